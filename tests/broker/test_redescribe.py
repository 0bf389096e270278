"""Between sweeps against a real broker: the ListOffsets probe sees a real open transaction at the partition's
last stable offset, the partition is described again once that report can settle it, and a transaction that
commits first is not described again (admin/collect/redescribe.py)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import pytest
from kafka import KafkaAdminClient, KafkaProducer

from admin.collect.collector import Collector
from admin.collect.redescribe import FOLLOW_UPS_MS, Redescribes
from admin.wire.connect import connect_admin
from admin.wire.kafka_wire import KafkaWire
from common.settings import CollectorSettings, KafkaSettings
from detectors.models import DetectionLimits
from detectors.rules import TxnFacts, settled
from dev.workload import ensure_topics

pytestmark = pytest.mark.broker

LIMITS = DetectionLimits()


@pytest.fixture(scope="module")
def admin(bootstrap: str) -> Iterator[KafkaAdminClient]:
    client = connect_admin(KafkaSettings(bootstrap_servers=bootstrap), request_timeout_ms=10_000)
    yield client
    client.close()


def open_transaction(bootstrap: str, transactional_id: str, topic: str, partition: int) -> KafkaProducer:
    producer = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=transactional_id, acks="all")
    producer.init_transactions()
    producer.begin_transaction()
    producer.send(topic, b"v", partition=partition).get(timeout=30)
    return producer


def test_a_probe_sees_a_real_open_transaction_and_its_re_describe_settles_it(
    admin: KafkaAdminClient, bootstrap: str, unique: str
) -> None:
    topic = f"{unique}redescribe"
    ensure_topics(admin, [topic], 2)
    # The session's broker holds other tests' open transactions too: every check names this test's partitions.
    redescribes = Redescribes(LIMITS)
    collector = Collector(
        KafkaWire(admin, request_timeout_ms=5_000),
        cluster="test",
        settings=CollectorSettings(request_timeout_ms=5_000),
        open_partitions=set(),
        redescribes=redescribes,
    )
    mine, committed = (topic, 0), (topic, 1)
    collector.sweep()  # the view the probe asks by; nothing of this test is open yet
    hanging = open_transaction(bootstrap, f"{unique}open", topic, 0)
    committing = open_transaction(bootstrap, f"{unique}commits", topic, 1)
    try:
        assert collector.probe() > 0
        probed_at = int(time.time() * 1000)
        due_at = redescribes.due_at_ms(mine)
        assert due_at is not None and redescribes.due_at_ms(committed) is not None
        assert due_at - probed_at <= LIMITS.grace_ms + LIMITS.clock_skew_ms + 200
        committing.commit_transaction()  # ends before it is due: the probe sees its LSO move on
        time.sleep(0.5)
        collector.probe()
        assert redescribes.due_at_ms(committed) is None  # not described again: its transaction committed
        time.sleep(max(0.0, (due_at - time.time() * 1000) / 1000))
        deadline = time.monotonic() + 5
        while mine not in collector.due() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert mine in collector.due() and committed not in collector.due()
        result = collector.sweep(only=[mine])
        assert result.redescribe and [(s.topic, s.partition) for s in result.snapshots] == [mine]
        (snap,) = result.snapshots
        (t,) = snap.open_transactions
        assert t.seen_open_ms is not None and t.seen_open_ms <= probed_at  # the probe's sighting
        facts = TxnFacts(
            topic, 0, t.producer_id, t.first_batch_epoch, t.open_since_ms, snap.observed_at_ms,
            seen_open_ms=t.seen_open_ms,
        )  # fmt: skip
        assert settled(facts, LIMITS)
        assert result.positions and result.positions[0].as_of_ms >= snap.observed_at_ms
        # Settled: what remains is the follow-up a second later, for proofs that wait on coordinator events.
        follow_up_at = redescribes.due_at_ms(mine)
        assert follow_up_at is not None
        assert 0 < follow_up_at - snap.observed_at_ms <= FOLLOW_UPS_MS[0]
    finally:
        with contextlib.suppress(Exception):
            hanging.abort_transaction()
        hanging.close(timeout=5)
        committing.close(timeout=5)
