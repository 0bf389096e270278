"""Event time on a real broker: a kafka-python transactional producer that stamps its records two hours in the
past (as Kafka Streams does with old input, and MirrorMaker 2 and Flink with the source's time), each transaction
committed within a fraction of a second. The broker accepts the timestamps (`log.message.timestamp.before.max.ms`
defaults to Long.MAX_VALUE), and DescribeProducers' LastTimestamp and the start batch carry them.

Before the collector bounded a transaction's opening by its own reports (admin/collect/sighting.py), every one of these
transactions was two hours old: MaxActiveTransactionDuration read 7,200 s and the LATE rule called them late.
The broker's own PartitionsWithLateTransactionsCount is fooled the same way: it ages the LastTimestamp of the
oldest transaction's producer (`ProducerStateManager.hasLateTransaction`), a record timestamp."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import NewTopic

from admin.collect.collector import Collector
from admin.wire.connect import connect_admin
from admin.wire.kafka_wire import KafkaWire
from admin.wire.types import record_from_description
from common.settings import CollectorSettings, KafkaSettings
from detectors import kip664
from detectors.models import DetectionLimits, PartitionSnapshot, VerdictKind
from detectors.rules import classify

pytestmark = pytest.mark.broker

TWO_HOURS_MS = 2 * 3600 * 1000
# The shipped thresholds, with a late threshold a 2 h event time would cross many times over.
LIMITS = DetectionLimits()


@pytest.fixture
def admin(bootstrap: str) -> Iterator[KafkaAdminClient]:
    client = connect_admin(KafkaSettings(bootstrap_servers=bootstrap), request_timeout_ms=10_000)
    yield client
    client.close()


def _produce_in_event_time(bootstrap: str, topic: str, tid: str, stop: threading.Event) -> int:
    """Short transactions (a few records, ~0.3 s open) stamped two hours ago, until `stop`; returns how many."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=tid, transaction_timeout_ms=30_000)
    producer.init_transactions()
    done = 0
    try:
        while not stop.is_set():
            producer.begin_transaction()
            stamp = int(time.time() * 1000) - TWO_HOURS_MS
            for i in range(3):
                producer.send(topic, value=b"e%d" % i, partition=0, timestamp_ms=stamp + i)
            producer.flush()
            time.sleep(0.3)
            producer.commit_transaction()
            done += 1
    finally:
        producer.close()
    return done


def test_transactions_stamped_two_hours_ago_are_as_young_as_the_collector_saw_them(
    bootstrap: str, admin: KafkaAdminClient, unique: str
) -> None:
    topic, tid = f"{unique}events", f"{unique}streams-like"
    admin.create_topics([NewTopic(topic, 1, 1)])
    wire = KafkaWire(admin, request_timeout_ms=5_000)
    collector = Collector(
        wire,
        cluster="test",
        settings=CollectorSettings(retry_backoff_ms=100, request_timeout_ms=5_000),
        open_partitions=set(),
    )
    collector.sweep()  # the partition is reported once before the first transaction opens
    stop = threading.Event()
    result: list[int] = []
    worker = threading.Thread(
        target=lambda: result.append(_produce_in_event_time(bootstrap, topic, tid, stop))
    )
    worker.start()
    seen: list[PartitionSnapshot] = []
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and len(seen) < 8:
            sweep = collector.sweep()
            seen += [s for s in sweep.snapshots if s.topic == topic and s.open_transactions]
            time.sleep(0.2)
    finally:
        stop.set()
        worker.join(timeout=30)
    assert result and result[0] > 0, "the producer committed no transaction"
    assert len(seen) >= 3, f"only {len(seen)} sweeps caught a transaction open"

    (coordinator,) = wire.metadata().brokers  # one broker: it coordinates every transactional id
    for snap in seen:
        (txn,) = snap.open_transactions
        # The records say two hours; the collector saw the transaction open within a sweep of its opening.
        assert snap.observed_at_ms - txn.record_time_ms > TWO_HOURS_MS - 60_000
        assert txn.opened_after_ms is not None and txn.open_since_basis == "opened-after-previous-report"
        duration = kip664.partition_duration_ms(snap, now_ms=snap.observed_at_ms)
        assert duration is not None and duration < 10_000, (duration, txn)
        assert not kip664.partition_has_late_transaction(snap, now_ms=snap.observed_at_ms, limits=LIMITS)
        # The verdict against the coordinator's own description of the transaction (read now: it may have
        # moved on, which only makes it less related) is never LATE.
        (d,) = wire.describe_transactions({coordinator: [tid]})
        record = record_from_description(d, seen_at_ms=snap.observed_at_ms)
        related = record if record.producer_id == txn.producer_id else None
        assert related is not None, (record, txn)
        v = classify(
            txn, snap, related, now_ms=snap.observed_at_ms, limits=LIMITS, view_current_ms=snap.observed_at_ms
        )
        assert v.kind is not VerdictKind.LATE, v.explanation
        assert v.evidence.age_ms < 10_000
