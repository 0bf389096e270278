"""The sweep's logic against a scripted cluster: batching, retries, backoff, start-batch cache, empty snapshots."""

from __future__ import annotations

import itertools
import math
import threading
from typing import Any

import pytest
from collector_fakes import T0, FakeCluster, producer, start_batch
from prometheus_client import generate_latest

from admin.collect.collector import Collector, chunks, run
from admin.collect.metrics import CollectorMetrics
from admin.wire.types import BrokerTimeout, FetchFailure, Offsets, SweepResult
from common.settings import CollectorSettings

pytestmark = pytest.mark.unit

ORDERS0 = ("orders", 0)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s


def make(
    cluster: FakeCluster, *, open_partitions: set[Any] | None = None, **settings: Any
) -> tuple[Collector, Clock]:
    clock = Clock()
    collector = Collector(
        cluster,
        cluster="prod",
        settings=CollectorSettings(**settings),
        open_partitions=set() if open_partitions is None else open_partitions,
        clock_ms=lambda: cluster.clock,
        monotonic=clock.monotonic,
        sleep=clock.sleep,
    )
    return collector, clock


def one_hanging() -> FakeCluster:
    return FakeCluster(
        leaders={ORDERS0: 1, ("orders", 1): 2, ("__transaction_state", 0): 3},
        producers={ORDERS0: [producer(), producer(producer_id=7, current_txn_start_offset=-1)]},
        starts={(ORDERS0, 100): start_batch()},
        offsets={ORDERS0: Offsets(100, 140)},
    )


def snap(result: SweepResult, tp: tuple[str, int]) -> Any:
    return next(s for s in result.snapshots if (s.topic, s.partition) == tp)


# ---------------------------------------------------------------------------------------- snapshots


def test_snapshot_carries_leader_start_batch_offsets_and_broker_timeout() -> None:
    cluster = one_hanging()
    cluster.timeouts = {1: BrokerTimeout(900_000)}
    result = make(cluster)[0].sweep()
    s = snap(result, ORDERS0)
    (t,) = s.open_transactions  # the idempotent producer without an open transaction is left out
    assert (t.producer_id, t.producer_epoch, t.start_offset, t.coordinator_epoch) == (1000, 5, 100, 3)
    assert (t.start_timestamp_ms, t.start_batch_producer_epoch) == (T0, 5)
    assert (t.last_sequence, t.last_timestamp_ms) == (9, T0 + 1_000)
    assert (s.leader, s.last_stable_offset, s.high_watermark, s.max_transaction_timeout_ms) == (
        1,
        100,
        140,
        900_000,
    )
    assert s.cluster == "prod" and s.sweep_id == result.sweep_id
    assert len(result.snapshots) == 1 and result.empties == []
    assert result.partitions_total == result.partitions_covered == 3


def test_snapshot_carries_the_leader_epoch_and_the_start_batchs() -> None:
    """The leader epoch the answer was asked at (and its ListOffsets confirmed) is the snapshot's; the epoch its
    start batch was appended at is the transaction's: the rules compare them (a marker can only be lost across
    a leader change). Without epochs in the metadata, or in the batch's header, they are unknown."""
    cluster = one_hanging()
    cluster.epochs = {ORDERS0: 5}
    cluster.starts[(ORDERS0, 100)] = start_batch(leader_epoch=4)
    collector = make(cluster)[0]
    s = snap(collector.sweep(), ORDERS0)
    assert s.leader_epoch == 5 and s.open_transactions[0].start_batch_leader_epoch == 4
    # Cached with its start batch: the next sweep, in the same epoch, still knows it.
    again = snap(collector.sweep(), ORDERS0)
    assert (again.leader_epoch, again.open_transactions[0].start_batch_leader_epoch) == (5, 4)
    assert len(cluster.fetch_calls) == 1
    blind = one_hanging()
    s = snap(make(blind)[0].sweep(), ORDERS0)
    assert s.leader_epoch is None and s.open_transactions[0].start_batch_leader_epoch is None


def test_the_leader_epoch_is_unknown_when_the_leaders_list_offsets_did_not_confirm_it() -> None:
    cluster = one_hanging()
    cluster.epochs = {ORDERS0: 5}
    cluster.offsets[ORDERS0] = Offsets(None, None, "UNKNOWN_SERVER_ERROR")
    s = snap(make(cluster)[0].sweep(), ORDERS0)
    assert s.leader == 1 and s.leader_epoch is None


def test_observed_at_is_when_the_request_to_that_leader_was_sent() -> None:
    cluster = one_hanging()
    cluster.producers[("orders", 1)] = [producer(producer_id=9, current_txn_start_offset=5)]
    result = make(cluster)[0].sweep()
    # The fake's clock ticks once per request: each snapshot has its own request's time.
    times = {(s.topic, s.partition): s.observed_at_ms for s in result.snapshots}
    assert times[ORDERS0] != times[("orders", 1)]
    assert all(T0 + 60_000 <= t < cluster.clock for t in times.values())


def test_a_slow_answer_is_stamped_when_its_request_was_sent_and_seen_open_when_it_arrived() -> None:
    """A leader's answer describes its state at some moment between the request and the response. Stamped at
    receipt, an answer 7 s late claims the leader still had the transaction open 7 s after it last said so:
    past the grace (4 s) and skew (2 s), a transaction that committed just after the leader answered became
    HANGING coordinator-completed. `observed_at` is the send time (the snapshot is no older); the transaction
    is known open by the receipt time (`seen_open_ms`), and the position is measured after it."""
    cluster = with_transaction_log()
    cluster.answer_delay_ms = {1: 7_000}
    sent = cluster.clock  # broker 1 is asked first
    result = make(cluster)[0].sweep()
    s = snap(result, ORDERS0)
    (t,) = s.open_transactions
    assert s.observed_at_ms == sent
    assert t.seen_open_ms == sent + 7_001  # its answer arrived 7 s (and the fake's tick) later
    (position,) = result.positions
    assert position.as_of_ms >= t.seen_open_ms


def test_a_transaction_first_seen_after_a_slow_answer_opened_after_that_request_was_sent() -> None:
    # The previous report of the partition without it may be from any moment after its request was sent:
    # the transaction opened after that moment, not after the (late) receipt.
    cluster = one_hanging()
    cluster.producers[ORDERS0] = []
    cluster.answer_delay_ms = {1: 7_000}
    collector, _ = make(cluster)
    sent = cluster.clock
    collector.sweep()
    cluster.producers[ORDERS0] = [producer()]
    cluster.answer_delay_ms = {}
    (t,) = snap(collector.sweep(), ORDERS0).open_transactions
    assert t.opened_after_ms == sent


def test_sweep_ids_are_unique_per_sweep() -> None:
    collector, _ = make(one_hanging())
    assert collector.sweep().sweep_id != collector.sweep().sweep_id


@pytest.mark.parametrize(
    ("txns", "expected_offsets"),
    [
        pytest.param(
            [producer(producer_id=2, current_txn_start_offset=50), producer()], [50, 100], id="by-start"
        ),
        pytest.param([producer(current_txn_start_offset=-1)], None, id="idempotent-only-is-not-open"),
    ],
)
def test_open_transactions_sorted_and_only_open_ones(
    txns: list[Any], expected_offsets: list[int] | None
) -> None:
    cluster = one_hanging()
    cluster.producers[ORDERS0] = txns
    result = make(cluster)[0].sweep()
    if expected_offsets is None:
        assert result.snapshots == []
    else:
        assert [t.start_offset for t in snap(result, ORDERS0).open_transactions] == expected_offsets


# ------------------------------------------------------------------------------------------ batching


@pytest.mark.parametrize("partitions", [1, 499, 500, 501, 1_234, 10_000])
def test_at_most_500_partitions_per_request_and_ceil_requests_per_broker(partitions: int) -> None:
    leaders = {("t", p): 1 + p % 2 for p in range(partitions)}
    cluster = FakeCluster(leaders=leaders)
    make(cluster)[0].sweep()
    assert max(cluster.batch_sizes) <= 500
    for broker in (1, 2):
        led = sum(1 for b in leaders.values() if b == broker)
        assert cluster.describe_requests[broker] == math.ceil(led / 500)


def test_batch_size_setting_is_honoured() -> None:
    cluster = FakeCluster(leaders={("t", p): 1 for p in range(250)})
    make(cluster, describe_batch_size=100)[0].sweep()
    assert cluster.batch_sizes == [100, 100, 50]


def test_chunks() -> None:
    assert chunks([("a", i) for i in range(5)], 2) == [[("a", 0), ("a", 1)], [("a", 2), ("a", 3)], [("a", 4)]]


# --------------------------------------------------------------------------------- leaders and errors


def test_not_leader_is_refreshed_and_retried_within_the_sweep() -> None:
    cluster = one_hanging()
    # Metadata says broker 2 leads orders-0 (stale); the next metadata call has the truth.
    stale = dict(cluster.leaders) | {ORDERS0: 2}
    cluster.views = [stale]
    collector, clock = make(cluster, retry_backoff_ms=200)
    result = collector.sweep()
    assert snap(result, ORDERS0).leader == 1
    assert result.partitions_covered == 3 and all(not s.errors for s in result.summaries)
    # Once to route, and once after each round of answers (which also routes the retry).
    assert cluster.metadata_calls == 3 and clock.slept == [0.2]


# ------------------------------------------------------------------- stale leaders (issue 30, item 4)


def test_an_answer_from_a_replica_the_metadata_read_after_it_does_not_name_is_asked_again_of_the_leader() -> (
    None
):
    """Any replica answers DescribeProducers from its own log with error NONE (`Partition.activeProducerState`).
    Stale metadata routes orders-0 to broker 2, a replica that fell behind: its log still has the transaction
    open after the leader (1) wrote its commit marker. The metadata read after the answers names broker 1: the
    replica's answer is dropped and broker 1 is asked in the same sweep."""
    cluster = one_hanging()
    cluster.producers[ORDERS0] = []  # committed at the leader
    cluster.replica_states[(ORDERS0, 2)] = [producer()]  # still open in the lagging replica's log
    cluster.views = [dict(cluster.leaders) | {ORDERS0: 2}]
    collector, _ = make(cluster, open_partitions={ORDERS0})
    result = collector.sweep()
    assert [(s.topic, s.partition) for s in result.snapshots] == []
    (empty,) = result.empties
    assert (empty.topic, empty.partition, empty.leader) == ("orders", 0, 1)
    assert cluster.describe_requests == {1: 1, 2: 1, 3: 1}  # orders-0 asked of 2 (with orders-1), then of 1
    assert all(not s.errors for s in result.summaries)


def test_a_deposed_leader_that_every_metadata_answer_still_names_is_dropped_by_its_own_list_offsets() -> None:
    """Every metadata answer is stale (the brokers asked had not learnt of the move): orders-0 led by broker 2
    at epoch 4. Broker 2 knows better: it follows broker 1 at epoch 5. Its DescribeProducers answer (its lagging
    log: the transaction open) cannot be fenced, but its ListOffsets at epoch 4 answers FENCED_LEADER_EPOCH: the
    answer is dropped, counted under NOT_LEADER_OF_RECORD, and the partition keeps its last published state."""
    cluster = one_hanging()
    cluster.epochs = {ORDERS0: 5}
    cluster.producers[ORDERS0] = []
    cluster.replica_states[(ORDERS0, 2)] = [producer()]
    cluster.views = [dict(cluster.leaders) | {ORDERS0: 2}] * 5
    cluster.epoch_views = [{ORDERS0: 4}] * 5
    collector, _ = make(cluster, open_partitions={ORDERS0})
    result = collector.sweep()
    assert result.snapshots == [] and result.empties == []
    assert cluster.offsets_epochs == [{ORDERS0: 4}] and cluster.fetch_epochs == [{ORDERS0: 4}]
    assert {s.broker: s.errors for s in result.summaries}[2] == {"NOT_LEADER_OF_RECORD": 1}
    assert result.partitions_covered == 2
    assert any("broker 2" in p and "FENCED_LEADER_EPOCH" in p for p in result.problems)
    assert collector.open_partitions == {ORDERS0}  # no claim either way this sweep


def test_an_answer_given_at_another_leader_epoch_than_it_was_asked_at_is_asked_again() -> None:
    # Broker 1 lost orders-0 and got it back between the routing metadata (epoch 4) and the one read after its
    # answer (epoch 6): in between it was a follower, so its answer may be from then. Asked again at epoch 6.
    cluster = one_hanging()
    cluster.epochs = {ORDERS0: 6}
    cluster.epoch_views = [{ORDERS0: 4}]
    result = make(cluster)[0].sweep()
    assert cluster.describe_requests[1] == 2
    assert snap(result, ORDERS0).leader == 1 and all(not s.errors for s in result.summaries)
    assert cluster.offsets_epochs == [{ORDERS0: 6}]


def test_offsets_start_batches_and_positions_are_asked_at_the_leader_epoch_of_record() -> None:
    cluster = one_hanging()
    cluster.epochs = {ORDERS0: 5, ("orders", 1): 2, (TXN_LOG, 0): 9}
    result = make(cluster)[0].sweep()
    assert snap(result, ORDERS0).last_stable_offset == 100
    assert cluster.fetch_epochs == [{ORDERS0: 5, ("orders", 1): 2, (TXN_LOG, 0): 9}]
    assert cluster.offsets_epochs == [{ORDERS0: 5, ("orders", 1): 2, (TXN_LOG, 0): 9}]
    assert cluster.end_offsets_epochs == [{(TXN_LOG, 0): 9}]
    assert cluster.log_end_epochs == [{(TXN_LOG, 0): 9}]


def test_retries_are_bounded_and_the_rest_is_reported_uncovered() -> None:
    cluster = one_hanging()
    cluster.partition_errors[ORDERS0] = "NOT_LEADER_OR_FOLLOWER"
    result = make(cluster, retries_per_sweep=2)[0].sweep()
    assert cluster.describe_requests[1] == 3  # first try + 2 retries
    by = {s.broker: s for s in result.summaries}
    assert by[1].errors == {"NOT_LEADER_OR_FOLLOWER": 1} and by[1].partitions_covered == 0
    assert result.partitions_covered == 2


def test_authorization_error_is_counted_named_and_not_retried(caplog: pytest.LogCaptureFixture) -> None:
    cluster = one_hanging()
    cluster.partition_errors[ORDERS0] = "TOPIC_AUTHORIZATION_FAILED"
    result = make(cluster)[0].sweep()
    assert cluster.describe_requests[1] == 1
    assert {s.broker: s.errors for s in result.summaries}[1] == {"TOPIC_AUTHORIZATION_FAILED": 1}
    assert any("Read on topic orders" in p for p in result.problems)
    assert "grant the ACL Read on topic orders" in caplog.text


def test_unreachable_broker_is_counted_backed_off_and_retried_later() -> None:
    cluster = one_hanging()
    cluster.down = {2}
    collector, clock = make(cluster, broker_backoff_initial_s=5, broker_backoff_max_s=60)
    first = collector.sweep()
    by = {s.broker: s for s in first.summaries}
    assert by[2].errors == {"BROKER_UNREACHABLE": 1} and by[2].partitions_covered == 0
    assert by[1].partitions_covered == 1 and by[3].partitions_covered == 1  # the others are swept
    assert snap(first, ORDERS0).leader == 1
    # Within the backoff the broker is not asked at all.
    asked = cluster.describe_requests[2]
    second = collector.sweep()
    assert cluster.describe_requests[2] == asked
    assert {s.broker: s for s in second.summaries}[2].errors == {"BROKER_BACKOFF": 1}
    # After it, asked again; a success clears the backoff.
    clock.now += 6
    cluster.down = set()
    third = collector.sweep()
    assert {s.broker: s for s in third.summaries}[2].partitions_covered == 1
    assert cluster.describe_requests[2] == asked + 1


def test_backoff_grows_exponentially_up_to_the_maximum() -> None:
    cluster = FakeCluster(leaders={("t", 0): 2}, down={2})
    collector, clock = make(cluster, broker_backoff_initial_s=1, broker_backoff_max_s=4, retry_backoff_ms=0)
    asked_at = []
    for _ in range(60):
        before = cluster.describe_requests[2]
        collector.sweep()
        if cluster.describe_requests[2] > before:
            asked_at.append(clock.now)
        clock.now += 0.5
    gaps = [b - a for a, b in itertools.pairwise(asked_at)]
    assert gaps[:5] == [1.0, 2.0, 4.0, 4.0, 4.0]


def test_partition_moved_away_from_a_dead_broker_is_retried_on_its_new_leader() -> None:
    cluster = one_hanging()
    cluster.down = {1}
    # The first metadata still names broker 1 (dead); by the retry the controller moved orders-0 to 2.
    cluster.views = [dict(cluster.leaders)]
    cluster.leaders[ORDERS0] = 2
    result = make(cluster)[0].sweep()
    assert snap(result, ORDERS0).leader == 2
    assert {s.broker: s for s in result.summaries}[1].errors == {}


def test_leaderless_partitions_are_reported_under_broker_minus_one() -> None:
    cluster = one_hanging()
    cluster.leaders[("orders", 1)] = -1
    result = make(cluster)[0].sweep()
    by = {s.broker: s for s in result.summaries}
    assert by[-1].errors == {"LEADER_NOT_AVAILABLE": 1} and by[-1].partitions_covered == 0
    assert result.partitions_covered == 2


def test_invalid_producer_state_is_skipped_not_fatal() -> None:
    cluster = one_hanging()
    cluster.producers[("orders", 1)] = [producer(producer_id=-5, current_txn_start_offset=3)]
    result = make(cluster)[0].sweep()
    assert {s.broker: s.errors for s in result.summaries}[2] == {"INVALID_PRODUCER_STATE": 1}
    assert snap(result, ORDERS0) is not None


# ---------------------------------------------------------------------------------- start-batch cache


def test_start_batch_fetched_once_then_cached_and_forgotten_when_closed() -> None:
    cluster = one_hanging()
    collector, _ = make(cluster)
    first = collector.sweep()
    assert first.start_batch_fetches == 1 and first.new_transactions == 1
    assert cluster.fetch_calls == [{1: [(ORDERS0, 100)]}]
    second = collector.sweep()
    assert second.start_batch_fetches == 0 and len(cluster.fetch_calls) == 1
    assert snap(second, ORDERS0).open_transactions[0].start_timestamp_ms == T0
    cluster.producers[ORDERS0] = []
    collector.sweep()
    assert collector.cached_start_batches == 0


def test_permanent_fetch_failure_is_cached_as_unknown_transient_is_retried() -> None:
    cluster = one_hanging()
    cluster.starts[(ORDERS0, 100)] = FetchFailure("NOT_LEADER_OR_FOLLOWER", permanent=False)
    collector, _ = make(cluster)
    first = collector.sweep()
    assert snap(first, ORDERS0).open_transactions[0].start_timestamp_ms is None
    collector.sweep()
    assert len(cluster.fetch_calls) == 2  # transient: asked again
    cluster.starts[(ORDERS0, 100)] = FetchFailure("OFFSET_OUT_OF_RANGE", permanent=True)
    collector.sweep()
    collector.sweep()
    assert len(cluster.fetch_calls) == 3  # permanent: never again for this transaction
    t = snap(collector.sweep(), ORDERS0).open_transactions[0]
    assert t.start_timestamp_ms is None and t.open_since_ms == T0 + 1_000  # falls back to LastTimestamp


def test_batch_of_another_producer_leaves_start_unknown() -> None:
    cluster = one_hanging()
    cluster.starts[(ORDERS0, 100)] = start_batch(producer_id=55)
    result = make(cluster)[0].sweep()
    t = snap(result, ORDERS0).open_transactions[0]
    assert t.start_timestamp_ms is None and t.start_batch_producer_epoch is None
    assert any("belongs to producer 55" in p for p in result.problems)


def test_epoch_of_the_start_batch_is_kept_apart_from_the_latest_epoch() -> None:
    cluster = one_hanging()
    cluster.producers[ORDERS0] = [producer(producer_epoch=9)]
    cluster.starts[(ORDERS0, 100)] = start_batch(producer_epoch=7)
    t = snap(make(cluster)[0].sweep(), ORDERS0).open_transactions[0]
    assert (t.producer_epoch, t.start_batch_producer_epoch, t.first_batch_epoch) == (9, 7, 7)


def test_offsets_asked_only_for_partitions_with_open_transactions_from_their_leader() -> None:
    cluster = one_hanging()
    make(cluster)[0].sweep()
    assert cluster.offsets_calls == [{1: [ORDERS0]}]


# ----------------------------------------------------------------------------------- empty snapshots


def test_empty_snapshot_once_when_the_open_set_becomes_empty() -> None:
    cluster = one_hanging()
    collector, _ = make(cluster)
    assert collector.sweep().empties == []
    cluster.producers[ORDERS0] = []
    second = collector.sweep()
    (empty,) = second.empties
    assert (empty.topic, empty.partition, empty.leader, empty.open_transactions) == ("orders", 0, 1, ())
    assert collector.sweep().empties == []


def test_uncovered_partition_keeps_its_open_state_until_it_is_described_again() -> None:
    cluster = one_hanging()
    collector, clock = make(cluster, broker_backoff_initial_s=1)
    collector.sweep()
    cluster.down = {1}
    cluster.producers[ORDERS0] = []
    assert collector.sweep().empties == []  # not described: no claim either way
    clock.now += 10
    cluster.down = set()
    assert [(e.topic, e.partition) for e in collector.sweep().empties] == [ORDERS0]


def test_unknown_history_publishes_empty_for_every_covered_partition_once() -> None:
    cluster = one_hanging()
    collector, _ = make(cluster)
    collector._open = None  # what the CLI passes when the snapshot topic could not be read back
    first = collector.sweep()
    assert {(e.topic, e.partition) for e in first.empties} == {("orders", 1), ("__transaction_state", 0)}
    assert collector.sweep().empties == []


def test_restored_open_partition_gets_its_empty_snapshot_after_a_restart() -> None:
    cluster = one_hanging()
    cluster.producers = {}
    collector, _ = make(cluster, open_partitions={ORDERS0})
    assert [(e.topic, e.partition) for e in collector.sweep().empties] == [ORDERS0]


def test_deleted_topic_gets_an_empty_snapshot_without_leader() -> None:
    cluster = one_hanging()
    collector, _ = make(cluster)
    collector.sweep()
    del cluster.leaders[ORDERS0]
    (empty,) = collector.sweep().empties
    assert (empty.topic, empty.partition, empty.leader) == ("orders", 0, -1)


def test_topic_deleted_during_the_sweep() -> None:
    cluster = one_hanging()
    collector, _ = make(cluster, open_partitions={ORDERS0})
    cluster.partition_errors[ORDERS0] = "UNKNOWN_TOPIC_OR_PARTITION"
    cluster.views = [dict(cluster.leaders), {tp: b for tp, b in cluster.leaders.items() if tp != ORDERS0}]
    result = collector.sweep()
    assert [(e.topic, e.partition, e.leader) for e in result.empties] == [("orders", 0, -1)]
    assert result.partitions_total == 2


# --------------------------------------------------------------------------------- broker timeouts


def test_timeouts_read_for_new_brokers_and_refreshed_slowly() -> None:
    cluster = one_hanging()
    collector, clock = make(cluster, config_refresh_s=600)
    collector.sweep()
    collector.sweep()
    assert cluster.timeout_calls == [[1, 2, 3]]
    cluster.brokers[4] = "b4:9092"
    collector.sweep()
    assert cluster.timeout_calls[-1] == [4]
    clock.now += 601
    collector.sweep()
    assert cluster.timeout_calls[-1] == [1, 2, 3, 4]


def test_unknown_timeout_is_none_and_acl_is_named() -> None:
    cluster = one_hanging()
    cluster.timeouts = {1: BrokerTimeout(None, "CLUSTER_AUTHORIZATION_FAILED")}
    result = make(cluster)[0].sweep()
    assert snap(result, ORDERS0).max_transaction_timeout_ms is None
    assert any("DescribeConfigs on the cluster" in p for p in result.problems)


# ------------------------------------------------------------------------------- coordinator log position

TXN_LOG = "__transaction_state"


def with_transaction_log(partitions: int = 3) -> FakeCluster:
    """one_hanging(), with `partitions` partitions of __transaction_state led round-robin by brokers 1..3."""
    cluster = one_hanging()
    del cluster.leaders[(TXN_LOG, 0)]
    for p in range(partitions):
        cluster.leaders[(TXN_LOG, p)] = 1 + p % 3
        cluster.high_watermarks[(TXN_LOG, p)] = 10 * (p + 1)
    return cluster


def test_position_has_the_high_watermark_of_every_transaction_log_partition() -> None:
    cluster = with_transaction_log(5)
    result = make(cluster)[0].sweep()
    (position,) = result.positions
    assert (position.cluster, position.sweep_id, position.topic, position.partitions) == (
        "prod",
        result.sweep_id,
        TXN_LOG,
        5,
    )
    assert position.end_offsets == {0: 10, 1: 20, 2: 30, 3: 40, 4: 50}
    # One ListOffsets per leader, for the partitions it leads; nothing for other topics.
    (asked,) = [wanted for _, wanted in cluster.end_offsets_calls]
    assert asked == {1: [(TXN_LOG, 0), (TXN_LOG, 3)], 2: [(TXN_LOG, 1), (TXN_LOG, 4)], 3: [(TXN_LOG, 2)]}
    assert result.problems == []


def test_as_of_is_after_every_observation_and_before_the_offsets_are_asked() -> None:
    cluster = with_transaction_log()
    cluster.producers[("orders", 1)] = [producer(producer_id=9, current_txn_start_offset=5)]
    cluster.not_leader_once = {ORDERS0}  # a retry round: its answer is the sweep's last one
    collector, _ = make(cluster, open_partitions={("gone", 0)})  # and a deleted partition's empty snapshot
    result = collector.sweep()
    (position,) = result.positions
    observed = [s.observed_at_ms for s in [*result.snapshots, *result.empties]]
    assert len(observed) == 3 and ("gone", 0) in {(e.topic, e.partition) for e in result.empties}
    assert position.as_of_ms >= max(observed)
    ((asked_at, _),) = cluster.end_offsets_calls
    assert position.as_of_ms < asked_at  # read before the ListOffsets request was sent


def test_as_of_never_precedes_an_answer_even_if_the_clock_steps_back() -> None:
    cluster = with_transaction_log()
    behind = cluster.clock - 5_000
    collector = Collector(
        cluster, cluster="prod", settings=CollectorSettings(), open_partitions=set(), clock_ms=lambda: behind
    )
    result = collector.sweep()
    (position,) = result.positions
    assert position.as_of_ms >= max(s.observed_at_ms for s in result.snapshots)


def test_position_has_the_log_end_of_each_partition_asked_after_its_high_watermark() -> None:
    # The log end offsets show the job a collector clock running ahead (a record at or above one was appended
    # after as_of_ms): asked of the same leaders, after the high watermarks, so both after as_of_ms was read.
    cluster = with_transaction_log(3)
    cluster.log_ends = {(TXN_LOG, 0): 12, (TXN_LOG, 2): 35}  # 1: at its high watermark
    cluster.offset_errors[(TXN_LOG, 1)] = "NOT_LEADER_OR_FOLLOWER"
    result = make(cluster)[0].sweep()
    (position,) = result.positions
    assert position.end_offsets == {0: 10, 2: 30}
    assert position.log_end_offsets == {0: 12, 2: 35}  # only where the high watermark was measured
    ((hw_at, _),) = cluster.end_offsets_calls
    ((leo_at, asked),) = cluster.log_end_calls
    assert position.as_of_ms < hw_at < leo_at
    assert sorted(tp for tps in asked.values() for tp in tps) == [(TXN_LOG, 0), (TXN_LOG, 2)]


def test_partial_answers_leave_partitions_out_and_are_noted_once(caplog: pytest.LogCaptureFixture) -> None:
    cluster = with_transaction_log(6)
    cluster.leaders[(TXN_LOG, 0)] = -1  # no leader
    cluster.offset_errors[(TXN_LOG, 1)] = "NOT_LEADER_OR_FOLLOWER"  # moved between metadata and ListOffsets
    cluster.down = {3}  # failed DescribeProducers: backed off, not asked again this sweep
    collector, _ = make(cluster)
    result = collector.sweep()
    (position,) = result.positions
    assert position.partitions == 6 and position.end_offsets == {3: 40, 4: 50}
    ((_, asked),) = cluster.end_offsets_calls
    assert 3 not in asked
    problems = [p for p in result.problems if TXN_LOG in p]
    assert len(problems) == 3
    assert any("LEADER_NOT_AVAILABLE" in p and "partitions 0 " in p for p in problems)
    assert any("NOT_LEADER_OR_FOLLOWER" in p and "partitions 1 " in p for p in problems)
    assert any("BROKER_BACKOFF" in p and "partitions 2, 5 " in p for p in problems)
    assert [p for p in collector.sweep().problems if TXN_LOG in p] == problems  # every sweep; logged once
    assert sum("ListOffsets for __transaction_state" in r.message for r in caplog.records) == 3


def test_no_transaction_log_yet_publishes_no_position() -> None:
    cluster = one_hanging()
    del cluster.leaders[(TXN_LOG, 0)]  # no transactional producer ever ran: the topic does not exist
    result = make(cluster)[0].sweep()
    assert result.positions == [] and cluster.end_offsets_calls == [] and result.problems == []


def test_unauthorized_list_offsets_names_the_acl_once_and_the_sweep_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cluster = with_transaction_log()
    cluster.offset_errors = {(TXN_LOG, p): "TOPIC_AUTHORIZATION_FAILED" for p in range(3)}
    collector, _ = make(cluster)
    first, second = collector.sweep(), collector.sweep()
    assert first.positions == [] and second.positions == []  # nothing answered: nothing to vouch for
    expected = (
        "ListOffsets for __transaction_state was denied (TOPIC_AUTHORIZATION_FAILED): grant the ACL Describe on "
        "topic __transaction_state to txnwatch's principal"
    )
    assert first.problems == [expected] and second.problems == [expected]
    assert caplog.text.count(expected) == 1
    assert snap(second, ORDERS0).open_transactions and second.partitions_covered == 5


def test_describe_mode_does_not_measure_the_transaction_log() -> None:
    cluster = with_transaction_log()
    result = make(cluster, coordinator_source="describe")[0].sweep()
    assert result.positions == [] and cluster.end_offsets_calls == []


# ------------------------------------------------------------------------------------ metrics & json


def test_metrics_are_observed() -> None:
    cluster = one_hanging()
    cluster.down = {2}
    metrics = CollectorMetrics()
    collector = Collector(
        cluster, cluster="prod", settings=CollectorSettings(), open_partitions=set(), metrics=metrics
    )
    collector.sweep()
    text = generate_latest(metrics.registry).decode()
    assert "txnwatch_collector_sweep_duration_seconds_count 1.0" in text
    assert 'txnwatch_collector_partitions_scanned{broker="1"} 1.0' in text
    assert 'txnwatch_collector_partitions_uncovered{reason="BROKER_UNREACHABLE"} 1.0' in text
    assert "txnwatch_collector_open_transactions 1.0" in text
    assert "txnwatch_collector_open_transactions_seen_total 1.0" in text
    assert "txnwatch_collector_start_batch_cache_entries 1.0" in text


def test_as_json_is_what_once_prints() -> None:
    out = make(one_hanging())[0].sweep().as_json()
    assert out["open_transactions"] == 1 and out["partitions_covered"] == 3
    assert out["snapshots"][0]["open_transactions"][0]["start_timestamp_ms"] == T0
    assert [s["broker"] for s in out["summaries"]] == [1, 2, 3]
    (position,) = out["coordinator_log_positions"]
    assert (position["topic"], position["end_offsets"]) == ("__transaction_state", {"0": 0})


# ------------------------------------------------------------------------------------------ the loop


def test_run_survives_a_failed_sweep_and_stops_on_request() -> None:
    calls: list[str] = []

    class Flaky:
        n = 0

        def sweep(self) -> Any:
            self.n += 1
            if self.n == 1:
                raise RuntimeError("no metadata")
            return make(one_hanging())[0].sweep()

    metrics = CollectorMetrics()
    stop = threading.Event()
    published: list[SweepResult] = []
    sweeps = run(
        Flaky(),  # type: ignore[arg-type]
        published.append,
        interval_s=0,
        stop=stop,
        also=[lambda: calls.append("poll")],
        metrics=metrics,
        max_sweeps=3,
    )
    assert sweeps == 3 and len(published) == 2 and calls == ["poll"] * 3
    assert metrics.sweep_failures._value.get() == 1
    assert metrics.last_success._value.get() > 0
    stop.set()
    assert run(Flaky(), published.append, interval_s=0, stop=stop) == 0  # type: ignore[arg-type]


def test_the_loop_times_its_gaps_and_pauses_on_the_injected_clock(caplog: pytest.LogCaptureFixture) -> None:
    # The loop reads its clock three times a turn (began, published, before the pause), each 15 s later on this
    # one: published sweeps 45 s apart at a 5 s interval are a gap worth a warning, and no pause is left to wait
    # (on the real clock the test would wait 5 s a turn and see no gap).
    ticks = itertools.count(step=15.0)
    collector, _ = make(one_hanging())
    stop = threading.Event()
    sweeps = run(
        collector,
        lambda _r: None,
        interval_s=5,
        stop=stop,
        max_sweeps=3,
        monotonic=lambda: float(next(ticks)),
    )
    assert sweeps == 3
    assert caplog.text.count("45.0s between published sweeps (interval 5.0s)") == 2


def test_a_failed_publish_sends_the_empty_snapshots_again() -> None:
    cluster = one_hanging()
    collector, _ = make(cluster)
    collector.sweep()
    cluster.producers[ORDERS0] = []
    attempts: list[SweepResult] = []

    def publish(result: SweepResult) -> None:
        attempts.append(result)
        if len(attempts) == 1:
            raise RuntimeError("broker down")

    run(collector, publish, interval_s=0, stop=threading.Event(), max_sweeps=2)
    assert [[(e.topic, e.partition) for e in r.empties] for r in attempts] == [[ORDERS0], [ORDERS0]]
