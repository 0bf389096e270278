"""The sweep: what every partition leader says is open, as `PartitionSnapshot`s and per-broker summaries.

One sweep = cluster metadata (internal topics included) → DescribeProducers per leader in batches of at most
500 partitions, all brokers at once → metadata again, and a retry round for partitions whose leader (or leader
epoch) is not what it was when they were asked → the position of `__transaction_state` (its high watermarks,
asked right after the DescribeProducers answers: the `CoordinatorLogPosition` that tells the streaming job when
its coordinator view is current) → the start batch of every transaction not seen before (cached) → LSO and high
watermark of partitions with open transactions, fenced at the leader epoch the partition was described at →
snapshots, explicit empties and summaries. `Collector.sweep` reads as these phases, one method each.
The Kafka seam (`ClusterWire`) and the result (`SweepResult`) are in `admin.wire.types`.

Any replica answers DescribeProducers from its own log (`Partition.activeProducerState`), and the request has no
leader epoch: an answer counts only from the leader of record, confirmed twice (docs/detection.md, section 5,
"Slow answers and stale leaders"). Its snapshot is stamped with the time the request was sent, not received.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import NamedTuple

from pydantic import ValidationError

from admin.collect.metrics import CollectorMetrics, LoopHealth
from admin.collect.position import measure_log_position
from admin.collect.redescribe import Redescribes
from admin.collect.sighting import Sightings
from admin.wire.errors import AdminError, WireError, explain, is_authorization_error
from admin.wire.types import (
    TP,
    ActiveProducer,
    ClusterView,
    ClusterWire,
    Offsets,
    PartitionProducers,
    StartBatch,
    SweepResult,
    open_transaction,
    wall_clock_ms,
)
from common.settings import CollectorSettings
from detectors.contract import TRANSACTION_LOG_TOPIC
from detectors.health import collector_windows
from detectors.models import BrokerSweepSummary, CoordinatorLogPosition, OpenTransaction, PartitionSnapshot

log = logging.getLogger(__name__)

NO_LEADER = -1

# An answer from a broker that is not the partition's leader of record (dropped, counted under this name).
NOT_LEADER_OF_RECORD = "NOT_LEADER_OF_RECORD"

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
        NOT_LEADER_OF_RECORD,
    }
)

# ListOffsets answers that say the broker asked is not the leader at the epoch it was asked at
# (`Partition.localLogWithEpochOrThrow`): its DescribeProducers answer of the same sweep is not the leader's.
NOT_THE_LEADER = frozenset({"NOT_LEADER_OR_FOLLOWER", "FENCED_LEADER_EPOCH", "UNKNOWN_LEADER_EPOCH"})


def chunks(items: Sequence[TP], size: int) -> list[list[TP]]:
    return [list(items[i : i + size]) for i in range(0, len(items), size)]


@dataclass
class _Backoff:
    failures: int
    retry_at: float


class _Answer(NamedTuple):
    """One partition's DescribeProducers answer: the broker that gave it, the leader epoch of record it was asked
    at (None if the metadata carried none), and when the request was sent and the answer received (the leader's
    state is from a moment in between)."""

    broker: int
    leader_epoch: int | None
    sent_at_ms: int
    received_at_ms: int
    producers: PartitionProducers


class _Retry(NamedTuple):
    """A partition to ask again of its (new) leader: the broker asked, its error, and whether the whole
    request failed (then the same broker is not asked again this sweep)."""

    tp: TP
    broker: int
    error: str
    request_level: bool


@dataclass
class _Described:
    """What the DescribeProducers phase learnt; the later phases read it."""

    view: ClusterView  # the newest metadata (read again after every round of answers)
    began: float  # monotonic, when the phase began: which brokers were backed off then
    last_answer_ms: int  # the latest arrival of a DescribeProducers answer (never before the sweep began)
    results: dict[TP, _Answer] = field(default_factory=dict)  # answers of the leader of record only
    uncovered: dict[int, Counter[str]] = field(
        default_factory=dict
    )  # broker → why partitions were not described
    uncovered_partitions: dict[TP, str] = field(default_factory=dict)  # the same, by partition
    deleted: set[TP] = field(default_factory=set)
    failed_brokers: set[int] = field(default_factory=set)
    answered_brokers: set[int] = field(default_factory=set)

    def lose(self, broker: int, error: str, tp: TP) -> None:
        self.uncovered.setdefault(broker, Counter())[error] += 1
        self.uncovered_partitions[tp] = error


@dataclass
class _Built:
    """The snapshots phase: what to publish, and what this sweep knows for sure."""

    snapshots: list[PartitionSnapshot] = field(default_factory=list)
    empties: list[PartitionSnapshot] = field(default_factory=list)
    settled: set[TP] = field(default_factory=set)  # partitions whose open set this sweep knows for sure
    covered_by: Counter[int] = field(default_factory=Counter)
    last_seen_by: dict[int, int] = field(default_factory=dict)


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
        redescribes: when given, `probe` and `sweep(only=...)` between full sweeps describe a partition again
            once a report of it can prove what the last could not (admin/collect/redescribe.py).
        sightings: when each open transaction was first seen, restored from the snapshot topic at start-up
            (`Sightings.from_snapshots`, admin/collect/restore.py); None: none known (every transaction is seen anew).
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
        redescribes: Redescribes | None = None,
        sightings: Sightings | None = None,
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
        self._sightings = sightings if sightings is not None else Sightings()
        self._timeouts: dict[int, int | None] = {}
        self._timeouts_at: float | None = None
        self._backoff: dict[int, _Backoff] = {}
        self._open_before: tuple[str, set[TP] | None] | None = None
        self._run_id = uuid.uuid4().hex[:8]
        self._seq = 0
        self._noted: set[str] = set()
        self._redescribes = redescribes
        self._view: ClusterView | None = None  # the last full sweep's metadata: where the probe asks

    @property
    def open_partitions(self) -> set[TP] | None:
        return None if self._open is None else set(self._open)

    @property
    def cached_start_batches(self) -> int:
        return len(self._starts)

    def sweep(self, only: Iterable[TP] | None = None) -> SweepResult:
        """Run one sweep; with `only`, a re-describe of those partitions (`SweepResult.redescribe`).

        Returns:
            The snapshots (partitions with open transactions), explicit empty snapshots (partitions whose open
            set became empty, or whose topic was deleted), one summary per broker, and (primary mode) the
            position of `__transaction_state` as of the end of the DescribeProducers phase.

        Raises:
            admin.wire.errors.WireError: if cluster metadata cannot be read (nothing else stops a sweep).
        """
        started = self._monotonic()
        self._seq += 1
        sweep_id = f"{self._run_id}-{self._seq}"
        started_at_ms = self._clock_ms()
        problems: list[str] = []
        view = self._wire.metadata()
        asked = None if only is None else set(only)
        if asked is not None and self._redescribes is not None:
            self._redescribes.taken(asked)

        described = self._describe_producers(view, started_at_ms, problems, asked)
        # Read after the last DescribeProducers answer (and never before it, should the clock step back) and
        # before the offsets are asked for: everything a coordinator wrote that could explain those answers
        # was committed before them, so it lies below the end offsets measured next.
        as_of_ms = max(self._clock_ms(), described.last_answer_ms)
        positions = self._measure_log_position(described.view, sweep_id, as_of_ms, problems)
        open_now, need_fetch = self._open_transactions(described)
        self._fetch_start_batches(need_fetch, open_now, _epochs(described), problems)
        offsets = self._list_offsets(described, open_now)
        self._drop_answers_of_non_leaders(described, open_now, offsets, problems)
        self._refresh_timeouts(self._brokers_to_ask_for_timeouts(described), problems)
        built = self._build_snapshots(sweep_id, described, open_now, offsets, problems)
        self._remember_sightings(described, open_now)
        self._close_gone_partitions(sweep_id, described, as_of_ms, built)
        self._remember_open(sweep_id, built)
        self._prune_start_cache(described.results, open_now)
        summaries = self._summaries(sweep_id, described, built) if asked is None else []
        if self._redescribes is not None:
            self._redescribes.reported(described.results if asked is None else asked, built.snapshots)
        if asked is None:
            self._view = described.view

        fetches = sum(len(v) for v in need_fetch.values())
        result = SweepResult(
            sweep_id=sweep_id,
            started_at_ms=started_at_ms,
            duration_s=self._monotonic() - started,
            snapshots=built.snapshots,
            empties=built.empties,
            summaries=summaries,
            partitions_total=len(set(view.leaders if asked is None else asked) - described.deleted),
            partitions_covered=sum(built.covered_by.values()),
            new_transactions=fetches,  # every transaction not seen before is one start batch to fetch
            start_batch_fetches=fetches,
            problems=problems,
            positions=positions,
            redescribe=asked is not None,
        )
        if self._metrics is not None and asked is not None:
            self._metrics.redescribes.inc(len(asked))
        elif self._metrics is not None:
            self._metrics.observe_sweep(
                result, cached_start_batches=len(self._starts), uncovered=described.uncovered_partitions
            )
        return result

    def probe(self) -> int:
        """ListOffsets of every partition the last full sweep described, from its leader at its epoch: notes
        the transactions open at a last stable offset that no report has shown yet, and partitions whose awaited
        transactions ended (admin/collect/redescribe.py). Returns the partitions answered; 0 before the first sweep.

        Raises:
            admin.wire.errors.WireError: if no broker can be asked at all (the loop logs it and goes on)."""
        if self._redescribes is None or self._view is None:
            return 0
        view = self._view
        backed_off = self._backed_off(self._monotonic())
        wanted: dict[int, list[TP]] = {}
        for tp, leader in view.leaders.items():
            if leader >= 0 and leader not in backed_off:
                wanted.setdefault(leader, []).append(tp)
        answers = self._wire.list_offsets(wanted, view.leader_epochs)
        # Every answer had arrived by now: the latest moment any of them can be from.
        at_ms = self._clock_ms()
        for tp, offsets in answers.items():
            lso = offsets.last_stable_offset
            known = lso is not None and self._sightings.knows(tp, lso)
            self._redescribes.probed(tp, offsets, view.leader_epochs.get(tp), at_ms, known=known)
        if self._metrics is not None:
            self._metrics.probes.inc()
        return sum(1 for o in answers.values() if o.error is None)

    def due(self) -> list[TP]:
        """The partitions whose proving re-describe is due now."""
        return [] if self._redescribes is None else self._redescribes.due(self._clock_ms())

    def seconds_until_due(self) -> float | None:
        """How long until the next re-describe is due; None if none is scheduled."""
        at = None if self._redescribes is None else self._redescribes.next_due_ms()
        return None if at is None else max(0.0, (at - self._clock_ms()) / 1000)

    def unpublished(self, result: SweepResult) -> None:
        """The sweep's records did not reach Kafka: undo its effect on the open set, so the next sweep sends
        the empty snapshots again. Only the latest sweep can be undone."""
        if self._open_before is not None and self._open_before[0] == result.sweep_id:
            self._open = self._open_before[1]
            self._open_before = None

    # ------------------------------------------------------------------------ phase: DescribeProducers

    def _describe_producers(
        self, view: ClusterView, since_ms: int, problems: list[str], only: set[TP] | None = None
    ) -> _Described:
        """DescribeProducers of every partition from its leader; partitions whose leader moved are asked again
        of the new one after a metadata refresh, at most `retries_per_sweep` extra rounds. Updates backoff.

        Metadata is read again after every round: an answer stands only if the broker that gave it is still the
        partition's leader, at the epoch it was asked at. Any replica answers DescribeProducers from its own log
        (`Partition.activeProducerState`), so a deposed leader reached through stale metadata answers NONE with
        its stale state; the request itself carries no epoch to fence it."""
        s = self._settings
        described = _Described(view=view, began=self._monotonic(), last_answer_ms=since_ms)
        pending = self._route_to_leaders(described, only)
        rounds = 0
        while pending:
            retry = self._describe_round(pending, described, problems)
            described.view = self._wire.metadata()
            retry.extend(self._not_led_by_answerer(pending, described))
            rounds += 1
            if not retry:
                break
            if rounds > s.retries_per_sweep:
                for r in retry:
                    described.lose(r.broker, r.error, r.tp)
                break
            if s.retry_backoff_ms:
                self._sleep(s.retry_backoff_ms / 1000)
            pending = self._reroute(retry, described)
        self._update_backoff(described.failed_brokers, described.answered_brokers)
        return described

    def _route_to_leaders(self, described: _Described, only: set[TP] | None) -> dict[int, list[TP]]:
        # Leaderless partitions and brokers in backoff are not asked this sweep.
        pending: dict[int, list[TP]] = {}
        for tp, leader in described.view.leaders.items():
            if only is not None and tp not in only:
                continue
            if leader < 0:
                described.lose(NO_LEADER, "LEADER_NOT_AVAILABLE", tp)
            elif (b := self._backoff.get(leader)) is not None and b.retry_at > described.began:
                described.lose(leader, "BROKER_BACKOFF", tp)
            else:
                pending.setdefault(leader, []).append(tp)
        return pending

    def _describe_round(
        self, pending: Mapping[int, list[TP]], described: _Described, problems: list[str]
    ) -> list[_Retry]:
        batches = {b: chunks(sorted(tps), self._settings.describe_batch_size) for b, tps in pending.items()}
        asked_at = described.view.leader_epochs  # the epochs of the metadata that routed this round
        retry: list[_Retry] = []
        for batch in self._wire.describe_producers(batches):
            described.last_answer_ms = max(described.last_answer_ms, batch.received_at_ms)
            if batch.error is not None:
                described.failed_brokers.add(batch.broker)
                self._note(
                    explain("DescribeProducers", batch.error, f"broker {batch.broker}", batch.message),
                    problems,
                )
                retry.extend(_Retry(tp, batch.broker, batch.error, True) for tp in batch.partitions)
                continue
            described.answered_brokers.add(batch.broker)
            for tp in batch.partitions:
                result = batch.results.get(tp, PartitionProducers("MISSING_FROM_RESPONSE"))
                if result.error is None:
                    described.results[tp] = _Answer(
                        batch.broker, asked_at.get(tp), batch.sent_at_ms, batch.received_at_ms, result
                    )
                elif result.error in RETRY_WITH_NEW_LEADER:
                    retry.append(_Retry(tp, batch.broker, result.error, False))
                else:
                    described.lose(batch.broker, result.error, tp)
                    if is_authorization_error(result.error):
                        self._note(explain("DescribeProducers", result.error, tp[0]), problems)
        return retry

    def _not_led_by_answerer(self, asked: Mapping[int, list[TP]], described: _Described) -> list[_Retry]:
        """Drop this round's answers whose broker is not the leader of record in the metadata read after them
        (another leader, or the same broker at another epoch: it lost the partition in between), to be asked
        again of the leader of record; a partition gone from the metadata was deleted meanwhile."""
        retry: list[_Retry] = []
        fresh = described.view
        for tps in asked.values():
            for tp in tps:
                answer = described.results.get(tp)
                if answer is None:
                    continue
                if tp not in fresh.leaders:
                    del described.results[tp]
                    described.deleted.add(tp)
                    continue
                epoch = fresh.leader_epochs.get(tp)
                moved = fresh.leaders[tp] != answer.broker
                if moved or (None not in (epoch, answer.leader_epoch) and epoch != answer.leader_epoch):
                    del described.results[tp]
                    retry.append(_Retry(tp, answer.broker, NOT_LEADER_OF_RECORD, False))
                elif answer.leader_epoch is None and epoch is not None:
                    # Led by the same broker before and after; the later fences.
                    described.results[tp] = answer._replace(leader_epoch=epoch)
        return retry

    def _reroute(self, retry: Sequence[_Retry], described: _Described) -> dict[int, list[TP]]:
        # The metadata read after the round says where each partition to retry lives now.
        pending: dict[int, list[TP]] = {}
        for tp, broker, error, request_level in retry:
            moved_to = described.view.leaders.get(tp)
            if moved_to is None:
                described.deleted.add(tp)  # the topic (or partition) no longer exists
            elif moved_to < 0:
                described.lose(NO_LEADER, "LEADER_NOT_AVAILABLE", tp)
            elif request_level and (moved_to == broker or moved_to in described.failed_brokers):
                described.lose(
                    broker, error, tp
                )  # still led by a broker that just failed: not again this sweep
            else:
                pending.setdefault(moved_to, []).append(tp)
        return pending

    def _update_backoff(self, failed: set[int], answered: set[int]) -> None:
        now = self._monotonic()
        s = self._settings
        for b in answered - failed:
            self._backoff.pop(b, None)
        for b in failed:
            failures = self._backoff[b].failures + 1 if b in self._backoff else 1
            delay = min(s.broker_backoff_initial_s * 2 ** (failures - 1), s.broker_backoff_max_s)
            self._backoff[b] = _Backoff(failures, now + delay)

    def _backed_off(self, now: float) -> set[int]:
        return {b for b, state in self._backoff.items() if state.retry_at > now}

    # -------------------------------------------------------------- phase: transaction log position

    def _measure_log_position(
        self, view: ClusterView, sweep_id: str, as_of_ms: int, problems: list[str]
    ) -> list[CoordinatorLogPosition]:
        if self._settings.coordinator_source != "log":
            # The job then reads <prefix>.coordinator-state, whose position each poll publishes; and the
            # principal may well have no access to __transaction_state at all.
            return []
        position, trouble = measure_log_position(
            self._wire,
            view,
            TRANSACTION_LOG_TOPIC,
            cluster=self._cluster,
            sweep_id=sweep_id,
            as_of_ms=as_of_ms,
            skip_brokers=self._backed_off(self._monotonic()),
            log_end_offsets=True,
        )
        for message in trouble:
            self._note(message, problems)
        return [position] if position is not None else []

    # ----------------------------------------------------------------------- phase: start batches

    def _open_transactions(
        self, described: _Described
    ) -> tuple[dict[TP, list[ActiveProducer]], dict[int, list[tuple[TP, int]]]]:
        """The transactions open now by partition, and (by leader) the start batches not fetched before."""
        open_now: dict[TP, list[ActiveProducer]] = {}
        need_fetch: dict[int, list[tuple[TP, int]]] = {}
        for tp, answer in described.results.items():
            open_txns = [p for p in answer.producers.producers if p.current_txn_start_offset >= 0]
            if not open_txns:
                continue
            open_now[tp] = open_txns
            for p in open_txns:
                key = (tp[0], tp[1], p.producer_id, p.current_txn_start_offset)
                if key not in self._starts:
                    need_fetch.setdefault(answer.broker, []).append((tp, p.current_txn_start_offset))
        return open_now, need_fetch

    def _fetch_start_batches(
        self,
        need: Mapping[int, Sequence[tuple[TP, int]]],
        open_now: Mapping[TP, Sequence[ActiveProducer]],
        leader_epochs: Mapping[TP, int],
        problems: list[str],
    ) -> None:
        if not need:
            return
        # Fenced at the epoch of record: a deposed leader's batch is refused (FENCED_LEADER_EPOCH), not read.
        outcomes = self._wire.fetch_start_batches(need, leader_epochs)
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

    # ------------------------------------------------------------------ phase: offsets and timeouts

    def _list_offsets(
        self, described: _Described, open_now: Mapping[TP, Sequence[ActiveProducer]]
    ) -> dict[TP, Offsets]:
        # LSO and high watermark, asked of the leader that described the partition at the epoch it was
        # described at: the broker's own word that it still leads the partition (`_drop_answers_of_non_leaders`).
        # Also where the answer has none open but a transaction was seen open: forgetting it needs that word too.
        fenced = [
            *open_now,
            *(tp for tp in described.results if tp not in open_now and self._sightings.holds_open(tp)),
        ]
        if not fenced:
            return {}
        wanted: dict[int, list[TP]] = {}
        for tp in fenced:
            wanted.setdefault(described.results[tp].broker, []).append(tp)
        return self._wire.list_offsets(wanted, _epochs(described))

    def _drop_answers_of_non_leaders(
        self,
        described: _Described,
        open_now: dict[TP, list[ActiveProducer]],
        offsets: Mapping[TP, Offsets],
        problems: list[str],
    ) -> None:
        """Drop the answer of a partition asked ListOffsets (open transactions, or a transaction seen open that
        the answer no longer has) whose broker, asked at the leader epoch of record after its DescribeProducers
        answer, says it is not the leader at that epoch.

        Metadata can be stale everywhere the collector asks (a broker cut off from the controller still serves
        its old view), so the broker that answered is asked too: a former leader that knows it lost the
        partition refuses; its open transactions may have been closed by the new leader's markers since, and a
        lagging replica's log may not have a transaction the leader has open."""
        for tp in sorted(offsets):
            error = offsets[tp].error
            if error not in NOT_THE_LEADER or tp not in described.results:
                continue
            answer = described.results.pop(tp)
            open_now.pop(tp, None)
            described.lose(answer.broker, NOT_LEADER_OF_RECORD, tp)
            epoch = "unknown" if answer.leader_epoch is None else answer.leader_epoch
            self._note(
                f"{tp[0]}-{tp[1]}: broker {answer.broker} answered DescribeProducers, but at leader epoch {epoch} "
                f"its ListOffsets says {error}: not the partition's leader, its answer is dropped this sweep",
                problems,
            )

    def _brokers_to_ask_for_timeouts(self, described: _Described) -> list[int]:
        # Not a broker that failed this sweep, nor one backed off when it began: asking would only wait.
        backed_off = self._backed_off(described.began)
        return [
            b for b in described.view.brokers if b not in described.failed_brokers and b not in backed_off
        ]

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

    # --------------------------------------------------------------------------- phase: snapshots

    def _build_snapshots(
        self,
        sweep_id: str,
        described: _Described,
        open_now: Mapping[TP, Sequence[ActiveProducer]],
        offsets: Mapping[TP, Offsets],
        problems: list[str],
    ) -> _Built:
        """A snapshot for every described partition with open transactions, and an empty one for each whose
        open set became empty (or whose history is unknown)."""
        built = _Built()
        for tp, answer in sorted(described.results.items()):
            broker, received_at_ms = answer.broker, answer.received_at_ms
            txns = open_now.get(tp)
            wants_empty = not txns and (self._open is None or tp in self._open)
            if txns or wants_empty:
                # Only partitions that publish something are built (a model costs microseconds, x 10k).
                try:
                    snap = self._snapshot(sweep_id, tp, answer, txns or (), offsets.get(tp) if txns else None)
                except ValidationError as exc:
                    described.lose(broker, "INVALID_PRODUCER_STATE", tp)
                    self._note(
                        f"{tp[0]}-{tp[1]}: leader {broker} reported unusable producer state: {exc}", problems
                    )
                    continue
                (built.snapshots if txns else built.empties).append(snap)
            built.settled.add(tp)
            built.covered_by[broker] += 1
            if received_at_ms > built.last_seen_by.get(broker, 0):
                built.last_seen_by[broker] = received_at_ms
        return built

    def _snapshot(
        self,
        sweep_id: str,
        tp: TP,
        answer: _Answer,
        txns: Sequence[ActiveProducer],
        offsets: Offsets | None,
    ) -> PartitionSnapshot:
        return PartitionSnapshot(
            cluster=self._cluster,
            sweep_id=sweep_id,
            # The leader's state is from a moment between sending and receipt. The rules read `observed_at` as
            # "the snapshot postdates coordinator event E" (its markers had landed), which only the earliest
            # such moment proves: stamped at receipt, an answer delayed past the grace turned a transaction that
            # committed just after the leader answered into HANGING coordinator-completed.
            observed_at_ms=answer.sent_at_ms,
            leader=answer.broker,
            topic=tp[0],
            partition=tp[1],
            open_transactions=tuple(
                sorted(
                    (self._open_transaction(tp, p, answer.received_at_ms, answer.leader_epoch) for p in txns),
                    key=lambda t: t.start_offset,
                )
            ),
            last_stable_offset=offsets.last_stable_offset if offsets is not None else None,
            high_watermark=offsets.high_watermark if offsets is not None else None,
            max_transaction_timeout_ms=self._timeouts.get(answer.broker),
            # The epoch the answer was asked at and the metadata read after it confirmed; with open transactions,
            # only once the broker's ListOffsets at that epoch answered (a broker that is not the leader at it
            # was dropped by `_drop_answers_of_non_leaders`; one whose ListOffsets failed otherwise proved
            # nothing): the rules read "start batch appended in this epoch" as "no marker since lost".
            leader_epoch=answer.leader_epoch
            if not txns or (offsets is not None and offsets.error is None)
            else None,
        )

    def _open_transaction(
        self, tp: TP, p: ActiveProducer, received_at_ms: int, leader_epoch: int | None
    ) -> OpenTransaction:
        # Open in this answer: it had opened by the answer's receipt, the latest moment the answer can be from.
        probed = (
            None
            if self._redescribes is None
            else self._redescribes.seen_open_ms(tp, p.current_txn_start_offset, leader_epoch)
        )
        opened_after, seen_open = self._sightings.bounds(
            tp, p.producer_id, p.current_txn_start_offset, received_at_ms, probed
        )
        return open_transaction(
            p,
            self._starts.get((tp[0], tp[1], p.producer_id, p.current_txn_start_offset)),
            opened_after_ms=opened_after,
            seen_open_ms=seen_open,
        )

    def _remember_sightings(
        self, described: _Described, open_now: Mapping[TP, Sequence[ActiveProducer]]
    ) -> None:
        # Every partition described this sweep was seen with exactly these open: a transaction first seen open
        # later opened after this report, so after the request was sent, the earliest moment the leader's
        # answer can be from (admin.collect.sighting).
        for tp, answer in described.results.items():
            txns = open_now.get(tp, ())
            self._sightings.reported(
                tp, answer.sent_at_ms, [(p.producer_id, p.current_txn_start_offset) for p in txns]
            )

    def _close_gone_partitions(
        self, sweep_id: str, described: _Described, as_of_ms: int, built: _Built
    ) -> None:
        # Partitions that no longer exist (topic deleted) cannot hold a transaction any more.
        gone = described.deleted | ((self._open or set()) - set(described.view.leaders))
        for tp in sorted(gone):
            built.settled.add(tp)
            if self._open is not None and tp not in self._open:
                continue
            built.empties.append(
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

    def _remember_open(self, sweep_id: str, built: _Built) -> None:
        # Partitions this sweep could not describe keep what was last published for them.
        now_open = {(snap.topic, snap.partition) for snap in built.snapshots}
        self._open_before = (sweep_id, None if self._open is None else set(self._open))
        self._open = now_open if self._open is None else (self._open - built.settled) | now_open

    # --------------------------------------------------------------------------- phase: summaries

    def _summaries(self, sweep_id: str, described: _Described, built: _Built) -> list[BrokerSweepSummary]:
        end_ms = self._clock_ms()
        brokers = set(described.view.brokers) | set(described.uncovered) | set(built.covered_by)
        return [
            BrokerSweepSummary(
                cluster=self._cluster,
                sweep_id=sweep_id,
                observed_at_ms=built.last_seen_by.get(b, end_ms),
                broker=b,
                partitions_covered=built.covered_by.get(b, 0),
                errors=dict(sorted(described.uncovered.get(b, Counter()).items())),
            )
            for b in sorted(brokers)
        ]

    def _note(self, message: str, problems: list[str]) -> None:
        # Every sweep reports its problems; the log gets each distinct one once.
        problems.append(message)
        if message not in self._noted:
            self._noted.add(message)
            log.warning("%s", message)


def _epochs(described: _Described) -> dict[TP, int]:
    """The leader epoch each described partition was asked (and confirmed) at, where known."""
    return {tp: a.leader_epoch for tp, a in described.results.items() if a.leader_epoch is not None}


# ------------------------------------------------------------------------------------------- the loop


# After failed sweeps the next waits longer, doubling from the interval up to this (or the interval, if longer).
SWEEP_BACKOFF_MAX_S = 10.0


def loop_health(settings: CollectorSettings) -> LoopHealth:
    """The probes' windows for this collector's settings (detectors.health.collector_windows)."""
    ready_ms, stall_ms = collector_windows(
        interval_s=settings.interval_s,
        longest_pause_s=max(settings.interval_s, SWEEP_BACKOFF_MAX_S),
        request_timeout_ms=settings.request_timeout_ms,
        ready_intervals=settings.ready_intervals,
        stall_after_s=settings.stall_after_s,
    )
    return LoopHealth(ready_within_ms=ready_ms, stall_after_ms=stall_ms)


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
    health: LoopHealth | None = None,
    monotonic: Callable[[], float] = time.monotonic,
    probe_interval_s: float = 0.0,
    publish_redescribe: Callable[[SweepResult], object] | None = None,
) -> int:
    """Sweep and publish every `interval_s` until `stop` is set (Ctrl-C) or `max_sweeps` ran; in between, probe
    every `probe_interval_s` (0: never) and re-describe the partitions due (`between_sweeps`), published with
    `publish_redescribe` (default `publish`).

    A failed sweep (no metadata, a publish error) is counted, and logged once per run of failures (a cluster
    down for a minute is one line, not one per interval, and one more when sweeps succeed again); after a failed
    sweep the next waits longer, doubling up to `SWEEP_BACKOFF_MAX_S`. `also` runs after each sweep (the
    coordinator fallback poll). `health` hears every turn of the loop and every published sweep (/healthz,
    /readyz). `monotonic` times the pauses and the gaps between published sweeps (the real clock only as the
    default, like the Collector's own). Returns the number of sweeps run.
    """
    sweeps = 0
    failed = 0  # failed sweeps in a row
    failing_since = 0.0
    published_at: float | None = None  # monotonic, when the last sweep was published
    while not stop.is_set():
        began = monotonic()
        if health is not None:
            health.turned()
        try:
            result = collector.sweep()
            try:
                publish(result)
            except BaseException:
                collector.unpublished(result)
                raise
            if metrics is not None:
                metrics.last_success.set(clock_ms() / 1000)
            if health is not None:
                health.published()
            now = monotonic()
            if failed:
                log.warning(
                    "sweeps succeed again after %d failed in a row (%.0fs without a published sweep)",
                    failed,
                    now - failing_since,
                )
                failed = 0
            elif published_at is not None and now - published_at > max(2 * interval_s, interval_s + 5):
                # A sweep or its publish that hung (a broker gone, its partitions not yet moved) is a gap in
                # the snapshots the job sees, even though every sweep succeeded.
                log.warning(
                    "%.1fs between published sweeps (interval %.1fs): a broker or the snapshot topic's leader "
                    "did not answer meanwhile",
                    now - published_at,
                    interval_s,
                )
            published_at = now
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
        except Exception as exc:  # a sweep must never kill the collector; the next one may succeed
            failed += 1
            if failed == 1:
                failing_since = began
                log.error(
                    "sweep failed: %s; retrying with backoff (up to %.0fs), said once until a sweep succeeds",
                    exc,
                    max(interval_s, SWEEP_BACKOFF_MAX_S),
                    exc_info=not isinstance(exc, AdminError | WireError),
                )
            else:
                log.debug("sweep failed again (%d in a row): %s", failed, exc)
            if metrics is not None:
                metrics.sweep_failures.inc()
        for task in also:
            if stop.is_set():
                break
            try:
                task()
            except Exception as exc:
                log.error("%s failed: %s", getattr(task, "__name__", "task"), exc)
            if health is not None:
                health.turned()
        sweeps += 1
        if max_sweeps is not None and sweeps >= max_sweeps:
            break
        pause = interval_s
        if failed:
            pause = max(interval_s, min(interval_s * 2 ** (failed - 1), SWEEP_BACKOFF_MAX_S))
        between_sweeps(
            collector,
            publish_redescribe or publish,
            until=began + pause,
            probe_interval_s=probe_interval_s if not failed else 0.0,
            stop=stop,
            monotonic=monotonic,
            health=health,
        )
    return sweeps


def between_sweeps(
    collector: Collector,
    publish: Callable[[SweepResult], object],
    *,
    until: float,
    probe_interval_s: float,
    stop: threading.Event,
    monotonic: Callable[[], float] = time.monotonic,
    health: LoopHealth | None = None,
) -> None:
    """Until `until` (monotonic) or `stop`: probe every `probe_interval_s` (0: never) and re-describe each
    partition when its re-describe is due (admin/collect/redescribe.py). A failure is logged once per kind and never
    ends the loop: the next full sweep covers every partition anyway."""
    next_probe = monotonic() if probe_interval_s > 0 else None
    failures: set[str] = set()
    while not stop.is_set():
        now = monotonic()
        if now >= until:
            return
        if next_probe is not None and now >= next_probe:
            _quietly(collector.probe, "probe", failures)
            # Probes take at most half the loop's time: on a cluster large enough that one takes longer than
            # half the interval, the next waits as long as this one took.
            took = monotonic() - now
            next_probe = max(now + probe_interval_s, now + 2 * took)
        due = collector.due()
        if due:
            _quietly(partial(_redescribe, collector, publish, due), "re-describe", failures)
        if health is not None:
            health.turned()
        wake = until
        if next_probe is not None:
            wake = min(wake, next_probe)
        after = collector.seconds_until_due()
        if after is not None:
            wake = min(wake, monotonic() + after)
        stop.wait(max(0.0, wake - monotonic()))


def _redescribe(collector: Collector, publish: Callable[[SweepResult], object], due: list[TP]) -> None:
    result = collector.sweep(only=due)
    try:
        publish(result)
    except BaseException:
        collector.unpublished(result)
        raise
    log.debug("re-described %d partitions: %d open transactions", len(due), result.open_transactions)


def _quietly(task: Callable[[], object], what: str, failures: set[str]) -> None:
    try:
        task()
    except Exception as exc:
        if what not in failures:
            failures.add(what)
            log.warning("%s between sweeps failed: %s (the next sweep covers every partition)", what, exc)
