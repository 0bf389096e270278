"""Abort planning and the verified abort's decisions (pure): `plan_abort` (verdict → `AbortCandidate`),
`verify_abort` / `verify_commit` (may the marker still be written, given `LiveEvidence` read now), `post_check`,
`collision_signs` and `pending_candidates`. Reading the cluster and writing the marker live in admin/; why each
refusal: docs/detection.md, section 7, and docs/proposals.md.
"""

from __future__ import annotations

import shlex
from collections.abc import Collection, Iterable, Sequence
from typing import Literal

from detectors import lateness
from detectors.contract import PREPARING_STATES
from detectors.models import (
    TWO_PHASE_COMMIT_TIMEOUT_MS,
    AbortCandidate,
    AuditOutcome,
    AuditRecord,
    CandidateStatus,
    CoordinatorState,
    HangingReason,
    LiveCoordinator,
    LiveEvidence,
    OpenTransaction,
    PartitionSnapshot,
    PostCheck,
    Verdict,
    VerdictKind,
    VerifyOutcome,
    VerifyResult,
    WriteTxnMarkersSpec,
    candidate_id,
    is_two_phase_commit,
)

BOOTSTRAP_PLACEHOLDER = "<bootstrap-server>"


def marker_coordinator_epoch(leader_coordinator_epoch: int) -> int:
    """The coordinator epoch to put in an admin abort marker: the leader's, or 0 when it is negative.

    Kafka's TransactionsCommand does the same: a producer that hung before its first marker shows -1, and
    0 is <= any real coordinator epoch. kafka-python's default of -1 is fenced once a marker was written.
    """
    return leader_coordinator_epoch if leader_coordinator_epoch >= 0 else 0


def kafka_cli_abort(
    *,
    topic: str,
    partition: int,
    start_offset: int,
    bootstrap: str | None = None,
    command_config: str | None = None,
) -> str:
    """The equivalent `kafka-transactions.sh abort` line (Kafka 3.0+ brokers: by start offset).

    Args:
        topic: topic of the partition.
        partition: partition number.
        start_offset: the open transaction's start offset.
        bootstrap: bootstrap servers; None gives the placeholder `<bootstrap-server>` to fill in.
        command_config: path of a client.properties file, if the cluster needs one.
    """
    server = shlex.quote(bootstrap) if bootstrap else BOOTSTRAP_PLACEHOLDER
    config = f" --command-config {shlex.quote(command_config)}" if command_config else ""
    return (
        f"kafka-transactions.sh --bootstrap-server {server}{config} abort "
        f"--topic {shlex.quote(topic)} --partition {partition} --start-offset {start_offset}"
    )


# Kafka's tools write only ABORT markers (`kafka-transactions.sh abort`, Admin.abortTransaction): a lost commit is
# restored with txnwatch's own command.
NO_KAFKA_CLI_COMMIT = (
    "none: kafka-transactions.sh can only abort; restore the commit with `txnwatch proposals commit`"
)


MarkerResult = Literal["ABORT", "COMMIT"]


def marker_result(reason: HangingReason | None) -> MarkerResult:
    """The marker that ends a HANGING transaction as its coordinator decided: COMMIT where the coordinator
    committed it and the partition's marker was lost (`lost-commit-marker`), ABORT for every other reason (no
    coordinator will ever decide it, or it decided abort)."""
    return "COMMIT" if reason is HangingReason.LOST_COMMIT_MARKER else "ABORT"


def plan_abort(
    snapshot: PartitionSnapshot,
    txn: OpenTransaction,
    verdict: Verdict,
    *,
    bootstrap: str | None = None,
    first_detected_ms: int,
    command_config: str | None = None,
) -> AbortCandidate:
    """Plan the abort of a transaction proven HANGING.

    Args:
        snapshot: the partition snapshot the verdict was made on.
        txn: the open transaction (one of `snapshot.open_transactions`).
        verdict: its verdict; must be HANGING.
        bootstrap: bootstrap servers for the CLI line (placeholder if None).
        first_detected_ms: when txnwatch first judged this transaction HANGING.
        command_config: client.properties path for the CLI line, if any.

    Returns:
        The candidate: id, WriteTxnMarkers spec (leader-reported coordinator epoch, 0 if negative), reason,
        evidence and the equivalent Kafka CLI line.

    Raises:
        ValueError: if the verdict is not HANGING, or the transaction is not in the snapshot, or the verdict's
            evidence is about another transaction (caller bugs).
    """
    if verdict.kind is not VerdictKind.HANGING or verdict.reason is None:
        raise ValueError(f"only a HANGING verdict can be aborted, not {verdict.kind.value}")
    if txn not in snapshot.open_transactions:
        raise ValueError(f"producer {txn.producer_id} has no such open transaction in the snapshot")
    e = verdict.evidence
    if (e.topic, e.partition, e.producer_id, e.start_offset) != (
        snapshot.topic,
        snapshot.partition,
        txn.producer_id,
        txn.start_offset,
    ):
        raise ValueError("the verdict's evidence is about another transaction")
    spec = WriteTxnMarkersSpec(
        topic=snapshot.topic,
        partition=snapshot.partition,
        producer_id=txn.producer_id,
        producer_epoch=txn.producer_epoch,
        coordinator_epoch=marker_coordinator_epoch(txn.coordinator_epoch),
        transaction_result=marker_result(verdict.reason),
    )
    cli = kafka_cli_abort(
        topic=snapshot.topic,
        partition=snapshot.partition,
        start_offset=txn.start_offset,
        bootstrap=bootstrap,
        command_config=command_config,
    )
    return AbortCandidate(
        candidate_id=candidate_id(
            snapshot.cluster,
            snapshot.topic,
            snapshot.partition,
            txn.producer_id,
            txn.producer_epoch,
            txn.start_offset,
        ),
        cluster=snapshot.cluster,
        topic=snapshot.topic,
        partition=snapshot.partition,
        start_offset=txn.start_offset,
        spec=spec,
        reason=verdict.reason,
        evidence=e,
        explanation=verdict.explanation,
        first_detected_ms=first_detected_ms,
        two_phase_commit=verdict.two_phase_commit,
        kafka_cli=cli if spec.transaction_result == "ABORT" else NO_KAFKA_CLI_COMMIT,
    )


# --------------------------------------------------------------------------------- verify, post-check


def _where(c: AbortCandidate) -> str:
    return f"{c.topic}-{c.partition}"


def verify_abort(
    candidate: AbortCandidate,
    live: LiveEvidence,
    *,
    allow_live_owner: bool = False,
    allow_leader_change: bool = False,
) -> VerifyResult:
    """May the candidate's ABORT marker still be written? `verify_marker` for `proposals abort`: a candidate
    whose marker is COMMIT is refused by name (`lost-commit-marker`)."""
    return verify_marker(
        candidate,
        live,
        result="ABORT",
        allow_live_owner=allow_live_owner,
        allow_leader_change=allow_leader_change,
    )


def verify_commit(
    candidate: AbortCandidate, live: LiveEvidence, *, allow_live_owner: bool = False
) -> VerifyResult:
    """May the candidate's COMMIT marker (a lost commit marker restored) still be written? `verify_marker` for
    `proposals commit`: any candidate whose marker is not COMMIT is refused by name (`abort-candidate`)."""
    return verify_marker(candidate, live, result="COMMIT", allow_live_owner=allow_live_owner)


def verify_marker(
    candidate: AbortCandidate,
    live: LiveEvidence,
    *,
    result: MarkerResult,
    allow_live_owner: bool = False,
    allow_leader_change: bool = False,
) -> VerifyResult:
    """May the marker `result` (ABORT for `proposals abort`, COMMIT for `proposals commit`) still be written for the
    candidate, decided on what the cluster says now: SAFE (with any refusal the operator waived in `waived`),
    ALREADY_RESOLVED (the transaction at the start offset is no longer open: nothing to write), or REFUSED, the
    `changes` saying what changed or could not be checked, one line each. Each check and why it refuses:
    docs/proposals.md, "`abort ID`" step 2 and "`commit ID`".

    Args:
        candidate: the planned marker (its spec carries the epochs seen when it was planned).
        live: the partition and its coordinator as read just now.
        result: the marker the command writes.
        allow_live_owner: `--allow-live-owner`: `live-owner-same-epoch` is waived (in `waived`).
        allow_leader_change: `--allow-leader-change`: `leader-changed-since-start` is waived (in `waived`).
    """
    spec, start, where = candidate.spec, candidate.start_offset, _where(candidate)
    pid = spec.producer_id
    p = live.producer
    if p is None or p.current_txn_start_offset < 0:
        what = (
            f"the leader of {where} no longer lists producer {pid}"
            if p is None
            else f"producer {pid} has no open transaction on {where} any more"
        )
        return VerifyResult(
            outcome=VerifyOutcome.ALREADY_RESOLVED,
            changes=(f"{what}: the transaction at offset {start} was committed or aborted since the plan",),
        )
    if p.current_txn_start_offset > start:
        return VerifyResult(
            outcome=VerifyOutcome.ALREADY_RESOLVED,
            changes=(
                f"the transaction at offset {start} is over; producer {pid} now has another transaction open "
                f"on {where} at offset {p.current_txn_start_offset} (not this candidate's)",
            ),
        )
    changes: list[str] = []
    if p.current_txn_start_offset != start:
        changes.append(
            f"producer {pid}'s open transaction on {where} starts at offset {p.current_txn_start_offset}, "
            f"not {start} as planned"
        )
    if p.producer_epoch != spec.producer_epoch:
        changes.append(f"producer epoch moved from {spec.producer_epoch} to {p.producer_epoch}")
    live_marker_epoch = marker_coordinator_epoch(p.coordinator_epoch)
    if live_marker_epoch != spec.coordinator_epoch:
        changes.append(
            f"the leader's coordinator epoch for producer {pid} moved from {spec.coordinator_epoch} to "
            f"{p.coordinator_epoch} (a coordinator wrote a marker on {where} since the plan)"
        )
    if result == "ABORT" and spec.transaction_result == "COMMIT":
        changes.append(lost_commit_refusal(candidate))
    if result == "COMMIT":
        changes.extend(commit_objections(candidate))
    objections = _coordinator_objections(candidate, live, result)
    changes.extend(objections)
    # An owner the checks above let through (readable, in a known state, not writing markers, not owning the
    # partition) may be live at the marker's epoch; so may one caught writing the markers of a transaction on
    # other partitions: a busy owner is in a Prepare state often, and retrying alone would not help.
    live_owner = (
        live_owner_same_epoch(candidate, live.coordinator, result)
        if not objections or _preparing_elsewhere(live)
        else None
    )
    waived: tuple[str, ...] = ()
    if live_owner is not None and allow_live_owner:
        waived = (live_owner,)
    elif live_owner is not None:
        changes.append(live_owner)
    # Across a leader change a commit marker of it may have been lost: an ABORT would undo a decided commit.
    leader_change = leader_changed_since_start(candidate, live) if result == "ABORT" else None
    if leader_change is not None and allow_leader_change:
        waived = (*waived, leader_change)
    elif leader_change is not None:
        changes.append(leader_change)
    if changes:
        return VerifyResult(outcome=VerifyOutcome.REFUSED, changes=tuple(changes), waived=waived)
    return VerifyResult(
        outcome=VerifyOutcome.SAFE,
        marker=spec.model_copy(update={"coordinator_epoch": live_marker_epoch}),
        waived=waived,
    )


LOST_COMMIT_MARKER = "lost-commit-marker"


ABORT_CANDIDATE = "abort-candidate"
COMMIT_UNPROVEN = "commit-unproven"
COORDINATOR_CONTRADICTS_COMMIT = "coordinator-contradicts-commit"
COMMIT_OWNER_GONE = "commit-owner-gone"


def commit_objections(candidate: AbortCandidate) -> list[str]:
    """What the candidate itself says against a COMMIT marker: it is not a lost commit (its marker is ABORT:
    `abort-candidate`), or its evidence does not show the coordinator committed the transaction with this
    partition in its PrepareCommit (`commit-unproven`). Only that proof makes a COMMIT the coordinator's own
    outcome; without it a COMMIT could commit what no coordinator ever committed."""
    spec, where, cid = candidate.spec, _where(candidate), candidate.candidate_id
    if spec.transaction_result != "COMMIT":
        return [
            f"{ABORT_CANDIDATE}: candidate {cid} ({candidate.reason.value}) is ended with an ABORT marker, never a "
            f"COMMIT: no coordinator committed this transaction on {where}; `txnwatch proposals abort {cid}` "
            "is its command"
        ]
    e = candidate.evidence.coordinator
    if (
        candidate.reason is not HangingReason.LOST_COMMIT_MARKER
        or e is None
        or e.state is not CoordinatorState.COMPLETE_COMMIT
        or e.producer_id != spec.producer_id
        or e.prepared_partition_listed is not True
    ):
        shown = (
            "no coordinator record"
            if e is None
            else f"{e.transactional_id} {e.state.value if e.state else 'tombstone'} of producer {e.producer_id}, "
            f"its Prepare record {_prepare_listing(e.prepared_partition_listed)} {where}"
        )
        return [
            f"{COMMIT_UNPROVEN}: the candidate's evidence ({shown}) does not show that its coordinator committed "
            f"this transaction with {where} in its PrepareCommit; only that proof makes a COMMIT the "
            "coordinator's outcome"
        ]
    return []


def _prepare_listing(listed: bool | None) -> str:
    return {True: "listed", False: "did not list", None: "(not read) may or may not have listed"}[listed]


def commit_contradicted(candidate: AbortCandidate, owner: LiveCoordinator) -> str | None:
    """`coordinator-contradicts-commit` when the owner's coordinator, read now, no longer records the commit the
    candidate was proven on: its record of the same transaction (the same start time) is in another state than
    CompleteCommit (an unclean election of `__transaction_state` can rewind it: it may abort it yet), or its
    epoch is below the committed record's (its log went back). A later transaction of the owner (another start)
    leaves that commit as it was: it is not contradicted. None when nothing contradicts it."""
    e = candidate.evidence.coordinator
    if e is None:
        return None  # `commit_objections` refuses it
    why = None
    if owner.producer_epoch < e.producer_epoch:
        why = f"its epoch is {owner.producer_epoch}, below the committed record's {e.producer_epoch}"
    elif (
        owner.transaction_start_ms == e.start_timestamp_ms and owner.state != CoordinatorState.COMPLETE_COMMIT
    ):
        why = (
            f"it records the same transaction (started at {e.start_timestamp_ms} ms) as {owner.state}, not "
            "CompleteCommit"
        )
    if why is None:
        return None
    return (
        f"{COORDINATOR_CONTRADICTS_COMMIT}: transactional id {owner.transactional_id} (producer "
        f"{owner.producer_id}) was proven CompleteCommit with {_where(candidate)} in its PrepareCommit, but now "
        f"{why}: its coordinator's log no longer says this transaction committed; write nothing, and read "
        "`txnwatch inspect coordinator-log` (runbook: lost markers)"
    )


def lost_commit_refusal(candidate: AbortCandidate) -> str:
    """Why a transaction whose commit marker was lost is never aborted, and what restores it instead."""
    return (
        f"{LOST_COMMIT_MARKER}: the coordinator committed this transaction with {_where(candidate)} in it and the "
        "partition's marker was lost; every other partition of it committed and its client was told so, so an "
        "ABORT marker would break its atomicity; restore the commit with "
        f"`txnwatch proposals commit {candidate.candidate_id}` (runbook: lost markers)"
    )


def candidate_is_two_phase_commit(candidate: AbortCandidate) -> bool:
    """The candidate was judged against a KIP-939 two-phase-commit transaction (its flag, or, for a candidate
    written before the flag existed, its coordinator evidence)."""
    c = candidate.evidence.coordinator
    return candidate.two_phase_commit or (c is not None and c.two_phase_commit)


def two_phase_commit_refusal(transactional_id: str) -> str:
    """Why a two-phase-commit transaction is never aborted with a marker, and what ends it instead."""
    return (
        f"two-phase-commit: transactional id {transactional_id} is a KIP-939 two-phase-commit transaction "
        f"(timeout {TWO_PHASE_COMMIT_TIMEOUT_MS}, no timeout): its outcome belongs to its external transaction "
        "manager; end it there, or with Kafka 4.1+'s Admin.forceTerminateTransaction "
        f"(kafka-transactions.sh forceTerminateTransaction --transactionalId {shlex.quote(transactional_id)}); "
        "never with a marker"
    )


LIVE_OWNER_SAME_EPOCH = "live-owner-same-epoch"
ALLOW_LIVE_OWNER_FLAG = "--allow-live-owner"


def owner_at_marker_epoch(candidate: AbortCandidate, owner: LiveCoordinator | None) -> bool:
    """`owner` owns the candidate's producer id at the marker's epoch and is not Dead: a transaction of it may
    write into the orphan's open transaction at that epoch, whatever the transaction version (why:
    docs/proposals.md, "`abort ID`", the `live-owner-same-epoch` refusal)."""
    return (
        owner is not None
        and owner.producer_id == candidate.spec.producer_id
        and owner.producer_epoch == candidate.spec.producer_epoch
        and owner.state != CoordinatorState.DEAD.value
    )


def recorded_transaction_version(candidate: AbortCandidate) -> int:
    """The client transaction version of the coordinator record the candidate was judged against, if it was the
    producer id's own record; 0 otherwise (TV0, or unknown: DescribeTransactions does not report it, and the
    describe fallback's records carry 0)."""
    c = candidate.evidence.coordinator
    if c is None or c.producer_id != candidate.spec.producer_id:
        return 0
    return c.client_transaction_version


def live_owner_same_epoch(
    candidate: AbortCandidate, owner: LiveCoordinator | None, result: MarkerResult = "ABORT"
) -> str | None:
    """The refusal `live-owner-same-epoch` when `owner` is live at the marker's epoch (`owner_at_marker_epoch`),
    else None. Waived only by the operator (`--allow-live-owner`). The same for a COMMIT: the owner's batch
    would be committed with the lost transaction before its own coordinator decides it."""
    if owner is None or not owner_at_marker_epoch(candidate, owner):
        return None
    where, epoch = _where(candidate), candidate.spec.producer_epoch
    version = recorded_transaction_version(candidate)
    known = f"transaction version {version}" if version else "transaction version 0 or unknown"
    caught = (
        "abort it too while its coordinator commits the rest"
        if result == "ABORT"
        else "commit it too, whatever its coordinator decides for the rest"
    )
    return (
        f"{LIVE_OWNER_SAME_EPOCH}: transactional id {owner.transactional_id} owns producer {owner.producer_id} "
        f"at epoch {epoch}, the marker's, and is live ({owner.state}, {known}): until its epoch moves, any "
        f"transaction of it that adds {where} writes there at epoch {epoch}, that batch joins this open "
        f"transaction unchecked, and the marker would {caught}. Ask its owners to stop or restart that producer "
        f"(InitProducerId moves the epoch; the {result.lower()} then needs no flag), or, if it no longer writes "
        f"to {where}, run again with {ALLOW_LIVE_OWNER_FLAG}"
    )


LEADER_CHANGED_SINCE_START = "leader-changed-since-start"
ALLOW_LEADER_CHANGE_FLAG = "--allow-leader-change"
# The refusals an operator may waive, each with the flag that waives it (`proposals abort`; for `commit`, only
# the live owner's).
WAIVERS: dict[str, str] = {
    LIVE_OWNER_SAME_EPOCH: ALLOW_LIVE_OWNER_FLAG,
    LEADER_CHANGED_SINCE_START: ALLOW_LEADER_CHANGE_FLAG,
}


def refusal_name(line: str) -> str:
    """The name a refusal line starts with (`live-owner-same-epoch: ...` -> `live-owner-same-epoch`); a line
    without one gives its text up to the first colon, which names no waivable refusal."""
    return line.split(":", 1)[0]


def waiver_flags(verify: VerifyResult) -> tuple[str, ...]:
    """The flags that would let a REFUSED verification through: every refusal is a waivable one (`WAIVERS`),
    one flag each, in `WAIVERS` order; empty when it is not refused, or when any refusal is not waivable (no
    flag would get that abort through)."""
    if verify.outcome is not VerifyOutcome.REFUSED or not verify.changes:
        return ()
    names = {refusal_name(line) for line in verify.changes}
    if not names <= WAIVERS.keys():
        return ()
    return tuple(flag for name, flag in WAIVERS.items() if name in names)


def leader_changed_since_start(candidate: AbortCandidate, live: LiveEvidence) -> str | None:
    """The refusal `leader-changed-since-start` for an ABORT candidate (any reason but `lost-abort-marker`) when
    the partition's leader is not shown to be in the leader epoch its start batch was appended in (the epochs
    differ, or either is unknown), else None. Waived only by the operator (`--allow-leader-change`). Why: across an
    election a COMMIT marker may have been lost, and an ABORT would undo a commit (docs/proposals.md, "`abort ID`")."""
    spec = candidate.spec
    if spec.transaction_result != "ABORT" or candidate.reason is HangingReason.LOST_ABORT_MARKER:
        return None
    started = live.start_batch_leader_epoch
    if started is None:
        started = candidate.evidence.start_batch_leader_epoch
    now = live.leader_epoch
    if started is not None and now is not None and started == now:
        return None
    where, start = _where(candidate), candidate.start_offset
    changed = "changed" if started is not None and now is not None else "may have changed"
    c = candidate.evidence.coordinator
    tid = shlex.quote(c.transactional_id) if c is not None and c.transactional_id else "<transactional-id>"
    return (
        f"{LEADER_CHANGED_SINCE_START}: the leader of {where} {changed} since this transaction began (its start "
        f"batch was appended at leader epoch {_epoch(started)}, the leader is at epoch {_epoch(now)} now), so a "
        "commit marker of it may have been lost in an unclean leader election, and an ABORT would then undo "
        f"records its coordinator committed; check the partition's log around offset {start} (kafka-dump-log.sh "
        f"--print-data-log: a COMMIT control batch of producer {spec.producer_id} before it means it began after "
        "that commit) and its coordinator's history (txnwatch inspect coordinator-log --transactional-id "
        f"{tid} --from-beginning), and if you are sure it was never committed, run again with "
        f"{ALLOW_LEADER_CHANGE_FLAG}"
    )


def _fenced_past(candidate: AbortCandidate, c: LiveCoordinator) -> bool:
    """The owner is the candidate's producer id at a later epoch than the marker's: a transaction of it (its
    current one, in whatever state) is not the orphan's, and writes only its own partitions at its own epoch (a
    TV2 owner committing elsewhere every 100 ms is in PrepareCommit now and then)."""
    return c.producer_id == candidate.spec.producer_id and c.producer_epoch > candidate.spec.producer_epoch


def _preparing_elsewhere(live: LiveEvidence) -> bool:
    """The owner is writing the markers of a transaction that does not list the candidate's partition."""
    c = live.coordinator
    return (
        live.coordinator_error is None
        and c is not None
        and c.state in {s.value for s in PREPARING_STATES}
        and not c.partition_listed
    )


def _epoch(epoch: int | None) -> str:
    return "unknown" if epoch is None else str(epoch)


def _coordinator_objections(
    candidate: AbortCandidate, live: LiveEvidence, result: MarkerResult = "ABORT"
) -> list[str]:
    where = _where(candidate)
    ended = "aborted" if result == "ABORT" else "committed"
    if result == "ABORT" and candidate_is_two_phase_commit(candidate):
        e = candidate.evidence.coordinator
        return [two_phase_commit_refusal(e.transactional_id if e is not None else "?")]
    if live.coordinator_error is not None:
        return [f"the coordinator side cannot be checked: {live.coordinator_error}"]
    c = live.coordinator
    if c is None:
        if result == "COMMIT":
            # The commit is checked against its coordinator's own record, read now: without an owner it cannot be.
            return [
                f"{COMMIT_OWNER_GONE}: no transactional id owns producer {candidate.spec.producer_id} "
                "any more (expired, or it moved to another producer id): the commit cannot be checked against "
                "its coordinator now; write nothing (runbook: lost markers)"
            ]
        return []
    if result == "ABORT" and is_two_phase_commit(c.transaction_timeout_ms):
        return [two_phase_commit_refusal(c.transactional_id)]
    try:
        state: CoordinatorState | None = CoordinatorState(c.state)
    except ValueError:
        state = None
    if state is None:
        return [f"transactional id {c.transactional_id} is in a state txnwatch does not know ({c.state})"]
    if state in PREPARING_STATES and (
        result == "COMMIT" or c.partition_listed or not _fenced_past(candidate, c)
    ):
        return [
            f"transactional id {c.transactional_id} (producer {c.producer_id}) is {c.state}: its coordinator "
            f"is writing markers right now; a Prepare state is never {ended} by hand"
        ]
    if state is CoordinatorState.ONGOING and c.partition_listed:
        return [
            f"transactional id {c.transactional_id} (producer {c.producer_id}, epoch {c.producer_epoch}) is "
            f"Ongoing with {where} in its partitions: a live transaction its coordinator will finish; "
            f"{'an abort' if result == 'ABORT' else 'a commit'} would break exactly-once"
        ]
    if result == "COMMIT":
        contradiction = commit_contradicted(candidate, c)
        return [] if contradiction is None else [contradiction]
    return []


def post_check(
    candidate: AbortCandidate, after: LiveEvidence, read_committed_offset: int | None = None
) -> PostCheck:
    """Did the marker do its job? The transaction at the start offset is gone and the LSO moved past it (a
    COMMIT moves it as an ABORT does: `ProducerStateManager.completeTxn` either way). For a COMMIT also: the
    records are visible to a read_committed reader, whose first record from the start offset
    (`read_committed_offset`, None when it got none) is the one at the start offset (an ABORT marker would
    have put the transaction in the aborted index: the reader skips it).

    An LSO still at or below the start offset is accepted only when another, older open transaction holds it
    (that one is not this candidate's business; a read_committed reader then gets nothing past it either).
    """
    start, pid = candidate.start_offset, candidate.spec.producer_id
    problems: list[str] = []
    p = after.producer
    if p is not None and p.current_txn_start_offset == start:
        problems.append(f"producer {pid} still has a transaction open at offset {start}")
    lso = after.last_stable_offset
    held_by_older = False
    if lso is None:
        problems.append("the last stable offset could not be read")
    elif lso <= start:
        older = [o for _, o in after.other_open if o < start]
        held_by_older = bool(older) and lso == min(older)
        if not held_by_older:
            problems.append(f"the last stable offset is {lso}, not past the start offset {start}")
    if candidate.spec.transaction_result == "COMMIT" and not held_by_older and not problems:
        if read_committed_offset is None:
            problems.append(f"a read_committed reader got no record from offset {start}")
        elif read_committed_offset != start:
            problems.append(
                f"a read_committed reader skips offset {start} (its first record from there is at "
                f"{read_committed_offset}): the transaction is not committed"
            )
    return PostCheck(ok=not problems, problems=tuple(problems))


def needs_read_committed(candidate: AbortCandidate, after: LiveEvidence) -> bool:
    """The post-check of a COMMIT reads the records back as a read_committed reader once the LSO is past the
    start offset (before that the reader gets nothing there)."""
    lso = after.last_stable_offset
    return candidate.spec.transaction_result == "COMMIT" and lso is not None and lso > candidate.start_offset


def collision_signs(
    candidate: AbortCandidate, before: LiveEvidence, after: LiveEvidence | None
) -> tuple[str, ...]:
    """Why the marker may have aborted records of a live owner: what moved between verification (`before`) and
    the first look after the marker (`after`, None when it could not be read), one line each. Empty when no
    owner was at the marker's epoch at either look (nothing at that epoch could write there), or when nothing
    moved.

    The owner's coordinator (it added the partition, began or ended a transaction, changed epoch or owner) and
    the leader (the producer's last data sequence there moved: it wrote to the partition, which a TV2 client
    does without the coordinator listing the partition when a transaction of its epoch is already open there).
    """
    b = before.coordinator
    a = after.coordinator if after is not None else None
    if not (owner_at_marker_epoch(candidate, b) or owner_at_marker_epoch(candidate, a)):
        return ()
    pid, where = candidate.spec.producer_id, _where(candidate)
    if after is None or after.coordinator_error is not None:
        why = after.coordinator_error if after is not None else "the partition could not be read"
        return (f"the owner of producer {pid} could not be read again after the marker ({why})",)
    signs = list(_owner_moves(b, a, pid=pid, where=where))
    was, now = before.producer, after.producer
    if was is not None and now is not None and now.last_sequence != was.last_sequence:
        signs.append(
            f"the leader of {where} took records of producer {pid} since verification (its last sequence "
            f"moved from {was.last_sequence} to {now.last_sequence})"
        )
    return tuple(signs)


def _owner_moves(b: LiveCoordinator | None, a: LiveCoordinator | None, *, pid: int, where: str) -> list[str]:
    if a is None:
        return [f"{b.transactional_id if b else 'no transactional id'} no longer owns producer {pid}"]
    if b is None or b.transactional_id != a.transactional_id:
        was = b.transactional_id if b else "no transactional id"
        return [f"producer {pid} is owned by {a.transactional_id} now, by {was} at verification"]
    moves = []
    if a.partition_listed:
        moves.append(
            f"{a.transactional_id} now lists {where} in its transaction: it added the partition between "
            "verification and the marker"
        )
    if a.state != b.state:
        moves.append(f"{a.transactional_id} moved from {b.state} to {a.state}")
    if a.producer_epoch != b.producer_epoch:
        moves.append(f"{a.transactional_id}'s epoch moved from {b.producer_epoch} to {a.producer_epoch}")
    if a.transaction_start_ms != b.transaction_start_ms:
        moves.append(
            f"{a.transactional_id} began a transaction since verification (its start moved from "
            f"{b.transaction_start_ms} to {a.transaction_start_ms} ms)"
        )
    return moves


def collision_report(candidate: AbortCandidate, signs: Sequence[str]) -> str:
    """What a COLLISION means and what on-call does, after the signs."""
    where, pid = _where(candidate), candidate.spec.producer_id
    if candidate.spec.transaction_result == "COMMIT":
        fate = (
            f"were committed with the lost transaction (producer {pid}, offsets after {candidate.start_offset}), "
            f"and its coordinator does not know: if it aborts that transaction, those records stay committed on "
            f"{where}"
        )
    else:
        fate = (
            f"were aborted with the orphan (producer {pid}, offsets after {candidate.start_offset}), and its "
            f"coordinator does not know: its commit still succeeds on its other partitions, and on {where} only "
            "what it writes after the marker"
        )
    return (
        "; ".join(signs)
        + f". Records the owner wrote to {where} before the marker {fate}. Exactly-once is broken for that "
        "transaction: tell its owners now (docs/runbook.md, Collision)"
    )


# ------------------------------------------------------------------------------ the audit log's answers


def ended_it(record: AuditRecord) -> bool:
    """The attempt wrote its marker and the post-check saw the transaction gone: ABORTED or COMMITTED, or a
    COLLISION whose post-check passed (the transaction is ended; what else the marker caught is another
    matter)."""
    if record.outcome is AuditOutcome.COLLISION:
        return record.post_check is not None and record.post_check.ok
    return record.outcome in (AuditOutcome.ABORTED, AuditOutcome.COMMITTED)


def prior_ending(history: Iterable[AuditRecord]) -> AuditRecord | None:
    """The attempt that ended the candidate's transaction with its marker, if one did (`history`: its audit
    records, in topic order)."""
    return next((r for r in history if ended_it(r)), None)


def claim_holder(history: Sequence[AuditRecord], *, now_ms: int, lease_ms: int) -> AuditRecord | None:
    """The execution that holds the candidate: the first CLAIMED record, in topic order, whose attempt has no
    ending record yet and whose lease has not run out.

    The audit topic's partition orders the claims of every execution: each reads it back after its own claim is
    acknowledged, so all agree on who came first. A claim ends with its attempt's ending record (same audit id);
    one left by a crashed run expires after `lease_ms`, and the run that takes over verifies again (a marker the
    crashed run wrote shows as ALREADY_RESOLVED).

    Args:
        history: the candidate's audit records in topic order.
        now_ms: the reader's clock; clocks of other machines differ, so leases are minutes, not seconds.
        lease_ms: how long a claim without an ending holds.
    """
    ended = {r.audit_id for r in history if r.outcome is not AuditOutcome.CLAIMED}
    for r in history:
        if r.outcome is AuditOutcome.CLAIMED and r.audit_id not in ended and now_ms - r.at_ms < lease_ms:
            return r
    return None


def resolved_by_audit(audits: Iterable[AuditRecord]) -> set[str]:
    """Candidate ids that need nothing more by the audit log: aborted or committed by an attempt, or found no
    longer open by one (committed or aborted by someone else since the plan)."""
    return {
        a.candidate_id
        for a in audits
        if ended_it(a)
        or a.outcome is AuditOutcome.ALREADY_RESOLVED
        or (a.verify is not None and a.verify.outcome is VerifyOutcome.ALREADY_RESOLVED)
    }


# ------------------------------------------------------------------------------------------- listing


def lso_lag(candidate: AbortCandidate) -> int | None:
    """Records held back from read_committed readers when the candidate was planned (HW - LSO), if known."""
    e = candidate.evidence
    if e.high_watermark is None or e.last_stable_offset is None:
        return None
    return max(0, e.high_watermark - e.last_stable_offset)


def candidate_age_ms(candidate: AbortCandidate, now_ms: int) -> int:
    """How long the transaction has been open at `now_ms`; the verdict's age when its start is unknown."""
    since = candidate.evidence.open_since_ms
    if lateness.known(since):
        return lateness.age_ms(now_ms, since)
    return candidate.evidence.age_ms


def pending_candidates(
    candidates: Iterable[AbortCandidate],
    *,
    cluster: str,
    now_ms: int,
    done: Collection[str] = (),
) -> list[AbortCandidate]:
    """The candidates on-call should look at: this cluster's, OPENED, not in `done` (already aborted or found
    resolved by `proposals abort`), the largest LSO lag first, then the oldest.

    Args:
        candidates: the latest record per candidate id.
        cluster: only this cluster's.
        now_ms: the clock ages are measured on.
        done: candidate ids known to need nothing more.
    """
    pending = [
        c
        for c in candidates
        if c.cluster == cluster and c.status is CandidateStatus.OPENED and c.candidate_id not in done
    ]
    return sorted(
        pending,
        key=lambda c: (-(lso_lag(c) or 0), -candidate_age_ms(c, now_ms), c.candidate_id),
    )
