"""Coordinator fallback: what ListTransactions + DescribeTransactions polls publish, and when."""

from __future__ import annotations

import pytest
from test_collector_fakes import T0, FakeCoordinators, description

from admin.coordinator import ACTIVE_STATES, CoordinatorPoller, record_from_description, tombstone
from detectors.models import CoordinatorState, TopicPartition

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
    assert p.poll() == [] and fake.described[-1:] == [["tx-2"]]  # only the first poll described it
    fake.descriptions["tx-2"] = description(transactional_id="tx-2", state="Ongoing", producer_epoch=6)
    (r,) = p.poll()
    assert r.state is CoordinatorState.ONGOING and r.producer_epoch == 6


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


def test_unknown_state_is_reported_not_fatal(caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeCoordinators(descriptions={"tx-1": description(state="Unknown")})
    p, _ = poller(fake)
    assert p.poll() == []
    assert "unusable answer" in caplog.text
