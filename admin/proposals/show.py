"""`txnwatch proposals list` and `show`: what they read around a candidate besides the verification (consumer
groups, the transactional id the evidence names, the group an offset commit blocks) and how both print, as a
table and lines for people or as JSON. The abort itself is admin/proposals/verified_marker.py; nothing here writes.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from admin.live.evidence import LiveWire, describe_by_id
from admin.wire.errors import AdminError, WireError, explain
from admin.wire.types import TP, GroupOffsets, GroupStanding, StartBatch, TransactionDescription
from common.text import duration, format_table, iso
from detectors.abort import (
    ALLOW_LIVE_OWNER_FLAG,
    LEADER_CHANGED_SINCE_START,
    LIVE_OWNER_SAME_EPOCH,
    candidate_age_ms,
    candidate_is_two_phase_commit,
    kafka_cli_abort,
    lso_lag,
    refusal_name,
    waiver_flags,
)
from detectors.groups import CONSUMER_OFFSETS_TOPIC
from detectors.models import AbortCandidate, LiveEvidence, VerifyOutcome, VerifyResult, is_two_phase_commit


class ShowWire(LiveWire, Protocol):
    """The seams `admin.wire.kafka_wire.KafkaWire` offers for `show`: the inspection's, plus the consumer groups."""

    def committed_offsets(self, topic: str, partition: int) -> GroupOffsets: ...

    def group_standing(self, group: str, pending: Sequence[TP] = ()) -> GroupStanding: ...


def candidate_row(c: AbortCandidate, now_ms: int) -> dict[str, Any]:
    return {
        "candidate_id": c.candidate_id,
        "topic": c.topic,
        "partition": c.partition,
        "start_offset": c.start_offset,
        "producer_id": c.spec.producer_id,
        "producer_epoch": c.spec.producer_epoch,
        "reason": c.reason.value,
        "marker": c.spec.transaction_result,
        "lso_lag": lso_lag(c),
        "age_ms": candidate_age_ms(c, now_ms),
        "first_detected_ms": c.first_detected_ms,
        "explanation": c.explanation,
        "kafka_cli": c.kafka_cli,
        "two_phase_commit": candidate_is_two_phase_commit(c),
    }


def render_list(candidates: Sequence[AbortCandidate], now_ms: int) -> str:
    if not candidates:
        return "no pending abort candidates"
    rows = [
        [
            "Candidate",
            "Topic",
            "Partition",
            "StartOffset",
            "ProducerId",
            "Epoch",
            "LsoLag",
            "Age",
            "Reason",
            "Marker",
        ]
    ]
    for c in candidates:
        lag = lso_lag(c)
        rows.append(
            [
                c.candidate_id,
                c.topic,
                str(c.partition),
                str(c.start_offset),
                str(c.spec.producer_id),
                str(c.spec.producer_epoch),
                "-" if lag is None else str(lag),
                duration(candidate_age_ms(c, now_ms)),
                c.reason.value,
                c.spec.transaction_result,
            ]
        )
    return format_table(rows)


@dataclass(frozen=True)
class ActWith:
    """How the operator reaches the cluster: what the two ways to act must repeat."""

    bootstrap: str
    cluster: str
    topic_prefix: str
    command_config: str | None = None

    def txnwatch(
        self, c: AbortCandidate, *, allow_live_owner: bool = False, flags: Sequence[str] = ()
    ) -> str:
        """The verified command for the candidate's own marker: `abort`, or `commit` for a lost commit; with
        `flags` (the waivers verification asks for, `detectors.abort.waiver_flags`) after `--execute`."""
        config = f" --command-config {shlex.quote(self.command_config)}" if self.command_config else ""
        wanted = [*([ALLOW_LIVE_OWNER_FLAG] if allow_live_owner else []), *flags]
        waive = "".join(f" {f}" for f in dict.fromkeys(wanted))
        command = "commit" if c.spec.transaction_result == "COMMIT" else "abort"
        return (
            f"txnwatch proposals {command} {c.candidate_id} --bootstrap-server {shlex.quote(self.bootstrap)}"
            f"{config} --cluster {shlex.quote(self.cluster)} --topic-prefix {shlex.quote(self.topic_prefix)} "
            f"--execute{waive}"
        )

    def kafka_cli(self, c: AbortCandidate) -> str:
        """Kafka's own line, which can only abort: for a lost commit, the candidate's note that there is none."""
        if c.spec.transaction_result == "COMMIT":
            return c.kafka_cli
        return kafka_cli_abort(
            topic=c.topic,
            partition=c.partition,
            start_offset=c.start_offset,
            bootstrap=self.bootstrap,
            command_config=self.command_config,
        )


@dataclass(frozen=True)
class Surroundings:
    """What `show` reads besides the verification's evidence: the consumer groups' committed offsets (who is
    stuck), and the current record of the transactional id the candidate's evidence names, when it no longer owns
    the producer id (or why it could not be read)."""

    groups: GroupOffsets
    named: TransactionDescription | None = None
    named_error: str | None = None
    # On `__consumer_offsets`: the group whose pending offset commit this is, as it stands now (None elsewhere;
    # a standing with an empty group name and an error when the start batch could not tell).
    blocked: GroupStanding | None = None


def look_around(wire: ShowWire, candidate: AbortCandidate, live: LiveEvidence) -> Surroundings:
    groups = wire.committed_offsets(candidate.topic, candidate.partition)
    blocked = blocked_group(wire, candidate, live) if candidate.topic == CONSUMER_OFFSETS_TOPIC else None
    named = candidate.evidence.coordinator.transactional_id if candidate.evidence.coordinator else None
    if named is None or (live.coordinator is not None and live.coordinator.transactional_id == named):
        return Surroundings(groups, blocked=blocked)
    try:
        d = describe_by_id(wire, [named]).get(named)
    except (AdminError, WireError) as exc:
        return Surroundings(groups, named_error=f"DescribeTransactions {named}: {exc}", blocked=blocked)
    if d is None or d.error is not None:
        error = "NOT_DESCRIBED" if d is None else d.error or ""
        return Surroundings(
            groups, named_error=explain("DescribeTransactions", error, named), blocked=blocked
        )
    return Surroundings(groups, named=d, blocked=blocked)


def blocked_group(wire: ShowWire, candidate: AbortCandidate, live: LiveEvidence) -> GroupStanding:
    """The consumer group a hanging transaction on `__consumer_offsets` blocks, and how it stands now.

    The start batch, read now, names the group and the partitions whose offsets are pending (its record keys);
    the evidence's group (the collector read the same keys) stands in when the batch cannot be read. Only that
    group's offsets are pending: other groups placed on the partition still fetch theirs (they are listed as
    neighbours: their partition cannot be compacted past the LSO).
    """
    tp, offset = (candidate.topic, candidate.partition), candidate.start_offset
    got = wire.fetch_start_batches({live.leader: [(tp, offset)]}).get((tp, offset))
    if isinstance(got, StartBatch) and got.offset_commit_group is not None:
        return wire.group_standing(got.offset_commit_group, got.offset_commit_partitions)
    if candidate.evidence.offset_commit_group is not None:
        return wire.group_standing(candidate.evidence.offset_commit_group)
    why = "holds no offset commit record" if isinstance(got, StartBatch) else f"could not be read ({got})"
    return GroupStanding("", error=f"the start batch {why}")


def refused_only_for_a_live_owner(verify: VerifyResult) -> bool:
    """Verification refused the abort for `live-owner-same-epoch` and nothing else: `--allow-live-owner` alone is
    what stands between the operator and the abort (JSON `act.txnwatch_allow_live_owner`)."""
    return waiver_flags(verify) == (ALLOW_LIVE_OWNER_FLAG,)


def flags_offered(verify: VerifyResult) -> tuple[str, ...]:
    """The flags `show` offers: only when every refusal is a waivable one (`live-owner-same-epoch`,
    `leader-changed-since-start`), exactly the flags that waive them (`detectors.abort.waiver_flags`). A safe
    abort needs no flag, and another refusal is not lifted by any."""
    return waiver_flags(verify)


def _only_if(c: AbortCandidate, live: LiveEvidence, verify: VerifyResult) -> dict[str, str]:
    """What the operator must know before waiving each refusal of `verify`, by refusal name."""
    where = f"{c.topic}-{c.partition}"
    names = {refusal_name(line) for line in verify.changes}
    clauses = {}
    if LIVE_OWNER_SAME_EPOCH in names:
        clauses[LIVE_OWNER_SAME_EPOCH] = f"{_owner(live)} no longer writes to {where}"
    if LEADER_CHANGED_SINCE_START in names:
        clauses[LEADER_CHANGED_SINCE_START] = f"{where}'s log and its coordinator show it was never committed"
    return clauses


def _owner(live: LiveEvidence) -> str:
    return live.coordinator.transactional_id if live.coordinator else "its transactional id"


def kafka_tool_offered(verify: VerifyResult) -> bool:
    """Kafka's `kafka-transactions.sh abort` line is shown only while verification says SAFE: the tool re-checks
    nothing, so on a refusal (the coordinator owns the transaction, the owner is live at the orphan's epoch, it
    changed since the plan) it would write the very marker txnwatch refused. Even then it is the second way, for
    whoever holds the cluster permission without txnwatch (docs/runbook.md, step 4)."""
    return verify.outcome is VerifyOutcome.SAFE


def stuck_groups(live: LiveEvidence, groups: GroupOffsets) -> dict[str, int]:
    """The consumer groups whose committed offset on the partition is at or past its LSO: a `read_committed`
    member gets nothing beyond the LSO, so these wait on the hanging transaction (who is stuck)."""
    lso = live.last_stable_offset
    if lso is None:
        return {}
    return {g: o for g, o in sorted(groups.offsets.items()) if o >= lso}


def show_json(
    c: AbortCandidate,
    live: LiveEvidence,
    verify: VerifyResult,
    act: ActWith,
    now_ms: int,
    around: Surroundings,
) -> dict[str, Any]:
    named = around.named
    return {
        "candidate": {**candidate_row(c, now_ms), "status": c.status.value},
        "live": live.model_dump(mode="json"),
        "live_lso_lag": _lag(live),
        "stuck_groups": stuck_groups(live, around.groups),
        "groups_error": around.groups.error,
        "blocked_group": None if around.blocked is None else around.blocked._asdict(),
        "named_transactional_id": None
        if named is None
        else {
            "transactional_id": named.transactional_id,
            "state": named.state,
            "producer_id": named.producer_id,
            "producer_epoch": named.producer_epoch,
            "partition_listed": (c.topic, c.partition) in named.partitions,
        },
        "named_error": around.named_error,
        "verify": verify.model_dump(mode="json"),
        "act": {
            "txnwatch": act.txnwatch(c),
            # Only when the live owner is the one refusal (`refused_only_for_a_live_owner`); else null.
            "txnwatch_allow_live_owner": act.txnwatch(c, allow_live_owner=True)
            if refused_only_for_a_live_owner(verify)
            else None,
            # Only when every refusal is a waivable one: the command with exactly the flags that waive them
            # (`flags_offered`); else null.
            "txnwatch_waiving": act.txnwatch(c, flags=flags_offered(verify))
            if flags_offered(verify)
            else None,
            # Only while verification says SAFE (`kafka_tool_offered`); else null.
            "kafka_cli": act.kafka_cli(c) if kafka_tool_offered(verify) else None,
        },
    }


def render_blocked(b: GroupStanding, partition: int) -> list[str]:
    """`show`'s lines for a transaction on `__consumer_offsets`: whom it blocks (the LSO means nothing there)."""
    if not b.group:
        return [f"  blocked     unknown consumer group: {b.error}"]
    if b.error is not None:
        return [f"  blocked     consumer group {b.group} (its pending offset commit); now unknown: {b.error}"]
    members = "?" if b.members is None else str(b.members)
    fetch = {
        True: "its OffsetFetch with require_stable answers UNSTABLE_OFFSET_COMMIT now: read_committed members "
        "(Kafka Streams exactly-once) cannot start or rebalance",
        False: "its OffsetFetch with require_stable answers without UNSTABLE_OFFSET_COMMIT now",
        None: "",
    }[b.unstable]
    lines = [
        f"  blocked     consumer group {b.group} ({b.state or 'state unknown'}, {members} members): {fetch}"
    ]
    if b.neighbours:
        lines.append(
            f"  placed too  {', '.join(b.neighbours)} (on __consumer_offsets-{partition}: their offsets still "
            "fetch, but the partition is not compacted past the LSO)"
        )
    return lines


def _lag(live: LiveEvidence) -> int | None:
    if live.high_watermark is None or live.last_stable_offset is None:
        return None
    return live.high_watermark - live.last_stable_offset


def render_show(
    c: AbortCandidate,
    live: LiveEvidence,
    verify: VerifyResult,
    act: ActWith,
    now_ms: int,
    around: Surroundings,
) -> str:
    p = live.producer
    lines = [
        f"candidate {c.candidate_id} ({c.status.value}): {c.topic}-{c.partition} offset {c.start_offset}",
        f"  verdict     HANGING {c.reason.value}"
        f"{' [two-phase commit]' if candidate_is_two_phase_commit(c) else ''}: {c.explanation}",
        f"  planned     producer {c.spec.producer_id} epoch {c.spec.producer_epoch}, coordinator epoch "
        f"{c.spec.coordinator_epoch}; open since {iso(c.evidence.open_since_ms)} "
        f"({duration(candidate_age_ms(c, now_ms))} ago), first detected {iso(c.first_detected_ms)}",
        f"  live        leader {live.leader} at {iso(live.observed_at_ms)}: LSO {live.last_stable_offset}, "
        f"HW {live.high_watermark} ({_lag(live) if _lag(live) is not None else '?'} records held back from "
        "read_committed readers)",
        "  leader      "
        + (
            f"producer {p.producer_id} epoch {p.producer_epoch}, coordinator epoch {p.coordinator_epoch}, "
            f"open transaction at {p.current_txn_start_offset if p.current_txn_start_offset >= 0 else 'none'}"
            if p is not None
            else f"no longer lists producer {c.spec.producer_id}"
        ),
    ]
    co = live.coordinator
    if live.coordinator_error is not None:
        lines.append(f"  coordinator unknown: {live.coordinator_error}")
    elif co is None:
        lines.append(f"  coordinator no transactional id owns producer {c.spec.producer_id}")
    else:
        lines.append(
            f"  coordinator {co.transactional_id} on broker {co.coordinator}: {co.state}, producer "
            f"{co.producer_id} epoch {co.producer_epoch}, {c.topic}-{c.partition} "
            f"{'listed' if co.partition_listed else 'not listed'}"
            f"{', two-phase commit (no timeout)' if is_two_phase_commit(co.transaction_timeout_ms) else ''}"
        )
    if around.named is not None:
        n = around.named
        lines.append(
            f"  named id    {n.transactional_id} (named by the evidence) now: {n.state}, producer {n.producer_id} "
            f"epoch {n.producer_epoch}; it no longer owns producer {c.spec.producer_id}"
        )
    elif around.named_error is not None:
        lines.append(f"  named id    unknown: {around.named_error}")
    if live.other_open:
        lines.append("  also open   " + ", ".join(f"producer {pid} at {off}" for pid, off in live.other_open))
    groups = around.groups
    stuck = stuck_groups(live, groups)
    if around.blocked is not None:
        lines += render_blocked(around.blocked, c.partition)
    elif groups.error is not None:
        lines.append(f"  stuck       unknown: {explain('ListGroups/OffsetFetch', groups.error)}")
    elif stuck:
        lines.append(
            "  stuck       consumer groups at the LSO (read_committed members wait here): "
            + ", ".join(f"{g} (committed {o})" for g, o in stuck.items())
        )
    else:
        lines.append(
            f"  stuck       no consumer group has committed up to the LSO of {c.topic}-{c.partition}"
        )
    lines.append(
        f"  verify now  {verify.outcome.value}" + (": " + "; ".join(verify.changes) if verify.changes else "")
    )
    if verify.outcome is VerifyOutcome.ALREADY_RESOLVED:
        lines.append("  act         nothing to do")
    elif candidate_is_two_phase_commit(c):
        # `abort` refuses it (two-phase-commit): point at what ends a KIP-939 transaction instead.
        tid = c.evidence.coordinator.transactional_id if c.evidence.coordinator else "<transactional-id>"
        lines.append(
            "  act         two-phase commit (KIP-939): its transaction manager decides; or Kafka 4.1+: "
            f"kafka-transactions.sh --bootstrap-server {shlex.quote(act.bootstrap)} forceTerminateTransaction "
            f"--transactionalId {shlex.quote(tid)}"
        )
    elif flags := flags_offered(verify):
        # Every refusal is one the operator may waive, knowing what verification cannot. The owner's restart
        # (InitProducerId moves its epoch) lifts a live owner's refusal without its flag; the flags are for what
        # the operator has checked. Kafka's tool checks none of it.
        clauses = _only_if(c, live, verify)
        if ALLOW_LIVE_OWNER_FLAG in flags:
            rest = [f for f in flags if f != ALLOW_LIVE_OWNER_FLAG]
            when = f"once {_owner(live)}'s producer restarted" + "".join(
                f", and only if {clause}" for name, clause in clauses.items() if name != LIVE_OWNER_SAME_EPOCH
            )
            lines.append(f"  act ({when}):  " + act.txnwatch(c, flags=rest))
        lines.append(f"  act (only if {' and '.join(clauses.values())}):  " + act.txnwatch(c, flags=flags))
    else:
        lines.append("  act (verified, dry run without --execute):  " + act.txnwatch(c))
        if kafka_tool_offered(verify):
            lines.append("  act (Kafka's tool, re-checks nothing):      " + act.kafka_cli(c))
    return "\n".join(lines)
