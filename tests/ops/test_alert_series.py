"""The series the hanging alert is built on (`txnwatch_hanging_transaction_open_since_timestamp_seconds`): one
per HANGING transaction with a candidate, gone with it, valued at when it opened. Fast and without Spark; the
live test (tests/e2e/test_alerts_live.py) sees it from the real job."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from streaming.exporter import LiveState, VerdictCollector

NAME = "txnwatch_hanging_transaction_open_since_timestamp_seconds"


def event(event: str, producer_id: int, kind: str | None = None, **over: Any) -> SimpleNamespace:
    row = {
        "event": event,
        "producer_id": producer_id,
        "topic": "orders",
        "partition": 3,
        "kind": kind,
        "reason": None,
        "lso_lag": 5,
        "age_ms": 0,
        "candidate_id": None,
        "withheld": None,
        "event_time_ms": 1_700_000_100_000,
        "payload": None,
        "start_offset": 10,
        "two_phase_commit": False,
    }
    return SimpleNamespace(**{**row, **over})


def series(state: LiveState) -> list[tuple[dict[str, str], float]]:
    (family,) = [f for f in VerdictCollector(state, "prod").collect() if f.name == NAME]
    return [(s.labels, s.value) for s in family.samples]


def test_one_series_per_hanging_transaction_valued_at_when_it_opened() -> None:
    state = LiveState()
    state.apply_events(
        [
            event(
                "VERDICT",
                7,
                "HANGING",
                reason="coordinator-completed",
                candidate_id="c7",
                age_ms=100_000,
            ),
            event("VERDICT", 8, "LATE", age_ms=2_000_000),
            # withheld: a HANGING rule holds, but no proof, no candidate, no series
            event(
                "VERDICT", 9, "UNCONFIRMED", reason="no-coordinator-state", withheld="coordinator-view-behind"
            ),
        ]
    )
    assert series(state) == [
        (
            {
                "cluster": "prod",
                "topic": "orders",
                "partition": "3",
                "reason": "coordinator-completed",
                "candidate_id": "c7",
            },
            1_700_000_000.0,
        )
    ]


def test_the_series_goes_with_the_transaction() -> None:
    state = LiveState()
    state.apply_events([event("VERDICT", 7, "HANGING", reason="no-coordinator-state", candidate_id="c7")])
    assert len(series(state)) == 1
    state.apply_events([event("GONE", 7)])
    assert series(state) == []
