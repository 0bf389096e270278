"""The admin room's seams and the plain types that cross them: what `admin.wire.kafka_wire.KafkaWire` answers
(`ClusterWire` for partition leaders, `CoordinatorWire` for transaction coordinators) and what a sweep hands
to publishing and metrics (`SweepResult`).

Types only, plus the conversion of a DescribeProducers row into our `OpenTransaction` model at the boundary.
The collector, inspection, the wire, publishing and metrics all import these from here, never from each other;
unit tests implement the Protocols with scripted fakes.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from detectors.models import (
    BrokerSweepSummary,
    CoordinatorLogPosition,
    CoordinatorRecord,
    CoordinatorState,
    OpenTransaction,
    PartitionSnapshot,
    TopicPartition,
)

TP = tuple[str, int]


def wall_clock_ms() -> int:
    """The wall clock in milliseconds: the default clock of the wire, the collector and inspection."""
    return time.time_ns() // 1_000_000


# ------------------------------------------------------------------------------- partition leaders


class ActiveProducer(NamedTuple):
    """One ActiveProducers row of DescribeProducers."""

    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_timestamp_ms: int
    coordinator_epoch: int
    current_txn_start_offset: int


class PartitionProducers(NamedTuple):
    """One partition of a DescribeProducers response: its error name (None if fine) or its producers."""

    error: str | None
    producers: tuple[ActiveProducer, ...] = ()
    message: str | None = None


@dataclass(frozen=True)
class DescribeBatch:
    """One DescribeProducers request and its outcome.

    The leader's answer describes its state at some moment between `sent_at_ms` (the wall clock read just before
    the request was handed to the client) and `received_at_ms` (when the response, or the failure, arrived): a
    full request queue or a paused collector can put seconds between the two. So `sent_at_ms` is the snapshots'
    `observed_at_ms`, the moment every "the snapshot is after coordinator event E" proof compares against (the
    leader's state is no older than it), and `received_at_ms` the moment by which a transaction it reports open
    had opened. `error` is a request-level failure (unreachable broker, timeout), in which case `results` is
    empty.
    """

    broker: int
    partitions: tuple[TP, ...]
    received_at_ms: int
    results: Mapping[TP, PartitionProducers] = field(default_factory=dict)
    error: str | None = None
    message: str | None = None
    sent_at_ms: int = field(kw_only=True)


@dataclass(frozen=True)
class ClusterView:
    """Cluster metadata: brokers (id → host:port), every partition's leader (-1 if none) and, where the answer
    carried it (Metadata v7+), the leader's epoch: what ListOffsets and Fetch send as `current_leader_epoch`, so
    a broker that is not the leader at that epoch refuses (`Partition.localLogWithEpochOrThrow`)."""

    brokers: Mapping[int, str]
    leaders: Mapping[TP, int]
    internal_topics: frozenset[str] = frozenset()
    leader_epochs: Mapping[TP, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class StartBatch:
    """The record batch holding a transaction's first record (read by `admin.wire.fetch.parse_start_batch`).

    `start_timestamp_ms` is the timestamp of the record at the start offset (under LogAppendTime, the batch's
    append time, as Kafka reports it); `max_timestamp_ms` is the batch's max timestamp. `leader_epoch` is the
    header's partitionLeaderEpoch: the leader epoch the batch was appended at (None when the header says -1).
    """

    base_offset: int
    producer_id: int
    producer_epoch: int
    start_timestamp_ms: int
    max_timestamp_ms: int
    transactional: bool
    # The consumer group whose offset records the batch holds (a transaction's batch on `__consumer_offsets`),
    # and the partitions whose offsets it commits.
    offset_commit_group: str | None = None
    offset_commit_partitions: tuple[TP, ...] = ()
    leader_epoch: int | None = None


class FetchFailure(NamedTuple):
    """Why a start batch could not be read; `permanent` failures are not retried for the same transaction."""

    error: str
    permanent: bool


class Offsets(NamedTuple):
    """A partition's last stable offset (read_committed ListOffsets) and high watermark (read_uncommitted), and
    the error (Kafka's name) of either request for it, if any: FENCED_LEADER_EPOCH, UNKNOWN_LEADER_EPOCH or
    NOT_LEADER_OR_FOLLOWER say the broker asked is not the leader at the epoch it was asked with."""

    last_stable_offset: int | None
    high_watermark: int | None
    error: str | None = None


class GroupOffsets(NamedTuple):
    """The consumer groups' committed offsets on one partition (group id -> offset; groups with no commit there
    left out), or the error that kept them unknown (Kafka's error name)."""

    offsets: Mapping[str, int]
    error: str | None = None


class GroupStanding(NamedTuple):
    """How a consumer group stands now: its state and members (DescribeGroups), whether an OffsetFetch with
    `require_stable` answers UNSTABLE_OFFSET_COMMIT (its committed offsets are pending in a transaction), the other
    groups placed on its `__consumer_offsets` partition, and the error that kept any of it unknown."""

    group: str
    state: str | None = None
    members: int | None = None
    unstable: bool | None = None
    neighbours: tuple[str, ...] = ()
    error: str | None = None


class EndOffset(NamedTuple):
    """A partition's high watermark (ListOffsets latest, read_uncommitted), or the error that kept it unknown."""

    offset: int | None
    error: str | None = None


class BrokerTimeout(NamedTuple):
    """A broker's `transaction.max.timeout.ms`, or why it is unknown."""

    value_ms: int | None
    error: str | None = None


class ClusterWire(Protocol):
    """The slice of Kafka the sweep needs; `admin.wire.kafka_wire.KafkaWire` implements it with kafka-python."""

    def metadata(self, topics: Sequence[str] | None = None) -> ClusterView:
        """All topics (or only `topics`; missing ones are left out), internal ones included.

        Raises kafka.errors.KafkaError if no broker answers."""
        ...

    def describe_producers(self, batches: Mapping[int, Sequence[Sequence[TP]]]) -> list[DescribeBatch]:
        """One DescribeProducers request per batch, brokers concurrently; never raises for a broker's failure."""
        ...

    def fetch_start_batches(
        self,
        wanted: Mapping[int, Sequence[tuple[TP, int]]],
        leader_epochs: Mapping[TP, int] | None = None,
    ) -> dict[tuple[TP, int], StartBatch | FetchFailure]:
        """The batch at each (partition, start offset), read_uncommitted from the given leader (fenced at
        `leader_epochs` where given)."""
        ...

    def list_offsets(
        self, wanted: Mapping[int, Sequence[TP]], leader_epochs: Mapping[TP, int] | None = None
    ) -> dict[TP, Offsets]:
        """LSO (read_committed ListOffsets) and high watermark (read_uncommitted) per partition, fenced at
        `leader_epochs` where given."""
        ...

    def end_offsets(
        self,
        wanted: Mapping[int, Sequence[TP]],
        leader_epochs: Mapping[TP, int] | None = None,
        *,
        log_end: bool = False,
    ) -> dict[TP, EndOffset]:
        """The high watermark of each partition, asked of the given leader (one read_uncommitted ListOffsets
        per broker, brokers concurrently; fenced at `leader_epochs` where given), or its error name; never
        raises for a broker's failure. `log_end`: the leader's log end offset instead (replica id -2)."""
        ...

    def max_transaction_timeouts(self, brokers: Sequence[int]) -> dict[int, BrokerTimeout]:
        """`transaction.max.timeout.ms` of each broker (DescribeConfigs)."""
        ...


def open_transaction(
    p: ActiveProducer,
    start: StartBatch | None,
    *,
    opened_after_ms: int | None = None,
    seen_open_ms: int | None = None,
) -> OpenTransaction:
    """Our model of an open transaction from a DescribeProducers row and, if read, its start batch, with the
    collector's bounds of its opening (`admin.collect.sighting`).

    Raises:
        pydantic.ValidationError: for values out of range (e.g. a negative producer id).
    """
    return OpenTransaction(
        producer_id=p.producer_id,
        producer_epoch=p.producer_epoch,
        coordinator_epoch=max(p.coordinator_epoch, -1),
        start_offset=p.current_txn_start_offset,
        start_timestamp_ms=start.start_timestamp_ms if start is not None else None,
        start_batch_producer_epoch=start.producer_epoch if start is not None else None,
        start_batch_leader_epoch=start.leader_epoch if start is not None else None,
        last_sequence=max(p.last_sequence, -1),
        last_timestamp_ms=max(p.last_timestamp_ms, -1),
        offset_commit_group=start.offset_commit_group if start is not None else None,
        opened_after_ms=opened_after_ms,
        seen_open_ms=seen_open_ms,
    )


# --------------------------------------------------------------------------- transaction coordinators


class TransactionListing(NamedTuple):
    """One ListTransactions row, with the broker that listed it (its coordinator)."""

    transactional_id: str
    producer_id: int
    state: str
    coordinator: int


class ListingResult(NamedTuple):
    listings: list[TransactionListing]
    failed: dict[int, str]  # broker → error name, for brokers whose listing failed
    # The brokers that answered without an error: only their listings are complete (a broker never asked is in
    # neither set).
    answered: frozenset[int] = frozenset()


class TransactionDescription(NamedTuple):
    """One DescribeTransactions row; `error` is Kafka's error name (None if fine)."""

    transactional_id: str
    error: str | None
    state: str
    timeout_ms: int
    start_time_ms: int
    producer_id: int
    producer_epoch: int
    partitions: tuple[TP, ...]
    coordinator: int


def record_from_description(d: TransactionDescription, *, seen_at_ms: int) -> CoordinatorRecord:
    """A `CoordinatorRecord` (origin describe-transactions) from one DescribeTransactions row.

    `last_update_timestamp_ms` is `seen_at_ms`, the first time the collector saw this content: the API does not
    say when the coordinator last changed the state. The previous/next producer ids and the client's
    transaction version are not in the API (defaults -1, -1, 0).

    Raises:
        ValueError: unknown state name, or fields out of range.
    """
    return CoordinatorRecord(
        transactional_id=d.transactional_id,
        producer_id=d.producer_id,
        producer_epoch=d.producer_epoch,
        transaction_timeout_ms=d.timeout_ms,
        state=CoordinatorState(d.state),
        partitions=tuple(TopicPartition(topic=t, partition=p) for t, p in sorted(d.partitions)),
        last_update_timestamp_ms=seen_at_ms,
        start_timestamp_ms=d.start_time_ms,
        origin="describe-transactions",
    )


class CoordinatorWire(Protocol):
    """The coordinator APIs the fallback and inspection need; `admin.wire.kafka_wire.KafkaWire` implements them."""

    def broker_apis(self, brokers: Sequence[int]) -> dict[int, Mapping[int, tuple[int, int]]]:
        """Each broker's ApiVersions (API key -> (min, max)); empty for a broker whose versions are unknown
        (`admin.wire.versions` reads them)."""
        ...

    def list_transactions(
        self,
        *,
        producer_ids: Sequence[int] = (),
        states: Sequence[str] = (),
        duration_filter_ms: int | None = None,
        brokers: Sequence[int] | None = None,
    ) -> ListingResult:
        """ListTransactions on `brokers` (None: every broker), concurrently; a broker whose request fails (a
        DurationFilter to a broker without ListTransactions v1 fails UNSUPPORTED_VERSION) is in `failed`."""
        ...

    def describe_transactions(
        self, by_coordinator: Mapping[int, Sequence[str]]
    ) -> list[TransactionDescription]: ...


# --------------------------------------------------------------------------------- a sweep's output


@dataclass
class SweepResult:
    """What one sweep saw and will publish (read by `admin.collect.publish` and `admin.collect.metrics`)."""

    sweep_id: str
    started_at_ms: int
    duration_s: float
    snapshots: list[PartitionSnapshot]
    empties: list[PartitionSnapshot]
    summaries: list[BrokerSweepSummary]
    partitions_total: int
    partitions_covered: int
    new_transactions: int
    start_batch_fetches: int
    problems: list[str]
    # How far `__transaction_state` had reached when the sweep's DescribeProducers answers were in (published
    # after the sweep's other records); empty if the topic does not exist or no partition answered.
    positions: list[CoordinatorLogPosition] = field(default_factory=list)
    # A re-describe of a few partitions between full sweeps (admin/collect/redescribe.py): its snapshots and positions
    # are published as a sweep's, but it has no broker summaries and says nothing of the other partitions.
    redescribe: bool = False

    @property
    def open_transactions(self) -> int:
        return sum(len(s.open_transactions) for s in self.snapshots)

    def as_json(self) -> dict[str, Any]:
        """The `--once` output: the sweep's records as they would be published."""
        return {
            "sweep_id": self.sweep_id,
            "started_at_ms": self.started_at_ms,
            "duration_s": round(self.duration_s, 3),
            "partitions_total": self.partitions_total,
            "partitions_covered": self.partitions_covered,
            "open_transactions": self.open_transactions,
            "new_transactions": self.new_transactions,
            "start_batch_fetches": self.start_batch_fetches,
            "snapshots": [s.model_dump(mode="json") for s in self.snapshots],
            "empty_snapshots": [s.model_dump(mode="json") for s in self.empties],
            "summaries": [s.model_dump(mode="json") for s in self.summaries],
            "coordinator_log_positions": [p.model_dump(mode="json") for p in self.positions],
            "problems": self.problems,
        }


# ------------------------------------------------------------------------------- our own topics' records

Headers = list[tuple[str, bytes]]


class OutRecord(NamedTuple):
    """One record to produce."""

    topic: str
    key: bytes
    value: bytes
    headers: Headers


class ConsumedRecord(Protocol):
    """One record a consumer read (kafka-python's ConsumerRecord), as `admin.wire.records` hands it out."""

    @property
    def partition(self) -> int: ...

    @property
    def offset(self) -> int: ...

    @property
    def timestamp(self) -> int: ...

    @property
    def key(self) -> bytes | None: ...

    @property
    def value(self) -> bytes | None: ...

    @property
    def headers(self) -> Headers | None: ...
