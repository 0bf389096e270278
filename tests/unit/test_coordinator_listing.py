"""When an absence from ListTransactions counts: the describe fallback's tombstones (`CoordinatorPoller`) and the
abort's "no owner" (`admin.live.evidence.listing_incomplete`), on scripted coordinators. The same on a real three-node
test bed: tests/broker/test_coordinator_moves.py."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import pytest
from builders import LIMITS, MINUTE, SECOND, open_txn, snapshot
from collector_fakes import T0, FakeCluster, FakeCoordinators, description, producer, start_batch

import txnwatch_cli
from admin.cli import main as cli
from admin.cli.main import _collect_once, publish_coordinator_poll
from admin.collect.collector import Collector
from admin.collect.coordinator import CoordinatorPoll, CoordinatorPoller
from admin.collect.metrics import CollectorMetrics
from admin.collect.publish import OutRecord, Publisher
from admin.live.evidence import listing_incomplete
from admin.wire.errors import WireError, WireTimeout
from admin.wire.types import ClusterView, ListingResult, TransactionDescription
from common.settings import CollectorSettings
from detectors.contract import COORDINATOR_LOG_POSITION_TYPE, SNAPSHOT_TYPE, TYPE_HEADER
from detectors.currency import ViewCurrency, coordinator_partition
from detectors.listing import LogLeader
from detectors.models import (
    CoordinatorLogPosition,
    CoordinatorRecord,
    CoordinatorState,
    DetectionLimits,
    HangingReason,
    PartitionSnapshot,
    VerdictKind,
    WithheldReason,
)
from detectors.rules import Decision, coord_facts, judge, txn_facts

pytestmark = pytest.mark.unit

LOG = "__transaction_state"


@dataclass
class Coordinators(FakeCoordinators):
    """Scripted coordinators whose listing can silently leave ids out (`unlisted`: their partition moves, loads
    or has no leader), and whose DescribeTransactions can fail per broker."""

    unlisted: set[str] = field(default_factory=set)
    broker_errors: dict[int, str] = field(default_factory=dict)

    def list_transactions(self, **kwargs: Any) -> ListingResult:
        listing = super().list_transactions(**kwargs)
        kept = [t for t in listing.listings if t.transactional_id not in self.unlisted]
        return ListingResult(kept, listing.failed, listing.answered)

    def describe_transactions(
        self, by_coordinator: Mapping[int, Sequence[str]]
    ) -> list[TransactionDescription]:
        out = []
        for broker, ids in by_coordinator.items():
            if broker in self.broker_errors:
                error = self.broker_errors[broker]
                out += [TransactionDescription(i, error, "", -1, -1, -1, -1, (), broker) for i in ids]
            else:
                out += super().describe_transactions({broker: ids})
        return out


def poller(fake: Coordinators) -> CoordinatorPoller:
    return CoordinatorPoller(fake, clock_ms=lambda: T0 + 60_000)


def tombstones(p: CoordinatorPoller) -> list[str]:
    return [r.transactional_id for r in p.poll() if r.tombstone]


# ------------------------------------------------------------------------------------- describe fallback


def test_an_id_whose_partition_has_no_leader_is_not_tombstoned() -> None:
    fake = Coordinators(descriptions={"tx-1": description()})
    p = poller(fake)
    p.poll()
    fake.unlisted = {"tx-1"}  # its partition went offline: nobody lists it, every broker answered
    fake.log_leaders = {0: -1}
    assert tombstones(p) == []
    assert p.withheld_expiries == 1


def test_an_id_whose_partition_loads_on_its_new_coordinator_is_not_tombstoned() -> None:
    fake = Coordinators(descriptions={"tx-1": description(coordinator=1)})
    p = poller(fake)
    p.poll()
    # Moved from broker 1 to broker 2, which is loading it: 1 answers without it, 2 fails.
    fake.descriptions["tx-1"] = description(coordinator=2)
    fake.failed = {2: "COORDINATOR_LOAD_IN_PROGRESS"}
    fake.log_leaders = {0: 2}
    assert tombstones(p) == []
    fake.failed = {}  # loaded: 2 lists it
    assert tombstones(p) == []


def test_an_id_its_leader_does_not_serve_yet_is_not_tombstoned() -> None:
    fake = Coordinators(descriptions={"tx-1": description()})
    p = poller(fake)
    p.poll()
    fake.unlisted = {"tx-1"}
    fake.broker_errors = {1: "NOT_COORDINATOR"}  # Metadata already names it; it has not taken over yet
    assert tombstones(p) == []


def test_an_id_its_current_coordinator_does_not_know_is_tombstoned() -> None:
    fake = Coordinators(descriptions={"tx-1": description(), "tx-2": description(transactional_id="tx-2")})
    p = poller(fake)
    p.poll()
    del fake.descriptions["tx-1"]  # expired: its leader answered, and answers TRANSACTIONAL_ID_NOT_FOUND
    assert tombstones(p) == ["tx-1"]
    assert p.withheld_expiries == 0


# ------------------------------------------------------------------------------- the abort's "no owner"


@dataclass
class Both(FakeCluster, Coordinators):
    pass


def both(log_leaders: dict[int, int]) -> Both:
    return Both(leaders={(LOG, p): b for p, b in log_leaders.items()})


def at_epoch_0(leaders: dict[int, int] | None) -> dict[int, LogLeader] | None:
    """Metadata's `__transaction_state` leaders, each at leader epoch 0 (the fakes' default epoch)."""
    return None if leaders is None else {p: LogLeader(b, 0) for p, b in leaders.items()}


def test_a_complete_listing_has_no_gap() -> None:
    fake = both({0: 1, 1: 2, 2: 3})
    assert listing_incomplete(fake, at_epoch_0({0: 1, 1: 2, 2: 3}), {1, 2, 3}) is None


@pytest.mark.parametrize(
    ("before", "after", "answered", "errors", "reason"),
    [
        ({0: 1, 1: -1}, {0: 1, 1: -1}, {1, 2}, {}, f"{LOG} partition 1 has no leader"),
        ({0: 1, 1: 2}, {0: 1, 1: -1}, {1, 2}, {}, f"{LOG} partition 1 has no leader"),
        ({0: 1, 1: 2}, {0: 1, 1: 3}, {1, 2, 3}, {}, f"{LOG} partition 1 moved from broker 2 to broker 3"),
        ({0: 1, 1: 2}, {0: 1, 1: 2}, {1}, {}, f"broker 2, the leader of {LOG} partition 1, did not answer"),
        ({0: 1, 1: 2}, {0: 1, 1: 2}, {1, 2}, {2: "COORDINATOR_LOAD_IN_PROGRESS"}, "broker 2 does not serve"),
        ({0: 1, 1: 2}, {0: 1, 1: 2}, {1, 2}, {2: "NOT_COORDINATOR"}, f"{LOG} partition 1"),
        (
            {0: 1, 1: 2},
            {0: 1, 1: 2},
            {1, 2},
            {1: "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"},
            "grant the ACL Describe on TransactionalId '*'",
        ),
        (None, {0: 1}, {1}, {}, f"Metadata for {LOG} failed before the listing"),
        ({}, {}, {1}, {}, f"{LOG} is not visible"),
    ],
)
def test_an_incomplete_listing_is_named(
    before: dict[int, int] | None,
    after: dict[int, int],
    answered: set[int],
    errors: dict[int, str],
    reason: str,
) -> None:
    fake = both(after)
    fake.broker_errors = errors
    gap = listing_incomplete(fake, at_epoch_0(before), answered)
    assert gap is not None and gap.startswith("coordinator-listing-incomplete: ")
    assert reason in gap


# ---------------------------------------------------------------------- when a poll's position may vouch

COORDINATOR_TOPIC = "txnwatch.coordinator-state"
SNAPSHOT_TOPIC = "txnwatch.producer-state"
WITHHELD = "txnwatch_collector_coordinator_positions_withheld_total"
# tx-1 lives in __transaction_state partition 0 of 2 (led by broker 1, its coordinator); partition 1 by broker 2.
assert coordinator_partition("tx-1", 2) == 0


@dataclass
class Polled(FakeCluster, Coordinators):
    """Both seams on one scripted cluster: Metadata from `leaders` (or the scripted `views`, one per call), the
    coordinators as `Coordinators` scripts them, and a DurationFilter listing that can fail per broker."""

    long_running_failed: dict[int, str] = field(default_factory=dict)  # with the filter and without it
    log_metadata_fails: bool = False
    # Run as a poll sends its ListTransactions (one each, in order): what changed since the sweep before it.
    on_listing: list[Callable[[], None]] = field(default_factory=list)
    # Ids whose DescribeTransactions raises (the wire's IO loop failing mid-request), once each.
    describe_raises: set[str] = field(default_factory=set)

    def metadata(self, topics: Sequence[str] | None = None) -> ClusterView:
        if self.log_metadata_fails and topics is not None and LOG in topics:
            raise WireTimeout("KafkaTimeoutError: no broker answered")
        return super().metadata(topics)

    def list_transactions(self, **kwargs: Any) -> ListingResult:
        if kwargs.get("duration_filter_ms") is None and self.on_listing:
            self.on_listing.pop(0)()
        listing = super().list_transactions(**kwargs)
        # The long-running listings (active states only: with the DurationFilter, and again without it).
        if not kwargs.get("states") or not self.long_running_failed:
            return listing
        failed = self.long_running_failed
        return ListingResult(
            [t for t in listing.listings if t.coordinator not in failed],
            {**listing.failed, **failed},
            listing.answered - set(failed),
        )

    def describe_transactions(
        self, by_coordinator: Mapping[int, Sequence[str]]
    ) -> list[TransactionDescription]:
        asked = {i for ids in by_coordinator.values() for i in ids}
        if asked & self.describe_raises:
            self.describe_raises -= asked
            raise WireError("KafkaConnectionError: the IO loop failed", "BROKER_UNREACHABLE")
        return super().describe_transactions(by_coordinator)


class Sink:
    """Acknowledges every record; the coordinator records land on the coordinator-state topic's one partition
    (its high watermark moves, as a broker's would)."""

    def __init__(self, cluster: Polled) -> None:
        self.cluster = cluster
        self.sent: list[OutRecord] = []
        self.coordinator_topic_fails = (
            False  # its leader is unavailable: the poll's records do not get through
        )

    def send_all(self, records: Sequence[OutRecord]) -> None:
        if self.coordinator_topic_fails and any(r.topic == COORDINATOR_TOPIC for r in records):
            raise WireTimeout("KafkaTimeoutError: no acknowledgement")
        for r in records:
            self.sent.append(r)
            if r.topic == COORDINATOR_TOPIC:
                tp = (COORDINATOR_TOPIC, 0)
                self.cluster.high_watermarks[tp] = self.cluster.high_watermarks.get(tp, 0) + 1

    def close(self) -> None:
        pass

    def positions(self) -> list[CoordinatorLogPosition]:
        return [
            CoordinatorLogPosition.model_validate_json(r.value)
            for r in self.sent
            if dict(r.headers)[TYPE_HEADER] == COORDINATOR_LOG_POSITION_TYPE.encode()
        ]

    def snapshots(self) -> list[PartitionSnapshot]:
        return [
            PartitionSnapshot.model_validate_json(r.value)
            for r in self.sent
            if dict(r.headers)[TYPE_HEADER] == SNAPSHOT_TYPE.encode()
        ]

    def view(self, transactional_id: str) -> CoordinatorRecord:
        """The last record of the id on the coordinator-state topic: what the streaming job holds."""
        return [
            CoordinatorRecord.model_validate_json(r.value)
            for r in self.sent
            if r.topic == COORDINATOR_TOPIC and r.key == transactional_id.encode()
        ][-1]


class Fallback(NamedTuple):
    cluster: Polled
    poller: CoordinatorPoller
    sink: Sink
    publisher: Publisher
    metrics: CollectorMetrics

    def publish(self) -> tuple[CoordinatorPoll, CoordinatorLogPosition | None]:
        """One poll as `txnwatch collect --coordinator-source describe` runs it."""
        return publish_coordinator_poll(
            self.poller, self.publisher, self.cluster, cluster="prod", metrics=self.metrics
        )

    def withheld(self, reason: str) -> float:
        return self.metrics.registry.get_sample_value(WITHHELD, {"reason": reason}) or 0.0


def fallback(
    tx1: TransactionDescription | None = None, *, duration_filter_ms: int = 0, **state: Any
) -> Fallback:
    """tx-1 (Ongoing unless given), coordinated by broker 1, after a first complete poll, which published a
    position."""
    cluster = Polled(
        leaders={(LOG, 0): 1, (LOG, 1): 2, (COORDINATOR_TOPIC, 0): 1},
        descriptions={"tx-1": tx1 or description()},
        **state,
    )
    poller_ = CoordinatorPoller(
        cluster, duration_filter_ms=duration_filter_ms, clock_ms=lambda: cluster.clock
    )
    sink = Sink(cluster)
    publisher = Publisher(sink, snapshot_topic=SNAPSHOT_TOPIC, coordinator_topic=COORDINATOR_TOPIC)
    f = Fallback(cluster, poller_, sink, publisher, CollectorMetrics())
    poll, position = f.publish()
    assert poll.incomplete is None and position is not None and sink.positions() == [position]
    return f


def assert_withheld_then_vouched(f: Fallback, reason: str, heal: Callable[[], None]) -> None:
    """The broken poll publishes its records but no position, counted under `reason`; once healed, the next
    poll publishes a position again."""
    f.cluster.clock += 10_000
    sent = len(f.sink.positions())
    poll, position = f.publish()
    assert position is None, f"a position vouched for a poll that was not complete ({reason})"
    assert poll.incomplete is not None and poll.incomplete.reason == reason
    assert len(f.sink.positions()) == sent and f.withheld(reason) == 1
    heal()
    f.cluster.clock += 10_000
    poll, position = f.publish()
    assert poll.incomplete is None and position is not None and position.sweep_id == poll.poll_id
    assert f.sink.positions()[-1] == position and f.withheld(reason) == 1


def test_a_failed_broker_listing_withholds_the_position() -> None:
    f = fallback()
    f.cluster.failed = {
        2: "COORDINATOR_LOAD_IN_PROGRESS"
    }  # broker 2 loads a partition: it lists none of them
    assert_withheld_then_vouched(f, "listing-failed", f.cluster.failed.clear)


def test_a_failed_listing_of_a_broker_that_leads_nothing_withholds_it_too() -> None:
    # Metadata may lag the broker's own view of what it leads: any failure makes the listing incomplete.
    f = fallback()
    f.cluster.failed = {3: "BROKER_UNREACHABLE"}
    assert_withheld_then_vouched(f, "listing-failed", f.cluster.failed.clear)


def test_a_leaderless_partition_withholds_the_position() -> None:
    f = fallback()
    f.cluster.leaders[(LOG, 1)] = -1  # listed by nobody; every broker answers without an error
    assert_withheld_then_vouched(
        f, "partition-without-leader", lambda: f.cluster.leaders.update({(LOG, 1): 2})
    )


def test_a_leader_that_did_not_answer_withholds_the_position() -> None:
    f = fallback()
    f.cluster.coordinator_brokers = frozenset({1, 3})  # broker 2 (leader of partition 1) was not asked
    assert_withheld_then_vouched(
        f, "listing-failed", lambda: setattr(f.cluster, "coordinator_brokers", frozenset({1, 2, 3}))
    )


def test_a_leader_that_moved_during_the_poll_withholds_the_position() -> None:
    f = fallback()
    # Before the listing broker 2 led partition 1, after it broker 3: 2 may have answered without it, 3 before
    # it took it over.
    f.cluster.views = [{(LOG, 0): 1, (LOG, 1): 2}, {(LOG, 0): 1, (LOG, 1): 3}]
    assert_withheld_then_vouched(f, "leader-moved", lambda: None)


def test_a_leader_that_does_not_serve_its_partition_yet_withholds_the_position() -> None:
    f = fallback()
    f.cluster.broker_errors = {2: "NOT_COORDINATOR"}  # Metadata names it; it has not loaded the partition
    assert_withheld_then_vouched(f, "leader-not-serving", f.cluster.broker_errors.clear)


def test_ids_the_principal_may_not_describe_withhold_the_position() -> None:
    # ListTransactions silently leaves them out: "no record" would read as "no owner".
    f = fallback()
    f.cluster.deny_unknown = True
    assert_withheld_then_vouched(
        f, "transactional-ids-hidden", lambda: setattr(f.cluster, "deny_unknown", False)
    )


def test_an_invisible_transaction_log_withholds_the_position() -> None:
    f = fallback()
    leaders = dict(f.cluster.leaders)
    del f.cluster.leaders[(LOG, 0)], f.cluster.leaders[(LOG, 1)]  # no Describe on it: Metadata leaves it out
    assert_withheld_then_vouched(
        f, "transaction-log-not-visible", lambda: setattr(f.cluster, "leaders", leaders)
    )


def test_failed_transaction_log_metadata_withholds_the_position() -> None:
    f = fallback()
    f.cluster.log_metadata_fails = True
    assert_withheld_then_vouched(
        f, "metadata-failed", lambda: setattr(f.cluster, "log_metadata_fails", False)
    )


def test_a_failed_duration_filter_listing_withholds_the_position() -> None:
    f = fallback(duration_filter_ms=5_000, long_running={"tx-1"})
    f.cluster.long_running_failed = {1: "COORDINATOR_LOAD_IN_PROGRESS"}
    assert_withheld_then_vouched(f, "duration-listing-failed", f.cluster.long_running_failed.clear)


def test_a_broker_that_lists_no_long_running_transactions_has_its_active_ones_described() -> None:
    """Broker 1 fails the DurationFilter listing and the listing again without the filter: the failure is acted
    on, not only counted. Its active tx-1 (young: a working filter would leave it out) is described from the
    poll's own listing, and the position stays withheld."""
    f = fallback(duration_filter_ms=5_000)
    f.cluster.long_running_failed = {1: "COORDINATOR_LOAD_IN_PROGRESS"}
    f.cluster.clock += 10_000
    calls, described = len(f.cluster.list_calls), len(f.cluster.described)
    poll, position = f.publish()
    assert position is None and poll.incomplete is not None
    assert poll.incomplete.reason == "duration-listing-failed"
    assert ["tx-1"] in f.cluster.described[described:]
    assert [(c.get("brokers"), c["duration_filter_ms"]) for c in f.cluster.list_calls[calls:]] == [
        (None, None),  # the poll's listing
        ([1, 2, 3], 5_000),  # every broker offers ListTransactions v1
        ([1], None),  # broker 1 failed it: asked again without the filter
    ]


def test_a_failed_describe_withholds_the_position_and_is_retried() -> None:
    f = fallback()
    f.cluster.descriptions["tx-1"] = description(state="PrepareCommit")
    f.cluster.describe_errors = {"tx-1": "COORDINATOR_LOAD_IN_PROGRESS"}
    assert_withheld_then_vouched(f, "describe-failed", f.cluster.describe_errors.clear)
    assert f.sink.view("tx-1").state is CoordinatorState.PREPARE_COMMIT  # described again, and published


def test_a_collect_once_says_why_no_position_vouches(capsys: pytest.CaptureFixture[str]) -> None:
    f = fallback()
    f.cluster.failed = {2: "COORDINATOR_LOAD_IN_PROGRESS"}
    collector = Collector(
        f.cluster, cluster="prod", settings=CollectorSettings(), open_partitions=None, clock_ms=lambda: T0
    )
    assert _collect_once(collector, f.publisher, f.poller, f.cluster, "prod", "json") == 0
    out = json.loads(capsys.readouterr().out)
    assert out["coordinator_position_withheld"]["reason"] == "listing-failed"
    assert "broker 2" in out["coordinator_position_withheld"]["detail"]
    assert [p for p in out["coordinator_log_positions"] if p["topic"] == COORDINATOR_TOPIC] == []


# -------------------------------------------------- the scenario, through the rules the job applies


def test_an_id_whose_coordinator_fails_the_listing_is_never_proven_completed() -> None:
    """tx-1 was last seen CompleteCommit. It starts a new transaction on orders-0 while its coordinator
    (broker 1) answers ListTransactions with COORDINATOR_LOAD_IN_PROGRESS, and completes it before the broker
    answers again. The leader reports the transaction open meanwhile. Fed what the collector published, the
    rules the streaming job applies must never call it HANGING `coordinator-completed`: while the listing
    fails no position vouches for the stale record (UNCONFIRMED `coordinator-view-behind`), and once it
    answers the id is described again (its listing looks unchanged: CompleteCommit, same producer id) and
    its record carries the new completion.

    Pure: a real broker cannot be made to answer COORDINATOR_LOAD_IN_PROGRESS on demand (it does so only while
    it loads a `__transaction_state` partition, for as long as the load takes)."""
    done = description(state="CompleteCommit", partitions=(), start_time_ms=T0 - 2 * MINUTE)
    f = fallback(done, clock=T0)  # the first poll sees CompleteCommit at T0
    currency = ViewCurrency(None, [COORDINATOR_TOPIC])

    def judged() -> Decision:
        """The job, having applied everything published so far, judges the leader's report of T."""
        for position in f.sink.positions():
            currency.add_position(
                position.topic, position.partitions, position.as_of_ms, position.end_offsets
            )
            for p, end in position.end_offsets.items():
                currency.applied(position.topic, p, end)
        txn = open_txn(start_timestamp_ms=T0 + 10 * SECOND)
        report = snapshot(txn, observed_at_ms=T0 + 70 * SECOND)
        t = txn_facts(txn, report, first_seen_ms=T0 + 11 * SECOND)
        view = coord_facts(f.sink.view("tx-1"))
        return judge(t, view, T0 + 100 * SECOND, LIMITS, view_current_ms=currency.current_as_of("tx-1"))

    # T0 + 10 s: the new transaction begins; broker 1 starts loading a partition. The leader reports T at 70 s.
    f.cluster.descriptions["tx-1"] = description(start_time_ms=T0 + 10 * SECOND)
    f.cluster.failed = {1: "COORDINATOR_LOAD_IN_PROGRESS"}
    f.cluster.clock = T0 + 80 * SECOND
    f.publish()
    d = judged()
    assert (d.kind, d.reason, d.withheld) == (
        VerdictKind.UNCONFIRMED,
        HangingReason.COORDINATOR_COMPLETED,
        WithheldReason.COORDINATOR_VIEW_BEHIND,
    )
    # T0 + 90 s: the transaction completes; broker 1 answers again at 100 s.
    f.cluster.descriptions["tx-1"] = description(
        state="CompleteCommit", partitions=(), start_time_ms=T0 + 10 * SECOND
    )
    f.cluster.failed = {}
    f.cluster.clock = T0 + 100 * SECOND
    poll, position = f.publish()
    assert poll.incomplete is None and position is not None
    assert judged().kind in (VerdictKind.OPEN, VerdictKind.LATE)
    assert f.sink.view("tx-1").last_update_timestamp_ms == T0 + 100 * SECOND


def test_an_id_the_listing_missed_is_described_and_stamped_again_when_listed_again() -> None:
    """Its listing may look unchanged (CompleteCommit, same producer id) after a whole transaction ran while it
    was not listed: its record is published again with this poll's stamp, whatever DescribeTransactions says."""
    f = fallback(description(state="CompleteCommit", partitions=()), clock=T0)
    f.cluster.unlisted = {"tx-1"}  # its partition loads elsewhere, say: nobody lists it
    f.cluster.leaders[(LOG, 0)] = -1
    f.cluster.clock = T0 + MINUTE
    f.publish()
    f.cluster.unlisted, f.cluster.leaders[(LOG, 0)] = set(), 1
    f.cluster.clock = T0 + 2 * MINUTE
    poll, position = f.publish()
    assert [r.last_update_timestamp_ms for r in poll.records] == [T0 + 2 * MINUTE] and position is not None
    f.cluster.clock = T0 + 3 * MINUTE
    assert f.publish()[0].records == []  # refreshed: no longer published every poll


# ------------------------------------------ a whole transaction between two listings, while sweeps saw it open

ORDERS = ("orders", 0)
DEFAULTS = DetectionLimits()  # the 4 s grace and 2 s skew the job runs with
T1_START = T0 - 2 * MINUTE
T2_START = T0 + 3 * SECOND


def completed(start_ms: int) -> TransactionDescription:
    return description(state="CompleteCommit", partitions=(), start_time_ms=start_ms)


def swept(f: Fallback) -> Collector:
    """A collector of the same scripted cluster, whose broker 1 leads orders-0."""
    f.cluster.leaders[ORDERS] = 1
    return Collector(
        f.cluster,
        cluster="prod",
        settings=CollectorSettings(coordinator_source="describe"),
        open_partitions=set(),
        clock_ms=lambda: f.cluster.clock,
    )


def begin_t2(f: Fallback) -> None:
    """tx-1's producer (1000) begins T2 on orders-0: its coordinator says Ongoing, the leader holds it open."""
    f.cluster.descriptions["tx-1"] = description(start_time_ms=T2_START)
    f.cluster.producers[ORDERS] = [producer(current_txn_start_offset=200, last_timestamp_ms=T2_START)]
    f.cluster.starts[(ORDERS, 200)] = start_batch(
        base_offset=200, start_timestamp_ms=T2_START, max_timestamp_ms=T2_START
    )


def commit_t2(f: Fallback) -> None:
    f.cluster.descriptions["tx-1"] = completed(T2_START)
    f.cluster.producers[ORDERS] = []


def turn(f: Fallback, collector: Collector, at_ms: int) -> None:
    """One turn of `txnwatch collect`'s loop at `at_ms`: a sweep, published, then the describe-fallback poll
    (what `_collect_once` runs). A poll that raises is logged by the loop, which goes on."""
    f.cluster.clock = at_ms
    _collect_once(collector, f.publisher, f.poller, f.cluster, "prod", "json")


def judged(f: Fallback, start_offset: int) -> Decision:
    """What the streaming job decides on the newest report of tx-1's producer's transaction at `start_offset`,
    having applied everything published: first seen at its first report (`tracking.confirm_open`), judged
    against tx-1's last record, as current as the published positions show."""
    reports = [
        s for s in f.sink.snapshots() if any(t.start_offset == start_offset for t in s.open_transactions)
    ]
    assert len(reports) == 2  # two reports, 10 s apart: past the grace since first seen
    currency = ViewCurrency(None, [COORDINATOR_TOPIC])
    for position in f.sink.positions():
        currency.add_position(position.topic, position.partitions, position.as_of_ms, position.end_offsets)
        for p, end in position.end_offsets.items():
            currency.applied(position.topic, p, end)
    report = reports[-1]
    (txn,) = report.open_transactions
    t = txn_facts(txn, report, first_seen_ms=reports[0].observed_at_ms)
    view = coord_facts(f.sink.view("tx-1"))
    now_ms = report.observed_at_ms + SECOND
    return judge(t, view, now_ms, DEFAULTS, view_current_ms=currency.current_as_of("tx-1"))


def test_a_transaction_that_ends_between_two_listings_that_look_alike_is_never_proven_completed() -> None:
    """tx-1 was last seen CompleteCommit (T1). Its producer begins T2 on orders-0 at 3 s. The sweep at 10 s
    reports T2 open; the poll after it cannot publish (the coordinator-state topic's leader is unavailable), so
    it is undone. The sweep at 20 s reports T2 open again, and T2 commits before the poll after it lists. That
    listing looks like the last published one (CompleteCommit, producer 1000) and the poll is complete: its
    position vouches for tx-1's record. Had tx-1 not been described again, that record would be T1's, stamped
    at 0 s, and the job would prove HANGING `coordinator-completed` on T2, which its coordinator owned when the
    leader reported it. The sweeps saw producer 1000 open: tx-1 is described, its record (T2's completion)
    published again with a stamp after both reports."""
    f = fallback(completed(T1_START), clock=T0)
    collector = swept(f)
    begin_t2(f)
    f.sink.coordinator_topic_fails = True
    with pytest.raises(WireTimeout):
        turn(f, collector, T0 + 10 * SECOND)
    f.sink.coordinator_topic_fails = False
    f.cluster.on_listing = [lambda: commit_t2(f)]
    turn(f, collector, T0 + 20 * SECOND)
    assert f.sink.positions()[-1].as_of_ms > f.sink.snapshots()[-1].observed_at_ms  # vouches for the report
    d = judged(f, 200)
    assert d.kind in (VerdictKind.OPEN, VerdictKind.LATE), d
    record = f.sink.view("tx-1")
    assert (record.state, record.start_timestamp_ms) == (CoordinatorState.COMPLETE_COMMIT, T2_START)
    assert record.last_update_timestamp_ms > f.sink.snapshots()[-1].observed_at_ms


def test_an_orphan_of_a_completed_id_keeps_its_record_and_stamp() -> None:
    """Describing an id because its producer id is open republishes it only if its content changed: an orphan
    of producer 1000 (a transaction its coordinator completed long ago, CompleteCommit T1) leaves tx-1's
    record and stamp as they are, so "the snapshot is after the completion" can still hold and it is proven."""
    f = fallback(completed(T1_START), clock=T0)
    collector = swept(f)
    f.cluster.producers[ORDERS] = [producer(current_txn_start_offset=100)]
    f.cluster.starts[(ORDERS, 100)] = start_batch()
    f.cluster.described.clear()
    for at_ms in (T0 + 10 * SECOND, T0 + 20 * SECOND):
        turn(f, collector, at_ms)
        assert ["tx-1"] in f.cluster.described  # described: its producer id is open
    assert f.sink.view("tx-1").last_update_timestamp_ms == T0  # not republished: the same content
    d = judged(f, 100)
    assert (d.kind, d.reason) == (VerdictKind.HANGING, HangingReason.COORDINATOR_COMPLETED)


def test_a_poll_that_raises_is_undone() -> None:
    """The poll at 10 s describes tx-1 Ongoing (T2), then raises before it returns (the wire's IO loop fails
    while it asks whether tx-2, gone from the listing, expired): nothing of it is published. The next poll sees
    T2 still Ongoing and must publish that record, though its content is what the failed poll described: else
    the topic keeps T1's completion, the next position vouches for it, and T2, reported open at 10 s and 20 s,
    is proven HANGING `coordinator-completed`."""
    f = fallback(completed(T1_START), clock=T0)
    f.cluster.descriptions["tx-2"] = description(transactional_id="tx-2", producer_id=2, state="Empty")
    f.cluster.clock = T0 + SECOND
    f.publish()
    collector = swept(f)
    begin_t2(f)
    del f.cluster.descriptions["tx-2"]  # expires
    f.cluster.describe_raises = {"tx-2"}
    with pytest.raises(WireError):
        turn(f, collector, T0 + 10 * SECOND)
    turn(f, collector, T0 + 20 * SECOND)
    record = f.sink.view("tx-1")
    assert (record.state, record.start_timestamp_ms) == (CoordinatorState.ONGOING, T2_START)
    assert judged(f, 200).kind in (VerdictKind.OPEN, VerdictKind.LATE)


class _Admin:
    def close(self) -> None:
        pass


def test_collect_hands_each_sweep_s_open_producer_ids_to_the_poll_after_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`txnwatch collect --coordinator-source describe`'s own loop, on the scripted cluster: the poll after a
    sweep that saw producer 1000 open describes tx-1 although its listing looks unchanged, and publishes T2's
    completion."""
    f = fallback(completed(T1_START), clock=T0)
    f.cluster.leaders[ORDERS] = 1
    loop: dict[str, Any] = {}

    def scripted_run(collector: Collector, publish: Callable[..., object], **kwargs: Any) -> int:
        loop.update(collector=collector, publish=publish, also=list(kwargs["also"]))
        return 0

    monkeypatch.setattr(cli, "run", scripted_run)
    monkeypatch.setattr(cli, "connect_admin", lambda *a, **k: _Admin())
    monkeypatch.setattr(cli, "KafkaWire", lambda *a, **k: f.cluster)
    monkeypatch.setattr(cli, "ensure_topics", lambda *a, **k: None)
    monkeypatch.setattr(cli, "producer_for", lambda *a, **k: None)
    monkeypatch.setattr(cli, "KafkaSink", lambda *a, **k: f.sink)
    args = txnwatch_cli.build_parser().parse_args(
        [
            "collect",
            "--bootstrap-server",
            "b:9092",
            "--coordinator-source",
            "describe",
            "--no-restore",
            "--metrics-port",
            "0",
            "--topic-prefix",
            "txnwatch",
        ]
    )
    assert args.func(args) == 0

    def loop_turn() -> None:  # `admin.collect.collector.run`: sweep, publish it, then the `also` tasks
        loop["publish"](loop["collector"].sweep())
        for task in loop["also"]:
            task()

    loop_turn()  # nothing open; the poll describes tx-1 (new to this poller): T1's completion
    begin_t2(f)
    f.cluster.on_listing = [lambda: commit_t2(f)]
    loop_turn()  # the sweep sees T2 open; T2 commits before the poll lists
    assert f.cluster.described[-1] == ["tx-1"]
    record = f.sink.view("tx-1")
    assert (record.state, record.start_timestamp_ms) == (CoordinatorState.COMPLETE_COMMIT, T2_START)
