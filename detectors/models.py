"""The domain records: what partition leaders and coordinators report, the verdicts, and abort candidates.

Every model is frozen (hashable, safe to share) and rejects unknown fields; records that travel as JSON
carry a `schema_version`. Durations and timestamps are integers in milliseconds and end in `_ms`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from enum import StrEnum
from typing import Any, Literal, Protocol, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

SCHEMA_VERSION = 1
# Where an open transaction's age comes from: the batch at its start offset, LastTimestamp, or nowhere.
OpenSinceBasis = Literal[
    "start-timestamp", "last-timestamp", "unknown", "opened-after-previous-report", "first-seen-open"
]
# Kafka's producer epoch is an int16; the coordinator hands out a new producer id before it would overflow.
MAX_PRODUCER_EPOCH = 32767
# The transaction timeout of a KIP-939 two-phase-commit transaction: Integer.MAX_VALUE. Kafka has no 2PC field in
# `TransactionLogValue` or DescribeTransactions; `TransactionCoordinator.handleInitProducerId` stores this timeout
# when the producer enables 2PC, and `TransactionMetadata.isDistributedTwoPhaseCommitTxn()` is exactly
# `txnTimeoutMs == Integer.MAX_VALUE`. (KIP-939's text says -1; Kafka never writes that.)
TWO_PHASE_COMMIT_TIMEOUT_MS = 2_147_483_647


def is_two_phase_commit(transaction_timeout_ms: int) -> bool:
    """The coordinator's transaction timeout marks a KIP-939 two-phase-commit transaction (no timeout: only its
    external transaction manager, or a forced termination, ends it). Any other value, -1 included, is not."""
    return transaction_timeout_ms == TWO_PHASE_COMMIT_TIMEOUT_MS


def has_deadline(transaction_timeout_ms: int) -> bool:
    """The coordinator will abort the transaction once this timeout has passed: a real one, 1 ms up to
    transaction.max.timeout.ms (`TransactionStateManager.validateTransactionTimeoutMs` admits no other for a
    normal producer). Not a two-phase-commit one (the timeout sweeper skips those), and not a value Kafka never
    writes (0, -1): those are unknown, so no deadline can be claimed."""
    return 0 < transaction_timeout_ms < TWO_PHASE_COMMIT_TIMEOUT_MS


class Model(BaseModel):
    """Base of every txnwatch model: frozen (hashable, usable in sets) and strict about unknown fields."""

    model_config = ConfigDict(frozen=True, extra="forbid")


# ------------------------------------------------------------------------------------------------ enums


class CoordinatorState(StrEnum):
    """Coordinator-side transaction state with Kafka's own names (`TransactionState`).

    The order matches the `TransactionStatus` byte of `__transaction_state` (0..7), so
    `CoordinatorState.from_status(byte)` maps the codec's value without importing it.
    """

    EMPTY = "Empty"
    ONGOING = "Ongoing"
    PREPARE_COMMIT = "PrepareCommit"
    PREPARE_ABORT = "PrepareAbort"
    COMPLETE_COMMIT = "CompleteCommit"
    COMPLETE_ABORT = "CompleteAbort"
    DEAD = "Dead"
    PREPARE_EPOCH_FENCE = "PrepareEpochFence"

    @classmethod
    def from_status(cls, status: int | str) -> CoordinatorState:
        """Map a `TransactionStatus` byte (0..7, or the codec's IntEnum) or a Kafka state name to a state.

        Raises:
            ValueError: for an unknown byte or name.
        """
        if isinstance(status, str) and not isinstance(status, int):
            return cls(status)
        if not 0 <= status < len(_STATES_BY_STATUS):
            raise ValueError(f"unknown TransactionStatus {status}")
        return _STATES_BY_STATUS[status]


_STATES_BY_STATUS: tuple[CoordinatorState, ...] = tuple(CoordinatorState)


class VerdictKind(StrEnum):
    """What txnwatch concludes about one open transaction (see docs/detection.md)."""

    OPEN = "OPEN"
    LATE = "LATE"
    HANGING = "HANGING"
    STUCK_PREPARE = "STUCK_PREPARE"
    COORDINATOR_OVERDUE = "COORDINATOR_OVERDUE"
    # A HANGING rule holds, but on evidence not shown to be current: no candidate, no hanging metric. `reason`
    # is the HANGING reason it would be, `withheld` why it is not (judged again when that changes).
    UNCONFIRMED = "UNCONFIRMED"


class HangingReason(StrEnum):
    """Why a HANGING transaction is proven to hang; each has a rule function of the same name."""

    NO_COORDINATOR_STATE = "no-coordinator-state"
    COORDINATOR_COMPLETED = "coordinator-completed"
    PARTITION_NOT_IN_TRANSACTION = "partition-not-in-transaction"
    OLDER_THAN_COORDINATOR_TRANSACTION = "older-than-coordinator-transaction"
    # The coordinator completed the transaction with the partition in its Prepare record, and the transaction was
    # open on the partition before that: the partition's marker was lost (an unclean leader election can truncate
    # it away). The remedy restores the outcome the coordinator decided: a COMMIT marker for a lost commit.
    LOST_COMMIT_MARKER = "lost-commit-marker"
    LOST_ABORT_MARKER = "lost-abort-marker"
    # The owner lives on: a transaction of the same producer id began after this one was seen open, without its
    # partition, and no record of the producer id has listed the partition since (Kafka Streams, a late write).
    OWNER_MOVED_ON = "owner-moved-on"
    # The coordinator committed with the partition listed, and the open transaction began after that marker: its
    # start batch was appended in the leader epoch the leader still reports, so the marker is still in the log
    # before it (a retried Produce that landed late, KIP-890's motivation). ABORT.
    WRITE_AFTER_MARKER = "write-after-marker"


class WithheldReason(StrEnum):
    """Why a HANGING proof was withheld (the verdict is UNCONFIRMED)."""

    # The coordinator view of the partition(s) that could own the transaction is not known to be current as of
    # any moment the leader reported it open (docs/detection.md, "Currency").
    COORDINATOR_VIEW_BEHIND = "coordinator-view-behind"
    # The stored coordinator view names neither the producer id nor its previous/next one: the pipeline's own
    # state is inconsistent, which proves nothing about the cluster.
    COORDINATOR_VIEW_INCONSISTENT = "coordinator-view-inconsistent"
    # A coordinator record that could be about the transaction's owner did not decode (e.g. a value version
    # newer than txnwatch knows): its content is lost, so the view of that id (or partition) is not complete.
    COORDINATOR_RECORD_UNDECODABLE = "coordinator-record-undecodable"
    # The coordinator log partition that could own the transaction was read again at offsets below what the view
    # had applied (truncated and rewritten: an unclean leader election): the view holds records the log no longer
    # has, until the job reads the log again on a new checkpoint.
    COORDINATOR_LOG_REWOUND = "coordinator-log-rewound"
    # The coordinator committed a transaction whose Prepare record listed the partition, and the transaction open
    # there was not seen open before that commit: a commit marker lost before it (COMMIT restores it) and a write
    # after it (ABORT) look the same from here, and the two remedies are opposite.
    COMMIT_OR_LATE_WRITE = "commit-or-late-write"
    # The coordinator record the proof says came before the leader's report lies at or above the log end offset
    # measured after that report: it was appended after the leader answered, although its stamp says it came well
    # before. The collector's clock runs ahead of the coordinator's (or the coordinator's behind), by more than
    # the skew and grace allow, so no "the report is after the coordinator event" proof from these clocks holds.
    COLLECTOR_CLOCK_AHEAD = "collector-clock-ahead"


class CoordinatorRole(StrEnum):
    """How the coordinator record we were given relates to the open transaction's producer id."""

    NONE = "none"  # no record, a tombstone, or Dead: no transactional id owns the producer id
    CURRENT = "current"  # record.producer_id == producer id
    PREVIOUS = "previous"  # record.previous_producer_id == producer id (retired after an epoch overflow)
    NEXT = "next"  # record.next_producer_id == producer id (handed out, not used for markers yet)


class CandidateStatus(StrEnum):
    """Life cycle of an abort candidate on the compacted candidates topic."""

    OPENED = "OPENED"
    RESOLVED = "RESOLVED"  # the transaction ended (or was forgotten unreported): nothing to abort
    # The job no longer has its proof (withheld: the evidence stopped being current or complete; or disproved: a
    # later verdict is not HANGING) while the transaction may still be open: not to be aborted on this record.
    WITHDRAWN = "WITHDRAWN"


# ----------------------------------------------------------------------------------- partition side


class TopicPartition(Model):
    """Our own topic-partition (never `kafka.structs.TopicPartition`)."""

    topic: str = Field(min_length=1)
    partition: int = Field(ge=0)


def record_time_ms(start_timestamp_ms: int | None, last_timestamp_ms: int) -> int:
    """The transaction's start as its records tell it: the start batch's timestamp, else LastTimestamp (<= 0:
    unknown). A producer's CreateTime: Kafka Streams, MirrorMaker 2 and Flink write their input's event time."""
    return (
        start_timestamp_ms if start_timestamp_ms is not None and start_timestamp_ms > 0 else last_timestamp_ms
    )


def open_since_ms(
    start_timestamp_ms: int | None,
    last_timestamp_ms: int,
    opened_after_ms: int | None = None,
    seen_open_ms: int | None = None,
) -> int:
    """`OpenTransaction.open_since_ms` on plain values (the streaming hot path has columns, not models).

    The records' time, held inside what the collector saw: the transaction opened after `opened_after_ms` (an
    earlier report of the partition without it) and before `seen_open_ms` (the first report with it open). Both
    are the collector's clock, so a record stamped with event time hours old, or ahead of every clock, cannot
    make a transaction older or younger than the collector saw it. An unknown record time (<= 0) is replaced by
    the earliest moment the transaction can have opened, if known."""
    since = record_time_ms(start_timestamp_ms, last_timestamp_ms)
    if opened_after_ms is not None and opened_after_ms > 0 and since < opened_after_ms:
        since = opened_after_ms
    if seen_open_ms is not None and seen_open_ms > 0 and since > seen_open_ms:
        since = seen_open_ms
    return since


def aged_since_ms(
    start_timestamp_ms: int | None,
    last_timestamp_ms: int,
    opened_after_ms: int | None = None,
    seen_open_ms: int | None = None,
) -> int:
    """What a transaction's age is counted from for LATE and MaxActiveTransactionDuration: the collector's first
    sighting of it open when known (a lower bound of the age, on the collector's clock), else `open_since_ms`.

    The records' time is client time (event time under Kafka Streams, MirrorMaker 2, Flink) and the previous
    report is only an upper bound: neither proves a transaction has been open that long (docs/detection.md)."""
    if seen_open_ms is not None and seen_open_ms > 0:
        return seen_open_ms
    return open_since_ms(start_timestamp_ms, last_timestamp_ms, opened_after_ms, seen_open_ms)


def open_since_basis(
    start_timestamp_ms: int | None,
    last_timestamp_ms: int,
    opened_after_ms: int | None = None,
    seen_open_ms: int | None = None,
) -> OpenSinceBasis:
    """Where `open_since_ms` comes from: the records' own time, or a bound the collector saw."""
    recorded = record_time_ms(start_timestamp_ms, last_timestamp_ms)
    since = open_since_ms(start_timestamp_ms, last_timestamp_ms, opened_after_ms, seen_open_ms)
    if since != recorded:
        return "opened-after-previous-report" if since > recorded else "first-seen-open"
    if start_timestamp_ms is not None and start_timestamp_ms > 0:
        return "start-timestamp"
    return "last-timestamp" if last_timestamp_ms > 0 else "unknown"


def first_batch_epoch(start_batch_producer_epoch: int | None, producer_epoch: int) -> int:
    """`OpenTransaction.first_batch_epoch` on plain values."""
    return start_batch_producer_epoch if start_batch_producer_epoch is not None else producer_epoch


class OpenTransaction(Model):
    """One open transaction as a partition leader reports it (DescribeProducers, plus the start batch).

    `start_timestamp_ms` and `start_batch_producer_epoch` come from the record batch at `start_offset` (the
    timestamp of the record at `start_offset`, i.e. the transaction's first record, and the batch's producer
    epoch); they are None when the collector could not fetch that batch.
    `last_timestamp_ms` is DescribeProducers' LastTimestamp: the max timestamp of the producer's latest
    batch on the partition (-1 if the broker does not know it).
    """

    producer_id: int = Field(ge=0)
    producer_epoch: int = Field(ge=0, le=MAX_PRODUCER_EPOCH)
    coordinator_epoch: int = Field(default=-1, ge=-1)
    start_offset: int = Field(ge=0)
    start_timestamp_ms: int | None = None
    start_batch_producer_epoch: int | None = Field(default=None, ge=0, le=MAX_PRODUCER_EPOCH)
    last_sequence: int = Field(default=-1, ge=-1)
    last_timestamp_ms: int = Field(default=-1, ge=-1)
    # On `__consumer_offsets`: the consumer group whose offset commit the start batch holds (its record keys), the
    # group this transaction blocks (detectors/groups.py); None elsewhere or when the batch was not read.
    offset_commit_group: str | None = None
    # The collector's own clock around the transaction's opening (None: not known, e.g. the collector's first
    # report of the partition): a report of the partition at `opened_after_ms` did not have it open, and the
    # first report that had it open arrived at `seen_open_ms`. They bound the records' timestamps, which are
    # client time (event time under Kafka Streams) and prove nothing about when the transaction opened.
    opened_after_ms: int | None = None
    seen_open_ms: int | None = None
    # The start batch's partitionLeaderEpoch: the leader epoch its leader appended it at (None: not read). Beside
    # the report's `PartitionSnapshot.leader_epoch`, it tells whether a marker written after the transaction began
    # could have been lost (a leader never truncates its own log within its leader epoch).
    start_batch_leader_epoch: int | None = None

    @property
    def record_time_ms(self) -> int:
        """The start as the records tell it (start batch timestamp, else LastTimestamp; <= 0 unknown)."""
        return record_time_ms(self.start_timestamp_ms, self.last_timestamp_ms)

    @property
    def open_since_ms(self) -> int:
        """The best known start of the transaction: the start batch's timestamp, else LastTimestamp, held
        between `opened_after_ms` and `seen_open_ms` (`open_since_ms` above).

        Non-positive timestamps are unknown (Kafka's NO_TIMESTAMP is -1; the broker's own lateness check also
        ignores them); the result is then <= 0 and every age computed from it counts as unknown, not old.
        """
        return open_since_ms(
            self.start_timestamp_ms, self.last_timestamp_ms, self.opened_after_ms, self.seen_open_ms
        )

    @property
    def aged_since_ms(self) -> int:
        """What LATE and the duration metric count from (`aged_since_ms` above)."""
        return aged_since_ms(
            self.start_timestamp_ms, self.last_timestamp_ms, self.opened_after_ms, self.seen_open_ms
        )

    @property
    def open_since_basis(self) -> OpenSinceBasis:
        """Where `open_since_ms` comes from."""
        return open_since_basis(
            self.start_timestamp_ms, self.last_timestamp_ms, self.opened_after_ms, self.seen_open_ms
        )

    @property
    def first_batch_epoch(self) -> int:
        """Epoch of the transaction's first batch; falls back to the producer's latest epoch."""
        return first_batch_epoch(self.start_batch_producer_epoch, self.producer_epoch)


class PartitionSnapshot(Model):
    """What one partition leader said at `observed_at_ms` (published by the collector, JSON).

    An empty `open_transactions` is an explicit "no open transactions now". `max_transaction_timeout_ms` is
    the leader's `transaction.max.timeout.ms`, None when unknown (the detection default applies).
    """

    schema_version: int = SCHEMA_VERSION
    cluster: str = Field(min_length=1)
    sweep_id: str
    observed_at_ms: int
    leader: int
    topic: str = Field(min_length=1)
    partition: int = Field(ge=0)
    open_transactions: tuple[OpenTransaction, ...] = ()
    last_stable_offset: int | None = None
    high_watermark: int | None = None
    max_transaction_timeout_ms: int | None = Field(default=None, ge=1)
    # The leader epoch the partition's leader answered at (the metadata's, checked by ListOffsets at it), if known.
    leader_epoch: int | None = None

    @model_validator(mode="after")
    def _one_open_transaction_per_producer(self) -> Self:
        # A leader keeps one ProducerStateEntry per producer id, so it has at most one open txn per producer.
        ids = [t.producer_id for t in self.open_transactions]
        if len(ids) != len(set(ids)):
            raise ValueError(f"{self.topic}-{self.partition}: duplicate producer ids in open_transactions")
        return self

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(topic=self.topic, partition=self.partition)


class BrokerSweepSummary(Model):
    """One per broker per sweep, so the consumer knows which partitions a sweep covered (JSON)."""

    schema_version: int = SCHEMA_VERSION
    cluster: str = Field(min_length=1)
    sweep_id: str
    observed_at_ms: int
    broker: int
    partitions_covered: int = Field(ge=0)
    errors: dict[str, int] = Field(default_factory=dict)


class CoordinatorLogPosition(Model):
    """How far a coordinator topic had reached at a moment: what makes the job's coordinator view provably current.

    The collector publishes one per sweep for `__transaction_state` (header `txnwatch.type=coordinator-log-position`)
    and, in the describe fallback, one per poll for `<prefix>.coordinator-state`. A view that has applied every
    record below a partition's `end_offsets` is current as of `as_of_ms`; why: docs/detection.md, section 4, and
    docs/collector.md, "Coordinator log position".
    """

    schema_version: int = SCHEMA_VERSION
    cluster: str = Field(min_length=1)
    sweep_id: str
    topic: str = Field(min_length=1)  # __transaction_state, or <prefix>.coordinator-state
    partitions: int = Field(ge=1)  # the topic's partition count
    as_of_ms: int
    # partition -> high watermark (the next offset to be written); partitions whose leader did not answer are
    # missing, and stay as current as an earlier position made them.
    end_offsets: dict[int, int] = Field(default_factory=dict)
    # partition -> log end offset, asked of the same leaders after `end_offsets` (ListOffsets with replica id -2:
    # the leader's local log end, not the high watermark). Every record at or above it was appended after
    # `as_of_ms`, whatever its stamp says: what shows a collector clock running ahead of the coordinators'
    # (docs/detection.md, "Clocks"). Only on `__transaction_state` positions; earlier collectors left it out.
    log_end_offsets: dict[int, int] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _partitions_in_range(self) -> Self:
        for name, offsets in (("end", self.end_offsets), ("log end", self.log_end_offsets)):
            for partition, offset in offsets.items():
                if not 0 <= partition < self.partitions:
                    raise ValueError(f"{self.topic}: partition {partition} outside 0..{self.partitions - 1}")
                if offset < 0:
                    raise ValueError(f"{self.topic}-{partition}: negative {name} offset {offset}")
        return self


# ---------------------------------------------------------------------------------- coordinator side


class TxnLogValueLike(Protocol):
    """The shape of a decoded `__transaction_state` value (detectors.codec.TxnLogValue matches it)."""

    @property
    def producer_id(self) -> int: ...
    @property
    def producer_epoch(self) -> int: ...
    @property
    def transaction_timeout_ms(self) -> int: ...
    @property
    def status(self) -> int: ...
    @property
    def partitions(self) -> Sequence[tuple[str, Sequence[int]]] | None: ...
    @property
    def last_update_timestamp_ms(self) -> int: ...
    @property
    def start_timestamp_ms(self) -> int: ...
    @property
    def previous_producer_id(self) -> int: ...
    @property
    def next_producer_id(self) -> int: ...
    @property
    def client_transaction_version(self) -> int: ...


class FoldedCompletion(Model):
    """A transaction of the producer id that completed among the records stage 1 folded into a newer one, and
    listed partitions that record does not (`detectors.tracking.advance_owners`): what a lost-marker proof
    needs of it when its owner has moved on (`BucketState.track_moved_on`)."""

    state: CoordinatorState  # CompleteCommit or CompleteAbort
    producer_epoch: int
    start_timestamp_ms: int
    # No later than its markers were sent: the Prepare record's time (the Complete record's when only it was read).
    decided_ms: int
    # No earlier than every marker was acknowledged: the Complete record's time, else the record after the Prepare.
    completed_by_ms: int
    partitions: tuple[TopicPartition, ...]


class BeganMark(Model):
    """A transaction of the producer id among the records folded into a newer one: when it began, and the log
    offset of one of its records (`detectors.began`)."""

    start_timestamp_ms: int
    offset: int


class CoordinatorRecord(Model):
    """The coordinator's state for one transactional id (JSON).

    Built from a `__transaction_state` record (`from_log_value`) or, where that topic cannot be read, from
    ListTransactions + DescribeTransactions (`origin="describe-transactions"`; source_* are then -1 and
    `last_update_timestamp_ms` should be the first time the collector saw the state).
    A tombstone (transactional id expired) has `tombstone=True`, `state=None` and -1 producer fields.
    """

    schema_version: int = SCHEMA_VERSION
    transactional_id: str
    producer_id: int = Field(ge=-1)
    producer_epoch: int = Field(ge=-1, le=MAX_PRODUCER_EPOCH)
    previous_producer_id: int = Field(default=-1, ge=-1)
    next_producer_id: int = Field(default=-1, ge=-1)
    client_transaction_version: int = Field(default=0, ge=0)
    # TWO_PHASE_COMMIT_TIMEOUT_MS for a two-phase-commit transaction (KIP-939): no timeout. -1 in tombstones.
    transaction_timeout_ms: int
    state: CoordinatorState | None
    partitions: tuple[TopicPartition, ...] = ()
    # On a CompleteCommit/CompleteAbort record (which lists no partitions): the partitions its PrepareCommit/
    # PrepareAbort of the same producer id and epoch listed, the markers the coordinator sent. The streaming job
    # carries them over from the Prepare record it read just before; None when it did not read that record.
    prepared_partitions: tuple[TopicPartition, ...] | None = None
    # Set by stage 1 when the records of the producer id it folded into this one (its batch's earlier records)
    # listed partitions this record does not: a transaction of the producer id that wrote those partitions a
    # marker, which stage 2 must know of to tell an owner that moved on (detectors.tracking). None: nothing more.
    listed_since: tuple[TopicPartition, ...] | None = None
    # Set by stage 1 with the transactions of the producer id that completed among the records it folded into
    # this one and listed partitions this record does not (in log order). None: none.
    completed_since: tuple[FoldedCompletion, ...] | None = None
    # Set by the job's decoder and stage 1 when the records folded into this one began transactions at least half
    # a second apart: one mark each (in log order), so stage 2 can order an owner-moved-on proof by the first
    # that began after a sighting (detectors.began). None: none.
    began_since: tuple[BeganMark, ...] | None = None
    last_update_timestamp_ms: int
    start_timestamp_ms: int
    source_partition: int = -1
    source_offset: int = -1
    source_timestamp_ms: int = -1
    tombstone: bool = False
    origin: Literal["transaction-log", "describe-transactions"] = "transaction-log"

    @model_validator(mode="after")
    def _tombstone_has_no_state(self) -> Self:
        if self.tombstone != (self.state is None):
            raise ValueError("a tombstone has state None, and only a tombstone does")
        return self

    @classmethod
    def from_log_value(
        cls,
        transactional_id: str,
        value: TxnLogValueLike | None,
        *,
        source_partition: int,
        source_offset: int,
        source_timestamp_ms: int,
    ) -> CoordinatorRecord:
        """Build a record from a decoded `__transaction_state` key and value (None = tombstone).

        Args:
            transactional_id: the record key's transactional id.
            value: the decoded value (e.g. `detectors.codec.TxnLogValue`), or None for a tombstone.
            source_partition: `__transaction_state` partition the record was read from.
            source_offset: its offset there.
            source_timestamp_ms: the record's timestamp.

        Returns:
            The record; partitions are flattened from (topic, ids) groups and sorted.

        Raises:
            ValueError (pydantic.ValidationError): if the value has an unknown status or invalid fields.
        """
        if value is None:
            return cls.tombstone_of(
                transactional_id,
                source_partition=source_partition,
                source_offset=source_offset,
                source_timestamp_ms=source_timestamp_ms,
            )
        partitions = tuple(
            sorted(
                (
                    TopicPartition(topic=topic, partition=p)
                    for topic, ids in (value.partitions or ())
                    for p in ids
                ),
                key=lambda tp: (tp.topic, tp.partition),
            )
        )
        return cls(
            transactional_id=transactional_id,
            producer_id=value.producer_id,
            producer_epoch=value.producer_epoch,
            previous_producer_id=value.previous_producer_id,
            next_producer_id=value.next_producer_id,
            client_transaction_version=value.client_transaction_version,
            transaction_timeout_ms=value.transaction_timeout_ms,
            state=CoordinatorState.from_status(int(value.status)),
            partitions=partitions,
            last_update_timestamp_ms=value.last_update_timestamp_ms,
            start_timestamp_ms=value.start_timestamp_ms,
            source_partition=source_partition,
            source_offset=source_offset,
            source_timestamp_ms=source_timestamp_ms,
        )

    @classmethod
    def tombstone_of(
        cls,
        transactional_id: str,
        *,
        source_partition: int = -1,
        source_offset: int = -1,
        source_timestamp_ms: int = -1,
    ) -> CoordinatorRecord:
        """A tombstone: the coordinator expired the transactional id (value = null in the log)."""
        return cls(
            transactional_id=transactional_id,
            producer_id=-1,
            producer_epoch=-1,
            transaction_timeout_ms=-1,
            state=None,
            last_update_timestamp_ms=source_timestamp_ms,
            start_timestamp_ms=-1,
            source_partition=source_partition,
            source_offset=source_offset,
            source_timestamp_ms=source_timestamp_ms,
            tombstone=True,
        )

    def lists(self, topic: str, partition: int) -> bool:
        """True if the coordinator's transaction includes topic-partition."""
        return any(tp.partition == partition and tp.topic == topic for tp in self.partitions)

    @property
    def two_phase_commit(self) -> bool:
        """A live record of a KIP-939 two-phase-commit transactional id (see `is_two_phase_commit`)."""
        return not self.tombstone and is_two_phase_commit(self.transaction_timeout_ms)


# -------------------------------------------------------------------------------------------- limits


class DetectionLimits(Model):
    """Thresholds of the rules (the `detection` section of Settings)."""

    # How long a contradiction must last before it counts: markers in flight, and a coordinator record that a
    # client which writes before registering its partition (only possible with partition verification off)
    # commits a moment after its batch. Not a bound on the coordinator view's lag: that is measured
    # (detectors/currency.py). 10 s until 2026-11-23, when it also had to cover the lag. Below the collector's
    # default 5 s interval on purpose: "seen open for longer than the grace on our own clock" then holds at the
    # second sweep that sees a transaction, not only at the third (docs/BENCHMARKS.md, Detection latency).
    grace_ms: int = Field(default=4_000, ge=0)
    # Added to transaction.max.timeout.ms before an open transaction counts as LATE (Kafka's metric: 5 min).
    late_buffer_ms: int = Field(default=0, ge=0)
    # Tolerated difference between producer, coordinator and collector clocks (NTP keeps them within
    # milliseconds; 2 s leaves room for a host that lost sync).
    clock_skew_ms: int = Field(default=2_000, ge=0)
    # The broker's transaction.abort.timed.out.transaction.cleanup.interval.ms (default 10 s).
    coordinator_cleanup_interval_ms: int = Field(default=10_000, ge=0)
    # transaction.max.timeout.ms when the broker's value is unknown (Kafka's default, 15 min).
    default_max_transaction_timeout_ms: int = Field(default=900_000, ge=1)


# ------------------------------------------------------------------------------------------ verdicts


class CoordinatorEvidence(Model):
    """The coordinator record a verdict was judged against."""

    role: CoordinatorRole
    transactional_id: str
    state: CoordinatorState | None
    producer_id: int
    producer_epoch: int
    previous_producer_id: int
    next_producer_id: int
    client_transaction_version: int
    transaction_timeout_ms: int
    start_timestamp_ms: int
    last_update_timestamp_ms: int
    partition_listed: bool
    # The transaction version the record shows (its ClientTransactionVersion; 0 where the value has none, as on every
    # 3.x broker), None when unknown: a record from DescribeTransactions, which does not report it.
    transaction_version: int | None = None
    # A Complete* record: whether its Prepare record listed the partition (None: that record was not read).
    prepared_partition_listed: bool | None = None

    @property
    def two_phase_commit(self) -> bool:
        """The transaction is the producer id's own (role current) and a KIP-939 two-phase-commit one."""
        return self.role is CoordinatorRole.CURRENT and is_two_phase_commit(self.transaction_timeout_ms)


class Evidence(Model):
    """The numbers a human needs to check a verdict by hand."""

    topic: str
    partition: int
    producer_id: int
    producer_epoch: int
    first_batch_epoch: int
    coordinator_epoch: int
    start_offset: int
    open_since_ms: int
    open_since_basis: OpenSinceBasis
    # The start as the records tell it (client time: event time under Kafka Streams); differs from
    # `open_since_ms` when the collector saw the transaction open later or earlier than that (`open_since_basis`).
    record_time_ms: int | None = None
    # When the collector first saw it open (it had opened by then), if known.
    seen_open_ms: int | None = None
    # The leader epoch the start batch was appended at, and the one the leader reported at; None: unknown. Equal:
    # no leader change since the transaction began, so no marker of it can have been lost (`rules.leader_kept`).
    start_batch_leader_epoch: int | None = None
    leader_epoch: int | None = None
    last_timestamp_ms: int
    observed_at_ms: int
    now_ms: int
    age_ms: int
    last_stable_offset: int | None = None
    high_watermark: int | None = None
    coordinator: CoordinatorEvidence | None = None
    # When the producer id lost its transactional id (tombstone or move), if known.
    retired_at_ms: int | None = None
    grace_ms: int
    clock_skew_ms: int
    max_transaction_timeout_ms: int
    max_transaction_timeout_source: Literal["broker", "default"]
    # LATE's threshold: the maximum above plus the late buffer, or the transaction's own timeout when lower and
    # the coordinator's record is its transaction (`late_threshold_source` "transaction").
    late_threshold_ms: int
    late_threshold_source: Literal["max-timeout", "transaction"] = "max-timeout"
    overdue_threshold_ms: int | None = None
    # The coordinator view was current as of this time (collector clock), if measured (docs/detection.md).
    view_current_as_of_ms: int | None = None
    # The leader report a HANGING proof rests on: `observed_at_ms`, or an earlier moment at which the
    # transaction was already open and the view was current (when the view is behind the newest report).
    judged_as_of_ms: int | None = None
    # When the pipeline first saw this transaction open (collector clock), if it tracks it.
    first_seen_ms: int | None = None
    # The coordinator's time of the first record showing the owner moved on (`rules.owner_moved_on`), if known.
    owner_moved_on_ms: int | None = None
    # On `__consumer_offsets`: the consumer group whose pending offset commit this is (OpenTransaction's).
    offset_commit_group: str | None = None


class Verdict(Model):
    """The classification of one open transaction, with its evidence and a one-line explanation."""

    kind: VerdictKind
    # HANGING: why it hangs; UNCONFIRMED: the HANGING reason that would hold on current evidence.
    reason: HangingReason | None = None
    withheld: WithheldReason | None = None  # UNCONFIRMED only: why the proof was withheld
    evidence: Evidence
    explanation: str
    # The coordinator owns the transaction as a KIP-939 two-phase-commit one (timeout Integer.MAX_VALUE): it never
    # times out, is never COORDINATOR_OVERDUE, and is ended by its transaction manager, not by a marker.
    two_phase_commit: bool = False

    @model_validator(mode="after")
    def _reason_only_when_hanging(self) -> Self:
        provable = self.kind in (VerdictKind.HANGING, VerdictKind.UNCONFIRMED)
        if provable != (self.reason is not None):
            raise ValueError("HANGING and UNCONFIRMED verdicts need a reason, and only they have one")
        if (self.kind is VerdictKind.UNCONFIRMED) != (self.withheld is not None):
            raise ValueError("an UNCONFIRMED verdict says why it was withheld, and only it does")
        return self


# ------------------------------------------------------------------------------------------- aborting


class WriteTxnMarkersSpec(Model):
    """What Admin.abortTransaction sends to the leader: an ABORT marker (WriteTxnMarkers); a COMMIT marker,
    which Kafka's tools never send, only to restore a commit whose marker was lost.

    `coordinator_epoch` is the leader-reported one, 0 when it is negative (never -1), as Kafka's
    TransactionsCommand does: a broker fences a marker whose coordinator epoch is below the partition's.
    """

    topic: str = Field(min_length=1)
    partition: int = Field(ge=0)
    producer_id: int = Field(ge=0)
    producer_epoch: int = Field(ge=0, le=MAX_PRODUCER_EPOCH)
    coordinator_epoch: int = Field(ge=0)
    # ABORT, or COMMIT where the coordinator committed the transaction and the partition's marker was lost
    # (`lost-commit-marker`): the marker restores what the coordinator decided, never the opposite.
    transaction_result: Literal["ABORT", "COMMIT"] = "ABORT"


def candidate_id(
    cluster: str, topic: str, partition: int, producer_id: int, producer_epoch: int, start_offset: int
) -> str:
    """Deterministic id of an abort candidate (the key on the compacted candidates topic).

    The first 32 hex digits (128 bits) of SHA-256 over the compact JSON array
    `[cluster, topic, partition, producer_id, producer_epoch, start_offset]`; JSON keeps the fields apart
    whatever characters the cluster name contains.
    """
    payload = json.dumps(
        [cluster, topic, partition, producer_id, producer_epoch, start_offset],
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:32]


class AbortCandidate(Model):
    """A transaction proven HANGING, with the abort to send and the equivalent Kafka CLI line (JSON)."""

    schema_version: int = SCHEMA_VERSION
    candidate_id: str
    cluster: str = Field(min_length=1)
    topic: str = Field(min_length=1)
    partition: int = Field(ge=0)
    start_offset: int = Field(ge=0)
    spec: WriteTxnMarkersSpec
    reason: HangingReason
    evidence: Evidence
    explanation: str
    first_detected_ms: int
    kafka_cli: str
    status: CandidateStatus = CandidateStatus.OPENED
    # When it was RESOLVED or WITHDRAWN.
    resolved_at_ms: int | None = None
    # WITHDRAWN: why (the verdict that replaced the proof, and its explanation).
    withdrawn_reason: str | None = None
    # The verdict's two_phase_commit: `proposals abort` refuses such a candidate (docs/proposals.md).
    two_phase_commit: bool = False

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        expected = candidate_id(
            self.cluster,
            self.topic,
            self.partition,
            self.spec.producer_id,
            self.spec.producer_epoch,
            self.start_offset,
        )
        if self.candidate_id != expected:
            raise ValueError(f"candidate_id {self.candidate_id} does not match its fields ({expected})")
        if (self.spec.topic, self.spec.partition) != (self.topic, self.partition):
            raise ValueError("spec names another partition than the candidate")
        if (self.status is not CandidateStatus.OPENED) != (self.resolved_at_ms is not None):
            raise ValueError("resolved_at_ms is set exactly when status is RESOLVED or WITHDRAWN")
        if (self.status is CandidateStatus.WITHDRAWN) != (self.withdrawn_reason is not None):
            raise ValueError("withdrawn_reason is set exactly when status is WITHDRAWN")
        return self

    def resolved(self, *, resolved_at_ms: int) -> AbortCandidate:
        """The same candidate marked RESOLVED (the transaction is no longer open)."""
        return self.model_copy(
            update={
                "status": CandidateStatus.RESOLVED,
                "resolved_at_ms": resolved_at_ms,
                "withdrawn_reason": None,
            }
        )

    def audit_fields(self) -> dict[str, Any]:
        """What every `AuditRecord` about this candidate repeats of it: its id, where it is, and its plan."""
        return {
            "candidate_id": self.candidate_id,
            "cluster": self.cluster,
            "topic": self.topic,
            "partition": self.partition,
            "start_offset": self.start_offset,
            "plan": self.spec,
            "candidate_evidence": self.evidence,
        }

    def withdrawn(self, *, withdrawn_at_ms: int, reason: str) -> AbortCandidate:
        """The same candidate marked WITHDRAWN: its HANGING proof no longer holds (`reason` says what replaced
        it), though the transaction may still be open."""
        return self.model_copy(
            update={
                "status": CandidateStatus.WITHDRAWN,
                "resolved_at_ms": withdrawn_at_ms,
                "withdrawn_reason": reason,
            }
        )


# ------------------------------------------------------------------------------ verified abort (admin/proposals)


class LeaderProducer(Model):
    """One producer as the partition leader reports it right now (DescribeProducers' ActiveProducers row).

    `current_txn_start_offset` is -1 when the producer has no open transaction on the partition;
    `coordinator_epoch` is -1 when it never received a marker there.
    """

    producer_id: int = Field(ge=0)
    producer_epoch: int = Field(ge=0, le=MAX_PRODUCER_EPOCH)
    coordinator_epoch: int = Field(ge=-1)
    current_txn_start_offset: int = Field(ge=-1)
    last_timestamp_ms: int = -1
    # The sequence of the producer's last data batch on the partition (-1: none, or not read). A marker leaves it
    # as it is, so a change between two reads means the producer wrote to the partition in between.
    last_sequence: int = -1


class LiveCoordinator(Model):
    """What the coordinator currently records for the transactional id that owns a producer id
    (ListTransactions filtered by the producer id, then DescribeTransactions)."""

    transactional_id: str
    state: str
    producer_id: int
    producer_epoch: int
    partition_listed: bool
    coordinator: int = -1
    transaction_start_ms: int = -1
    # DescribeTransactions' TransactionTimeoutMs (-1 when not read): TWO_PHASE_COMMIT_TIMEOUT_MS marks KIP-939 2PC.
    transaction_timeout_ms: int = -1


class LiveEvidence(Model):
    """The partition and its coordinator as seen live, before or after an abort."""

    observed_at_ms: int
    leader: int
    # The leader's row for the candidate's producer id, None when the leader no longer lists it.
    producer: LeaderProducer | None = None
    # Every other producer with an open transaction on the partition: (producer id, start offset).
    other_open: tuple[tuple[int, int], ...] = ()
    last_stable_offset: int | None = None
    high_watermark: int | None = None
    # The owner of the producer id, None when no transactional id owns it (or it was not asked).
    coordinator: LiveCoordinator | None = None
    # Why the coordinator side could not be read (then `coordinator` proves nothing).
    coordinator_error: str | None = None
    # The partition's leader epoch now (metadata, checked against the leader's answer), None when unknown.
    leader_epoch: int | None = None
    # The leader epoch the batch at the candidate's start offset was appended in, read now; None when unknown.
    start_batch_leader_epoch: int | None = None


class VerifyOutcome(StrEnum):
    """What live verification concluded about an abort candidate."""

    SAFE = "SAFE"  # still open exactly as planned and not owned by its coordinator: the marker may be written
    REFUSED = "REFUSED"  # something changed or cannot be checked: write nothing
    ALREADY_RESOLVED = "ALREADY_RESOLVED"  # the transaction is no longer open: nothing to do


class VerifyResult(Model):
    """Live verification of a candidate: the outcome, what changed (one line each), and the marker to send."""

    outcome: VerifyOutcome
    changes: tuple[str, ...] = ()
    # SAFE only: the marker to write (coordinator epoch as the leader reports it now, 0 when negative).
    marker: WriteTxnMarkersSpec | None = None
    # Refusals the operator waived by flag (`--allow-live-owner`: `live-owner-same-epoch`; `--allow-leader-change`:
    # `leader-changed-since-start`), one line each: what verification would have refused with.
    waived: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _marker_only_when_safe(self) -> Self:
        if (self.outcome is VerifyOutcome.SAFE) != (self.marker is not None):
            raise ValueError("a marker is planned exactly when verification found the abort safe")
        return self


class PostCheck(Model):
    """After the marker: the transaction must be gone and the LSO past its start offset."""

    ok: bool
    problems: tuple[str, ...] = ()


class AuditOutcome(StrEnum):
    """How one `txnwatch proposals abort` (or `commit`) attempt ended (with its exit code in admin/proposals/verified_marker.py)."""

    DRY_RUN = "DRY_RUN"  # verified; nothing written (no --execute)
    ABORTED = "ABORTED"  # marker written and post-checked
    # `proposals commit`: a COMMIT marker restored a lost commit, post-checked (read_committed sees the records)
    COMMITTED = "COMMITTED"
    REFUSED = "REFUSED"  # state changed or not provably safe (by us, or the broker fenced the marker)
    ALREADY_RESOLVED = "ALREADY_RESOLVED"  # the transaction was no longer open: no-op
    DENIED = "DENIED"  # the broker refused for want of an ACL (Alter/ClusterAction on the cluster)
    FAILED = "FAILED"  # an error: the marker may or may not have been written (see marker_written)
    # The marker was written, but the transactional id owning the producer id at the marker's epoch moved
    # between verification and the marker (`collision` says how): it may have had records on the partition
    # aborted with the orphan while its coordinator commits the rest.
    COLLISION = "COLLISION"
    # Not an ending: an --execute run holds the candidate from here until its ending record (same audit_id), so
    # that two concurrent executions write one marker (admin/proposals/verified_marker.py). A claim without an ending expires.
    CLAIMED = "CLAIMED"
    # Not an attempt either: the streaming job withdrew the candidate (its proof no longer holds); written by the
    # job (actor "txnwatch-stream"), with the reason as its message.
    WITHDRAWN = "WITHDRAWN"


class AuditRecord(Model):
    """One attempt to abort a candidate (or to commit it: a lost commit marker), published to `<prefix>.audit`
    (JSON, key = candidate id)."""

    schema_version: int = SCHEMA_VERSION
    audit_id: str
    candidate_id: str
    cluster: str
    topic: str
    partition: int
    start_offset: int
    actor: str
    at_ms: int
    execute: bool
    plan: WriteTxnMarkersSpec
    candidate_evidence: Evidence
    before: LiveEvidence | None = None
    after: LiveEvidence | None = None
    verify: VerifyResult | None = None
    post_check: PostCheck | None = None
    marker: WriteTxnMarkersSpec | None = None  # the marker sent, if one was
    # True: the leader wrote it; False: not sent, or refused; None: unknown (the request failed in flight).
    marker_written: bool | None = False
    leader_moves: int = 0
    # `--allow-live-owner` was given: a live owner at the marker's epoch did not refuse the abort.
    allow_live_owner: bool = False
    # `--allow-leader-change` was given: a leader change since the transaction began did not refuse the abort.
    allow_leader_change: bool = False
    # COLLISION: what the owner's coordinator and the leader showed moved after the marker, one line each.
    collision: tuple[str, ...] = ()
    outcome: AuditOutcome
    message: str
