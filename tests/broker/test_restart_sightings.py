"""A restarted `txnwatch collect` against a real broker keeps the first sighting of a transaction that stayed open
(issue 39, item 3): it reads its snapshot topic's tail back (admin/collect/restore.py) before its first sweep."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.structs import TopicPartition as KafkaTP

from admin.wire.connect import connect_admin
from common.settings import KafkaSettings
from detectors.models import OpenTransaction, PartitionSnapshot
from dev.workload import ensure_topics

pytestmark = pytest.mark.broker

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def admin(bootstrap: str) -> Iterator[KafkaAdminClient]:
    client = connect_admin(KafkaSettings(bootstrap_servers=bootstrap), request_timeout_ms=10_000)
    yield client
    client.close()


def collect(bootstrap: str, prefix: str, sweeps: int) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "txnwatch_cli",
            "collect",
            "--bootstrap-server",
            bootstrap,
            "--topic-prefix",
            prefix,
            "--cluster",
            "ci",
            "--metrics-port",
            "0",
            "--topic-partitions",
            "1",
            "--interval-ms",
            "500",
            "--max-sweeps",
            str(sweeps),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if not k.startswith("TXNWATCH_")},
    )
    assert done.returncode == 0, done.stderr


def reported(bootstrap: str, topic: str, key: bytes) -> list[OpenTransaction]:
    """The open transaction of every snapshot of `key` on `topic` (one partition), in publishing order."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        tp = KafkaTP(topic, 0)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        end = consumer.end_offsets([tp])[tp]
        records = []
        deadline = time.monotonic() + 30
        while consumer.position(tp) < end and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=500).values():
                records.extend(r for r in batch if r.key == key)
    finally:
        consumer.close()
    return [t for r in records for t in PartitionSnapshot.model_validate_json(r.value).open_transactions]


def test_a_restarted_collector_reports_the_first_sighting_of_a_transaction_still_open(
    admin: KafkaAdminClient, bootstrap: str, unique: str
) -> None:
    topic, prefix = f"{unique}restart", f"{unique}out"
    ensure_topics(admin, [topic], 1)
    # Open across both runs of the collector (well within the default 60 s transaction timeout).
    producer = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"{unique}open", acks="all")
    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send(topic, b"v", partition=0).get(timeout=30)

        collect(bootstrap, prefix, sweeps=2)
        (first, *_) = reported(bootstrap, f"{prefix}.producer-state", f"{topic}-0".encode())
        assert first.seen_open_ms is not None
        restarted_at = int(time.time() * 1000)
        time.sleep(0.5)  # a collector that started afresh would see it open only after this

        collect(bootstrap, prefix, sweeps=1)
        last = reported(bootstrap, f"{prefix}.producer-state", f"{topic}-0".encode())[-1]
        assert last.start_offset == first.start_offset
        assert (last.seen_open_ms, last.opened_after_ms) == (first.seen_open_ms, first.opened_after_ms)
        assert last.seen_open_ms < restarted_at
    finally:
        producer.abort_transaction()
        producer.close()
