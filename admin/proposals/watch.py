"""`txnwatch proposals watch`: follow the abort candidates as the job proposes them; with `--auto-abort --policy
policy.yaml`, try the ones the policy allows through the same verified abort as `proposals abort --execute`.

The loop is written against small callables (the next records of the candidates topic, the verified abort, the
clock, the printer) so its decisions are tested without a cluster; admin/cli/main.py wires them to Kafka.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from admin.proposals.verified_marker import latest_candidates
from common.text import duration, iso
from detectors.abort import (
    ALLOW_LEADER_CHANGE_FLAG,
    ALLOW_LIVE_OWNER_FLAG,
    LEADER_CHANGED_SINCE_START,
    LIVE_OWNER_SAME_EPOCH,
    candidate_age_ms,
    lso_lag,
    resolved_by_audit,
)
from detectors.models import AbortCandidate, AuditOutcome, AuditRecord, CandidateStatus
from detectors.policy import AbortPolicy, decide, wrote_a_marker

# A refusal named by its first word, as verification names its own (`live-owner-same-epoch: ...`).
_NAMED_REFUSAL = re.compile(r"([a-z0-9]+(?:-[a-z0-9]+)+): ")


class PolicyError(ValueError):
    """The policy file is missing, unreadable or invalid; the message is one line for the operator."""


def load_policy(path: Path) -> AbortPolicy:
    """The policy in a YAML (or JSON) file.

    Raises:
        PolicyError: the file cannot be read, is not YAML, or breaks the policy's schema (each problem named by
            its field).
    """
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise PolicyError(f"cannot read the policy {path}: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise PolicyError(f"the policy {path} is not valid YAML: {exc}".replace("\n", " ")) from exc
    if not isinstance(data, dict):
        raise PolicyError(
            f"the policy {path} must be a mapping (reasons, min_age_s, ...), not {type(data).__name__}"
        )
    try:
        return AbortPolicy.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(top)'}: {e['msg']}"
            for e in exc.errors(include_url=False)
        )
        raise PolicyError(f"the policy {path} is invalid: {problems}") from exc


@dataclass(frozen=True)
class WatchEvent:
    """One line of `watch` output.

    kind: OPENED (a pending candidate, at start or when the job proposes it), RESOLVED (the job saw it end),
    WITHDRAWN (the job took the proposal back: its proof no longer holds),
    HELD (the policy does not allow it now, and why), ABORT (an auto-abort attempt and its audit outcome).
    """

    kind: str
    candidate: AbortCandidate
    at_ms: int
    detail: str = ""
    audit: AuditRecord | None = None

    def as_json(self) -> dict[str, Any]:
        c = self.candidate
        out: dict[str, Any] = {
            "event": self.kind,
            "at_ms": self.at_ms,
            "candidate_id": c.candidate_id,
            "topic": c.topic,
            "partition": c.partition,
            "start_offset": c.start_offset,
            "reason": c.reason.value,
            "lso_lag": lso_lag(c),
            "age_ms": candidate_age_ms(c, self.at_ms),
            "detail": self.detail,
        }
        if self.audit is not None:
            out["outcome"] = self.audit.outcome.value
            out["audit_id"] = self.audit.audit_id
            out["refusals"] = list(named_refusals(self.audit))
        return out

    def as_line(self) -> str:
        c = self.candidate
        lag = lso_lag(c)
        head = (
            f"{iso(self.at_ms)} {self.kind:<8} {c.candidate_id} {c.topic}-{c.partition}@{c.start_offset} "
            f"{c.reason.value}, open {duration(candidate_age_ms(c, self.at_ms))}, LSO lag "
            f"{'?' if lag is None else lag}"
        )
        return f"{head}: {self.detail}" if self.detail else head


@dataclass
class Watch:
    """The state of one `watch` run.

    Args:
        cluster: only this cluster's candidates.
        policy: None: print only. Else `--auto-abort` with this policy.
        attempt: the verified abort with --execute, its ending record published; returns that record.
        emit: prints one event.
        done: candidate ids the audit log shows need nothing more (printed as nothing).
        aborts_at_ms: when this actor's earlier aborts happened (for max_aborts_per_hour).
    """

    cluster: str
    policy: AbortPolicy | None
    attempt: Callable[[AbortCandidate], AuditRecord]
    emit: Callable[[WatchEvent], None]
    done: set[str] = field(default_factory=set)
    aborts_at_ms: list[int] = field(default_factory=list)
    pending: dict[str, AbortCandidate] = field(default_factory=dict)
    tried: set[str] = field(default_factory=set)
    held_by: dict[str, str] = field(default_factory=dict)

    def take(self, records: Iterable[tuple[Any, Any]], now_ms: int) -> None:
        """Apply records of the candidates topic: new OPENED candidates are printed, RESOLVED ones dropped."""
        latest, _malformed = latest_candidates(records)
        for c in latest.values():
            if c.cluster != self.cluster:
                continue
            known = c.candidate_id in self.pending
            if c.status is CandidateStatus.RESOLVED:
                if known:
                    del self.pending[c.candidate_id]
                    self.emit(WatchEvent("RESOLVED", c, now_ms, "the job saw the transaction end"))
                continue
            if c.status is CandidateStatus.WITHDRAWN:
                if known:
                    del self.pending[c.candidate_id]
                    self.emit(WatchEvent("WITHDRAWN", c, now_ms, c.withdrawn_reason or "no longer proven"))
                continue
            if known or c.candidate_id in self.done:
                continue
            self.pending[c.candidate_id] = c
            self.emit(WatchEvent("OPENED", c, now_ms, c.explanation))

    def act(self, now_ms: int) -> None:
        """With a policy: try every pending candidate it allows now (once per run each)."""
        if self.policy is None:
            return
        for c in sorted(self.pending.values(), key=lambda c: c.first_detected_ms):
            if c.candidate_id in self.tried:
                continue
            recent = sum(1 for t in self.aborts_at_ms if now_ms - t < 3_600_000)
            decision = decide(self.policy, c, now_ms=now_ms, aborts_last_hour=recent)
            if not decision.allowed:
                if self.held_by.get(c.candidate_id) != decision.held_by:
                    self.held_by[c.candidate_id] = decision.held_by or ""
                    self.emit(WatchEvent("HELD", c, now_ms, decision.why))
                continue
            self.tried.add(c.candidate_id)
            record = self.attempt(c)
            if wrote_a_marker(record):  # a COLLISION wrote one too: max_aborts_per_hour counts it
                self.aborts_at_ms.append(record.at_ms)
            if c.candidate_id in resolved_by_audit([record]):  # as `done` is read from the audit log at start
                self.pending.pop(c.candidate_id, None)
                self.done.add(c.candidate_id)
            self.emit(WatchEvent("ABORT", c, now_ms, attempt_detail(record), record))


def named_refusals(record: AuditRecord) -> tuple[str, ...]:
    """The names of the refusals that ended a REFUSED attempt (`live-owner-same-epoch`, `two-phase-commit`,
    `coordinator-listing-incomplete`), in verification's order; a refusal without a name (the state changed since
    the plan) is in the message only."""
    if record.outcome is not AuditOutcome.REFUSED or record.verify is None:
        return ()
    return tuple(m.group(1) for m in map(_NAMED_REFUSAL.match, record.verify.changes) if m is not None)


def attempt_detail(record: AuditRecord) -> str:
    """An ABORT event's detail: the outcome and the audit message; for a waivable refusal (a live owner, a leader
    change), also that watch never waives it (the message's advice to run again with the flag is for a person,
    not for auto-abort)."""
    detail = f"{record.outcome.value}: {record.message}"
    named = named_refusals(record)
    if LIVE_OWNER_SAME_EPOCH in named:
        detail += (
            f". auto-abort never passes {ALLOW_LIVE_OWNER_FLAG} and does not try this candidate again in this run: "
            "once the owner's producer restarted, `proposals abort ID --execute` (or watch again) aborts it"
        )
    if LEADER_CHANGED_SINCE_START in named:
        detail += (
            f". auto-abort never passes {ALLOW_LEADER_CHANGE_FLAG} and does not try this candidate again in this "
            "run: a person checks that it was never committed (docs/runbook.md) and aborts it with the flag"
        )
    return detail


def printer(output: str, write: Callable[[str], None]) -> Callable[[WatchEvent], None]:
    """Events as table lines, or one JSON object per line (`--output json`)."""

    def emit(event: WatchEvent) -> None:
        write(json.dumps(event.as_json()) if output == "json" else event.as_line())

    return emit


def policy_summary(policy: AbortPolicy) -> Sequence[str]:
    return (
        f"reasons {', '.join(r.value for r in policy.reasons)}",
        f"min_age_s {policy.min_age_s:g}",
        f"min_lso_lag {policy.min_lso_lag}",
        f"topics allow {', '.join(policy.topics.allow)}"
        + (f" deny {', '.join(policy.topics.deny)}" if policy.topics.deny else ""),
        f"max_aborts_per_hour {policy.max_aborts_per_hour}",
    )
