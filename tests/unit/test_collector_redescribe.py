"""Between sweeps: the probe that sees new open transactions, and the re-describe that comes when a report of a
partition can prove its young transaction (admin/collect/redescribe.py), against a scripted cluster."""

from __future__ import annotations

import random
import threading
from typing import Any

import pytest
from collector_fakes import T0, FakeCluster, producer, start_batch

from admin.collect.collector import Collector, between_sweeps
from admin.collect.metrics import CollectorMetrics
from admin.collect.redescribe import (
    FOLLOW_UPS_MS,
    MARGIN_MS,
    ORDERED_FIRST_REPORT_MS,
    ORDERED_FOLLOW_UPS_MS,
    Redescribes,
)
from admin.wire.types import Offsets, SweepResult
from common.settings import CollectorSettings
from detectors.models import DetectionLimits
from detectors.rules import TxnFacts, settled, settles_at_ms

pytestmark = pytest.mark.unit

ORDERS0 = ("orders", 0)
LIMITS = DetectionLimits()  # grace 4 s, skew 2 s
EPOCH = 7


def make(
    cluster: FakeCluster, metrics: CollectorMetrics | None = None, *, ordered: bool = False
) -> Collector:
    return Collector(
        cluster,
        cluster="prod",
        settings=CollectorSettings(),
        open_partitions=set(),
        metrics=metrics,
        clock_ms=lambda: cluster.clock,
        redescribes=Redescribes(LIMITS, ordered=ordered),
    )


def young_orphan(opened_at_ms: int) -> FakeCluster:
    """`orders-0` with a transaction opened at `opened_at_ms` (its records' time), LSO 100 below HW 140."""
    cluster = FakeCluster(
        leaders={ORDERS0: 1, ("orders", 1): 2},
        epochs={ORDERS0: EPOCH, ("orders", 1): 3},
        starts={(ORDERS0, 100): start_batch(start_timestamp_ms=opened_at_ms)},
        offsets={ORDERS0: Offsets(140, 140), ("orders", 1): Offsets(5, 5)},
    )
    return cluster


def begin(cluster: FakeCluster) -> None:
    cluster.producers[ORDERS0] = [producer(last_timestamp_ms=cluster.clock)]
    cluster.offsets[ORDERS0] = Offsets(100, 140)


def facts(snap: Any) -> TxnFacts:
    (t,) = snap.open_transactions
    return TxnFacts(
        snap.topic,
        snap.partition,
        t.producer_id,
        t.first_batch_epoch,
        t.open_since_ms,
        snap.observed_at_ms,
        seen_open_ms=t.seen_open_ms,
    )


# ------------------------------------------------------------------------------------------ the rule


def test_settles_at_is_the_first_report_time_at_which_the_rules_settle_a_transaction() -> None:
    rng = random.Random(7)
    for _ in range(20_000):
        lim = DetectionLimits(
            grace_ms=rng.choice([0, 1, 4_000, 10_000]), clock_skew_ms=rng.choice([0, 2_000])
        )
        since = rng.choice([-1, 0, T0 + rng.randint(-20_000, 20_000)])
        seen = rng.choice([None, T0 + rng.randint(-20_000, 20_000)])
        at = settles_at_ms(since, seen, lim)
        for obs in (T0 + rng.randint(-30_000, 30_000), *(() if at is None else (at - 1, at))):
            t = TxnFacts("orders", 0, 1, 0, since, obs, seen_open_ms=seen)
            assert settled(t, lim) == (at is not None and obs >= at), (since, seen, obs, at)


# ---------------------------------------------------------------------------------------------- probe


def test_a_probe_sees_a_new_transaction_and_its_re_describe_proves_it_a_grace_later() -> None:
    """A transaction opened between sweeps: the probe's ListOffsets shows its first batch below the high
    watermark (LSO < HW), so it was open then; the partition is described again once the grace has passed since
    that moment, and that report alone settles it, long before the next full sweep."""
    cluster = young_orphan(opened_at_ms=T0 + 60_000 - 10_000)  # records stamped 10 s old: event time
    metrics = CollectorMetrics()
    collector = make(cluster, metrics)
    collector.sweep()  # nothing open yet
    cluster.clock += 1_000
    begin(cluster)
    assert collector.probe() == 2
    probed_at = cluster.clock
    assert collector.due() == []
    due_at = probed_at + LIMITS.clock_skew_ms + LIMITS.grace_ms + 1 + MARGIN_MS
    assert collector.seconds_until_due() == pytest.approx((due_at - cluster.clock) / 1000)
    cluster.clock = due_at - 1
    assert collector.due() == []
    cluster.clock = due_at
    assert collector.due() == [ORDERS0]
    described_before = sum(cluster.describe_requests.values())
    covered_before = metrics.partitions_described._value.get()
    result = collector.sweep(only=collector.due())
    assert result.redescribe and result.summaries == [] and result.partitions_total == 1
    assert sum(cluster.describe_requests.values()) == described_before + 1  # that partition alone
    assert cluster.batch_sizes[-1] == 1
    (s,) = result.snapshots
    (t,) = s.open_transactions
    assert t.seen_open_ms == probed_at  # the probe's sighting, not this report's
    assert settled(facts(s), LIMITS)
    assert result.positions == [] or result.positions[0].as_of_ms >= s.observed_at_ms
    # Settled: only the follow-ups remain, for proofs that wait on coordinator events.
    assert collector.seconds_until_due() == pytest.approx(FOLLOW_UPS_MS[0] / 1000, abs=0.01)
    assert metrics.redescribes._value.get() == 1 and metrics.probes._value.get() == 1
    # A re-describe is no sweep: the coverage figures stay the last sweep's.
    assert metrics.partitions_described._value.get() == covered_before


def test_where_proofs_are_ordered_by_offsets_a_young_transaction_is_reported_early_and_again() -> None:
    """Ordered (the job reads __transaction_state): the probe's sighting is described 1 s later, and each of
    the next four reports is followed by another 1 s after it while none settles it, each sweep measuring the log's position that the
    next report is ordered after (detectors.rules.logged_before_report); then the settling report by the clocks.
    A transaction that ended by the early report's time is dropped by the probe, as before."""
    cluster = young_orphan(opened_at_ms=T0 + 61_000)  # written as the probe sees it
    collector = make(cluster, ordered=True)
    collector.sweep()
    cluster.clock += 1_000
    begin(cluster)
    collector.probe()
    probed_at = cluster.clock
    assert collector.seconds_until_due() == pytest.approx((ORDERED_FIRST_REPORT_MS + MARGIN_MS) / 1000)
    cluster.clock = probed_at + ORDERED_FIRST_REPORT_MS + MARGIN_MS
    reports = []
    for pause_ms in ORDERED_FOLLOW_UPS_MS:
        assert collector.due() == [ORDERS0]
        result = collector.sweep(only=collector.due())
        reports.append(result.snapshots[0])
        assert result.positions == [] or result.positions[0].as_of_ms >= result.snapshots[0].observed_at_ms
        assert collector.seconds_until_due() == pytest.approx(pause_ms / 1000, abs=0.01)
        cluster.clock += pause_ms
    assert [r.sweep_id.rpartition("-")[2] for r in reports] == ["2", "3", "4", "5"]  # one run, in order
    (t,) = collector.sweep(only=collector.due()).snapshots[0].open_transactions
    # The ordered follow-ups done: the next is the report that settles it by the clocks.
    settles = settles_at_ms(t.open_since_ms, t.seen_open_ms, LIMITS)
    assert settles is not None and settles > cluster.clock
    assert collector.seconds_until_due() == pytest.approx(
        (settles + MARGIN_MS - cluster.clock) / 1000, abs=0.01
    )

    # A short transaction: ended by the early report's time, the probe drops it.
    short = young_orphan(opened_at_ms=T0 + 60_000)
    collector = make(short, ordered=True)
    collector.sweep()
    begin(short)
    collector.probe()
    short.clock += ORDERED_FIRST_REPORT_MS
    short.offsets[ORDERS0] = Offsets(150, 150)
    collector.probe()
    assert collector.seconds_until_due() is None


def test_a_probe_sighting_at_another_leader_epoch_proves_nothing() -> None:
    """Between the probe and the report the partition changed leader: the batch at the probe's last stable offset
    may have been truncated and another written there, so the report's transaction is first seen by the report."""
    cluster = young_orphan(opened_at_ms=T0)
    collector = make(cluster)
    collector.sweep()
    begin(cluster)
    collector.probe()
    probed_at = cluster.clock
    cluster.clock += 5_000
    cluster.epochs[ORDERS0] = EPOCH + 1
    result = collector.sweep(only=[ORDERS0])
    (t,) = result.snapshots[0].open_transactions
    assert t.seen_open_ms is not None and t.seen_open_ms > probed_at


def test_a_transaction_a_sweep_saw_young_is_described_again_when_a_report_can_settle_it() -> None:
    cluster = young_orphan(opened_at_ms=T0 + 60_000)
    begin(cluster)
    collector = make(cluster)
    first = collector.sweep()
    (t,) = first.snapshots[0].open_transactions
    assert not settled(facts(first.snapshots[0]), LIMITS)
    at = settles_at_ms(t.open_since_ms, t.seen_open_ms, LIMITS)
    assert at is not None
    cluster.clock = at + MARGIN_MS - 1
    assert collector.due() == []
    cluster.clock = at + MARGIN_MS
    assert collector.due() == [ORDERS0]
    assert settled(facts(collector.sweep(only=[ORDERS0]).snapshots[0]), LIMITS)


def test_a_re_describe_reports_the_leader_epoch_and_the_start_batchs_as_a_sweep_does() -> None:
    """A re-describe's report is an ordinary snapshot: the leader epoch its answer was confirmed at, and the
    epoch the start batch was appended at, which the rules compare (no marker can be lost within one epoch)."""
    cluster = young_orphan(opened_at_ms=T0 + 60_000)
    cluster.starts[(ORDERS0, 100)] = start_batch(start_timestamp_ms=T0 + 60_000, leader_epoch=EPOCH)
    begin(cluster)
    collector = make(cluster)
    collector.sweep()
    cluster.clock += 5_000
    (s,) = collector.sweep(only=[ORDERS0]).snapshots
    assert (s.leader_epoch, s.open_transactions[0].start_batch_leader_epoch) == (EPOCH, EPOCH)
    cluster.epochs[ORDERS0] = EPOCH + 1  # an election since: the same start batch, another leader epoch
    (moved,) = collector.sweep(only=[ORDERS0]).snapshots
    assert (moved.leader_epoch, moved.open_transactions[0].start_batch_leader_epoch) == (EPOCH + 1, EPOCH)


def test_a_partition_whose_awaited_transactions_ended_is_not_described_again() -> None:
    """The probe after the schedule shows the last stable offset past the transaction: it ended (committed, as
    most do within the grace), so there is nothing left to prove there."""
    cluster = young_orphan(opened_at_ms=T0 + 60_000)
    begin(cluster)
    collector = make(cluster)
    collector.sweep()
    assert collector.seconds_until_due() is not None
    cluster.offsets[ORDERS0] = Offsets(150, 150)  # committed; its marker below the high watermark
    cluster.producers[ORDERS0] = []
    collector.probe()
    assert collector.seconds_until_due() is None


def test_a_probe_leaves_a_transaction_already_reported_to_its_reports() -> None:
    cluster = young_orphan(opened_at_ms=T0 - 60_000)
    begin(cluster)
    collector = make(cluster)
    collector.sweep()  # a first report never settles: it must be seen open for the grace
    scheduled = collector.seconds_until_due()
    assert scheduled is not None
    collector.probe()
    assert collector.seconds_until_due() == scheduled  # the sweep's sighting stands, the probe adds none


def test_follow_ups_only_after_the_proving_report_and_only_while_the_transaction_stays() -> None:
    cluster = young_orphan(opened_at_ms=T0 - 600_000)  # long open: no report is a "proving" one
    begin(cluster)
    collector = make(cluster)
    collector.sweep()
    cluster.clock += 10_000
    collector.sweep()  # settled long ago (records' time) and seen open 10 s ago: no follow-up
    assert collector.seconds_until_due() is None
    young = young_orphan(opened_at_ms=T0 + 60_000)
    begin(young)
    collector = make(young)
    first = collector.sweep()
    (t,) = first.snapshots[0].open_transactions
    young.clock = (settles_at_ms(t.open_since_ms, t.seen_open_ms, LIMITS) or 0) + MARGIN_MS
    collector.sweep(only=collector.due())
    assert collector.seconds_until_due() is not None  # a follow-up is scheduled
    young.offsets[ORDERS0] = Offsets(150, 150)  # the transaction ended
    collector.probe()
    assert collector.seconds_until_due() is None


def test_a_transaction_behind_a_pinning_one_is_first_seen_by_the_probe_whose_high_watermark_passed_it() -> (
    None
):
    """The partition's last stable offset stays at an older open transaction, so the probe cannot see a new one
    behind it; but the first probe whose high watermark is past the new one's first batch bounds its opening,
    at the same leader epoch only."""
    for epoch_moves in (False, True):
        cluster = young_orphan(opened_at_ms=T0 - 600_000)
        begin(cluster)  # the pinning transaction at 100, reported open
        collector = make(cluster)
        collector.sweep()
        cluster.clock += 1_000
        cluster.offsets[ORDERS0] = Offsets(100, 146)  # a batch at 145: a transaction behind the pinning one
        collector.probe()
        marked_at = cluster.clock
        cluster.clock += 1_000
        collector.probe()  # no new high watermark: the first mark stands
        cluster.clock += 6_000
        if epoch_moves:
            cluster.epochs[ORDERS0] = EPOCH + 1
        cluster.producers[ORDERS0].append(producer(producer_id=2000, current_txn_start_offset=145))
        cluster.starts[(ORDERS0, 145)] = start_batch(base_offset=145, producer_id=2000, start_timestamp_ms=T0)
        behind = next(t for t in collector.sweep().snapshots[0].open_transactions if t.start_offset == 145)
        if epoch_moves:
            assert behind.seen_open_ms is not None and behind.seen_open_ms > marked_at + 6_000
        else:
            assert behind.seen_open_ms == marked_at


# ----------------------------------------------------------------------------------------- the loop


class Ticks:
    """A monotonic clock that moves with the cluster's (ms) clock; waiting moves both."""

    def __init__(self, cluster: FakeCluster) -> None:
        self.cluster = cluster

    def monotonic(self) -> float:
        return self.cluster.clock / 1000


class Wait(threading.Event):
    def __init__(self, cluster: FakeCluster) -> None:
        super().__init__()
        self.cluster = cluster
        self.waits: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        assert timeout is not None
        self.waits.append(timeout)
        self.cluster.clock += max(1, round(timeout * 1000))
        return self.is_set()


def test_between_sweeps_probes_re_describes_when_due_and_stops_at_the_next_sweep() -> None:
    cluster = young_orphan(opened_at_ms=T0)
    collector = make(cluster)
    collector.sweep()
    begin(cluster)
    published: list[SweepResult] = []
    ticks = Ticks(cluster)
    stop = Wait(cluster)
    start = ticks.monotonic()
    between_sweeps(
        collector,
        published.append,
        until=start + 10,
        probe_interval_s=1,
        stop=stop,
        monotonic=ticks.monotonic,
    )
    assert ticks.monotonic() >= start + 10
    assert len(cluster.offsets_calls) >= 10  # a probe a second
    proving, *follow_ups = published
    assert proving.redescribe and settled(facts(proving.snapshots[0]), LIMITS)
    proved_at = proving.snapshots[0].observed_at_ms
    assert proved_at - start * 1000 < LIMITS.clock_skew_ms + LIMITS.grace_ms + 1_500
    # Then twice more, for proofs that wait on coordinator events a moment after the write (the owner's commit).
    assert [r.snapshots[0].observed_at_ms - proved_at for r in follow_ups] == pytest.approx(
        [1_000, 3_000], abs=20
    )


def test_a_probe_slower_than_half_the_interval_spaces_the_next_by_its_own_duration() -> None:
    cluster = young_orphan(opened_at_ms=T0)
    collector = make(cluster)
    collector.sweep()
    ticks = Ticks(cluster)
    stop = Wait(cluster)
    slow_probe = collector.probe

    def probe() -> int:
        cluster.clock += 1_500  # a large cluster: 1.5 s a probe
        return slow_probe()

    collector.probe = probe  # type: ignore[method-assign]
    start = ticks.monotonic()
    between_sweeps(
        collector, lambda _r: None, until=start + 30, probe_interval_s=1, stop=stop, monotonic=ticks.monotonic
    )
    # Every 3 s (1.5 s probing, 1.5 s waiting), not back to back.
    assert 9 <= len(cluster.offsets_calls) <= 11


def test_a_failing_re_describe_is_not_retried_in_a_loop() -> None:
    cluster = young_orphan(opened_at_ms=T0)
    collector = make(cluster)
    collector.sweep()
    begin(cluster)
    collector.probe()
    attempts: list[int] = []

    def publish(_: SweepResult) -> None:
        attempts.append(cluster.clock)
        raise RuntimeError("snapshot topic unavailable")

    ticks = Ticks(cluster)
    stop = Wait(cluster)
    between_sweeps(
        collector,
        publish,
        until=ticks.monotonic() + 10,
        probe_interval_s=0,
        stop=stop,
        monotonic=ticks.monotonic,
    )
    # The proving re-describe and its two follow-ups, each once: a failure does not spin the loop.
    assert len(attempts) == 1 + len(FOLLOW_UPS_MS) and len(stop.waits) < 10
