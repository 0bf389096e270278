"""`txnwatch proposals`: the abort candidates the streaming job proposed, and the verified abort of one.

The job writes `AbortCandidate`s to the compacted `<prefix>.abort-candidates` (key = candidate id, OPENED then
RESOLVED). `proposals abort` runs plan → verify live → execute → post-check → audit:

- plan: the candidate's `WriteTxnMarkersSpec` (built purely by `detectors.abort.plan_abort`);
- verify: `observe` reads the partition's leader (DescribeProducers, ListOffsets) and the coordinator that owns the
  producer id (ListTransactions by producer id, DescribeTransactions); `detectors.abort.verify_abort` decides;
- execute (`--execute` only): one WriteTxnMarkers ABORT to the current leader with the coordinator epoch it
  reports (0 when negative, never -1). NOT_LEADER_OR_FOLLOWER (and the other leader-moved errors): metadata is
  read again once, everything is verified again, and the marker goes to the new leader;
- post-check: the transaction is gone and the LSO moved past its start offset (`detectors.abort.post_check`);
- audit: one `AuditRecord` per attempt to `<prefix>.audit`, whatever the outcome.
"""

from __future__ import annotations

import json
import logging
import shlex
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import kafka.errors as Errors
from kafka import KafkaConsumer, KafkaProducer
from kafka.structs import TopicPartition as KafkaTopicPartition

from admin.client import AdminError, error_name, explain
from admin.inspect import (
    InspectWire,
    ask_coordinators,
    ask_leader,
    describe_by_id,
    duration,
    format_table,
    iso,
    listing_incomplete,
    transaction_log_leaders,
)
from admin.seams import TP, GroupOffsets, GroupStanding, StartBatch, TransactionDescription, wall_clock_ms
from detectors.abort import (
    candidate_age_ms,
    candidate_is_two_phase_commit,
    claim_holder,
    kafka_cli_abort,
    lso_lag,
    post_check,
    prior_abort,
    verify_abort,
)
from detectors.groups import CONSUMER_OFFSETS_TOPIC
from detectors.models import (
    AbortCandidate,
    AuditOutcome,
    AuditRecord,
    LeaderProducer,
    LiveCoordinator,
    LiveEvidence,
    PostCheck,
    VerifyOutcome,
    VerifyResult,
    WriteTxnMarkersSpec,
    is_two_phase_commit,
)

log = logging.getLogger(__name__)

# Exit codes of `txnwatch proposals abort` (documented in --help and docs/proposals.md).
EXIT_DONE = 0  # aborted and post-checked, or a dry run that verified the abort is safe
EXIT_ERROR = 1  # an error: unreachable, denied by an ACL, marker failed or post-check failed
EXIT_REFUSED = 3  # refused: the state changed since the plan, or the abort is not provably safe
EXIT_ALREADY_RESOLVED = 4  # the transaction is no longer open: nothing to do

EXIT_CODES = {
    AuditOutcome.DRY_RUN: EXIT_DONE,
    AuditOutcome.ABORTED: EXIT_DONE,
    AuditOutcome.REFUSED: EXIT_REFUSED,
    AuditOutcome.ALREADY_RESOLVED: EXIT_ALREADY_RESOLVED,
    AuditOutcome.DENIED: EXIT_ERROR,
    AuditOutcome.FAILED: EXIT_ERROR,
}

# WriteTxnMarkers errors after which Kafka's AbortTransactionHandler looks the leader up again; plus
# UNKNOWN_BROKER: the verified leader left the cluster's metadata, so the request never left and the leader is
# looked up again too. (A lost connection is not here: the marker may have been written before it dropped.)
LEADER_MOVED = frozenset(
    {
        "NOT_LEADER_OR_FOLLOWER",
        "REPLICA_NOT_AVAILABLE",
        "BROKER_NOT_AVAILABLE",
        "UNKNOWN_TOPIC_OR_PARTITION",
        "UNKNOWN_BROKER",
    }
)
# The broker refused the marker because the partition's producer state moved on: the plan is stale.
FENCED = frozenset({"INVALID_PRODUCER_EPOCH", "TRANSACTION_COORDINATOR_FENCED", "PRODUCER_FENCED"})
DENIED_MESSAGE = (
    "WriteTxnMarkers was denied (CLUSTER_AUTHORIZATION_FAILED): grant the ACL Alter on the cluster (or "
    "ClusterAction on the cluster) to txnwatch's principal"
)


class ProposalWire(InspectWire, Protocol):
    """The seams `admin.wire.KafkaWire` offers, plus the marker."""

    def write_abort_marker(
        self,
        broker: int,
        *,
        topic: str,
        partition: int,
        producer_id: int,
        producer_epoch: int,
        coordinator_epoch: int,
    ) -> str | None: ...

    def committed_offsets(self, topic: str, partition: int) -> GroupOffsets: ...

    def group_standing(self, group: str, pending: Sequence[TP] = ()) -> GroupStanding: ...


# ------------------------------------------------------------------------------------ reading topics


def read_topic(consumer: KafkaConsumer, topic: str, *, timeout_s: float = 30.0) -> Iterator[tuple[Any, Any]]:
    """Every (key, value) of `topic` from the beginning to the end offsets measured at the start.

    Yields nothing when the topic does not exist.

    Raises:
        AdminError: the topic could not be read within `timeout_s`, or reading was denied.
    """
    try:
        partitions = consumer.partitions_for_topic(topic)
        if not partitions:
            return
        tps = [KafkaTopicPartition(topic, p) for p in sorted(partitions)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        end = consumer.end_offsets(tps)
        remaining = {tp for tp in tps if end[tp] > 0}
        deadline = time.monotonic() + timeout_s
        while remaining:
            if time.monotonic() > deadline:
                raise AdminError(f"reading {topic} took longer than {timeout_s:.0f}s")
            for _tp, records in consumer.poll(timeout_ms=500).items():
                for r in records:
                    yield r.key, r.value
            for tp in list(remaining):
                if consumer.position(tp) >= end[tp]:
                    remaining.discard(tp)
    except Errors.KafkaError as exc:
        raise AdminError(explain("Consume", error_name(exc), topic, str(exc))) from exc


def follow_topic(
    consumer: KafkaConsumer, topic: str, stop: threading.Event, *, poll_ms: int = 1000
) -> Iterator[list[tuple[Any, Any]]]:
    """Every (key, value) of `topic` from the beginning, then as it arrives: one list per poll (possibly empty),
    until `stop` is set. A topic that does not exist yet is waited for (the job creates it).

    Raises:
        AdminError: reading was denied, or failed.
    """
    try:
        partitions = None
        while not partitions:
            if stop.is_set():
                return
            partitions = consumer.partitions_for_topic(topic)
            if not partitions:
                yield []
                stop.wait(poll_ms / 1000)
        tps = [KafkaTopicPartition(topic, p) for p in sorted(partitions)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        while not stop.is_set():
            batch = consumer.poll(timeout_ms=poll_ms)
            yield [(r.key, r.value) for records in batch.values() for r in records]
    except Errors.KafkaError as exc:
        raise AdminError(explain("Consume", error_name(exc), topic, str(exc))) from exc


def latest_candidates(records: Iterable[tuple[Any, Any]]) -> tuple[dict[str, AbortCandidate], int]:
    """The latest candidate per key (a tombstone removes it), and how many records were malformed."""
    latest: dict[str, AbortCandidate] = {}
    malformed = 0
    for key, value in records:
        name = key.decode("utf-8", "replace") if isinstance(key, bytes) else str(key)
        if value is None:
            latest.pop(name, None)
            continue
        try:
            candidate = AbortCandidate.model_validate_json(value)
        except ValueError:
            malformed += 1
            continue
        latest[candidate.candidate_id] = candidate
    return latest, malformed


def audit_records(records: Iterable[tuple[Any, Any]]) -> tuple[list[AuditRecord], int]:
    """The audit records in topic order, and how many were malformed."""
    out: list[AuditRecord] = []
    malformed = 0
    for _key, value in records:
        if value is None:
            continue
        try:
            out.append(AuditRecord.model_validate_json(value))
        except ValueError:
            malformed += 1
    return out, malformed


# ------------------------------------------------------------------------------------------ observe


def observe(
    wire: InspectWire,
    candidate: AbortCandidate,
    *,
    clock_ms: Callable[[], int] = wall_clock_ms,
    sleep: Callable[[float], None] = time.sleep,
) -> LiveEvidence:
    """The candidate's partition and coordinator, read now: the leader's row for the producer id, the other open
    transactions, LSO and high watermark, and the transactional id that owns the producer id.

    Raises:
        AdminError: unknown partition, no leader, or the leader's DescribeProducers failed.
    """
    tp = (candidate.topic, candidate.partition)
    pid = candidate.spec.producer_id
    leader, observed, result = ask_leader(wire, candidate.topic, candidate.partition, sleep)
    mine = [p for p in result.producers if p.producer_id == pid]
    producer = (
        LeaderProducer(
            producer_id=mine[0].producer_id,
            producer_epoch=mine[0].producer_epoch,
            coordinator_epoch=max(-1, mine[0].coordinator_epoch),
            current_txn_start_offset=max(-1, mine[0].current_txn_start_offset),
            last_timestamp_ms=mine[0].last_timestamp_ms,
        )
        if mine
        else None
    )
    others = tuple(
        sorted(
            (p.producer_id, p.current_txn_start_offset)
            for p in result.producers
            if p.producer_id != pid and p.current_txn_start_offset >= 0
        )
    )
    offsets = wire.list_offsets({leader: [tp]}).get(tp)
    coordinator, coordinator_error = _ask_coordinator(wire, candidate)
    return LiveEvidence(
        observed_at_ms=observed,
        leader=leader,
        producer=producer,
        other_open=others,
        last_stable_offset=offsets.last_stable_offset if offsets else None,
        high_watermark=offsets.high_watermark if offsets else None,
        coordinator=coordinator,
        coordinator_error=coordinator_error,
    )


def _ask_coordinator(
    wire: InspectWire, candidate: AbortCandidate
) -> tuple[LiveCoordinator | None, str | None]:
    """The transactional id that owns the candidate's producer id now, or None when no id owns it; or why the
    coordinator side cannot be shown (the second element).

    "No owner listed" is evidence only when the listing was complete: every `__transaction_state` partition has
    a leader that served it loaded and answered, and the principal may Describe every id
    (`admin.inspect.listing_incomplete`, whose `coordinator-listing-incomplete: ...` reason refuses the abort
    otherwise). The id the candidate's evidence names (the
    producer id's last known owner) is described too, so its current state is read even if it was not listed.
    """
    pid = candidate.spec.producer_id
    try:
        before = transaction_log_leaders(wire)  # `listing_incomplete` compares them with those after
        answers = ask_coordinators(wire, [pid])
    except Errors.KafkaError as exc:
        return None, explain("ListTransactions", error_name(exc))
    owner = answers.owners.get(pid)
    if owner is None and answers.listing_failed:
        failed = "; ".join(
            explain("ListTransactions", e, f"broker {b}") for b, e in sorted(answers.listing_failed.items())
        )
        return None, failed
    if owner is not None:
        d = answers.described.get(owner.transactional_id)
        if d is None or d.error is not None:
            error = d.error if d is not None and d.error is not None else "NOT_DESCRIBED"
            return None, explain("DescribeTransactions", error, owner.transactional_id)
        return _live_coordinator(candidate, d), None
    named = candidate.evidence.coordinator.transactional_id if candidate.evidence.coordinator else None
    problem = listing_incomplete(wire, before, answers.listing_answered)
    if problem is not None:
        return None, f"cannot show that no transactional id owns producer {pid}: {problem}"
    if named:
        try:
            described = describe_by_id(wire, [named])
        except (Errors.KafkaError, AdminError) as exc:
            return None, f"DescribeTransactions {named}: {exc}"
        d = described.get(named)
        if d is not None and d.error is None and d.producer_id == pid:
            # Listed by nobody, yet it names the producer id: the listing was incomplete after all.
            return _live_coordinator(candidate, d), None
        if d is not None and d.error not in (None, "TRANSACTIONAL_ID_NOT_FOUND"):
            return None, explain("DescribeTransactions", d.error or "", named)
    return None, None


def _live_coordinator(candidate: AbortCandidate, d: TransactionDescription) -> LiveCoordinator:
    return LiveCoordinator(
        transactional_id=d.transactional_id,
        state=d.state,
        producer_id=d.producer_id,
        producer_epoch=d.producer_epoch,
        partition_listed=(candidate.topic, candidate.partition) in d.partitions,
        coordinator=d.coordinator,
        transaction_start_ms=d.start_time_ms,
        transaction_timeout_ms=d.timeout_ms,
    )


# -------------------------------------------------------------------------------------------- abort


@dataclass(frozen=True)
class AbortAttempt:
    """How one `proposals abort` ended: its audit record (to publish) and its exit code."""

    audit: AuditRecord

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.audit.outcome]


class AuditLog(Protocol):
    """`<prefix>.audit` as the abort uses it: what was recorded for a candidate, and appending a record."""

    def history(self, candidate_id: str) -> list[AuditRecord]:
        """The candidate's records in topic order, read up to the end offsets measured now."""
        ...

    def append(self, record: AuditRecord) -> None:
        """Publish one record and wait for its acknowledgement (raises AdminError)."""
        ...


CLAIM_LEASE_MS = 120_000  # a claim without an ending (its run crashed) holds this long
CLAIM_WAIT_S = 20.0  # how long a second execution waits for the first one's ending


def abort(
    wire: ProposalWire,
    candidate: AbortCandidate,
    *,
    execute: bool,
    actor: str,
    audit_log: AuditLog,
    clock_ms: Callable[[], int] = wall_clock_ms,
    sleep: Callable[[float], None] = time.sleep,
    post_check_timeout_s: float = 10.0,
    claim_wait_s: float = CLAIM_WAIT_S,
    claim_lease_ms: int = CLAIM_LEASE_MS,
) -> AbortAttempt:
    """Verify the candidate live and, with `execute`, claim it, write its ABORT marker and post-check it.

    The claim (a CLAIMED record on the audit log, `detectors.abort.claim_holder`) makes concurrent executions
    write one marker: the first claim in the audit partition goes on, verifying again; the others wait for its
    ending and then find the transaction aborted (ALREADY_RESOLVED), or refuse. The caller publishes the
    returned ending record, which releases the claim.

    Never raises for cluster trouble: every ending is an `AuditRecord` (outcome and message).
    """
    base: dict[str, Any] = {
        "audit_id": uuid.uuid4().hex,
        "candidate_id": candidate.candidate_id,
        "cluster": candidate.cluster,
        "topic": candidate.topic,
        "partition": candidate.partition,
        "start_offset": candidate.start_offset,
        "actor": actor,
        "execute": execute,
        "plan": candidate.spec,
        "candidate_evidence": candidate.evidence,
    }

    def record(outcome: AuditOutcome, message: str, **fields: Any) -> AuditRecord:
        return AuditRecord(**base, **fields, at_ms=clock_ms(), outcome=outcome, message=message)

    def ending(outcome: AuditOutcome, message: str, **fields: Any) -> AbortAttempt:
        return AbortAttempt(record(outcome, message, **fields))

    def history() -> list[AuditRecord] | AbortAttempt:
        try:
            return audit_log.history(candidate.candidate_id)
        except AdminError as exc:
            return ending(AuditOutcome.FAILED, f"cannot read the audit log: {exc}; nothing written")

    past = history()
    if isinstance(past, AbortAttempt):
        return past
    done = prior_abort(past)
    if done is not None:
        return ending(AuditOutcome.ALREADY_RESOLVED, "nothing to do: " + _aborted_by(done))

    moves = 0
    claimed = False
    before: LiveEvidence | None = None
    verify: VerifyResult | None = None
    while True:
        try:
            before = observe(wire, candidate, clock_ms=clock_ms, sleep=sleep)
        except AdminError as exc:
            return ending(
                AuditOutcome.FAILED, f"cannot verify: {exc}", before=before, verify=verify, leader_moves=moves
            )
        verify = verify_abort(candidate, before)
        context: dict[str, Any] = {"before": before, "verify": verify, "leader_moves": moves}
        if verify.outcome is VerifyOutcome.ALREADY_RESOLVED:
            # Not by us (an abort of ours would be in the audit log): the transaction ended since the plan.
            return ending(
                AuditOutcome.REFUSED,
                "refused, no marker written: the transaction changed since the plan: "
                + "; ".join(verify.changes),
                **context,
            )
        if verify.outcome is VerifyOutcome.REFUSED:
            return ending(
                AuditOutcome.REFUSED, "refused, no marker written: " + "; ".join(verify.changes), **context
            )
        marker = verify.marker
        if marker is None:  # cannot happen: VerifyResult's validator gives SAFE a marker
            return ending(AuditOutcome.FAILED, "verification planned no marker", **context)
        if not execute:
            return ending(
                AuditOutcome.DRY_RUN,
                f"dry run: safe to abort now (leader {before.leader}, coordinator epoch "
                f"{marker.coordinator_epoch}); nothing written, add --execute to abort",
                **context,
            )
        if not claimed:
            lost = _claim(
                audit_log, record, candidate, clock_ms, sleep, claim_wait_s, claim_lease_ms, context
            )
            if lost is not None:
                return lost
            claimed = True
            claimed_at = clock_ms()
            continue  # verify again: the state may have moved while the claim was taken
        if clock_ms() - claimed_at > claim_lease_ms // 2:
            return ending(
                AuditOutcome.REFUSED,
                "refused, no marker written: verification took so long that the claim on this candidate could "
                "expire and another execution take over; run it again",
                **context,
            )
        error = _send_marker(wire, before.leader, marker)
        context["marker"] = marker
        if error is None:
            break
        if error in LEADER_MOVED and moves == 0:
            moves += 1
            log.info("WriteTxnMarkers to broker %d: %s; reading metadata again", before.leader, error)
            continue
        if error == "CLUSTER_AUTHORIZATION_FAILED":
            return ending(AuditOutcome.DENIED, DENIED_MESSAGE, **context)
        if error in FENCED:
            return ending(
                AuditOutcome.REFUSED,
                f"the leader refused the marker ({error}): the producer state changed since it was verified; "
                "nothing was written",
                **context,
            )
        if error in LEADER_MOVED:
            return ending(
                AuditOutcome.FAILED,
                f"WriteTxnMarkers to broker {before.leader} failed with {error} after one leader move; nothing "
                "was written: try again once the partition's leadership is stable",
                **context,
            )
        return ending(
            AuditOutcome.FAILED,
            f"WriteTxnMarkers to broker {before.leader} failed with {error}; the marker may or may not have "
            "been written: run `txnwatch proposals show` before trying again",
            marker_written=None,
            **context,
        )
    # The marker was written: wait (bounded) until the leader shows its effect.
    deadline = time.monotonic() + post_check_timeout_s
    after: LiveEvidence | None = None
    check: PostCheck | None = None
    problem: str | None = None
    while True:
        try:
            after = observe(wire, candidate, clock_ms=clock_ms, sleep=sleep)
            check = post_check(candidate, after)
            problem = None
        except AdminError as exc:
            problem = str(exc)
        if (check is not None and check.ok) or time.monotonic() > deadline:
            break
        sleep(0.2)
    fields: dict[str, Any] = {**context, "after": after, "post_check": check, "marker_written": True}
    if check is not None and check.ok:
        return ending(
            AuditOutcome.ABORTED,
            f"aborted: marker written by broker {before.leader}; {candidate.topic}-{candidate.partition} LSO "
            f"{after.last_stable_offset if after else '?'} is past offset {candidate.start_offset}",
            **fields,
        )
    why = problem or "; ".join(check.problems if check else ())
    return ending(AuditOutcome.FAILED, f"marker written, but the post-check failed: {why}", **fields)


def _aborted_by(r: AuditRecord) -> str:
    return f"aborted by {r.actor} at {iso(r.at_ms)} (audit {r.audit_id})"


def _claim(
    audit_log: AuditLog,
    record: Callable[..., AuditRecord],
    candidate: AbortCandidate,
    clock_ms: Callable[[], int],
    sleep: Callable[[float], None],
    wait_s: float,
    lease_ms: int,
    context: dict[str, Any],
) -> AbortAttempt | None:
    """Claim the candidate on the audit log. None: this run holds it. Else how this run ends: the holder
    aborted it meanwhile (ALREADY_RESOLVED), or it held on past `wait_s` (REFUSED), or the log failed."""
    mine = record(AuditOutcome.CLAIMED, "claimed for --execute", **context)
    try:
        audit_log.append(mine)
    except AdminError as exc:
        return AbortAttempt(
            record(
                AuditOutcome.FAILED, f"cannot claim the candidate on the audit log: {exc}; nothing written"
            )
        )
    deadline = time.monotonic() + wait_s
    while True:
        try:
            past = audit_log.history(candidate.candidate_id)
        except AdminError as exc:
            return AbortAttempt(
                record(AuditOutcome.FAILED, f"cannot read the audit log: {exc}; nothing written", **context)
            )
        done = prior_abort(past)
        if done is not None:
            return AbortAttempt(
                record(AuditOutcome.ALREADY_RESOLVED, "nothing to do: " + _aborted_by(done), **context)
            )
        holder = claim_holder(past, now_ms=clock_ms(), lease_ms=lease_ms)
        if holder is not None and holder.audit_id == mine.audit_id:
            return None
        if holder is None and any(r.audit_id == mine.audit_id for r in past):
            # Our own claim is back but already expired: far too slow to be safe.
            return AbortAttempt(
                record(
                    AuditOutcome.REFUSED, "refused, no marker written: this run's claim expired", **context
                )
            )
        if time.monotonic() > deadline:
            who = f"{holder.actor} since {iso(holder.at_ms)} (audit {holder.audit_id})" if holder else "?"
            return AbortAttempt(
                record(
                    AuditOutcome.REFUSED,
                    f"refused, no marker written: another execution holds this candidate: {who}; run "
                    "`txnwatch proposals show` to see how it ended",
                    **context,
                )
            )
        sleep(0.5)


def _send_marker(wire: ProposalWire, leader: int, marker: WriteTxnMarkersSpec) -> str | None:
    return wire.write_abort_marker(
        leader,
        topic=marker.topic,
        partition=marker.partition,
        producer_id=marker.producer_id,
        producer_epoch=marker.producer_epoch,
        coordinator_epoch=marker.coordinator_epoch,
    )


def publish_audit(
    producer: KafkaProducer, topic: str, record: AuditRecord, *, timeout_s: float = 30.0
) -> None:
    """Write one audit record (key = candidate id) and wait for its acknowledgement.

    Raises:
        AdminError: the record was not acknowledged (the message names the ACL if one is missing).
    """
    try:
        producer.send(topic, key=record.candidate_id.encode(), value=record.model_dump_json().encode()).get(
            timeout=timeout_s
        )
    except Errors.KafkaError as exc:
        raise AdminError(explain("Produce", error_name(exc), topic, str(exc))) from exc


class TopicAuditLog:
    """`<prefix>.audit` on the cluster: records go out acks=all (one at a time), and every `history` reads the
    topic again from the beginning to its end offsets, so it sees every record acknowledged before it began."""

    def __init__(
        self, producer: KafkaProducer, consumer: KafkaConsumer, topic: str, *, timeout_s: float = 30.0
    ) -> None:
        self._producer = producer
        self._consumer = consumer
        self.topic = topic
        self._timeout_s = timeout_s

    def history(self, candidate_id: str) -> list[AuditRecord]:
        key = candidate_id.encode()
        mine = (
            (k, v) for k, v in read_topic(self._consumer, self.topic, timeout_s=self._timeout_s) if k == key
        )
        records, _malformed = audit_records(mine)
        return records

    def all_records(self) -> list[AuditRecord]:
        records, _malformed = audit_records(read_topic(self._consumer, self.topic, timeout_s=self._timeout_s))
        return records

    def append(self, record: AuditRecord) -> None:
        publish_audit(self._producer, self.topic, record, timeout_s=self._timeout_s)


# ---------------------------------------------------------------------------------------- rendering


def candidate_row(c: AbortCandidate, now_ms: int) -> dict[str, Any]:
    return {
        "candidate_id": c.candidate_id,
        "topic": c.topic,
        "partition": c.partition,
        "start_offset": c.start_offset,
        "producer_id": c.spec.producer_id,
        "producer_epoch": c.spec.producer_epoch,
        "reason": c.reason.value,
        "lso_lag": lso_lag(c),
        "age_ms": candidate_age_ms(c, now_ms),
        "first_detected_ms": c.first_detected_ms,
        "explanation": c.explanation,
        "kafka_cli": c.kafka_cli,
        "two_phase_commit": candidate_is_two_phase_commit(c),
    }


def render_list(candidates: Sequence[AbortCandidate], now_ms: int) -> str:
    if not candidates:
        return "no pending abort candidates"
    rows = [
        ["Candidate", "Topic", "Partition", "StartOffset", "ProducerId", "Epoch", "LsoLag", "Age", "Reason"]
    ]
    for c in candidates:
        lag = lso_lag(c)
        rows.append(
            [
                c.candidate_id,
                c.topic,
                str(c.partition),
                str(c.start_offset),
                str(c.spec.producer_id),
                str(c.spec.producer_epoch),
                "-" if lag is None else str(lag),
                duration(candidate_age_ms(c, now_ms)),
                c.reason.value,
            ]
        )
    return format_table(rows)


@dataclass(frozen=True)
class ActWith:
    """How the operator reaches the cluster: what the two ways to act must repeat."""

    bootstrap: str
    cluster: str
    topic_prefix: str
    command_config: str | None = None

    def txnwatch(self, c: AbortCandidate) -> str:
        config = f" --command-config {shlex.quote(self.command_config)}" if self.command_config else ""
        return (
            f"txnwatch proposals abort {c.candidate_id} --bootstrap-server {shlex.quote(self.bootstrap)}{config} "
            f"--cluster {shlex.quote(self.cluster)} --topic-prefix {shlex.quote(self.topic_prefix)} --execute"
        )

    def kafka_cli(self, c: AbortCandidate) -> str:
        return kafka_cli_abort(
            topic=c.topic,
            partition=c.partition,
            start_offset=c.start_offset,
            bootstrap=self.bootstrap,
            command_config=self.command_config,
        )


@dataclass(frozen=True)
class Surroundings:
    """What `show` reads besides the verification's evidence: the consumer groups' committed offsets (who is
    stuck), and the current record of the transactional id the candidate's evidence names, when it no longer owns
    the producer id (or why it could not be read)."""

    groups: GroupOffsets
    named: TransactionDescription | None = None
    named_error: str | None = None
    # On `__consumer_offsets`: the group whose pending offset commit this is, as it stands now (None elsewhere;
    # a standing with an empty group name and an error when the start batch could not tell).
    blocked: GroupStanding | None = None


def look_around(wire: ProposalWire, candidate: AbortCandidate, live: LiveEvidence) -> Surroundings:
    groups = wire.committed_offsets(candidate.topic, candidate.partition)
    blocked = blocked_group(wire, candidate, live) if candidate.topic == CONSUMER_OFFSETS_TOPIC else None
    named = candidate.evidence.coordinator.transactional_id if candidate.evidence.coordinator else None
    if named is None or (live.coordinator is not None and live.coordinator.transactional_id == named):
        return Surroundings(groups, blocked=blocked)
    try:
        d = describe_by_id(wire, [named]).get(named)
    except (AdminError, Errors.KafkaError) as exc:
        return Surroundings(groups, named_error=f"DescribeTransactions {named}: {exc}", blocked=blocked)
    if d is None or d.error is not None:
        error = "NOT_DESCRIBED" if d is None else d.error or ""
        return Surroundings(
            groups, named_error=explain("DescribeTransactions", error, named), blocked=blocked
        )
    return Surroundings(groups, named=d, blocked=blocked)


def blocked_group(wire: ProposalWire, candidate: AbortCandidate, live: LiveEvidence) -> GroupStanding:
    """The consumer group a hanging transaction on `__consumer_offsets` blocks, and how it stands now.

    The start batch, read now, names the group and the partitions whose offsets are pending (its record keys);
    the evidence's group (the collector read the same keys) stands in when the batch cannot be read. Only that
    group's offsets are pending: other groups placed on the partition still fetch theirs (they are listed as
    neighbours: their partition cannot be compacted past the LSO).
    """
    tp, offset = (candidate.topic, candidate.partition), candidate.start_offset
    got = wire.fetch_start_batches({live.leader: [(tp, offset)]}).get((tp, offset))
    if isinstance(got, StartBatch) and got.offset_commit_group is not None:
        return wire.group_standing(got.offset_commit_group, got.offset_commit_partitions)
    if candidate.evidence.offset_commit_group is not None:
        return wire.group_standing(candidate.evidence.offset_commit_group)
    why = "holds no offset commit record" if isinstance(got, StartBatch) else f"could not be read ({got})"
    return GroupStanding("", error=f"the start batch {why}")


def stuck_groups(live: LiveEvidence, groups: GroupOffsets) -> dict[str, int]:
    """The consumer groups whose committed offset on the partition is at or past its LSO: a `read_committed`
    member gets nothing beyond the LSO, so these wait on the hanging transaction (who is stuck)."""
    lso = live.last_stable_offset
    if lso is None:
        return {}
    return {g: o for g, o in sorted(groups.offsets.items()) if o >= lso}


def show_json(
    c: AbortCandidate,
    live: LiveEvidence,
    verify: VerifyResult,
    act: ActWith,
    now_ms: int,
    around: Surroundings,
) -> dict[str, Any]:
    named = around.named
    return {
        "candidate": {**candidate_row(c, now_ms), "status": c.status.value},
        "live": live.model_dump(mode="json"),
        "live_lso_lag": _lag(live),
        "stuck_groups": stuck_groups(live, around.groups),
        "groups_error": around.groups.error,
        "blocked_group": None if around.blocked is None else around.blocked._asdict(),
        "named_transactional_id": None
        if named is None
        else {
            "transactional_id": named.transactional_id,
            "state": named.state,
            "producer_id": named.producer_id,
            "producer_epoch": named.producer_epoch,
            "partition_listed": (c.topic, c.partition) in named.partitions,
        },
        "named_error": around.named_error,
        "verify": verify.model_dump(mode="json"),
        "act": {"txnwatch": act.txnwatch(c), "kafka_cli": act.kafka_cli(c)},
    }


def render_blocked(b: GroupStanding, partition: int) -> list[str]:
    """`show`'s lines for a transaction on `__consumer_offsets`: whom it blocks (the LSO means nothing there)."""
    if not b.group:
        return [f"  blocked     unknown consumer group: {b.error}"]
    if b.error is not None:
        return [f"  blocked     consumer group {b.group} (its pending offset commit); now unknown: {b.error}"]
    members = "?" if b.members is None else str(b.members)
    fetch = {
        True: "its OffsetFetch with require_stable answers UNSTABLE_OFFSET_COMMIT now: read_committed members "
        "(Kafka Streams exactly-once) cannot start or rebalance",
        False: "its OffsetFetch with require_stable answers without UNSTABLE_OFFSET_COMMIT now",
        None: "",
    }[b.unstable]
    lines = [
        f"  blocked     consumer group {b.group} ({b.state or 'state unknown'}, {members} members): {fetch}"
    ]
    if b.neighbours:
        lines.append(
            f"  placed too  {', '.join(b.neighbours)} (on __consumer_offsets-{partition}: their offsets still "
            "fetch, but the partition is not compacted past the LSO)"
        )
    return lines


def _lag(live: LiveEvidence) -> int | None:
    if live.high_watermark is None or live.last_stable_offset is None:
        return None
    return live.high_watermark - live.last_stable_offset


def render_show(
    c: AbortCandidate,
    live: LiveEvidence,
    verify: VerifyResult,
    act: ActWith,
    now_ms: int,
    around: Surroundings,
) -> str:
    p = live.producer
    lines = [
        f"candidate {c.candidate_id} ({c.status.value}): {c.topic}-{c.partition} offset {c.start_offset}",
        f"  verdict     HANGING {c.reason.value}"
        f"{' [two-phase commit]' if candidate_is_two_phase_commit(c) else ''}: {c.explanation}",
        f"  planned     producer {c.spec.producer_id} epoch {c.spec.producer_epoch}, coordinator epoch "
        f"{c.spec.coordinator_epoch}; open since {iso(c.evidence.open_since_ms)} "
        f"({duration(candidate_age_ms(c, now_ms))} ago), first detected {iso(c.first_detected_ms)}",
        f"  live        leader {live.leader} at {iso(live.observed_at_ms)}: LSO {live.last_stable_offset}, "
        f"HW {live.high_watermark} ({_lag(live) if _lag(live) is not None else '?'} records held back from "
        "read_committed readers)",
        "  leader      "
        + (
            f"producer {p.producer_id} epoch {p.producer_epoch}, coordinator epoch {p.coordinator_epoch}, "
            f"open transaction at {p.current_txn_start_offset if p.current_txn_start_offset >= 0 else 'none'}"
            if p is not None
            else f"no longer lists producer {c.spec.producer_id}"
        ),
    ]
    co = live.coordinator
    if live.coordinator_error is not None:
        lines.append(f"  coordinator unknown: {live.coordinator_error}")
    elif co is None:
        lines.append(f"  coordinator no transactional id owns producer {c.spec.producer_id}")
    else:
        lines.append(
            f"  coordinator {co.transactional_id} on broker {co.coordinator}: {co.state}, producer "
            f"{co.producer_id} epoch {co.producer_epoch}, {c.topic}-{c.partition} "
            f"{'listed' if co.partition_listed else 'not listed'}"
            f"{', two-phase commit (no timeout)' if is_two_phase_commit(co.transaction_timeout_ms) else ''}"
        )
    if around.named is not None:
        n = around.named
        lines.append(
            f"  named id    {n.transactional_id} (named by the evidence) now: {n.state}, producer {n.producer_id} "
            f"epoch {n.producer_epoch}; it no longer owns producer {c.spec.producer_id}"
        )
    elif around.named_error is not None:
        lines.append(f"  named id    unknown: {around.named_error}")
    if live.other_open:
        lines.append("  also open   " + ", ".join(f"producer {pid} at {off}" for pid, off in live.other_open))
    groups = around.groups
    stuck = stuck_groups(live, groups)
    if around.blocked is not None:
        lines += render_blocked(around.blocked, c.partition)
    elif groups.error is not None:
        lines.append(f"  stuck       unknown: {explain('ListGroups/OffsetFetch', groups.error)}")
    elif stuck:
        lines.append(
            "  stuck       consumer groups at the LSO (read_committed members wait here): "
            + ", ".join(f"{g} (committed {o})" for g, o in stuck.items())
        )
    else:
        lines.append(
            f"  stuck       no consumer group has committed up to the LSO of {c.topic}-{c.partition}"
        )
    lines.append(
        f"  verify now  {verify.outcome.value}" + (": " + "; ".join(verify.changes) if verify.changes else "")
    )
    if verify.outcome is VerifyOutcome.ALREADY_RESOLVED:
        lines.append("  act         nothing to do")
    elif candidate_is_two_phase_commit(c):
        # `abort` refuses it (two-phase-commit): point at what ends a KIP-939 transaction instead.
        tid = c.evidence.coordinator.transactional_id if c.evidence.coordinator else "<transactional-id>"
        lines.append(
            "  act         two-phase commit (KIP-939): its transaction manager decides; or Kafka 4.1+: "
            f"kafka-transactions.sh --bootstrap-server {shlex.quote(act.bootstrap)} forceTerminateTransaction "
            f"--transactionalId {shlex.quote(tid)}"
        )
    else:
        lines.append("  act (verified, dry run without --execute):  " + act.txnwatch(c))
        lines.append("  act (Kafka's tool, re-checks nothing):      " + act.kafka_cli(c))
    return "\n".join(lines)


def audit_json(record: AuditRecord) -> str:
    return json.dumps(record.model_dump(mode="json"))
