"""The coordinator view's currency (detectors/currency.py) and the rules that take it as an input (`judge`).

A HANGING verdict is a proof only on a view shown current as of a moment the transaction was open; these tests
hold that, including a generated-history property: with any lag between the view and the leader reports, a
transaction the coordinator owns is never called HANGING.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple
from unittest.mock import patch

import pytest
from builders import LIMITS, MINUTE, PID, SECOND, T0, coord, open_txn, snapshot
from hypothesis import given, settings
from hypothesis import strategies as st

from detectors.currency import (
    LEGACY_LOG_END_POSITIONS,
    LOG_END_HORIZON_MS,
    MAX_LOG_END_POSITIONS,
    MAX_PENDING_POSITIONS,
    ViewCurrency,
    coordinator_partition,
)
from detectors.models import CoordinatorState, DetectionLimits, HangingReason, VerdictKind, WithheldReason
from detectors.rules import CoordFacts, TxnFacts, classify, coord_facts, decide, judge, judge_view

pytestmark = pytest.mark.unit

RESOURCES = Path(__file__).parent / "resources"
LOG = "__transaction_state"
K = VerdictKind
R = HangingReason

# ------------------------------------------------------------------------------ Kafka's partitioning


def test_min_value_hash_maps_to_partition_zero() -> None:
    assert coordinator_partition("polygenelubricants", 50) == 0


@pytest.mark.parametrize("capture", ["txnlog_tv0.json", "txnlog_tv2.json"])
def test_coordinator_partition_matches_a_real_broker(capture: str) -> None:
    """Records captured from a real broker (3 __transaction_state partitions) sit where the hash says."""
    data = json.loads((RESOURCES / capture).read_text())
    seen = 0
    for r in data["records"]:
        tid = r["kafka_formatter"]["key"]["data"]["transactionalId"]
        assert coordinator_partition(tid, 3) == r["partition"], tid
        seen += 1
    assert seen > 10


# ------------------------------------------------------------------------------ the bookkeeping


def test_current_once_the_position_is_covered_in_either_order() -> None:
    v = ViewCurrency(LOG)
    assert v.current_as_of(None) is None  # nothing measured: never current
    v.add_position(LOG, 2, 1_000, {0: 10, 1: 0})
    assert v.current_as_of(None) is None  # partition 0 not read yet; partition 1 is empty, so covered
    assert v.current.get((LOG, 1)) == 1_000
    v.applied(LOG, 0, 9)
    assert v.current_as_of(None) is None
    v.applied(LOG, 0, 10)
    assert v.current_as_of(None) == 1_000
    # records read before the position arrives count too
    v.applied(LOG, 0, 15)
    v.applied(LOG, 1, 3)
    v.add_position(LOG, 2, 2_000, {0: 15, 1: 3})
    assert v.current_as_of(None) == 2_000
    assert v.lag() == (True, True, 0, 0, 2_000, 0, 0)


def test_a_transactional_id_needs_only_its_partition() -> None:
    v = ViewCurrency(LOG)
    tid = "tx-1"
    mine = coordinator_partition(tid, 3)
    other = (mine + 1) % 3
    v.add_position(LOG, 3, 5_000, {0: 4, 1: 4, 2: 4})
    v.applied(LOG, mine, 4)
    assert v.current_as_of(tid) == 5_000
    assert v.current_as_of(None) is None  # an unknown producer id could belong to any partition
    v.applied(LOG, other, 4)
    assert v.current_as_of(None) is None
    lag = v.lag()
    assert (lag.measured, lag.current, lag.records_behind) == (True, False, 4)


def test_other_topics_need_every_partition_and_every_topic_must_be_current() -> None:
    v = ViewCurrency(LOG, ["txnwatch.coordinator-state"])
    v.add_position(LOG, 1, 1_000, {0: 1})
    v.applied(LOG, 0, 1)
    assert v.current_as_of("tx-1") is None  # the describe topic has no position yet
    v.add_position("txnwatch.coordinator-state", 2, 900, {0: 2, 1: 1})
    v.applied("txnwatch.coordinator-state", 0, 2)
    assert v.current_as_of("tx-1") is None
    v.applied("txnwatch.coordinator-state", 1, 1)
    assert v.current_as_of("tx-1") == 900  # the older of the two


def test_positions_of_other_topics_are_ignored() -> None:
    v = ViewCurrency(LOG)
    assert not v.add_position("relay", 1, 1_000, {0: 0})
    assert v.lag().measured is False


def test_a_partition_missing_from_a_position_keeps_its_earlier_currency() -> None:
    v = ViewCurrency(LOG)
    v.add_position(LOG, 2, 1_000, {0: 1, 1: 1})
    v.applied(LOG, 0, 1)
    v.applied(LOG, 1, 1)
    v.add_position(LOG, 2, 2_000, {0: 2})  # partition 1's leader did not answer
    v.applied(LOG, 0, 2)
    assert v.current[(LOG, 0)] == 2_000
    assert v.current_as_of(None) == 1_000


def test_lag_while_behind() -> None:
    v = ViewCurrency(LOG)
    v.add_position(LOG, 1, 1_000, {0: 100})
    v.add_position(LOG, 1, 6_000, {0: 400})
    lag = v.lag()
    assert (lag.current, lag.lag_ms, lag.records_behind, lag.current_as_of_ms) == (False, 5_000, 400, None)
    v.applied(LOG, 0, 100)
    lag = v.lag()
    assert (lag.current, lag.lag_ms, lag.records_behind, lag.current_as_of_ms) == (False, 5_000, 300, 1_000)
    v.applied(LOG, 0, 400)
    assert v.lag() == (True, True, 0, 0, 6_000, 0, 0)
    assert v.pending == []


def test_state_round_trips() -> None:
    v = ViewCurrency(LOG)
    v.add_position(LOG, 2, 1_000, {0: 5, 1: 5})
    v.applied(LOG, 0, 5)
    restored = ViewCurrency(LOG, state=v.state())
    restored.applied(LOG, 1, 5)
    assert restored.current_as_of(None) == 1_000


def test_pending_positions_are_bounded_and_thinning_stays_safe() -> None:
    v = ViewCurrency(LOG)
    for i in range(3 * MAX_PENDING_POSITIONS):
        v.add_position(LOG, 1, i * 5_000, {0: i + 1})
    assert len(v.pending) <= MAX_PENDING_POSITIONS
    v.applied(LOG, 0, 2 * MAX_PENDING_POSITIONS)
    at = v.current_as_of(None)
    # currency is claimed only at a position whose offsets are really covered
    assert at is not None and at <= (2 * MAX_PENDING_POSITIONS - 1) * 5_000


# ------------------------------------------------------------------------------ judge


def facts(observed: int, *, first_seen: int | None = None, since: int = T0) -> TxnFacts:
    return TxnFacts("orders", 3, PID, 5, since, observed, 900_000, first_seen)


COMPLETED = coord_facts(
    coord(
        state=CoordinatorState.COMPLETE_COMMIT,
        partitions=(),
        start_timestamp_ms=T0 - 2 * MINUTE,
        last_update_timestamp_ms=T0 - MINUTE,
    )
)


def test_judge_issues_hanging_only_on_a_current_view() -> None:
    t = facts(T0 + MINUTE, first_seen=T0 + 5 * SECOND)
    assert decide(t, COMPLETED, t.observed_at_ms, LIMITS).kind is K.HANGING
    assert judge(t, COMPLETED, t.observed_at_ms, LIMITS, view_current_ms=t.observed_at_ms).kind is K.HANGING
    withheld = judge(t, COMPLETED, t.observed_at_ms, LIMITS, view_current_ms=None)
    assert (withheld.kind, withheld.reason, withheld.withheld) == (
        K.UNCONFIRMED,
        R.COORDINATOR_COMPLETED,
        WithheldReason.COORDINATOR_VIEW_BEHIND,
    )
    # current only before the transaction was first seen: nothing proves it was open then
    early = judge(t, COMPLETED, t.observed_at_ms, LIMITS, view_current_ms=T0 + SECOND)
    assert early.kind is K.UNCONFIRMED


def test_judge_proves_as_of_an_earlier_report_when_the_view_lags_the_newest() -> None:
    t = facts(T0 + 2 * MINUTE, first_seen=T0 + 5 * SECOND)
    d = judge(t, COMPLETED, t.observed_at_ms, LIMITS, view_current_ms=T0 + MINUTE)
    assert (d.kind, d.reason, d.judged_as_of_ms) == (K.HANGING, R.COORDINATOR_COMPLETED, T0 + MINUTE)
    # but not when the rules do not hold as of that earlier moment (not yet past the grace then)
    t = facts(T0 + 2 * MINUTE, first_seen=T0 + SECOND, since=T0 - 2 * SECOND)
    d = judge(t, None, t.observed_at_ms, LIMITS, view_current_ms=T0 + 3 * SECOND)
    assert (d.kind, d.reason) == (K.UNCONFIRMED, R.NO_COORDINATOR_STATE)


def test_alerts_on_the_view_wait_for_it_too() -> None:
    """A Prepare record listing the partition, a minute old: STUCK_PREPARE on a current view; on a stale one it
    may be an earlier transaction's record (the open one is newer), so LATE/OPEN until current."""
    prepare = coord_facts(coord(state=CoordinatorState.PREPARE_COMMIT, last_update_timestamp_ms=T0))
    t = TxnFacts("orders", 0, PID, 5, T0 + 2 * SECOND, T0 + MINUTE, 900_000, T0 + 3 * SECOND)
    assert judge(t, prepare, T0 + MINUTE, LIMITS, view_current_ms=T0 + MINUTE).kind is K.STUCK_PREPARE
    assert judge(t, prepare, T0 + MINUTE, LIMITS, view_current_ms=None).kind is K.OPEN
    assert judge(t, prepare, T0 + MINUTE, LIMITS, view_current_ms=T0 + 20 * SECOND).kind is K.STUCK_PREPARE
    overdue = coord_facts(coord(start_timestamp_ms=T0 - 5 * MINUTE, transaction_timeout_ms=60_000))
    assert judge(t, overdue, T0 + MINUTE, LIMITS, view_current_ms=T0 + MINUTE).kind is K.COORDINATOR_OVERDUE
    assert judge(t, overdue, T0 + MINUTE, LIMITS, view_current_ms=T0 + SECOND).kind is K.OPEN
    late_t = t._replace(open_since_ms=T0 - 20 * MINUTE)
    assert judge(late_t, overdue, T0 + MINUTE, LIMITS, view_current_ms=None).kind is K.LATE


def test_classify_explains_a_withheld_verdict() -> None:
    txn = open_txn(start_timestamp_ms=T0, producer_id=PID)
    snap = snapshot(txn, observed_at_ms=T0 + MINUTE)
    view = coord(state=CoordinatorState.COMPLETE_COMMIT, partitions=(), last_update_timestamp_ms=T0 - MINUTE)
    v = classify(txn, snap, view, now_ms=T0 + MINUTE, limits=LIMITS, view_current_ms=T0 + 20 * SECOND)
    assert (v.kind, v.reason, v.withheld) == (
        K.UNCONFIRMED,
        R.COORDINATOR_COMPLETED,
        WithheldReason.COORDINATOR_VIEW_BEHIND,
    )
    assert v.explanation.startswith(
        "UNCONFIRMED (would be HANGING coordinator-completed; coordinator-view-behind)"
    )
    assert "current only as of" in v.explanation and "40s before the report" in v.explanation
    assert v.evidence.view_current_as_of_ms == T0 + 20 * SECOND
    unmeasured = classify(txn, snap, view, now_ms=T0 + MINUTE, limits=LIMITS, view_current_ms=None)
    assert "not shown current" in unmeasured.explanation
    proven = classify(txn, snap, view, now_ms=T0 + MINUTE, limits=LIMITS, view_current_ms=T0 + MINUTE)
    assert proven.kind is K.HANGING and proven.evidence.judged_as_of_ms == T0 + MINUTE


def test_a_view_naming_another_producer_id_is_never_proof() -> None:
    t = facts(T0 + MINUTE, first_seen=T0 + SECOND)
    other = coord_facts(coord(producer_id=PID + 1, previous_producer_id=-1, next_producer_id=-1))
    with pytest.raises(ValueError, match="is not about producer"):
        decide(t, other, t.observed_at_ms, LIMITS)
    d = judge_view(t, other, t.observed_at_ms, LIMITS, view_current_ms=t.observed_at_ms)
    assert (d.kind, d.withheld) == (K.UNCONFIRMED, WithheldReason.COORDINATOR_VIEW_INCONSISTENT)


# ------------------------------------------------------------------------------ generated histories


class Txn(NamedTuple):
    epoch: int
    adds: tuple[tuple[int, frozenset[tuple[str, int]]], ...]  # (time, partitions listed from then on)
    end: int  # PrepareCommit/PrepareAbort record time
    complete: int  # CompleteCommit/CompleteAbort record time
    commit: bool


PARTS = [("orders", p) for p in range(4)]


@st.composite
def histories(draw: st.DrawFn) -> tuple[list[Txn], int]:
    """A transactional id's successive transactions; (transactions, client transaction version)."""
    tv = draw(st.sampled_from([0, 2]))
    t = T0 + draw(st.integers(0, 5_000))
    txns = []
    epoch = draw(st.integers(0, 10))
    for _ in range(draw(st.integers(1, 5))):
        t += draw(st.integers(1, 20_000))
        adds = []
        listed: frozenset[tuple[str, int]] = frozenset()
        for _ in range(draw(st.integers(1, 3))):
            listed = listed | {draw(st.sampled_from(PARTS))}
            adds.append((t, listed))
            t += draw(st.integers(1, 30_000))
        end = t
        complete = end + draw(st.integers(1, 3_000))
        txns.append(Txn(epoch, tuple(adds), end, complete, draw(st.booleans())))
        t = complete
        if tv >= 2:
            epoch += 1
    return txns, tv


def view_at(txns: list[Txn], tv: int, at: int) -> CoordFacts | None:
    """The coordinator's record for the producer id as of `at` (the newest record written at or before it)."""
    view = None
    for txn in txns:
        start = txn.adds[0][0]
        for when, listed in txn.adds:
            if when <= at:
                view = CoordFacts(
                    PID, txn.epoch, -1, -1, tv, 60_000, CoordinatorState.ONGOING, listed, when, start
                )
        if txn.end <= at:
            state = CoordinatorState.PREPARE_COMMIT if txn.commit else CoordinatorState.PREPARE_ABORT
            view = CoordFacts(PID, txn.epoch, -1, -1, tv, 60_000, state, txn.adds[-1][1], txn.end, start)
        if txn.complete <= at:
            state = CoordinatorState.COMPLETE_COMMIT if txn.commit else CoordinatorState.COMPLETE_ABORT
            epoch = txn.epoch + 1 if tv >= 2 else txn.epoch
            view = CoordFacts(PID, epoch, -1, -1, tv, 60_000, state, frozenset(), txn.complete, start)
    return view


def log_end_at(txns: list[Txn], at: int) -> int:
    """The end offset of the producer's transaction log partition at `at`: one record per write (each add, each
    Prepare, each Complete), in the order written; the record written at `w` is at offset (writes before it)."""
    return sum(1 for x in txns for w in (*(a for a, _ in x.adds), x.end, x.complete) if w <= at)


# The rules' own test thresholds and the thresholds txnwatch ships with (detectors.models.DetectionLimits).
BOTH_LIMITS = pytest.mark.parametrize(
    "limits", [LIMITS, DetectionLimits()], ids=["grace-10s-skew-5s", "shipped-defaults"]
)


@BOTH_LIMITS
@settings(max_examples=400, deadline=None)
@given(
    history=histories(),
    pick=st.data(),
)
def test_a_transaction_the_coordinator_owns_is_never_hanging_whatever_the_lag(
    limits: DetectionLimits, history: tuple[list[Txn], int], pick: st.DataObject
) -> None:
    """The leader reports a partition of a real transaction open (after its first batch, before its marker);
    the job's view lags the report by any amount, and its currency is measured truthfully (or not at all).
    Whatever the lag, no HANGING verdict."""
    txns, tv = history
    txn = pick.draw(st.sampled_from(txns))
    add_time, listed = pick.draw(st.sampled_from(txn.adds))
    topic, partition = pick.draw(st.sampled_from(sorted(listed)))
    first_batch = add_time + pick.draw(
        st.integers(1, 2_000)
    )  # the leader appends after the coordinator adds it
    marker = txn.end + pick.draw(st.integers(1, 2_000))  # and closes it after Prepare*
    if first_batch >= marker:
        return
    observed = pick.draw(st.integers(first_batch, marker - 1))
    first_seen = pick.draw(st.integers(first_batch, observed))
    # The view stops just before some record the coordinator wrote (the interesting places), or anywhere.
    record_times = sorted(
        {w for x in txns for w, _ in x.adds} | {x.end for x in txns} | {x.complete for x in txns}
    )
    stops = [w - 1 for w in record_times if w <= observed] + [observed]
    # or past the report: records written after it (its own marker's Complete) are in a view read later
    later = [w for w in record_times if w > observed][:2]
    view_time = pick.draw(
        st.one_of(st.sampled_from(stops + later), st.integers(observed - 120_000, observed + 5_000))
    )
    c = view_at(txns, tv, view_time)
    measured = pick.draw(st.sampled_from(["exact", "conservative", "unknown"]))
    current = {"exact": view_time, "conservative": view_time - 1_000, "unknown": None}[measured]
    t = TxnFacts(topic, partition, PID, txn.epoch, first_batch, observed, 900_000, first_seen)
    # Proofs ordered by offsets: the log end a position measured at some moment before the report's request
    # (or none known), and the view's record at its true offset.
    written = [w for w in record_times if w < observed] or [observed - 1]  # just after a write: the edge
    measured_at = pick.draw(
        st.one_of(st.none(), st.sampled_from(written), st.integers(observed - 30_000, observed - 1))
    )
    if measured_at is not None and c is not None:
        t = t._replace(log_end_before=log_end_at(txns, measured_at))
        c = c._replace(log_offset=log_end_at(txns, view_time) - 1)
    now = observed + pick.draw(st.integers(0, 10_000))
    d = judge(t, c, now, limits, view_current_ms=current)
    # Never HANGING; and never STUCK_PREPARE, which this history cannot have (every marker lands within 2 s of
    # its Prepare, inside the grace): on a stale view it would be an earlier transaction's Prepare record.
    assert d.kind not in (K.HANGING, K.STUCK_PREPARE), (d, c, t, current)


@BOTH_LIMITS
@settings(max_examples=200, deadline=None)
@given(history=histories(), pick=st.data())
def test_an_orphan_is_found_once_the_view_is_current(
    limits: DetectionLimits, history: tuple[list[Txn], int], pick: st.DataObject
) -> None:
    """The other side: data on a partition no transaction lists, written after the last transaction completed,
    is HANGING once the view is current and the grace has passed, whatever lag came before."""
    txns, tv = history
    last = txns[-1]
    first_batch = last.complete + pick.draw(st.integers(1, 5_000))
    observed = first_batch + limits.grace_ms + limits.clock_skew_ms + limits.grace_ms + 1
    observed += pick.draw(st.integers(0, 60_000))
    first_seen = pick.draw(st.integers(first_batch, observed - limits.grace_ms - 1))
    t = TxnFacts("payments", 0, PID, last.epoch, first_batch, observed, 900_000, first_seen)
    c = view_at(txns, tv, observed)
    assert judge(t, c, observed, limits, view_current_ms=None).kind is K.UNCONFIRMED
    d = judge(t, c, observed, limits, view_current_ms=observed)
    assert (d.kind, d.reason) == (K.HANGING, R.COORDINATOR_COMPLETED)


@BOTH_LIMITS
@settings(max_examples=200, deadline=None)
@given(history=histories(), pick=st.data())
def test_an_orphan_is_found_at_the_first_report_ordered_after_the_completion(
    limits: DetectionLimits, history: tuple[list[Txn], int], pick: st.DataObject
) -> None:
    """Ordered by offsets: a report whose sweep follows a position measured after the last Complete record proves
    the orphan at once, without waiting for grace and skew; one that follows only a position measured before it
    does not, by offsets, until the clocks allow."""
    txns, tv = history
    last = txns[-1]
    first_batch = last.complete + pick.draw(st.integers(1, 5_000))
    measured_at = pick.draw(st.integers(last.complete, first_batch + 2_000))
    observed = max(first_batch, measured_at) + pick.draw(st.integers(1, 1_000))
    t = TxnFacts("payments", 0, PID, last.epoch, first_batch, observed, 900_000, first_batch)
    t = t._replace(log_end_before=log_end_at(txns, measured_at))
    c = view_at(txns, tv, observed)
    assert c is not None
    c = c._replace(log_offset=log_end_at(txns, observed) - 1)
    d = judge(t, c, observed, limits, view_current_ms=observed)
    assert (d.kind, d.reason) == (K.HANGING, R.COORDINATOR_COMPLETED)
    before = t._replace(log_end_before=log_end_at(txns, last.complete - 1))
    if observed - first_batch - limits.clock_skew_ms <= limits.grace_ms:
        assert judge(before, c, observed, limits, view_current_ms=observed).kind is K.OPEN


def test_progress_without_a_position_is_a_change_to_store() -> None:
    """The stage stores the bookkeeping only when it changed: reading records before any position arrived is
    a change (a missed save here once left a view forever "behind")."""
    v = ViewCurrency(LOG)
    assert v.applied(LOG, 0, 5) is True
    assert v.applied(LOG, 0, 5) is False
    restored = ViewCurrency(LOG, state=v.state())
    restored.add_position(LOG, 1, 1_000, {0: 5})
    assert restored.current_as_of(None) == 1_000


# ------------------------------------------------------------------------------ log ends (collector-clock-ahead)


def test_a_record_after_the_report_is_shown_after_many_more_positions() -> None:
    """Issue 39 #5: the position right after the report must still answer once 17+ positions followed it."""
    v = ViewCurrency(LOG)
    report = T0
    v.add_position(LOG, 1, report + 100, {0: 10}, {0: 11})  # measured right after the report: log end 11
    for i in range(1, 40):  # a busy cluster: re-describes and follow-ups publish a position every second
        v.add_position(LOG, 1, report + 100 + i * SECOND, {0: 11 + i}, {0: 12 + i})
    assert v.appended_after(0, 11, report)  # the commit at 11 was appended after the report


def test_a_position_kept_answers_as_before() -> None:
    v = ViewCurrency(LOG)
    v.add_position(LOG, 2, T0, {0: 10}, {0: 12})
    v.add_position(LOG, 2, T0 + 5 * SECOND, {0: 12, 1: 3}, {0: 14, 1: 4})
    assert not v.appended_after(0, 11, T0 - SECOND)
    assert v.appended_after(0, 12, T0 - SECOND)
    assert v.appended_after(0, 13, T0 + SECOND) is False  # the next position's log end is 14
    assert v.appended_after(1, 4, T0 - SECOND)  # the first position with partition 1 answers for it
    assert not v.appended_after(0, 99, T0 + 6 * SECOND)  # no position measured at or after that moment
    assert v.log_ends_dropped_ms is None


def test_log_ends_stay_bounded_and_a_dropped_one_withholds() -> None:
    v = ViewCurrency(LOG)
    for i in range(10_000):  # one a second: the count bounds them
        v.add_position(LOG, 1, T0 + i * SECOND, {0: i}, {0: i + 1})
    assert len(v.log_ends) == MAX_LOG_END_POSITIONS
    newest = T0 + 9_999 * SECOND
    assert v.log_ends_dropped_ms == newest - MAX_LOG_END_POSITIONS * SECOND
    assert not v.appended_after(0, 9_000, newest - 100 * SECOND)  # kept: answered exactly (log end 9,900)
    assert v.appended_after(0, 0, T0 + 5 * SECOND)  # its position is gone: maybe after, never "not after"
    slow = ViewCurrency(LOG)
    for i in range(10_000):  # one every 5 s: the horizon bounds them
        slow.add_position(LOG, 1, T0 + i * 5 * SECOND, {0: i}, {0: i + 1})
    assert len(slow.log_ends) == LOG_END_HORIZON_MS // (5 * SECOND) + 1


def test_a_quiet_log_keeps_one_log_end() -> None:
    v = ViewCurrency(LOG)
    for i in range(1_000):  # nothing written: every position measures the same ends
        v.add_position(LOG, 2, T0 + i * SECOND, {0: 7, 1: 9}, {0: 7, 1: 9})
    assert v.log_ends == [(T0 + 999 * SECOND, ((0, 7), (1, 9)))]
    assert v.log_ends_dropped_ms is None
    assert v.appended_after(0, 7, T0) and not v.appended_after(0, 6, T0)


def test_the_dropped_mark_survives_the_state_store_and_old_state_loads() -> None:
    v = ViewCurrency(LOG)
    for i in range(MAX_LOG_END_POSITIONS + 3):
        v.add_position(LOG, 1, T0 + i * SECOND, {0: i}, {0: i + 1})
    restored = ViewCurrency(LOG, state=v.state())
    assert restored.log_ends_dropped_ms == T0 + 2 * SECOND and restored.appended_after(0, 0, T0 + SECOND)
    v.add_position(LOG, 1, T0, {0: 0}, {0: 1})  # a late one at or before the mark answers nothing new
    assert len(v.log_ends) == MAX_LOG_END_POSITIONS
    legacy = ViewCurrency(LOG)  # a release that kept the newest 16 stored no mark
    for i in range(LEGACY_LOG_END_POSITIONS):
        legacy.add_position(LOG, 1, T0 + i * SECOND, {0: i}, {0: i + 1})
    full = ViewCurrency(LOG, state=legacy.state()[:9])
    assert full.log_ends_dropped_ms == T0 and full.appended_after(0, 0, T0 - SECOND)
    assert not full.appended_after(0, 1, T0 + SECOND)  # log end 2 at T0 + 1 s
    short = ViewCurrency(LOG, state=(*legacy.state()[:8], legacy.log_ends[1:]))  # 15 ends: none dropped
    assert short.log_ends_dropped_ms is None


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 40 * MINUTE),
            st.dictionaries(st.integers(0, 2), st.integers(0, 50), min_size=1, max_size=3),
        ),
        max_size=60,
    ),
    st.integers(0, 2),
    st.integers(0, 50),
    st.integers(-SECOND, 40 * MINUTE + SECOND),
)
def test_log_ends_never_say_not_after_when_every_position_would_say_after(
    positions: list[tuple[int, dict[int, int]]], partition: int, offset: int, moment: int
) -> None:
    """Against every position kept (the reference): the answer is the same, or "maybe after" once dropped."""
    v = ViewCurrency(LOG)
    with patch("detectors.currency.MAX_LOG_END_POSITIONS", 8):  # the horizon and the count both drop some
        for as_of, ends in positions:
            v.add_position(LOG, 3, T0 + as_of, {}, ends)
    # A record at or above the log end of any position measured at or after the moment was appended after it.
    reference = any(
        as_of >= moment and partition in ends and offset >= ends[partition] for as_of, ends in positions
    )
    answer = v.appended_after(partition, offset, T0 + moment)
    assert answer or not reference
    if v.log_ends_dropped_ms is None or T0 + moment > v.log_ends_dropped_ms:
        assert answer == reference
