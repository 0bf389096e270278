"""The series behind the stuck-prepare, coordinator-overdue and withheld pages (streaming/exporter.py), fed with
stage 2's own events (detectors/tracking.py, as the driver's EventRow): one per partition in that state, naming
the partition and the transactional id of the coordinator record it was judged against, valued at when the
transaction opened, and gone once the transaction leaves that state."""

from __future__ import annotations

from typing import Any

import pytest
from builders import SECOND, T0, coord, open_txn, snapshot
from test_tracking import (
    batch,
    fact_row,
    new_bucket,
    open_row,
    position_row,
    seen_at,
)

from common import metric_descriptors as metrics
from detectors.models import CoordinatorState
from detectors.tracking import EVENT_COLUMNS, BucketState, reconcile_bucket
from streaming.exporter import LiveState, VerdictCollector
from streaming.sinks import EventRow

pytestmark = pytest.mark.unit

STUCK = metrics.STUCK_PREPARE_TRANSACTION_OPEN_SINCE_TIMESTAMP_SECONDS
OVERDUE = metrics.COORDINATOR_OVERDUE_TRANSACTION_OPEN_SINCE_TIMESTAMP_SECONDS
WITHHELD = metrics.WITHHELD_VERDICT_OPEN_SINCE_TIMESTAMP_SECONDS
LSO_LAG = metrics.LAST_STABLE_OFFSET_LAG
HANGING = metrics.HANGING_TRANSACTION_OPEN_SINCE_TIMESTAMP_SECONDS


def applied(state: LiveState, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events, applied as the sink applies them (EventRow, the driver's row of EVENT_COLUMNS)."""
    state.apply_events([EventRow(*(e[c] for c in EVENT_COLUMNS)) for e in events])
    return events


def series(state: LiveState, metric: metrics.Metric) -> list[tuple[dict[str, str], float]]:
    (family,) = [f for f in VerdictCollector(state, "prod").collect() if f.name == metric.name]
    return [(s.labels, s.value) for s in family.samples]


def forget_all(bucket: BucketState, state: LiveState) -> None:
    """No snapshot confirms the transaction any more (it ended): stage 2 forgets it at its deadline."""
    deadline = bucket.next_deadline()
    assert deadline is not None
    applied(state, [dict(zip(EVENT_COLUMNS, e, strict=True)) for e in bucket.expire(deadline)])


def test_a_stuck_prepare_names_its_partition_and_transactional_id_until_it_ends() -> None:
    preparing = coord(
        transactional_id="payments-7", state=CoordinatorState.PREPARE_COMMIT, last_update_timestamp_ms=T0
    )
    b, state = new_bucket(), LiveState()
    at = T0 + 30 * SECOND
    events = applied(state, batch(b, at, fact_row(preparing), open_row(seen_at(at))))
    assert [(e["kind"], e["transactional_id"]) for e in events] == [("STUCK_PREPARE", "payments-7")]
    assert series(state, STUCK) == [
        (
            {"cluster": "prod", "topic": "orders", "partition": "0", "transactional_id": "payments-7"},
            T0 / 1000,  # opened at T0 (its start batch's timestamp)
        )
    ]
    assert series(state, OVERDUE) == series(state, WITHHELD) == []
    forget_all(b, state)
    assert series(state, STUCK) == []


def test_a_coordinator_overdue_transaction_names_its_partition_and_transactional_id() -> None:
    ongoing = coord(transactional_id="billing-2")  # Ongoing with orders-0, a 60 s timeout, since T0
    b, state = new_bucket(), LiveState()
    at = T0 + 80 * SECOND  # past its timeout, the coordinator's abort interval and the clock skew
    events = applied(state, batch(b, at, fact_row(ongoing), open_row(seen_at(at))))
    assert [(e["kind"], e["transactional_id"]) for e in events] == [("COORDINATOR_OVERDUE", "billing-2")]
    assert series(state, OVERDUE) == [
        (
            {"cluster": "prod", "topic": "orders", "partition": "0", "transactional_id": "billing-2"},
            T0 / 1000,
        )
    ]
    assert series(state, STUCK) == []
    forget_all(b, state)
    assert series(state, OVERDUE) == []


def test_a_withheld_verdict_names_its_partition_transactional_id_and_why() -> None:
    # The view still shows the producer's previous transaction completed and is behind the collector's newest
    # measurement: a HANGING rule holds, the proof is withheld (UNCONFIRMED).
    done = coord(state=CoordinatorState.COMPLETE_COMMIT, partitions=(), last_update_timestamp_ms=T0 - SECOND)
    b, state = new_bucket(), LiveState()
    at = T0 + 30 * SECOND
    behind = position_row(at, {0: 12, 1: 0, 2: 0})
    applied(
        state, batch(b, at - 15 * SECOND, fact_row(done), open_row(seen_at(at - 15 * SECOND)), current=False)
    )
    events = applied(state, batch(b, at, open_row(seen_at(at)), behind, current=False))
    assert [(e["kind"], e["withheld"], e["transactional_id"]) for e in events] == [
        ("UNCONFIRMED", "coordinator-view-behind", "tx-1")
    ]
    assert series(state, WITHHELD) == [
        (
            {
                "cluster": "prod",
                "topic": "orders",
                "partition": "0",
                "transactional_id": "tx-1",
                "reason": "coordinator-view-behind",
                "would_be": "coordinator-completed",
            },
            T0 / 1000,
        )
    ]
    forget_all(b, state)
    assert series(state, WITHHELD) == []


def test_the_lso_lag_series_follows_every_sweep_while_the_verdict_stays_the_same() -> None:
    """Stage 2 tells a verdict only when it changes, but a changed LSO lag is a change: the per-partition series
    an SRE watches grow behind an open transaction is never more than a sweep old, and a sweep that moved
    nothing sends nothing."""
    preparing = coord(state=CoordinatorState.PREPARE_COMMIT, last_update_timestamp_ms=T0)
    b, state = new_bucket(), LiveState()
    labels = {"cluster": "prod", "topic": "orders", "partition": "0"}
    for i, (high_watermark, news) in enumerate(((250, 1), (400, 1), (400, 0), (900, 1))):
        at = T0 + (30 + 10 * i) * SECOND
        shown = open_row(snapshot(open_txn(), observed_at_ms=at, high_watermark=high_watermark))
        events = applied(state, batch(b, at, *([fact_row(preparing)] if i == 0 else []), shown))
        assert [(e["event"], e["kind"]) for e in events] == [("VERDICT", "STUCK_PREPARE")] * news
        assert series(state, LSO_LAG) == [(labels, high_watermark - 100)]  # the LSO stays at 100
        assert series(state, STUCK) == [({**labels, "transactional_id": "tx-1"}, T0 / 1000)]


def test_a_new_driver_gets_the_hanging_series_back_at_the_first_batch_of_the_new_run() -> None:
    """After a restart from the checkpoint the driver's live state is empty and no verdict changed: stage 2 tells
    it every verdict again (once per run), so the hanging series and its page come back at once."""
    done = coord(state=CoordinatorState.COMPLETE_COMMIT, partitions=(), last_update_timestamp_ms=T0 - SECOND)
    b, before = new_bucket(), LiveState()
    applied(before, batch(b, T0 + 5 * SECOND, fact_row(done), open_row(seen_at(T0 + 5 * SECOND))))
    applied(before, batch(b, T0 + 25 * SECOND, open_row(seen_at(T0 + 25 * SECOND))))
    assert len(series(before, HANGING)) == 1
    after = LiveState()  # the new driver
    columns = [list(c) for c in zip(position_row(T0 + 35 * SECOND), strict=True)]
    events = reconcile_bucket(b, columns, T0 + 35 * SECOND, announce=True)
    applied(after, [dict(zip(EVENT_COLUMNS, e, strict=True)) for e in events])
    assert [label for label, _ in series(after, HANGING)] == [label for label, _ in series(before, HANGING)]
