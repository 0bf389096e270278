"""The collector's blocked consumer groups (admin/collect/blocked.py): which partitions are looked at, which groups are
named, the caps, the cached group list, errors counted and never raised; and their series on /metrics."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from admin.collect.blocked import (
    COMMITTED_AT_LSO,
    NO_GROUP_LISTED,
    PARTITION_CAP,
    PENDING_OFFSET_COMMIT,
    SERIES_CAP,
    BlockedGroup,
    BlockedGroups,
    BlockedReport,
    at_or_past_lso,
    open_longer_than,
)
from admin.collect.metrics import CollectorMetrics
from admin.wire.groups import CommittedOffsets, GroupIds
from admin.wire.types import TP
from detectors.models import OpenTransaction, PartitionSnapshot

pytestmark = pytest.mark.unit

NOW = 1_750_000_000_000
MINUTE = 60_000


def snapshot(
    topic: str,
    partition: int,
    *opened_ago_ms: int,
    lso: int | None = 10,
    group: str | None = None,
) -> PartitionSnapshot:
    return PartitionSnapshot(
        cluster="prod",
        sweep_id="s-1",
        observed_at_ms=NOW,
        leader=1,
        topic=topic,
        partition=partition,
        open_transactions=tuple(
            OpenTransaction(
                producer_id=100 + i,
                producer_epoch=0,
                start_offset=10 + i,
                start_timestamp_ms=NOW - ago if ago is not None else None,
                offset_commit_group=group,
            )
            for i, ago in enumerate(opened_ago_ms)
        ),
        last_stable_offset=lso,
        high_watermark=20,
    )


class FakeGroups:
    """The groups wire, scripted; records what it was asked."""

    def __init__(self, groups: Sequence[str], committed: dict[tuple[str, TP], int]) -> None:
        self.groups = tuple(groups)
        self.committed = committed
        self.list_error: str | None = None
        self.errors: dict[str, int] = {}
        self.listings = 0
        self.asked: list[tuple[list[str], list[TP]]] = []

    def list_group_ids(self) -> GroupIds:
        self.listings += 1
        return GroupIds((), self.list_error) if self.list_error else GroupIds(self.groups)

    def committed_offsets(self, groups: Sequence[str], partitions: Sequence[TP]) -> CommittedOffsets:
        self.asked.append((list(groups), list(partitions)))
        offsets = {(g, tp): o for (g, tp), o in self.committed.items() if g in groups and tp in partitions}
        return CommittedOffsets(offsets, dict(self.errors))


# ------------------------------------------------------------------------------------ which partitions


def test_only_partitions_whose_oldest_transaction_is_open_that_long_oldest_first() -> None:
    snaps = [
        snapshot("young", 0, 10_000),
        snapshot("old", 0, 5 * MINUTE),
        snapshot("older", 1, 30_000, 9 * MINUTE),  # its oldest transaction counts
        snapshot("edge", 0, MINUTE),  # exactly the threshold: looked at
    ]
    chosen = open_longer_than(snaps, MINUTE)
    assert [p.tp for p in chosen] == [("older", 1), ("old", 0), ("edge", 0)]
    assert chosen[0].open_since_ms == NOW - 9 * MINUTE


def test_a_transaction_of_unknown_age_is_not_old() -> None:
    unknown = snapshot("t", 0, 0)
    unknown = unknown.model_copy(
        update={"open_transactions": (OpenTransaction(producer_id=1, producer_epoch=0, start_offset=3),)}
    )
    assert open_longer_than([unknown], 1) == []


def test_groups_at_or_past_the_lso_wait_there_and_groups_behind_it_do_not() -> None:
    assert at_or_past_lso(10, {"behind": 9, "at": 10, "past": 12}) == ["at", "past"]
    assert at_or_past_lso(None, {"at": 10}) == []


# ------------------------------------------------------------------------------------------ the lookup


def test_groups_at_a_long_open_partitions_lso_are_named_in_one_offset_fetch() -> None:
    wire = FakeGroups(
        ["app", "audit", "other"],
        {
            ("app", ("orders", 0)): 10,
            ("audit", ("orders", 0)): 4,
            ("app", ("pay", 2)): 7,
            ("other", ("pay", 2)): 3,
        },
    )
    snaps = [
        snapshot("orders", 0, 5 * MINUTE, lso=10),
        snapshot("pay", 2, 2 * MINUTE, lso=7),
        snapshot("new", 0, 1),
    ]
    report = BlockedGroups(wire, after_ms=MINUTE).after_sweep(snaps)
    assert report.blocked == (
        BlockedGroup("orders", 0, "app", COMMITTED_AT_LSO),
        BlockedGroup("pay", 2, "app", COMMITTED_AT_LSO),
    )
    assert report.left_out == {}
    # one OffsetFetch batch for both partitions, every group; the young partition is not asked
    assert wire.asked == [(["app", "audit", "other"], [("orders", 0), ("pay", 2)])]


def test_a_pending_offset_commit_names_its_group_without_asking_offsets() -> None:
    wire = FakeGroups(["streams-app"], {})
    snaps = [snapshot("__consumer_offsets", 17, 5 * MINUTE, lso=3, group="streams-app")]
    report = BlockedGroups(wire, after_ms=MINUTE).after_sweep(snaps)
    assert report.blocked == (BlockedGroup("__consumer_offsets", 17, "streams-app", PENDING_OFFSET_COMMIT),)
    assert wire.asked == [] and wire.listings == 0  # nothing to compare with an LSO: no request at all


def test_nothing_open_that_long_sends_no_request() -> None:
    wire = FakeGroups(["app"], {})
    report = BlockedGroups(wire, after_ms=MINUTE).after_sweep([snapshot("orders", 0, 1_000)])
    assert report == BlockedReport((), {}) and wire.listings == 0 and wire.asked == []


def test_at_most_so_many_partitions_are_asked_the_oldest_and_the_rest_is_counted() -> None:
    wire = FakeGroups(["g"], {("g", ("t", p)): 10 for p in range(5)})
    snaps = [snapshot("t", p, (10 - p) * MINUTE) for p in range(5)]
    report = BlockedGroups(wire, after_ms=MINUTE, max_partitions=3).after_sweep(snaps)
    assert wire.asked[0][1] == [("t", 0), ("t", 1), ("t", 2)]
    assert [b.partition for b in report.blocked] == [0, 1, 2]
    assert report.left_out == {PARTITION_CAP: 2}


def test_at_most_so_many_series_and_the_rest_is_counted() -> None:
    groups = [f"g{i:02}" for i in range(7)]
    wire = FakeGroups(groups, {(g, ("t", 0)): 10 for g in groups})
    report = BlockedGroups(wire, after_ms=MINUTE, max_series=4).after_sweep([snapshot("t", 0, 2 * MINUTE)])
    assert [b.group for b in report.blocked] == groups[:4]
    assert report.left_out == {SERIES_CAP: 3}


def test_the_group_list_is_kept_for_so_many_lookups() -> None:
    wire = FakeGroups(["app"], {("app", ("t", 0)): 10})
    blocked = BlockedGroups(wire, after_ms=MINUTE, group_list_sweeps=3)
    for _ in range(7):
        blocked.after_sweep([snapshot("t", 0, 2 * MINUTE)])
    assert wire.listings == 3  # lookups 1, 4 and 7
    assert len(wire.asked) == 7  # the offsets every sweep


def test_errors_are_counted_by_name_and_a_failed_listing_keeps_the_last_list() -> None:
    wire = FakeGroups(["app"], {("app", ("t", 0)): 10})
    blocked = BlockedGroups(wire, after_ms=MINUTE, group_list_sweeps=1)
    snaps = [snapshot("t", 0, 2 * MINUTE)]
    blocked.after_sweep(snaps)
    wire.list_error = "BROKER_UNREACHABLE"
    wire.errors = {"GROUP_AUTHORIZATION_FAILED": 2}
    report = blocked.after_sweep(snaps)
    assert report.left_out == {"BROKER_UNREACHABLE": 1, "GROUP_AUTHORIZATION_FAILED": 2}
    assert report.blocked == (BlockedGroup("t", 0, "app", COMMITTED_AT_LSO),)  # the groups listed before


def test_no_group_listed_is_said_not_taken_for_no_group_held_up() -> None:
    # Kafka's ListGroups leaves out, without an error, every group the principal may not Describe.
    wire = FakeGroups([], {})
    report = BlockedGroups(wire, after_ms=MINUTE).after_sweep(
        [snapshot("t", 0, 2 * MINUTE), snapshot("t", 1, 3 * MINUTE)]
    )
    assert report == BlockedReport((), {NO_GROUP_LISTED: 2})


def test_a_failing_wire_never_raises_into_the_sweep() -> None:
    class Broken(FakeGroups):
        def list_group_ids(self) -> GroupIds:
            raise RuntimeError("kafka-python blew up")

    got: list[BlockedReport] = []
    report = BlockedGroups(Broken([], {}), after_ms=MINUTE, report=got.append).after_sweep(
        [snapshot("t", 0, 2 * MINUTE)]
    )
    assert report == BlockedReport((), {"CLIENT_ERROR": 1}) and got == [report]


# ------------------------------------------------------------------------------------------ on /metrics


def series(metrics: CollectorMetrics, name: str) -> list[tuple[dict[str, str], float]]:
    text = generate_latest(metrics.registry).decode()
    return [
        (s.labels, s.value) for f in text_string_to_metric_families(text) for s in f.samples if s.name == name
    ]


def test_the_series_name_each_group_and_go_when_it_is_no_longer_held_up() -> None:
    metrics = CollectorMetrics()
    wire = FakeGroups(["app"], {("app", ("orders", 0)): 10})
    blocked = BlockedGroups(wire, after_ms=MINUTE, report=metrics.observe_blocked_groups, max_partitions=0)
    blocked.after_sweep([snapshot("orders", 0, 2 * MINUTE)])
    assert series(metrics, "txnwatch_collector_blocked_groups") == []
    assert series(metrics, "txnwatch_collector_blocked_groups_left_out") == [({"reason": PARTITION_CAP}, 1.0)]

    blocked = BlockedGroups(wire, after_ms=MINUTE, report=metrics.observe_blocked_groups)
    blocked.after_sweep([snapshot("orders", 0, 2 * MINUTE)])
    labels: dict[str, Any] = {"topic": "orders", "partition": "0", "group": "app", "reason": COMMITTED_AT_LSO}
    assert series(metrics, "txnwatch_collector_blocked_groups") == [(labels, 1.0)]
    assert series(metrics, "txnwatch_collector_blocked_groups_left_out") == []

    blocked.after_sweep([])  # the transaction ended
    assert series(metrics, "txnwatch_collector_blocked_groups") == []
