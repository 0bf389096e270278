"""KIP-664 metric arithmetic from partition snapshots: MaxActiveTransactionDuration per partition and
PartitionsWithLateTransactionsCount per broker (leader) and per cluster, under two definitions of "late".
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import Field

from detectors.lateness import (
    LateDefinition,
    age_ms,
    is_late,
    is_late_by_broker_definition,
    late_threshold_ms,
    max_timeout_ms,
)
from detectors.models import DetectionLimits, Model, OpenSinceBasis, PartitionSnapshot


class PartitionDuration(Model):
    """MaxActiveTransactionDuration of one partition: the age of its oldest open transaction.

    `basis` says where the age comes from: "start-timestamp" (the exact start batch) or "last-timestamp"
    (DescribeProducers' LastTimestamp, used when the start batch was not fetched: an underestimate).
    """

    cluster: str
    topic: str
    partition: int
    leader: int
    duration_ms: int = Field(ge=0)
    basis: OpenSinceBasis
    producer_id: int
    start_offset: int


class BrokerLateCount(Model):
    """PartitionsWithLateTransactionsCount of one broker: leader partitions with a late transaction."""

    cluster: str
    broker: int
    count: int = Field(ge=0)


class LateTransactionsCount(Model):
    """PartitionsWithLateTransactionsCount per broker and per cluster, under one definition."""

    definition: LateDefinition
    brokers: tuple[BrokerLateCount, ...]
    clusters: dict[str, int]


def latest_snapshots(snapshots: Iterable[PartitionSnapshot]) -> list[PartitionSnapshot]:
    """The newest snapshot of each (cluster, topic, partition): latest observed_at_ms, then sweep_id."""
    latest: dict[tuple[str, str, int], PartitionSnapshot] = {}
    for s in snapshots:
        key = (s.cluster, s.topic, s.partition)
        cur = latest.get(key)
        if cur is None or (s.observed_at_ms, s.sweep_id) > (cur.observed_at_ms, cur.sweep_id):
            latest[key] = s
    return list(latest.values())


def max_active_transaction_duration(
    snapshots: Iterable[PartitionSnapshot], *, now_ms: int
) -> list[PartitionDuration]:
    """MaxActiveTransactionDuration (KIP-664) of every partition that has open transactions.

    Duration = now − the exact start timestamp of the oldest open transaction; where the start batch is
    unknown, now − LastTimestamp (`basis="last-timestamp"`); 0 with `basis="unknown"` when neither is known. Partitions without open transactions are left
    out, so an exporter publishing this list has no stale series. Only the newest snapshot per partition
    counts.

    Args:
        snapshots: partition snapshots (any number per partition).
        now_ms: current time.

    Returns:
        One entry per partition with open transactions, sorted by (cluster, topic, partition).
    """
    out: list[PartitionDuration] = []
    for s in latest_snapshots(snapshots):
        if not s.open_transactions:
            continue
        oldest = max(s.open_transactions, key=lambda t: (age_ms(now_ms, t.open_since_ms), -t.start_offset))
        out.append(
            PartitionDuration(
                cluster=s.cluster,
                topic=s.topic,
                partition=s.partition,
                leader=s.leader,
                duration_ms=age_ms(now_ms, oldest.open_since_ms),
                basis=oldest.open_since_basis,
                producer_id=oldest.producer_id,
                start_offset=oldest.start_offset,
            )
        )
    out.sort(key=lambda d: (d.cluster, d.topic, d.partition))
    return out


def partition_has_late_transaction(
    snapshot: PartitionSnapshot,
    *,
    now_ms: int,
    limits: DetectionLimits,
    definition: LateDefinition = "txnwatch",
) -> bool:
    """Whether one partition counts in PartitionsWithLateTransactionsCount.

    - "txnwatch": some open transaction is older, from its exact start (else LastTimestamp), than
      transaction.max.timeout.ms + late_buffer_ms (the LATE verdict's rule).
    - "broker": Kafka's own: now − LastTimestamp of the producer owning the oldest open transaction (lowest
      start offset) > transaction.max.timeout.ms + 5 min, and LastTimestamp > 0.
    Both are strict: exactly at the threshold is not late.
    """
    if not snapshot.open_transactions:
        return False
    max_timeout = max_timeout_ms(
        snapshot.max_transaction_timeout_ms, limits.default_max_transaction_timeout_ms
    )
    if definition == "broker":
        oldest = min(snapshot.open_transactions, key=lambda t: t.start_offset)
        return is_late_by_broker_definition(now_ms, oldest.last_timestamp_ms, max_timeout)
    threshold = late_threshold_ms(max_timeout, limits.late_buffer_ms)
    return any(is_late(now_ms, t.open_since_ms, threshold) for t in snapshot.open_transactions)


def partitions_with_late_transactions(
    snapshots: Iterable[PartitionSnapshot],
    *,
    now_ms: int,
    limits: DetectionLimits,
    definition: LateDefinition = "txnwatch",
) -> LateTransactionsCount:
    """PartitionsWithLateTransactionsCount (KIP-664) per broker (the snapshot's leader) and per cluster.

    Every leader that appears in the (newest) snapshots gets an entry, 0 included, so a broker that recovers
    goes back to 0 instead of vanishing.

    Args:
        snapshots: partition snapshots (any number per partition; the newest counts).
        now_ms: current time.
        limits: late_buffer_ms and the default max timeout.
        definition: "txnwatch" or "broker" (see `partition_has_late_transaction`).

    Returns:
        Counts per (cluster, broker), sorted, and totals per cluster.
    """
    per_broker: dict[tuple[str, int], int] = {}
    for s in latest_snapshots(snapshots):
        key = (s.cluster, s.leader)
        late = partition_has_late_transaction(s, now_ms=now_ms, limits=limits, definition=definition)
        per_broker[key] = per_broker.get(key, 0) + int(late)
    clusters: dict[str, int] = {}
    for (cluster, _), n in per_broker.items():
        clusters[cluster] = clusters.get(cluster, 0) + n
    return LateTransactionsCount(
        definition=definition,
        brokers=tuple(
            BrokerLateCount(cluster=c, broker=b, count=n) for (c, b), n in sorted(per_broker.items())
        ),
        clusters=clusters,
    )
