"""KIP-939 two-phase commit as Kafka really marks it: a transaction timeout of Integer.MAX_VALUE (2147483647).

`TransactionCoordinator.handleInitProducerId` stores that timeout for a 2PC producer and
`TransactionMetadata.isDistributedTwoPhaseCommitTxn()` is `txnTimeoutMs == Integer.MAX_VALUE`; -1 (KIP-939's
text) is never written. A 2PC transaction is labelled on its verdict, event, candidate and metrics, is never
COORDINATOR_OVERDUE (the coordinator never times it out), and `proposals abort` refuses it by name.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from builders import LEADER_EPOCH, LIMITS, MINUTE, PID, T0, coord, open_txn, snapshot, tps
from collector_fakes import FakeCoordinators, description
from hypothesis import given
from hypothesis import strategies as st
from test_tracking import batch, fact_row, new_bucket, open_row, seen_at
from test_verified_abort import run, scripted

from admin.proposals.verified_marker import ActWith, Surroundings, candidate_row, render_show
from admin.wire.types import GroupOffsets
from detectors.abort import candidate_is_two_phase_commit, plan_abort, verify_abort
from detectors.models import (
    TWO_PHASE_COMMIT_TIMEOUT_MS,
    AbortCandidate,
    AuditOutcome,
    CoordinatorRecord,
    CoordinatorState,
    LeaderProducer,
    LiveCoordinator,
    LiveEvidence,
    Verdict,
    VerdictKind,
    VerifyOutcome,
    has_deadline,
    is_two_phase_commit,
)
from detectors.rules import (
    CoordFacts,
    TxnFacts,
    classify,
    coord_facts,
    decide,
    decide_by_rules,
    two_phase_commit,
    txn_facts,
)
from streaming.exporter import LiveState, VerdictCollector, WindowState

pytestmark = pytest.mark.unit

TWO_PC = TWO_PHASE_COMMIT_TIMEOUT_MS
DAY = 24 * 60 * MINUTE
# 2147483647 ms is 24.86 days: a prepared 2PC transaction older than that is where the old -1 reading went wrong.
OLD = 30 * DAY
K = VerdictKind


def judged(view: CoordinatorRecord | None, *, age_ms: int, **txn: Any) -> Verdict:
    t = open_txn(**txn)
    at = T0 + age_ms
    return classify(t, snapshot(t, observed_at_ms=at), view, now_ms=at, limits=LIMITS, view_current_ms=at)


def test_the_predicates_key_on_integer_max_value_only() -> None:
    assert TWO_PC == 2**31 - 1
    assert is_two_phase_commit(TWO_PC)
    for other in (-1, 0, 1, 60_000, 900_000, TWO_PC - 1):
        assert not is_two_phase_commit(other), other
    # A deadline only for a timeout the coordinator enforces: not 2PC, and not the values Kafka never writes.
    assert [t for t in (-1, 0, 1, 60_000, TWO_PC - 1, TWO_PC) if has_deadline(t)] == [1, 60_000, TWO_PC - 1]


def test_a_prepared_two_phase_commit_transaction_past_24_9_days_is_late_never_overdue() -> None:
    # As Kafka shows a prepared 2PC transaction: Ongoing, the partition listed, timeout Integer.MAX_VALUE.
    prepared = coord(transactional_id="tx-2pc", transaction_timeout_ms=TWO_PC, start_timestamp_ms=T0 - 100)
    v = judged(prepared, age_ms=OLD)
    assert v.kind is K.LATE, v.explanation
    assert v.two_phase_commit
    assert "two-phase commit: no timeout" in v.explanation
    assert "forceTerminateTransaction" in v.explanation
    assert v.evidence.overdue_threshold_ms is None  # no deadline to show


def test_the_same_transaction_with_a_real_timeout_is_overdue() -> None:
    # The control: the rule is live on this scene, only the 2PC timeout keeps it off.
    v = judged(coord(transaction_timeout_ms=900_000), age_ms=OLD)
    assert (v.kind, v.two_phase_commit) == (K.COORDINATOR_OVERDUE, False)
    assert "two-phase" not in v.explanation


@pytest.mark.parametrize("timeout", [-1, 0])
def test_a_timeout_kafka_never_writes_is_harmless(timeout: int) -> None:
    """-1 (KIP-939's text) and 0: an unknown timeout, not 2PC; no deadline is claimed, nothing raises."""
    v = judged(coord(transaction_timeout_ms=timeout), age_ms=OLD)
    assert (v.kind, v.two_phase_commit) == (K.LATE, False)
    assert "two-phase" not in v.explanation
    assert v.evidence.overdue_threshold_ms is None


def test_young_two_phase_commit_is_open_and_labelled() -> None:
    v = judged(coord(transaction_timeout_ms=TWO_PC), age_ms=MINUTE)
    assert (v.kind, v.two_phase_commit) == (K.OPEN, True)


def test_stuck_prepare_of_a_two_phase_commit_transaction_keeps_its_label() -> None:
    committing = coord(
        transaction_timeout_ms=TWO_PC, state=CoordinatorState.PREPARE_COMMIT, last_update_timestamp_ms=T0
    )
    v = judged(committing, age_ms=MINUTE)
    assert (v.kind, v.two_phase_commit) == (K.STUCK_PREPARE, True)


def test_a_tombstone_or_another_producers_record_is_not_two_phase_commit() -> None:
    t = txn_facts(open_txn(), snapshot())
    assert two_phase_commit(t, coord_facts(coord(transaction_timeout_ms=TWO_PC)))
    assert not two_phase_commit(t, None)
    assert not two_phase_commit(t, coord_facts(coord(transaction_timeout_ms=TWO_PC, producer_id=PID + 1)))
    assert not two_phase_commit(
        t, coord_facts(coord(transaction_timeout_ms=TWO_PC, state=CoordinatorState.DEAD))
    )
    tomb = CoordinatorRecord.tombstone_of("tx-1")
    assert not tomb.two_phase_commit and not two_phase_commit(t, coord_facts(tomb))


# ------------------------------------------------------------------- both engines agree, on ages of days

INSTANTS = st.integers(-40 * DAY, 40 * DAY)
TIMEOUTS = st.sampled_from([-1, 0, 1, 60_000, 900_000, TWO_PC - 1, TWO_PC])


def facts(since: int, start: int, now: int, timeout: int, state: CoordinatorState, listed: bool) -> tuple:
    t = TxnFacts("orders", 0, PID, 5, T0 + since, T0 + now, 900_000, None)
    partitions = frozenset({("orders", 0)} if listed else ())
    return t, CoordFacts(PID, 5, -1, -1, 2, timeout, state, partitions, T0 + start, T0 + start)


@given(
    since=INSTANTS,
    start=INSTANTS,
    now=INSTANTS,
    timeout=TIMEOUTS,
    state=st.sampled_from(list(CoordinatorState)),
    listed=st.booleans(),
)
def test_decide_equals_the_rules_on_ages_of_days(
    since: int, start: int, now: int, timeout: int, state: CoordinatorState, listed: bool
) -> None:
    t, c = facts(since, start, now, timeout, state, listed)
    assert decide(t, c, T0 + now, LIMITS) == decide_by_rules(t, c, T0 + now, LIMITS)


@given(since=INSTANTS, start=INSTANTS, age=st.integers(0, 80 * DAY), timeout=st.sampled_from([TWO_PC, -1, 0]))
def test_no_age_makes_a_transaction_without_a_deadline_overdue(
    since: int, start: int, age: int, timeout: int
) -> None:
    """Ongoing with the partition listed (where COORDINATOR_OVERDUE lives), for up to 80 days: with the 2PC
    timeout or one Kafka never writes, both engines say anything but COORDINATOR_OVERDUE."""
    t, c = facts(since, start, start + age, timeout, CoordinatorState.ONGOING, True)
    for d in (decide(t, c, T0 + start + age, LIMITS), decide_by_rules(t, c, T0 + start + age, LIMITS)):
        assert d.kind is not K.COORDINATOR_OVERDUE


# ------------------------------------------------------------------------------ the stream's event row


def test_stage_two_labels_the_verdict_event() -> None:
    prepared = coord(transaction_timeout_ms=TWO_PC, last_update_timestamp_ms=T0 - 1)
    b = new_bucket()
    first = batch(b, T0 + MINUTE, fact_row(prepared), open_row(seen_at(T0 + MINUTE)))
    later = batch(b, T0 + OLD, open_row(seen_at(T0 + OLD)))
    assert [(e["kind"], e["two_phase_commit"]) for e in first + later] == [("OPEN", True), ("LATE", True)]
    assert "two-phase commit: no timeout" in later[0]["explanation"]


# -------------------------------------------------------------------------------- abort: refused by name


def hanging_two_pc_candidate() -> AbortCandidate:
    # A leftover on orders-1, which the 2PC transaction (Ongoing on orders-0) does not list: HANGING.
    view = coord(transactional_id="tx-2pc", transaction_timeout_ms=TWO_PC, partitions=tps("orders-0"))
    t = open_txn(start_batch_leader_epoch=LEADER_EPOCH)
    snap = snapshot(t, partition=1, observed_at_ms=T0 + MINUTE, leader_epoch=LEADER_EPOCH)
    v = classify(t, snap, view, now_ms=T0 + MINUTE, limits=LIMITS, view_current_ms=T0 + MINUTE)
    assert (v.kind, v.two_phase_commit) == (K.HANGING, True)
    return plan_abort(snap, t, v, first_detected_ms=T0 + MINUTE)


def live(coordinator: LiveCoordinator | None) -> LiveEvidence:
    return LiveEvidence(
        observed_at_ms=T0 + 2 * MINUTE,
        leader=1,
        producer=LeaderProducer(
            producer_id=PID, producer_epoch=5, coordinator_epoch=3, current_txn_start_offset=100
        ),
        coordinator=coordinator,
        leader_epoch=LEADER_EPOCH,
    )


def test_a_two_phase_commit_candidate_is_refused_by_name() -> None:
    c = hanging_two_pc_candidate()
    assert c.two_phase_commit and candidate_is_two_phase_commit(c)
    result = verify_abort(c, live(None))
    assert result.outcome is VerifyOutcome.REFUSED
    (why,) = result.changes
    assert why.startswith("two-phase-commit: transactional id tx-2pc")
    assert "Admin.forceTerminateTransaction" in why and "transaction manager" in why


def test_a_candidate_whose_owner_is_two_phase_commit_now_is_refused() -> None:
    plain = hanging_two_pc_candidate().model_copy(update={"two_phase_commit": False})
    plain = plain.model_copy(update={"evidence": plain.evidence.model_copy(update={"coordinator": None})})
    owner = LiveCoordinator(
        transactional_id="tx-2pc",
        state="Ongoing",
        producer_id=PID,
        producer_epoch=5,
        partition_listed=False,
        transaction_timeout_ms=TWO_PC,
    )
    result = verify_abort(plain, live(owner))
    assert result.outcome is VerifyOutcome.REFUSED
    assert result.changes[0].startswith("two-phase-commit:")
    # The same owner with a normal timeout is no 2PC objection: the abort is safe (at a later epoch than the
    # orphan's: an owner live at the orphan's epoch is refused for that, `live-owner-same-epoch`).
    normal = owner.model_copy(update={"transaction_timeout_ms": 60_000, "producer_epoch": 6})
    assert verify_abort(plain, live(normal)).outcome is VerifyOutcome.SAFE


def test_a_candidate_written_before_the_flag_is_still_recognised() -> None:
    data = hanging_two_pc_candidate().model_dump(mode="json")
    del data["two_phase_commit"]
    old = AbortCandidate.model_validate(data)
    assert not old.two_phase_commit and candidate_is_two_phase_commit(old)


# -------------------------------------------------------------------------------------------- metrics


def event(producer_id: int, partition: int, start_offset: int, kind: str, two_pc: bool) -> SimpleNamespace:
    return SimpleNamespace(
        event="VERDICT",
        producer_id=producer_id,
        topic="orders",
        partition=partition,
        start_offset=start_offset,
        kind=kind,
        reason=None,
        lso_lag=1,
        age_ms=OLD,
        candidate_id=None,
        withheld=None,
        event_time_ms=T0 + OLD,
        payload=None,
        two_phase_commit=two_pc,
        transactional_id=None,
    )


def samples(state: LiveState, name: str) -> dict[tuple[str, ...], float]:
    (family,) = [f for f in VerdictCollector(state, "prod").collect() if f.name == name]
    return {tuple(sorted(s.labels.items())): s.value for s in family.samples}


def test_the_late_count_splits_by_the_oldest_transactions_two_phase_commit() -> None:
    state = LiveState()
    state.apply_events(
        [
            event(1, 0, 10, "LATE", True),  # orders-0: the oldest is 2PC (a younger plain one behind it)
            event(2, 0, 20, "OPEN", False),
            event(3, 1, 30, "COORDINATOR_OVERDUE", False),  # orders-1: plain
            event(4, 2, 5, "OPEN", False),  # orders-2: the oldest is plain, a 2PC one behind it
            event(5, 2, 40, "LATE", True),
        ]
    )
    late = WindowState(
        leader=1, window_end_ms=T0, observed_at_ms=T0, duration_ms=OLD, late=True, open_count=2
    )
    state.windows = {("orders", p): late for p in (0, 1, 2)}
    state.windows[("orders", 3)] = late  # no verdict yet: counted as not 2PC, the alert stays on
    split = samples(state, "txnwatch_late_partitions")
    labels = (("broker", "1"), ("cluster", "prod"))
    assert split == {(*labels, ("two_phase_commit", "false")): 3, (*labels, ("two_phase_commit", "true")): 1}
    # KIP-664's own count is unchanged.
    assert list(samples(state, "txnwatch_partitions_with_late_transactions").values()) == [4]
    kinds = samples(state, "txnwatch_open_transactions")
    assert kinds[(("cluster", "prod"), ("kind", "LATE"), ("two_phase_commit", "true"))] == 2
    assert kinds[(("cluster", "prod"), ("kind", "OPEN"), ("two_phase_commit", "false"))] == 2


# ------------------------------------------------------------------------ proposals abort / show, end to end


def test_proposals_abort_refuses_a_two_phase_commit_owner_with_exit_3_and_writes_nothing() -> None:
    # The owner would otherwise allow the abort (CompleteCommit, another partition): only its 2PC timeout refuses.
    wire = scripted(
        coordinators=FakeCoordinators(
            {
                "tx-1": description(
                    state="CompleteCommit", producer_epoch=6, partitions=(("orders", 1),), timeout_ms=TWO_PC
                )
            }
        )
    )
    record = run(wire)  # asserts the exit code matches the outcome: REFUSED is 3
    assert record.outcome is AuditOutcome.REFUSED and wire.markers == []
    assert "two-phase-commit: transactional id tx-1" in record.message
    assert "forceTerminateTransaction" in record.message


def test_proposals_show_labels_a_two_phase_commit_candidate_and_offers_no_marker() -> None:
    c = hanging_two_pc_candidate()
    owner = LiveCoordinator(
        transactional_id="tx-2pc",
        state="Ongoing",
        producer_id=PID,
        producer_epoch=5,
        partition_listed=False,
        transaction_timeout_ms=TWO_PC,
    )
    now = live(owner)
    act = ActWith("b:9092", "prod", "txnwatch")
    shown = render_show(c, now, verify_abort(c, now), act, T0 + 2 * MINUTE, Surroundings(GroupOffsets({})))
    assert "HANGING partition-not-in-transaction [two-phase commit]" in shown
    assert "not listed, two-phase commit (no timeout)" in shown
    assert "forceTerminateTransaction --transactionalId tx-2pc" in shown
    assert act.txnwatch(c) not in shown and "abort --topic" not in shown
    assert candidate_row(c, T0)["two_phase_commit"] is True
