"""The series the hanging alert is built on (`txnwatch_hanging_transaction_open_since_timestamp_seconds`): one
per open candidate (proven HANGING, not withdrawn, not resolved), gone with it, valued at when the transaction
opened as proven, and kept while its verdict only waits (a Kafka outage). Fast and without Spark; the
live test (tests/e2e/test_alerts_live.py) sees it from the real job."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from streaming.exporter import Health, LiveState, VerdictCollector

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
        "transactional_id": None,
    }
    return SimpleNamespace(**{**row, **over})


def series(state: LiveState, name: str = NAME) -> list[tuple[dict[str, str], float]]:
    (family,) = [f for f in VerdictCollector(state, "prod").collect() if f.name == name]
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
                transactional_id="orders-tx-1",
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
                "transactional_id": "orders-tx-1",
                "producer_id": "7",
                "reason": "coordinator-completed",
                "candidate_id": "c7",
            },
            1_700_000_000.0,
        )
    ]


def test_the_series_names_the_transactional_id_and_producer_id_it_was_proven_on() -> None:
    """The page names whose transaction hangs: the producer id, and the transactional id of the coordinator
    record the proof was judged against (empty without one), both kept while the candidate is open."""
    state = LiveState()
    state.apply_events(
        [
            event(
                "VERDICT",
                7,
                "HANGING",
                reason="coordinator-completed",
                candidate_id="c7",
                transactional_id="orders-tx-1",
            ),
            # no coordinator record names its owner: the label is empty (Prometheus then has none)
            event("VERDICT", 8, "HANGING", reason="no-coordinator-state", candidate_id="c8", partition=4),
        ]
    )
    named = [(labels["transactional_id"], labels["producer_id"]) for labels, _ in series(state)]
    assert named == [("orders-tx-1", "7"), ("", "8")]
    # The record expires while the candidate is open (HANGING again on another reason, no record now): the same
    # candidate, the same page, named as proven.
    state.apply_events(
        [
            event(
                "VERDICT",
                7,
                "HANGING",
                reason="no-coordinator-state",
                candidate_id="c7",
                transactional_id=None,
            )
        ]
    )
    assert [(labels["transactional_id"], labels["producer_id"]) for labels, _ in series(state)] == named


def test_the_series_goes_with_the_transaction() -> None:
    state = LiveState()
    state.apply_events([event("VERDICT", 7, "HANGING", reason="no-coordinator-state", candidate_id="c7")])
    assert len(series(state)) == 1
    state.apply_events([event("GONE", 7)])
    assert series(state) == []


def test_the_series_stays_while_the_candidate_waits_and_goes_when_it_is_withdrawn() -> None:
    # After a Kafka outage the job can judge the orphan younger than proven: the verdict turns OPEN, only
    # waiting, and its candidate stays open (detectors.tracking.withdraws_proof). The page stays, as proven.
    state = LiveState()
    proven = {"candidate_id": "c7", "age_ms": 100_000}
    state.apply_events([event("VERDICT", 7, "HANGING", reason="coordinator-completed", **proven)])
    before = series(state)
    assert [value for _, value in before] == [1_700_000_000.0]
    state.apply_events(
        [event("VERDICT", 7, "OPEN", candidate_id="c7", age_ms=36_000, event_time_ms=1_700_000_200_000)]
    )
    assert series(state) == before
    # HANGING again, on another reason (its transactional id expired meanwhile): the same candidate, the same
    # page, named by the reason its candidate was opened on.
    state.apply_events(
        [event("VERDICT", 7, "HANGING", reason="no-coordinator-state", candidate_id="c7", age_ms=100_000)]
    )
    assert series(state) == before
    # Withdrawn (the job took the proof back): no candidate id any more, and no page.
    state.apply_events([event("VERDICT", 7, "OPEN", age_ms=40_000, event_time_ms=1_700_000_204_000)])
    assert series(state) == []
    # A candidate this state never saw proven (a driver started while its verdict waits): no proven reason to
    # name, and the reason picks abort or commit in the page, so no series until HANGING again.
    state.apply_events([event("VERDICT", 7, "OPEN", candidate_id="c8", age_ms=50_000)])
    assert series(state) == []


def test_transactions_sharing_a_partitions_labels_give_one_series_the_oldest() -> None:
    # Two producers withheld on one partition, neither with a coordinator record (no transactional id): one label
    # set, which an exposition may carry once; it says since when the partition has had one.
    state = LiveState()
    withheld = {"reason": "no-coordinator-state", "withheld": "coordinator-view-behind"}
    state.apply_events(
        [
            event("VERDICT", 7, "UNCONFIRMED", age_ms=100_000, **withheld),
            event("VERDICT", 8, "UNCONFIRMED", age_ms=300_000, **withheld),
            event("VERDICT", 9, "UNCONFIRMED", age_ms=50_000, transactional_id="tx-9", **withheld),
        ]
    )
    name = "txnwatch_withheld_verdict_open_since_timestamp_seconds"
    assert [(labels["transactional_id"], value) for labels, value in series(state, name)] == [
        ("", 1_699_999_800.0),
        ("tx-9", 1_700_000_050.0),
    ]
    # The oldest judged again, not withheld any more (its view is current and it is plainly open): the
    # partition's series now says when the other one opened.
    state.apply_events([event("VERDICT", 8, "OPEN", age_ms=310_000, event_time_ms=1_700_000_110_000)])
    assert [(labels["transactional_id"], value) for labels, value in series(state, name)] == [
        ("", 1_700_000_000.0),
        ("tx-9", 1_700_000_050.0),
    ]


def test_each_dead_letter_source_is_counted_from_zero_so_its_first_dead_letter_is_an_increase() -> None:
    # DeadLettersGrowing is `increase()` of this counter: a series that first shows at 1 is no increase, and a
    # driver's first dead letter (often its only one) would never alert.
    registry = CollectorRegistry()
    health = Health(registry)
    health.count_dead_letters_from_zero(["producer-state", "transaction-log"])
    body = generate_latest(registry).decode()
    assert 'txnwatch_dead_letter_records_total{source="producer-state"} 0.0' in body
    assert 'txnwatch_dead_letter_records_total{source="transaction-log"} 0.0' in body
    health.dead_letters.labels("transaction-log").inc()
    assert (
        'txnwatch_dead_letter_records_total{source="transaction-log"} 1.0'
        in generate_latest(registry).decode()
    )
