"""Row shaping for the reconcile stages: the columns each stateful stage reads, built in the JVM.

Stage 1 gets one row per coordinator record (`coordinator_rows`), stage 2 one row per open transaction and per
collector position (`open_transaction_rows`) unioned with stage 1's facts (`fact_rows`); every row carries the
bucket of its id (`bucket_of`), the stages' grouping key. Column orders: `detectors.tracking`.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from detectors.tracking import STAGE1_INPUT_COLUMNS, STAGE2_INPUT_COLUMNS
from streaming.schemas import COORDINATOR_RECORD_SCHEMA, PARTITION_SNAPSHOT_SCHEMA


def bucket_of(column: str, buckets: int) -> Column:
    """The state bucket of an id column: stable across runs and versions (xxhash64, Spark's fixed seed)."""
    return F.pmod(F.xxhash64(F.col(column)), F.lit(buckets))


_TXN_TYPE = PARTITION_SNAPSHOT_SCHEMA["open_transactions"].dataType.elementType  # type: ignore[attr-defined]


def open_transaction_rows(snapshots: DataFrame, buckets: int) -> DataFrame:
    """One row per open transaction: the columns stage 2 decides on, and a one-transaction PartitionSnapshot
    JSON it parses only to explain a new verdict or plan an abort. Given `sources.good_snapshots_and_positions`,
    each CoordinatorLogPosition also becomes one "position" row per stage-2 bucket (every bucket judges, so every
    bucket needs to know how current the coordinator view is)."""
    if "is_position" not in snapshots.columns:
        snapshots = snapshots.select(
            "*",
            F.lit(False).alias("is_position"),
            F.lit(None).cast("string").alias("position_json"),
            F.lit(None).cast("long").alias("position_as_of_ms"),
        )
    position = F.col("is_position")
    items = F.when(
        position,
        F.transform(
            F.sequence(F.lit(0), F.lit(buckets - 1)),
            lambda b: F.struct(F.lit(None).cast(_TXN_TYPE).alias("t"), b.cast("int").alias("b")),
        ),
    ).otherwise(
        F.transform("open_transactions", lambda t: F.struct(t.alias("t"), F.lit(None).cast("int").alias("b")))
    )
    s = snapshots.select("*", F.explode(items).alias("x")).select("*", F.col("x.t").alias("t"))
    one = F.struct(
        "schema_version",
        "cluster",
        "sweep_id",
        "observed_at_ms",
        "leader",
        "topic",
        "partition",
        F.array("t").alias("open_transactions"),
        "last_stable_offset",
        "high_watermark",
        "max_transaction_timeout_ms",
        "leader_epoch",
    )
    return s.select(
        F.coalesce(F.col("x.b"), bucket_of("t.producer_id", buckets)).alias("bucket"),
        F.coalesce(F.col("t.producer_id"), F.lit(-1)).alias("producer_id"),
        F.when(position, F.lit("position")).otherwise(F.lit("open")).alias("fact"),
        F.lit(None).cast("string").alias("transactional_id"),
        F.col("position_json").alias("record_json"),
        F.col("position_as_of_ms").alias("fact_time_ms"),
        F.lit(None).cast("long").alias("log_offset"),
        "topic",
        "partition",
        F.when(~position, F.to_json(one)).alias("snapshot_json"),
        "observed_at_ms",
        "leader",
        F.col("t.start_offset").alias("start_offset"),
        F.col("t.producer_epoch").alias("producer_epoch"),
        F.col("t.start_batch_producer_epoch").alias("start_batch_producer_epoch"),
        F.col("t.start_timestamp_ms").alias("start_timestamp_ms"),
        F.col("t.last_timestamp_ms").alias("last_timestamp_ms"),
        F.col("t.opened_after_ms").alias("opened_after_ms"),
        F.col("t.seen_open_ms").alias("seen_open_ms"),
        "max_transaction_timeout_ms",
        (F.col("high_watermark") - F.col("last_stable_offset")).alias("lso_lag"),
        F.col("t.start_batch_leader_epoch").alias("start_batch_leader_epoch"),
        "leader_epoch",
    )


def fact_rows(facts: DataFrame, buckets: int) -> DataFrame:
    """Stage 1's facts as stage-2 rows: a fact about a producer id goes to its bucket; an "applied" fact (how far
    the coordinator topics were read) and an "undecodable" one (records read whose content is lost) to every
    bucket."""
    none = {c: F.lit(None).cast("long") for c in STAGE2_INPUT_COLUMNS[7:]}
    none.update(topic=F.lit(None).cast("string"), snapshot_json=F.lit(None).cast("string"))
    # every bucket judges against the whole view
    everywhere = F.col("fact").isin("applied", "undecodable", "read")
    targets = F.when(everywhere, F.sequence(F.lit(0), F.lit(buckets - 1))).otherwise(
        F.array(bucket_of("producer_id", buckets).cast("int"))
    )
    return facts.select("*", F.explode(targets).alias("target")).select(
        F.col("target").cast("long").alias("bucket"),
        "producer_id",
        "fact",
        "transactional_id",
        "record_json",
        "fact_time_ms",
        "log_offset",
        *[none[c].alias(c) for c in STAGE2_INPUT_COLUMNS[7:]],
    )


# Where a record was read from: not part of the coordinator's view (stage 2 keeps one view per producer id, so
# every byte left out is a byte less to rewrite per batch; the model's defaults fill them back in).
_PROVENANCE = {"schema_version", "source_partition", "source_offset", "source_timestamp_ms", "origin"}


def coordinator_rows(records: DataFrame, buckets: int) -> DataFrame:
    """Stage 1's input: the columns its rule reads, and the record as JSON (built here, in the JVM)."""
    record = F.struct(*[F.col(f.name) for f in COORDINATOR_RECORD_SCHEMA.fields if f.name not in _PROVENANCE])
    for name, kind in (
        ("read_topic", "string"),
        ("read_partition", "long"),
        ("read_offset", "long"),
        ("read_after", "long"),
    ):
        if name not in records.columns:  # records without where they were read: no progress to report
            records = records.withColumn(name, F.lit(None).cast(kind))
    return records.select(
        bucket_of("transactional_id", buckets).alias("bucket"),
        *STAGE1_INPUT_COLUMNS[1:8],
        F.to_json(record, {"ignoreNullFields": "false"}).alias("record_json"),
        *STAGE1_INPUT_COLUMNS[9:],
    )
