"""The sweep: what every partition leader says is open, as `PartitionSnapshot`s and per-broker summaries.

One sweep = cluster metadata (internal topics included) → DescribeProducers per leader in batches of at most
500 partitions, all brokers at once → a refresh-and-retry round for partitions whose leader moved → the start
batch of every transaction not seen before (cached) → LSO and high watermark of partitions with open
transactions. Right after the DescribeProducers answers, the high watermarks of `__transaction_state` are asked
for: the `CoordinatorLogPosition` that tells the streaming job when its coordinator view is current.
`ClusterWire` is the seam: `admin.wire.KafkaWire` speaks Kafka, unit tests pass a fake.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from pydantic import ValidationError

from admin.client import AdminError, explain, is_authorization_error
from admin.fetch import StartBatch
from admin.metrics import CollectorMetrics
from admin.settings import CollectorSettings
from detectors.models import BrokerSweepSummary, CoordinatorLogPosition, OpenTransaction, PartitionSnapshot

log = logging.getLogger(__name__)

TP = tuple[str, int]
NO_LEADER = -1
# The coordinators' log, whose reach each sweep measures (primary mode).
TRANSACTION_LOG = "__transaction_state"

# Partition errors that mean "ask the new leader": refresh metadata and retry within the sweep.
RETRY_WITH_NEW_LEADER = frozenset(
    {
        "NOT_LEADER_OR_FOLLOWER",
        "UNKNOWN_TOPIC_OR_PARTITION",
        "LEADER_NOT_AVAILABLE",
        "REPLICA_NOT_AVAILABLE",
        "KAFKA_STORAGE_ERROR",
        "FENCED_LEADER_EPOCH",
        "UNKNOWN_LEADER_EPOCH",
    }
)


# ----------------------------------------------------------------------------------------- the seam


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

    `received_at_ms` is the wall clock when the response (or the failure) arrived: the snapshots'
    `observed_at_ms`. `error` is a request-level failure (unreachable broker, timeout), in which case
    `results` is empty.
    """

    broker: int
    partitions: tuple[TP, ...]
    received_at_ms: int
    results: Mapping[TP, PartitionProducers] = field(default_factory=dict)
    error: str | None = None
    message: str | None = None


@dataclass(frozen=True)
class ClusterView:
    """Cluster metadata: brokers (id → host:port) and every partition's leader (-1 if none)."""

    brokers: Mapping[int, str]
    leaders: Mapping[TP, int]
    internal_topics: frozenset[str] = frozenset()


class FetchFailure(NamedTuple):
    """Why a start batch could not be read; `permanent` failures are not retried for the same transaction."""

    error: str
    permanent: bool


class Offsets(NamedTuple):
    last_stable_offset: int | None
    high_watermark: int | None


class EndOffset(NamedTuple):
    """A partition's high watermark (ListOffsets latest, read_uncommitted), or the error that kept it unknown."""

    offset: int | None
    error: str | None = None


class BrokerTimeout(NamedTuple):
    """A broker's `transaction.max.timeout.ms`, or why it is unknown."""

    value_ms: int | None
    error: str | None = None


class ClusterWire(Protocol):
    """The slice of Kafka the sweep needs; `admin.wire.KafkaWire` implements it with kafka-python."""

    def metadata(self, topics: Sequence[str] | None = None) -> ClusterView:
        """All topics (or only `topics`; missing ones are left out), internal ones included.

        Raises kafka.errors.KafkaError if no broker answers."""
        ...

    def describe_producers(self, batches: Mapping[int, Sequence[Sequence[TP]]]) -> list[DescribeBatch]:
        """One DescribeProducers request per batch, brokers concurrently; never raises for a broker's failure."""
        ...

    def fetch_start_batches(
        self, wanted: Mapping[int, Sequence[tuple[TP, int]]]
    ) -> dict[tuple[TP, int], StartBatch | FetchFailure]:
        """The batch at each (partition, start offset), read_uncommitted from the given leader."""
        ...

    def list_offsets(self, wanted: Mapping[int, Sequence[TP]]) -> dict[TP, Offsets]:
        """LSO (read_committed ListOffsets) and high watermark (read_uncommitted) per partition."""
        ...

    def end_offsets(self, wanted: Mapping[int, Sequence[TP]]) -> dict[TP, EndOffset]:
        """The high watermark of each partition, asked of the given leader (one read_uncommitted ListOffsets
        per broker, brokers concurrently), or its error name; never raises for a broker's failure."""
        ...

    def max_transaction_timeouts(self, brokers: Sequence[int]) -> dict[int, BrokerTimeout]:
        """`transaction.max.timeout.ms` of each broker (DescribeConfigs)."""
        ...


# ------------------------------------------------------------------------------------------- results


@dataclass
class SweepResult:
    """What one sweep saw and will publish."""

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


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def open_transaction(p: ActiveProducer, start: StartBatch | None) -> OpenTransaction:
    """Our model of an open transaction from a DescribeProducers row and, if read, its start batch.

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
        last_sequence=max(p.last_sequence, -1),
        last_timestamp_ms=max(p.last_timestamp_ms, -1),
    )


def chunks(items: Sequence[TP], size: int) -> list[list[TP]]:
    return [list(items[i : i + size]) for i in range(0, len(items), size)]


def measure_log_position(
    wire: ClusterWire,
    view: ClusterView,
    topic: str,
    *,
    cluster: str,
    sweep_id: str,
    as_of_ms: int,
    skip_brokers: Collection[int] = frozenset(),
) -> tuple[CoordinatorLogPosition | None, list[str]]:
    """How far `topic` has reached: the high watermark of each of its partitions in `view`, asked of its leader
    now, as a position as of `as_of_ms`.

    The caller reads `as_of_ms` *before* calling: the offsets asked for now are at least what they were then,
    so every record written by that moment lies below them. Partitions without a leader, led by a broker in
    `skip_brokers` (it failed this sweep; asking again would only wait for its timeout), or answering with an
    error are left out: the job keeps them as current as an earlier position made them.

    Returns:
        The position (None if `topic` is not in `view`, e.g. no transaction ever ran, or no partition
        answered) and one problem message per kind of failure.
    """
    partitions = sorted(p for t, p in view.leaders if t == topic)
    if not partitions:
        return None, []
    wanted: dict[int, list[TP]] = {}
    failed: dict[str, list[int]] = {}
    for p in partitions:
        leader = view.leaders[(topic, p)]
        if leader < 0:
            failed.setdefault("LEADER_NOT_AVAILABLE", []).append(p)
        elif leader in skip_brokers:
            failed.setdefault("BROKER_BACKOFF", []).append(p)
        else:
            wanted.setdefault(leader, []).append((topic, p))
    answers = wire.end_offsets(wanted) if wanted else {}
    end_offsets: dict[int, int] = {}
    for tps in wanted.values():
        for tp in tps:
            answer = answers.get(tp, EndOffset(None, "MISSING_FROM_RESPONSE"))
            if answer.error is None and answer.offset is not None and answer.offset >= 0:
                end_offsets[tp[1]] = answer.offset
            else:
                failed.setdefault(answer.error or "NO_OFFSET", []).append(tp[1])
    problems = [_position_problem(topic, error, ps) for error, ps in sorted(failed.items())]
    if not end_offsets:
        # An empty position would vouch for nothing, yet tell the job its view is measured.
        return None, problems
    position = CoordinatorLogPosition(
        cluster=cluster,
        sweep_id=sweep_id,
        topic=topic,
        partitions=partitions[-1] + 1,
        as_of_ms=as_of_ms,
        end_offsets=end_offsets,
    )
    return position, problems


def _position_problem(topic: str, error: str, partitions: Sequence[int]) -> str:
    if is_authorization_error(error):
        # The same every sweep, so it is logged once: names the ACL (Describe on the topic).
        return explain("ListOffsets", error, topic)
    listed = ", ".join(str(p) for p in sorted(partitions))
    return (
        f"{explain('ListOffsets', error, topic)}: partitions {listed} left out of its coordinator log "
        "position this sweep"
    )


@dataclass
class _Backoff:
    failures: int
    retry_at: float


# ------------------------------------------------------------------------------------------ the sweep


class Collector:
    """Sweeps the cluster; keeps the start-batch cache, the set of partitions last published open, broker
    timeouts and per-broker backoff between sweeps.

    Args:
        wire: the Kafka seam.
        cluster: the cluster name written into every record.
        settings: batch size, retries, backoff, config refresh.
        open_partitions: partitions whose last published snapshot had open transactions (read back from the
            snapshot topic at start-up); None if unknown, in which case the first sweep publishes an empty
            snapshot for every partition it covers without open transactions.
        clock_ms: the wall clock; read only when a response arrives (in the wire), for sweep ids, and for the
            coordinator log position's `as_of_ms` (after the DescribeProducers phase).
        monotonic / sleep: for durations, backoff and the pause before a retry round.
    """

    def __init__(
        self,
        wire: ClusterWire,
        *,
        cluster: str,
        settings: CollectorSettings,
        open_partitions: set[TP] | None = None,
        metrics: CollectorMetrics | None = None,
        clock_ms: Callable[[], int] = wall_clock_ms,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._wire = wire
        self._cluster = cluster
        self._settings = settings
        self._open = set(open_partitions) if open_partitions is not None else None
        self._metrics = metrics
        self._clock_ms = clock_ms
        self._monotonic = monotonic
        self._sleep = sleep
        self._starts: dict[tuple[str, int, int, int], StartBatch | None] = {}
        self._timeouts: dict[int, int | None] = {}
        self._timeouts_at: float | None = None
        self._backoff: dict[int, _Backoff] = {}
        self._open_before: tuple[str, set[TP] | None] | None = None
        self._run_id = uuid.uuid4().hex[:8]
        self._seq = 0
        self._noted: set[str] = set()

    @property
    def open_partitions(self) -> set[TP] | None:
        return None if self._open is None else set(self._open)

    @property
    def cached_start_batches(self) -> int:
        return len(self._starts)

    def _note(self, message: str, problems: list[str]) -> None:
        # Every sweep reports its problems; the log gets each distinct one once.
        problems.append(message)
        if message not in self._noted:
            self._noted.add(message)
            log.warning("%s", message)

    def sweep(self) -> SweepResult:
        """Run one sweep.

        Returns:
            The snapshots (partitions with open transactions), explicit empty snapshots (partitions whose open
            set became empty, or whose topic was deleted), one summary per broker, and (primary mode) the
            position of `__transaction_state` as of the end of the DescribeProducers phase.

        Raises:
            kafka.errors.KafkaError: if cluster metadata cannot be read (nothing else stops a sweep).
        """
        started = self._monotonic()
        self._seq += 1
        sweep_id = f"{self._run_id}-{self._seq}"
        started_at_ms = self._clock_ms()
        problems: list[str] = []
        s = self._settings

        view = self._wire.metadata()
        all_partitions = set(view.leaders)
        uncovered: dict[int, Counter[str]] = {}
        described: dict[TP, tuple[int, int, PartitionProducers]] = {}

        def lose(broker: int, tp_count: int, error: str) -> None:
            uncovered.setdefault(broker, Counter())[error] += tp_count

        now = self._monotonic()
        pending: dict[int, list[TP]] = {}
        for tp, leader in view.leaders.items():
            if leader < 0:
                lose(NO_LEADER, 1, "LEADER_NOT_AVAILABLE")
            elif (b := self._backoff.get(leader)) is not None and b.retry_at > now:
                lose(leader, 1, "BROKER_BACKOFF")
            else:
                pending.setdefault(leader, []).append(tp)

        failed_brokers: set[int] = set()
        answered_brokers: set[int] = set()
        deleted: set[TP] = set()
        last_answer_ms = started_at_ms
        attempt = 0
        while pending:
            batches = {b: chunks(sorted(tps), s.describe_batch_size) for b, tps in pending.items()}
            retry: list[tuple[TP, int, str, bool]] = []  # (tp, broker asked, error, request-level)
            for batch in self._wire.describe_producers(batches):
                last_answer_ms = max(last_answer_ms, batch.received_at_ms)
                if batch.error is not None:
                    failed_brokers.add(batch.broker)
                    self._note(
                        explain("DescribeProducers", batch.error, f"broker {batch.broker}", batch.message),
                        problems,
                    )
                    retry.extend((tp, batch.broker, batch.error, True) for tp in batch.partitions)
                    continue
                answered_brokers.add(batch.broker)
                for tp in batch.partitions:
                    result = batch.results.get(tp, PartitionProducers("MISSING_FROM_RESPONSE"))
                    if result.error is None:
                        described[tp] = (batch.broker, batch.received_at_ms, result)
                    elif result.error in RETRY_WITH_NEW_LEADER:
                        retry.append((tp, batch.broker, result.error, False))
                    else:
                        lose(batch.broker, 1, result.error)
                        if is_authorization_error(result.error):
                            self._note(explain("DescribeProducers", result.error, tp[0]), problems)
            attempt += 1
            pending = {}
            if not retry:
                break
            if attempt > s.retries_per_sweep:
                for _tp, broker, error, _ in retry:
                    lose(broker, 1, error)
                break
            if s.retry_backoff_ms:
                self._sleep(s.retry_backoff_ms / 1000)
            view = self._wire.metadata()
            for tp, broker, error, request_level in retry:
                moved_to = view.leaders.get(tp)
                if moved_to is None:
                    deleted.add(tp)  # the topic (or partition) no longer exists
                elif moved_to < 0:
                    lose(NO_LEADER, 1, "LEADER_NOT_AVAILABLE")
                elif request_level and (moved_to == broker or moved_to in failed_brokers):
                    lose(broker, 1, error)  # still led by a broker that just failed: not again this sweep
                else:
                    pending.setdefault(moved_to, []).append(tp)
        self._update_backoff(failed_brokers, answered_brokers)

        # Read after the last DescribeProducers answer (and never before it, should the clock step back) and
        # before the offsets are asked for: everything a coordinator wrote that could explain those answers
        # was committed before them, so it lies below the end offsets measured next.
        as_of_ms = max(self._clock_ms(), last_answer_ms)
        positions = self._log_positions(view, sweep_id, as_of_ms, problems)

        # Transactions open now, and the start batches not fetched before.
        open_now: dict[TP, list[ActiveProducer]] = {}
        need_fetch: dict[int, list[tuple[TP, int]]] = {}
        new_transactions = 0
        for tp, (broker, _, result) in described.items():
            open_txns = [p for p in result.producers if p.current_txn_start_offset >= 0]
            if not open_txns:
                continue
            open_now[tp] = open_txns
            for p in open_txns:
                key = (tp[0], tp[1], p.producer_id, p.current_txn_start_offset)
                if key not in self._starts:
                    need_fetch.setdefault(broker, []).append((tp, p.current_txn_start_offset))
                    new_transactions += 1
        fetches = sum(len(v) for v in need_fetch.values())
        if need_fetch:
            self._fetch_start_batches(need_fetch, open_now, problems)
        offsets: dict[TP, Offsets] = {}
        if open_now:
            wanted: dict[int, list[TP]] = {}
            for tp in open_now:
                wanted.setdefault(described[tp][0], []).append(tp)
            offsets = self._wire.list_offsets(wanted)
        self._refresh_timeouts(
            [b for b in view.brokers if b not in failed_brokers and b not in self._backed_off(now)], problems
        )

        snapshots: list[PartitionSnapshot] = []
        empties: list[PartitionSnapshot] = []
        settled: set[TP] = set()  # partitions whose open set this sweep knows for sure
        covered_by: Counter[int] = Counter()
        last_seen_by: dict[int, int] = {}
        for tp, (broker, received_at_ms, _) in sorted(described.items()):
            txns = open_now.get(tp)
            wants_empty = not txns and (self._open is None or tp in self._open)
            if txns or wants_empty:
                # Only partitions that publish something are built (a model costs microseconds, x 10k).
                try:
                    snap = PartitionSnapshot(
                        cluster=self._cluster,
                        sweep_id=sweep_id,
                        observed_at_ms=received_at_ms,
                        leader=broker,
                        topic=tp[0],
                        partition=tp[1],
                        open_transactions=tuple(
                            sorted(
                                (self._open_transaction(tp, p) for p in txns or ()),
                                key=lambda t: t.start_offset,
                            )
                        ),
                        last_stable_offset=offsets[tp].last_stable_offset if tp in offsets else None,
                        high_watermark=offsets[tp].high_watermark if tp in offsets else None,
                        max_transaction_timeout_ms=self._timeouts.get(broker),
                    )
                except ValidationError as exc:
                    lose(broker, 1, "INVALID_PRODUCER_STATE")
                    self._note(
                        f"{tp[0]}-{tp[1]}: leader {broker} reported unusable producer state: {exc}", problems
                    )
                    continue
                (snapshots if txns else empties).append(snap)
            settled.add(tp)
            covered_by[broker] += 1
            if received_at_ms > last_seen_by.get(broker, 0):
                last_seen_by[broker] = received_at_ms
        # Partitions that no longer exist (topic deleted) cannot hold a transaction any more.
        gone = deleted | ((self._open or set()) - set(view.leaders))
        for tp in sorted(gone):
            settled.add(tp)
            if self._open is not None and tp not in self._open:
                continue
            empties.append(
                PartitionSnapshot(
                    cluster=self._cluster,
                    sweep_id=sweep_id,
                    # Known gone from metadata read during the DescribeProducers phase, so by as_of_ms; this
                    # keeps the sweep's snapshots no later than its position.
                    observed_at_ms=as_of_ms,
                    leader=NO_LEADER,
                    topic=tp[0],
                    partition=tp[1],
                )
            )
        now_open = {(snap.topic, snap.partition) for snap in snapshots}
        # Partitions this sweep could not describe keep what was last published for them.
        self._open_before = (sweep_id, None if self._open is None else set(self._open))
        self._open = now_open if self._open is None else (self._open - settled) | now_open
        self._prune_start_cache(described, open_now)

        end_ms = self._clock_ms()
        summaries = [
            BrokerSweepSummary(
                cluster=self._cluster,
                sweep_id=sweep_id,
                observed_at_ms=last_seen_by.get(b, end_ms),
                broker=b,
                partitions_covered=covered_by.get(b, 0),
                errors=dict(sorted(uncovered.get(b, Counter()).items())),
            )
            for b in sorted(set(view.brokers) | set(uncovered) | set(covered_by))
        ]
        sweep = SweepResult(
            sweep_id=sweep_id,
            started_at_ms=started_at_ms,
            duration_s=self._monotonic() - started,
            snapshots=snapshots,
            empties=empties,
            summaries=summaries,
            partitions_total=len(all_partitions - deleted),
            partitions_covered=sum(covered_by.values()),
            new_transactions=new_transactions,
            start_batch_fetches=fetches,
            problems=problems,
            positions=positions,
        )
        if self._metrics is not None:
            self._metrics.observe_sweep(sweep, cached_start_batches=len(self._starts))
        return sweep

    def unpublished(self, result: SweepResult) -> None:
        """The sweep's records did not reach Kafka: undo its effect on the open set, so the next sweep sends
        the empty snapshots again. Only the latest sweep can be undone."""
        if self._open_before is not None and self._open_before[0] == result.sweep_id:
            self._open = self._open_before[1]
            self._open_before = None

    # ---------------------------------------------------------------------------------------- helpers

    def _log_positions(
        self, view: ClusterView, sweep_id: str, as_of_ms: int, problems: list[str]
    ) -> list[CoordinatorLogPosition]:
        if self._settings.coordinator_source != "log":
            # The job then reads <prefix>.coordinator-state, whose position each poll publishes; and the
            # principal may well have no access to __transaction_state at all.
            return []
        position, trouble = measure_log_position(
            self._wire,
            view,
            TRANSACTION_LOG,
            cluster=self._cluster,
            sweep_id=sweep_id,
            as_of_ms=as_of_ms,
            skip_brokers=self._backed_off(self._monotonic()),
        )
        for message in trouble:
            self._note(message, problems)
        return [position] if position is not None else []

    def _backed_off(self, now: float) -> set[int]:
        return {b for b, state in self._backoff.items() if state.retry_at > now}

    def _update_backoff(self, failed: set[int], answered: set[int]) -> None:
        now = self._monotonic()
        s = self._settings
        for b in answered - failed:
            self._backoff.pop(b, None)
        for b in failed:
            failures = self._backoff[b].failures + 1 if b in self._backoff else 1
            delay = min(s.broker_backoff_initial_s * 2 ** (failures - 1), s.broker_backoff_max_s)
            self._backoff[b] = _Backoff(failures, now + delay)

    def _fetch_start_batches(
        self,
        need: Mapping[int, Sequence[tuple[TP, int]]],
        open_now: Mapping[TP, Sequence[ActiveProducer]],
        problems: list[str],
    ) -> None:
        outcomes = self._wire.fetch_start_batches(need)
        for (tp, offset), outcome in outcomes.items():
            for p in open_now.get(tp, ()):
                if p.current_txn_start_offset != offset:
                    continue
                key = (tp[0], tp[1], p.producer_id, offset)
                if isinstance(outcome, StartBatch):
                    if outcome.producer_id != p.producer_id or not outcome.transactional:
                        self._note(
                            f"{tp[0]}-{tp[1]}: the batch at start offset {offset} belongs to producer "
                            f"{outcome.producer_id}, not {p.producer_id}; start time left unknown",
                            problems,
                        )
                        self._starts[key] = None
                    else:
                        self._starts[key] = outcome
                elif outcome.permanent:
                    self._starts[key] = None
                elif is_authorization_error(outcome.error):
                    self._note(explain("Fetch", outcome.error, tp[0]), problems)

    def _open_transaction(self, tp: TP, p: ActiveProducer) -> OpenTransaction:
        return open_transaction(
            p, self._starts.get((tp[0], tp[1], p.producer_id, p.current_txn_start_offset))
        )

    def _prune_start_cache(
        self, described: Mapping[TP, object], open_now: Mapping[TP, Sequence[ActiveProducer]]
    ) -> None:
        # Forget start batches of transactions that are no longer open on partitions this sweep covered.
        live = {
            (tp[0], tp[1], p.producer_id, p.current_txn_start_offset)
            for tp, txns in open_now.items()
            for p in txns
        }
        for key in [k for k in self._starts if (k[0], k[1]) in described and k not in live]:
            del self._starts[key]

    def _refresh_timeouts(self, brokers: Sequence[int], problems: list[str]) -> None:
        now = self._monotonic()
        stale = self._timeouts_at is None or now - self._timeouts_at >= self._settings.config_refresh_s
        wanted = list(brokers) if stale else [b for b in brokers if b not in self._timeouts]
        if not wanted:
            return
        for broker, answer in self._wire.max_transaction_timeouts(wanted).items():
            if answer.value_ms is not None:
                self._timeouts[broker] = answer.value_ms
            else:
                self._timeouts.setdefault(broker, None)
                if answer.error is not None and is_authorization_error(answer.error):
                    self._note(explain("DescribeConfigs", answer.error, f"broker {broker}"), problems)
        if stale:
            self._timeouts_at = now


# ------------------------------------------------------------------------------------------- the loop


def run(
    collector: Collector,
    publish: Callable[[SweepResult], object],
    *,
    interval_s: float,
    stop: threading.Event,
    also: Iterable[Callable[[], object]] = (),
    metrics: CollectorMetrics | None = None,
    max_sweeps: int | None = None,
    clock_ms: Callable[[], int] = wall_clock_ms,
) -> int:
    """Sweep and publish every `interval_s` until `stop` is set (Ctrl-C) or `max_sweeps` ran.

    A failed sweep (no metadata, a publish error) is logged and counted; the next one runs on schedule.
    `also` runs after each sweep (the coordinator fallback poll). Returns the number of sweeps run.
    """
    sweeps = 0
    while not stop.is_set():
        began = time.monotonic()
        try:
            result = collector.sweep()
            try:
                publish(result)
            except BaseException:
                collector.unpublished(result)
                raise
            if metrics is not None:
                metrics.last_success.set(clock_ms() / 1000)
            log.info(
                "sweep %s: %d/%d partitions covered, %d open transactions on %d partitions, %d empty "
                "snapshots, %.3fs",
                result.sweep_id,
                result.partitions_covered,
                result.partitions_total,
                result.open_transactions,
                len(result.snapshots),
                len(result.empties),
                result.duration_s,
            )
        except AdminError as exc:
            log.error("sweep failed: %s", exc)
            if metrics is not None:
                metrics.sweep_failures.inc()
        except Exception as exc:  # a sweep must never kill the collector; the next one may succeed
            log.error("sweep failed: %s", exc, exc_info=not _is_kafka_error(exc))
            if metrics is not None:
                metrics.sweep_failures.inc()
        for task in also:
            if stop.is_set():
                break
            try:
                task()
            except Exception as exc:
                log.error("%s failed: %s", getattr(task, "__name__", "task"), exc)
        sweeps += 1
        if max_sweeps is not None and sweeps >= max_sweeps:
            break
        stop.wait(max(0.0, interval_s - (time.monotonic() - began)))
    return sweeps


def _is_kafka_error(exc: BaseException) -> bool:
    from kafka.errors import KafkaError

    return isinstance(exc, KafkaError)
