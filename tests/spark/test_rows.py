"""The rows Spark shapes for the reconcile stages (streaming/rows.py), read back as the stages read them, give
the facts the models give: one way to build facts for the rules, whichever path a record takes."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from detectors.models import (
    CoordinatorRecord,
    CoordinatorState,
    OpenTransaction,
    PartitionSnapshot,
    TopicPartition,
)
from detectors.rules import coord_facts, txn_facts
from detectors.tracking import (
    STAGE1_INPUT_COLUMNS,
    STAGE2_INPUT_COLUMNS,
    OpenRow,
    coord_facts_from_json,
    open_entry,
)
from streaming.reconcile import FACT_SCHEMA, _columns
from streaming.rows import _PROVENANCE, coordinator_rows, fact_rows, open_transaction_rows
from streaming.schemas import COORDINATOR_RECORD_SCHEMA, PARTITION_SNAPSHOT_SCHEMA

pytestmark = pytest.mark.spark

T0 = 1_732_000_000_000
BUCKETS = 4


def _frame(spark: SparkSession, models: list[Any], schema: T.StructType) -> DataFrame:
    """Model JSON parsed by Spark with the job's schema, as the sources parse it."""
    raw = spark.createDataFrame([(m.model_dump_json(),) for m in models], "j string")
    return raw.select(F.from_json("j", schema).alias("m")).select("m.*")


def _as_stage_reads(df: DataFrame, names: tuple[str, ...]) -> list[tuple[Any, ...]]:
    """The rows through Arrow → pandas → `_columns`, as a stateful stage gets them (nullable longs as floats)."""
    columns = _columns(iter([df.toArrow().to_pandas()]), names)
    return list(zip(*columns, strict=True))


def test_open_transaction_rows_give_the_rules_txn_facts(spark: SparkSession) -> None:
    txns = [
        OpenTransaction(
            producer_id=7,
            producer_epoch=3,
            start_offset=5,
            start_timestamp_ms=T0,
            start_batch_producer_epoch=2,
        ),
        OpenTransaction(producer_id=8, producer_epoch=1, start_offset=9, last_timestamp_ms=T0 + 4),
        OpenTransaction(producer_id=9, producer_epoch=0, start_offset=11, start_timestamp_ms=-1),
    ]
    snapshots = [
        PartitionSnapshot(
            cluster="c",
            sweep_id="s",
            observed_at_ms=T0 + 60_000,
            leader=2,
            topic="orders",
            partition=3,
            open_transactions=tuple(txns),
            last_stable_offset=5,
            high_watermark=40,
            max_transaction_timeout_ms=60_000,
        ),
        PartitionSnapshot(
            cluster="c",
            sweep_id="s",
            observed_at_ms=T0 + 61_000,
            leader=1,
            topic="payments",
            partition=0,
            open_transactions=(txns[1],),
        ),
    ]
    rows = open_transaction_rows(_frame(spark, snapshots, PARTITION_SNAPSHOT_SCHEMA), BUCKETS)
    assert tuple(rows.columns) == STAGE2_INPUT_COLUMNS
    read = _as_stage_reads(rows, STAGE2_INPUT_COLUMNS)
    assert len(read) == 4
    by_key = {(s.topic, t.producer_id): (s, t) for s in snapshots for t in s.open_transactions}
    for bucket, pid, fact, *rest in read:
        assert fact == "open" and 0 <= bucket < BUCKETS
        row = OpenRow(pid, *rest[4:])  # as tracking.reconcile_bucket builds it
        snapshot, txn = by_key[(row.topic, pid)]
        assert open_entry(row, T0, None, None).facts == txn_facts(txn, snapshot, first_seen_ms=T0)
        one = PartitionSnapshot.model_validate_json(row.snapshot_json)
        assert one == snapshot.model_copy(update={"open_transactions": (txn,)})
        assert (row.leader, row.start_offset) == (snapshot.leader, txn.start_offset)
        if snapshot.high_watermark is not None and snapshot.last_stable_offset is not None:
            assert row.lso_lag == snapshot.high_watermark - snapshot.last_stable_offset
        else:
            assert row.lso_lag is None


def test_coordinator_rows_carry_the_record_the_rules_read(spark: SparkSession) -> None:
    records = [
        CoordinatorRecord(
            transactional_id="tx-1",
            producer_id=7,
            producer_epoch=4,
            previous_producer_id=6,
            client_transaction_version=2,
            transaction_timeout_ms=60_000,
            state=CoordinatorState.ONGOING,
            partitions=(
                TopicPartition(topic="orders", partition=3),
                TopicPartition(topic="orders", partition=5),
            ),
            last_update_timestamp_ms=T0,
            start_timestamp_ms=T0 - 10,
            source_partition=1,
            source_offset=42,
            source_timestamp_ms=T0,
        ),
        CoordinatorRecord.tombstone_of("tx-2", source_partition=1, source_offset=43, source_timestamp_ms=T0),
    ]
    rows = coordinator_rows(_frame(spark, records, COORDINATOR_RECORD_SCHEMA), BUCKETS)
    assert tuple(rows.columns) == STAGE1_INPUT_COLUMNS
    read = {r[1]: r for r in _as_stage_reads(rows, STAGE1_INPUT_COLUMNS)}
    for record in records:
        r = read[record.transactional_id]
        assert r[2:8] == (
            record.producer_id,
            record.previous_producer_id,
            record.next_producer_id,
            record.tombstone,
            record.last_update_timestamp_ms,
            record.source_offset,
        )
        assert coord_facts_from_json(r[8]) == coord_facts(record)
        back = CoordinatorRecord.model_validate_json(r[8])
        assert back.model_dump(exclude=_PROVENANCE) == record.model_dump(exclude=_PROVENANCE)


def test_fact_rows_send_progress_to_every_bucket_and_views_to_theirs(spark: SparkSession) -> None:
    facts = spark.createDataFrame(
        [
            (7, "view", "tx-1", "{}", T0, 42),
            (-1, "applied", "__transaction_state", json.dumps({0: 5}), 0, -1),
        ],
        FACT_SCHEMA,
    )
    rows = fact_rows(facts, BUCKETS)
    assert tuple(rows.columns) == STAGE2_INPUT_COLUMNS
    read = rows.collect()
    assert sorted(r.bucket for r in read if r.fact == "applied") == list(range(BUCKETS))
    # the record's place in the coordinator log rides along with the view
    assert [r.log_offset for r in read if r.fact == "view"] == [42]
