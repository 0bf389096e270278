"""Coordinator fallback: what ListTransactions + DescribeTransactions polls publish, and when."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from collector_fakes import T0, FakeCluster, FakeCoordinators, description

from admin.cli.main import publish_coordinator_poll
from admin.collect.coordinator import (
    ACTIVE_STATES,
    CoordinatorPoller,
    tombstone,
)
from admin.collect.publish import OutRecord, Publisher
from admin.wire.errors import AdminError
from admin.wire.types import TP, EndOffset, ListingResult, record_from_description
from detectors.contract import COORDINATOR_LOG_POSITION_TYPE
from detectors.models import (
    CoordinatorLogPosition,
    CoordinatorState,
    TopicPartition,
)

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.now = T0 + 60_000

    def __call__(self) -> int:
        return self.now


def poller(fake: FakeCoordinators, duration_filter_ms: int = 0) -> tuple[CoordinatorPoller, Clock]:
    clock = Clock()
    return CoordinatorPoller(fake, duration_filter_ms=duration_filter_ms, clock_ms=clock), clock


def test_record_from_description() -> None:
    r = record_from_description(
        description(partitions=(("orders", 1), ("orders", 0), ("audit", 2))), seen_at_ms=T0 + 5
    )
    assert r.state is CoordinatorState.ONGOING and r.origin == "describe-transactions"
    assert r.partitions == (
        TopicPartition(topic="audit", partition=2),
        TopicPartition(topic="orders", partition=0),
        TopicPartition(topic="orders", partition=1),
    )
    assert (r.producer_id, r.producer_epoch, r.transaction_timeout_ms) == (1000, 5, 60_000)
    assert (r.start_timestamp_ms, r.last_update_timestamp_ms) == (T0, T0 + 5)
    assert (r.previous_producer_id, r.next_producer_id, r.source_offset) == (-1, -1, -1)


def test_tombstone_record() -> None:
    t = tombstone("tx-9", seen_at_ms=T0)
    assert t.tombstone and t.state is None and t.origin == "describe-transactions"
    assert t.last_update_timestamp_ms == T0 and t.producer_id == -1


def test_first_poll_publishes_everything_then_only_changes() -> None:
    fake = FakeCoordinators(
        descriptions={
            "tx-1": description(),
            "tx-2": description(
                transactional_id="tx-2", state="CompleteCommit", partitions=(), producer_id=2
            ),
        }
    )
    p, clock = poller(fake)
    assert {r.transactional_id for r in p.poll()} == {"tx-1", "tx-2"}
    clock.now += 1_000
    # Nothing changed: the Ongoing one is described again (its partitions may grow) but not republished.
    assert p.poll() == []
    assert fake.described[-1] == ["tx-1"]
    # The Ongoing transaction adds a partition: republished, with the time it was first seen so.
    fake.descriptions["tx-1"] = description(partitions=(("orders", 0), ("orders", 1)))
    (changed,) = p.poll()
    assert changed.lists("orders", 1) and changed.last_update_timestamp_ms == clock.now


def test_state_change_is_described_and_published() -> None:
    fake = FakeCoordinators(
        descriptions={"tx-2": description(transactional_id="tx-2", state="CompleteCommit")}
    )
    p, _ = poller(fake)
    p.poll()
    assert p.poll() == []
    assert [ids for ids in fake.described if "tx-2" in ids] == [["tx-2"]]  # only the first poll described it
    fake.descriptions["tx-2"] = description(transactional_id="tx-2", state="Ongoing", producer_epoch=6)
    (r,) = p.poll()
    assert r.state is CoordinatorState.ONGOING and r.producer_epoch == 6


def test_an_id_a_sweep_saw_open_is_described_by_the_next_poll_and_published_only_if_it_changed() -> None:
    fake = FakeCoordinators(
        descriptions={
            "tx-1": description(state="CompleteCommit", partitions=()),
            "tx-2": description(
                transactional_id="tx-2", state="CompleteCommit", partitions=(), producer_id=2
            ),
        }
    )
    p, clock = poller(fake)
    p.poll()
    fake.described.clear()

    def described() -> list[list[str]]:
        return [ids for ids in fake.described if "tx-1" in ids or "tx-2" in ids]

    p.saw_open({1000, 4242})  # 4242: a producer id no listed id has (an orphan's)
    clock.now += 1_000
    assert p.poll() == [] and described() == [["tx-1"]]  # described though listed alike; the same content
    fake.descriptions["tx-1"] = description(state="CompleteCommit", partitions=(), start_time_ms=T0 + 500)
    assert p.poll() == [] and described() == [
        ["tx-1"]
    ]  # not again: only what the sweeps since the last poll saw
    p.saw_open({1000})
    clock.now += 1_000
    (r,) = p.poll()  # a transaction ran between the two listings: its completion, stamped by this poll
    assert (r.start_timestamp_ms, r.last_update_timestamp_ms) == (T0 + 500, clock.now)


def test_expired_id_gets_a_tombstone_but_not_when_its_coordinator_failed() -> None:
    fake = FakeCoordinators(
        descriptions={
            "tx-1": description(coordinator=1),
            "tx-3": description(transactional_id="tx-3", producer_id=3, coordinator=2),
        }
    )
    p, _ = poller(fake)
    p.poll()
    fake.failed = {
        2: "BROKER_UNREACHABLE"
    }  # tx-3 vanishes from the listing, but only because broker 2 failed
    assert [r for r in p.poll() if r.tombstone] == []
    fake.failed = {}
    del fake.descriptions["tx-1"]  # expired
    (t,) = [r for r in p.poll() if r.tombstone]
    assert t.transactional_id == "tx-1"


def test_not_found_between_listing_and_describing_is_an_expiry() -> None:
    fake = FakeCoordinators(descriptions={"tx-1": description()})
    p, _ = poller(fake)
    p.poll()
    fake.describe_errors["tx-1"] = "TRANSACTIONAL_ID_NOT_FOUND"
    (t,) = p.poll()
    assert t.tombstone and t.transactional_id == "tx-1"


def test_transient_describe_error_is_retried_next_poll() -> None:
    fake = FakeCoordinators(
        descriptions={"tx-2": description(transactional_id="tx-2", state="CompleteAbort")}
    )
    fake.describe_errors["tx-2"] = "COORDINATOR_LOAD_IN_PROGRESS"
    p, _ = poller(fake)
    assert p.poll() == []
    del fake.describe_errors["tx-2"]
    (r,) = p.poll()
    assert r.state is CoordinatorState.COMPLETE_ABORT


def test_authorization_error_names_the_acl(caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeCoordinators(descriptions={"tx-1": description()})
    fake.describe_errors["tx-1"] = "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"
    p, _ = poller(fake)
    assert p.poll() == []
    assert "Describe on transactional id tx-1" in caplog.text


def test_duration_filter_limits_redescribing_active_transactions() -> None:
    fake = FakeCoordinators(
        descriptions={
            "young": description(transactional_id="young"),
            "old": description(transactional_id="old", producer_id=2),
        },
        long_running={"old"},
    )
    p, _ = poller(fake, duration_filter_ms=5_000)
    p.poll()
    p.poll()
    assert fake.described[-1] == ["old"]
    assert fake.list_calls[-1] == {
        "producer_ids": [],
        "states": list(ACTIVE_STATES),
        "duration_filter_ms": 5_000,
        "brokers": [1, 2, 3],
    }


def test_without_duration_filter_support_every_active_one_is_described(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake = FakeCoordinators(
        descriptions={
            "young": description(transactional_id="young"),
            "old": description(transactional_id="old"),
        },
        duration_filter=False,
    )
    p, _ = poller(fake, duration_filter_ms=5_000)
    p.poll()
    p.poll()
    assert fake.described[-1] == ["old", "young"]
    assert "Kafka 3.8" in caplog.text
    assert all(c["duration_filter_ms"] is None for c in fake.list_calls)


def mixed_cluster(**knobs: Any) -> FakeCoordinators:
    """Brokers 1-3, each coordinating one young and one long-running Ongoing transaction."""
    descriptions = {
        f"{age}-{b}": description(transactional_id=f"{age}-{b}", producer_id=10 * b + i, coordinator=b)
        for b in (1, 2, 3)
        for i, age in enumerate(("young", "old"))
    }
    return FakeCoordinators(descriptions=descriptions, long_running={"old-1", "old-2", "old-3"}, **knobs)


def test_the_duration_filter_is_chosen_per_broker(caplog: pytest.LogCaptureFixture) -> None:
    """A cluster mid-upgrade: brokers 1 and 2 run 3.8+, broker 3 an older release (no ListTransactions v1).
    Broker 3 is listed without the filter, so its young transaction is described too; the others with it. No
    broker fails, nothing is skipped, and the poll is complete."""
    fake = mixed_cluster(before_3_8=frozenset({3}))
    p, _ = poller(fake, duration_filter_ms=5_000)
    p.poll()
    poll = p.poll_as_of()
    assert fake.described[-1] == ["old-1", "old-2", "old-3", "young-3"]
    assert [(c.get("brokers"), c["duration_filter_ms"]) for c in fake.list_calls[-3:]] == [
        (None, None),
        ([1, 2], 5_000),
        ([3], None),
    ]
    assert poll.incomplete is None
    assert "broker 3 listed without ListTransactions' DurationFilter" in caplog.text


def test_a_broker_that_fails_the_duration_filter_is_asked_again_without_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Broker 2's ApiVersions offer ListTransactions v1 (kafka-python clamps a connection's versions to the
    bootstrap broker's, and a broker may still refuse), but it fails the filtered listing: it is asked again
    without the filter, and its transactions are described, not skipped."""
    fake = mixed_cluster(filter_errors={2: "UNSUPPORTED_VERSION"})
    p, _ = poller(fake, duration_filter_ms=5_000)
    p.poll()
    poll = p.poll_as_of()
    assert fake.described[-1] == ["old-1", "old-2", "old-3", "young-2"]
    assert [(c.get("brokers"), c["duration_filter_ms"]) for c in fake.list_calls[-2:]] == [
        ([1, 2, 3], 5_000),
        ([2], None),
    ]
    assert poll.incomplete is None
    assert "failed on broker 2 (UNSUPPORTED_VERSION); asked again without the filter" in caplog.text


def test_a_broker_whose_versions_are_unknown_is_listed_without_the_filter() -> None:
    fake = mixed_cluster(apis_unknown=frozenset({1}))
    p, _ = poller(fake, duration_filter_ms=5_000)
    p.poll()
    p.poll()
    assert fake.described[-1] == ["old-1", "old-2", "old-3", "young-1"]


def test_unknown_state_is_reported_not_fatal(caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeCoordinators(descriptions={"tx-1": description(state="Unknown")})
    p, _ = poller(fake)
    assert p.poll() == []
    assert "unusable answer" in caplog.text


# ---------------------------------------------------------------------------- coordinator-state position

COORDINATOR_TOPIC = "txnwatch.coordinator-state"
SNAPSHOT_TOPIC = "txnwatch.producer-state"


@dataclass
class Coordinators(FakeCluster, FakeCoordinators):
    """Both seams on one scripted clock; `events` records what was asked and sent, in order."""

    events: list[str] = field(default_factory=list)

    def list_transactions(self, **kwargs: Any) -> ListingResult:
        self.clock += 1  # the broker answers after the request was sent
        self.events.append(f"ListTransactions@{self.clock}")
        return super().list_transactions(**kwargs)

    def end_offsets(self, wanted: Mapping[int, Sequence[TP]]) -> dict[TP, EndOffset]:
        self.events.append("ListOffsets")
        return super().end_offsets(wanted)


class RecordingSink:
    def __init__(self, events: list[str], *, fail: bool = False) -> None:
        self.events = events
        self.fail = fail
        self.sent: list[OutRecord] = []

    def send_all(self, records: Sequence[OutRecord]) -> None:
        if self.fail:
            raise AdminError("Produce failed")
        self.sent.extend(records)
        self.events.append("acked " + ",".join(dict(r.headers)["txnwatch.type"].decode() for r in records))

    def close(self) -> None:
        pass


def fallback(
    *, fail: bool = False, topic_partitions: int = 3
) -> tuple[Coordinators, CoordinatorPoller, Publisher, RecordingSink]:
    fake = Coordinators(
        leaders={
            ("orders", 0): 1,
            ("__transaction_state", 0): 1,  # every id's coordinator: broker 1
            **{(COORDINATOR_TOPIC, p): 1 + p % 2 for p in range(topic_partitions)},
        },
        high_watermarks={(COORDINATOR_TOPIC, p): 100 + p for p in range(topic_partitions)},
        descriptions={"tx-1": description()},
    )
    sink = RecordingSink(fake.events, fail=fail)
    publisher = Publisher(sink, snapshot_topic=SNAPSHOT_TOPIC, coordinator_topic=COORDINATOR_TOPIC)
    return fake, CoordinatorPoller(fake, clock_ms=lambda: fake.clock), publisher, sink


def test_poll_as_of_is_read_before_list_transactions() -> None:
    fake, poller_, _, _ = fallback()
    before = fake.clock
    poll = poller_.poll_as_of()
    assert poll.as_of_ms == before < fake.clock  # ListTransactions ticked the clock after as_of was read
    (record,) = poll.records
    assert record.last_update_timestamp_ms >= poll.as_of_ms
    assert poller_.poll_as_of().poll_id != poll.poll_id


def test_position_is_measured_after_the_records_are_acknowledged_and_published_last() -> None:
    fake, poller_, publisher, sink = fallback()
    poll, position = publish_coordinator_poll(poller_, publisher, fake, cluster="prod")
    assert fake.events == [
        f"ListTransactions@{poll.as_of_ms + 1}",
        "acked coordinator-record",
        "ListOffsets",
        f"acked {COORDINATOR_LOG_POSITION_TYPE}",
    ]
    assert position is not None
    assert (position.cluster, position.sweep_id, position.topic, position.as_of_ms) == (
        "prod",
        poll.poll_id,
        COORDINATOR_TOPIC,
        poll.as_of_ms,
    )
    assert (position.partitions, position.end_offsets) == (3, {0: 100, 1: 101, 2: 102})
    # __transaction_state's leaders before and after the listing (is the poll complete?), then only the one topic
    assert fake.metadata_topics == [["__transaction_state"], ["__transaction_state"], [COORDINATOR_TOPIC]]
    last = sink.sent[-1]
    assert (last.topic, last.key) == (SNAPSHOT_TOPIC, f"__position__-{COORDINATOR_TOPIC}".encode())
    assert CoordinatorLogPosition.model_validate_json(last.value) == position


def test_a_poll_without_changes_still_publishes_its_position() -> None:
    fake, poller_, publisher, _ = fallback()
    publish_coordinator_poll(poller_, publisher, fake, cluster="prod")
    fake.events.clear()
    poll, position = publish_coordinator_poll(poller_, publisher, fake, cluster="prod")
    assert poll.records == [] and position is not None and position.as_of_ms == poll.as_of_ms
    assert fake.events[1:] == ["ListOffsets", f"acked {COORDINATOR_LOG_POSITION_TYPE}"]


def test_failed_publish_measures_nothing_and_the_next_poll_sends_the_records_again() -> None:
    fake, poller_, publisher, sink = fallback()
    fake.descriptions["tx-2"] = description(transactional_id="tx-2", state="CompleteCommit", producer_id=2)
    publish_coordinator_poll(poller_, publisher, fake, cluster="prod")  # publishes both
    fake.events.clear()
    del fake.descriptions["tx-2"]  # expires
    fake.descriptions["tx-1"] = description(producer_epoch=6)  # changes
    sink.fail = True
    with pytest.raises(AdminError):
        publish_coordinator_poll(poller_, publisher, fake, cluster="prod")
    assert "ListOffsets" not in fake.events
    sink.fail = False
    poll, position = publish_coordinator_poll(poller_, publisher, fake, cluster="prod")
    assert {(r.transactional_id, r.tombstone, r.producer_epoch) for r in poll.records} == {
        ("tx-1", False, 6),
        ("tx-2", True, -1),
    }
    assert position is not None


def test_missing_coordinator_topic_or_partition_errors(caplog: pytest.LogCaptureFixture) -> None:
    fake, poller_, publisher, _ = fallback(topic_partitions=0)
    poll, position = publish_coordinator_poll(poller_, publisher, fake, cluster="prod")
    assert position is None and "ListOffsets" not in fake.events and poll.records
    fake, poller_, publisher, _ = fallback()
    fake.offset_errors[(COORDINATOR_TOPIC, 1)] = "TOPIC_AUTHORIZATION_FAILED"
    _, position = publish_coordinator_poll(poller_, publisher, fake, cluster="prod")
    assert position is not None and position.end_offsets == {0: 100, 2: 102}
    assert f"grant the ACL Describe on topic {COORDINATOR_TOPIC}" in caplog.text


def test_a_duration_filter_moves_the_position_back_by_the_filter() -> None:
    """With a DurationFilter, a young Ongoing transaction that adds a partition is not described again until it
    is older than the filter: the position must not vouch for the last `duration_filter_ms` of state."""
    fake, _, publisher, _ = fallback()
    filtered = CoordinatorPoller(fake, duration_filter_ms=30_000, clock_ms=lambda: fake.clock)
    poll, position = publish_coordinator_poll(filtered, publisher, fake, cluster="prod")
    assert position is not None and position.as_of_ms == poll.as_of_ms - 30_000
