"""The collector names on /metrics the consumer groups a real hanging transaction holds up, on the real broker.

A real orphan pins a partition's last stable offset; a real read_committed consumer group reads up to it and stays
there (records written after the orphan never reach it) and commits that offset; another group committed behind
it. `txnwatch collect --blocked-groups-after-ms` names the first group on its /metrics, not the second. A real
orphan offset commit on `__consumer_offsets` (the `hanging-offsets` workload) names the group whose commit it holds.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.admin import NewTopic
from kafka.structs import OffsetAndMetadata, TopicPartition
from prometheus_client.parser import text_string_to_metric_families
from workloads import run_workload

from admin.collect.blocked import COMMITTED_AT_LSO, PENDING_OFFSET_COMMIT, BlockedGroups
from admin.collect.collector import Collector
from admin.collect.metrics import CollectorMetrics
from admin.wire.groups import KafkaGroupOffsets
from admin.wire.kafka_wire import KafkaWire
from common.settings import CollectorSettings
from detectors.groups import CONSUMER_OFFSETS_TOPIC

pytestmark = pytest.mark.broker

ROOT = Path(__file__).resolve().parents[2]
# Older than any other orphan a broker test leaves on the session broker: the collector looks at the oldest first.
TWO_DAYS_MS = 2 * 24 * 3_600_000
BEFORE_THE_ORPHAN = 3  # plain records ahead of the orphan on its partition


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def blocked_series(body: str) -> list[dict[str, str]]:
    return [
        s.labels
        for f in text_string_to_metric_families(body)
        for s in f.samples
        if s.name == "txnwatch_collector_blocked_groups"
    ]


def produce(bootstrap: str, topic: str, partition: int, n: int) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    try:
        for i in range(n):
            producer.send(topic, value=f"plain-{i}".encode(), partition=partition).get(30)
    finally:
        producer.close()


def read_committed_group_stops_at(bootstrap: str, group: str, tp: TopicPartition) -> int:
    """A real read_committed member of `group` reads everything it can, commits its position, and returns it."""
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
    )
    try:
        consumer.assign([tp])
        deadline = time.monotonic() + 20
        read = 0
        while time.monotonic() < deadline:
            read += sum(len(v) for v in consumer.poll(timeout_ms=500).values())
            if read >= BEFORE_THE_ORPHAN and consumer.position(tp) == BEFORE_THE_ORPHAN:
                # polled again and again: nothing past the pinned LSO ever arrives
                for _ in range(4):
                    assert not consumer.poll(timeout_ms=500), "a read_committed consumer read past the LSO"
                break
        position = consumer.position(tp)
        consumer.commit({tp: OffsetAndMetadata(position, "", -1)})
        return int(position)
    finally:
        consumer.close(autocommit=False)


def test_collect_names_the_read_committed_group_a_real_hanging_transaction_holds_up(
    bootstrap: str, unique: str
) -> None:
    # The orphan's partition first gets plain records, so a group can commit behind the LSO.
    topic = f"{unique}hanging"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(topic, 2, 1)])
    finally:
        admin.close()
    produce(bootstrap, topic, 1, BEFORE_THE_ORPHAN)
    truth = run_workload(
        bootstrap,
        *("--scenario", "hanging", "--topic-prefix", unique, "--partitions", "2"),
        *("--backdate-ms", str(TWO_DAYS_MS)),
    )
    hanging = next(t for t in truth["transactions"] if t["kind"] == "hanging")
    assert (hanging["topic"], hanging["partition"], hanging["start_offset"]) == (topic, 1, BEFORE_THE_ORPHAN)
    produce(
        bootstrap, topic, 1, 2
    )  # after the orphan: beyond the LSO, a read_committed member never gets them
    tp = TopicPartition(topic, 1)

    stuck, behind = f"{unique}stuck", f"{unique}behind"
    assert read_committed_group_stops_at(bootstrap, stuck, tp) == BEFORE_THE_ORPHAN
    c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=behind, enable_auto_commit=False)
    c.assign([tp])
    c.commit({tp: OffsetAndMetadata(1, "", -1)})
    c.close(autocommit=False)

    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TXNWATCH_")}
    command = [sys.executable, "-m", "txnwatch_cli", "collect", "--bootstrap-server", bootstrap]
    command += ["--cluster", "ci", "--topic-prefix", f"{unique}out", "--interval-ms", "1000"]
    command += ["--metrics-port", str(port), "--blocked-groups-after-ms", "60000"]
    proc = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    named: list[dict[str, str]] = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else "collect exited"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    named = [s for s in blocked_series(r.read().decode()) if s["topic"] == topic]
            except OSError:
                pass  # not serving yet
            if named:
                break
            time.sleep(0.5)
    finally:
        proc.terminate()
        proc.wait(30)
    assert named == [{"topic": topic, "partition": "1", "group": stuck, "reason": COMMITTED_AT_LSO}]


def test_a_hanging_offset_commit_names_its_group_from_a_real_sweep(bootstrap: str, unique: str) -> None:
    truth = run_workload(bootstrap, "--scenario", "hanging-offsets", "--topic-prefix", unique)
    committed, hanging = (
        next(t for t in truth["transactions"] if t["kind"] == k) for k in ("committed", "hanging")
    )
    group = f"{committed['transactional_id']}-group"  # dev/workload.py's hanging_offsets
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        metrics = CollectorMetrics()
        sweep = Collector(
            KafkaWire(admin), cluster="ci", settings=CollectorSettings(), open_partitions=set()
        ).sweep()
        # Every long-open partition of the session broker is asked here (the cap is the subprocess test's).
        report = BlockedGroups(
            KafkaGroupOffsets(admin),
            after_ms=0,
            report=metrics.observe_blocked_groups,
            max_partitions=10_000,
            max_series=10_000,
        ).after_sweep(sweep.snapshots)
    finally:
        admin.close()
    mine = [b for b in report.blocked if b.group == group]
    assert [(b.topic, b.partition, b.reason) for b in mine] == [
        (CONSUMER_OFFSETS_TOPIC, hanging["partition"], PENDING_OFFSET_COMMIT)
    ]
