"""KIP-664's two metrics as event-time tumbling windows over the snapshots (built-in aggregations: JVM speed): the
Spark form of `detectors.kip664`'s arithmetic, held equal to it by
tests/spark/test_streaming_stages.py::test_windows_agree_with_detectors_kip664. docs/streaming.md, "Windows".
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from detectors.models import DetectionLimits


def open_since(t: Column) -> Column:
    """`detectors.models.open_since_ms` on a column of OpenTransaction structs: the start batch's timestamp when
    it is positive, else LastTimestamp (which may itself be unknown, <= 0), held between the collector's
    `opened_after_ms` and `seen_open_ms` where known (event time cannot age a transaction). Null for a null
    struct."""
    start = t["start_timestamp_ms"]
    recorded = F.when(start > 0, start).otherwise(t["last_timestamp_ms"])
    after, seen = t["opened_after_ms"], t["seen_open_ms"]
    raised = F.when(after.isNotNull() & (after > 0) & (recorded < after), after).otherwise(recorded)
    return F.when(seen.isNotNull() & (seen > 0) & (raised > seen), seen).otherwise(raised)


def aged_since(t: Column) -> Column:
    """`detectors.models.aged_since_ms`: the collector's first sighting of the transaction open when known (a
    lower bound of its age), else `open_since`."""
    seen = t["seen_open_ms"]
    return F.when(seen.isNotNull() & (seen > 0), seen).otherwise(open_since(t))


def age(now: Column, since: Column) -> Column:
    """`detectors.lateness.age_ms`: now - since, 0 when `since` is unknown (<= 0, Kafka's NO_TIMESTAMP is -1)
    or ahead of `now`. Null stays null: a snapshot with nothing open has no transaction to measure."""
    return (
        F.when(since.isNull(), F.lit(None).cast("long"))
        .when((since > 0) & (now > since), now - since)
        .otherwise(F.lit(0))
    )


def late(now: Column, since: Column, threshold: Column) -> Column:
    """`detectors.lateness.is_late`: strictly older than the threshold, never when `since` is unknown."""
    return (since > 0) & (now - since > threshold)


def window_metrics(
    snapshots: DataFrame, limits: DetectionLimits, *, window: str, watermark: str
) -> DataFrame:
    """Snapshots (PartitionSnapshot columns) → one row per (window, leader, topic, partition), update mode."""
    t = F.col("t")
    since = aged_since(t)
    now = F.col("observed_at_ms")
    # detectors.lateness.late_threshold_ms(max_timeout_ms(...), late_buffer_ms)
    threshold = F.coalesce(
        F.col("max_transaction_timeout_ms"), F.lit(limits.default_max_transaction_timeout_ms)
    ) + F.lit(limits.late_buffer_ms)
    rows = (
        snapshots.withColumn("event_time", F.timestamp_millis(F.col("observed_at_ms")))
        .withWatermark("event_time", watermark)
        .select(
            "event_time",
            "observed_at_ms",
            "cluster",
            "leader",
            "topic",
            "partition",
            F.size("open_transactions").alias("open_count"),
            F.explode_outer("open_transactions").alias("t"),
            "max_transaction_timeout_ms",
        )
        .withColumn("duration_ms", age(now, since))
        .withColumn("late", late(now, since, threshold))
    )
    # max(struct(observed_at, ...)) is the partition's newest snapshot in the window; ties (several open
    # transactions in one snapshot) resolve to the longest duration, and a late one wins over a timely one.
    newest = F.max(
        F.struct(
            F.col("observed_at_ms"),
            F.coalesce(F.col("duration_ms"), F.lit(0)).alias("duration_ms"),
            F.coalesce(F.col("late"), F.lit(False)).alias("late"),
            F.col("open_count"),
        )
    )
    return rows.groupBy(
        F.window("event_time", window).alias("window"), "cluster", "leader", "topic", "partition"
    ).agg(
        F.max("duration_ms").alias("window_max_duration_ms"),
        F.max(F.coalesce(F.col("late"), F.lit(False))).alias("window_any_late"),
        newest.alias("newest"),
    )
