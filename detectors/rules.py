"""Hanging-transaction rules: a leader's open transaction against the coordinator's view of its producer id. One
pure function per verdict reason, chained by `decide_by_rules`; `decide` is that chain in hot-path form, held equal
to it by tests/unit/test_rules.py; `classify` is models in, a `Verdict` out. No clock. The rules and why each is
safe: docs/detection.md, section 3.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import NamedTuple, Protocol

from detectors.contract import COMPLETE_WITH_MARKERS, COMPLETED_STATES, OWNING_STATES, PREPARING_STATES
from detectors.groups import blocked_groups_note
from detectors.lateness import (
    age_ms,
    elapsed_beyond_skew_ms,
    is_late,
    known,
    late_threshold_ms,
    max_timeout_ms,
)
from detectors.models import (
    CoordinatorEvidence,
    CoordinatorRecord,
    CoordinatorRole,
    CoordinatorState,
    DetectionLimits,
    Evidence,
    HangingReason,
    OpenTransaction,
    Verdict,
    VerdictKind,
    WithheldReason,
    has_deadline,
    is_two_phase_commit,
)

# Transaction version from which every transaction bumps the producer epoch (KIP-890 part 2).
EPOCH_BUMP_TRANSACTION_VERSION = 2
# The completions that follow markers (Empty follows none: InitProducerId, or an abort of nothing).


# ----------------------------------------------------------------------------------------- lean facts


class TxnFacts(NamedTuple):
    """An open transaction and its partition, as primitives (the hot path's input).

    `open_since_ms` is the start batch's timestamp, else LastTimestamp; `first_batch_epoch` is the start
    batch's producer epoch, else the producer's latest epoch. `first_seen_ms` (optional) is when our own
    pipeline first saw this transaction open; when given, grace periods must also have passed since then.
    """

    topic: str
    partition: int
    producer_id: int
    first_batch_epoch: int
    open_since_ms: int
    observed_at_ms: int
    max_transaction_timeout_ms: int | None = None
    first_seen_ms: int | None = None
    # When the collector first saw it open (`OpenTransaction.seen_open_ms`): it had opened by then, whatever its
    # records' time says. None: unknown (a report of a collector from before it was kept, or a pipeline that
    # does not carry it).
    seen_open_ms: int | None = None
    # When the coordinator wrote the record of the first transaction of the producer id that began after T was
    # seen open and did not list P, with no record of the producer id listing P since (stage 2 keeps it,
    # `detectors.tracking.BucketState.track_moved_on`); None: no such record known.
    moved_on_ms: int | None = None
    # The start batch was appended in the leader epoch the report was answered at (True), in another (False), or
    # either is unknown (None): True proves no marker written since T began was lost (`leader_kept`).
    leader_kept: bool | None = None
    # The end offset of the owner's transaction log partition that the same collector measured before it sent the
    # report's request (`logged_before_report`); None: unknown (no such position known, the describe fallback,
    # or a judgement as of an earlier moment than the report). Set by the caller at judgement, never stored.
    log_end_before: int | None = None
    # Where the record that showed the owner moved on (`moved_on_ms`) is in that partition; None: unknown.
    moved_on_offset: int | None = None


class CoordFacts(NamedTuple):
    """A coordinator record as primitives. `state` None = tombstone; partitions as (topic, partition)."""

    producer_id: int
    producer_epoch: int
    previous_producer_id: int
    next_producer_id: int
    client_transaction_version: int
    transaction_timeout_ms: int
    state: CoordinatorState | None
    partitions: frozenset[tuple[str, int]]
    last_update_timestamp_ms: int
    start_timestamp_ms: int
    # Complete* records: the partitions of the Prepare record before it (None: not read), as the model's.
    prepared_partitions: frozenset[tuple[str, int]] | None = None
    # The record's offset in its transaction log partition (None: not known, or a record of the describe
    # fallback, which has none): what `logged_before_report` orders against the report.
    log_offset: int | None = None


class Decision(NamedTuple):
    """What `decide` (or `judge`) concluded: the kind, the hanging reason (HANGING, and the would-be reason of
    UNCONFIRMED), the coordinator's role; `judge` adds why a proof was withheld and, when a proof rests on an
    earlier moment than the newest leader report, that moment."""

    kind: VerdictKind
    reason: HangingReason | None
    role: CoordinatorRole
    withheld: WithheldReason | None = None
    judged_as_of_ms: int | None = None


def coord_facts(record: CoordinatorRecord) -> CoordFacts:
    """The lean form of a coordinator record."""
    return CoordFacts(
        record.producer_id,
        record.producer_epoch,
        record.previous_producer_id,
        record.next_producer_id,
        record.client_transaction_version,
        record.transaction_timeout_ms,
        record.state,
        frozenset((tp.topic, tp.partition) for tp in record.partitions),
        record.last_update_timestamp_ms,
        record.start_timestamp_ms,
        None
        if record.prepared_partitions is None
        else frozenset((tp.topic, tp.partition) for tp in record.prepared_partitions),
    )


class PartitionContext(Protocol):
    """What classify needs of the partition: a `PartitionSnapshot` has it."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def observed_at_ms(self) -> int: ...
    @property
    def max_transaction_timeout_ms(self) -> int | None: ...
    @property
    def last_stable_offset(self) -> int | None: ...
    @property
    def high_watermark(self) -> int | None: ...
    @property
    def leader_epoch(self) -> int | None: ...


def leader_kept(start_batch_leader_epoch: int | None, leader_epoch: int | None) -> bool | None:
    """Whether the partition's leader is in the leader epoch it appended T's start batch in: a leader never
    truncates its own log within its epoch, so every marker written since T began is still there (True); an
    election since, clean or not, may have lost one (False); None when either epoch is unknown."""
    if start_batch_leader_epoch is None or leader_epoch is None:
        return None
    return start_batch_leader_epoch == leader_epoch


def txn_facts(txn: OpenTransaction, ctx: PartitionContext, *, first_seen_ms: int | None = None) -> TxnFacts:
    """The lean form of an open transaction on its partition."""
    return TxnFacts(
        ctx.topic,
        ctx.partition,
        txn.producer_id,
        txn.first_batch_epoch,
        txn.open_since_ms,
        ctx.observed_at_ms,
        ctx.max_transaction_timeout_ms,
        first_seen_ms,
        txn.seen_open_ms,
        None,
        leader_kept(txn.start_batch_leader_epoch, ctx.leader_epoch),
    )


# ------------------------------------------------------------------------------------ shared predicates


def coordinator_role(t: TxnFacts, c: CoordFacts | None) -> CoordinatorRole:
    """How the coordinator record relates to the transaction's producer id.

    Raises:
        ValueError: if a live record names the producer id nowhere (the caller picked the wrong record).
    """
    if c is None or c.state is None or c.state is CoordinatorState.DEAD:
        return CoordinatorRole.NONE
    pid = t.producer_id
    if c.producer_id == pid:
        return CoordinatorRole.CURRENT
    if c.previous_producer_id == pid:
        return CoordinatorRole.PREVIOUS
    if c.next_producer_id == pid:
        return CoordinatorRole.NEXT
    raise _not_about(t, c)


def _not_about(t: TxnFacts, c: CoordFacts) -> ValueError:
    return ValueError(
        f"coordinator record for producer {c.producer_id} (previous {c.previous_producer_id}, "
        f"next {c.next_producer_id}) is not about producer {t.producer_id}"
    )


def settled(t: TxnFacts, limits: DetectionLimits) -> bool:
    """The transaction had been open for longer than the grace period when the leader reported it.

    The coordinator writes the record that would own a partition (Ongoing with P) before the leader appends
    the transaction's first batch there, so once the grace period (our bound on the coordinator view's lag)
    has passed since the start, any owning record has reached us. The age comes from producer timestamps,
    so it is reduced by the clock-skew tolerance; `first_seen_ms`, when known, must agree.
    """
    g = limits.grace_ms
    seen = open_by(t)
    if known(t.open_since_ms):
        if elapsed_beyond_skew_ms(t.observed_at_ms, t.open_since_ms, limits.clock_skew_ms) <= g:
            return False
    elif seen is None:
        return False  # no timestamp and no first sighting: the age is unknown, never "past the grace"
    return seen is None or t.observed_at_ms - seen > g


def settles_at_ms(open_since_ms: int, seen_open_ms: int | None, limits: DetectionLimits) -> int | None:
    """The earliest report time at which `settled` holds for a transaction open since `open_since_ms` and first
    seen open at `seen_open_ms`: when a report proves the most. None: no report ever settles it (no usable
    timestamp and no sighting). The collector re-describes a partition then rather than at its next sweep; the
    rules judge that report as any other."""
    times: list[int] = []
    if known(open_since_ms):
        times.append(open_since_ms + limits.clock_skew_ms + limits.grace_ms + 1)
    if seen_open_ms is not None:
        times.append(seen_open_ms + limits.grace_ms + 1)
    return max(times) if times else None


def open_by(t: TxnFacts) -> int | None:
    """The earliest moment T is known to have been open: when the collector received its first report with T
    open (`seen_open_ms`; a report is stamped when its request was sent, and the leader's state is from some
    moment before the answer arrived); else the pipeline's first report (`first_seen_ms`: collectors that do not
    send `seen_open_ms` stamped reports at arrival). A transaction open at two reports with one start offset was
    open in between."""
    return t.seen_open_ms if t.seen_open_ms is not None else t.first_seen_ms


def snapshot_after(t: TxnFacts, event_ms: int, limits: DetectionLimits) -> bool:
    """The snapshot is newer than a coordinator event by more than the grace period (skew-reduced)."""
    return elapsed_beyond_skew_ms(t.observed_at_ms, event_ms, limits.clock_skew_ms) > limits.grace_ms


def logged_before_report(t: TxnFacts, offset: int | None) -> bool:
    """The coordinator record at `offset` was in the transaction log before the report's request was sent: it
    lies below the partition's end offset that the same collector measured before sending it
    (`t.log_end_before`). The offsets order the two; no clock is compared. What that proves: docs/detection.md,
    section 4, "Ordered by offsets"."""
    return offset is not None and offset >= 0 and t.log_end_before is not None and offset < t.log_end_before


def after_event(t: TxnFacts, c: CoordFacts, event_ms: int, limits: DetectionLimits) -> bool:
    """The report comes after the coordinator record `c` (whose time of interest is `event_ms`) in a way that
    proves: ordered by the transaction log's offsets, or, by the clocks, settled and newer than the event by the
    grace period (skew-reduced)."""
    return logged_before_report(t, c.log_offset) or (
        settled(t, limits) and snapshot_after(t, event_ms, limits)
    )


def lists_partition(t: TxnFacts, c: CoordFacts) -> bool:
    return (t.topic, t.partition) in c.partitions


def two_phase_commit(t: TxnFacts, c: CoordFacts | None) -> bool:
    """The coordinator owns the transaction's producer id as a KIP-939 two-phase-commit transaction: a live
    record of it whose timeout is Integer.MAX_VALUE (`TransactionMetadata.isDistributedTwoPhaseCommitTxn()`).

    A label, not a verdict: every rule holds for it as for any transaction, except COORDINATOR_OVERDUE (no
    timeout, so the coordinator never aborts it). Never raises, whatever record it is given.
    """
    return (
        c is not None
        and c.state is not None
        and c.state is not CoordinatorState.DEAD
        and c.producer_id == t.producer_id
        and is_two_phase_commit(c.transaction_timeout_ms)
    )


# ----------------------------------------------------------------------------------- one rule per reason


def older_than_coordinator_transaction(t: TxnFacts, c: CoordFacts | None, limits: DetectionLimits) -> bool:
    """HANGING: the open transaction belongs to a transaction the coordinator has already finished: its producer id
    is the record's previous one, or the coordinator is Ongoing in a newer transaction of it that does not list the
    partition (a listed partition gets that transaction's marker: not hanging). Each proof and why it is safe:
    docs/detection.md, section 3, "`older-than-coordinator-transaction`".
    """
    if c is None:
        return False
    role = coordinator_role(t, c)
    if role is CoordinatorRole.PREVIOUS:
        return after_event(t, c, c.last_update_timestamp_ms, limits)
    if (
        role is not CoordinatorRole.CURRENT
        or c.state is not CoordinatorState.ONGOING
        or lists_partition(t, c)
    ):
        return False
    if not after_event(t, c, c.start_timestamp_ms, limits):
        return False
    if t.first_batch_epoch < c.producer_epoch:
        return True
    return (
        c.client_transaction_version < EPOCH_BUMP_TRANSACTION_VERSION
        and t.first_batch_epoch == c.producer_epoch
        and known(t.open_since_ms)
        and t.open_since_ms < c.start_timestamp_ms - limits.clock_skew_ms
    )


def no_coordinator_state(
    t: TxnFacts, c: CoordFacts | None, limits: DetectionLimits, *, retired_at_ms: int | None = None
) -> bool:
    """HANGING: no transactional id owns the producer id (no record, tombstone, Dead), past the grace period.

    `retired_at_ms`, when known (stage 1 saw the id's last owner move away or expire), must also be older
    than the snapshot by the grace period: a snapshot taken before the move may show markers not yet written.
    """
    if coordinator_role(t, c) is not CoordinatorRole.NONE or not settled(t, limits):
        return False
    return retired_at_ms is None or snapshot_after(t, retired_at_ms, limits)


def marker_of_completed_transaction(t: TxnFacts, c: CoordFacts | None, limits: DetectionLimits) -> bool:
    """The coordinator completed a transaction whose Prepare record listed this partition, and the snapshot is
    newer than that completion by the grace period (settled): the coordinator sent the partition its marker and
    had it acknowledged before it wrote Complete* (`TransactionMarkerChannelManager`), yet a transaction of the
    producer id is open there. The marker closes whatever the producer id has open on the partition
    (`ProducerAppendInfo.appendEndTxnMarker`), so either it was lost after it was acknowledged (an unclean leader
    election truncates it away) or this transaction began after it (a late write)."""
    return (
        c is not None
        and c.state in COMPLETE_WITH_MARKERS
        and c.prepared_partitions is not None
        and (t.topic, t.partition) in c.prepared_partitions
        and coordinator_role(t, c) is CoordinatorRole.CURRENT
        and after_event(t, c, c.last_update_timestamp_ms, limits)
    )


def open_before(t: TxnFacts, event_ms: int, limits: DetectionLimits) -> bool:
    """The collector saw the transaction open before a coordinator event (skew-reduced): it began before it."""
    return t.seen_open_ms is not None and t.seen_open_ms < event_ms - limits.clock_skew_ms


def lost_marker(t: TxnFacts, c: CoordFacts | None, limits: DetectionLimits) -> bool:
    """HANGING lost-commit-marker / lost-abort-marker: `marker_of_completed_transaction`, and the transaction was
    seen open before the completion, so it was open when the marker should have closed it: the marker was lost.
    Its remedy is the coordinator's outcome: COMMIT for a commit (an ABORT would undo a commit every other
    partition of the transaction made, and its client was told it succeeded), ABORT for an abort."""
    return (
        marker_of_completed_transaction(t, c, limits)
        and c is not None
        and open_before(t, c.last_update_timestamp_ms, limits)
    )


def write_after_marker(t: TxnFacts, c: CoordFacts | None, limits: DetectionLimits) -> bool:
    """HANGING write-after-marker: `marker_of_completed_transaction` for a commit, T was not seen open before it,
    and T's start batch was appended in the leader epoch the leader still reports (`leader_kept`). The commit
    marker was acknowledged before Complete was written and no leader change since T began could have removed
    it, yet T is open: T began after the marker (a Produce retried after the commit, KIP-890's motivation). The
    commit is whole; the remedy is ABORT."""
    return (
        marker_of_completed_transaction(t, c, limits)
        and c is not None
        and c.state is CoordinatorState.COMPLETE_COMMIT
        and not open_before(t, c.last_update_timestamp_ms, limits)
        and t.leader_kept is True
    )


def commit_or_late_write(t: TxnFacts, c: CoordFacts | None, limits: DetectionLimits) -> bool:
    """Withheld (UNCONFIRMED commit-or-late-write): `marker_of_completed_transaction` for a commit, T was not
    seen open before it, and the partition's leader changed since T began (or that is unknown): a commit whose
    marker was lost in the election (COMMIT restores it) and a write after the marker landed (ABORT) look the
    same, and the remedies are opposite. (For an abort both remedies are ABORT: `coordinator_completed` proves
    it.)"""
    return (
        marker_of_completed_transaction(t, c, limits)
        and c is not None
        and c.state is CoordinatorState.COMPLETE_COMMIT
        and not open_before(t, c.last_update_timestamp_ms, limits)
        and t.leader_kept is not True
    )


def coordinator_completed(t: TxnFacts, c: CoordFacts | None, limits: DetectionLimits) -> bool:
    """HANGING: the coordinator says Empty/CompleteCommit/CompleteAbort for this producer id, and the snapshot
    is newer than that completion by the grace period: every marker was acknowledged before Complete* was
    written, so an open transaction seen after it will not get one."""
    return (
        c is not None
        and c.state in COMPLETED_STATES
        and coordinator_role(t, c) is CoordinatorRole.CURRENT
        and after_event(t, c, c.last_update_timestamp_ms, limits)
    )


def partition_not_in_transaction(t: TxnFacts, c: CoordFacts | None, limits: DetectionLimits) -> bool:
    """HANGING: the coordinator is Ongoing/Prepare* for this producer id but does not list the partition,
    past the grace period (the rule of Kafka's find-hanging): its markers will go elsewhere."""
    return (
        c is not None
        and c.state in OWNING_STATES
        and coordinator_role(t, c) is CoordinatorRole.CURRENT
        and not lists_partition(t, c)
        and after_event(t, c, c.start_timestamp_ms, limits)
    )


def writes_partition(t: TxnFacts, c: CoordFacts) -> bool:
    """C lists P: in its partitions, or (a Complete record) in its Prepare record's, where a marker went."""
    tp = (t.topic, t.partition)
    return tp in c.partitions or (c.prepared_partitions is not None and tp in c.prepared_partitions)


def owner_moved_on(t: TxnFacts, c: CoordFacts | None, limits: DetectionLimits) -> bool:
    """HANGING owner-moved-on: the owner lives on. A transaction of T's producer id began after T was seen open
    without listing P, no record of the producer id has listed P since (`moved_on_ms`), the report is after that
    record (by offsets, or skew-reduced and settled), and the newest record does not list P either. Why it is
    needed and safe: docs/detection.md, section 3, "`owner-moved-on`".
    """
    return (
        t.moved_on_ms is not None
        and c is not None
        and coordinator_role(t, c) is CoordinatorRole.CURRENT
        and not writes_partition(t, c)
        and (
            logged_before_report(t, t.moved_on_offset)
            or (
                settled(t, limits)
                and elapsed_beyond_skew_ms(t.observed_at_ms, t.moved_on_ms, limits.clock_skew_ms) > 0
            )
        )
    )


def stuck_prepare(t: TxnFacts, c: CoordFacts | None, limits: DetectionLimits) -> bool:
    """STUCK_PREPARE (alert only): PrepareCommit/PrepareAbort lists the partition and its marker is overdue
    by the grace period. Never an abort candidate: aborting one partition of a commit breaks atomicity."""
    return (
        c is not None
        and c.state in PREPARING_STATES
        and coordinator_role(t, c) is CoordinatorRole.CURRENT
        and lists_partition(t, c)
        and snapshot_after(t, c.last_update_timestamp_ms, limits)
    )


def coordinator_overdue(t: TxnFacts, c: CoordFacts | None, now_ms: int, limits: DetectionLimits) -> bool:
    """COORDINATOR_OVERDUE (alert only): Ongoing with the partition, older than its own timeout plus the
    coordinator's abort-cleanup interval: the coordinator should have aborted it. Only a timeout the coordinator
    enforces has a deadline (`has_deadline`): never a KIP-939 two-phase-commit transaction (Integer.MAX_VALUE,
    which `TransactionStateManager`'s timeout sweep skips), nor a value Kafka does not write (0, -1)."""
    return (
        c is not None
        and own_deadline(t, c)
        and elapsed_beyond_skew_ms(now_ms, c.start_timestamp_ms, limits.clock_skew_ms)
        > c.transaction_timeout_ms + limits.coordinator_cleanup_interval_ms
    )


def own_deadline(t: TxnFacts, c: CoordFacts) -> bool:
    """C is T's own transaction (current, Ongoing, listing P) with a timeout its coordinator enforces."""
    return (
        c.state is CoordinatorState.ONGOING
        and has_deadline(c.transaction_timeout_ms)
        and coordinator_role(t, c) is CoordinatorRole.CURRENT
        and lists_partition(t, c)
    )


def late_threshold(t: TxnFacts, c: CoordFacts | None, limits: DetectionLimits) -> int:
    """How long T may stay open before it is LATE: the leader's transaction.max.timeout.ms (the detection
    default when unknown) plus `late_buffer_ms`; the transaction's own timeout instead, when lower and the
    coordinator's record is T's transaction (current, Ongoing, listing P) with a timeout it enforces. Kafka
    validates a producer's timeout against its *coordinator's* transaction.max.timeout.ms
    (`TransactionStateManager.validateTransactionTimeoutMs`), not the leader's, and aborts the transaction once
    that timeout passes: past it, the transaction is late whatever the leader's maximum says."""
    threshold = max_timeout_ms(t.max_transaction_timeout_ms, limits.default_max_transaction_timeout_ms)
    if c is not None and own_deadline(t, c):
        threshold = min(threshold, c.transaction_timeout_ms)
    return late_threshold_ms(threshold, limits.late_buffer_ms)


def aged_since(t: TxnFacts) -> int:
    """What LATE counts from: the collector's first sighting of T open (a lower bound of its age), else its
    records' time (`detectors.models.aged_since_ms`)."""
    return t.seen_open_ms if t.seen_open_ms is not None and t.seen_open_ms > 0 else t.open_since_ms


def late(t: TxnFacts, c: CoordFacts | None, now_ms: int, limits: DetectionLimits) -> bool:
    """LATE: open for longer than `late_threshold` (strict), counted from what was observed (`aged_since`).
    Without a coordinator record of T's own transaction, this is the metric's rule: transaction.max.timeout.ms +
    late_buffer_ms."""
    return is_late(now_ms, aged_since(t), late_threshold(t, c, limits))


# --------------------------------------------------------------------------------------------- deciding


def decide_by_rules(
    t: TxnFacts,
    c: CoordFacts | None,
    now_ms: int,
    limits: DetectionLimits,
    *,
    retired_at_ms: int | None = None,
) -> Decision:
    """The reference classification: the rule functions in order, the first that holds decides (the order and why
    the rules exclude each other: docs/detection.md, section 3). `decide` computes the same answer faster; a property
    test holds them equal.
    """
    role = coordinator_role(t, c)
    if older_than_coordinator_transaction(t, c, limits):
        return Decision(VerdictKind.HANGING, HangingReason.OLDER_THAN_COORDINATOR_TRANSACTION, role)
    if no_coordinator_state(t, c, limits, retired_at_ms=retired_at_ms):
        return Decision(VerdictKind.HANGING, HangingReason.NO_COORDINATOR_STATE, role)
    if lost_marker(t, c, limits) and c is not None:
        lost = (
            HangingReason.LOST_COMMIT_MARKER
            if c.state is CoordinatorState.COMPLETE_COMMIT
            else HangingReason.LOST_ABORT_MARKER
        )
        return Decision(VerdictKind.HANGING, lost, role)
    if write_after_marker(t, c, limits):
        return Decision(VerdictKind.HANGING, HangingReason.WRITE_AFTER_MARKER, role)
    if commit_or_late_write(t, c, limits):
        return Decision(
            VerdictKind.UNCONFIRMED,
            HangingReason.COORDINATOR_COMPLETED,
            role,
            WithheldReason.COMMIT_OR_LATE_WRITE,
        )
    if coordinator_completed(t, c, limits):
        return Decision(VerdictKind.HANGING, HangingReason.COORDINATOR_COMPLETED, role)
    if partition_not_in_transaction(t, c, limits):
        return Decision(VerdictKind.HANGING, HangingReason.PARTITION_NOT_IN_TRANSACTION, role)
    if owner_moved_on(t, c, limits):
        return Decision(VerdictKind.HANGING, HangingReason.OWNER_MOVED_ON, role)
    if stuck_prepare(t, c, limits):
        return Decision(VerdictKind.STUCK_PREPARE, None, role)
    if coordinator_overdue(t, c, now_ms, limits):
        return Decision(VerdictKind.COORDINATOR_OVERDUE, None, role)
    if late(t, c, now_ms, limits):
        return Decision(VerdictKind.LATE, None, role)
    return Decision(VerdictKind.OPEN, None, role)


# Every possible Decision, built once: the hot path returns one of these instead of allocating.
_OPEN_NONE = Decision(VerdictKind.OPEN, None, CoordinatorRole.NONE)
_OPEN_CURRENT = Decision(VerdictKind.OPEN, None, CoordinatorRole.CURRENT)
_OPEN_PREVIOUS = Decision(VerdictKind.OPEN, None, CoordinatorRole.PREVIOUS)
_OPEN_NEXT = Decision(VerdictKind.OPEN, None, CoordinatorRole.NEXT)
_LATE_NONE = Decision(VerdictKind.LATE, None, CoordinatorRole.NONE)
_LATE_CURRENT = Decision(VerdictKind.LATE, None, CoordinatorRole.CURRENT)
_LATE_PREVIOUS = Decision(VerdictKind.LATE, None, CoordinatorRole.PREVIOUS)
_LATE_NEXT = Decision(VerdictKind.LATE, None, CoordinatorRole.NEXT)
_HANGING_NO_COORDINATOR = Decision(
    VerdictKind.HANGING, HangingReason.NO_COORDINATOR_STATE, CoordinatorRole.NONE
)
_HANGING_OLDER_PREVIOUS = Decision(
    VerdictKind.HANGING, HangingReason.OLDER_THAN_COORDINATOR_TRANSACTION, CoordinatorRole.PREVIOUS
)
_HANGING_OLDER = Decision(
    VerdictKind.HANGING, HangingReason.OLDER_THAN_COORDINATOR_TRANSACTION, CoordinatorRole.CURRENT
)
_HANGING_COMPLETED = Decision(
    VerdictKind.HANGING, HangingReason.COORDINATOR_COMPLETED, CoordinatorRole.CURRENT
)
_HANGING_NOT_LISTED = Decision(
    VerdictKind.HANGING, HangingReason.PARTITION_NOT_IN_TRANSACTION, CoordinatorRole.CURRENT
)
_HANGING_WRITE_AFTER_MARKER = Decision(
    VerdictKind.HANGING, HangingReason.WRITE_AFTER_MARKER, CoordinatorRole.CURRENT
)
_HANGING_MOVED_ON = Decision(VerdictKind.HANGING, HangingReason.OWNER_MOVED_ON, CoordinatorRole.CURRENT)
_LOST_COMMIT = Decision(VerdictKind.HANGING, HangingReason.LOST_COMMIT_MARKER, CoordinatorRole.CURRENT)
_LOST_ABORT = Decision(VerdictKind.HANGING, HangingReason.LOST_ABORT_MARKER, CoordinatorRole.CURRENT)
_COMMIT_OR_LATE_WRITE = Decision(
    VerdictKind.UNCONFIRMED,
    HangingReason.COORDINATOR_COMPLETED,
    CoordinatorRole.CURRENT,
    WithheldReason.COMMIT_OR_LATE_WRITE,
)
_STUCK = Decision(VerdictKind.STUCK_PREPARE, None, CoordinatorRole.CURRENT)
_OVERDUE = Decision(VerdictKind.COORDINATOR_OVERDUE, None, CoordinatorRole.CURRENT)
_ONGOING = CoordinatorState.ONGOING
_DEAD = CoordinatorState.DEAD


def decide(
    t: TxnFacts,
    c: CoordFacts | None,
    now_ms: int,
    limits: DetectionLimits,
    *,
    retired_at_ms: int | None = None,
) -> Decision:
    """Classify one open transaction on primitives: the streaming hot path.

    `decide_by_rules` (the rule chain, defined there once) computed with each quantity evaluated once and
    dispatched on the coordinator's role and state set (`detectors.contract`); a change to a rule or to the
    order goes into `decide_by_rules` first, then here, and the equivalence test over every state, role and
    listing (tests/unit/test_rules.py) fails until the two agree.

    Args:
        t: the open transaction (lean form).
        c: the coordinator's view of its producer id, or None if no transactional id owns it.
        now_ms: current time for ages (LATE, COORDINATOR_OVERDUE); proofs use `t.observed_at_ms`.
        limits: thresholds.
        retired_at_ms: when the producer id lost its owner, if known (see `no_coordinator_state`).

    Returns:
        The decision.

    Raises:
        ValueError: if `c` is a live record that does not name the producer id.
    """
    grace = limits.grace_ms
    skew = limits.clock_skew_ms
    obs = t.observed_at_ms
    since = t.open_since_ms
    # `settled`: open for longer than the grace period at observation, skew-reduced (and since first seen).
    first_seen = t.seen_open_ms if t.seen_open_ms is not None else t.first_seen_ms  # open_by
    since_known = since > 0
    settled = (obs - since - skew > grace if since_known else first_seen is not None) and (
        first_seen is None or obs - first_seen > grace
    )
    max_timeout = t.max_transaction_timeout_ms
    if max_timeout is None:
        max_timeout = limits.default_max_transaction_timeout_ms
    aged = t.seen_open_ms if t.seen_open_ms is not None and t.seen_open_ms > 0 else since  # aged_since
    is_late = aged > 0 and now_ms - aged > max_timeout + limits.late_buffer_ms

    state = c.state if c is not None else None
    end_before = t.log_end_before
    # logged_before_report(t, c.log_offset): the record is ordered before the report by offsets
    ordered = (
        end_before is not None
        and c is not None
        and c.log_offset is not None
        and 0 <= c.log_offset < end_before
    )
    if c is None or state is None or state is _DEAD:
        if settled and (retired_at_ms is None or obs - retired_at_ms - skew > grace):
            return _HANGING_NO_COORDINATOR
        return _LATE_NONE if is_late else _OPEN_NONE
    pid = t.producer_id
    if c.producer_id != pid:
        if c.previous_producer_id == pid:
            if ordered or (settled and obs - c.last_update_timestamp_ms - skew > grace):
                return _HANGING_OLDER_PREVIOUS
            return _LATE_PREVIOUS if is_late else _OPEN_PREVIOUS
        if c.next_producer_id == pid:
            return _LATE_NEXT if is_late else _OPEN_NEXT
        raise _not_about(t, c)
    listed = (t.topic, t.partition) in c.partitions
    if state is _ONGOING:
        if not listed:
            if ordered or (settled and obs - c.start_timestamp_ms - skew > grace):
                first = t.first_batch_epoch
                epoch = c.producer_epoch
                if first < epoch or (
                    first == epoch
                    and c.client_transaction_version < EPOCH_BUMP_TRANSACTION_VERSION
                    and since_known
                    and since < c.start_timestamp_ms - skew
                ):
                    return _HANGING_OLDER
                return _HANGING_NOT_LISTED
        elif has_deadline(c.transaction_timeout_ms):
            if (
                now_ms - c.start_timestamp_ms - skew
                > c.transaction_timeout_ms + limits.coordinator_cleanup_interval_ms
            ):
                return _OVERDUE
            if c.transaction_timeout_ms < max_timeout:  # late_threshold: its own timeout, when lower
                is_late = aged > 0 and now_ms - aged > c.transaction_timeout_ms + limits.late_buffer_ms
    elif state in PREPARING_STATES:
        if not listed:
            if ordered or (settled and obs - c.start_timestamp_ms - skew > grace):
                return _HANGING_NOT_LISTED
        elif obs - c.last_update_timestamp_ms - skew > grace:
            return _STUCK
    elif state in COMPLETED_STATES and (
        ordered or (settled and obs - c.last_update_timestamp_ms - skew > grace)
    ):
        prepared = c.prepared_partitions
        if state in COMPLETE_WITH_MARKERS and prepared is not None and (t.topic, t.partition) in prepared:
            seen = t.seen_open_ms
            if seen is not None and seen < c.last_update_timestamp_ms - skew:  # open_before
                return _LOST_COMMIT if state is CoordinatorState.COMPLETE_COMMIT else _LOST_ABORT
            if state is CoordinatorState.COMPLETE_COMMIT:
                return _HANGING_WRITE_AFTER_MARKER if t.leader_kept is True else _COMMIT_OR_LATE_WRITE
        return _HANGING_COMPLETED
    moved_on = t.moved_on_ms
    moved_on_offset = t.moved_on_offset
    if (
        moved_on is not None
        and (
            (end_before is not None and moved_on_offset is not None and 0 <= moved_on_offset < end_before)
            or (settled and obs - moved_on - skew > 0)
        )
        and not listed
        and not (c.prepared_partitions is not None and (t.topic, t.partition) in c.prepared_partitions)
    ):  # owner_moved_on
        return _HANGING_MOVED_ON
    return _LATE_CURRENT if is_late else _OPEN_CURRENT


# Verdicts that rest on the coordinator view being complete up to the report: HANGING (no record will close it),
# STUCK_PREPARE and COORDINATOR_OVERDUE (no newer record moved the transaction on; on a stale view the record
# may be an earlier transaction of the same producer, long finished).
_NEEDS_CURRENT_VIEW = frozenset(
    {VerdictKind.HANGING, VerdictKind.STUCK_PREPARE, VerdictKind.COORDINATOR_OVERDUE}
)


def judge(
    t: TxnFacts,
    c: CoordFacts | None,
    now_ms: int,
    limits: DetectionLimits,
    *,
    view_current_ms: int | None,
    retired_at_ms: int | None = None,
) -> Decision:
    """`decide`, with a HANGING proof only on a coordinator view shown to be current (the job's entry point).

    `view_current_ms` is the measured time the view of every partition that could own the transaction is current
    as of (`detectors.currency`), None if unknown. A HANGING answer stands if the view is current as of the report,
    or as of an earlier moment the transaction was already open (then judged as of it); otherwise it is withheld
    as UNCONFIRMED `coordinator-view-behind`. STUCK_PREPARE and COORDINATOR_OVERDUE fall back to LATE or OPEN on a
    view not current. Why: docs/detection.md, section 4, "The rule".
    """
    decision = decide(t, c, now_ms, limits, retired_at_ms=retired_at_ms)
    if decision.kind not in _NEEDS_CURRENT_VIEW:
        return decision
    if view_current_ms is not None:
        if view_current_ms >= t.observed_at_ms:
            return decision
        seen = open_by(t)
        if seen is not None and view_current_ms >= seen:
            # The log end measured before the report orders nothing before an earlier moment.
            earlier = decide(
                t._replace(observed_at_ms=view_current_ms, log_end_before=None),
                c,
                now_ms,
                limits,
                retired_at_ms=retired_at_ms,
            )
            if earlier.kind is decision.kind:
                return earlier._replace(judged_as_of_ms=view_current_ms)
    if decision.kind is VerdictKind.HANGING:
        return Decision(
            VerdictKind.UNCONFIRMED, decision.reason, decision.role, WithheldReason.COORDINATOR_VIEW_BEHIND
        )
    # An alert on a stale view waits too: LATE or OPEN until the view is current (LATE by the leader's maximum:
    # a stale record's timeout may be an earlier transaction's).
    late_now = late(t, None, now_ms, limits)
    return Decision(VerdictKind.LATE if late_now else VerdictKind.OPEN, None, decision.role)


def judge_view(
    t: TxnFacts,
    c: CoordFacts | None,
    now_ms: int,
    limits: DetectionLimits,
    *,
    view_current_ms: int | None,
    retired_at_ms: int | None = None,
) -> Decision:
    """`judge` for a view a pipeline stored: a live record that names neither the producer id nor its
    previous or next one is the pipeline's own inconsistency, not a fact about the cluster. It is judged as
    having no record, and any HANGING answer is withheld (`coordinator-view-inconsistent`); `decide` itself
    refuses such a record (ValueError)."""
    if (
        c is not None
        and c.state is not None
        and t.producer_id
        not in (
            c.producer_id,
            c.previous_producer_id,
            c.next_producer_id,
        )
    ):
        d = decide(t, None, now_ms, limits)
        if d.kind is VerdictKind.HANGING:
            return Decision(
                VerdictKind.UNCONFIRMED, d.reason, d.role, WithheldReason.COORDINATOR_VIEW_INCONSISTENT
            )
        return d
    return judge(t, c, now_ms, limits, view_current_ms=view_current_ms, retired_at_ms=retired_at_ms)


def is_abort_candidate(verdict: Verdict) -> bool:
    """Only a HANGING verdict may become an abort candidate (never STUCK_PREPARE or COORDINATOR_OVERDUE)."""
    return verdict.kind is VerdictKind.HANGING


def select_coordinator_view(
    producer_id: int, records: Iterable[CoordinatorRecord]
) -> CoordinatorRecord | None:
    """Pick the coordinator's view of a producer id from the latest record of each transactional id.

    A record whose current producer id matches wins over one naming it as previous, which wins over one
    naming it as next; ties go to the most recently updated record. Tombstones and Dead records own nothing.

    Returns:
        The record, or None when no transactional id owns the producer id.
    """
    best: CoordinatorRecord | None = None
    best_rank = (0, 0)
    for r in records:
        if r.state is None or r.state is CoordinatorState.DEAD:
            continue
        if r.producer_id == producer_id:
            priority = 3
        elif r.previous_producer_id == producer_id:
            priority = 2
        elif r.next_producer_id == producer_id:
            priority = 1
        else:
            continue
        rank = (priority, r.last_update_timestamp_ms)
        if best is None or rank > best_rank:
            best, best_rank = r, rank
    return best


# ----------------------------------------------------------------------------------------- the model API


def classify(
    txn: OpenTransaction,
    partition_ctx: PartitionContext,
    coordinator_view: CoordinatorRecord | None,
    *,
    now_ms: int,
    limits: DetectionLimits,
    view_current_ms: int | None,
    first_seen_ms: int | None = None,
    retired_at_ms: int | None = None,
    moved_on_ms: int | None = None,
) -> Verdict:
    """Classify one open transaction seen on a partition leader (`judge`, explained).

    Args:
        txn: the open transaction from the snapshot.
        partition_ctx: its partition (a `PartitionSnapshot`): topic, partition, observed_at_ms, max timeout.
        coordinator_view: the latest record naming the producer id as current, previous or next producer id
            (see `select_coordinator_view`), a tombstone, or None if no transactional id owns it.
        now_ms: current time; this module never reads a clock.
        limits: thresholds.
        view_current_ms: the time the coordinator view is shown current as of (`detectors.currency`), None if
            not shown: then no HANGING verdict, only UNCONFIRMED. Pass `observed_at_ms` only when the view
            was read to its end after the leader answered.
        first_seen_ms: when our pipeline first saw this transaction open, if tracked.
        retired_at_ms: when the producer id lost its owner, if known; a tombstone view supplies its own time.
        moved_on_ms: see `TxnFacts.moved_on_ms` (stage 2 tracks it).

    Returns:
        The verdict, with evidence and a one-line explanation.

    Raises:
        ValueError: if `coordinator_view` is a live record about another producer id.
    """
    t = txn_facts(txn, partition_ctx, first_seen_ms=first_seen_ms)._replace(moved_on_ms=moved_on_ms)
    c = coord_facts(coordinator_view) if coordinator_view is not None else None
    if retired_at_ms is None and coordinator_view is not None and coordinator_view.tombstone:
        retired_at_ms = (
            coordinator_view.source_timestamp_ms if coordinator_view.source_timestamp_ms >= 0 else None
        )
    decision = judge(t, c, now_ms, limits, view_current_ms=view_current_ms, retired_at_ms=retired_at_ms)
    return build_verdict(
        decision,
        txn,
        partition_ctx,
        coordinator_view,
        now_ms=now_ms,
        limits=limits,
        retired_at_ms=retired_at_ms,
        view_current_ms=view_current_ms,
        first_seen_ms=first_seen_ms,
        moved_on_ms=moved_on_ms,
    )


def build_verdict(
    decision: Decision,
    txn: OpenTransaction,
    partition_ctx: PartitionContext,
    coordinator_view: CoordinatorRecord | None,
    *,
    now_ms: int,
    limits: DetectionLimits,
    retired_at_ms: int | None = None,
    view_current_ms: int | None = None,
    first_seen_ms: int | None = None,
    moved_on_ms: int | None = None,
) -> Verdict:
    """The `Verdict` (evidence, explanation) for a decision `decide` or `judge` made on the same inputs.

    The hot path runs `decide` on every open transaction and calls this only for the ones it emits (e.g. all
    but OPEN): building the models costs tens of microseconds, deciding well under one.

    Args:
        decision: what `decide` returned for this transaction.
        txn, partition_ctx, coordinator_view, now_ms, limits, retired_at_ms, view_current_ms, first_seen_ms,
            moved_on_ms: as given to `classify`.

    Returns:
        The verdict.
    """
    evidence = _evidence(txn, partition_ctx, coordinator_view, decision.role, now_ms, limits, retired_at_ms)
    judged_as_of = decision.judged_as_of_ms
    if judged_as_of is None and decision.kind is VerdictKind.HANGING:
        judged_as_of = partition_ctx.observed_at_ms
    evidence = evidence.model_copy(
        update={
            "view_current_as_of_ms": view_current_ms,
            "judged_as_of_ms": judged_as_of,
            "first_seen_ms": first_seen_ms,
            "owner_moved_on_ms": moved_on_ms,
        }
    )
    return Verdict(
        kind=decision.kind,
        reason=decision.reason,
        withheld=decision.withheld,
        evidence=evidence,
        explanation=explain(decision, evidence, limits),
        two_phase_commit=evidence.coordinator is not None and evidence.coordinator.two_phase_commit,
    )


def _evidence(
    txn: OpenTransaction,
    ctx: PartitionContext,
    record: CoordinatorRecord | None,
    role: CoordinatorRole,
    now_ms: int,
    limits: DetectionLimits,
    retired_at_ms: int | None,
) -> Evidence:
    max_timeout = max_timeout_ms(ctx.max_transaction_timeout_ms, limits.default_max_transaction_timeout_ms)
    coordinator = None
    overdue_threshold = None
    own_timeout: int | None = None
    if record is not None and role is not CoordinatorRole.NONE:
        coordinator = CoordinatorEvidence(
            role=role,
            transactional_id=record.transactional_id,
            state=record.state,
            producer_id=record.producer_id,
            producer_epoch=record.producer_epoch,
            previous_producer_id=record.previous_producer_id,
            next_producer_id=record.next_producer_id,
            client_transaction_version=record.client_transaction_version,
            transaction_timeout_ms=record.transaction_timeout_ms,
            start_timestamp_ms=record.start_timestamp_ms,
            last_update_timestamp_ms=record.last_update_timestamp_ms,
            partition_listed=record.lists(ctx.topic, ctx.partition),
            transaction_version=None
            if record.origin == "describe-transactions"
            else record.client_transaction_version,
            prepared_partition_listed=None
            if record.prepared_partitions is None
            else any(
                (tp.topic, tp.partition) == (ctx.topic, ctx.partition) for tp in record.prepared_partitions
            ),
        )
        if record.state is CoordinatorState.ONGOING and has_deadline(record.transaction_timeout_ms):
            overdue_threshold = record.transaction_timeout_ms + limits.coordinator_cleanup_interval_ms
            if (
                role is CoordinatorRole.CURRENT
                and coordinator.partition_listed
                and record.transaction_timeout_ms < max_timeout
            ):
                own_timeout = record.transaction_timeout_ms  # `late_threshold`
    return Evidence(
        topic=ctx.topic,
        partition=ctx.partition,
        producer_id=txn.producer_id,
        producer_epoch=txn.producer_epoch,
        first_batch_epoch=txn.first_batch_epoch,
        coordinator_epoch=txn.coordinator_epoch,
        start_offset=txn.start_offset,
        open_since_ms=txn.open_since_ms,
        open_since_basis=txn.open_since_basis,
        record_time_ms=txn.record_time_ms,
        seen_open_ms=txn.seen_open_ms,
        start_batch_leader_epoch=txn.start_batch_leader_epoch,
        leader_epoch=ctx.leader_epoch,
        last_timestamp_ms=txn.last_timestamp_ms,
        observed_at_ms=ctx.observed_at_ms,
        now_ms=now_ms,
        age_ms=age_ms(now_ms, txn.open_since_ms),
        last_stable_offset=ctx.last_stable_offset,
        high_watermark=ctx.high_watermark,
        coordinator=coordinator,
        retired_at_ms=retired_at_ms,
        grace_ms=limits.grace_ms,
        clock_skew_ms=limits.clock_skew_ms,
        max_transaction_timeout_ms=max_timeout,
        max_transaction_timeout_source="broker" if ctx.max_transaction_timeout_ms is not None else "default",
        late_threshold_ms=late_threshold_ms(
            own_timeout if own_timeout is not None else max_timeout, limits.late_buffer_ms
        ),
        late_threshold_source="transaction" if own_timeout is not None else "max-timeout",
        overdue_threshold_ms=overdue_threshold,
        offset_commit_group=txn.offset_commit_group,
    )


# ------------------------------------------------------------------------------------------ explanation


def format_duration(ms: int) -> str:
    """Human duration: 850ms, 42s, 3m05s, 2h01m, 3d04h."""
    if ms < 1_000:
        return f"{ms}ms"
    s = ms // 1_000
    if s < 60:
        return f"{s}s"
    m, s = divmod(s, 60)
    if m < 60:
        return f"{m}m{s:02d}s"
    h, m = divmod(m, 60)
    if h < 24:
        return f"{h}h{m:02d}m"
    d, h = divmod(h, 24)
    return f"{d}d{h:02d}h"


_BASIS_NOTE = {
    "start-timestamp": "",
    "last-timestamp": " (at least; start batch unknown)",
    "unknown": " (age unknown: no timestamps)",
}


def _basis_note(e: Evidence) -> str:
    """How the age was counted; where the records' own time disagrees with what the collector saw, by how much."""
    if e.open_since_basis == "opened-after-previous-report":
        if e.record_time_ms is None or e.record_time_ms <= 0:
            return " (at most: counted from the collector's last report without it; its records have no time)"
        return (
            f" (at most: counted from the collector's last report without it; its records are stamped "
            f"{format_duration(e.open_since_ms - e.record_time_ms)} earlier, event time rather than when it "
            f"opened)"
        )
    if e.open_since_basis == "first-seen-open":
        ahead = format_duration((e.record_time_ms or 0) - e.open_since_ms)
        return (
            f" (counted from the collector's first report of it open; its records are stamped {ahead} later)"
        )
    return _BASIS_NOTE[e.open_since_basis]


def _iso(ms: int) -> str:
    if ms < 0:
        return "unknown"
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def explain(decision: Decision, e: Evidence, limits: DetectionLimits) -> str:
    """One line for on-call: what is open, for how long, and why the verdict holds."""
    label = decision.reason.value if decision.reason else ""
    if decision.kind is VerdictKind.UNCONFIRMED and decision.withheld is not None:
        label = f"would be HANGING {label}; {decision.withheld.value}"
    head = (
        f"{decision.kind.value}{f' ({label})' if label else ''}: "
        f"producer {e.producer_id} epoch {e.producer_epoch} has a transaction open on "
        f"{e.topic}-{e.partition} from offset {e.start_offset} for {format_duration(e.age_ms)}"
        f"{_basis_note(e)}"
    )
    c = e.coordinator
    grace = format_duration(limits.grace_ms)
    tid = f"transactional id {c.transactional_id!r}" if c else ""
    if decision.reason is HangingReason.OLDER_THAN_COORDINATOR_TRANSACTION and c:
        if c.role is CoordinatorRole.PREVIOUS:
            why = (
                f"{tid} moved on to producer {c.producer_id} ({c.state}) at "
                f"{_iso(c.last_update_timestamp_ms)} and names {e.producer_id} only as its previous producer "
                f"id: no marker will ever be written with it"
            )
        elif e.first_batch_epoch < c.producer_epoch:
            why = (
                f"its first batch has epoch {e.first_batch_epoch}, but {tid} is in a newer transaction "
                f"(Ongoing, epoch {c.producer_epoch}) that does not list the partition"
            )
        else:
            why = (
                f"it started before the current transaction of {tid} (Ongoing since "
                f"{_iso(c.start_timestamp_ms)}, same epoch {c.producer_epoch}, transaction version "
                f"{c.client_transaction_version}: no epoch bump per transaction), which does not list the partition"
            )
    elif decision.reason in (HangingReason.LOST_COMMIT_MARKER, HangingReason.LOST_ABORT_MARKER) and c:
        outcome = "COMMIT" if decision.reason is HangingReason.LOST_COMMIT_MARKER else "ABORT"
        why = (
            f"{tid} reached {c.state} at {_iso(c.last_update_timestamp_ms)} with this partition in its Prepare "
            f"record, and the transaction was already open here (seen at {_iso(e.seen_open_ms or -1)}): the "
            f"coordinator's {outcome} marker for this partition was lost (an unclean leader election can truncate "
            f"it away); the remedy is a {outcome} marker, the outcome the coordinator decided"
            + (
                ", never an ABORT: the transaction committed everywhere else and its client was told it did"
                if outcome == "COMMIT"
                else ""
            )
        )
    elif decision.reason is HangingReason.WRITE_AFTER_MARKER and c:
        why = (
            f"{tid} reached CompleteCommit at {_iso(c.last_update_timestamp_ms)} with this partition in its Prepare "
            f"record, and its commit marker is still in the log: this transaction's start batch was appended at "
            f"leader epoch {e.start_batch_leader_epoch}, the epoch the leader still reports, and a leader never "
            f"truncates its own log within its epoch; so this transaction began after the marker (a Produce "
            f"retried after the commit): the commit is whole, and the remedy is ABORT"
        )
    elif decision.reason is HangingReason.OWNER_MOVED_ON and c:
        why = (
            f"its owner lives on: {tid} began a transaction of the same producer id after this one was seen open "
            f"(at {_iso(e.seen_open_ms or -1)}), recorded at {_iso(e.owner_moved_on_ms or -1)} without this "
            f"partition, and no record of it has listed the partition since (now {c.state}): no marker is coming; "
            f"the application that owns {tid} is still running"
        )
    elif decision.reason is HangingReason.NO_COORDINATOR_STATE:
        why = f"no transactional id owns producer {e.producer_id} (past the {grace} grace)"
    elif decision.reason is HangingReason.COORDINATOR_COMPLETED and c:
        why = (
            f"{tid} reached {c.state} at {_iso(c.last_update_timestamp_ms)}, "
            f"{format_duration(age_ms(e.observed_at_ms, c.last_update_timestamp_ms))} before the snapshot, "
            f"and all its markers were written before that"
        )
    elif decision.reason is HangingReason.PARTITION_NOT_IN_TRANSACTION and c:
        why = (
            f"{tid} is {c.state} but does not list the partition, in a record that precedes the report (by the "
            f"transaction log's offsets, or by the {grace} grace)"
        )
    elif decision.kind is VerdictKind.STUCK_PREPARE and c:
        why = (
            f"{tid} is {c.state} since {_iso(c.last_update_timestamp_ms)} and lists the partition, but the "
            f"marker has not arrived {format_duration(age_ms(e.observed_at_ms, c.last_update_timestamp_ms))} "
            f"later (grace {grace}); alert only, never abort (it would break atomicity)"
        )
    elif decision.kind is VerdictKind.COORDINATOR_OVERDUE and c:
        why = (
            f"{tid} is Ongoing since {_iso(c.start_timestamp_ms)}, past its timeout "
            f"{format_duration(c.transaction_timeout_ms)} + cleanup interval "
            f"{format_duration(limits.coordinator_cleanup_interval_ms)}; the coordinator should have "
            f"aborted it (alert only)"
        )
    else:
        why = _why_not_hanging(decision, e, limits)
    if decision.kind is VerdictKind.HANGING and decision.reason not in _MARKER_DECIDED:
        why += leader_change_note(e)
    if decision.kind is VerdictKind.UNCONFIRMED:
        why += f"; {_why_withheld(decision, e)}"
    elif decision.judged_as_of_ms is not None and decision.judged_as_of_ms != e.observed_at_ms:
        why += (
            f" (judged as of {_iso(decision.judged_as_of_ms)}, when it was already open and the coordinator "
            f"view was current; the newest report is {_iso(e.observed_at_ms)})"
        )
    if c is not None:
        why += f"; {transaction_version_note(c)}"
    if c is not None and c.two_phase_commit:
        why += (
            "; two-phase commit: no timeout (KIP-939, timeout Integer.MAX_VALUE): its transaction manager ends "
            "it, or Kafka 4.1+'s Admin.forceTerminateTransaction; never a marker"
        )
    why += blocked_groups_note(e.topic, e.partition, e.offset_commit_group)
    return f"{head}; {why}"


# Reasons whose remedy is the outcome the coordinator decided for this very partition (no leader-change caveat).
_MARKER_DECIDED = frozenset({HangingReason.LOST_COMMIT_MARKER, HangingReason.LOST_ABORT_MARKER})


def leader_change_note(e: Evidence) -> str:
    """For an ABORT proposal: whether a marker of T can have been lost since it began (`leader_kept`). Empty when
    the leader is in the epoch it appended T's start batch in."""
    kept = leader_kept(e.start_batch_leader_epoch, e.leader_epoch)
    if kept is True:
        return ""
    if kept is False:
        change = f"its start batch was appended at leader epoch {e.start_batch_leader_epoch}, the leader is at {e.leader_epoch} now"
    else:
        change = "the leader epochs that would show no leader change since it began are unknown"
    return (
        f"; unconfirmed that no commit was lost: {change}; an unclean election can drop a commit marker written "
        f"since, and an ABORT would then undo committed records (`proposals abort` asks for --allow-leader-change)"
    )


def transaction_version_note(c: CoordinatorEvidence) -> str:
    """Which transaction version the coordinator evidence came from, and what that means for its epochs."""
    v = c.transaction_version
    if v is None:
        return (
            "evidence of transaction version unknown (the coordinator record came from DescribeTransactions, "
            "which does not report it)"
        )
    if v >= EPOCH_BUMP_TRANSACTION_VERSION:
        return (
            f"evidence of transaction version {v} (the coordinator record's ClientTransactionVersion: the epoch "
            "moves at the end of every transaction, KIP-890)"
        )
    return (
        f"evidence of transaction version {v} (the coordinator record's ClientTransactionVersion, 0 where it has "
        "none, as on every 3.x broker: one epoch from InitProducerId to the next)"
    )


def _why_withheld(decision: Decision, e: Evidence) -> str:
    if decision.withheld is WithheldReason.COLLECTOR_CLOCK_AHEAD:
        return (
            "withheld: the coordinator record this proof weighed lies at or above the transaction log's end "
            "measured after the leader's report, so it was written after the report although its stamp puts it "
            "well before: the collector's clock runs ahead of the coordinator's (fix the clocks: NTP); judged again "
            "on the next reports"
        )
    if decision.withheld is WithheldReason.COMMIT_OR_LATE_WRITE:
        return (
            "withheld: the committed transaction's Prepare record listed this partition, and this transaction was "
            "not seen open before the commit: a lost commit marker (COMMIT restores it) and a write after the "
            "marker (ABORT) look the same from here; no remedy is proposed (runbook: lost markers)"
        )
    if decision.withheld is WithheldReason.COORDINATOR_LOG_REWOUND:
        return (
            "withheld: the coordinator log partition of its owner was read again below offsets already applied "
            "(truncated and rewritten, as after an unclean leader election), so the view may hold records the log "
            "no longer has; restart the job on a new checkpoint location to read it again"
        )
    if decision.withheld is WithheldReason.COORDINATOR_RECORD_UNDECODABLE:
        return (
            "withheld: a coordinator record that could be about its owner did not decode (on the dead-letter "
            "topic; a value version txnwatch does not know?), so the view may miss what it said; judged again "
            "once a decodable record of that transactional id supersedes it"
        )
    if decision.withheld is WithheldReason.COORDINATOR_VIEW_INCONSISTENT:
        return (
            "withheld: the stored coordinator view names another producer id (an inconsistency of txnwatch's "
            "state, not proof); no abort candidate"
        )
    if e.view_current_as_of_ms is None:
        return (
            "withheld: the coordinator view is not shown current as of the report (no measured position of the "
            "coordinator log covers it; the stream gets them from `txnwatch collect`); judged again once it is"
        )
    return (
        f"withheld: the coordinator view is current only as of {_iso(e.view_current_as_of_ms)}, "
        f"{format_duration(age_ms(e.observed_at_ms, e.view_current_as_of_ms))} before the report; records "
        f"written since could own this transaction; judged again once the view catches up"
    )


def _why_not_hanging(decision: Decision, e: Evidence, limits: DetectionLimits) -> str:
    limit = (
        f"its own transaction timeout {format_duration(e.late_threshold_ms - limits.late_buffer_ms)}"
        if e.late_threshold_source == "transaction"
        else f"transaction.max.timeout.ms {format_duration(e.max_transaction_timeout_ms)}"
    )
    late_note = (
        f"longer than {limit}"
        f"{f' + {format_duration(limits.late_buffer_ms)}' if limits.late_buffer_ms else ''}; "
        if decision.kind is VerdictKind.LATE
        else ""
    )
    c = e.coordinator
    if c is None and e.retired_at_ms is not None:
        context = (
            f"producer {e.producer_id} lost its transactional id at {_iso(e.retired_at_ms)}; waiting for a "
            f"snapshot newer than that by the {format_duration(limits.grace_ms)} grace"
        )
    elif c is None:
        context = (
            f"no transactional id owns producer {e.producer_id} yet; "
            f"waiting out the {format_duration(limits.grace_ms)} grace"
        )
    elif c.role is CoordinatorRole.NEXT:
        context = (
            f"it is the next producer id of transactional id {c.transactional_id!r} ({c.state} with producer "
            f"{c.producer_id}); waiting for the coordinator to hand it over"
        )
    elif c.role is CoordinatorRole.PREVIOUS:
        context = (
            f"transactional id {c.transactional_id!r} names it as its previous producer id; "
            f"waiting for the snapshot to postdate that record by the grace period"
        )
    elif (
        c.partition_listed and c.state is CoordinatorState.ONGOING and e.first_batch_epoch < c.producer_epoch
    ):
        context = (
            f"transactional id {c.transactional_id!r} is Ongoing and lists the partition; the leftover from "
            f"epoch {e.first_batch_epoch} will be closed by that transaction's marker"
        )
    elif c.partition_listed:
        context = f"transactional id {c.transactional_id!r} is {c.state} and lists the partition"
    else:
        context = (
            f"transactional id {c.transactional_id!r} is {c.state}; too early to call it hanging "
            f"(grace {format_duration(limits.grace_ms)})"
        )
    return late_note + context
