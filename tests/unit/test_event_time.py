"""Event time is not transaction time: a transaction's age and its "settled" proof are held between what the
collector saw (`opened_after_ms`, `seen_open_ms`; admin/collect/sighting.py), never taken from the records' CreateTime
alone. Kafka Streams stamps its output with its input's event time, MirrorMaker 2 and Flink keep the source's,
and brokers accept any past timestamp by default. The same on a real broker: tests/broker/test_event_time_broker.py."""

from __future__ import annotations

import pytest
from builders import HOUR, LIMITS, MINUTE, SECOND, T0, coord, open_txn, snapshot

from admin.collect.sighting import Sightings
from detectors import kip664
from detectors.models import HangingReason, VerdictKind
from detectors.rules import classify

pytestmark = pytest.mark.unit

K = VerdictKind


def test_records_stamped_two_hours_ago_age_from_the_report_before_the_transaction_opened() -> None:
    txn = open_txn(start_timestamp_ms=T0 - 2 * HOUR, last_timestamp_ms=T0 - 2 * HOUR, opened_after_ms=T0)
    assert txn.record_time_ms == T0 - 2 * HOUR
    assert (txn.open_since_ms, txn.open_since_basis) == (T0, "opened-after-previous-report")
    snap = snapshot(txn, observed_at_ms=T0 + 5 * SECOND)
    assert kip664.partition_duration_ms(snap, now_ms=T0 + 5 * SECOND) == 5 * SECOND
    assert not kip664.partition_has_late_transaction(snap, now_ms=T0 + 5 * SECOND, limits=LIMITS)


def test_without_an_earlier_report_the_records_time_is_all_there_is() -> None:
    # The collector's first sweep of the partition (or a restart): nothing bounds the opening from below.
    txn = open_txn(start_timestamp_ms=T0 - 2 * HOUR, seen_open_ms=T0)
    assert (txn.open_since_ms, txn.open_since_basis) == (T0 - 2 * HOUR, "start-timestamp")


def test_a_future_timestamp_is_held_to_the_first_report_of_it_open() -> None:
    txn = open_txn(start_timestamp_ms=T0 + HOUR, last_timestamp_ms=T0 + HOUR, seen_open_ms=T0)
    assert (txn.open_since_ms, txn.open_since_basis) == (T0, "first-seen-open")


def test_an_unknown_record_time_takes_the_earliest_possible_opening() -> None:
    txn = open_txn(start_timestamp_ms=None, last_timestamp_ms=-1, opened_after_ms=T0)
    assert txn.open_since_ms == T0


def test_a_healthy_transaction_in_event_time_is_open_not_late_and_the_explanation_says_why() -> None:
    txn = open_txn(start_timestamp_ms=T0 - 2 * HOUR, last_timestamp_ms=T0 - 2 * HOUR, opened_after_ms=T0)
    v = classify(
        txn,
        snapshot(txn, observed_at_ms=T0 + 3 * SECOND),
        coord(start_timestamp_ms=T0, last_update_timestamp_ms=T0),
        now_ms=T0 + 3 * SECOND,
        limits=LIMITS,
        view_current_ms=T0 + 3 * SECOND,
    )
    assert v.kind is K.OPEN
    assert v.evidence.age_ms == 3 * SECOND and v.evidence.record_time_ms == T0 - 2 * HOUR
    assert "stamped 2h00m earlier" in v.explanation


def test_a_real_orphan_stamped_in_the_future_is_proven_on_time() -> None:
    # No transactional id owns the producer id; its batch says it opened an hour from now. Before the bound the
    # rules waited for that hour to pass before "settled" held (and with it the HANGING proof).
    txn = open_txn(start_timestamp_ms=T0 + HOUR, last_timestamp_ms=T0 + HOUR, seen_open_ms=T0)
    observed = T0 + MINUTE
    v = classify(
        txn,
        snapshot(txn, observed_at_ms=observed),
        None,
        now_ms=observed,
        limits=LIMITS,
        view_current_ms=observed,
        first_seen_ms=T0,
    )
    assert (v.kind, v.reason) == (K.HANGING, HangingReason.NO_COORDINATOR_STATE)
    assert "first report of it open" in v.explanation


def test_late_counts_from_the_transactions_own_timeout_when_its_coordinator_record_gives_it() -> None:
    # 3 minutes open, its own timeout 60 s (the leader's transaction.max.timeout.ms is 15 min): late, and the
    # coordinator's abort (60 s + the 10 s cleanup interval) is overdue only past that.
    txn = open_txn()
    record = coord(start_timestamp_ms=T0 - 100, transaction_timeout_ms=60_000)
    args = {"limits": LIMITS, "view_current_ms": T0 + MINUTE}
    at_65s = classify(txn, snapshot(txn), record, now_ms=T0 + 65 * SECOND, **args)  # type: ignore[arg-type]
    assert at_65s.kind is K.LATE and at_65s.evidence.late_threshold_source == "transaction"
    assert "its own transaction timeout 1m00s" in at_65s.explanation
    at_40s = classify(txn, snapshot(txn), record, now_ms=T0 + 40 * SECOND, **args)  # type: ignore[arg-type]
    assert at_40s.kind is K.OPEN
    # A record of a finished transaction gives no timeout of T's: the leader's maximum, KIP-664's definition.
    done = coord(state="CompleteCommit", partitions=(), start_timestamp_ms=T0 + 10 * SECOND)
    other = classify(txn, snapshot(txn), done, now_ms=T0 + 3 * MINUTE, **args)  # type: ignore[arg-type]
    assert other.evidence.late_threshold_source == "max-timeout"
    assert other.evidence.late_threshold_ms == 900_000


def test_sightings_bound_a_transaction_between_two_reports() -> None:
    s = Sightings()
    tp = ("orders", 0)
    assert s.bounds(tp, 7, 100, T0) == (None, T0)  # the partition's first report: no earlier one
    s.reported(tp, T0, [(7, 100)])
    assert s.bounds(tp, 7, 100, T0 + 10 * SECOND) == (None, T0)  # fixed at its first report
    assert s.bounds(tp, 8, 150, T0 + 10 * SECOND) == (T0, T0 + 10 * SECOND)  # opened after the report at T0
    s.reported(tp, T0 + 10 * SECOND, [(8, 150)])
    assert len(s) == 1  # 7 closed: forgotten
    assert s.bounds(tp, 7, 100, T0 + 20 * SECOND) == (T0 + 10 * SECOND, T0 + 20 * SECOND)


def test_a_short_transaction_seen_between_two_sweeps_is_not_late_by_the_gap_between_them() -> None:
    """Kafka Streams exactly_once_v2 over input stamped 2 h ago, the collector at its shipped 10 s sweep: the
    previous full sweep (10 s before) did not have the 100 ms transaction open, the next one did. Its age is
    what was observed (from that first sighting), never the gap between the sweeps, so it is not LATE by its
    own 10 s timeout and MaxActiveTransactionDuration does not read the sweep interval."""
    seen = T0 + 10 * SECOND + 150
    txn = open_txn(
        start_timestamp_ms=T0 - 2 * HOUR,
        last_timestamp_ms=T0 - 2 * HOUR,
        opened_after_ms=T0,
        seen_open_ms=seen,
    )
    own = coord(
        start_timestamp_ms=seen - 100, last_update_timestamp_ms=seen - 100, transaction_timeout_ms=10_000
    )
    snap = snapshot(txn, observed_at_ms=seen)
    v = classify(txn, snap, own, now_ms=seen, limits=LIMITS, view_current_ms=seen)
    assert v.kind is K.OPEN, v.explanation
    assert kip664.partition_duration_ms(snap, now_ms=seen) == 0
    # Still open 11 s after it was first seen: longer than its own timeout by what was observed, LATE.
    later = seen + 11 * SECOND
    again = classify(
        txn, snapshot(txn, observed_at_ms=later), own, now_ms=later, limits=LIMITS, view_current_ms=later
    )
    assert again.kind is K.LATE


def test_after_a_restart_hours_old_stamps_do_not_make_a_transaction_late() -> None:
    """A Flink or MirrorMaker 2 transaction first reported by a collector that just started (no earlier report
    of its partition): its records' time is hours old, but all that was observed is that it is open now."""
    txn = open_txn(start_timestamp_ms=T0 - 3 * HOUR, last_timestamp_ms=T0 - 3 * HOUR, seen_open_ms=T0)
    snap = snapshot(txn, observed_at_ms=T0 + SECOND)
    assert not kip664.partition_has_late_transaction(snap, now_ms=T0 + SECOND, limits=LIMITS)
    assert kip664.partition_duration_ms(snap, now_ms=T0 + SECOND) == SECOND
    v = classify(txn, snap, None, now_ms=T0 + SECOND, limits=LIMITS, view_current_ms=T0 + SECOND)
    assert v.kind is K.OPEN
