"""KIP-664's two metrics, their arithmetic defined once: a partition's MaxActiveTransactionDuration, whether it has
a late transaction, and the late-partition count per broker and cluster. streaming/windows.py holds the Spark form,
kept equal by tests/spark/test_streaming_stages.py::test_windows_agree_with_detectors_kip664; ages and "late" are
detectors/lateness.py.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from detectors.lateness import (
    LateDefinition,
    age_ms,
    is_late,
    is_late_by_broker_definition,
    late_threshold_ms,
    max_timeout_ms,
)
from detectors.models import DetectionLimits, OpenTransaction, PartitionSnapshot


def oldest_open_transaction(snapshot: PartitionSnapshot, *, now_ms: int) -> OpenTransaction | None:
    """The partition's longest-open transaction (ties: the lowest start offset); None when nothing is open."""
    if not snapshot.open_transactions:
        return None
    return max(snapshot.open_transactions, key=lambda t: (age_ms(now_ms, t.aged_since_ms), -t.start_offset))


def partition_duration_ms(snapshot: PartitionSnapshot, *, now_ms: int) -> int | None:
    """MaxActiveTransactionDuration (KIP-664) of one partition; None when it has no open transaction (an
    exporter lists only partitions with open transactions, so it has no stale series).

    Duration = now − when the collector first saw the oldest open transaction open (a lower bound: never the
    records' client time alone, nor the gap between two reports); without a sighting, now − its start batch's
    timestamp, else LastTimestamp; 0 when none is known or the producer's clock is ahead of ours.
    """
    oldest = oldest_open_transaction(snapshot, now_ms=now_ms)
    return None if oldest is None else age_ms(now_ms, oldest.aged_since_ms)


def partition_has_late_transaction(
    snapshot: PartitionSnapshot,
    *,
    now_ms: int,
    limits: DetectionLimits,
    definition: LateDefinition = "txnwatch",
) -> bool:
    """Whether one partition counts in PartitionsWithLateTransactionsCount.

    - "txnwatch" (what the job exports): some open transaction is older, from the collector's first sighting
      of it open (else its exact start, else LastTimestamp), than transaction.max.timeout.ms + late_buffer_ms (the LATE verdict's rule).
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
    return any(is_late(now_ms, t.aged_since_ms, threshold) for t in snapshot.open_transactions)


class LatePartition(NamedTuple):
    """One partition as the count sees it: its leader, whether it is late, and whether its late (oldest open)
    transaction is a KIP-939 two-phase-commit one (no timeout: the late alert may leave it out)."""

    leader: int
    late: bool
    two_phase_commit: bool = False


class LateCounts(NamedTuple):
    """PartitionsWithLateTransactionsCount of one cluster: per broker (every leader seen, 0 included, so a
    broker that recovers goes back to 0 instead of vanishing), the two-phase-commit part of it, and the total."""

    per_broker: dict[int, int]
    two_phase_commit_per_broker: dict[int, int]
    cluster: int


def count_late_partitions(partitions: Iterable[LatePartition]) -> LateCounts:
    """PartitionsWithLateTransactionsCount (KIP-664) per broker and for the cluster, from each partition's newest
    state (one entry per partition)."""
    per_broker: dict[int, int] = {}
    two_phase_commit: dict[int, int] = {}
    for p in partitions:
        per_broker[p.leader] = per_broker.get(p.leader, 0) + int(p.late)
        two_phase_commit[p.leader] = two_phase_commit.get(p.leader, 0) + int(p.late and p.two_phase_commit)
    return LateCounts(
        dict(sorted(per_broker.items())), dict(sorted(two_phase_commit.items())), sum(per_broker.values())
    )
