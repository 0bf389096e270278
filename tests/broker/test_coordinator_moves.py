"""Coordinator listings that are incomplete, on a real three-node test bed: a `__transaction_state` partition moves
or goes offline. Kafka lists a transactional id only on the coordinator that leads its `__transaction_state`
partition and has loaded it (`TransactionStateManager.listTransactionStates`); an offline partition is listed by
nobody, silently. Then:

- the describe fallback (`txnwatch collect --coordinator-source describe`) must not tombstone the id (a tombstone
  tells the streaming job the id expired, and its open transaction turns HANGING);
- `proposals abort` must not take "no transactional id owns the producer id" for proof: refused, exit 3,
  `coordinator-listing-incomplete`, nothing written; once the partition is back, the abort goes through.

`__transaction_state` has one replica per partition here, so stopping its leader takes the partition offline
(with three replicas another one takes over within a second, a window a test cannot hit reliably).
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.admin import NewTopic
from kafka.structs import TopicPartition
from workloads import lso, partition_batches, partition_replicas, plan_by_hand, run_workload

from admin.inspect.report import inspect_partition
from admin.proposals.verified_marker import AbortAttempt, TopicAuditLog, abort
from admin.wire.kafka_wire import KafkaWire
from detectors.contract import TRANSACTION_LOG_TOPIC
from detectors.currency import coordinator_partition
from dev.kafka import Cluster, TestBedConfig, node_running, start_cluster, start_node, stop_cluster, stop_node
from dev.workload import ensure_topics, restart_owner

pytestmark = pytest.mark.broker

ROOT = Path(__file__).resolve().parents[2]
LOG_PARTITIONS = 3
ONE_REPLICA_LOG = TestBedConfig(
    nodes=3,
    partition_verification=False,
    extra={
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": str(LOG_PARTITIONS),
    },
)


@pytest.fixture(scope="module")
def bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    state_dir: Path = tmp_path_factory.mktemp("coordinator-moves")
    cluster = start_cluster(ONE_REPLICA_LOG, state_dir)
    try:
        yield cluster
    finally:
        stop_cluster(state_dir)


@pytest.fixture
def restart_stopped(bed: Cluster) -> Iterator[None]:
    """Whatever a test stopped runs again afterwards (the next test needs all three nodes)."""
    yield
    for node in bed.nodes:
        if not node_running(node.pid):
            start_node(bed, node.node_id)


def log_leader(admin: KafkaAdminClient, transactional_id: str) -> tuple[int, int]:
    """(the `__transaction_state` partition of the id, its leader: -1 when offline)."""
    p = coordinator_partition(transactional_id, LOG_PARTITIONS)
    return p, partition_replicas(admin, TRANSACTION_LOG_TOPIC, p)[0]


def wait_for_log_leader(bootstrap: str, partition: int, wanted: Any, timeout_s: float = 60) -> int:
    """Wait until `wanted(leader)` holds for the `__transaction_state` partition (a new client each time: the
    metadata must be fresh); returns the leader."""
    deadline = time.monotonic() + timeout_s
    while True:
        admin = KafkaAdminClient(bootstrap_servers=bootstrap)
        try:
            leader = partition_replicas(admin, TRANSACTION_LOG_TOPIC, partition)[0]
        finally:
            admin.close()
        if wanted(leader):
            return leader
        assert time.monotonic() < deadline, f"{TRANSACTION_LOG_TOPIC}-{partition}: leader still {leader}"
        time.sleep(0.3)


def wait_for_loaded_coordinators(bootstrap: str, timeout_s: float = 60) -> None:
    """Wait until every broker answers ListTransactions (a restarted coordinator answers
    COORDINATOR_LOAD_IN_PROGRESS while it loads its `__transaction_state` partitions)."""
    deadline = time.monotonic() + timeout_s
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        while (failed := KafkaWire(admin).list_transactions().failed) != {}:
            assert time.monotonic() < deadline, f"ListTransactions still fails: {failed}"
            time.sleep(0.3)
    finally:
        admin.close()


def live_bootstrap(bed: Cluster) -> str:
    return ",".join(f"127.0.0.1:{n.broker_port}" for n in bed.nodes if node_running(n.pid))


# --------------------------------------------------------------------------- proposals abort (issue 20, item 5)


def execute(bootstrap: str, candidate: Any, audit_topic: str) -> AbortAttempt:
    """`proposals abort --execute` as the CLI runs it, in this process, with a fresh client (fresh metadata)."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=0)
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None)
    try:
        log = TopicAuditLog(producer, consumer, audit_topic)
        attempt = abort(KafkaWire(admin), candidate, execute=True, actor="coordinator-moves", audit_log=log)
        log.append(attempt.audit)
        return attempt
    finally:
        producer.close()
        consumer.close()
        admin.close()


def transactional_id_away_from_the_orphan(bootstrap: str, prefix: str, base: str) -> str:
    """A transactional id whose `__transaction_state` partition another broker leads than the one leading the
    `hanging` workload's orphan partition (`<prefix>hanging`-2, made here first; the workload finds it made):
    stopping the id's coordinator then leaves the orphan's leader, and its leader epoch, as they were. (Across a
    leader change the abort is refused, `leader-changed-since-start`: that is not what this test is about.)"""
    restart_owner(
        bootstrap, f"{base}warm"
    )  # a first InitProducerId: `__transaction_state` exists from now on
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        ensure_topics(admin, [f"{prefix}hanging"], 3)
        deadline = time.monotonic() + 60
        while True:  # a new topic's partitions reach the metadata a moment after it is created
            try:
                orphan_leader = partition_replicas(admin, f"{prefix}hanging", 2)[0]
                return next(
                    tid
                    for tid in (f"{base}{i}" for i in itertools.count())
                    if log_leader(admin, tid)[1] not in (-1, orphan_leader)
                )
            except ValueError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
    finally:
        admin.close()


def test_abort_refuses_while_a_transaction_log_partition_is_offline(
    bed: Cluster, restart_stopped: None
) -> None:
    """A real orphan of transactional id T. The broker leading T's `__transaction_state` partition stops: no
    broker lists T, and no broker reports an error. `inspect partition` says unconfirmed, the abort refuses (exit 3, the partition named, no marker,
    LSO unchanged) instead of reading "no owner"; with the node back, the same abort goes through."""
    bootstrap = bed.bootstrap_servers
    unique = f"c{uuid.uuid4().hex[:8]}-"
    txn_id = transactional_id_away_from_the_orphan(bootstrap, f"{unique}r-", f"{unique}tx")
    truth = run_workload(
        bootstrap, "--scenario", "hanging", "--topic-prefix", f"{unique}r-", "--transactional-id", txn_id
    )
    (h,) = [t for t in truth["transactions"] if t["kind"] == "hanging"]
    topic, partition, start, pid = h["topic"], h["partition"], h["start_offset"], h["producer_id"]
    assert (topic, partition) == (f"{unique}r-hanging", 2)
    audit_topic = f"{unique}tw.audit"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(audit_topic, 1, -1)])  # three replicas: made while all nodes run
        log_partition, coordinator = log_leader(admin, txn_id)
        candidate = plan_by_hand(KafkaWire(admin), topic, partition, pid)
    finally:
        admin.close()
    assert coordinator >= 0

    stop_node(bed, coordinator)
    wait_for_log_leader(live_bootstrap(bed), log_partition, lambda leader: leader < 0)
    alive = live_bootstrap(bed)
    before = partition_batches(alive, topic, partition)
    admin = KafkaAdminClient(bootstrap_servers=alive)
    try:
        lso_before = lso(KafkaWire(admin), topic, partition)
    finally:
        admin.close()
    assert lso_before is not None and lso_before <= start

    admin = KafkaAdminClient(bootstrap_servers=alive)
    try:
        (inspected,) = inspect_partition(KafkaWire(admin), topic, partition).transactions
    finally:
        admin.close()
    assert inspected.verdict is None and inspected.note.startswith("unconfirmed: "), inspected.note
    assert f"{TRANSACTION_LOG_TOPIC} partition {log_partition} has no leader" in inspected.note

    refused = execute(alive, candidate, audit_topic)
    record = refused.audit
    print(
        f"\nbroker {coordinator} (leader of {TRANSACTION_LOG_TOPIC}-{log_partition}) stopped: {record.message}"
    )
    assert refused.exit_code == 3, record.message
    assert record.outcome.value == "REFUSED" and record.marker_written is False
    assert (
        f"coordinator-listing-incomplete: {TRANSACTION_LOG_TOPIC} partition {log_partition} has no leader"
        in record.message
    )
    assert partition_batches(alive, topic, partition) == before  # not a byte written
    admin = KafkaAdminClient(bootstrap_servers=alive)
    try:
        assert lso(KafkaWire(admin), topic, partition) == lso_before
    finally:
        admin.close()

    start_node(bed, coordinator)
    wait_for_log_leader(bootstrap, log_partition, lambda leader: leader == coordinator)
    wait_for_loaded_coordinators(bootstrap)
    done = execute(bootstrap, candidate, audit_topic)
    assert done.exit_code == 0, done.audit.message
    assert done.audit.outcome.value == "ABORTED" and not done.audit.allow_leader_change


# ------------------------------------------------------------------------ the describe fallback (item 4)


def coordinator_records(bootstrap: str, topic: str, transactional_id: str) -> list[dict[str, Any]]:
    """Every record the collector published for one transactional id, in order."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None)
    try:
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        end = consumer.end_offsets(tps)
        out: list[Any] = []
        deadline = time.monotonic() + 30
        while any(consumer.position(tp) < end[tp] for tp in tps):
            assert time.monotonic() < deadline, f"reading {topic} took too long"
            for batch in consumer.poll(timeout_ms=500).values():
                out.extend(r for r in batch if r.key == transactional_id.encode())
        return [json.loads(r.value) for r in sorted(out, key=lambda r: r.offset)]
    finally:
        consumer.close()


def wait_for_records(bootstrap: str, topic: str, tid: str, wanted: Any, timeout_s: float = 60) -> list[Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        records = coordinator_records(bootstrap, topic, tid) if topic_exists(bootstrap, topic) else []
        if wanted(records):
            return records
        assert time.monotonic() < deadline, f"{tid} on {topic}: {records}"
        time.sleep(0.5)


def topic_exists(bootstrap: str, topic: str) -> bool:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        return topic in admin.list_topics()
    finally:
        admin.close()


def test_describe_fallback_keeps_an_id_whose_coordinator_moves_or_goes_offline(
    bed: Cluster, restart_stopped: None
) -> None:
    """`txnwatch collect --coordinator-source describe` runs while transactional id T has an open (Ongoing)
    transaction. T's `__transaction_state` partition goes offline (its only replica's broker stops: the other
    brokers answer, without T), comes back, then is reassigned to another broker (the old one answers without
    T, the new one loads it). Through all of it, no tombstone for T reaches `<prefix>.coordinator-state`: the
    streaming job never reads T as expired, so its open transaction cannot turn HANGING for that reason."""
    bootstrap = bed.bootstrap_servers
    unique = f"d{uuid.uuid4().hex[:8]}-"
    prefix = f"{unique}tw"
    state_topic = f"{prefix}.coordinator-state"
    txn_id = f"{unique}tx"
    data_topic = f"{unique}orders"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(data_topic, 1, -1)])
    finally:
        admin.close()
    producer = KafkaProducer(
        bootstrap_servers=bootstrap, transactional_id=txn_id, transaction_timeout_ms=60_000, acks="all"
    )
    producer.init_transactions()
    producer.begin_transaction()
    producer.send(data_topic, b"open", partition=0).get(timeout=30)
    producer.flush()
    with socket.socket() as s:  # a free loopback port for the collector's /metrics
        s.bind(("127.0.0.1", 0))
        metrics_port = s.getsockname()[1]
    collector = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "txnwatch_cli",
            "collect",
            "--bootstrap-server",
            bootstrap,
            "--coordinator-source",
            "describe",
            "--interval-ms",
            "1000",
            "--topic-prefix",
            prefix,
            "--metrics-port",
            str(metrics_port),
        ],
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if not k.startswith("TXNWATCH_")}
        | {"TXNWATCH_COLLECTOR__METRICS_ADDR": "127.0.0.1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    coordinator = -1
    try:
        wait_for_records(bootstrap, state_topic, txn_id, lambda rs: any(r["state"] == "Ongoing" for r in rs))
        admin = KafkaAdminClient(bootstrap_servers=bootstrap)
        try:
            log_partition, coordinator = log_leader(admin, txn_id)
        finally:
            admin.close()

        # Offline: the only replica's broker stops; the collector polls every second meanwhile.
        stop_node(bed, coordinator)
        wait_for_log_leader(live_bootstrap(bed), log_partition, lambda leader: leader < 0)
        time.sleep(5)
        assert not [
            r for r in coordinator_records(live_bootstrap(bed), state_topic, txn_id) if r["tombstone"]
        ]
        # ...and says so on /metrics: the withheld expiries are counted.
        scraped = (
            urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
        )
        (withheld,) = [
            float(line.split()[-1])
            for line in scraped.splitlines()
            if line.startswith("txnwatch_collector_coordinator_expiries_withheld_total ")
        ]
        assert withheld > 0, "the withheld tombstones were not counted"
        # ...and no coordinator-state position vouched for those polls: nobody listed T's partition.
        (no_leader,) = [
            float(line.split()[-1])
            for line in scraped.splitlines()
            if line.startswith(
                'txnwatch_collector_coordinator_positions_withheld_total{reason="partition-without-leader"} '
            )
        ]
        assert no_leader > 0, "positions were published while a __transaction_state partition had no leader"
        start_node(bed, coordinator)
        wait_for_log_leader(bootstrap, log_partition, lambda leader: leader == coordinator)

        # Moved: reassigned to another broker (the old one drops it, the new one loads it).
        target = next(n.node_id for n in bed.nodes if n.node_id != coordinator)
        admin = KafkaAdminClient(bootstrap_servers=bootstrap)
        try:
            admin.alter_partition_reassignments(
                {TopicPartition(TRANSACTION_LOG_TOPIC, log_partition): [target]}
            )
        finally:
            admin.close()
        wait_for_log_leader(bootstrap, log_partition, lambda leader: leader == target)
        time.sleep(4)
        records = coordinator_records(bootstrap, state_topic, txn_id)
        assert not [r for r in records if r["tombstone"]], records
        assert collector.poll() is None, "the collector stopped"
    finally:
        collector.terminate()
        _, stderr = collector.communicate(timeout=60)
        said = [line for line in stderr.splitlines() if "admin.collect.coordinator" in line]
        print("\ncollector's coordinator fallback said:\n" + "\n".join(said[-20:]))
        producer.close(timeout=5)
