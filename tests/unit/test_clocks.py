"""Clocks the proof must not trust blindly (issue 30 #3, the job's side). A report is stamped when its request was
sent (`observed_at_ms`), so "open since the first report" must use when that first answer arrived
(`seen_open_ms`), the earliest moment the transaction is known to have been open."""

from __future__ import annotations

import pytest
from builders import LIMITS, SECOND, T0, coord, open_txn, snapshot

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
