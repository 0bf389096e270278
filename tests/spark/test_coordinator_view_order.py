"""The job's coordinator view on real Spark and the real broker, fed hand-made `__transaction_state` records through
its `transaction_log_topic` (clients cannot write the real one): the view follows the log's order, not the
coordinator's clock, and keeps a transaction in progress while its partition goes unreported (issue 20)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.admin import NewTopic
from pyspark.sql import SparkSession

from common.settings import KafkaSettings, Settings, StreamSettings
from common.topics import TopicSettings
from detectors.codec import TxnLogKey, TxnLogValue, TxnStatus, encode_key, encode_value
from detectors.contract import COORDINATOR_LOG_POSITION_TYPE, SNAPSHOT_TYPE, TYPE_HEADER, snapshot_key
from detectors.models import CoordinatorLogPosition, DetectionLimits, OpenTransaction, PartitionSnapshot
from streaming import job

pytestmark = pytest.mark.spark

EXPIRE_MS = 8_000  # the job forgets an open transaction no snapshot confirmed for this long
VIEW_TTL_MS = 3_000  # ... and, before issue 20, the view of its producer id soon after
TWO_PC_TIMEOUT_MS = 2**31 - 1  # what the coordinator stores for a KIP-939 transaction: no timeout


def _now() -> int:
    return int(time.time() * 1000)


def _wait_for(predicate: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = predicate()
        if result:
            return result
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


class Bed:
    """A job reading a one-partition copy of the transaction log and hand-made collector output."""

    def __init__(self, spark: SparkSession, bootstrap: str, ck: Path) -> None:
        self.bootstrap = bootstrap
        prefix = f"ord{uuid.uuid4().hex[:8]}"
        self.log = f"{prefix}-txnlog"
        self.data = f"{prefix}-data"  # the partitions the hand-made snapshots report on (never written)
        self.settings = Settings(
            cluster="c",
            kafka=KafkaSettings(bootstrap_servers=bootstrap),
            topics=TopicSettings(prefix=prefix),
            detection=DetectionLimits(grace_ms=1_000, clock_skew_ms=500),
            stream=StreamSettings(
                checkpoint_location=str(ck),
                trigger="1 second",
                starting_offsets="earliest",
                transaction_log_topic=self.log,
                expire_after_ms=EXPIRE_MS,
                view_ttl_ms=VIEW_TTL_MS,
                state_buckets=2,
                metrics_port=0,
            ),
        )
        admin = KafkaAdminClient(bootstrap_servers=bootstrap)
        admin.create_topics([NewTopic(self.log, 1, 1), NewTopic(self.settings.topics.producer_state, 1, 1)])
        admin.close()
        self.producer = KafkaProducer(bootstrap_servers=bootstrap)
        self.offsets = 0  # records written to the log copy
        self.published = 0  # records written to the snapshot topic
        opts = job.StreamOptions(settings=self.settings, kafka_options={"bootstrap.servers": bootstrap})
        job.ensure_topics(opts, self.settings.kafka.client_kwargs())
        self.running = job.start(spark, opts, out=None, queries=("reconcile",))
        self.query = self.running.queries[0]

    def coordinator_record(self, transactional_id: str, value: TxnLogValue) -> None:
        self.producer.send(self.log, key=encode_key(TxnLogKey(transactional_id)), value=encode_value(value))
        self.producer.flush()
        self.offsets += 1

    def sweep(self, *opens: tuple[int, int, int]) -> None:
        """What one collector sweep publishes: the open transactions (producer id, partition, open since) and
        then the position of the log copy, measured after them."""
        observed = _now()
        for pid, partition, since in opens:
            txn = OpenTransaction(
                producer_id=pid,
                producer_epoch=0,
                start_offset=7,
                start_timestamp_ms=since,
                start_batch_producer_epoch=0,
                last_timestamp_ms=since,
            )
            snap = PartitionSnapshot(
                cluster="c",
                sweep_id="s",
                observed_at_ms=observed,
                leader=1,
                topic=self.data,
                partition=partition,
                open_transactions=(txn,),
                last_stable_offset=7,
                high_watermark=9,
                max_transaction_timeout_ms=900_000,
            )
            self._publish(snapshot_key(self.data, partition), snap.model_dump_json(), SNAPSHOT_TYPE)
        position = CoordinatorLogPosition(
            cluster="c",
            sweep_id="s",
            topic=self.log,
            partitions=1,
            as_of_ms=_now(),
            end_offsets={0: self.offsets},
        )
        self._publish(b"position", position.model_dump_json(), COORDINATOR_LOG_POSITION_TYPE)
        self.producer.flush()

    def _publish(self, key: bytes, value: str, kind: str) -> None:
        topic = self.settings.topics.producer_state
        self.producer.send(topic, key=key, value=value.encode(), headers=[(TYPE_HEADER, kind.encode())])
        self.published += 1

    def read_all(self) -> None:
        """Wait until a finished reconcile batch has read every record published so far. The job runs a batch only
        when a source has new records (`spark.sql.streaming.noDataMicroBatches.enabled` off), so waiting for a
        number of batches would wait for ever once everything is read."""
        wanted = {self.log: self.offsets, self.settings.topics.producer_state: self.published}
        _wait_for(lambda: self._read() == wanted, 120, f"the reconcile query to read {wanted}")

    def _read(self) -> dict[str, int]:
        """Records of each source topic read by the last finished batch (every topic here has one partition)."""
        assert self.running.failed() is None, self.running.failed()
        progress = self.query.lastProgress
        read: dict[str, int] = {}
        for source in progress["sources"] if progress else ():
            end = source["endOffset"]
            for topic, offsets in (json.loads(end) if isinstance(end, str) else end).items():
                read[topic] = read.get(topic, 0) + sum(int(v) for v in offsets.values())
        return read

    def verdict(self, pid: int, partition: int) -> Any:
        return self.running.live.verdicts.get((self.data, partition, pid))

    def candidates(self) -> list[Any]:
        consumer = KafkaConsumer(
            self.settings.topics.abort_candidates,
            bootstrap_servers=self.bootstrap,
            auto_offset_reset="earliest",
            consumer_timeout_ms=3_000,
        )
        try:
            return [r for r in consumer if self.data.encode() in (r.value or b"")]
        finally:
            consumer.close()

    def stop(self) -> None:
        self.running.stop()
        self.producer.close()


@pytest.fixture
def bed(spark: SparkSession, bootstrap: str, tmp_path: Path) -> Iterator[Bed]:
    b = Bed(spark, bootstrap, tmp_path / "ck")
    try:
        yield b
    finally:
        b.stop()


def ongoing(
    pid: int, partitions: tuple[int, ...], *, start_ms: int, updated_ms: int, topic: str
) -> TxnLogValue:
    return TxnLogValue(
        version=1,
        producer_id=pid,
        producer_epoch=0,
        transaction_timeout_ms=TWO_PC_TIMEOUT_MS,
        status=TxnStatus.ONGOING,
        partitions=((topic, partitions),),
        last_update_timestamp_ms=updated_ms,
        start_timestamp_ms=start_ms,
        previous_producer_id=pid,  # what Kafka 4.3 writes on every transition that keeps the producer id
        client_transaction_version=2,
    )


def test_the_view_follows_the_log_not_the_coordinators_clock_and_outlives_an_unreported_partition(
    bed: Bed,
) -> None:
    t0 = _now()
    moved, held = 9_100_001, 9_100_002
    # 1. A transaction of "moved" is Ongoing on partition 0; a 2PC transaction of "held" is Ongoing on 2.
    bed.coordinator_record(
        "moved", ongoing(moved, (0,), start_ms=t0 - 30_000, updated_ms=t0 - 30_000, topic=bed.data)
    )
    bed.coordinator_record(
        "held", ongoing(held, (2,), start_ms=t0 - 60_000, updated_ms=t0 - 60_000, topic=bed.data)
    )
    # Both reported from the start: a view is never left without an open transaction of its producer id.
    bed.sweep((moved, 0, t0 - 25_000), (held, 2, t0 - 50_000))
    bed.read_all()
    # 2. Its coordinator moved to a broker whose clock is 90 s behind: the record adding partition 1 is later in
    #    the log and stamped earlier than the one before it.
    bed.coordinator_record(
        "moved", ongoing(moved, (0, 1), start_ms=t0 - 30_000, updated_ms=t0 - 120_000, topic=bed.data)
    )
    bed.read_all()
    # 3. Leaders report both transactions open, twice (past the grace), with the log measured after each sweep.
    for _ in range(3):  # the third past the grace since the first: judged then
        bed.sweep((moved, 0, t0 - 25_000), (moved, 1, t0 - 20_000), (held, 2, t0 - 50_000))
        bed.read_all()
        time.sleep(1.5)
    kinds = {
        pid: (bed.verdict(pid, p).kind, bed.verdict(pid, p).reason) for pid, p in ((moved, 1), (held, 2))
    }
    assert kinds == {moved: ("OPEN", None), held: ("OPEN", None)}
    # 4. Partition 2's leader restarts: it goes unreported past the expiry (the collector keeps measuring the
    #    log and reporting partitions 0 and 1). Its open entry is forgotten; its view must not be.
    gone_by = time.monotonic() + (EXPIRE_MS + VIEW_TTL_MS) / 1000 + 4
    while time.monotonic() < gone_by or bed.verdict(held, 2) is not None:
        assert time.monotonic() < gone_by + 60, "the unreported transaction was never forgotten"
        bed.sweep((moved, 0, t0 - 25_000), (moved, 1, t0 - 20_000))
        time.sleep(1)
    # 5. Reported again: still the coordinator's, not HANGING no-coordinator-state.
    for _ in range(3):  # the third past the grace since the first: judged then
        bed.sweep((moved, 0, t0 - 25_000), (moved, 1, t0 - 20_000), (held, 2, t0 - 50_000))
        bed.read_all()
        time.sleep(1.5)
    verdicts = {pid: bed.verdict(pid, p) for pid, p in ((moved, 1), (held, 2))}
    assert {pid: (v.kind, v.reason) for pid, v in verdicts.items()} == {
        moved: ("OPEN", None),
        held: ("OPEN", None),
    }
    assert bed.candidates() == []  # never HANGING: no abort candidate was ever opened
