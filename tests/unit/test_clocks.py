"""Clocks the proof must not trust blindly (issue 30 #3, the job's side). A report is stamped when its request was
sent (`observed_at_ms`), so "open since the first report" must use when that first answer arrived
(`seen_open_ms`), the earliest moment the transaction is known to have been open."""

from __future__ import annotations

from typing import Any

import pytest
from builders import LIMITS, SECOND, T0, coord, open_txn, snapshot
from test_tracking import LOG, applied_row, batch, fact_row, new_bucket, open_row, position_row

from detectors.currency import MAX_LOG_END_POSITIONS, ViewCurrency, coordinator_partition
from detectors.models import CoordinatorState, HangingReason, VerdictKind
from detectors.rules import classify

pytestmark = pytest.mark.unit

SKEW = LIMITS.clock_skew_ms


def test_a_slow_first_answer_does_not_count_as_open_since_its_request() -> None:
    # The first report's request went out at T0 (its stamp), but the answer took 20 s: the leader's state is from
    # some moment up to T0 + 20 s, so the transaction is known open only from then. At T0 + 25 s it has not been
    # open for the 10 s grace; counted from the request, it had, and the completed record proved HANGING.
    txn = open_txn(start_timestamp_ms=None, last_timestamp_ms=-1, seen_open_ms=T0 + 20 * SECOND)
    done = coord(
        state=CoordinatorState.COMPLETE_COMMIT, partitions=(), last_update_timestamp_ms=T0 - 60 * SECOND
    )
    obs = T0 + 25 * SECOND
    v = classify(txn, snapshot(txn, observed_at_ms=obs), done, now_ms=obs, limits=LIMITS, view_current_ms=obs,
                 first_seen_ms=T0)  # fmt: skip
    assert v.kind is VerdictKind.OPEN
    later = obs + 10 * SECOND
    v = classify(txn, snapshot(txn, observed_at_ms=later), done, now_ms=later, limits=LIMITS,
                 view_current_ms=later, first_seen_ms=T0)  # fmt: skip
    assert (v.kind, v.reason) == (VerdictKind.HANGING, HangingReason.COORDINATOR_COMPLETED)


# ----------------------------------------------------------------- a collector clock that runs ahead (stage 2)

AHEAD = 60 * SECOND  # the collector's clock runs a minute ahead of the coordinator's (and the broker's)


def _the_commit_after_the_report(*, log_ends: bool, provenance: bool = True) -> list[dict[str, Any]]:
    """tx-1's transaction T began on orders-0 at T0 (coordinator clock: Ongoing at offset 10). The leader reports
    it open at T0 + 2 s and T0 + 15 s; the collector stamps those reports AHEAD later and measures the log right
    after each: high watermark and log end 11. Then T commits (CompleteCommit at 11, stamped T0 + 16 s) and the
    next sweep (the leader no longer reports T) measures 12. By the stamps, the last report came 59 s after the
    commit: HANGING `coordinator-completed`. By the offsets, the commit was written after that report."""
    p = coordinator_partition("tx-1", 3)
    ends = dict.fromkeys(range(3), 0)
    # The job's records carry no provenance (streaming.rows.coordinator_rows leaves it out of the JSON): where a
    # record is comes with its fact (the log offset) and its transactional id (the partition).
    where: dict[str, int] = {"source_partition": p} if provenance else {}
    ongoing = coord(
        last_update_timestamp_ms=T0, start_timestamp_ms=T0, **where, source_offset=10 if provenance else -1
    )
    done = coord(
        state=CoordinatorState.COMPLETE_COMMIT,
        partitions=(),
        last_update_timestamp_ms=T0 + 16 * SECOND,
        start_timestamp_ms=T0,
        **where,
        source_offset=11 if provenance else -1,
    )
    b = new_bucket()
    measured = {**ends, p: 11}
    batch(b, T0 + 2 * SECOND + AHEAD, fact_row(ongoing, log_offset=10), applied_row(measured), current=False)
    for real in (T0 + 2 * SECOND, T0 + 15 * SECOND):
        report = real + AHEAD
        txn = open_txn(last_timestamp_ms=T0 + SECOND, seen_open_ms=T0 + 2 * SECOND + AHEAD + 50)
        position = position_row(report + 100, measured, log_ends=measured if log_ends else None)
        batch(b, report + 200, open_row(snapshot(txn, observed_at_ms=report)), position, current=False)
    later = T0 + 25 * SECOND + AHEAD
    after = {**ends, p: 12}
    position = position_row(later, after, log_ends=after if log_ends else None)
    return batch(b, later + 200, fact_row(done, log_offset=11), applied_row(after), position, current=False)


@pytest.mark.parametrize("provenance", [True, False], ids=["record-says-where", "as-the-job-builds-it"])
def test_a_commit_written_after_the_report_is_no_proof_whatever_the_stamps_say(provenance: bool) -> None:
    events = _the_commit_after_the_report(log_ends=True, provenance=provenance)
    (verdict,) = [e for e in events if e["event"] == "VERDICT"]
    assert (verdict["kind"], verdict["withheld"]) == ("UNCONFIRMED", "collector-clock-ahead"), verdict
    assert "clock runs ahead" in verdict["explanation"]
    assert not [e for e in events if e["event"] == "OPENED"]


def test_without_log_end_offsets_the_stamps_alone_decide() -> None:
    # A collector from before the check publishes no log end offsets: the story above is then HANGING, as it was
    # for every collector before (what the check closes).
    events = _the_commit_after_the_report(log_ends=False)
    (verdict,) = [e for e in events if e["event"] == "VERDICT"]
    assert (verdict["kind"], verdict["reason"]) == ("HANGING", "coordinator-completed"), verdict


def test_a_record_appended_before_the_position_is_judged_by_its_stamp() -> None:
    # Offsets below the log end of the position after the report say nothing about the order: not flagged.
    v = ViewCurrency(LOG, clock_skew_ms=SKEW)
    v.add_position(LOG, 3, T0, {0: 10}, {0: 12})
    assert not v.appended_after(0, 11, T0 - SECOND)
    assert v.appended_after(0, 12, T0 - SECOND)
    assert not v.appended_after(1, 50, T0 - SECOND)  # no log end known for partition 1
    assert not v.appended_after(0, 99, T0 + SECOND)  # no position measured at or after that moment


def test_the_log_ends_survive_the_state_store_and_are_bounded() -> None:
    v = ViewCurrency(LOG, clock_skew_ms=SKEW)
    for i in range(MAX_LOG_END_POSITIONS + 5):
        v.add_position(LOG, 3, T0 + i * SECOND, {0: i}, {0: i + 1})
    restored = ViewCurrency(LOG, state=v.state(), clock_skew_ms=SKEW)
    assert len(restored.log_ends) == MAX_LOG_END_POSITIONS
    assert restored.appended_after(0, 25, T0 + 20 * SECOND)  # log end 21 at T0 + 20 s
    older = ViewCurrency(LOG, state=v.state()[:8], clock_skew_ms=SKEW)  # a checkpoint from before the check
    assert older.log_ends == []
