"""The collector's sightings of open transactions (admin/collect/sighting.py) survive what used to reset them (issue 39,
item 3): a restart, which restores them from the snapshot topic's recent tail, and a stale replica's answer
without the transaction, which its own ListOffsets now fences."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from collector_fakes import T0, FakeCluster, producer, start_batch

from admin.collect.collector import Collector
from admin.collect.restore import recent_snapshots
from admin.collect.sighting import Sightings
from admin.wire.types import TP, Offsets, SweepResult
from common.settings import CollectorSettings
from detectors.models import OpenTransaction, PartitionSnapshot

pytestmark = pytest.mark.unit

ORDERS0 = ("orders", 0)
ORDERS1 = ("orders", 1)


def cluster_with(*, txn_open: bool) -> FakeCluster:
    return FakeCluster(
        leaders={ORDERS0: 1, ORDERS1: 2},
        epochs={ORDERS0: 5, ORDERS1: 2},
        producers={ORDERS0: [producer()] if txn_open else []},
        starts={(ORDERS0, 100): start_batch()},
        offsets={ORDERS0: Offsets(100, 140)},
    )


def make(cluster: FakeCluster, sightings: Sightings | None = None) -> Collector:
    return Collector(
        cluster,
        cluster="prod",
        settings=CollectorSettings(coordinator_source="describe"),
        open_partitions=set(),
        clock_ms=lambda: cluster.clock,
        sightings=sightings,
    )


def txn_of(result: SweepResult, tp: TP = ORDERS0) -> OpenTransaction:
    (snap,) = [s for s in result.snapshots if (s.topic, s.partition) == tp]
    (txn,) = snap.open_transactions
    return txn


def snapshot(
    at_ms: int, *txns: OpenTransaction, cluster: str = "prod", tp: TP = ORDERS0
) -> PartitionSnapshot:
    return PartitionSnapshot(
        cluster=cluster,
        sweep_id="s",
        observed_at_ms=at_ms,
        leader=1,
        topic=tp[0],
        partition=tp[1],
        open_transactions=txns,
    )


def txn(opened_after_ms: int | None, seen_open_ms: int | None, start_offset: int = 100) -> OpenTransaction:
    return OpenTransaction(
        producer_id=1000 + start_offset,
        producer_epoch=5,
        start_offset=start_offset,
        opened_after_ms=opened_after_ms,
        seen_open_ms=seen_open_ms,
    )


# ---------------------------------------------------------------------------------------------- restart


def test_a_restarted_collector_keeps_the_earliest_sighting_its_snapshots_published() -> None:
    """Before: `Sightings` lived only in memory, so after a restart the open transaction was first seen at the
    new run's first report, with no "opened after" at all; the proofs, the re-describe schedule and the duration
    metric started again. Now the run starts from the snapshots it published (and ignores another cluster's)."""
    cluster = cluster_with(txn_open=False)
    before = make(cluster)
    before.sweep()  # the report without it: the transaction opened after this one
    cluster.producers[ORDERS0] = [producer()]
    published = [before.sweep(), before.sweep()]
    first = txn_of(published[0])
    assert first.opened_after_ms is not None and first.seen_open_ms is not None
    assert txn_of(published[1]) == first  # fixed at the first report

    cluster.clock += 600_000  # the restart
    snapshots = [s for r in published for s in r.snapshots]
    other = snapshot(T0, txn(None, T0 - 1), cluster="staging")  # same partition, another cluster: not ours
    after = make(cluster, Sightings.from_snapshots([other, *snapshots], "prod"))
    again = txn_of(after.sweep())
    assert (again.opened_after_ms, again.seen_open_ms) == (first.opened_after_ms, first.seen_open_ms)


def test_restoring_keeps_the_earliest_bounds_any_snapshot_gave_and_only_what_the_newest_has_open() -> None:
    """A run before this fix restarted (or a stale answer reset the sighting): its later snapshots carry a later
    sighting and a bound after it. The earliest wins, and a bound not before it is dropped (as in the job,
    `detectors.tracking.earliest_sightings`). A transaction the partition's newest snapshot no longer has open is
    not restored; the newest snapshot's time is the partition's last report."""
    older = snapshot(T0, txn(T0 - 5_000, T0 + 10), txn(None, T0 + 10, start_offset=7))
    reset = snapshot(T0 + 60_000, txn(T0 + 50_000, T0 + 60_010))  # offset 7 closed meanwhile
    sightings = Sightings.from_snapshots([older, reset], "prod")
    assert sightings.bounds(ORDERS0, 1100, 100, T0 + 99_000) == (T0 - 5_000, T0 + 10)
    assert len(sightings) == 1 and not sightings.knows(ORDERS0, 7)
    # A transaction first reported after the restart opened after the newest snapshot (which did not have it).
    assert sightings.bounds(ORDERS0, 2000, 300, T0 + 99_000) == (T0 + 60_000, T0 + 99_000)


def test_a_partition_whose_newest_snapshot_has_a_transaction_without_sighting_gets_no_opened_after() -> None:
    # A snapshot from before sightings were published (seen_open_ms None): that report had the transaction open,
    # so its time is no "opened after" for any transaction, and none is restored.
    sightings = Sightings.from_snapshots([snapshot(T0, txn(None, None))], "prod")
    assert len(sightings) == 0
    assert sightings.bounds(ORDERS0, 1100, 100, T0 + 5_000) == (None, T0 + 5_000)


def test_an_earlier_probe_sighting_still_wins_over_a_restored_one() -> None:
    sightings = Sightings.from_snapshots([snapshot(T0, txn(T0 - 100, T0 + 10))], "prod")
    assert sightings.bounds(ORDERS0, 1100, 100, T0 + 9_000, T0 + 5) == (T0 - 100, T0 + 5)
    assert sightings.bounds(ORDERS0, 1100, 100, T0 + 9_000, T0 + 50) == (T0 - 100, T0 + 5)


# ----------------------------------------------------------------------------- the snapshot topic's tail


class Rec:
    def __init__(self, value: bytes | None, headers: list[tuple[str, bytes]] | None = None) -> None:
        self.value = value
        self.headers = [("txnwatch.type", b"partition-snapshot")] if headers is None else headers


class TailConsumer:
    """One partition of the snapshot topic, from offset `begin`: serves what lies from the seek on."""

    def __init__(self, records: list[Rec] | None, begin: int = 0) -> None:
        self.records, self.begin, self.pos = records, begin, 0

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        return None if self.records is None else {0}

    def assign(self, tps: list[Any]) -> None:
        self.tp = tps[0]

    def beginning_offsets(self, tps: list[Any]) -> dict[Any, int]:
        return {tp: self.begin for tp in tps}

    def end_offsets(self, tps: list[Any]) -> dict[Any, int]:
        assert self.records is not None
        return {tp: self.begin + len(self.records) for tp in tps}

    def seek(self, tp: Any, offset: int) -> None:
        self.pos = offset

    def position(self, tp: Any) -> int:
        return self.pos

    def poll(self, timeout_ms: int) -> dict[Any, list[Rec]]:
        assert self.records is not None
        recs = self.records[self.pos - self.begin :]
        self.pos += len(recs)
        return {self.tp: recs} if recs else {}


def test_the_tail_read_is_bounded_and_keeps_only_snapshots(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="admin.collect.restore")
    snaps = [snapshot(T0 + i, txn(None, T0 + i)) for i in range(5)]
    records = [Rec(s.model_dump_json().encode()) for s in snaps]
    records += [
        Rec(b'{"broker": 1}', [("txnwatch.type", b"broker-sweep-summary")]),
        Rec(b"not json"),
        Rec(None),
    ]
    read = list(recent_snapshots(TailConsumer(records, begin=40), "t", timeout_s=5, records=5))  # type: ignore[arg-type]
    assert read == snaps[3:]  # the last 5 records: two snapshots, a summary, two unreadable
    assert list(recent_snapshots(TailConsumer(None), "t", timeout_s=5)) == []  # type: ignore[arg-type]
    assert "no sightings to restore" in caplog.text


# ------------------------------------------------------------------------------------------ stale answers


def test_a_stale_replica_answer_without_the_transaction_does_not_reset_its_sighting() -> None:
    """Every metadata answer of one sweep is stale: orders-0 led by broker 2 at epoch 4, a replica whose log does
    not have the transaction (its leader, broker 1 at epoch 5, does). Before: an answer without open transactions
    was never fenced, so the sighting was forgotten, an empty snapshot published, and the next sweep saw the
    transaction anew (seen open then, "opened after" the stale answer). Now broker 2's own ListOffsets at epoch 4
    (FENCED_LEADER_EPOCH) drops its answer: no report of orders-0 this sweep, and the sighting stands."""
    cluster = cluster_with(txn_open=False)
    collector = make(cluster)
    collector.sweep()
    cluster.producers[ORDERS0] = [producer()]
    first = txn_of(collector.sweep())

    cluster.replica_states[(ORDERS0, 2)] = []
    cluster.views = [dict(cluster.leaders) | {ORDERS0: 2}] * 5
    cluster.epoch_views = [{ORDERS0: 4, ORDERS1: 2}] * 5
    stale = collector.sweep()
    assert stale.empties == [] and stale.snapshots == []
    assert {s.broker: s.errors for s in stale.summaries}[2] == {"NOT_LEADER_OF_RECORD": 1}
    assert collector.open_partitions == {ORDERS0}

    cluster.views, cluster.epoch_views = [], []  # the metadata is current again
    again = txn_of(collector.sweep())
    assert (again.opened_after_ms, again.seen_open_ms) == (first.opened_after_ms, first.seen_open_ms)


def test_the_leaders_own_answer_without_the_transaction_still_closes_it() -> None:
    cluster = cluster_with(txn_open=True)
    collector = make(cluster)
    collector.sweep()
    cluster.producers[ORDERS0] = []
    result = collector.sweep()
    (empty,) = result.empties
    # Fenced by the leader's ListOffsets, which says it leads; the empty snapshot carries no offsets, as before.
    assert cluster.offsets_calls[-1] == {1: [ORDERS0]} and cluster.offsets_epochs[-1][ORDERS0] == 5
    assert (empty.topic, empty.partition, empty.last_stable_offset, empty.high_watermark) == (
        "orders",
        0,
        None,
        None,
    )
    cluster.producers[ORDERS0] = [producer(current_txn_start_offset=150)]
    cluster.starts[(ORDERS0, 150)] = start_batch(base_offset=150)
    reopened = txn_of(collector.sweep())
    assert reopened.opened_after_ms == empty.observed_at_ms  # a new transaction, after the closing report
