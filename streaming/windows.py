"""KIP-664's two metrics as event-time tumbling windows over the snapshots (built-in aggregations: JVM speed).

Per (window, partition): the longest open transaction (MaxActiveTransactionDuration), whether any open
transaction is late, how many were open in the partition's latest snapshot of the window. The exporter turns the
newest window of each partition into gauges and counts late partitions per broker and for the cluster.
The arithmetic mirrors detectors.lateness (tests/spark/test_windows.py checks them against each other).
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from detectors.models import DetectionLimits


def window_metrics(
    snapshots: DataFrame, limits: DetectionLimits, *, window: str, watermark: str
) -> DataFrame:
    """Snapshots (PartitionSnapshot columns) → one row per (window, leader, topic, partition), update mode."""
    t = F.col("t")
    since = F.coalesce(t["start_timestamp_ms"], t["last_timestamp_ms"])
    threshold = F.coalesce(
        F.col("max_transaction_timeout_ms"), F.lit(limits.default_max_transaction_timeout_ms)
    )
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
        .withColumn("duration_ms", F.greatest(F.col("observed_at_ms") - since, F.lit(0)))
        .withColumn("late", F.col("duration_ms") > threshold + F.lit(limits.late_buffer_ms))
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
