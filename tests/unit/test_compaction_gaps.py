"""Compaction while the job lags (issue 30 #2): `__transaction_state` is compacted with `min.compaction.lag.ms` 0,
so a record below a position's end offset can be cleaned away before the job reads it, once a later record of the
same transactional id (above that end) supersedes it. The job then reaches the end with the id's view one
transaction behind, and "every record below the end applied" no longer means "the state as of the position".
These tests hold the job's answer: a gap in what it read stops earlier positions from vouching past the gap
(`ViewCurrency.read`), and a partition read again below what was applied (truncated and rewritten) proves nothing.
The same on a real broker whose cleaner runs every few hundred milliseconds: tests/broker/test_compaction.py."""

from __future__ import annotations

import json
from typing import Any

import pytest
from builders import SECOND, T0, coord
from test_tracking import LOG, applied_row, batch, fact_row, new_bucket, open_row, position_row, seen_at, told

from detectors.currency import ViewCurrency, coordinator_partition
from detectors.models import CoordinatorState
from detectors.tracking import STAGE2_INPUT_COLUMNS, read_facts

pytestmark = pytest.mark.unit

SKEW = 2_000


def view(state: tuple[Any, ...] | None = None) -> ViewCurrency:
    return ViewCurrency(LOG, state=state, clock_skew_ms=SKEW)


def test_a_contiguous_read_vouches_as_before() -> None:
    v = view()
    v.add_position(LOG, 1, T0, {0: 50})
    v.read(LOG, 0, [(-1, 0)], T0 + 60 * SECOND)  # first row read: offset 0, nothing missing
    v.applied(LOG, 0, 50)
    assert v.current_as_of(None) == T0


def test_a_gap_read_after_a_position_stops_it_vouching_past_the_gap() -> None:
    v = view()
    v.add_position(LOG, 1, T0, {0: 50})  # measured while the cleaned record was still there
    v.read(LOG, 0, [(-1, 0), (19, 30)], T0 + 60 * SECOND)  # 20..29 were cleaned: 30 follows 19
    v.applied(LOG, 0, 50)
    assert v.current_as_of(None) is None
    # A position measured after the gap was read (beyond the skew) ends above whatever superseded the lost record.
    v.add_position(LOG, 1, T0 + 70 * SECOND, {0: 80})
    v.applied(LOG, 0, 80)
    assert v.current_as_of(None) == T0 + 70 * SECOND


def test_a_position_measured_within_the_skew_of_the_read_does_not_vouch() -> None:
    v = view()
    v.read(LOG, 0, [(-1, 0), (19, 30)], T0)
    v.add_position(LOG, 1, T0 + SKEW, {0: 50})
    v.applied(LOG, 0, 50)
    assert v.current_as_of(None) is None


def test_a_position_ending_before_the_gap_still_vouches() -> None:
    v = view()
    v.add_position(LOG, 1, T0, {0: 20})
    v.read(LOG, 0, [(-1, 0), (19, 30)], T0 + 60 * SECOND)  # offsets 0..19 read in a row
    v.applied(LOG, 0, 50)
    assert v.current_as_of(None) == T0


def test_a_gap_between_two_batches_counts_too() -> None:
    v = view()
    v.read(LOG, 0, [(-1, 0)], T0)
    v.applied(LOG, 0, 100)  # the first batch read 0..99
    v.add_position(LOG, 1, T0 + SECOND, {0: 130})
    v.read(LOG, 0, [(-1, 120)], T0 + 60 * SECOND)  # the next batch starts at 120: 100..119 cleaned
    v.applied(LOG, 0, 130)
    assert v.current_as_of(None) is None


def test_a_partition_read_again_below_what_was_applied_is_rewound_and_proves_nothing() -> None:
    v = view()
    v.add_position(LOG, 1, T0, {0: 100})
    v.read(LOG, 0, [(-1, 0)], T0)
    v.applied(LOG, 0, 100)
    assert v.current_as_of(None) == T0
    # Truncated to 80 by an unclean election and written again: the reader sees offset 80 once more.
    assert v.read(LOG, 0, [(-1, 80)], T0 + SECOND)
    assert v.current_as_of(None) is None and v.rewound_about(None) and v.rewound_about("tx-1")
    assert v.rewound == {(LOG, 0): 80}


def test_the_gaps_survive_the_state_store_and_older_states_load() -> None:
    v = view()
    v.read(LOG, 0, [(-1, 0), (19, 30)], T0)
    again = view(v.state())
    assert again.gaps == {(LOG, 0): (20, T0)}
    older = view(v.state()[:6])  # stored before gaps were kept
    assert older.gaps == {} and older.rewound == {}


def test_stage_one_reports_the_breaks_of_its_rows() -> None:
    facts = read_facts([LOG, LOG, LOG, None], [0, 0, 1, None], [10, 30, 5, None], [-1, 19, None, None], T0)
    assert facts == [(-1, "read", LOG, json.dumps({0: [(-1, 10), (19, 30)]}), T0, -1)]


def read_row(breaks: dict[int, list[tuple[int, int]]], at_ms: int) -> list[Any]:
    values = {
        "producer_id": -1,
        "fact": "read",
        "transactional_id": LOG,
        "record_json": json.dumps(breaks),
        "fact_time_ms": at_ms,
        "log_offset": -1,
    }
    return [values.get(c) for c in STAGE2_INPUT_COLUMNS[1:]]


def test_the_live_transaction_whose_ongoing_record_was_cleaned_is_not_hanging() -> None:
    """The issue's story, through stage 2. tx-1's first transaction committed (CompleteCommit at offset 10, read
    by the job). Its second transaction starts (Ongoing, listing orders-0, at offset 11); the leader reports it
    open and the collector measures the log's end at 15. The job lags; meanwhile the second transaction commits
    (offsets 16..) and the cleaner removes 11..15, superseded. The job's next batch starts at 16: it reaches the
    position's end with the view still at the first CompleteCommit. Before the gap was heeded: HANGING
    `coordinator-completed` on a transaction that was live when the leader reported it."""
    p = coordinator_partition("tx-1", 3)
    done = coord(
        state=CoordinatorState.COMPLETE_COMMIT, partitions=(), last_update_timestamp_ms=T0 - 30 * SECOND
    )
    b = new_bucket()
    ends = dict.fromkeys(range(3), 0)
    # The job has read tx-1's partition up to offset 10 (the first CompleteCommit), current as of T0 - 20 s.
    batch(
        b,
        T0 - 20 * SECOND,
        read_row({p: [(-1, 0)]}, T0 - 20 * SECOND),
        fact_row(done, log_offset=10),
        applied_row({p: 11}),
        position_row(T0 - 20 * SECOND, {**ends, p: 11}),
        current=False,
    )
    # The leader reports the second transaction open (it began at T0) at T0 + 10 s and again at T0 + 30 s; the
    # collector measures the log's end just after that second report: 16.
    batch(b, T0 + 10 * SECOND, open_row(seen_at(T0 + 10 * SECOND, start_timestamp_ms=T0)), current=False)
    obs = T0 + 30 * SECOND
    position = position_row(obs, {**ends, p: 16})
    batch(b, obs, open_row(seen_at(obs, start_timestamp_ms=T0)), position, current=False)
    # Later the job reads on: its first row of the partition is 16 (11..15 cleaned away), read at obs + 60 s.
    read_at = obs + 60 * SECOND
    events = batch(
        b,
        read_at,
        read_row({p: [(-1, 16)]}, read_at),
        applied_row({p: 16}),
        open_row(seen_at(obs + 2 * SECOND, start_timestamp_ms=T0)),
        current=False,
    )
    assert told(b).kind != "HANGING", told(b)  # the VERDICT the driver holds, unchanged by this batch
    assert (told(b).kind, told(b).withheld) == ("UNCONFIRMED", "coordinator-view-behind")
    assert not [e for e in events if e["event"] == "OPENED"]
