"""The stream's console line for a new candidate names txnwatch's verified path, never Kafka's abort line.

`kafka-transactions.sh abort` re-checks nothing. The console prints its line when the job proposes a candidate,
before anyone verified it, so on-call could paste it where `proposals abort` would now refuse (the coordinator
owns the transaction again, its owner is live at that epoch). `proposals show` offers Kafka's line only while it
says SAFE (tests/unit/test_show_acts.py); the console offers `proposals show` and the candidate's own verified
command instead. The OPENED row here is stage 2's own (detectors.tracking, through test_tracking's helpers).
"""

from __future__ import annotations

import pytest
from builders import MINUTE, SECOND, T0, coord
from test_lost_markers import lost_commit
from test_tracking import batch, fact_row, new_bucket, open_row, seen_at

from detectors.models import AbortCandidate, CoordinatorState
from streaming.sinks import EventRow, format_event

pytestmark = pytest.mark.unit


def opened_by_stage_2() -> EventRow:
    """The OPENED event stage 2 emits for a transaction left open after its coordinator committed."""
    done = coord(state=CoordinatorState.COMPLETE_COMMIT, partitions=(), last_update_timestamp_ms=T0 + SECOND)
    b = new_bucket()
    batch(b, T0 + MINUTE, fact_row(done), open_row(seen_at(T0 + MINUTE)))
    later = T0 + MINUTE + 15 * SECOND  # past the grace period
    (opened,) = [e for e in batch(b, later, open_row(seen_at(later))) if e["event"] == "OPENED"]
    return EventRow(**opened)


def opened_row(candidate: AbortCandidate) -> EventRow:
    """Stage 2's OPENED row carrying `candidate` instead (its id, reason, explanation and payload)."""
    return opened_by_stage_2()._replace(
        candidate_id=candidate.candidate_id,
        reason=candidate.reason.value,
        explanation=candidate.explanation,
        payload=candidate.model_dump_json(),
    )


def test_a_new_candidate_is_shown_with_the_verified_commands_not_kafkas_abort() -> None:
    r = opened_by_stage_2()
    c = AbortCandidate.model_validate_json(r.payload or "")
    assert c.kafka_cli.startswith(
        "kafka-transactions.sh"
    )  # the candidate still carries it, for `show` to offer
    line = format_event(r)
    assert "kafka-transactions.sh" not in line and c.kafka_cli not in line
    assert f"txnwatch proposals show {c.candidate_id}\n" in line
    assert f"txnwatch proposals abort {c.candidate_id}" in line
    assert line.startswith(f"HANGING   {r.topic}-{r.partition} producer {r.producer_id} ")


def test_a_lost_commit_is_shown_with_its_commit_never_an_abort() -> None:
    c = lost_commit()
    assert c.spec.transaction_result == "COMMIT"
    line = format_event(opened_row(c))
    assert f"txnwatch proposals show {c.candidate_id}\n" in line
    assert f"txnwatch proposals commit {c.candidate_id}" in line
    assert "proposals abort" not in line and "kafka-transactions.sh" not in line
