"""The auto-abort policy (`detectors.policy`), its file (`admin.proposals.watch.load_policy`) and the `watch` loop's
decisions (`admin.proposals.watch.Watch`) on scripted candidates: what is printed, what is tried, what is held and why."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from builders import HOUR, LIMITS, MINUTE, T0, open_txn, snapshot

from admin.proposals.watch import PolicyError, Watch, WatchEvent, load_policy
from detectors.abort import plan_abort
from detectors.models import (
    AbortCandidate,
    AuditOutcome,
    AuditRecord,
    CandidateStatus,
    HangingReason,
    PostCheck,
    VerifyOutcome,
    VerifyResult,
)
from detectors.policy import (
    AbortPolicy,
    TopicRules,
    aborts_in_last_hour,
    decide,
    topic_allowed,
    wrote_a_marker,
)
from detectors.rules import classify

pytestmark = pytest.mark.unit

NOW = T0 + HOUR


def candidate(topic: str = "orders", producer_id: int = 1000, **snap: Any) -> AbortCandidate:
    txn = open_txn(producer_id=producer_id, start_timestamp_ms=T0, last_timestamp_ms=T0)
    s = snapshot(txn, topic=topic, **snap)
    verdict = classify(txn, s, None, now_ms=s.observed_at_ms, limits=LIMITS, view_current_ms=s.observed_at_ms)
    return plan_abort(s, txn, verdict, first_detected_ms=s.observed_at_ms)


def policy(**overrides: Any) -> AbortPolicy:
    fields: dict[str, Any] = {
        "reasons": [HangingReason.NO_COORDINATOR_STATE],
        "min_age_s": 600,
        "min_lso_lag": 1,
        "topics": {"allow": ["orders*"], "deny": ["orders-audit"]},
        "max_aborts_per_hour": 2,
    }
    fields.update(overrides)
    return AbortPolicy.model_validate(fields)


def test_candidate_inside_the_policy_is_allowed() -> None:
    c = candidate()
    assert c.reason is HangingReason.NO_COORDINATOR_STATE
    decision = decide(policy(), c, now_ms=NOW, aborts_last_hour=0)
    assert decision.allowed, decision.why


@pytest.mark.parametrize(
    ("changes", "topic", "now", "recent", "why"),
    [
        ({"reasons": [HangingReason.COORDINATOR_COMPLETED]}, "orders", NOW, 0, "is not in reasons"),
        ({}, "payments", NOW, 0, "matches no allow pattern"),
        ({}, "orders-audit", NOW, 0, "matches deny pattern 'orders-audit'"),
        ({}, "orders", T0 + 5 * MINUTE, 0, "under min_age_s 600"),
        ({"min_lso_lag": 10_000}, "orders", NOW, 0, "under min_lso_lag 10000"),
        ({}, "orders", NOW, 2, "max_aborts_per_hour is 2"),
    ],
)
def test_each_policy_field_holds_what_it_should(
    changes: dict[str, Any], topic: str, now: int, recent: int, why: str
) -> None:
    decision = decide(policy(**changes), candidate(topic), now_ms=now, aborts_last_hour=recent)
    assert not decision.allowed and why in decision.why


def test_deny_wins_over_allow() -> None:
    rules = TopicRules(allow=("*",), deny=("secret-*",))
    assert topic_allowed(rules, "orders") is None
    assert topic_allowed(rules, "secret-keys") is not None


def test_aborts_in_last_hour_counts_only_this_actors_markers() -> None:
    c = candidate()

    def rec(actor: str, outcome: AuditOutcome, at_ms: int) -> AuditRecord:
        return AuditRecord(
            audit_id=f"{actor}{at_ms}{outcome}",
            candidate_id=c.candidate_id,
            cluster=c.cluster,
            topic=c.topic,
            partition=c.partition,
            start_offset=c.start_offset,
            actor=actor,
            at_ms=at_ms,
            execute=True,
            plan=c.spec,
            candidate_evidence=c.evidence,
            outcome=outcome,
            message="",
        )

    audits = [
        rec("auto-abort:ops", AuditOutcome.ABORTED, NOW - 10 * MINUTE),
        rec("auto-abort:ops", AuditOutcome.ABORTED, NOW - 2 * HOUR),  # too old
        rec("auto-abort:ops", AuditOutcome.REFUSED, NOW - MINUTE),  # no marker
        rec("alice", AuditOutcome.ABORTED, NOW - MINUTE),  # another actor
    ]
    assert aborts_in_last_hour(audits, actor="auto-abort:ops", now_ms=NOW) == 1


def test_a_collision_and_any_marker_written_or_maybe_written_count_as_aborts() -> None:
    """max_aborts_per_hour limits markers: a COLLISION wrote one (it aborted the orphan and what the live owner
    wrote with it), as did a FAILED attempt whose post-check failed after its marker; one lost in flight may have.
    Each counts; a claim, a dry run or a refusal wrote nothing."""
    wrote = [
        record(candidate(), AuditOutcome.COLLISION).model_copy(update={"marker_written": True}),
        record(candidate(), AuditOutcome.FAILED).model_copy(update={"marker_written": True}),
        record(candidate(), AuditOutcome.FAILED).model_copy(update={"marker_written": None}),
    ]
    nothing = [
        record(candidate(), outcome)
        for outcome in (AuditOutcome.CLAIMED, AuditOutcome.DRY_RUN, AuditOutcome.REFUSED, AuditOutcome.FAILED)
    ]
    assert [wrote_a_marker(r) for r in wrote + nothing] == [True] * 3 + [False] * 4
    assert aborts_in_last_hour(wrote + nothing, actor="auto-abort:ops", now_ms=NOW) == 3


def test_policy_file_problems_are_one_line_naming_the_field(tmp_path: Path) -> None:
    good = tmp_path / "policy.yaml"
    good.write_text(
        "reasons: [no-coordinator-state, coordinator-completed]\nmin_age_s: 900\nmin_lso_lag: 1\n"
        "topics:\n  allow: ['orders-*']\nmax_aborts_per_hour: 3\n"
    )
    assert load_policy(good).reasons == (
        HangingReason.NO_COORDINATOR_STATE,
        HangingReason.COORDINATOR_COMPLETED,
    )

    cases = {
        "missing.yaml": None,
        "empty.yaml": "",
        "bad-yaml.yaml": "reasons: [unclosed\n",
        "no-limit.yaml": "reasons: [no-coordinator-state]\nmin_age_s: 1\nmin_lso_lag: 1\ntopics: {allow: ['*']}\n",
        "bad-reason.yaml": "reasons: [because]\nmin_age_s: 1\nmin_lso_lag: 1\ntopics: {allow: ['*']}\n"
        "max_aborts_per_hour: 1\n",
        "typo.yaml": "reasons: [no-coordinator-state]\nmin_age: 1\nmin_lso_lag: 1\ntopics: {allow: ['*']}\n"
        "max_aborts_per_hour: 1\n",
    }
    expected = {
        "missing.yaml": "cannot read the policy",
        "empty.yaml": "must be a mapping",
        "bad-yaml.yaml": "not valid YAML",
        "no-limit.yaml": "max_aborts_per_hour: Field required",
        "bad-reason.yaml": "reasons.0: Input should be",
        "typo.yaml": "min_age: Extra inputs are not permitted",
    }
    for name, text in cases.items():
        path = tmp_path / name
        if text is not None:
            path.write_text(text)
        with pytest.raises(PolicyError) as err:
            load_policy(path)
        assert expected[name] in str(err.value) and "\n" not in str(err.value), name


# ---------------------------------------------------------------------------------------- the loop


def record(c: AbortCandidate, outcome: AuditOutcome) -> AuditRecord:
    return AuditRecord(
        audit_id="a",
        candidate_id=c.candidate_id,
        cluster=c.cluster,
        topic=c.topic,
        partition=c.partition,
        start_offset=c.start_offset,
        actor="auto-abort:ops",
        at_ms=NOW,
        execute=True,
        plan=c.spec,
        candidate_evidence=c.evidence,
        outcome=outcome,
        message=outcome.value.lower(),
    )


def loop(
    p: AbortPolicy | None,
    outcome: AuditOutcome = AuditOutcome.ABORTED,
    ending: Callable[[AbortCandidate], AuditRecord] | None = None,
) -> tuple[Watch, list[WatchEvent]]:
    events: list[WatchEvent] = []
    tried: list[str] = []

    def attempt(c: AbortCandidate) -> AuditRecord:
        tried.append(c.candidate_id)
        return ending(c) if ending is not None else record(c, outcome)

    w = Watch(candidate().cluster, p, attempt, events.append)
    return w, events


def kv(c: AbortCandidate) -> tuple[bytes, bytes]:
    return c.candidate_id.encode(), c.model_dump_json().encode()


def test_without_a_policy_watch_only_prints_opened_and_resolved() -> None:
    w, events = loop(None)
    c = candidate()
    w.take([kv(c)], NOW)
    w.act(NOW)
    w.take([kv(c)], NOW)  # the same record again (compaction, restart): printed once
    resolved = c.model_copy(update={"status": CandidateStatus.RESOLVED, "resolved_at_ms": NOW})
    w.take([kv(resolved)], NOW)
    assert [e.kind for e in events] == ["OPENED", "RESOLVED"]


def test_auto_abort_tries_an_allowed_candidate_once() -> None:
    w, events = loop(policy())
    c = candidate()
    w.take([kv(c)], NOW)
    w.act(NOW)
    w.act(NOW + MINUTE)
    assert [e.kind for e in events] == ["OPENED", "ABORT"]
    assert events[1].audit is not None and events[1].audit.outcome is AuditOutcome.ABORTED
    assert w.pending == {} and c.candidate_id in w.done


def test_held_candidate_is_printed_once_per_reason_then_tried_when_old_enough() -> None:
    w, events = loop(policy())
    c = candidate()
    young = T0 + 2 * MINUTE
    w.take([kv(c)], young)
    w.act(young)
    w.act(young + 1000)  # same reason: not printed again
    w.act(NOW)
    assert [e.kind for e in events] == ["OPENED", "HELD", "ABORT"]
    assert "min_age_s" in events[1].detail


def test_rate_limit_counts_this_runs_aborts() -> None:
    w, events = loop(policy(max_aborts_per_hour=1))
    first, second = candidate(producer_id=1000), candidate(producer_id=2000)
    w.take([kv(first), kv(second)], NOW)
    w.act(NOW)
    kinds = [(e.kind, e.candidate.candidate_id) for e in events]
    assert kinds.count(("ABORT", first.candidate_id)) + kinds.count(("ABORT", second.candidate_id)) == 1
    held = [e for e in events if e.kind == "HELD"]
    assert len(held) == 1 and "max_aborts_per_hour is 1" in held[0].detail


def test_other_clusters_and_done_candidates_are_not_printed() -> None:
    w, events = loop(policy())
    c = candidate()
    w.done.add(c.candidate_id)
    other = candidate(cluster="other")
    w.take([kv(c), kv(other)], NOW)
    w.act(NOW)
    assert events == []


LIVE_OWNER = (
    "live-owner-same-epoch: transactional id tx-1 owns producer 1000 at epoch 5, the marker's, and is live "
    "(CompleteCommit, transaction version 0 or unknown): ... or, if it no longer writes to orders-0, run again with "
    "--allow-live-owner"
)


def refused_for_a_live_owner(c: AbortCandidate) -> AuditRecord:
    verify = VerifyResult(outcome=VerifyOutcome.REFUSED, changes=(LIVE_OWNER,))
    return record(c, AuditOutcome.REFUSED).model_copy(
        update={"verify": verify, "message": f"refused, no marker written: {LIVE_OWNER}"}
    )


def test_auto_abort_refused_for_a_live_owner_names_the_refusal_and_never_waives_it() -> None:
    """auto-abort never passes --allow-live-owner: the attempt ends REFUSED, and its event names the refusal (the
    line and the JSON's `refusals`) and says that a person, or the owner's restart, ends it; it is not retried in
    this run, and wrote nothing that counts against the hourly limit."""
    w, events = loop(policy(), ending=refused_for_a_live_owner)
    c = candidate()
    w.take([kv(c)], NOW)
    w.act(NOW)
    w.act(NOW + MINUTE)
    assert [e.kind for e in events] == ["OPENED", "ABORT"]
    event = events[1]
    assert event.as_json()["outcome"] == "REFUSED"
    assert event.as_json()["refusals"] == ["live-owner-same-epoch"]
    assert (
        "REFUSED: refused, no marker written: live-owner-same-epoch: transactional id tx-1" in event.as_line()
    )
    assert "auto-abort never passes --allow-live-owner" in event.detail
    assert c.candidate_id in w.pending and c.candidate_id in w.tried and w.aborts_at_ms == []


def test_a_collision_counts_against_the_hourly_limit_and_leaves_the_pending_list() -> None:
    """A COLLISION wrote its marker (the orphan is aborted, its post-check passed): it is an abort for
    max_aborts_per_hour, and the candidate is done, as the audit log reads it at the next start."""

    def collided(c: AbortCandidate) -> AuditRecord:
        return record(c, AuditOutcome.COLLISION).model_copy(
            update={"marker_written": True, "post_check": PostCheck(ok=True)}
        )

    w, events = loop(policy(max_aborts_per_hour=1), ending=collided)
    first, second = candidate(producer_id=1000), candidate(producer_id=2000)
    w.take([kv(first), kv(second)], NOW)
    w.act(NOW)
    (attempted,) = [e for e in events if e.kind == "ABORT"]
    assert attempted.as_json()["outcome"] == "COLLISION" and attempted.as_json()["refusals"] == []
    assert w.aborts_at_ms == [NOW] and attempted.candidate.candidate_id in w.done
    assert attempted.candidate.candidate_id not in w.pending
    (held,) = [e for e in events if e.kind == "HELD"]
    assert "max_aborts_per_hour is 1" in held.detail
