"""Fakes for the admin room's seams (`admin.wire.types.ClusterWire`, `CoordinatorWire`) and builders with defaults plus overrides.

A scripted in-memory cluster: partitions with leaders and leader epochs, producer states, start batches, offsets,
high watermarks (what the coordinator log position reads), broker configs, and knobs to make a broker fail, answer
NOT_LEADER_OR_FOLLOWER, answer late, answer from a replica it no longer leads (as Kafka does: DescribeProducers is
served from any replica's log), or move a partition between two metadata calls.
Imported by tests/unit/test_collector_*.py and test_inspect_partition_age.py; it holds no tests itself.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from admin.wire.types import (
    TP,
    ActiveProducer,
    BrokerTimeout,
    ClusterView,
    DescribeBatch,
    EndOffset,
    FetchFailure,
    ListingResult,
    Offsets,
    PartitionProducers,
    StartBatch,
    TransactionDescription,
    TransactionListing,
)

T0 = 1_750_000_000_000


def producer(**overrides: Any) -> ActiveProducer:
    fields: dict[str, Any] = {
        "producer_id": 1000,
        "producer_epoch": 5,
        "last_sequence": 9,
        "last_timestamp_ms": T0 + 1_000,
        "coordinator_epoch": 3,
        "current_txn_start_offset": 100,
    }
    fields.update(overrides)
    return ActiveProducer(**fields)


def start_batch(**overrides: Any) -> StartBatch:
    fields: dict[str, Any] = {
        "base_offset": 100,
        "producer_id": 1000,
        "producer_epoch": 5,
        "start_timestamp_ms": T0,
        "max_timestamp_ms": T0 + 5,
        "transactional": True,
    }
    fields.update(overrides)
    return StartBatch(**fields)


@dataclass
class FakeCluster:
    """Implements ClusterWire from scripted state; records every call."""

    leaders: dict[TP, int] = field(default_factory=dict)
    producers: dict[TP, list[ActiveProducer]] = field(default_factory=dict)
    starts: dict[tuple[TP, int], StartBatch | FetchFailure] = field(default_factory=dict)
    offsets: dict[TP, Offsets] = field(default_factory=dict)
    high_watermarks: dict[TP, int] = field(default_factory=dict)  # ListOffsets for end_offsets; 0 if absent
    timeouts: dict[int, BrokerTimeout] = field(default_factory=dict)
    brokers: dict[int, str] = field(default_factory=lambda: {1: "b1:9092", 2: "b2:9092", 3: "b3:9092"})
    internal: frozenset[str] = frozenset({"__consumer_offsets", "__transaction_state"})
    # knobs
    down: set[int] = field(default_factory=set)  # request-level failure (unreachable)
    partition_errors: dict[TP, str] = field(default_factory=dict)  # answered with this error, every time
    not_leader_once: set[TP] = field(default_factory=set)  # NOT_LEADER_OR_FOLLOWER on the first describe
    offset_errors: dict[TP, str] = field(default_factory=dict)  # end_offsets answers this error
    log_ends: dict[TP, int] = field(
        default_factory=dict
    )  # end_offsets(log_end=True); the high watermark if absent
    views: list[dict[TP, int]] = field(default_factory=list)  # scripted metadata answers, then `leaders`
    # The leaders' epochs (none: Metadata without epochs); `epoch_views` are scripted answers, then `epochs`.
    epochs: dict[TP, int] = field(default_factory=dict)
    epoch_views: list[dict[TP, int]] = field(default_factory=list)
    # The leader epoch Metadata gives a `__transaction_state` partition `epochs` does not script, when asked for
    # that topic by name (as the coordinator fallback and the verified abort do: a Kafka 3.0+ broker always says
    # it); None: no epoch (Metadata before v7).
    log_epoch: int | None = 0
    # (partition, broker) → the open transactions in the log of a replica that does not lead the partition: it
    # answers DescribeProducers with them, error NONE (`Partition.activeProducerState`), however stale.
    replica_states: dict[tuple[TP, int], list[ActiveProducer]] = field(default_factory=dict)
    answer_delay_ms: dict[int, int] = field(default_factory=dict)  # broker → ms from request to its answer
    clock: int = T0 + 60_000
    # call log
    metadata_calls: int = 0
    describe_requests: Counter[int] = field(default_factory=Counter)
    batch_sizes: list[int] = field(default_factory=list)
    fetch_calls: list[dict[int, list[tuple[TP, int]]]] = field(default_factory=list)
    offsets_calls: list[dict[int, list[TP]]] = field(default_factory=list)
    end_offsets_calls: list[tuple[int, dict[int, list[TP]]]] = field(default_factory=list)  # (clock, asked)
    log_end_calls: list[tuple[int, dict[int, list[TP]]]] = field(default_factory=list)  # (clock, asked)
    # the leader epochs each call sent, in call order
    fetch_epochs: list[dict[TP, int]] = field(default_factory=list)
    offsets_epochs: list[dict[TP, int]] = field(default_factory=list)
    end_offsets_epochs: list[dict[TP, int]] = field(default_factory=list)
    log_end_epochs: list[dict[TP, int]] = field(default_factory=list)
    metadata_topics: list[list[str] | None] = field(default_factory=list)
    denied_topics: set[str] = field(default_factory=set)  # Metadata by name: TOPIC_AUTHORIZATION_FAILED
    timeout_calls: list[list[int]] = field(default_factory=list)

    def describe_denied(self, topic: str) -> bool:
        return topic in self.denied_topics

    def metadata(self, topics: Sequence[str] | None = None) -> ClusterView:
        self.metadata_calls += 1
        self.metadata_topics.append(None if topics is None else list(topics))
        leaders = self.views.pop(0) if self.views else self.leaders
        epochs = self.epoch_views.pop(0) if self.epoch_views else self.epochs
        if topics is not None:
            leaders = {tp: b for tp, b in leaders.items() if tp[0] in topics}
            if "__transaction_state" in topics and self.log_epoch is not None:
                epochs = {
                    **{tp: self.log_epoch for tp in leaders if tp[0] == "__transaction_state"},
                    **epochs,
                }
        return ClusterView(dict(self.brokers), dict(leaders), self.internal, dict(epochs))

    def describe_producers(self, batches: Mapping[int, Sequence[Sequence[TP]]]) -> list[DescribeBatch]:
        out = []
        for broker, bs in batches.items():
            for batch in bs:
                self.describe_requests[broker] += 1
                self.batch_sizes.append(len(batch))
                sent = self.clock
                self.clock += 1 + self.answer_delay_ms.get(broker, 0)
                if broker in self.down:
                    out.append(
                        DescribeBatch(
                            broker, tuple(batch), self.clock, error="BROKER_UNREACHABLE", sent_at_ms=sent
                        )
                    )
                    continue
                results: dict[TP, PartitionProducers] = {}
                for tp in batch:
                    if tp in self.not_leader_once:
                        self.not_leader_once.discard(tp)
                        results[tp] = PartitionProducers("NOT_LEADER_OR_FOLLOWER")
                    elif tp in self.partition_errors:
                        results[tp] = PartitionProducers(self.partition_errors[tp], (), "denied")
                    elif (tp, broker) in self.replica_states:
                        results[tp] = PartitionProducers(None, tuple(self.replica_states[(tp, broker)]))
                    elif self.leaders.get(tp) != broker:
                        results[tp] = PartitionProducers("NOT_LEADER_OR_FOLLOWER")
                    else:
                        results[tp] = PartitionProducers(None, tuple(self.producers.get(tp, ())))
                out.append(DescribeBatch(broker, tuple(batch), self.clock, results, sent_at_ms=sent))
        return out

    def not_the_leader(self, tp: TP, broker: int, epoch: int | None) -> str | None:
        """What Kafka's `Partition.localLogWithEpochOrThrow` answers a leader-only request (ListOffsets, Fetch)
        for `tp` sent to `broker` at `epoch` (None: -1, no fencing), by the true leaders and epochs; None when
        the broker leads the partition at that epoch."""
        current = self.epochs.get(tp)
        if epoch is not None and current is not None and epoch != current:
            return "FENCED_LEADER_EPOCH" if epoch < current else "UNKNOWN_LEADER_EPOCH"
        return None if self.leaders.get(tp) == broker else "NOT_LEADER_OR_FOLLOWER"

    def fetch_start_batches(
        self,
        wanted: Mapping[int, Sequence[tuple[TP, int]]],
        leader_epochs: Mapping[TP, int] | None = None,
    ) -> dict[tuple[TP, int], StartBatch | FetchFailure]:
        self.fetch_calls.append({b: list(items) for b, items in wanted.items()})
        epochs = dict(leader_epochs or {})
        self.fetch_epochs.append(epochs)
        out: dict[tuple[TP, int], StartBatch | FetchFailure] = {}
        for broker, items in wanted.items():
            for key in items:
                refused = self.not_the_leader(key[0], broker, epochs.get(key[0])) if epochs else None
                out[key] = (
                    FetchFailure(refused, permanent=False)
                    if refused is not None
                    else self.starts.get(key, FetchFailure("NO_BATCH_AT_OFFSET", permanent=True))
                )
        return out

    def list_offsets(
        self, wanted: Mapping[int, Sequence[TP]], leader_epochs: Mapping[TP, int] | None = None
    ) -> dict[TP, Offsets]:
        self.offsets_calls.append({b: list(tps) for b, tps in wanted.items()})
        epochs = dict(leader_epochs or {})
        self.offsets_epochs.append(epochs)
        out: dict[TP, Offsets] = {}
        for broker, tps in wanted.items():
            for tp in tps:
                refused = self.not_the_leader(tp, broker, epochs.get(tp))
                out[tp] = (
                    Offsets(None, None, refused) if refused else self.offsets.get(tp, Offsets(None, None))
                )
        return out

    def end_offsets(
        self,
        wanted: Mapping[int, Sequence[TP]],
        leader_epochs: Mapping[TP, int] | None = None,
        *,
        log_end: bool = False,
    ) -> dict[TP, EndOffset]:
        # The clock ticks when the request is sent: as_of_ms must have been read before.
        self.clock += 1
        if log_end:
            self.log_end_calls.append((self.clock, {b: list(tps) for b, tps in wanted.items()}))
        else:
            self.end_offsets_calls.append((self.clock, {b: list(tps) for b, tps in wanted.items()}))
        epochs = dict(leader_epochs or {})
        (self.log_end_epochs if log_end else self.end_offsets_epochs).append(epochs)
        out: dict[TP, EndOffset] = {}
        for broker, tps in wanted.items():
            for tp in tps:
                refused = self.not_the_leader(tp, broker, epochs.get(tp))
                if broker in self.down:
                    out[tp] = EndOffset(None, "BROKER_UNREACHABLE")
                elif tp in self.offset_errors:
                    out[tp] = EndOffset(None, self.offset_errors[tp])
                elif refused is not None:
                    out[tp] = EndOffset(None, refused)
                elif log_end:
                    out[tp] = EndOffset(self.log_ends.get(tp, self.high_watermarks.get(tp, 0)))
                else:
                    out[tp] = EndOffset(self.high_watermarks.get(tp, 0))
        return out

    def max_transaction_timeouts(self, brokers: Sequence[int]) -> dict[int, BrokerTimeout]:
        self.timeout_calls.append(list(brokers))
        return {b: self.timeouts.get(b, BrokerTimeout(60_000)) for b in brokers}


@dataclass
class FakeCoordinators:
    """Implements CoordinatorWire: transactional ids per coordinator and their descriptions."""

    descriptions: dict[str, TransactionDescription] = field(default_factory=dict)
    failed: dict[int, str] = field(default_factory=dict)
    duration_filter: bool = True
    describe_errors: dict[str, str] = field(default_factory=dict)
    # A principal without Describe on ids it was not granted: unknown ids are denied, not "not found".
    deny_unknown: bool = False
    long_running: set[str] = field(default_factory=set)
    # Brokers older than Kafka 3.8 (no ListTransactions v1), brokers whose ApiVersions are unknown, and errors a
    # broker answers to a DurationFilter listing only.
    before_3_8: frozenset[int] = frozenset()
    apis_unknown: frozenset[int] = frozenset()
    filter_errors: dict[int, str] = field(default_factory=dict)
    described: list[list[str]] = field(default_factory=list)
    list_calls: list[dict[str, Any]] = field(default_factory=list)
    # The brokers whose ListTransactions answers (unless failed), and the leader of each __transaction_state
    # partition (the coordinator fallback asks Metadata for them before it tombstones an id).
    coordinator_brokers: frozenset[int] = frozenset({1, 2, 3})
    log_leaders: dict[int, int] = field(default_factory=lambda: {0: 1})
    # Their leader epochs (a partition not scripted here: 0, as a Kafka 3.0+ broker always says one).
    log_leader_epochs: dict[int, int] = field(default_factory=dict)

    def broker_apis(self, brokers: Sequence[int]) -> dict[int, Mapping[int, tuple[int, int]]]:
        # ListTransactions (key 66): v1 (DurationFilter) from Kafka 3.8; `before_3_8` brokers offer v0 only.
        return {
            b: {66: (0, 1 if self.duration_filter and b not in self.before_3_8 else 0)}
            for b in brokers
            if b not in self.apis_unknown
        }

    def metadata(self, topics: Sequence[str] | None = None) -> ClusterView:
        leaders = {("__transaction_state", p): b for p, b in self.log_leaders.items()}
        epochs = {("__transaction_state", p): self.log_leader_epochs.get(p, 0) for p in self.log_leaders}
        return ClusterView({}, leaders, frozenset({"__transaction_state"}), epochs)

    def list_transactions(
        self,
        *,
        producer_ids: Sequence[int] = (),
        states: Sequence[str] = (),
        duration_filter_ms: int | None = None,
        brokers: Sequence[int] | None = None,
    ) -> ListingResult:
        call: dict[str, Any] = {
            "producer_ids": list(producer_ids),
            "states": list(states),
            "duration_filter_ms": duration_filter_ms,
        }
        if brokers is not None:
            call["brokers"] = sorted(brokers)
        self.list_calls.append(call)
        asked = self.coordinator_brokers if brokers is None else frozenset(brokers)
        failed = (
            dict(self.failed) if brokers is None else {b: e for b, e in self.failed.items() if b in asked}
        )
        if duration_filter_ms is not None:
            # A filtered request to a broker without ListTransactions v1 fails in kafka-python (no common
            # version); `filter_errors` are a broker's own answers to the filter.
            failed.update({b: "UNSUPPORTED_VERSION" for b in asked & self.before_3_8})
            failed.update({b: e for b, e in self.filter_errors.items() if b in asked})
        listings = [
            TransactionListing(d.transactional_id, d.producer_id, d.state, d.coordinator)
            for d in self.descriptions.values()
            if d.coordinator in asked
            and d.coordinator not in failed
            and (not producer_ids or d.producer_id in producer_ids)
            and (not states or d.state in states)
            and (duration_filter_ms is None or d.transactional_id in self.long_running)
        ]
        return ListingResult(listings, failed, frozenset(asked) - set(failed))

    def describe_transactions(
        self, by_coordinator: Mapping[int, Sequence[str]]
    ) -> list[TransactionDescription]:
        ids = [i for ids in by_coordinator.values() for i in ids]
        self.described.append(sorted(ids))
        out = []
        for i in ids:
            if i in self.describe_errors:
                out.append(TransactionDescription(i, self.describe_errors[i], "", -1, -1, -1, -1, (), 1))
            elif i in self.descriptions:
                out.append(self.descriptions[i])
            else:
                error = (
                    "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"
                    if self.deny_unknown
                    else "TRANSACTIONAL_ID_NOT_FOUND"
                )
                out.append(TransactionDescription(i, error, "", -1, -1, -1, -1, (), 1))
        return out


def description(**overrides: Any) -> TransactionDescription:
    fields: dict[str, Any] = {
        "transactional_id": "tx-1",
        "error": None,
        "state": "Ongoing",
        "timeout_ms": 60_000,
        "start_time_ms": T0,
        "producer_id": 1000,
        "producer_epoch": 5,
        "partitions": (("orders", 0),),
        "coordinator": 1,
    }
    fields.update(overrides)
    return TransactionDescription(**fields)
