"""The coordinator topics are decoded in as many Spark tasks as asked (`sources.in_tasks`), not one per Kafka
partition, and what the decoders work out per partition is the same either way: offsets in order, where the
reading broke (`kafka_read_after`), and which records the compaction keeps (`run_ends`)."""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from detectors.codec import TxnLogKey, TxnLogValue, TxnStatus, encode_key, encode_value
from streaming import sources

NOW = 1_700_000_000_000
PARTITIONS = 8


def _record(tid: str, pid: int, status: TxnStatus, ms: int) -> tuple[bytes, bytes]:
    value = TxnLogValue(
        version=1,
        producer_id=pid,
        producer_epoch=0,
        transaction_timeout_ms=60_000,
        status=status,
        partitions=(("orders", (0,)),) if status != TxnStatus.EMPTY else (),
        last_update_timestamp_ms=ms,
        start_timestamp_ms=ms - 10,
        client_transaction_version=2,
    )
    return encode_key(TxnLogKey(tid)), encode_value(value)


def _log(spark: SparkSession) -> DataFrame:
    """Eight Kafka partitions as eight Spark partitions, each in offset order (as Kafka's source reads them):
    two ids per partition with two whole transactions each, and a gap (compacted-away offsets) in partition 3."""
    rows = []
    for partition in range(PARTITIONS):
        offset = 0
        for n in range(2):
            tid, pid = f"tx-{partition}-{n}", 1000 * partition + n
            for status in (TxnStatus.ONGOING, TxnStatus.PREPARE_COMMIT, TxnStatus.COMPLETE_COMMIT) * 2:
                if partition == 3 and offset == 2:
                    offset += 5  # the cleaner removed offsets 2-6
                key, value = _record(tid, pid, status, NOW + offset)
                rows.append((key, value, "__transaction_state", partition, offset, NOW + offset))
                offset += 1
    raw = spark.createDataFrame(
        spark.sparkContext.parallelize(rows, PARTITIONS),
        "key binary, value binary, topic string, partition int, offset long, ms long",
    )
    return raw.withColumn("timestamp", F.timestamp_millis("ms")).drop("ms")


def _decoded(df: DataFrame) -> set[tuple[object, ...]]:
    return {
        (r.kafka_partition, r.kafka_offset, r.kafka_read_after, r.transactional_id, r.state)
        for r in df.collect()
    }


def test_the_log_is_decoded_in_the_tasks_asked_with_the_same_rows(spark: SparkSession) -> None:
    raw = _log(spark)
    assert raw.rdd.getNumPartitions() == PARTITIONS
    per_partition = sources.decode_transaction_log(raw, compact=True)
    coalesced = sources.decode_transaction_log(raw, compact=True, tasks=2)
    assert per_partition.rdd.getNumPartitions() == PARTITIONS
    assert coalesced.rdd.getNumPartitions() == 2
    rows = _decoded(coalesced)
    assert rows == _decoded(per_partition)
    # What the decoders work out per partition survived the coalesce: the first row of each partition was read
    # after nothing (-1), the gap in partition 3 is seen, and each id keeps its first record, its last Prepare and
    # its last record (run_ends: the rest would be overwritten).
    assert {(p, o, a) for p, o, a, _, _ in rows if a is not None} == {
        (p, 0, -1) for p in range(PARTITIONS)
    } | {(3, 7, 1)}
    assert sorted(o for p, o, _, _, _ in rows if p == 0) == [0, 4, 5, 6, 10, 11]
    assert sources.decode_transaction_log(raw, tasks=PARTITIONS * 2).rdd.getNumPartitions() == PARTITIONS
