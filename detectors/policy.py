"""The auto-abort policy of `txnwatch proposals watch --auto-abort --policy policy.yaml` (pure): which candidates
may be tried, from one explicit file with no defaults but `topics.deny`. An allowed candidate still goes through
the whole verified abort. The file's fields and the risks: docs/proposals.md, "watch".
"""

from __future__ import annotations

from collections.abc import Iterable
from fnmatch import fnmatchcase

from pydantic import Field, field_validator

from detectors.abort import candidate_age_ms, lso_lag
from detectors.models import AbortCandidate, AuditOutcome, AuditRecord, HangingReason, Model

HOUR_MS = 3_600_000


class TopicRules(Model):
    allow: tuple[str, ...] = Field(min_length=1)
    deny: tuple[str, ...] = ()


class AbortPolicy(Model):
    """What `--auto-abort` may abort, as written by an operator (YAML or JSON, validated here)."""

    reasons: tuple[HangingReason, ...] = Field(min_length=1)
    min_age_s: float = Field(ge=0)
    min_lso_lag: int = Field(ge=0)
    topics: TopicRules
    max_aborts_per_hour: int = Field(ge=1)

    @field_validator("reasons")
    @classmethod
    def _never_a_lost_commit(cls, reasons: tuple[HangingReason, ...]) -> tuple[HangingReason, ...]:
        # Its remedy is a COMMIT, restoring what the coordinator decided, never an abort; and a person writes it.
        if HangingReason.LOST_COMMIT_MARKER in reasons:
            raise ValueError(
                "lost-commit-marker cannot be auto-aborted: its remedy is a COMMIT "
                "(`txnwatch proposals commit`), written by a person"
            )
        return reasons


class PolicyDecision(Model):
    allowed: bool
    why: str
    # The policy field that holds the candidate back (None when allowed): `watch` prints a hold once per field.
    held_by: str | None = None


def topic_allowed(rules: TopicRules, topic: str) -> str | None:
    """None when the topic may be aborted on, else why not."""
    denied = next((p for p in rules.deny if fnmatchcase(topic, p)), None)
    if denied is not None:
        return f"topic {topic} matches deny pattern {denied!r}"
    if not any(fnmatchcase(topic, p) for p in rules.allow):
        return f"topic {topic} matches no allow pattern ({', '.join(rules.allow)})"
    return None


def wrote_a_marker(record: AuditRecord) -> bool:
    """The attempt wrote an ABORT marker, or may have: ABORTED did, and so did a COLLISION (its marker aborted the
    orphan and what the live owner wrote with it); so did a FAILED attempt whose post-check failed after its
    marker, and one whose marker was lost in flight may have (`marker_written` None). `max_aborts_per_hour` limits
    markers, so each of these counts."""
    return (
        record.outcome in (AuditOutcome.ABORTED, AuditOutcome.COLLISION) or record.marker_written is not False
    )


def abort_times(audits: Iterable[AuditRecord], *, actor: str) -> list[int]:
    """When this actor's attempts wrote a marker (`wrote_a_marker`), from its audit records: what
    `max_aborts_per_hour` counts."""
    return [a.at_ms for a in audits if a.actor == actor and wrote_a_marker(a)]


def aborts_in_last_hour(audits: Iterable[AuditRecord], *, actor: str, now_ms: int) -> int:
    """Markers this actor wrote in the hour before `now_ms` (`abort_times`, from the audit topic)."""
    return sum(1 for at_ms in abort_times(audits, actor=actor) if now_ms - at_ms < HOUR_MS)


def decide(
    policy: AbortPolicy, candidate: AbortCandidate, *, now_ms: int, aborts_last_hour: int
) -> PolicyDecision:
    """May `--auto-abort` try this candidate now? Each refusal names the policy field that stops it.

    Args:
        policy: the operator's policy.
        candidate: an OPENED candidate.
        now_ms: the clock its age is measured on.
        aborts_last_hour: `aborts_in_last_hour` for the watch's actor.
    """
    where = f"{candidate.topic}-{candidate.partition}@{candidate.start_offset}"
    if candidate.reason not in policy.reasons:
        allowed = ", ".join(r.value for r in policy.reasons)
        why = f"{where}: reason {candidate.reason.value} is not in reasons ({allowed})"
        return PolicyDecision(allowed=False, why=why, held_by="reasons")
    topic = topic_allowed(policy.topics, candidate.topic)
    if topic is not None:
        return PolicyDecision(allowed=False, why=f"{where}: {topic}", held_by="topics")
    age_ms = candidate_age_ms(candidate, now_ms)
    if age_ms < policy.min_age_s * 1000:
        return PolicyDecision(
            allowed=False,
            why=f"{where}: open {age_ms / 1000:.0f}s, under min_age_s {policy.min_age_s:g}",
            held_by="min_age_s",
        )
    lag = lso_lag(candidate)
    if (lag is None and policy.min_lso_lag > 0) or (lag is not None and lag < policy.min_lso_lag):
        shown = "unknown" if lag is None else str(lag)
        return PolicyDecision(
            allowed=False,
            why=f"{where}: LSO lag {shown}, under min_lso_lag {policy.min_lso_lag}",
            held_by="min_lso_lag",
        )
    if aborts_last_hour >= policy.max_aborts_per_hour:
        return PolicyDecision(
            allowed=False,
            why=f"{where}: {aborts_last_hour} aborts in the last hour, max_aborts_per_hour is "
            f"{policy.max_aborts_per_hour}",
            held_by="max_aborts_per_hour",
        )
    return PolicyDecision(allowed=True, why=f"{where}: {candidate.reason.value}, allowed by the policy")
