"""Publishing sweeps and coordinator records to Kafka; creating the output topics; reading back at start-up.

Snapshot topic (`<prefix>.producer-state`): key `"{topic}-{partition}"`, value `PartitionSnapshot` JSON, header
`txnwatch.type=partition-snapshot`; per-broker summaries on the same topic with key `"__sweep__-broker-{id}"`
and header `txnwatch.type=broker-sweep-summary`; coordinator log positions on the same topic, after the sweep's
other records, with key `"__position__-{coordinator topic}"` and header `txnwatch.type=coordinator-log-position`.
Coordinator fallback (`<prefix>.coordinator-state`): key the transactional id, value `CoordinatorRecord` JSON.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

import kafka.errors as Errors
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.admin import NewTopic
from kafka.structs import TopicPartition as KafkaTopicPartition

from admin.collect.metrics import CollectorMetrics
from admin.wire.connect import AdminError, error_name, explain
from admin.wire.types import TP, SweepResult
from common.broker_info import broker_count
from common.topics import OutputTopicSettings, replication_factor
from detectors.contract import (
    COORDINATOR_LOG_POSITION_TYPE,
    COORDINATOR_RECORD_TYPE,
    SNAPSHOT_TYPE,
    SUMMARY_TYPE,
    TYPE_HEADER,
    position_key,
    snapshot_key,
    summary_key,
)
from detectors.models import (
    BrokerSweepSummary,
    CoordinatorLogPosition,
    CoordinatorRecord,
    PartitionSnapshot,
)

log = logging.getLogger(__name__)

Headers = list[tuple[str, bytes]]


class OutRecord(NamedTuple):
    """One record to produce."""

    topic: str
    key: bytes
    value: bytes
    headers: Headers


def snapshot_record(topic: str, snapshot: PartitionSnapshot) -> OutRecord:
    return OutRecord(
        topic,
        snapshot_key(snapshot.topic, snapshot.partition),
        snapshot.model_dump_json().encode(),
        [(TYPE_HEADER, SNAPSHOT_TYPE.encode())],
    )


def summary_record(topic: str, summary: BrokerSweepSummary) -> OutRecord:
    return OutRecord(
        topic,
        summary_key(summary.broker),
        summary.model_dump_json().encode(),
        [(TYPE_HEADER, SUMMARY_TYPE.encode())],
    )


def position_record(topic: str, position: CoordinatorLogPosition) -> OutRecord:
    # One key per coordinator topic: compaction keeps the newest position, which is all a restarted job needs.
    return OutRecord(
        topic,
        position_key(position.topic),
        position.model_dump_json().encode(),
        [(TYPE_HEADER, COORDINATOR_LOG_POSITION_TYPE.encode())],
    )


def coordinator_record(topic: str, record: CoordinatorRecord) -> OutRecord:
    return OutRecord(
        topic,
        record.transactional_id.encode(),
        record.model_dump_json().encode(),
        [(TYPE_HEADER, COORDINATOR_RECORD_TYPE.encode())],
    )


def sweep_records(topic: str, result: SweepResult) -> list[OutRecord]:
    """A sweep's records in publishing order: snapshots, explicit empties, the broker summaries, then the
    coordinator log positions."""
    return [
        *(snapshot_record(topic, s) for s in result.snapshots),
        *(snapshot_record(topic, s) for s in result.empties),
        *(summary_record(topic, s) for s in result.summaries),
        *(position_record(topic, p) for p in result.positions),
    ]


class RecordSink(Protocol):
    """Where records go; `KafkaSink` in production, a list in unit tests."""

    def send_all(self, records: Sequence[OutRecord]) -> None:
        """Send and wait until every record is acknowledged. Raises AdminError on failure."""
        ...

    def close(self) -> None: ...


class KafkaSink:
    """An idempotent (acks=all) KafkaProducer; `send_all` flushes and checks every record's result.

    `timeout_s` bounds a whole `send_all`: the flush and every record's result share one deadline (the collector
    passes its request timeout). A publish that waited a minute for a cluster that went away kept the sweep, the
    probes and /healthz waiting with it, and when the cluster came back within that minute the outage was never
    said. What is still buffered when the deadline passes is delivered later by the producer, in order."""

    def __init__(self, producer: KafkaProducer, *, timeout_s: float = 60.0) -> None:
        self._producer = producer
        self._timeout_s = timeout_s

    def send_all(self, records: Sequence[OutRecord]) -> None:
        deadline = time.monotonic() + self._timeout_s
        futures = [
            (r.topic, self._producer.send(r.topic, key=r.key, value=r.value, headers=r.headers))
            for r in records
        ]
        try:
            self._producer.flush(timeout=max(0.0, deadline - time.monotonic()))
        except Errors.KafkaTimeoutError as exc:
            raise AdminError(
                f"Produce: {len(futures)} records not acknowledged within {self._timeout_s:.0f}s ({exc})"
            ) from exc
        for topic, future in futures:
            try:
                future.get(timeout=max(0.0, deadline - time.monotonic()))
            except Errors.KafkaError as exc:
                raise AdminError(explain("Produce", error_name(exc), topic, str(exc))) from exc

    def close(self) -> None:
        self._producer.close(timeout=10)


class Publisher:
    """Publishes sweeps (and coordinator records) through a sink, counting what it sends."""

    def __init__(
        self,
        sink: RecordSink,
        *,
        snapshot_topic: str,
        coordinator_topic: str,
        metrics: CollectorMetrics | None = None,
    ) -> None:
        self._sink = sink
        self.snapshot_topic = snapshot_topic
        self.coordinator_topic = coordinator_topic
        self._metrics = metrics

    def publish_sweep(self, result: SweepResult) -> int:
        records = sweep_records(self.snapshot_topic, result)
        self._sink.send_all(records)
        if self._metrics is not None:
            self._metrics.records_published.labels(type=SNAPSHOT_TYPE).inc(len(result.snapshots))
            self._metrics.records_published.labels(type="empty-snapshot").inc(len(result.empties))
            self._metrics.records_published.labels(type=SUMMARY_TYPE).inc(len(result.summaries))
            self._metrics.records_published.labels(type=COORDINATOR_LOG_POSITION_TYPE).inc(
                len(result.positions)
            )
        return len(records)

    def publish_coordinator(self, records: Iterable[CoordinatorRecord]) -> int:
        out = [coordinator_record(self.coordinator_topic, r) for r in records]
        if out:
            self._sink.send_all(out)
            if self._metrics is not None:
                self._metrics.records_published.labels(type=COORDINATOR_RECORD_TYPE).inc(len(out))
        return len(out)

    def publish_positions(self, positions: Sequence[CoordinatorLogPosition]) -> int:
        """Positions on the snapshot topic (the describe fallback's, after its records are acknowledged)."""
        out = [position_record(self.snapshot_topic, p) for p in positions]
        if out:
            self._sink.send_all(out)
            if self._metrics is not None:
                self._metrics.records_published.labels(type=COORDINATOR_LOG_POSITION_TYPE).inc(len(out))
        return len(out)

    def close(self) -> None:
        self._sink.close()


# ------------------------------------------------------------------------------------------- topics


def ensure_topics(
    admin: KafkaAdminClient, wanted: Mapping[str, OutputTopicSettings], *, timeout_s: float = 30.0
) -> list[str]:
    """Create the topics that do not exist yet (existing ones are left as they are).

    Returns:
        The names created.

    Raises:
        AdminError: creation denied (names the ACL) or failed.
    """
    existing = set(admin.list_topics())
    missing = [name for name in wanted if name not in existing]
    if not missing:
        return []
    brokers = broker_count(admin)
    new = [
        NewTopic(
            name,
            wanted[name].partitions,
            wanted[name].replication_factor or replication_factor(brokers),
            topic_configs=wanted[name].topic_configs(),
        )
        for name in missing
    ]
    created: list[str] = []
    for topic in new:
        try:
            admin.create_topics([topic])
            created.append(topic.name)
        except Errors.TopicAlreadyExistsError:
            continue  # created meanwhile by another collector
        except Errors.KafkaError as exc:
            raise AdminError(explain("CreateTopics", error_name(exc), topic.name, str(exc))) from exc
    _wait_for_leaders(admin, created, timeout_s)
    for name in created:
        log.info("created topic %s (%s)", name, wanted[name].topic_configs())
    return created


def _wait_for_leaders(admin: KafkaAdminClient, topics: Sequence[str], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while topics and time.monotonic() < deadline:
        described = admin.describe_topics(list(topics))
        if len(described) == len(topics) and all(
            p["leader_id"] is not None and p["leader_id"] >= 0 for t in described for p in t["partitions"]
        ):
            return
        time.sleep(0.2)


# ------------------------------------------------------------------------------------------ restore


def restore_open_partitions(consumer: KafkaConsumer, topic: str, *, timeout_s: float) -> set[TP] | None:
    """Which partitions the snapshot topic last showed with open transactions (read from the beginning).

    The collector publishes an explicit empty snapshot when a partition's open set becomes empty; after a
    restart it needs to know what it published before, or it would never close partitions that emptied
    while it was down.

    Returns:
        The partitions whose latest snapshot has open transactions; an empty set if the topic does not exist;
        None if the topic could not be read completely within `timeout_s` (the caller then publishes empty
        snapshots for every partition it covers, once).
    """
    try:
        partitions = consumer.partitions_for_topic(topic)
        if not partitions:
            return set()
        tps = [KafkaTopicPartition(topic, p) for p in sorted(partitions)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        end = consumer.end_offsets(tps)
        remaining = {tp for tp in tps if end[tp] > 0}
        latest: dict[TP, bool] = {}
        deadline = time.monotonic() + timeout_s
        while remaining and time.monotonic() < deadline:
            for tp, records in consumer.poll(timeout_ms=500).items():
                for r in records:
                    _remember(latest, r.headers, r.value)
                if consumer.position(tp) >= end[tp]:
                    remaining.discard(tp)
            for tp in list(remaining):
                if consumer.position(tp) >= end[tp]:
                    remaining.discard(tp)
        if remaining:
            log.warning(
                "reading %s back took longer than %.0fs; the first sweep publishes empty snapshots for every "
                "partition without open transactions",
                topic,
                timeout_s,
            )
            return None
        return {tp for tp, is_open in latest.items() if is_open}
    except Errors.KafkaError as exc:
        log.warning(
            "%s; the first sweep publishes empty snapshots for every partition without open transactions",
            explain("Consume", error_name(exc), topic, str(exc)),
        )
        return None


def _remember(latest: dict[TP, bool], headers: Any, value: bytes | None) -> None:
    kind = next((v for k, v in headers or () if k == TYPE_HEADER), None)
    if kind is not None and kind != SNAPSHOT_TYPE.encode():
        return
    if value is None:
        return
    try:
        snap = json.loads(value)
        latest[(snap["topic"], int(snap["partition"]))] = bool(snap.get("open_transactions"))
    except (ValueError, KeyError, TypeError):
        return
