"""kafka-python under the seams: `KafkaWire` sends the requests each API family's module builds (cluster,
producers, fetch, offsets, transactions, groups, markers) on kafka-python's own IO loop, with
`admin._manager.send`: one coroutine per broker (not asyncio), a few requests in flight per connection. Every
kafka-python error it lets out is a `WireError` (admin/wire/errors.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import kafka.errors as Errors
from kafka.structs import TopicPartition as KafkaTopicPartition

from admin.wire.cluster import (
    describe_denied,
    max_timeout_request,
    metadata_request,
    negotiated_apis,
    parse_max_timeout,
    parse_metadata,
)
from admin.wire.connect import AdminClient
from admin.wire.errors import WireError, error_name, kafka_errors_translated
from admin.wire.fetch import fetch_request, parse_fetch_round
from admin.wire.groups import has_unstable_offsets, offset_fetch_request
from admin.wire.markers import parse_marker_answer, write_txn_marker_request
from admin.wire.offsets import (
    CONSUMER_REPLICA_ID,
    DEBUGGING_REPLICA_ID,
    READ_COMMITTED,
    READ_UNCOMMITTED,
    list_offsets_request,
    parse_end_offsets,
    parse_offsets,
)
from admin.wire.producers import describe_producers_request, parse_describe_producers
from admin.wire.requests import RequestLog
from admin.wire.transactions import (
    DESCRIBE_TRANSACTIONS_BATCH,
    describe_transactions_request,
    list_transactions_request,
    parse_descriptions,
    parse_listing,
    undescribed,
)
from admin.wire.types import (
    TP,
    BrokerTimeout,
    ClusterView,
    DescribeBatch,
    EndOffset,
    FetchFailure,
    GroupOffsets,
    GroupStanding,
    ListingResult,
    Offsets,
    StartBatch,
    TransactionDescription,
    TransactionListing,
    wall_clock_ms,
)
from admin.wire.versions import BrokerApis
from detectors.groups import CONSUMER_OFFSETS_TOPIC, offsets_partition_for

log = logging.getLogger(__name__)


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
        admin: AdminClient,
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
        # What the IO loop raises leaves as the wire's own error (WireError), never kafka-python's.
        with kafka_errors_translated():
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
        request = metadata_request(topics)
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
        view = parse_metadata(response, self.requests)
        await self._ensure_brokers_known(list(view.brokers))
        return view

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
                future = self._send("DescribeProducers", broker, describe_producers_request(batch))
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
        return DescribeBatch(
            broker, batch, at, parse_describe_producers(response, self.requests), sent_at_ms=sent_at
        )

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
            retry = parse_fetch_round(response, this_round, out, self.requests)
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
            request = list_offsets_request(tps, isolation, leader_epochs)
            try:
                sent.append(self._send("ListOffsets", broker, request))
            except Exception as exc:
                sent.append(error_name(exc))
        values: list[dict[TP, int]] = []
        errors: dict[TP, str] = {}  # the first error either request gave for the partition
        for future in sent:
            response, failure = None, future if isinstance(future, str) else None
            if failure is None:
                try:
                    response = await future
                except Exception as exc:
                    failure = error_name(exc)
            if failure is not None:
                for tp in tps:
                    errors.setdefault(tp, failure)
            values.append({} if response is None else parse_offsets(response, self.requests, errors))
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
        request = list_offsets_request(tps, READ_UNCOMMITTED, leader_epochs, replica_id)
        try:
            response = await self._send("ListOffsets", broker, request)
        except Exception as exc:
            name = error_name(exc)
            return dict.fromkeys(tps, EndOffset(None, name))
        return parse_end_offsets(response, tps, self.requests)

    # ------------------------------------------------------------------------------ DescribeConfigs

    def max_transaction_timeouts(self, brokers: Sequence[int]) -> dict[int, BrokerTimeout]:
        calls = [(self._timeout_broker, (b,)) for b in brokers]
        results = self._run(self._gather, calls)
        return dict(zip(brokers, results, strict=True))

    async def _timeout_broker(self, broker: int) -> BrokerTimeout:
        try:
            response = await self._send("DescribeConfigs", broker, max_timeout_request(broker))
        except Exception as exc:
            return BrokerTimeout(None, error_name(exc))
        return parse_max_timeout(response, self.requests)

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
        return negotiated_apis(connection)

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
        request = list_transactions_request(producer_ids, states, duration_filter_ms)
        try:
            response = await self._send("ListTransactions", broker, request)
        except Exception as exc:
            return [], error_name(exc)
        return parse_listing(response, broker, self.requests)

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
            response = await self._send("DescribeTransactions", broker, describe_transactions_request(ids))
        except Exception as exc:
            return undescribed(ids, error_name(exc), broker)
        return parse_descriptions(response, broker, self.requests)

    def describe_denied(self, topic: str) -> bool:
        """True if the principal may not Describe `topic` (Metadata for it answers TOPIC_AUTHORIZATION_FAILED).

        Asked by name: a Metadata request for all topics silently leaves out the topics the principal may not
        describe, so their absence alone cannot tell a missing ACL from a topic that does not exist.
        """
        return self._run(self._describe_denied, topic)  # type: ignore[no-any-return]

    async def _describe_denied(self, topic: str) -> bool:
        response = await self._send("Metadata", None, metadata_request([topic]))
        return describe_denied(response, topic)

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
        except (Errors.KafkaError, WireError) as exc:
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
        request = offset_fetch_request([group], pending, many=False, require_stable=True)
        response = await self._send("OffsetFetch", coordinator, request)
        return has_unstable_offsets(response)

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
        request = write_txn_marker_request(
            topic=topic,
            partition=partition,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            coordinator_epoch=coordinator_epoch,
            transaction_result=transaction_result,
        )
        return self._run(self._write_marker, broker, request, (topic, partition))  # type: ignore[no-any-return]

    async def _write_marker(self, broker: int, request: Any, tp: TP) -> str | None:
        await self._ensure_brokers_known([broker])
        try:
            response = await self._send("WriteTxnMarkers", broker, request)
        except Exception as exc:
            return error_name(exc)
        return parse_marker_answer(response, tp)
