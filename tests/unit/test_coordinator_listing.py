"""When an absence from ListTransactions counts: the describe fallback's tombstones (`CoordinatorPoller`) and the
abort's "no owner" (`admin.inspect.listing_incomplete`), on scripted coordinators. The same on a real three-node
test bed: tests/broker/test_coordinator_moves.py."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from collector_fakes import T0, FakeCluster, FakeCoordinators, description

from admin.coordinator import CoordinatorPoller
from admin.inspect import listing_incomplete
from admin.seams import ListingResult, TransactionDescription

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


def test_a_complete_listing_has_no_gap() -> None:
    fake = both({0: 1, 1: 2, 2: 3})
    assert listing_incomplete(fake, {0: 1, 1: 2, 2: 3}, {1, 2, 3}) is None


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
    gap = listing_incomplete(fake, before, answered)
    assert gap is not None and gap.startswith("coordinator-listing-incomplete: ")
    assert reason in gap
