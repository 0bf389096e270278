"""`__transaction_state` read from a real broker and run through the job's own decoder and stage 1, for broker
tests that judge what the job would (tests/broker/test_lost_marker.py, test_write_after_marker.py)."""

from __future__ import annotations

import time
from typing import Any

import pyarrow as pa
from kafka import KafkaConsumer
from kafka.structs import TopicPartition

from detectors.contract import TRANSACTION_LOG_TOPIC
from detectors.models import CoordinatorRecord
from detectors.tracking import CoordinatorRow, advance_owners
from streaming.sources import decode_batches


def coordinator_log(bootstrap: str, partition: int) -> list[Any]:
    """`__transaction_state`'s partition read to its end now: its records (kafka-python's ConsumerRecords)."""
    tp = TopicPartition(TRANSACTION_LOG_TOPIC, partition)
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None)
    records: list[Any] = []
    try:
        consumer.assign([tp])
        end = consumer.end_offsets([tp])[tp]
        consumer.seek_to_beginning(tp)
        deadline = time.monotonic() + 20
        while consumer.position(tp) < end and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=500).values():
                records += [r for r in batch if r.offset < end]
    finally:
        consumer.close()
    return records


def decoded(records: list[Any], *, compact: bool = True) -> list[dict[str, Any]]:
    """The records through the job's decoder (`decode_batches`; as the job runs it: compact, one Arrow batch),
    one dict of DECODED_SCHEMA's columns per row."""
    raw = pa.RecordBatch.from_pydict(
        {
            "key": pa.array([r.key for r in records], pa.binary()),
            "value": pa.array([r.value for r in records], pa.binary()),
            "topic": pa.array([TRANSACTION_LOG_TOPIC] * len(records), pa.string()),
            "partition": pa.array([r.partition for r in records], pa.int32()),
            "offset": pa.array([r.offset for r in records], pa.int64()),
            "ts_ms": pa.array([r.timestamp for r in records], pa.int64()),
        }
    )
    (batch,) = list(decode_batches(iter([raw]), compact=compact))
    return batch.to_pylist()  # type: ignore[no-any-return]


def stage1_rows(rows: list[dict[str, Any]]) -> list[CoordinatorRow]:
    """The decoded rows as stage 1's input: each becomes the record JSON the job builds
    (`streaming.rows.coordinator_rows`: the decoded fields, provenance left out)."""
    fields = set(CoordinatorRecord.model_fields) - {
        "schema_version",
        "source_partition",
        "source_offset",
        "source_timestamp_ms",
        "origin",
    }
    return [
        CoordinatorRow(
            r["transactional_id"],
            r["producer_id"],
            r["previous_producer_id"],
            r["next_producer_id"],
            r["tombstone"],
            r["last_update_timestamp_ms"],
            r["source_offset"],
            CoordinatorRecord.model_validate({k: r[k] for k in fields}).model_dump_json(),
            r["state"],
        )
        for r in rows
        if r["error"] is None
    ]


def coordinator_view(rows: list[dict[str, Any]], producer_id: int) -> CoordinatorRecord:
    """Stage 1 on the decoded rows at once: the record the job's view holds for the producer id."""
    views = [f for f in advance_owners({}, stage1_rows(rows)) if f[0] == producer_id and f[1] == "view"]
    (view,) = views
    assert view[3] is not None
    return CoordinatorRecord.model_validate_json(view[3])
