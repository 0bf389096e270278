"""End to end on the job: a KIP-939 two-phase-commit transaction, in `__transaction_state` records encoded the way
Kafka writes them, is labelled two-phase commit and never COORDINATOR_OVERDUE, however old.

A real 2PC transaction cannot be made on the Kafka 4.3.1 test bed: the Java producer's 2PC API was reverted
(KAFKA-19414) and InitProducerId with keepPreparedTxn answers UNSUPPORTED_VERSION. So the coordinator's records are
made by hand with the codec (TransactionLogValue v1, as `TransactionLog.valueToBytes` writes it, with the timeout
`TransactionCoordinator.handleInitProducerId` stores for a 2PC producer: Integer.MAX_VALUE) into a copy of the
transaction log the job reads (`--transaction-log-topic`; clients cannot write `__transaction_state`), beside
hand-made leader snapshots and a collector position that shows the view current. Both transactions opened 30 days
ago (2147483647 ms is 24.9 days): the plain one (60 s timeout) is COORDINATOR_OVERDUE, which shows the rule is live
on this view; the 2PC one is LATE with the 2PC label on /metrics, in the late split and in its explanation.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import NewTopic
from pyspark.sql import SparkSession
from test_stream_e2e import Console, scrape, wait_for

from common.settings import KafkaSettings, Settings, StreamSettings
from common.topics import TopicSettings
from detectors.codec import TxnLogKey, TxnLogValue, TxnStatus, encode_key, encode_value
from detectors.contract import (
    COORDINATOR_LOG_POSITION_TYPE,
    SNAPSHOT_TYPE,
    TYPE_HEADER,
    position_key,
    snapshot_key,
)
from detectors.models import (
    TWO_PHASE_COMMIT_TIMEOUT_MS,
    CoordinatorLogPosition,
    OpenTransaction,
    PartitionSnapshot,
)
from streaming import job

pytestmark = pytest.mark.e2e

DAY_MS = 24 * 3_600_000
TOPIC = "orders"
TWO_PC_PID, PLAIN_PID = 4_200, 4_300  # on orders-0 and orders-1


def log_value(producer_id: int, timeout_ms: int, partition: int, since_ms: int) -> bytes:
    """An Ongoing TV2 transaction listing orders-<partition> (a prepared 2PC one looks the same: Ongoing)."""
    return encode_value(
        TxnLogValue(
            version=1,
            producer_id=producer_id,
            producer_epoch=0,
            transaction_timeout_ms=timeout_ms,
            status=TxnStatus.ONGOING,
            partitions=((TOPIC, (partition,)),),
            last_update_timestamp_ms=since_ms,
            start_timestamp_ms=since_ms,
            client_transaction_version=2,
        )
    )


def snapshot(cluster: str, partition: int, producer_id: int, since_ms: int, now_ms: int) -> PartitionSnapshot:
    txn = OpenTransaction(
        producer_id=producer_id,
        producer_epoch=0,
        start_offset=0,
        start_timestamp_ms=since_ms,
        start_batch_producer_epoch=0,
        last_timestamp_ms=since_ms,
    )
    return PartitionSnapshot(
        cluster=cluster,
        sweep_id=uuid.uuid4().hex,
        observed_at_ms=now_ms,
        leader=1,
        topic=TOPIC,
        partition=partition,
        open_transactions=(txn,),
        last_stable_offset=0,
        high_watermark=5,
        max_transaction_timeout_ms=900_000,
    )


def value(metrics: dict, name: str, **labels: str) -> float:
    return sum(v for lb, v in metrics.get(name, []) if all(lb.get(k) == x for k, x in labels.items()))


def test_a_two_phase_commit_transaction_is_labelled_and_never_overdue(
    spark: SparkSession, bootstrap: str, unique: str, tmp_path: Path
) -> None:
    cluster, log_copy = "e2e-2pc", f"{unique}txnlog-copy"
    settings = Settings(
        cluster=cluster,
        kafka=KafkaSettings(bootstrap_servers=bootstrap),
        topics=TopicSettings(prefix=f"{unique}txnwatch"),
        stream=StreamSettings(
            checkpoint_location=str(tmp_path / "ck"),
            trigger="2 seconds",
            starting_offsets="earliest",
            transaction_log_topic=log_copy,
            metrics_port=0,
            state_buckets=2,
        ),
    )
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(log_copy, 1, 1), NewTopic(settings.topics.producer_state, 1, 1)])
    admin.close()
    since = int(time.time() * 1000) - 30 * DAY_MS
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    for tid, pid, timeout, partition in (
        ("tx-2pc", TWO_PC_PID, TWO_PHASE_COMMIT_TIMEOUT_MS, 0),
        ("tx-plain", PLAIN_PID, 60_000, 1),
    ):
        producer.send(
            log_copy, key=encode_key(TxnLogKey(tid)), value=log_value(pid, timeout, partition, since)
        )
    producer.flush()

    def publish_sweep() -> None:
        """What one collector sweep publishes: the two leaders' snapshots, then the log's measured end (2)."""
        now = int(time.time() * 1000)
        for partition, pid in ((0, TWO_PC_PID), (1, PLAIN_PID)):
            producer.send(
                settings.topics.producer_state,
                key=snapshot_key(TOPIC, partition),
                value=snapshot(cluster, partition, pid, since, now).model_dump_json().encode(),
                headers=[(TYPE_HEADER, SNAPSHOT_TYPE.encode())],
            )
        position = CoordinatorLogPosition(
            cluster=cluster, sweep_id="s", topic=log_copy, partitions=1, as_of_ms=now + 1, end_offsets={0: 2}
        )
        producer.send(
            settings.topics.producer_state,
            key=position_key(log_copy),
            value=position.model_dump_json().encode(),
            headers=[(TYPE_HEADER, COORDINATOR_LOG_POSITION_TYPE.encode())],
        )
        producer.flush()

    publish_sweep()
    console = Console()
    opts = job.StreamOptions(
        settings=settings, kafka_options={"bootstrap.servers": bootstrap}, secondary_trigger="2 seconds"
    )
    running = job.start(spark, opts, out=console, queries=("reconcile", "windows"))
    try:

        def judged() -> dict | None:
            publish_sweep()  # the collector keeps sweeping: the transactions stay confirmed open
            m = scrape(running.metrics_port)
            assert running.failed() is None, running.failed()
            overdue = value(m, "txnwatch_open_transactions", kind="COORDINATOR_OVERDUE")
            late_split = value(m, "txnwatch_late_partitions")
            return (
                m
                if overdue + value(m, "txnwatch_open_transactions", kind="LATE") >= 2 and late_split
                else None
            )

        m = wait_for(judged, 240, "both transactions judged and the windows counted", poll_s=2.0)
        # The plain transaction: the coordinator should have aborted it long ago (the rule is live here).
        assert (
            value(m, "txnwatch_open_transactions", kind="COORDINATOR_OVERDUE", two_phase_commit="false") == 1
        )
        # The 2PC one: LATE (KIP-664's definition), labelled, never COORDINATOR_OVERDUE.
        assert (
            value(m, "txnwatch_open_transactions", kind="COORDINATOR_OVERDUE", two_phase_commit="true") == 0
        )
        assert value(m, "txnwatch_open_transactions", kind="LATE", two_phase_commit="true") == 1
        # The overdue alert's series names the overdue transaction's partition and transactional id, and only it.
        ((labels, opened),) = m["txnwatch_coordinator_overdue_transaction_open_since_timestamp_seconds"]
        assert labels == {
            "cluster": cluster,
            "topic": TOPIC,
            "partition": "1",
            "transactional_id": "tx-plain",
        }
        assert abs(opened - since / 1000) < 60  # when it opened, within the snapshots' delay
        # KIP-664's count keeps both late partitions; the split lets the late alert leave the 2PC one out.
        assert value(m, "txnwatch_partitions_with_late_transactions", broker="1") == 2
        assert value(m, "txnwatch_late_partitions", broker="1", two_phase_commit="true") == 1
        assert value(m, "txnwatch_late_partitions", broker="1", two_phase_commit="false") == 1
        lines = [ln for ln in console.lines if f"producer {TWO_PC_PID} " in ln]
        assert lines and all(not ln.startswith("COORDINATOR_OVERDUE") for ln in lines), lines
        assert any(ln.startswith("LATE") and "two-phase commit: no timeout" in ln for ln in lines), lines
    finally:
        running.stop()
        producer.close()
