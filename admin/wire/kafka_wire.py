"""kafka-python under the collector's seams: hand-built requests sent on kafka-python's own IO loop.

`KafkaAdminClient.describe_producers` raises for any per-partition error and sends one broker at a time, so
the collector builds DescribeProducers, Fetch, ListOffsets, DescribeConfigs, ListTransactions and
DescribeTransactions requests (and `txnwatch proposals abort` one WriteTxnMarkers) from `kafka.protocol` and sends them with `admin._manager.send`, one coroutine per
broker on kafka-python's loop (not asyncio), a few requests in flight per connection.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import kafka.errors as Errors
from kafka import KafkaAdminClient
from kafka.protocol.admin import DescribeConfigsRequest
from kafka.protocol.admin.transactions import (
    DescribeProducersRequest,
    DescribeTransactionsRequest,
    ListTransactionsRequest,
)
from kafka.protocol.consumer import ListOffsetsRequest
from kafka.protocol.consumer.group import OffsetFetchRequest
from kafka.protocol.metadata import MetadataRequest
from kafka.protocol.producer.transaction import WriteTxnMarkersRequest
from kafka.structs import TopicPartition as KafkaTopicPartition

from admin.wire.connect import code_name, error_name
from admin.wire.fetch import fetch_request, parse_start_batch
from admin.wire.requests import RequestLog
from admin.wire.types import (
    TP,
    ActiveProducer,
    BrokerTimeout,
    ClusterView,
    DescribeBatch,
    EndOffset,
    FetchFailure,
    GroupOffsets,
    GroupStanding,
    ListingResult,
    Offsets,
    PartitionProducers,
    StartBatch,
    TransactionDescription,
    TransactionListing,
    wall_clock_ms,
)
from admin.wire.versions import ADMIN_MARKER_TRANSACTION_VERSION, BrokerApis
from detectors.groups import CONSUMER_OFFSETS_TOPIC, offsets_partition_for

log = logging.getLogger(__name__)

LATEST_TIMESTAMP = -1
READ_UNCOMMITTED, READ_COMMITTED = 0, 1
BROKER_RESOURCE = 4  # ConfigResourceType.BROKER
MAX_TIMEOUT_CONFIG = "transaction.max.timeout.ms"
DESCRIBE_TRANSACTIONS_BATCH = 100
# Fetch errors after which the same start offset will never yield its batch.
PERMANENT_FETCH_ERRORS = frozenset({"OFFSET_OUT_OF_RANGE", "NO_BATCH_AT_OFFSET"})


# OffsetFetch's answer while a group's committed offsets are pending in an open transaction (require_stable).
UNSTABLE_OFFSET_COMMIT = 88


class KafkaWire:
    """Implements `admin.wire.types.ClusterWire` and `admin.wire.types.CoordinatorWire` with kafka-python.

    Args:
        admin: a bootstrapped KafkaAdminClient (its connections and IO thread are reused).
        request_timeout_ms: per request.
        max_in_flight: DescribeProducers requests pipelined per broker (kafka-python pauses at 5).
        requests: counts every request by API, broker and outcome (metrics, benchmark).
        clock_ms: the wall clock stamped before a DescribeProducers request is sent and when its response arrives.
    """

    def __init__(
        self,
        admin: KafkaAdminClient,
        *,
        request_timeout_ms: int = 15_000,
        max_in_flight: int = 3,
        fetch_partition_max_bytes: int = 1 << 20,
        fetch_max_bytes: int = 16 << 20,
        fetch_rounds: int = 10,
        requests: RequestLog | None = None,
        clock_ms: Callable[[], int] = wall_clock_ms,
    ) -> None:
        self._admin = admin
        self._manager = admin._manager
        self._timeout_ms = request_timeout_ms
        self._window = max(1, max_in_flight)
        self._fetch_partition_max_bytes = fetch_partition_max_bytes
        self._fetch_max_bytes = fetch_max_bytes
        self._fetch_rounds = fetch_rounds
        self.requests = requests if requests is not None else RequestLog()
        self._clock_ms = clock_ms

    # ------------------------------------------------------------------------------------ plumbing

    def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return self._manager.run(fn, *args)

    def _send(self, api: str, broker: int | None, request: Any) -> Any:
        """Send on the IO loop (call from a coroutine running there); returns kafka-python's Future."""
        future = self._manager.send(request, node_id=broker, request_timeout_ms=self._timeout_ms)
        shown = -1 if broker is None else broker
        future.add_callback(lambda _r: self.requests.record(api, shown))
        future.add_errback(lambda exc: self.requests.record(api, shown, error_name(exc)))
        return future

    async def _gather(self, calls: Sequence[tuple[Callable[..., Any], tuple[Any, ...]]]) -> list[Any]:
        # One task per call on kafka-python's loop; each coroutine handles its own errors.
        futures = [self._manager.call_soon(fn, *args) for fn, args in calls]
        return [await f for f in futures]

    async def _ensure_brokers_known(self, brokers: Sequence[int]) -> None:
        cluster = self._manager.cluster
        if any(cluster.broker_metadata(b) is None for b in brokers):
            await cluster.refresh_metadata()

    # ------------------------------------------------------------------------------------ metadata

    def metadata(self, topics: Sequence[str] | None = None) -> ClusterView:
        return self._run(self._metadata, None if topics is None else list(topics))  # type: ignore[no-any-return]

    async def _metadata(self, topics: list[str] | None) -> ClusterView:
        wanted = None if topics is None else [MetadataRequest.MetadataRequestTopic(name=t) for t in topics]
        request = MetadataRequest(topics=wanted, allow_auto_topic_creation=False)
        attempts = max(3, len(self._manager.cluster.brokers()))
        for attempt in range(attempts):
            # The least loaded node may be a broker that just died; kafka-python then backs it off, so the
            # next attempt goes to another one.
            try:
                response = await self._send("Metadata", None, request)
                break
            except Errors.KafkaError:
                if attempt == attempts - 1:
                    raise
                await self._manager._net.sleep(0.05)
        brokers = {b.node_id: f"{b.host}:{b.port}" for b in response.brokers}
        leaders: dict[TP, int] = {}
        epochs: dict[TP, int] = {}
        internal: set[str] = set()
        for topic in response.topics:
            if topic.error_code != 0 or topic.name is None:
                if topic.error_code not in (0, 3):  # UNKNOWN_TOPIC_OR_PARTITION: deleted meanwhile
                    self.requests.record_partition_error("Metadata", code_name(topic.error_code) or "?")
                continue
            if topic.is_internal:
                internal.add(topic.name)
            for p in topic.partitions:
                leaders[(topic.name, p.partition_index)] = p.leader_id if p.leader_id is not None else -1
                epoch = getattr(p, "leader_epoch", None)  # Metadata v7+; -1 when the broker did not say
                if epoch is not None and epoch >= 0:
                    epochs[(topic.name, p.partition_index)] = epoch
        await self._ensure_brokers_known(list(brokers))
        return ClusterView(
            brokers=brokers, leaders=leaders, internal_topics=frozenset(internal), leader_epochs=epochs
        )

    # --------------------------------------------------------------------------- DescribeProducers

    def describe_producers(self, batches: Mapping[int, Sequence[Sequence[TP]]]) -> list[DescribeBatch]:
        return self._run(self._describe_all, batches)  # type: ignore[no-any-return]

    async def _describe_all(self, batches: Mapping[int, Sequence[Sequence[TP]]]) -> list[DescribeBatch]:
        per_broker = await self._gather([(self._describe_broker, (b, list(bs))) for b, bs in batches.items()])
        return [batch for results in per_broker for batch in results]

    async def _describe_broker(self, broker: int, batches: list[Sequence[TP]]) -> list[DescribeBatch]:
        out: list[DescribeBatch] = []
        in_flight: list[tuple[tuple[TP, ...], Any, int, list[int]]] = []
        failure: DescribeBatch | None = None
        for batch in batches:
            if failure is not None:
                # The broker failed a request: do not queue the rest behind a dead connection.
                out.append(
                    DescribeBatch(
                        broker,
                        tuple(batch),
                        failure.received_at_ms,
                        error=failure.error,
                        message=failure.message,
                        sent_at_ms=failure.sent_at_ms,
                    )
                )
                continue
            # Read before the request is handed over: the leader answers after this, however long the answer
            # then takes to arrive (docs/detection.md, section 5, "Slow answers and stale leaders").
            sent_at = self._clock_ms()
            stamp: list[int] = []
            try:
                future = self._send("DescribeProducers", broker, _describe_producers_request(batch))
            except Exception as exc:  # UnknownBrokerIdError and the like, raised before sending
                failure = DescribeBatch(
                    broker,
                    tuple(batch),
                    self._clock_ms(),
                    error=error_name(exc),
                    message=str(exc),
                    sent_at_ms=sent_at,
                )
                out.append(failure)
                continue
            future.add_both(lambda _x, s=stamp: s.append(self._clock_ms()))
            in_flight.append((tuple(batch), future, sent_at, stamp))
            if len(in_flight) >= self._window:
                result = await self._settle(broker, *in_flight.pop(0))
                out.append(result)
                if result.error is not None:
                    failure = result
        for item in in_flight:
            out.append(await self._settle(broker, *item))
        return out

    async def _yield(self) -> None:
        # Parsing a 500-partition response takes a while; let the IO loop serve other brokers in between.
        await self._manager._net.sleep(0)

    async def _settle(
        self, broker: int, batch: tuple[TP, ...], future: Any, sent_at: int, stamp: list[int]
    ) -> DescribeBatch:
        try:
            response = await future
        except Exception as exc:
            at = stamp[0] if stamp else self._clock_ms()
            return DescribeBatch(
                broker, batch, at, error=error_name(exc), message=str(exc) or None, sent_at_ms=sent_at
            )
        at = stamp[0] if stamp else self._clock_ms()
        await self._yield()
        results: dict[TP, PartitionProducers] = {}
        for topic in response.topics:
            for p in topic.partitions:
                error = code_name(p.error_code)
                if error is not None:
                    self.requests.record_partition_error("DescribeProducers", error)
                    results[(topic.name, p.partition_index)] = PartitionProducers(error, (), p.error_message)
                    continue
                results[(topic.name, p.partition_index)] = PartitionProducers(
                    None,
                    tuple(
                        ActiveProducer(
                            a.producer_id,
                            a.producer_epoch,
                            a.last_sequence,
                            a.last_timestamp,
                            a.coordinator_epoch,
                            a.current_txn_start_offset,
                        )
                        for a in p.active_producers
                    ),
                )
        return DescribeBatch(broker, batch, at, results, sent_at_ms=sent_at)

    # ------------------------------------------------------------------------------- start batches

    def fetch_start_batches(
        self,
        wanted: Mapping[int, Sequence[tuple[TP, int]]],
        leader_epochs: Mapping[TP, int] | None = None,
    ) -> dict[tuple[TP, int], StartBatch | FetchFailure]:
        epochs = dict(leader_epochs or {})
        per_broker = self._run(
            self._gather, [(self._fetch_broker, (b, list(items), epochs)) for b, items in wanted.items()]
        )
        out: dict[tuple[TP, int], StartBatch | FetchFailure] = {}
        for part in per_broker:
            out.update(part)
        return out

    async def _fetch_broker(
        self, broker: int, items: list[tuple[TP, int]], leader_epochs: Mapping[TP, int]
    ) -> dict[tuple[TP, int], StartBatch | FetchFailure]:
        out: dict[tuple[TP, int], StartBatch | FetchFailure] = {}
        pending = list(dict.fromkeys(items))
        for _ in range(self._fetch_rounds):
            if not pending:
                break
            # A fetch names each partition once; a second open transaction on it waits for the next round.
            this_round: list[tuple[TP, int]] = []
            later: list[tuple[TP, int]] = []
            seen: set[TP] = set()
            for tp, offset in pending:
                (later if tp in seen else this_round).append((tp, offset))
                seen.add(tp)
            request = fetch_request(
                [(tp[0], tp[1], offset) for tp, offset in this_round],
                partition_max_bytes=self._fetch_partition_max_bytes,
                max_bytes=self._fetch_max_bytes,
                leader_epochs=leader_epochs,
            )
            try:
                response = await self._send("Fetch", broker, request)
            except Exception as exc:
                for key in pending:
                    out[key] = FetchFailure(error_name(exc), permanent=False)
                return out
            data = {(t.topic, p.partition_index): p for t in response.responses for p in t.partitions}
            retry: list[tuple[TP, int]] = []
            for tp, offset in this_round:
                p = data.get(tp)
                if p is None:
                    out[(tp, offset)] = FetchFailure("MISSING_FROM_RESPONSE", permanent=False)
                    continue
                error = code_name(p.error_code)
                if error is not None:
                    self.requests.record_partition_error("Fetch", error)
                    out[(tp, offset)] = FetchFailure(error, permanent=error in PERMANENT_FETCH_ERRORS)
                    continue
                batch = parse_start_batch(p.records, offset, tp[0])
                if batch is not None:
                    out[(tp, offset)] = batch
                elif not p.records and p.high_watermark > offset:
                    retry.append((tp, offset))  # did not fit this response; first in line next round
                elif p.records:
                    out[(tp, offset)] = FetchFailure("NO_BATCH_AT_OFFSET", permanent=True)
                else:
                    out[(tp, offset)] = FetchFailure("OFFSET_NOT_YET_REPLICATED", permanent=False)
            pending = retry + later
        for key in pending:
            out[key] = FetchFailure("FETCH_ROUNDS_EXHAUSTED", permanent=False)
        return out

    # -------------------------------------------------------------------------------- ListOffsets

    def list_offsets(
        self, wanted: Mapping[int, Sequence[TP]], leader_epochs: Mapping[TP, int] | None = None
    ) -> dict[TP, Offsets]:
        epochs = dict(leader_epochs or {})
        calls = [(self._offsets_broker, (b, list(tps), epochs)) for b, tps in wanted.items()]
        per_broker = self._run(self._gather, calls)
        out: dict[TP, Offsets] = {}
        for part in per_broker:
            out.update(part)
        return out

    async def _offsets_broker(
        self, broker: int, tps: list[TP], leader_epochs: Mapping[TP, int]
    ) -> dict[TP, Offsets]:
        sent: list[Any] = []  # per isolation level: kafka-python's Future, or the error that kept it unsent
        for isolation in (READ_COMMITTED, READ_UNCOMMITTED):
            request = _list_offsets_request(tps, isolation, leader_epochs)
            try:
                sent.append(self._send("ListOffsets", broker, request))
            except Exception as exc:
                sent.append(error_name(exc))
        values: list[dict[TP, int]] = []
        errors: dict[TP, str] = {}  # the first error either request gave for the partition
        for future in sent:
            found: dict[TP, int] = {}
            response, failure = None, future if isinstance(future, str) else None
            if failure is None:
                try:
                    response = await future
                except Exception as exc:
                    failure = error_name(exc)
            if failure is not None:
                for tp in tps:
                    errors.setdefault(tp, failure)
            for topic in response.topics if response is not None else ():
                for p in topic.partitions:
                    tp = (topic.name, p.partition_index)
                    if p.error_code == 0 and p.offset >= 0:
                        found[tp] = p.offset
                    elif p.error_code != 0:
                        error = code_name(p.error_code) or "?"
                        self.requests.record_partition_error("ListOffsets", error)
                        errors.setdefault(tp, error)
            values.append(found)
        lso, hw = values
        return {tp: Offsets(lso.get(tp), hw.get(tp), errors.get(tp)) for tp in tps}

    def end_offsets(
        self,
        wanted: Mapping[int, Sequence[TP]],
        leader_epochs: Mapping[TP, int] | None = None,
        *,
        log_end: bool = False,
    ) -> dict[TP, EndOffset]:
        epochs = dict(leader_epochs or {})
        calls = [(self._end_offsets_broker, (b, list(tps), epochs, log_end)) for b, tps in wanted.items()]
        out: dict[TP, EndOffset] = {}
        for part in self._run(self._gather, calls):
            out.update(part)
        return out

    async def _end_offsets_broker(
        self, broker: int, tps: list[TP], leader_epochs: Mapping[TP, int], log_end: bool
    ) -> dict[TP, EndOffset]:
        # One read_uncommitted ListOffsets (latest = the high watermark); unlike `list_offsets` it keeps each
        # partition's error, since the coordinator log position must say why a partition is missing.
        replica_id = DEBUGGING_REPLICA_ID if log_end else CONSUMER_REPLICA_ID
        request = _list_offsets_request(tps, READ_UNCOMMITTED, leader_epochs, replica_id)
        try:
            response = await self._send("ListOffsets", broker, request)
        except Exception as exc:
            name = error_name(exc)
            return dict.fromkeys(tps, EndOffset(None, name))
        found: dict[TP, EndOffset] = {}
        for topic in response.topics:
            for p in topic.partitions:
                error = code_name(p.error_code)
                if error is not None:
                    self.requests.record_partition_error("ListOffsets", error)
                found[(topic.name, p.partition_index)] = EndOffset(p.offset if error is None else None, error)
        return {tp: found.get(tp, EndOffset(None, "MISSING_FROM_RESPONSE")) for tp in tps}

    # ------------------------------------------------------------------------------ DescribeConfigs

    def max_transaction_timeouts(self, brokers: Sequence[int]) -> dict[int, BrokerTimeout]:
        calls = [(self._timeout_broker, (b,)) for b in brokers]
        results = self._run(self._gather, calls)
        return dict(zip(brokers, results, strict=True))

    async def _timeout_broker(self, broker: int) -> BrokerTimeout:
        resource = DescribeConfigsRequest.DescribeConfigsResource
        request = DescribeConfigsRequest(
            resources=[
                resource(
                    resource_type=BROKER_RESOURCE,
                    resource_name=str(broker),
                    configuration_keys=[MAX_TIMEOUT_CONFIG],
                )
            ],
            include_synonyms=False,
        )
        try:
            response = await self._send("DescribeConfigs", broker, request)
        except Exception as exc:
            return BrokerTimeout(None, error_name(exc))
        for result in response.results:
            error = code_name(result.error_code)
            if error is not None:
                self.requests.record_partition_error("DescribeConfigs", error)
                return BrokerTimeout(None, error)
            for config in result.configs:
                if config.name == MAX_TIMEOUT_CONFIG and config.value is not None:
                    try:
                        return BrokerTimeout(int(config.value))
                    except ValueError:
                        return BrokerTimeout(None, "INVALID_CONFIG_VALUE")
        return BrokerTimeout(None, "CONFIG_NOT_RETURNED")

    # ------------------------------------------------------------------------ coordinator fallback

    def broker_apis(self, brokers: Sequence[int]) -> dict[int, BrokerApis]:
        """Each broker's ApiVersions as its connection negotiated them (connecting if needed); empty for a broker
        that could not be reached. See `admin.wire.versions` for what they tell."""
        results = self._run(self._gather, [(self._broker_apis, (b,)) for b in brokers])
        return dict(zip(brokers, results, strict=True))

    async def _broker_apis(self, broker: int) -> BrokerApis:
        try:
            await self._ensure_brokers_known([broker])
            connection = self._manager.get_connection(broker)
            await connection
        except Exception as exc:
            log.debug("ApiVersions of broker %d unknown: %s", broker, error_name(exc))
            return {}
        data = connection.broker_version_data
        return {} if data is None or data.api_versions is None else dict(data.api_versions)

    def list_transactions(
        self,
        *,
        producer_ids: Sequence[int] = (),
        states: Sequence[str] = (),
        duration_filter_ms: int | None = None,
        brokers: Sequence[int] | None = None,
    ) -> ListingResult:
        if brokers is None:
            brokers = [b.node_id for b in self._manager.cluster.brokers()]
        calls = [
            (self._list_broker, (b, list(producer_ids), list(states), duration_filter_ms)) for b in brokers
        ]
        results = self._run(self._gather, calls)
        listings: list[TransactionListing] = []
        failed: dict[int, str] = {}
        for broker, (found, error) in zip(brokers, results, strict=True):
            listings.extend(found)
            if error is not None:
                failed[broker] = error
        return ListingResult(listings, failed, frozenset(brokers) - set(failed))

    async def _list_broker(
        self, broker: int, producer_ids: list[int], states: list[str], duration_filter_ms: int | None
    ) -> tuple[list[TransactionListing], str | None]:
        kwargs: dict[str, Any] = {
            "state_filters": states,
            "producer_id_filters": producer_ids,
            "min_version": 0,
        }
        if duration_filter_ms is not None:
            kwargs.update(duration_filter=duration_filter_ms, min_version=1)
        try:
            response = await self._send("ListTransactions", broker, ListTransactionsRequest(**kwargs))
        except Exception as exc:
            return [], error_name(exc)
        error = code_name(response.error_code)
        if error is not None:
            self.requests.record_partition_error("ListTransactions", error)
            return [], error
        return [
            TransactionListing(t.transactional_id, t.producer_id, t.transaction_state, broker)
            for t in response.transaction_states
        ], None

    def describe_transactions(
        self, by_coordinator: Mapping[int, Sequence[str]]
    ) -> list[TransactionDescription]:
        calls = [
            (self._describe_txns, (b, list(ids[i : i + DESCRIBE_TRANSACTIONS_BATCH])))
            for b, ids in by_coordinator.items()
            for i in range(0, len(ids), DESCRIBE_TRANSACTIONS_BATCH)
        ]
        results = self._run(self._gather, calls)
        return [d for part in results for d in part]

    async def _describe_txns(self, broker: int, ids: list[str]) -> list[TransactionDescription]:
        try:
            response = await self._send(
                "DescribeTransactions", broker, DescribeTransactionsRequest(transactional_ids=ids)
            )
        except Exception as exc:
            name = error_name(exc)
            return [TransactionDescription(i, name, "", -1, -1, -1, -1, (), broker) for i in ids]
        out: list[TransactionDescription] = []
        for t in response.transaction_states:
            error = code_name(t.error_code)
            if error is not None:
                self.requests.record_partition_error("DescribeTransactions", error)
            partitions = tuple(sorted((topic.topic, p) for topic in t.topics for p in topic.partitions))
            out.append(
                TransactionDescription(
                    t.transactional_id,
                    error,
                    t.transaction_state,
                    t.transaction_timeout_ms,
                    t.transaction_start_time_ms,
                    t.producer_id,
                    t.producer_epoch,
                    partitions,
                    broker,
                )
            )
        return out

    def describe_denied(self, topic: str) -> bool:
        """True if the principal may not Describe `topic` (Metadata for it answers TOPIC_AUTHORIZATION_FAILED).

        Asked by name: a Metadata request for all topics silently leaves out the topics the principal may not
        describe, so their absence alone cannot tell a missing ACL from a topic that does not exist.
        """
        return self._run(self._describe_denied, topic)  # type: ignore[no-any-return]

    async def _describe_denied(self, topic: str) -> bool:
        request = MetadataRequest(
            topics=[MetadataRequest.MetadataRequestTopic(name=topic)], allow_auto_topic_creation=False
        )
        response = await self._send("Metadata", None, request)
        return any(
            t.name == topic and code_name(t.error_code) == "TOPIC_AUTHORIZATION_FAILED"
            for t in response.topics
        )

    # ------------------------------------------------------------------------------ consumer groups

    def committed_offsets(self, topic: str, partition: int) -> GroupOffsets:
        """Every consumer group's committed offset on one partition (ListGroups, then OffsetFetch), through
        kafka-python's public admin calls. Only groups this principal may Describe are listed."""
        try:
            groups = sorted({g["group_id"] for g in self._admin.list_groups()})
            if not groups:
                return GroupOffsets({})
            wanted = [KafkaTopicPartition(topic, partition)]
            answers = self._admin.list_group_offsets({g: wanted for g in groups})
        except Errors.KafkaError as exc:
            return GroupOffsets({}, error_name(exc))
        offsets: dict[str, int] = {}
        for group, by_tp in answers.items():
            for tp, committed in by_tp.items():
                if (tp.topic, tp.partition) == (topic, partition) and committed.offset >= 0:
                    offsets[group] = committed.offset
        return GroupOffsets(offsets)

    def group_standing(self, group: str, pending: Sequence[TP] = ()) -> GroupStanding:
        """A consumer group's state and members, whether its offsets on `pending` are unstable now (an OffsetFetch
        v7 with `require_stable` for them, as every read_committed consumer sends; None when no partition is
        named: fetching all of a group's offsets leaves pending ones out), and the other groups placed on its
        `__consumer_offsets` partition. Errors are named, never raised."""
        try:
            described = self._admin.describe_groups([group]).get(group) or {}
            members = described.get("members")
            state = described.get("group_state") or None
            unstable = self._run(self._fetch_unstable, group, list(pending)) if pending else None
            partitions = self._offsets_partitions()
            placed = offsets_partition_for(group, partitions)
            others = sorted(
                g["group_id"]
                for g in self._admin.list_groups()
                if g["group_id"] != group and offsets_partition_for(g["group_id"], partitions) == placed
            )
        except Errors.KafkaError as exc:
            return GroupStanding(group, error=error_name(exc))
        return GroupStanding(
            group,
            state=state,
            members=None if members is None else len(members),
            unstable=unstable,
            neighbours=tuple(others),
        )

    async def _fetch_unstable(self, group: str, pending: list[TP]) -> bool:
        coordinator = await self._admin._find_coordinator_id(group)
        by_topic: dict[str, list[int]] = {}
        for topic, partition in pending:
            by_topic.setdefault(topic, []).append(partition)
        topic = OffsetFetchRequest.OffsetFetchRequestTopic
        request = OffsetFetchRequest(
            group_id=group,
            topics=[topic(name=t, partition_indexes=ps) for t, ps in by_topic.items()],
            require_stable=True,
            min_version=7,
            max_version=7,
        )
        response = await self._send("OffsetFetch", coordinator, request)
        codes = {response.error_code} | {p.error_code for t in response.topics for p in t.partitions}
        return UNSTABLE_OFFSET_COMMIT in codes

    def _offsets_partitions(self) -> int:
        described = self._admin.describe_topics([CONSUMER_OFFSETS_TOPIC])
        return max(1, len(described[0]["partitions"]))

    # ------------------------------------------------------------------------------ WriteTxnMarkers

    def write_abort_marker(
        self,
        broker: int,
        *,
        topic: str,
        partition: int,
        producer_id: int,
        producer_epoch: int,
        coordinator_epoch: int,
        transaction_result: Literal["ABORT", "COMMIT"] = "ABORT",
    ) -> str | None:
        """Send one WriteTxnMarkers ABORT for one partition to `broker` (its leader), as Kafka's
        `Admin.abortTransaction` does; no retry here (the caller re-verifies after a leader move).

        `transaction_result="COMMIT"` writes a COMMIT marker instead (`proposals commit`: a commit marker that
        was lost). The broker checks both alike (`KafkaApis.handleWriteTxnMarkersRequest`: Alter, else
        ClusterAction, on the cluster; `ProducerAppendInfo.appendEndTxnMarker`: epoch and coordinator epoch) and
        ends the open transaction either way (the LSO moves); only a COMMIT leaves it out of the aborted index,
        so read_committed readers get its records.

        Returns:
            None when the broker wrote the marker, else the error's name (NOT_LEADER_OR_FOLLOWER,
            CLUSTER_AUTHORIZATION_FAILED, TRANSACTION_COORDINATOR_FENCED, INVALID_PRODUCER_EPOCH, a client-side
            name such as REQUEST_TIMED_OUT: then the marker may or may not have been written).

        Raises:
            ValueError: a negative coordinator epoch (kafka-python's -1 default is fenced once the partition
                holds an epoch; use the leader's, 0 when negative).
        """
        if coordinator_epoch < 0:
            raise ValueError("WriteTxnMarkers: the coordinator epoch must be >= 0 (never -1)")
        marker = WriteTxnMarkersRequest.WritableTxnMarker
        request = WriteTxnMarkersRequest(
            markers=[
                marker(
                    producer_id=producer_id,
                    producer_epoch=producer_epoch,
                    transaction_result=transaction_result == "COMMIT",  # false: ABORT, true: COMMIT
                    topics=[marker.WritableTxnMarkerTopic(name=topic, partition_indexes=[partition])],
                    coordinator_epoch=coordinator_epoch,
                    # Sent (v2, Kafka 4.2+) as Kafka's `Admin.abortTransaction` sends it: see
                    # `admin.wire.versions.ADMIN_MARKER_TRANSACTION_VERSION`. Left out of v1 (older brokers).
                    transaction_version=ADMIN_MARKER_TRANSACTION_VERSION,
                )
            ]
        )
        return self._run(self._write_marker, broker, request, (topic, partition))  # type: ignore[no-any-return]

    async def _write_marker(self, broker: int, request: Any, tp: TP) -> str | None:
        await self._ensure_brokers_known([broker])
        try:
            response = await self._send("WriteTxnMarkers", broker, request)
        except Exception as exc:
            return error_name(exc)
        for result in response.markers:
            for topic in result.topics:
                for p in topic.partitions:
                    if (topic.name, p.partition_index) == tp:
                        return code_name(p.error_code)
        return "MISSING_FROM_RESPONSE"


def _describe_producers_request(batch: Sequence[TP]) -> Any:
    topic = DescribeProducersRequest.TopicRequest
    by_topic: dict[str, list[int]] = {}
    for name, partition in batch:
        by_topic.setdefault(name, []).append(partition)
    return DescribeProducersRequest(
        topics=[topic(name=name, partition_indexes=parts) for name, parts in by_topic.items()]
    )


# ListOffsets' replica ids: a client (the leader's high watermark or LSO), or a debugging tool (its log end offset).
CONSUMER_REPLICA_ID = -1
DEBUGGING_REPLICA_ID = -2


def _list_offsets_request(
    tps: Sequence[TP],
    isolation: int,
    leader_epochs: Mapping[TP, int],
    replica_id: int = CONSUMER_REPLICA_ID,
) -> Any:
    """ListOffsets (latest) for `tps`, each with the leader epoch of record where known (-1 otherwise).

    With an epoch, a broker that is not the leader at exactly that epoch answers FENCED_LEADER_EPOCH (it knows a
    newer one), UNKNOWN_LEADER_EPOCH (an older one) or NOT_LEADER_OR_FOLLOWER (`Partition.localLogWithEpochOrThrow`;
    replica id -1 asks the leader only): a deposed leader's high watermark or LSO is refused, not returned.

    `replica_id` -2 (`ListOffsetsRequest.DEBUGGING_REPLICA_ID`) asks for the log end offset: the broker then applies
    no isolation level (`ReplicaManager.fetchOffset`: only replica id -1 is a client request) and answers its local
    log's end (`Partition.fetchOffsetForTimestamp`), under the same Describe-on-topic check and epoch fencing.
    """
    topic = ListOffsetsRequest.ListOffsetsTopic
    by_topic: dict[str, list[Any]] = {}
    for name, partition in tps:
        by_topic.setdefault(name, []).append(
            topic.ListOffsetsPartition(
                partition_index=partition,
                current_leader_epoch=leader_epochs.get((name, partition), -1),
                timestamp=LATEST_TIMESTAMP,
            )
        )
    # v2 is the first with an isolation level (Kafka 4.0 removed v0), v4 the first with a current leader epoch:
    # never let an epoch be dropped by an older version.
    return ListOffsetsRequest(
        replica_id=replica_id,
        isolation_level=isolation,
        topics=[topic(name=name, partitions=parts) for name, parts in by_topic.items()],
        min_version=4 if any(leader_epochs.get(tp, -1) >= 0 for tp in tps) else 2,
    )
