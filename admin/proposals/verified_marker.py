"""`txnwatch proposals`: reading the abort candidates the streaming job proposed, and the verified abort of one
(or the verified commit of a lost commit marker).

The job writes `AbortCandidate`s to the compacted `<prefix>.abort-candidates` (key = candidate id, OPENED then
RESOLVED). `proposals abort` (`abort`) and `proposals commit` (`commit`, for a `lost-commit-marker` candidate,
whose spec says COMMIT) run the same named steps (`write_marker_verified`, parameterised by the marker's result),
each a function here:

- `plan`: the attempt and the candidate's `WriteTxnMarkersSpec` (built purely by `detectors.abort.plan_abort`);
  `audit_history_ending` ends it when the audit log shows the candidate aborted already;
- `claim` (`--execute` only): a CLAIMED record on the audit log, so concurrent executions write one marker;
- `verify_live`: `observe` (admin/live/evidence.py) reads the partition's leader (DescribeProducers, ListOffsets) and the
  coordinator that owns the producer id (ListTransactions by producer id, DescribeTransactions);
  `detectors.abort.verify_marker` decides for the command's marker (`verified_or_ending`);
- `send_marker`: one WriteTxnMarkers (ABORT, or COMMIT) to the current leader with the coordinator epoch it
  reports (0 when negative, never -1); `marker_answer` maps its error: NOT_LEADER_OR_FOLLOWER (and the other
  leader-moved errors) once means metadata is read again, everything verified again, and the marker goes to the
  new leader;
- `post_check_until` / `post_check_ending`: the transaction is gone and the LSO moved past its start offset
  (`detectors.abort.post_check`; for a COMMIT also a read_committed reader gets the record at the start offset:
  `first_read_committed_offset`), and no live owner of the producer id at the marker's epoch moved meanwhile
  (`detectors.abort.collision_signs`: the coordinator read again after the marker, and the leader; a COLLISION
  otherwise);
- audit: every ending is one `AuditRecord` (`Attempt.end`) to `<prefix>.audit`, whatever the outcome.

What `list` and `show` read and print is admin/proposals/show.py (its names are re-exported here for the CLI).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Final, Literal, NamedTuple, Protocol

from admin.live.evidence import LiveWire, observe
from admin.proposals.show import ActWith as ActWith
from admin.proposals.show import ShowWire
from admin.proposals.show import Surroundings as Surroundings
from admin.proposals.show import blocked_group as blocked_group
from admin.proposals.show import candidate_row as candidate_row
from admin.proposals.show import look_around as look_around
from admin.proposals.show import render_blocked as render_blocked
from admin.proposals.show import render_list as render_list
from admin.proposals.show import render_show as render_show
from admin.proposals.show import show_json as show_json
from admin.proposals.show import stuck_groups as stuck_groups
from admin.wire.connect import Consumer, Producer
from admin.wire.errors import AdminError, WireError, error_name, explain
from admin.wire.records import TopicRead, follow, reads_committed, send_one, topic_partitions
from admin.wire.types import wall_clock_ms
from admin.wire.versions import BrokerApis, marker_acl
from common.cli_options import EXIT_ALREADY_RESOLVED, EXIT_COLLISION, EXIT_DONE, EXIT_ERROR, EXIT_REFUSED
from common.text import iso
from detectors.abort import (
    LIVE_OWNER_SAME_EPOCH,
    WAIVERS,
    MarkerResult,
    claim_holder,
    collision_report,
    collision_signs,
    needs_read_committed,
    post_check,
    prior_ending,
    refusal_name,
    verify_marker,
)
from detectors.models import (
    AbortCandidate,
    AuditOutcome,
    AuditRecord,
    CandidateStatus,
    LiveEvidence,
    PostCheck,
    VerifyOutcome,
    VerifyResult,
    WriteTxnMarkersSpec,
)

log = logging.getLogger(__name__)

# What `txnwatch proposals abort` and `commit` exit with for each ending (the codes: common/cli_options.py, the one
# table of exit codes).
EXIT_CODES = {
    AuditOutcome.DRY_RUN: EXIT_DONE,
    AuditOutcome.ABORTED: EXIT_DONE,
    AuditOutcome.COMMITTED: EXIT_DONE,
    AuditOutcome.REFUSED: EXIT_REFUSED,
    AuditOutcome.ALREADY_RESOLVED: EXIT_ALREADY_RESOLVED,
    AuditOutcome.DENIED: EXIT_ERROR,
    AuditOutcome.FAILED: EXIT_ERROR,
    AuditOutcome.COLLISION: EXIT_COLLISION,
}

# WriteTxnMarkers errors after which Kafka's AbortTransactionHandler looks the leader up again; plus
# UNKNOWN_BROKER: the verified leader left the cluster's metadata, so the request never left and the leader is
# looked up again too. (A lost connection is not here: the marker may have been written before it dropped.)
LEADER_MOVED = frozenset(
    {
        "NOT_LEADER_OR_FOLLOWER",
        "REPLICA_NOT_AVAILABLE",
        "BROKER_NOT_AVAILABLE",
        "UNKNOWN_TOPIC_OR_PARTITION",
        "UNKNOWN_BROKER",
    }
)
# The broker refused the marker because the partition's producer state moved on: the plan is stale.
FENCED = frozenset({"INVALID_PRODUCER_EPOCH", "TRANSACTION_COORDINATOR_FENCED", "PRODUCER_FENCED"})


def denied_message(leader: int, leader_apis: BrokerApis) -> str:
    """The ACL the leader that denied the marker asks for: Alter on the cluster from Kafka 3.8, ClusterAction
    before (`admin.wire.versions.marker_acl`, read from that broker's ApiVersions)."""
    return (
        f"WriteTxnMarkers was denied (CLUSTER_AUTHORIZATION_FAILED): grant the ACL {marker_acl(leader_apis)} "
        f"to txnwatch's principal (broker {leader} denied it)"
    )


class ProposalWire(ShowWire, Protocol):
    """The seams `admin.wire.kafka_wire.KafkaWire` offers, plus the marker."""

    def write_abort_marker(
        self,
        broker: int,
        *,
        topic: str,
        partition: int,
        producer_id: int,
        producer_epoch: int,
        coordinator_epoch: int,
        transaction_result: MarkerResult = "ABORT",
    ) -> str | None: ...


# The post-check of a COMMIT: the offset of the first record a read_committed reader gets from the candidate's
# start offset on, None when it gets none (`first_read_committed_offset`).
ReadCommitted = Callable[[AbortCandidate], int | None]


# ------------------------------------------------------------------------------------ reading topics


def read_topic(consumer: Consumer, topic: str, *, timeout_s: float = 30.0) -> Iterator[tuple[Any, Any]]:
    """Every (key, value) of `topic` from the beginning to the end offsets measured at the start.

    Yields nothing when the topic does not exist.

    Raises:
        AdminError: the topic could not be read within `timeout_s`, or reading was denied.
    """
    read = TopicRead(consumer, topic, timeout_s=timeout_s)
    try:
        for r in read:
            yield r.key, r.value
    except WireError as exc:
        raise AdminError(explain("Consume", error_name(exc), topic, str(exc))) from exc
    if not read.complete:
        raise AdminError(f"reading {topic} took longer than {timeout_s:.0f}s")


def follow_topic(
    consumer: Consumer, topic: str, stop: threading.Event, *, poll_ms: int = 1000
) -> Iterator[list[tuple[Any, Any]]]:
    """Every (key, value) of `topic` from the beginning, then as it arrives: one list per poll (possibly empty),
    until `stop` is set. A topic that does not exist yet is waited for (the job creates it).

    Raises:
        AdminError: reading was denied, or failed.
    """
    try:
        partitions: list[int] = []
        while not partitions:
            if stop.is_set():
                return
            partitions = topic_partitions(consumer, topic)
            if not partitions:
                yield []
                stop.wait(poll_ms / 1000)
        for batch in follow(consumer, topic, partitions, start="beginning", poll_ms=poll_ms, stop=stop):
            yield [(r.key, r.value) for r in batch]
    except WireError as exc:
        raise AdminError(explain("Consume", error_name(exc), topic, str(exc))) from exc


def first_read_committed_offset(
    consumer: Consumer, candidate: AbortCandidate, *, timeout_s: float = 3.0
) -> int | None:
    """The offset of the first record `consumer` (isolation_level read_committed) gets from the candidate's start
    offset on, None when it gets none within `timeout_s`: a COMMIT's post-check (`ReadCommitted`). A committed
    transaction's first record is at its start offset; an aborted one is skipped (the leader's aborted index).

    Raises:
        ValueError: the consumer does not read committed (it would see aborted records too).
        AdminError: reading failed.
    """
    if not reads_committed(consumer):
        raise ValueError("a COMMIT is post-checked by a read_committed consumer")
    polls = follow(
        consumer, candidate.topic, [candidate.partition], start=candidate.start_offset, poll_ms=200
    )
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            got = [int(r.offset) for r in next(polls)]
            if got:
                return min(got)
    except WireError as exc:
        raise AdminError(explain("Fetch", error_name(exc), candidate.topic, str(exc))) from exc
    finally:
        polls.close()
    return None


def latest_candidates(records: Iterable[tuple[Any, Any]]) -> tuple[dict[str, AbortCandidate], int]:
    """The latest candidate per key (a tombstone removes it), and how many records were malformed."""
    latest: dict[str, AbortCandidate] = {}
    malformed = 0
    for key, value in records:
        name = key.decode("utf-8", "replace") if isinstance(key, bytes) else str(key)
        if value is None:
            latest.pop(name, None)
            continue
        try:
            candidate = AbortCandidate.model_validate_json(value)
        except ValueError:
            malformed += 1
            continue
        latest[candidate.candidate_id] = candidate
    return latest, malformed


def audit_records(records: Iterable[tuple[Any, Any]]) -> tuple[list[AuditRecord], int]:
    """The audit records in topic order, and how many were malformed."""
    out: list[AuditRecord] = []
    malformed = 0
    for _key, value in records:
        if value is None:
            continue
        try:
            out.append(AuditRecord.model_validate_json(value))
        except ValueError:
            malformed += 1
    return out, malformed


# `proposals abort --topic T --partition P --start-offset O` (as Kafka's `kafka-transactions.sh abort` names a
# transaction) acts only on what the job proposes now; otherwise it refuses by this name.
NOT_PROPOSED: Final = "not-proposed"


def candidate_at(
    candidates: Iterable[AbortCandidate], *, cluster: str, topic: str, partition: int, start_offset: int
) -> AbortCandidate | str:
    """The candidate the job proposes (OPENED) for the transaction that starts at `start_offset` of
    `topic`-`partition` on `cluster`, or why there is none to act on (a refusal, `not-proposed: ...`).

    txnwatch never aborts what it has not proven: a transaction without a candidate, or whose candidate the job
    resolved (it ended) or withdrew (its proof no longer holds), is not aborted by naming its offsets.

    Args:
        candidates: the latest record per candidate id (`latest_candidates`).
        cluster, topic, partition, start_offset: the transaction, as `kafka-transactions.sh abort` names it.
    """
    here = sorted(
        (
            c
            for c in candidates
            if c.cluster == cluster
            and c.topic == topic
            and c.partition == partition
            and c.start_offset == start_offset
        ),
        key=lambda c: c.candidate_id,
    )
    proposed = [c for c in here if c.status is CandidateStatus.OPENED]
    if len(proposed) == 1:
        return proposed[0]
    where = f"the transaction at {topic}-{partition} offset {start_offset} on cluster {cluster!r}"
    if len(proposed) > 1:
        ids = ", ".join(c.candidate_id for c in proposed)
        return f"{NOT_PROPOSED}: several candidates for {where} ({ids}): name one by its id"
    if here:
        states = ", ".join(f"{c.candidate_id} is {c.status.value}" for c in here)
        return (
            f"{NOT_PROPOSED}: the job no longer proposes aborting {where} ({states}): txnwatch never aborts what "
            "it has not proven"
        )
    return (
        f"{NOT_PROPOSED}: the job has proposed no abort of {where}: txnwatch never aborts what it has not proven "
        f"(`txnwatch inspect partition --topic {topic} --partition {partition}` shows what is known of it)"
    )


def no_longer_proposed(candidate: AbortCandidate) -> str | None:
    """Why a candidate named by its id is not to be acted on (a refusal, `not-proposed: ...`), or None.

    A WITHDRAWN candidate's proof no longer holds (the job says why): the live verification before a marker would
    be the only proof left, and txnwatch acts on a HANGING proof of the job's, verified live, never on the live
    check alone. A RESOLVED one goes on: its transaction ended, which the audit log or the live check finds, a
    clean "nothing to do" (exit 4) for a script that runs the abort again."""
    if candidate.status is not CandidateStatus.WITHDRAWN:
        return None
    return (
        f"{NOT_PROPOSED}: candidate {candidate.candidate_id} is WITHDRAWN: {candidate.withdrawn_reason}; the job "
        "no longer proposes it, and txnwatch never acts on what it has not proven (`txnwatch proposals list` "
        "shows what it proposes now)"
    )


# -------------------------------------------------------------------------------------------- abort


@dataclass(frozen=True)
class AbortAttempt:
    """How one `proposals abort` ended: its audit record (to publish) and its exit code."""

    audit: AuditRecord

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.audit.outcome]


class AuditLog(Protocol):
    """`<prefix>.audit` as the abort uses it: what was recorded for a candidate, and appending a record."""

    def history(self, candidate_id: str) -> list[AuditRecord]:
        """The candidate's records in topic order, read up to the end offsets measured now."""
        ...

    def append(self, record: AuditRecord) -> None:
        """Publish one record and wait for its acknowledgement (raises AdminError)."""
        ...


CLAIM_LEASE_MS = 120_000  # a claim without an ending (its run crashed) holds this long
CLAIM_WAIT_S = 20.0  # how long a second execution waits for the first one's ending


def abort(wire: ProposalWire, candidate: AbortCandidate, **options: Any) -> AbortAttempt:
    """`txnwatch proposals abort`: `write_marker_verified` with an ABORT marker (`options` are its keyword
    arguments). A candidate whose marker is COMMIT (a lost commit) is refused by name, `lost-commit-marker`."""
    return write_marker_verified(wire, candidate, result="ABORT", **options)


def commit(
    wire: ProposalWire, candidate: AbortCandidate, *, read_committed: ReadCommitted, **options: Any
) -> AbortAttempt:
    """`txnwatch proposals commit`: `write_marker_verified` with a COMMIT marker, for a `lost-commit-marker`
    candidate (any other is refused by name, `abort-candidate`); its post-check also reads the records back with
    `read_committed` (`options` are `write_marker_verified`'s other keyword arguments)."""
    return write_marker_verified(wire, candidate, result="COMMIT", read_committed=read_committed, **options)


def write_marker_verified(
    wire: ProposalWire,
    candidate: AbortCandidate,
    *,
    result: MarkerResult,
    execute: bool,
    actor: str,
    audit_log: AuditLog,
    clock_ms: Callable[[], int] = wall_clock_ms,
    sleep: Callable[[float], None] = time.sleep,
    monotonic: Callable[[], float] = time.monotonic,
    post_check_timeout_s: float = 10.0,
    claim_wait_s: float = CLAIM_WAIT_S,
    claim_lease_ms: int = CLAIM_LEASE_MS,
    allow_live_owner: bool = False,
    allow_leader_change: bool = False,
    read_committed: ReadCommitted | None = None,
) -> AbortAttempt:
    """Verify the candidate live and, with `execute`, claim it, write its marker (`result`: ABORT for `proposals
    abort`, COMMIT for `proposals commit`) and post-check it.

    The steps, each a function of this module: `plan` (the attempt and what its audit records repeat; a
    candidate the audit log shows ended by a marker ends here: `audit_history_ending`) → `verify_live` (a dry
    run ends here: `dry_run_ending`) → `claim` (`--execute` only) → `verify_live` again (and again after a
    leader move) → `send_marker` and `marker_answer` → `post_check_until` and `post_check_ending`; every ending
    is an audit record (`Attempt.end`).

    The claim (a CLAIMED record on the audit log, `detectors.abort.claim_holder`) makes concurrent executions
    write one marker: the first claim in the audit partition goes on, verifying again; the others wait for its
    ending and then find the transaction ended (ALREADY_RESOLVED), or refuse. The caller publishes the
    returned ending record, which releases the claim. `clock_ms` stamps records and ages claims; `monotonic`
    and `sleep` pace the waits. `allow_live_owner` (`--allow-live-owner`) waives the refusal
    `live-owner-same-epoch`; the post-check then also reports a COLLISION if that owner moved meanwhile.
    `allow_leader_change` (`--allow-leader-change`, `proposals abort` only) waives `leader-changed-since-start`.
    `read_committed` reads the records back for a COMMIT's post-check (without it a COMMIT's post-check fails).

    Never raises for cluster trouble: every ending is an `AuditRecord` (outcome and message).
    """
    attempt = plan(
        candidate,
        execute=execute,
        actor=actor,
        clock_ms=clock_ms,
        allow_live_owner=allow_live_owner,
        allow_leader_change=allow_leader_change,
        result=result,
    )
    ended = audit_history_ending(attempt, audit_log)
    if ended is not None:
        return ended
    moves = 0
    claimed_at_ms: int | None = None
    verified: Verified | None = None
    while True:
        checked = verify_live(wire, attempt, moves=moves, previous=verified, sleep=sleep)
        if isinstance(checked, AbortAttempt):
            if claimed_at_ms is None:
                return ended_by_another(
                    audit_log,
                    attempt,
                    checked,
                    wait_s=claim_wait_s,
                    lease_ms=claim_lease_ms,
                    sleep=sleep,
                    monotonic=monotonic,
                )
            return checked
        verified = checked
        if not execute:
            return dry_run_ending(attempt, verified)
        if claimed_at_ms is None:
            lost = claim(
                audit_log,
                attempt,
                verified.context,
                wait_s=claim_wait_s,
                lease_ms=claim_lease_ms,
                sleep=sleep,
                monotonic=monotonic,
            )
            if lost is not None:
                return lost
            claimed_at_ms = clock_ms()
            continue  # verify again: the state may have moved while the claim was taken
        if clock_ms() - claimed_at_ms > claim_lease_ms // 2:
            return attempt.end(
                AuditOutcome.REFUSED,
                "refused, no marker written: verification took so long that the claim on this candidate could "
                "expire and another execution take over; run it again",
                **verified.context,
            )
        leader = verified.before.leader
        error = send_marker(wire, leader, verified.marker)
        context = {**verified.context, "marker": verified.marker}
        answer = marker_answer(
            error, leader=leader, moves=moves, leader_apis=wire.broker_apis([leader]).get(leader, {})
        )
        if answer == MARKER_WRITTEN:
            break
        if answer == LOOK_UP_LEADER_AGAIN:
            moves += 1
            log.info(
                "WriteTxnMarkers to broker %d: %s; reading metadata again", verified.before.leader, error
            )
            continue
        return attempt.end(answer.outcome, answer.message, **answer.fields, **context)
    # The marker was written: wait (bounded) until the leader shows its effect.
    checked_after = post_check_until(
        wire,
        attempt.candidate,
        timeout_s=post_check_timeout_s,
        sleep=sleep,
        monotonic=monotonic,
        clock_ms=clock_ms,
        read_committed=read_committed,
    )
    return post_check_ending(
        attempt, checked_after, leader=verified.before.leader, context=context, before=verified.before
    )


# ------------------------------------------------------------------------------------- the abort's steps


@dataclass(frozen=True)
class Attempt:
    """One run of `proposals abort` (or `commit`) on one candidate: what every audit record of it repeats
    (`base`), stamped with `clock_ms` (the audit step: `record`, and `end` for the record the run ends with);
    `result` is the marker the command writes."""

    candidate: AbortCandidate
    execute: bool
    base: dict[str, Any]
    clock_ms: Callable[[], int]
    allow_live_owner: bool = False
    result: MarkerResult = "ABORT"
    allow_leader_change: bool = False

    def record(self, outcome: AuditOutcome, message: str, **fields: Any) -> AuditRecord:
        return AuditRecord(**self.base, **fields, at_ms=self.clock_ms(), outcome=outcome, message=message)

    def end(self, outcome: AuditOutcome, message: str, **fields: Any) -> AbortAttempt:
        return AbortAttempt(self.record(outcome, message, **fields))


def plan(
    candidate: AbortCandidate,
    *,
    execute: bool,
    actor: str,
    clock_ms: Callable[[], int],
    audit_id: str | None = None,
    allow_live_owner: bool = False,
    result: MarkerResult = "ABORT",
    allow_leader_change: bool = False,
) -> Attempt:
    """The attempt: a fresh audit id and the candidate's plan (`detectors.abort.plan_abort` built its
    WriteTxnMarkersSpec), which every audit record of this run carries, with the operator's
    `--allow-live-owner` and `--allow-leader-change`; `result` is the marker the command writes (verification refuses a plan of the other
    kind by name)."""
    base: dict[str, Any] = {
        **candidate.audit_fields(),
        "audit_id": audit_id if audit_id is not None else uuid.uuid4().hex,
        "actor": actor,
        "execute": execute,
        "allow_live_owner": allow_live_owner,
        "allow_leader_change": allow_leader_change,
    }
    return Attempt(candidate, execute, base, clock_ms, allow_live_owner, result, allow_leader_change)


def audit_history_ending(attempt: Attempt, audit_log: AuditLog) -> AbortAttempt | None:
    """How the run ends before it looks at the cluster: the audit log shows the candidate aborted (or committed)
    already (ALREADY_RESOLVED), or cannot be read (FAILED); None to go on."""
    try:
        past = audit_log.history(attempt.candidate.candidate_id)
    except AdminError as exc:
        return attempt.end(AuditOutcome.FAILED, f"cannot read the audit log: {exc}; nothing written")
    done = prior_ending(past)
    if done is not None:
        return attempt.end(AuditOutcome.ALREADY_RESOLVED, "nothing to do: " + _ended_by(done))
    return None


@dataclass(frozen=True)
class Verified:
    """The live state verified safe for the marker: what was read (`before`), the verification and its
    marker."""

    before: LiveEvidence
    verify: VerifyResult
    marker: WriteTxnMarkersSpec
    leader_moves: int

    @property
    def context(self) -> dict[str, Any]:
        """The audit fields every later record of the run carries."""
        return {"before": self.before, "verify": self.verify, "leader_moves": self.leader_moves}


def verify_live(
    wire: LiveWire,
    attempt: Attempt,
    *,
    moves: int,
    previous: Verified | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> Verified | AbortAttempt:
    """Read the partition and coordinator now (`observe`) and verify the command's marker
    (`detectors.abort.verify_marker`): the marker to send, or how the run ends (unreadable: FAILED, with the
    previous verification if any; ended or not provably safe: REFUSED, nothing written)."""
    candidate = attempt.candidate
    try:
        before = observe(wire, candidate, clock_ms=attempt.clock_ms, sleep=sleep)
    except AdminError as exc:
        return attempt.end(
            AuditOutcome.FAILED,
            f"cannot verify: {exc}",
            before=previous.before if previous else None,
            verify=previous.verify if previous else None,
            leader_moves=moves,
        )
    verify = verify_marker(
        candidate,
        before,
        result=attempt.result,
        allow_live_owner=attempt.allow_live_owner,
        allow_leader_change=attempt.allow_leader_change,
    )
    return verified_or_ending(attempt, before, verify, moves=moves)


def verified_or_ending(
    attempt: Attempt, before: LiveEvidence, verify: VerifyResult, *, moves: int
) -> Verified | AbortAttempt:
    """`verify_live`'s decision on what it read: SAFE with its marker goes on; anything else ends the run."""
    context: dict[str, Any] = {"before": before, "verify": verify, "leader_moves": moves}
    if verify.outcome is VerifyOutcome.ALREADY_RESOLVED:
        # Not by us (an abort of ours would be in the audit log): the transaction ended since the plan.
        return attempt.end(
            AuditOutcome.REFUSED,
            "refused, no marker written: the transaction changed since the plan: "
            + "; ".join(verify.changes),
            **context,
        )
    if verify.outcome is VerifyOutcome.REFUSED:
        return attempt.end(
            AuditOutcome.REFUSED, "refused, no marker written: " + "; ".join(verify.changes), **context
        )
    if verify.marker is None:  # cannot happen: VerifyResult's validator gives SAFE a marker
        return attempt.end(AuditOutcome.FAILED, "verification planned no marker", **context)
    return Verified(before, verify, verify.marker, moves)


def ended_by_another(
    audit_log: AuditLog,
    attempt: Attempt,
    ending: AbortAttempt,
    *,
    wait_s: float,
    lease_ms: int,
    sleep: Callable[[float], None] = time.sleep,
    monotonic: Callable[[], float] = time.monotonic,
) -> AbortAttempt:
    """A transaction found ended since the plan, before this run claimed it, may have been ended by another
    execution of the same candidate: one that wrote its marker but had not published its ABORTED record yet
    when this run read the audit log (two on-call engineers pressing enter together, the second a little
    slower). While such a claim is held, wait for its ending (up to `wait_s`) and end as it did, "aborted by",
    ALREADY_RESOLVED, rather than "changed since the plan". Every other ending is returned as it was."""
    verify = ending.audit.verify
    if verify is None or verify.outcome is not VerifyOutcome.ALREADY_RESOLVED:
        return ending
    deadline = monotonic() + wait_s
    while True:
        try:
            past = audit_log.history(attempt.candidate.candidate_id)
        except AdminError:
            return ending  # the refusal stands on what was read live
        done = prior_ending(past)
        if done is not None:
            return AbortAttempt(
                ending.audit.model_copy(
                    update={
                        "outcome": AuditOutcome.ALREADY_RESOLVED,
                        "message": "nothing to do: " + _ended_by(done),
                        "at_ms": attempt.clock_ms(),
                    }
                )
            )
        if claim_holder(past, now_ms=attempt.clock_ms(), lease_ms=lease_ms) is None or monotonic() > deadline:
            return ending
        sleep(0.5)


def dry_run_ending(attempt: Attempt, verified: Verified) -> AbortAttempt:
    """Without --execute the run ends once verified: nothing written."""
    act = _ACT[attempt.result]
    return attempt.end(
        AuditOutcome.DRY_RUN,
        f"dry run: safe to {act} now (leader {verified.before.leader}, coordinator epoch "
        f"{verified.marker.coordinator_epoch}){_waived(verified.verify)}; nothing written, add --execute to {act}",
        **verified.context,
    )


# What each marker does, for the messages: "safe to abort", "restores the commit".
_ACT: Final = {"ABORT": "abort", "COMMIT": "commit"}


def _waived(verify: VerifyResult | None) -> str:
    """What the operator's flags let through, for the message: the risk stays theirs, so it is said."""
    if verify is None or not verify.waived:
        return ""
    return "".join(f", with {WAIVERS[refusal_name(w)]} waiving: {w}" for w in verify.waived)


def _ended_by(r: AuditRecord) -> str:
    done = "committed" if r.plan.transaction_result == "COMMIT" else "aborted"
    return f"{done} by {r.actor} at {iso(r.at_ms)} (audit {r.audit_id})"


def claim(
    audit_log: AuditLog,
    attempt: Attempt,
    context: dict[str, Any],
    *,
    wait_s: float,
    lease_ms: int,
    sleep: Callable[[float], None] = time.sleep,
    monotonic: Callable[[], float] = time.monotonic,
) -> AbortAttempt | None:
    """Claim the candidate on the audit log. None: this run holds it. Else how this run ends: the holder
    ended it meanwhile (ALREADY_RESOLVED), or it held on past `wait_s` (REFUSED), or the log failed."""
    mine = attempt.record(AuditOutcome.CLAIMED, "claimed for --execute", **context)
    try:
        audit_log.append(mine)
    except AdminError as exc:
        return attempt.end(
            AuditOutcome.FAILED, f"cannot claim the candidate on the audit log: {exc}; nothing written"
        )
    deadline = monotonic() + wait_s
    while True:
        try:
            past = audit_log.history(attempt.candidate.candidate_id)
        except AdminError as exc:
            return attempt.end(
                AuditOutcome.FAILED, f"cannot read the audit log: {exc}; nothing written", **context
            )
        done = prior_ending(past)
        if done is not None:
            return attempt.end(AuditOutcome.ALREADY_RESOLVED, "nothing to do: " + _ended_by(done), **context)
        holder = claim_holder(past, now_ms=attempt.clock_ms(), lease_ms=lease_ms)
        if holder is not None and holder.audit_id == mine.audit_id:
            return None
        if holder is None and any(r.audit_id == mine.audit_id for r in past):
            # Our own claim is back but already expired: far too slow to be safe.
            return attempt.end(
                AuditOutcome.REFUSED, "refused, no marker written: this run's claim expired", **context
            )
        if monotonic() > deadline:
            who = f"{holder.actor} since {iso(holder.at_ms)} (audit {holder.audit_id})" if holder else "?"
            return attempt.end(
                AuditOutcome.REFUSED,
                f"refused, no marker written: another execution holds this candidate: {who}; run "
                "`txnwatch proposals show` to see how it ended",
                **context,
            )
        sleep(0.5)


def send_marker(wire: ProposalWire, leader: int, marker: WriteTxnMarkersSpec) -> str | None:
    """One WriteTxnMarkers to `leader`, of the verified marker's result (ABORT, or COMMIT): None when written,
    else the error's name."""
    return wire.write_abort_marker(
        leader,
        topic=marker.topic,
        partition=marker.partition,
        producer_id=marker.producer_id,
        producer_epoch=marker.producer_epoch,
        coordinator_epoch=marker.coordinator_epoch,
        transaction_result=marker.transaction_result,
    )


class MarkerEnding(NamedTuple):
    """How a marker error ends the run: the outcome, the message and any audit fields of its own."""

    outcome: AuditOutcome
    message: str
    fields: dict[str, Any]


# The two answers after which the run goes on: the marker is written (post-check next), or the leader moved for
# the first time (read metadata, verify again, send to the new leader).
MARKER_WRITTEN: Final = "written"
LOOK_UP_LEADER_AGAIN: Final = "look-up-leader-again"
MarkerAnswer = Literal["written", "look-up-leader-again"] | MarkerEnding


def marker_answer(error: str | None, *, leader: int, moves: int, leader_apis: BrokerApis) -> MarkerAnswer:
    """What a WriteTxnMarkers answer means: `MARKER_WRITTEN`, `LOOK_UP_LEADER_AGAIN` (the first leader move),
    or the ending (the ACL missing, named for the leader's release by its ApiVersions `leader_apis`; the marker
    fenced; a second move; or an error after which the marker may or may not have been written)."""
    if error is None:
        return MARKER_WRITTEN
    if error in LEADER_MOVED and moves == 0:
        return LOOK_UP_LEADER_AGAIN
    if error == "CLUSTER_AUTHORIZATION_FAILED":
        return MarkerEnding(AuditOutcome.DENIED, denied_message(leader, leader_apis), {})
    if error in FENCED:
        return MarkerEnding(
            AuditOutcome.REFUSED,
            f"the leader refused the marker ({error}): the producer state changed since it was verified; "
            "nothing was written",
            {},
        )
    if error in LEADER_MOVED:
        return MarkerEnding(
            AuditOutcome.FAILED,
            f"WriteTxnMarkers to broker {leader} failed with {error} after one leader move; nothing "
            "was written: try again once the partition's leadership is stable",
            {},
        )
    return MarkerEnding(
        AuditOutcome.FAILED,
        f"WriteTxnMarkers to broker {leader} failed with {error}; the marker may or may not have "
        "been written: run `txnwatch proposals show` before trying again",
        {"marker_written": None},
    )


class AfterMarker(NamedTuple):
    """The post-check's last look: what the leader showed, the check of it, or why it could not be read; for a
    COMMIT, the first offset a read_committed reader got from the start offset (None: not read, or nothing)."""

    after: LiveEvidence | None
    check: PostCheck | None
    problem: str | None
    read_committed_offset: int | None = None


def post_check_until(
    wire: LiveWire,
    candidate: AbortCandidate,
    *,
    timeout_s: float,
    sleep: Callable[[float], None] = time.sleep,
    monotonic: Callable[[], float] = time.monotonic,
    clock_ms: Callable[[], int] = wall_clock_ms,
    read_committed: ReadCommitted | None = None,
) -> AfterMarker:
    """Read the partition again (every 0.2 s, for up to `timeout_s`) until `detectors.abort.post_check` says the
    marker did its job; the last look either way. For a COMMIT, once the LSO is past the start offset, the
    records are read back with `read_committed` too."""
    deadline = monotonic() + timeout_s
    after: LiveEvidence | None = None
    check: PostCheck | None = None
    problem: str | None = None
    seen: int | None = None
    while True:
        try:
            after = observe(wire, candidate, clock_ms=clock_ms, sleep=sleep)
            read = read_committed is not None and needs_read_committed(candidate, after)
            seen = read_committed(candidate) if read_committed is not None and read else None
            check = post_check(candidate, after, seen)
            problem = None
        except AdminError as exc:
            problem = str(exc)
        if (check is not None and check.ok) or monotonic() > deadline:
            return AfterMarker(after, check, problem, seen)
        sleep(0.2)


def post_check_ending(
    attempt: Attempt, looked: AfterMarker, *, leader: int, context: dict[str, Any], before: LiveEvidence
) -> AbortAttempt:
    """The ending once the marker is written: COLLISION when a live owner at the marker's epoch moved between
    verification (`before`) and the look after the marker (`detectors.abort.collision_signs`), whatever the
    post-check says; else ABORTED (COMMITTED for a COMMIT) when the post-check holds, FAILED with why when it
    does not."""
    after, check = looked.after, looked.check
    fields: dict[str, Any] = {**context, "after": after, "post_check": check, "marker_written": True}
    candidate = attempt.candidate
    where = f"{candidate.topic}-{candidate.partition}"
    visible = (
        f"; a read_committed reader gets offset {looked.read_committed_offset}"
        if looked.read_committed_offset is not None
        else ""
    )
    checked = (
        f"post-check passed ({where} LSO {after.last_stable_offset if after else '?'} is past offset "
        f"{candidate.start_offset}{visible})"
        if check is not None and check.ok
        else "post-check failed: " + (looked.problem or "; ".join(check.problems if check else ()))
    )
    signs = collision_signs(candidate, before, after if looked.problem is None else None)
    if signs:
        return attempt.end(
            AuditOutcome.COLLISION,
            f"COLLISION: marker written by broker {leader}, {checked}, but the owner of producer "
            f"{candidate.spec.producer_id} at the marker's epoch moved: "
            + collision_report(candidate, signs),
            **fields,
            collision=signs,
        )
    if check is not None and check.ok:
        ended, outcome = (
            ("committed: COMMIT", AuditOutcome.COMMITTED)
            if attempt.result == "COMMIT"
            else ("aborted:", AuditOutcome.ABORTED)
        )
        return attempt.end(
            outcome,
            f"{ended} marker written by broker {leader}; {where} LSO "
            f"{after.last_stable_offset if after else '?'} is past offset {candidate.start_offset}{visible}"
            + _owner_stayed(context.get("verify")),
            **fields,
        )
    return attempt.end(AuditOutcome.FAILED, f"marker written, but the {checked}", **fields)


def _owner_stayed(verify: VerifyResult | None) -> str:
    """For an ABORTED (COMMITTED) run whose refusals the operator waived: which flag waived which, and, for a
    live owner, that the owner was watched and did not move."""
    if verify is None or not verify.waived:
        return ""
    said = []
    for name in (refusal_name(w) for w in verify.waived):
        stayed = ", and the owner did not move before the marker" if name == LIVE_OWNER_SAME_EPOCH else ""
        said.append(f"; {WAIVERS[name]} waived {name}{stayed}")
    return "".join(said)


def publish_audit(producer: Producer, topic: str, record: AuditRecord, *, timeout_s: float = 30.0) -> None:
    """Write one audit record (key = candidate id) and wait for its acknowledgement.

    Raises:
        AdminError: the record was not acknowledged (the message names the ACL if one is missing).
    """
    try:
        send_one(
            producer,
            topic,
            record.candidate_id.encode(),
            record.model_dump_json().encode(),
            timeout_s=timeout_s,
        )
    except WireError as exc:
        raise AdminError(explain("Produce", error_name(exc), topic, str(exc))) from exc


class TopicAuditLog:
    """`<prefix>.audit` on the cluster: records go out acks=all (one at a time), and every `history` reads the
    topic again from the beginning to its end offsets, so it sees every record acknowledged before it began."""

    def __init__(
        self, producer: Producer, consumer: Consumer, topic: str, *, timeout_s: float = 30.0
    ) -> None:
        self._producer = producer
        self._consumer = consumer
        self.topic = topic
        self._timeout_s = timeout_s

    def history(self, candidate_id: str) -> list[AuditRecord]:
        key = candidate_id.encode()
        mine = (
            (k, v) for k, v in read_topic(self._consumer, self.topic, timeout_s=self._timeout_s) if k == key
        )
        records, _malformed = audit_records(mine)
        return records

    def all_records(self) -> list[AuditRecord]:
        records, _malformed = audit_records(read_topic(self._consumer, self.topic, timeout_s=self._timeout_s))
        return records

    def append(self, record: AuditRecord) -> None:
        publish_audit(self._producer, self.topic, record, timeout_s=self._timeout_s)


def audit_json(record: AuditRecord) -> str:
    return json.dumps(record.model_dump(mode="json"))
