"""Clocks the proof must not trust blindly (issue 30 #3, the job's side). A report is stamped when its request was
sent (`observed_at_ms`), so "open since the first report" must use when that first answer arrived
(`seen_open_ms`), the earliest moment the transaction is known to have been open; and a collector clock running
ahead of the coordinators' makes every report look later than it is next to coordinator events, so the job
withholds proofs once a coordinator record written after a position is stamped well before it."""

from __future__ import annotations

import pytest
from builders import LIMITS, SECOND, T0, coord, open_txn, snapshot
from test_tracking import LOG, applied_row, batch, fact_row, new_bucket, open_row, position_row, seen_at

from detectors.currency import CLOCK_CHECK_SLACK_MS, ViewCurrency, coordinator_partition
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


def test_a_record_above_a_positions_end_stamped_well_before_it_marks_the_collector_clock_ahead() -> None:
    v = ViewCurrency(LOG, clock_skew_ms=SKEW)
    p = coordinator_partition("tx-1", 3)
    v.add_position(LOG, 3, T0, {p: 50})
    assert not v.check_clock("tx-1", 49, T0 - 60 * SECOND)  # below the end: written before, any stamp
    assert not v.check_clock("tx-1", 50, T0 - SKEW - CLOCK_CHECK_SLACK_MS)  # at the limit: agrees
    assert v.check_clock("tx-1", 50, T0 - 30 * SECOND)  # written after, stamped 30 s before: ahead
    assert v.clock_ahead == (30 * SECOND, T0)
    assert ViewCurrency(LOG, state=v.state()).clock_ahead == (30 * SECOND, T0)
    assert ViewCurrency(LOG, state=v.state()[:8]).clock_ahead is None  # stored before the check existed
    # A later position, and a record after it stamped in agreement: the mark is lifted.
    v.add_position(LOG, 3, T0 + 60 * SECOND, {p: 80})
    assert v.check_clock("tx-1", 81, T0 + 60 * SECOND)
    assert v.clock_ahead is None


def test_proofs_are_withheld_while_the_collector_clock_runs_ahead() -> None:
    p = coordinator_partition("tx-1", 3)
    ends = {0: 0, 1: 0, 2: 0}
    b = new_bucket()
    t1 = T0 + 60 * SECOND
    done = coord(state=CoordinatorState.COMPLETE_COMMIT, partitions=(), last_update_timestamp_ms=T0)
    # The collector measured the log's end at 10 before the record at offset 10 was written, yet the record is
    # stamped 60 s before that measurement.
    batch(b, t1, position_row(t1, {**ends, p: 10}), current=False)
    batch(b, t1, fact_row(done, log_offset=10), applied_row({**ends, p: 11}), open_row(seen_at(t1)),
          position_row(t1 + SECOND, {**ends, p: 11}), current=False)  # fmt: skip
    t2 = t1 + 20 * SECOND
    (verdict,) = batch(b, t2, open_row(seen_at(t2)), position_row(t2, {**ends, p: 11}), current=False)
    assert (verdict["kind"], verdict["withheld"]) == ("UNCONFIRMED", "collector-clock-ahead")
    assert "collector's clock runs ahead" in verdict["explanation"]
