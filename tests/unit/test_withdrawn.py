"""A HANGING candidate whose proof stops holding is WITHDRAWN (issue 30 #8), everywhere it was proposed: on the
candidates topic (status and reason), on the audit trail (a WITHDRAWN record beside the abort attempts), in
`proposals watch` (no longer pending, never auto-aborted on that record), and in the job's own console line. How
stage 2 decides to withdraw: tests/unit/test_tracking.py and test_undecodable.py."""

from __future__ import annotations

import pytest
from builders import LIMITS, T0, open_txn, snapshot

from admin.proposals.watch import Watch, WatchEvent
from detectors.abort import plan_abort
from detectors.models import (
    AbortCandidate,
    AuditOutcome,
    AuditRecord,
    CandidateStatus,
    CoordinatorRole,
    HangingReason,
    VerdictKind,
    WithheldReason,
)
from detectors.rules import Decision, classify
from detectors.tracking import WITHDRAWN_BY, withdrawal_audit, withdraws_proof

pytestmark = pytest.mark.unit

REASON = "UNCONFIRMED (would be HANGING coordinator-completed; coordinator-view-behind): ..."


def candidate() -> AbortCandidate:
    txn = open_txn(start_timestamp_ms=T0, last_timestamp_ms=T0)
    s = snapshot(txn)
    verdict = classify(txn, s, None, now_ms=s.observed_at_ms, limits=LIMITS, view_current_ms=s.observed_at_ms)
    return plan_abort(s, txn, verdict, first_detected_ms=s.observed_at_ms)


def test_a_withdrawn_candidate_carries_when_and_why() -> None:
    c = candidate().withdrawn(withdrawn_at_ms=T0 + 99, reason=REASON)
    assert (c.status, c.resolved_at_ms, c.withdrawn_reason) == (CandidateStatus.WITHDRAWN, T0 + 99, REASON)
    assert AbortCandidate.model_validate_json(c.model_dump_json()) == c
    with pytest.raises(ValueError, match="withdrawn_reason"):
        AbortCandidate.model_validate({**c.model_dump(), "withdrawn_reason": None})
    # Proven again and then ended: RESOLVED drops the old reason.
    assert c.resolved(resolved_at_ms=T0 + 200).withdrawn_reason is None


def test_the_withdrawal_is_an_audit_record_beside_the_abort_attempts() -> None:
    c = candidate().withdrawn(withdrawn_at_ms=T0 + 99, reason=REASON)
    a = withdrawal_audit(c)
    assert (a.outcome, a.actor, a.at_ms, a.execute) == (AuditOutcome.WITHDRAWN, WITHDRAWN_BY, T0 + 99, False)
    assert a.candidate_id == c.candidate_id and REASON in a.message and a.marker is None
    assert AuditRecord.model_validate_json(a.model_dump_json()) == a
    with pytest.raises(ValueError, match="not WITHDRAWN"):
        withdrawal_audit(candidate())


def test_watch_drops_a_withdrawn_candidate_and_says_why() -> None:
    events: list[WatchEvent] = []
    tried: list[str] = []
    c = candidate()

    def attempt(x: AbortCandidate) -> AuditRecord:
        tried.append(x.candidate_id)
        raise AssertionError("no policy: nothing is tried")

    w = Watch(c.cluster, None, attempt, events.append)
    kv = [(c.candidate_id.encode(), c.model_dump_json().encode())]
    w.take(kv, T0)
    withdrawn = c.withdrawn(withdrawn_at_ms=T0 + 5, reason=REASON)
    w.take([(c.candidate_id.encode(), withdrawn.model_dump_json().encode())], T0 + 5)
    assert [(e.kind, e.detail) for e in events] == [("OPENED", c.explanation), ("WITHDRAWN", REASON)]
    assert w.pending == {}
    w.take(kv, T0 + 10)  # proposed again later: pending again
    assert [e.kind for e in events][-1] == "OPENED" and c.candidate_id in w.pending


def test_a_view_behind_a_newer_report_does_not_withdraw_a_proof() -> None:
    """A Kafka outage: the reports after it are newer than any position the view covers (UNCONFIRMED
    coordinator-view-behind), but the proof was made on a view current while the transaction was open, and a
    transaction no coordinator would close then is one still: the candidate stays (else every outage withdrew
    and re-opened every candidate; tests/e2e/test_faults_e2e.py). A lost record of the owner, or a disproof, does
    withdraw it."""
    current = CoordinatorRole.CURRENT
    behind = Decision(
        VerdictKind.UNCONFIRMED,
        HangingReason.COORDINATOR_COMPLETED,
        current,
        WithheldReason.COORDINATOR_VIEW_BEHIND,
    )
    assert not withdraws_proof(behind, False)
    assert withdraws_proof(behind._replace(withheld=WithheldReason.COORDINATOR_RECORD_UNDECODABLE), False)
    assert withdraws_proof(behind._replace(withheld=WithheldReason.COORDINATOR_LOG_REWOUND), False)
    # Waiting for the grace after the owner retired or began another transaction: not a disproof.
    assert not withdraws_proof(Decision(VerdictKind.OPEN, None, CoordinatorRole.NONE), False)
    # The coordinator's transaction lists the partition after all: disproved.
    assert withdraws_proof(Decision(VerdictKind.OPEN, None, current), True)
    assert not withdraws_proof(
        Decision(VerdictKind.HANGING, HangingReason.COORDINATOR_COMPLETED, current), True
    )
