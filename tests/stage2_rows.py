"""Stage 2's input rows, built from what a real collector and a real `__transaction_state` gave, for broker tests
that drive the job's own stage 2 (`detectors.tracking.reconcile_bucket`) without Spark."""

from __future__ import annotations

import json
from typing import Any

from detectors.contract import TRANSACTION_LOG_TOPIC
from detectors.models import CoordinatorLogPosition, CoordinatorRecord, PartitionSnapshot
from detectors.tracking import EVENT_COLUMNS, STAGE2_INPUT_COLUMNS, BucketState, Fact, reconcile_bucket


def row(**values: Any) -> list[Any]:
    return [values.get(c) for c in STAGE2_INPUT_COLUMNS[1:]]


def open_row(snap: PartitionSnapshot) -> list[Any]:
    """The report of a partition with one open transaction."""
    (t,) = snap.open_transactions
    return row(
        producer_id=t.producer_id,
        fact="open",
        topic=snap.topic,
        partition=snap.partition,
        snapshot_json=snap.model_dump_json(),
        observed_at_ms=snap.observed_at_ms,
        leader=snap.leader,
        start_offset=t.start_offset,
        producer_epoch=t.producer_epoch,
        start_batch_producer_epoch=t.start_batch_producer_epoch,
        start_timestamp_ms=t.start_timestamp_ms,
        last_timestamp_ms=t.last_timestamp_ms,
        opened_after_ms=t.opened_after_ms,
        seen_open_ms=t.seen_open_ms,
        start_batch_leader_epoch=t.start_batch_leader_epoch,
        leader_epoch=snap.leader_epoch,
    )


def position_row(p: CoordinatorLogPosition) -> list[Any]:
    return row(producer_id=-1, fact="position", record_json=p.model_dump_json(), fact_time_ms=p.as_of_ms)


def view_row(r: CoordinatorRecord) -> list[Any]:
    """A coordinator record as a view fact of its producer id (stage 1 not run: one record, one fact)."""
    return row(
        producer_id=r.producer_id,
        fact="view",
        transactional_id=r.transactional_id,
        record_json=r.model_dump_json(),
        fact_time_ms=r.last_update_timestamp_ms,
        log_offset=r.source_offset,
    )


def fact_row(fact: Fact) -> list[Any]:
    """A fact stage 1 (`detectors.tracking.advance_owners`) gave."""
    producer_id, kind, transactional_id, record_json, fact_time_ms, log_offset = fact
    return row(
        producer_id=producer_id,
        fact=kind,
        transactional_id=transactional_id,
        record_json=record_json,
        fact_time_ms=fact_time_ms,
        log_offset=log_offset,
    )


def applied_row(ends: dict[int, int]) -> list[Any]:
    """The view holds every record of `__transaction_state` below these offsets (per partition)."""
    return row(
        producer_id=-1,
        fact="applied",
        transactional_id=TRANSACTION_LOG_TOPIC,
        record_json=json.dumps(ends),
        fact_time_ms=0,
    )


def batch(bucket: BucketState, now_ms: int, *rows: list[Any]) -> list[dict[str, Any]]:
    """One stage-2 batch of `rows`; its events as dicts of EVENT_COLUMNS."""
    columns = [list(c) for c in zip(*rows, strict=True)]
    return [dict(zip(EVENT_COLUMNS, e, strict=True)) for e in reconcile_bucket(bucket, columns, now_ms)]
