"""Compaction of `__transaction_state` under a lagging reader, on a real broker whose cleaner runs every 100 ms over
segments rolled every 300 ms (Kafka's defaults are 100 MB segments; the cleaner does the same to any rolled segment
once a later record of the same transactional id exists: `min.compaction.lag.ms` is 0).

A transactional id commits one transaction, opens a second one on a partition, and the collector sweeps: the
leader reports the transaction open and the collector measures the log's end (the position the job would judge
it against). The transaction then commits and the id runs more transactions, so the cleaner removes the second
transaction's Ongoing record, below that end. A job that reads the log only now reaches the end with that record
missing. The real decoder (`streaming.sources.decode_batches`) marks where its reading broke, stage 1 reports it
(`detectors.tracking.read_facts`), and the view (`detectors.currency.ViewCurrency`) no longer lets the position
measured before the read vouch: before it did, and the view "current" at that position held no Ongoing record of
the id (the pure story through stage 2 and its HANGING verdict: tests/unit/test_compaction_gaps.py)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic

from admin.collect.collector import Collector
from admin.wire.kafka_wire import KafkaWire
from common.settings import CollectorSettings
from detectors.currency import ViewCurrency, coordinator_partition
from detectors.tracking import applied_facts, read_facts
from dev.kafka import Cluster, TestBedConfig, start_cluster, stop_cluster
from streaming.sources import decode_batches

pytestmark = pytest.mark.broker

LOG = "__transaction_state"
PARTITIONS = 3


@pytest.fixture(scope="module")
def compacting(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    state: Path = tmp_path_factory.mktemp("compacting")
    cluster = start_cluster(
        TestBedConfig(
            extra={
                "log.roll.ms": "300",
                "log.cleaner.backoff.ms": "100",
                "log.cleaner.min.cleanable.ratio": "0.01",
                "log.segment.delete.delay.ms": "100",
            }
        ),
        state,
    )
    try:
        yield cluster
    finally:
        stop_cluster(state)


def _log_records(
    bootstrap: str, partition: int, end: int | None = None
) -> list[tuple[bytes, bytes | None, int, int]]:
    """The partition's records below `end` (default: its end now) as a reader sees them now: (key, value, offset,
    timestamp)."""
    tp = TopicPartition(LOG, partition)
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    consumer.assign([tp])
    if end is None:
        end = consumer.end_offsets([tp])[tp]
    consumer.seek_to_beginning(tp)
    out: list[tuple[bytes, bytes | None, int, int]] = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and consumer.position(tp) < end:
        for records in consumer.poll(timeout_ms=500).values():
            out += [(r.key, r.value, r.offset, r.timestamp) for r in records if r.offset < end]
    consumer.close()
    return out


def _decoded(records: list[tuple[bytes, bytes | None, int, int]], partition: int) -> pa.RecordBatch:
    """The records through the job's own decoder, as one Arrow batch of the Kafka source's columns."""
    batch = pa.RecordBatch.from_pydict(
        {
            "key": pa.array([r[0] for r in records], pa.binary()),
            "value": pa.array([r[1] for r in records], pa.binary()),
            "topic": pa.array([LOG] * len(records), pa.string()),
            "partition": pa.array([partition] * len(records), pa.int32()),
            "offset": pa.array([r[2] for r in records], pa.int64()),
            "ts_ms": pa.array([r[3] for r in records], pa.int64()),
        }
    )
    (out,) = list(decode_batches(iter([batch]), compact=True))
    return out


def test_a_position_measured_before_the_cleaner_removed_a_record_below_it_does_not_vouch(
    compacting: Cluster, unique: str
) -> None:
    bootstrap = compacting.bootstrap_servers
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    topic, tid = f"{unique}orders", f"{unique}tx"
    admin.create_topics([NewTopic(topic, 1, 1)])
    partition = coordinator_partition(tid, PARTITIONS)
    producer = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=tid)
    producer.init_transactions()
    producer.begin_transaction()
    producer.send(topic, b"first", partition=0).get(timeout=10)
    producer.commit_transaction()
    time.sleep(0.5)
    producer.begin_transaction()
    producer.send(topic, b"second", partition=0).get(timeout=10)
    # The leader reports the second transaction open; the collector measures the transaction log's end after.
    collector = Collector(
        KafkaWire(admin, request_timeout_ms=5_000),
        cluster="test",
        settings=CollectorSettings(retry_backoff_ms=100, request_timeout_ms=5_000),
        open_partitions=set(),
    )
    sweep = collector.sweep()
    (snap,) = [s for s in sweep.snapshots if s.topic == topic]
    assert snap.open_transactions, "the second transaction is open"
    (position,) = sweep.positions
    end = position.end_offsets[partition]
    ongoing_below_end = [r[2] for r in _log_records(bootstrap, partition, end)]
    producer.commit_transaction()
    # More transactions of the same id: every record below them is superseded; segments roll every 300 ms.
    for i in range(12):
        time.sleep(0.4)
        producer.begin_transaction()
        producer.send(topic, b"more %d" % i, partition=0).get(timeout=10)
        producer.commit_transaction()
    producer.close()
    deadline = time.monotonic() + 30
    while True:
        now_below_end = [r[2] for r in _log_records(bootstrap, partition, end)]
        if len(now_below_end) < len(ongoing_below_end) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    admin.close()
    assert len(now_below_end) < len(ongoing_below_end), (
        f"the cleaner removed nothing below {end}: {ongoing_below_end}"
    )

    # The job reads the log only now, with its own decoder, as far as it goes (past the position's end).
    records = _log_records(bootstrap, partition)
    read_at_ms = int(time.time() * 1000)
    decoded = _decoded(records, partition)
    topics = decoded.column("kafka_topic").to_pylist()
    partitions = decoded.column("kafka_partition").to_pylist()
    offsets = decoded.column("kafka_offset").to_pylist()
    after = decoded.column("kafka_read_after").to_pylist()
    # Where its reading broke: the first row read is past offset 0, or a row follows a gap.
    assert offsets[0] > 0 or any(a is not None and a >= 0 for a in after), (offsets, after)
    assert offsets[-1] + 1 >= end
    view = ViewCurrency(LOG, clock_skew_ms=2_000)
    view.add_position(LOG, position.partitions, position.as_of_ms, position.end_offsets)
    for _, _, topic_name, body, at, _ in read_facts(topics, partitions, offsets, after, read_at_ms):
        for p, pairs in json.loads(body).items():
            view.read(topic_name, int(p), [tuple(x) for x in pairs], at)
    for _, _, topic_name, body, _, _ in applied_facts(topics, partitions, offsets):
        for p, next_offset in json.loads(body).items():
            view.applied(topic_name, int(p), next_offset)
    for p in range(position.partitions):  # the other partitions: read to their ends without a gap
        if p != partition:
            view.read(LOG, p, [(-1, 0)], read_at_ms)
            view.applied(LOG, p, position.end_offsets.get(p, 0))
    assert view.current_as_of(tid) is None, "a position measured before the cleaning vouched for the view"
    # A position measured after the read vouches again.
    view.add_position(LOG, position.partitions, read_at_ms + 5_000, position.end_offsets)
    assert view.current_as_of(tid) == read_at_ms + 5_000
