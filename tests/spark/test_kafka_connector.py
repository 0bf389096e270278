"""Spark's Kafka connector from the jar cache works with the installed pyspark against the real broker.

Spark 4.3.0's Maven artifacts are not on Maven Central, so dev/jvm/spark resolves the 4.2.0 connector (and the
4.0.0 token provider, the newest published); these tests are the proof that the set works with pyspark 4.3.
They also settle the first streaming risk: can Spark's Kafka source read `__transaction_state` at all?
"""

from __future__ import annotations

import pytest
from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import NewTopic
from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark


def _produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(topic, 2, 1)])
    admin.close()
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    for i, v in enumerate(values):
        producer.send(topic, v, key=str(i).encode(), partition=i % 2)
    producer.flush()
    producer.close()


def test_streaming_read_and_write_through_the_connector(
    spark: SparkSession, bootstrap: str, unique: str, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    src, dst = f"{unique}in", f"{unique}out"
    _produce(bootstrap, src, [f"v{i}".encode() for i in range(10)])
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(dst, 1, 1)])
    admin.close()
    stream = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", src)
        .option("startingOffsets", "earliest")
        .load()
    )
    query = (
        stream.selectExpr("key", "upper(cast(value as string)) as value")
        .writeStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", dst)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .start()
    )
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    out = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", dst)
        .option("startingOffsets", "earliest")
        .load()
        .selectExpr("cast(value as string) as v")
        .collect()
    )
    assert sorted(r.v for r in out) == sorted(f"V{i}" for i in range(10))


def test_only_the_consumer_based_offset_reader_sees_transaction_state(
    spark: SparkSession, bootstrap: str, unique: str
) -> None:
    # Make sure __transaction_state exists and has records: one committed transaction.
    producer = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"{unique}conn")
    producer.init_transactions()
    producer.begin_transaction()
    _produce(bootstrap, f"{unique}txn", [])
    producer.send(f"{unique}txn", b"x", partition=0).get(timeout=30)
    producer.commit_transaction()
    producer.close()
    # Spark's AdminClient-based offset reader drops internal topics (ConsumerStrategy.retrieveAllPartitions
    # filters isInternal): a batch read of __transaction_state returns nothing although it has records.
    # The consumer-based reader, which the job turns on (streaming.job.spark_conf), reads them.
    key = "spark.sql.streaming.kafka.useDeprecatedOffsetFetching"
    chosen = spark.conf.get(key)

    def count() -> int:
        return (
            spark.read.format("kafka")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", "__transaction_state")
            .option("startingOffsets", "earliest")
            .load()
            .count()
        )

    try:
        spark.conf.set(key, "false")
        assert count() == 0
        spark.conf.set(key, "true")
        assert count() > 0
    finally:
        spark.conf.set(key, chosen)
