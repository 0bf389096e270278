"""Abort planning (pure): turn a HANGING verdict into an `AbortCandidate` with the WriteTxnMarkers spec.

Verification against the live cluster and execution live in admin/; this module only builds the plan.
"""

from __future__ import annotations

import shlex

from detectors.models import (
    AbortCandidate,
    OpenTransaction,
    PartitionSnapshot,
    Verdict,
    VerdictKind,
    WriteTxnMarkersSpec,
    candidate_id,
)

BOOTSTRAP_PLACEHOLDER = "<bootstrap-server>"


def marker_coordinator_epoch(leader_coordinator_epoch: int) -> int:
    """The coordinator epoch to put in an admin abort marker: the leader's, or 0 when it is negative.

    Kafka's TransactionsCommand does the same: a producer that hung before its first marker shows -1, and
    0 is <= any real coordinator epoch. kafka-python's default of -1 is fenced once a marker was written.
    """
    return leader_coordinator_epoch if leader_coordinator_epoch >= 0 else 0


def kafka_cli_abort(
    *,
    topic: str,
    partition: int,
    start_offset: int,
    bootstrap: str | None = None,
    command_config: str | None = None,
) -> str:
    """The equivalent `kafka-transactions.sh abort` line (Kafka 3.0+ brokers: by start offset).

    Args:
        topic: topic of the partition.
        partition: partition number.
        start_offset: the open transaction's start offset.
        bootstrap: bootstrap servers; None gives the placeholder `<bootstrap-server>` to fill in.
        command_config: path of a client.properties file, if the cluster needs one.
    """
    server = shlex.quote(bootstrap) if bootstrap else BOOTSTRAP_PLACEHOLDER
    config = f" --command-config {shlex.quote(command_config)}" if command_config else ""
    return (
        f"kafka-transactions.sh --bootstrap-server {server}{config} abort "
        f"--topic {shlex.quote(topic)} --partition {partition} --start-offset {start_offset}"
    )


def plan_abort(
    snapshot: PartitionSnapshot,
    txn: OpenTransaction,
    verdict: Verdict,
    *,
    bootstrap: str | None = None,
    first_detected_ms: int,
    command_config: str | None = None,
) -> AbortCandidate:
    """Plan the abort of a transaction proven HANGING.

    Args:
        snapshot: the partition snapshot the verdict was made on.
        txn: the open transaction (one of `snapshot.open_transactions`).
        verdict: its verdict; must be HANGING.
        bootstrap: bootstrap servers for the CLI line (placeholder if None).
        first_detected_ms: when txnwatch first judged this transaction HANGING.
        command_config: client.properties path for the CLI line, if any.

    Returns:
        The candidate: id, WriteTxnMarkers spec (leader-reported coordinator epoch, 0 if negative), reason,
        evidence and the equivalent Kafka CLI line.

    Raises:
        ValueError: if the verdict is not HANGING, or the transaction is not in the snapshot, or the verdict's
            evidence is about another transaction (caller bugs).
    """
    if verdict.kind is not VerdictKind.HANGING or verdict.reason is None:
        raise ValueError(f"only a HANGING verdict can be aborted, not {verdict.kind.value}")
    if txn not in snapshot.open_transactions:
        raise ValueError(f"producer {txn.producer_id} has no such open transaction in the snapshot")
    e = verdict.evidence
    if (e.topic, e.partition, e.producer_id, e.start_offset) != (
        snapshot.topic,
        snapshot.partition,
        txn.producer_id,
        txn.start_offset,
    ):
        raise ValueError("the verdict's evidence is about another transaction")
    spec = WriteTxnMarkersSpec(
        topic=snapshot.topic,
        partition=snapshot.partition,
        producer_id=txn.producer_id,
        producer_epoch=txn.producer_epoch,
        coordinator_epoch=marker_coordinator_epoch(txn.coordinator_epoch),
    )
    return AbortCandidate(
        candidate_id=candidate_id(
            snapshot.cluster,
            snapshot.topic,
            snapshot.partition,
            txn.producer_id,
            txn.producer_epoch,
            txn.start_offset,
        ),
        cluster=snapshot.cluster,
        topic=snapshot.topic,
        partition=snapshot.partition,
        start_offset=txn.start_offset,
        spec=spec,
        reason=verdict.reason,
        evidence=e,
        explanation=verdict.explanation,
        first_detected_ms=first_detected_ms,
        kafka_cli=kafka_cli_abort(
            topic=snapshot.topic,
            partition=snapshot.partition,
            start_offset=txn.start_offset,
            bootstrap=bootstrap,
            command_config=command_config,
        ),
    )
