"""Publishing sweeps and coordinator records to Kafka (`KafkaSink`, `ensure_topics`: admin/wire/); reading back at start-up.

Snapshot topic (`<prefix>.producer-state`): key `"{topic}-{partition}"`, value `PartitionSnapshot` JSON, header
`txnwatch.type=partition-snapshot`; per-broker summaries on the same topic with key `"__sweep__-broker-{id}"`
and header `txnwatch.type=broker-sweep-summary`; coordinator log positions on the same topic, after the sweep's
other records, with key `"__position__-{coordinator topic}"` and header `txnwatch.type=coordinator-log-position`.
Coordinator fallback (`<prefix>.coordinator-state`): key the transactional id, value `CoordinatorRecord` JSON.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from admin.collect.metrics import CollectorMetrics
from admin.wire.connect import Consumer
from admin.wire.errors import WireError, error_name, explain
from admin.wire.records import KafkaSink as KafkaSink
from admin.wire.records import TopicRead
from admin.wire.topics import ensure_topics as ensure_topics
from admin.wire.types import TP, SweepResult
from admin.wire.types import OutRecord as OutRecord
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


# ------------------------------------------------------------------------------------------ restore


def restore_open_partitions(consumer: Consumer, topic: str, *, timeout_s: float) -> set[TP] | None:
    """Which partitions the snapshot topic last showed with open transactions (read from the beginning).

    The collector publishes an explicit empty snapshot when a partition's open set becomes empty; after a
    restart it needs to know what it published before, or it would never close partitions that emptied
    while it was down.

    Returns:
        The partitions whose latest snapshot has open transactions; an empty set if the topic does not exist;
        None if the topic could not be read completely within `timeout_s` (the caller then publishes empty
        snapshots for every partition it covers, once).
    """
    read = TopicRead(consumer, topic, timeout_s=timeout_s)
    latest: dict[TP, bool] = {}
    try:
        for r in read:
            _remember(latest, r.headers, r.value)
    except WireError as exc:
        log.warning(
            "%s; the first sweep publishes empty snapshots for every partition without open transactions",
            explain("Consume", error_name(exc), topic, str(exc)),
        )
        return None
    if not read.complete:
        log.warning(
            "reading %s back took longer than %.0fs; the first sweep publishes empty snapshots for every "
            "partition without open transactions",
            topic,
            timeout_s,
        )
        return None
    return {tp for tp, is_open in latest.items() if is_open}


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
