"""benchmarks/bench_stage2.py shapes stage 2's input in plain Python (it runs without a JVM): its rows must be the
rows the job's Spark code builds (streaming/sources.py's parse, streaming/rows.py) from the same Kafka records, as
stage 2 reads them. Otherwise the benchmark measures a stage 2 the job does not run."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

from benchmarks import bench_stage2
from benchmarks.bench_stream import (
    SNAPSHOT_HEADERS,
    position_record,
    snapshot_coordinator_records,
    snapshot_records,
)
from detectors.tracking import FACT_COLUMNS, STAGE2_INPUT_COLUMNS
from streaming.reconcile import FACT_SCHEMA, _columns
from streaming.rows import fact_rows, open_transaction_rows
from streaming.sources import good_snapshots_and_positions, parse_snapshots

pytestmark = pytest.mark.spark

T0 = 1_732_000_000_000
BUCKETS = bench_stage2.BUCKETS
SNAPSHOT_JSON = STAGE2_INPUT_COLUMNS.index("snapshot_json") - 1  # in a row without its bucket


def _as_stage_reads(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Rows without their bucket (the job hashes producer ids, the benchmark takes them mod the bucket count),
    the snapshot JSON parsed (key order and spacing are no difference to stage 2), sorted."""
    out = []
    for row in rows:
        values = list(row[1:])
        if values[SNAPSHOT_JSON] is not None:
            values[SNAPSHOT_JSON] = json.loads(values[SNAPSHOT_JSON])
        out.append(tuple(values))
    return sorted(out, key=repr)


def _spark_reads(df: DataFrame) -> list[tuple[Any, ...]]:
    # through Arrow → pandas → `_columns`, as stage 2 gets them (nullable longs as floats)
    columns = _columns(iter([df.select(*STAGE2_INPUT_COLUMNS).toArrow().to_pandas()]), STAGE2_INPUT_COLUMNS)
    return _as_stage_reads(list(zip(*columns, strict=True)))


def _bench_reads(rows: list[list[Any]]) -> list[tuple[Any, ...]]:
    types = bench_stage2.stage2_arrow_types()
    batches = bench_stage2._arrow_batches(rows, types, BUCKETS).values()
    reads: list[tuple[Any, ...]] = []
    for batch in batches:
        if batch.num_rows:
            reads.extend(zip(*_columns(iter([batch.to_pandas()]), STAGE2_INPUT_COLUMNS), strict=True))
    return _as_stage_reads(reads)


def test_the_benchmarks_open_transaction_and_position_rows_are_the_jobs(spark: SparkSession) -> None:
    ends = {p: p % 3 for p in range(bench_stage2.LOG_PARTITIONS)}
    after_sweep = position_record(bench_stage2.LOG_TOPIC, bench_stage2.LOG_PARTITIONS, ends)
    records = list(snapshot_records(12, 2, 4, 5_000, 7, "bench", t0_ms=T0, after_sweep=after_sweep))
    kafka = [
        (
            r[0],
            r[1],
            "producer-state",
            0,
            offset,
            [(k, v) for k, v in (r[2] if len(r) == 3 else SNAPSHOT_HEADERS)],
        )
        for offset, r in enumerate(records)
    ]
    raw = spark.createDataFrame(
        kafka,
        "key binary, value binary, topic string, partition int, offset long, "
        "headers array<struct<key: string, value: binary>>",
    )
    job = open_transaction_rows(good_snapshots_and_positions(parse_snapshots(raw)), BUCKETS)
    bench: list[list[Any]] = []
    for r in records:
        if len(r) == 3:
            bench.extend(bench_stage2.position_rows(r[1], BUCKETS))
        else:
            bench.extend(bench_stage2.open_rows(r[1], BUCKETS))
    assert {row[STAGE2_INPUT_COLUMNS.index("fact")] for row in bench} == {"open", "position"}
    assert _bench_reads(bench) == _spark_reads(job)


def test_the_benchmarks_fact_rows_are_the_jobs(spark: SparkSession) -> None:
    facts, _ = bench_stage2.coordinator_facts(snapshot_coordinator_records(12, 4, T0, 3_600_000, "bench"), T0)
    assert {f[FACT_COLUMNS.index("fact")] for f in facts} >= {"view", "applied"}
    job = fact_rows(spark.createDataFrame([tuple(f) for f in facts], FACT_SCHEMA), BUCKETS)
    assert _bench_reads(bench_stage2.fact_rows(facts, BUCKETS)) == _spark_reads(job)
