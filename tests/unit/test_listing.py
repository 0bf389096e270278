"""When a ListTransactions answer counts for a `__transaction_state` partition (`detectors.listing`): only from
the broker that led the partition at one leader epoch in the Metadata read before the request and in the one read
after the answer (a broker that lost the partition answers from its old cache until it unloads it: KAFKA-21181,
KAFKA-21481). The rule alone, then the describe fallback's position and tombstones, then the verified abort's
owner check. The same on a real three-node bed: tests/broker/test_stale_listing.py."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from collector_fakes import FakeCoordinators, description
from test_coordinator_listing import LOG, assert_withheld_then_vouched, fallback, tombstones
from test_verified_abort import FakeProposalWire, run, scripted

from admin.collect.coordinator import CoordinatorPoller
from admin.wire.types import ClusterView, ListingResult, TransactionListing
from detectors.currency import coordinator_partition
from detectors.listing import LogLeader, check_listing
from detectors.models import AuditOutcome

pytestmark = pytest.mark.unit

# ------------------------------------------------------------------------------------------------ the rule


def test_every_partition_led_at_one_epoch_and_answered_counts() -> None:
    leaders = {0: LogLeader(1, 4), 1: LogLeader(2, 7)}
    check = check_listing(leaders, dict(leaders), {1, 2, 3})
    assert check.complete and check.counted == {0: 1, 1: 2} and check.gaps == ()


@pytest.mark.parametrize(
    ("before", "after", "answered", "kind", "detail"),
    [
        (LogLeader(-1, None), LogLeader(-1, None), {1, 2}, "no-leader", "partition 0 has no leader"),
        (LogLeader(1, 4), LogLeader(-1, None), {1, 2}, "no-leader", "partition 0 has no leader"),
        (LogLeader(1, 4), LogLeader(2, 5), {1, 2}, "moved", "moved from broker 1 to broker 2"),
        # The same broker, another epoch: it lost the partition and took it back during the listing (the leader
        # alone, all txnwatch compared before, looks unchanged).
        (LogLeader(1, 4), LogLeader(1, 6), {1, 2}, "epoch-changed", "went from leader epoch 4 to 6"),
        (LogLeader(1, None), LogLeader(1, 4), {1, 2}, "epoch-unknown", "no leader epoch"),
        (LogLeader(1, 4), LogLeader(1, None), {1, 2}, "epoch-unknown", "no leader epoch"),
        (LogLeader(1, 4), LogLeader(1, 4), {2}, "not-answered", "broker 1, the leader of"),
    ],
)
def test_a_partition_whose_answer_does_not_count_is_a_gap(
    before: LogLeader, after: LogLeader, answered: set[int], kind: str, detail: str
) -> None:
    check = check_listing({0: before, 1: LogLeader(2, 1)}, {0: after, 1: LogLeader(2, 1)}, answered)
    assert not check.complete and check.counted == {1: 2}
    (gap,) = check.gaps
    assert (gap.partition, gap.kind) == (0, kind) and detail in gap.detail, gap


def test_only_the_leader_s_answer_about_an_id_counts() -> None:
    """An id of partition 0 listed (or described) by broker 2, which lost partition 0 to broker 1 before the
    request: its answer comes from its old cache, and does not count; broker 1's does."""
    tid = next(f"tx-{i}" for i in range(100) if coordinator_partition(f"tx-{i}", 2) == 0)
    leaders = {0: LogLeader(1, 5), 1: LogLeader(2, 3)}
    check = check_listing(leaders, dict(leaders), {1, 2})
    assert check.counts(tid, 1) and not check.counts(tid, 2)
    moved = check_listing(
        {0: LogLeader(1, 5), 1: LogLeader(2, 3)}, {0: LogLeader(1, 7), 1: LogLeader(2, 3)}, {1, 2}
    )
    assert not moved.counts(tid, 1) and not moved.counts(tid, 2)


# ------------------------------------------------------------------------------------- describe fallback


def test_a_leader_that_lost_and_retook_its_partition_during_the_poll_withholds_the_position() -> None:
    """Broker 1 leads `__transaction_state` partition 0 before the listing and after it, at leader epochs 0 and
    2: it lost the partition and took it back meanwhile, and its answer may come from either side. No position
    vouches for the poll (the leader alone was compared before: it vouched)."""
    f = fallback()
    f.cluster.epoch_views = [{}, {(LOG, 0): 2}]  # before the listing: epoch 0 (the default); after it: 2
    assert_withheld_then_vouched(f, "leader-moved", lambda: f.cluster.epochs.update({(LOG, 0): 2}))


def test_a_position_needs_the_leader_epochs_metadata_gives() -> None:
    """Metadata without leader epochs cannot show that a leader kept its partition across the listing."""
    f = fallback()
    f.cluster.log_epoch = None
    assert_withheld_then_vouched(f, "leader-moved", lambda: setattr(f.cluster, "log_epoch", 0))


@dataclass
class Bumping(FakeCoordinators):
    """Each Metadata read gives `__transaction_state` partition 0 a leader epoch one higher (the same leader): it
    loses the partition and takes it back between any two reads."""

    reads: int = 0

    def metadata(self, topics: Sequence[str] | None = None) -> ClusterView:
        view = super().metadata(topics)
        self.reads += 1
        return ClusterView(view.brokers, view.leaders, view.internal_topics, {(LOG, 0): self.reads})


def test_an_id_gone_while_its_leader_lost_and_retook_the_partition_is_not_tombstoned() -> None:
    """tx-1 is listed by nobody, and its leader answers TRANSACTIONAL_ID_NOT_FOUND, but between the Metadata read
    before the listing and the one after it that leader lost the partition and took it back: its listing and its
    answer may both come from the moment it did not hold it. The id is withheld, not tombstoned (a tombstone tells
    the streaming job the id expired, and its open transactions turn HANGING)."""
    fake = Bumping(descriptions={"tx-1": description()})
    p = CoordinatorPoller(fake, clock_ms=lambda: 0)
    p.poll()
    del fake.descriptions["tx-1"]
    assert tombstones(p) == []
    assert p.withheld_expiries == 1


@dataclass
class FormerLeaderToo(FakeCoordinators):
    """Broker 2 lost `__transaction_state` partition 0 to broker 1 but still lists tx-1 from its old cache (after
    broker 1's row), and answers DescribeTransactions NOT_COORDINATOR for it."""

    def list_transactions(self, **kwargs: Any) -> ListingResult:
        listing = super().list_transactions(**kwargs)
        stale = [
            TransactionListing(t.transactional_id, t.producer_id, "CompleteCommit", 2)
            for t in listing.listings
        ]
        return ListingResult(listing.listings + stale, listing.failed, listing.answered)

    def describe_transactions(self, by_coordinator: Any) -> Any:
        out = super().describe_transactions({b: ids for b, ids in by_coordinator.items() if b != 2})
        return out + [
            d._replace(error="NOT_COORDINATOR", coordinator=2)
            for d in super().describe_transactions({b: ids for b, ids in by_coordinator.items() if b == 2})
        ]


def test_an_id_listed_by_its_leader_and_a_former_leader_is_taken_from_the_leader() -> None:
    fake = FormerLeaderToo(
        descriptions={"tx-1": description()}
    )  # coordinated by broker 1, partition 0's leader
    p = CoordinatorPoller(fake, clock_ms=lambda: 0)
    poll = p.poll_as_of()
    assert [r.transactional_id for r in poll.records] == ["tx-1"] and poll.incomplete is None


# ------------------------------------------------------------------------------------- the verified abort


@dataclass
class BumpingProposalWire(FakeProposalWire):
    """`scripted()`'s cluster, where every Metadata read for `__transaction_state` gives its partitions a leader
    epoch one higher (the same leaders): each lost its partition and took it back between two reads."""

    log_reads: int = 0

    def metadata(self, topics: Sequence[str] | None = None) -> ClusterView:
        view = super().metadata(topics)
        if topics is None or LOG not in topics:
            return view
        self.log_reads += 1
        epochs = {**view.leader_epochs, **{tp: self.log_reads for tp in view.leaders if tp[0] == LOG}}
        return ClusterView(view.brokers, view.leaders, view.internal_topics, epochs)


def no_owner(**overrides: Any) -> dict[str, Any]:
    """No transactional id owns producer 1000 (it expired, or moved on): the abort is SAFE when that is shown."""
    return {"coordinators": FakeCoordinators({}), **overrides}


def test_no_owner_is_shown_by_leaders_that_kept_their_partitions() -> None:
    assert run(scripted(**no_owner()), execute=False).outcome is AuditOutcome.DRY_RUN


def test_no_owner_is_not_shown_by_leaders_that_lost_and_retook_their_partitions() -> None:
    """Nobody lists an owner of producer 1000, every broker answered, and the same brokers lead before and after
    the listing, but at other leader epochs: they may have answered while they did not lead (a broker that lost a
    partition lists without its ids once it unloads it). Refused: the coordinator side cannot be checked."""
    wire = BumpingProposalWire(**scripted(**no_owner()).__dict__)
    record = run(wire, execute=False)
    assert record.outcome is AuditOutcome.REFUSED and wire.markers == []
    assert "coordinator-listing-incomplete" in record.message
    assert "went from leader epoch 1 to 2" in record.message


def test_an_owner_listed_by_a_broker_that_does_not_lead_its_partition_proves_nothing() -> None:
    """Broker 2 lists tx-1 as producer 1000's owner, CompleteCommit, and describes it so, but broker 1 leads tx-1's
    `__transaction_state` partition: broker 2 answers from the cache of a partition it lost (the owner may be
    Ongoing on broker 1, with this partition in its transaction). Refused, not SAFE."""
    stale = FakeCoordinators(
        {
            "tx-1": description(
                state="CompleteCommit", producer_epoch=6, partitions=(("orders", 1),), coordinator=2
            )
        }
    )
    wire = scripted(coordinators=stale)
    record = run(wire, execute=False)
    assert record.outcome is AuditOutcome.REFUSED and wire.markers == []
    assert "coordinator-listing-incomplete: transactional id tx-1 was listed by broker 2" in record.message
    # The same answer from the leader counts.
    leader = FakeCoordinators(
        {
            "tx-1": description(
                state="CompleteCommit", producer_epoch=6, partitions=(("orders", 1),), coordinator=1
            )
        }
    )
    assert run(scripted(coordinators=leader), execute=False).outcome is AuditOutcome.DRY_RUN
