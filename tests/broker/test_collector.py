"""The collector against real brokers and real transactions (dev/workload.py), compared with the ground truth.

Sweeps see steady, late and hanging transactions with their exact producer ids, epochs, start offsets and start
timestamps; a partition whose transaction ends gets an explicit empty snapshot; internal topics are covered; each
sweep measures how far `__transaction_state` has reached (and each describe-mode poll, the coordinator-state
topic); the CLI publishes the contract's records; a stale leader is refreshed within the sweep and an
unreachable broker does not stop it (own 3-node cluster).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.admin import ConfigResource, ConfigResourceType, NewTopic
from kafka.admin._transactions import AbortTransactionSpec
from kafka.errors import KafkaError
from kafka.structs import TopicPartition as KafkaTP
from prometheus_client import generate_latest
from workloads import run_workload, start_workload

from admin.cli.main import _collect_once
from admin.collect.collector import Collector
from admin.collect.coordinator import CoordinatorPoller
from admin.collect.metrics import CollectorMetrics
from admin.collect.publish import KafkaSink, OutRecord, Publisher, ensure_topics
from admin.wire.connect import connect_admin, producer_for
from admin.wire.errors import AdminError
from admin.wire.kafka_wire import KafkaWire
from admin.wire.requests import RequestLog
from admin.wire.types import ClusterView, ListingResult, SweepResult
from common.settings import CollectorSettings, KafkaSettings
from common.topics import OutputTopicSettings
from detectors.codec import DecodeError, TxnStatus, decode_key, decode_value
from detectors.contract import COORDINATOR_LOG_POSITION_TYPE
from detectors.models import (
    BrokerSweepSummary,
    CoordinatorLogPosition,
    CoordinatorRecord,
    CoordinatorState,
    PartitionSnapshot,
)
from dev.kafka import Cluster, TestBedConfig, start_cluster, stop_cluster
from dev.workload import ensure_topics as ensure_workload_topics
from dev.workload import raw_transactional_produce

pytestmark = pytest.mark.broker

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = CollectorSettings(retry_backoff_ms=100, request_timeout_ms=5_000)


# ------------------------------------------------------------------------------------------ helpers


@pytest.fixture(scope="module")
def admin(bootstrap: str) -> Iterator[KafkaAdminClient]:
    client = connect_admin(KafkaSettings(bootstrap_servers=bootstrap), request_timeout_ms=10_000)
    # Create __consumer_offsets now (the first FindCoordinator does), so it has loaded by the time
    # hanging-offsets runs; the first answer is COORDINATOR_NOT_AVAILABLE while the topic is created.
    with contextlib.suppress(KafkaError):
        client._manager.run(client._find_coordinator_id, "txnwatch-warm-up")
    yield client
    client.close()


def collector(admin: KafkaAdminClient, *, without_history: bool = False) -> Collector:
    """A collector that starts knowing nothing was open (or, `without_history`, not knowing what was)."""
    return Collector(
        KafkaWire(admin, request_timeout_ms=5_000),
        cluster="test",
        settings=SETTINGS,
        open_partitions=None if without_history else set(),
    )


def txnwatch(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "txnwatch_cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if not k.startswith("TXNWATCH_")},
    )


def snapshot_of(result: SweepResult, topic: str, partition: int) -> PartitionSnapshot | None:
    return next((s for s in result.snapshots if (s.topic, s.partition) == (topic, partition)), None)


def empties(result: SweepResult) -> set[tuple[str, int]]:
    return {(s.topic, s.partition) for s in result.empties}


def abort_orphan(admin: KafkaAdminClient, h: dict[str, Any]) -> None:
    # WriteTxnMarkers with the leader's coordinator epoch (-1 for an orphan, sent as 0, never -1).
    admin.abort_transaction(
        AbortTransactionSpec(KafkaTP(h["topic"], h["partition"]), h["producer_id"], h["producer_epoch"], 0)
    )


def assert_matches_truth(snap: PartitionSnapshot, truth: dict[str, Any]) -> None:
    (txn,) = [t for t in snap.open_transactions if t.producer_id == truth["producer_id"]]
    assert txn.producer_epoch == truth["producer_epoch"]
    assert txn.start_offset == truth["start_offset"]
    assert txn.start_timestamp_ms == truth["start_timestamp_ms"]  # exact: read from the start batch
    assert txn.start_batch_producer_epoch == truth["producer_epoch"]


def wait_for_markers(bootstrap: str, topic: str, partition: int, timeout_s: float = 30.0) -> None:
    """Wait until the partition's last stable offset reaches its high watermark. commit() returns once the
    coordinator has logged PrepareCommit; it writes the markers after that, so a sweep right after the workload
    can still see the committed transaction open for a few hundred milliseconds."""
    tp = KafkaTP(topic, partition)
    committed = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed")
    uncommitted = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        deadline = time.monotonic() + timeout_s
        while committed.end_offsets([tp])[tp] < uncommitted.end_offsets([tp])[tp]:
            assert time.monotonic() < deadline, f"no commit markers on {topic}-{partition} after {timeout_s}s"
            time.sleep(0.1)
    finally:
        committed.close()
        uncommitted.close()


# --------------------------------------------------------------------------------------- scenarios


def test_hanging_orphan_is_swept_exactly_and_emptied_after_abort(
    admin: KafkaAdminClient, bootstrap: str, unique: str
) -> None:
    truth = run_workload(bootstrap, "--scenario", "hanging", "--topic-prefix", unique)
    (h,) = [t for t in truth["transactions"] if t["kind"] == "hanging"]
    (c,) = [t for t in truth["transactions"] if t["kind"] == "committed"]
    wait_for_markers(bootstrap, c["topic"], c["partition"])
    col = collector(admin)
    first = col.sweep()

    snap = snapshot_of(first, h["topic"], h["partition"])
    assert snap is not None, f"no snapshot for the orphan on {h['topic']}-{h['partition']}"
    assert_matches_truth(snap, h)
    assert snap.leader == 1
    assert snap.observed_at_ms >= h["start_timestamp_ms"]
    assert snap.max_transaction_timeout_ms == 60_000  # the test bed's transaction.max.timeout.ms
    assert snap.last_stable_offset == h["start_offset"]
    assert snap.high_watermark is not None and snap.high_watermark - snap.last_stable_offset > 0
    assert snapshot_of(first, c["topic"], c["partition"]) is None  # committed: nothing open there
    assert first.new_transactions >= 1 and first.start_batch_fetches >= 1

    # The LSO stays pinned while later records arrive: the lag grows.
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    producer.send(h["topic"], b"after", partition=h["partition"]).get(timeout=30)
    producer.close()
    second = col.sweep()
    again = snapshot_of(second, h["topic"], h["partition"])
    assert again is not None and again.last_stable_offset == h["start_offset"]
    assert again.high_watermark == h["start_offset"] + 2
    assert second.start_batch_fetches == 0  # cached: steady state costs no fetch

    abort_orphan(admin, h)
    third = col.sweep()
    assert snapshot_of(third, h["topic"], h["partition"]) is None
    assert (h["topic"], h["partition"]) in empties(third)
    (empty,) = [s for s in third.empties if (s.topic, s.partition) == (h["topic"], h["partition"])]
    assert empty.open_transactions == () and empty.leader == 1
    # The empty snapshot is sent once, on the transition.
    assert (h["topic"], h["partition"]) not in empties(col.sweep())


def test_steady_transactions_seen_mid_flight_match_the_ground_truth(
    admin: KafkaAdminClient, bootstrap: str, unique: str
) -> None:
    # Popen, not start_workload: steady prints its ground truth only at the end, and this test sweeps meanwhile.
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dev.workload",
            "--bootstrap-server",
            bootstrap,
            "--json",
            "--scenario",
            "steady",
            "--topic-prefix",
            unique,
            "--seconds",
            "2.5",
            "--rate",
            "30",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    col = collector(admin)
    seen: dict[tuple[str, int, int, int], Any] = {}
    last_state: dict[tuple[str, int], str] = {}
    try:
        while proc.poll() is None:
            result = col.sweep()
            for s in result.snapshots:
                if s.topic.startswith(unique):
                    last_state[(s.topic, s.partition)] = "open"
                    for t in s.open_transactions:
                        seen[(s.topic, s.partition, t.producer_id, t.start_offset)] = t
            for tp in empties(result):
                if tp[0].startswith(unique):
                    last_state[tp] = "empty"
    finally:
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    truth = {
        (t["topic"], t["partition"], t["producer_id"], t["start_offset"]): t
        for t in json.loads(out)["transactions"]
    }
    assert seen, "no sweep caught a transaction while it was open"
    for key, txn in seen.items():
        assert key in truth, f"open transaction {key} is not one the workload made"
        t = truth[key]
        assert txn.producer_epoch == t["producer_epoch"]
        assert txn.start_timestamp_ms == t["start_timestamp_ms"]
        assert txn.start_batch_producer_epoch == t["producer_epoch"]

    # Once the markers are written nothing stays open, and every partition seen open got its empty snapshot.
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        result = col.sweep()
        for s in result.snapshots:
            if s.topic.startswith(unique):
                last_state[(s.topic, s.partition)] = "open"
        for tp in empties(result):
            if tp[0].startswith(unique):
                last_state[tp] = "empty"
        if not any(s.topic.startswith(unique) for s in result.snapshots):
            break
        time.sleep(0.5)
    assert last_state and set(last_state.values()) == {"empty"}


def test_late_transaction_then_its_abort(admin: KafkaAdminClient, bootstrap: str, unique: str) -> None:
    proc, truth = start_workload(
        bootstrap, "--scenario", "late", "--topic-prefix", unique, "--hold-ms", "3000"
    )
    col = collector(admin)
    wire = KafkaWire(admin)
    poller = CoordinatorPoller(wire, clock_ms=lambda: time.time_ns() // 1_000_000)
    try:
        (t,) = truth["transactions"]  # printed while the transaction is open
        result = col.sweep()
        snap = snapshot_of(result, t["topic"], t["partition"])
        assert snap is not None
        assert_matches_truth(snap, t)
        assert snap.last_stable_offset == t["start_offset"]
        assert snap.high_watermark is not None and snap.high_watermark > snap.last_stable_offset

        # Coordinator fallback: ListTransactions + DescribeTransactions say Ongoing with this partition.
        records = {r.transactional_id: r for r in poller.poll()}
        ongoing = records[t["transactional_id"]]
        assert ongoing.state is CoordinatorState.ONGOING
        assert ongoing.producer_id == t["producer_id"] and ongoing.producer_epoch == t["producer_epoch"]
        assert ongoing.lists(t["topic"], t["partition"])
        assert ongoing.origin == "describe-transactions"
        assert t["transactional_id"] not in {
            r.transactional_id for r in poller.poll()
        }  # unchanged: not again
    finally:
        assert proc.wait(timeout=60) == 0, proc.stderr.read() if proc.stderr else ""
    deadline = time.monotonic() + 10
    after = col.sweep()
    while snapshot_of(after, t["topic"], t["partition"]) is not None and time.monotonic() < deadline:
        time.sleep(0.3)  # the abort markers follow EndTxn's response
        after = col.sweep()
    assert snapshot_of(after, t["topic"], t["partition"]) is None
    assert (t["topic"], t["partition"]) in empties(after)
    ended = {r.transactional_id: r for r in poller.poll()}[t["transactional_id"]]
    assert ended.state in (CoordinatorState.COMPLETE_ABORT, CoordinatorState.PREPARE_ABORT)


def test_internal_topics_are_covered(admin: KafkaAdminClient, bootstrap: str, unique: str) -> None:
    truth = run_workload(bootstrap, "--scenario", "hanging-offsets", "--topic-prefix", unique)
    (h,) = [t for t in truth["transactions"] if t["kind"] == "hanging"]
    assert h["topic"] == "__consumer_offsets"
    view = KafkaWire(admin).metadata()
    assert {"__consumer_offsets", "__transaction_state"} <= view.internal_topics
    # Unknown open set (a collector without history): an empty snapshot for every covered partition.
    col = collector(admin, without_history=True)
    result = col.sweep()
    snap = snapshot_of(result, "__consumer_offsets", h["partition"])
    assert snap is not None
    assert_matches_truth(snap, h)
    internal = {tp for tp, leader in view.leaders.items() if tp[0] in view.internal_topics}
    described = empties(result) | {(s.topic, s.partition) for s in result.snapshots}
    assert internal <= described
    assert result.partitions_covered == result.partitions_total
    abort_orphan(admin, h)
    assert ("__consumer_offsets", h["partition"]) in empties(col.sweep())


def test_metrics_after_a_sweep(admin: KafkaAdminClient) -> None:
    metrics = CollectorMetrics()
    requests = RequestLog(metrics)
    col = Collector(
        KafkaWire(admin, requests=requests),
        cluster="test",
        settings=SETTINGS,
        open_partitions=set(),
        metrics=metrics,
    )
    result = col.sweep()
    text = generate_latest(metrics.registry).decode()
    assert "txnwatch_collector_sweep_duration_seconds_count 1.0" in text
    assert (
        'txnwatch_collector_partitions_scanned{broker="1"} ' + f"{float(result.partitions_covered)}" in text
    )
    assert 'txnwatch_collector_requests_total{api="DescribeProducers",outcome="ok"}' in text
    assert "txnwatch_collector_open_transactions " in text
    assert requests.by_broker("DescribeProducers") == {1: -(-result.partitions_total // 500)}


# ------------------------------------------------------------------------------------------------ CLI


def test_cli_once_prints_the_sweep(bootstrap: str, unique: str) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"{unique}once")
    producer.init_transactions()
    producer.close()
    done = txnwatch("collect", "--bootstrap-server", bootstrap, "--once", "--coordinator-source", "describe")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["partitions_total"] == out["partitions_covered"] > 0
    assert [BrokerSweepSummary.model_validate(s).broker for s in out["summaries"]] == [1]
    # Describe mode measures no __transaction_state, and nothing published means no coordinator-state position.
    assert out["coordinator_log_positions"] == []
    for s in out["snapshots"]:
        PartitionSnapshot.model_validate(s)
    (record,) = [r for r in out["coordinator_records"] if r["transactional_id"] == f"{unique}once"]
    assert record["state"] == "Empty" and record["origin"] == "describe-transactions"


def test_cli_publishes_the_contract_and_restores_after_restart(
    admin: KafkaAdminClient, bootstrap: str, unique: str
) -> None:
    # A real orphan the quick way (the workload's raw Produce v9): a producer id no coordinator knows.
    h = {"topic": f"{unique}orphan", "partition": 0, "producer_id": 424_242, "producer_epoch": 3}
    ensure_workload_topics(admin, [h["topic"]], 1)
    h["start_timestamp_ms"] = int(time.time() * 1000) - 60_000
    h["start_offset"] = raw_transactional_produce(
        admin,
        topic=h["topic"],
        partition=0,
        transactional_id=f"{unique}orphan",
        producer_id=h["producer_id"],
        producer_epoch=h["producer_epoch"],
        base_sequence=0,
        timestamp_ms=h["start_timestamp_ms"],
        value=b"orphan",
    )
    prefix = f"{unique}out"
    topic = f"{prefix}.producer-state"
    common = [
        "--bootstrap-server",
        bootstrap,
        "--topic-prefix",
        prefix,
        "--cluster",
        "ci",
        "--metrics-port",
        "0",
    ]
    done = txnwatch(
        "collect", *common, "--interval-ms", "500", "--max-sweeps", "2", "--topic-partitions", "2"
    )
    assert done.returncode == 0, done.stderr

    configs = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)], config_filter="all")
    config = configs["topic"][topic]
    assert config["cleanup.policy"]["value"] == "compact,delete"
    assert config["retention.ms"]["value"] == "86400000"
    records = read_all(bootstrap, topic)
    orphan_key = f"{h['topic']}-{h['partition']}".encode()
    snaps = [r for r in records if r.key == orphan_key]
    assert len(snaps) == 2  # one per sweep while it is open
    for r in snaps:
        assert dict(r.headers)["txnwatch.type"] == b"partition-snapshot"
        s = PartitionSnapshot.model_validate_json(r.value)
        assert s.cluster == "ci" and (s.topic, s.partition) == (h["topic"], h["partition"])
        assert_matches_truth(s, h)
    summaries = [r for r in records if r.key == b"__sweep__-broker-1"]
    assert len(summaries) == 2
    assert dict(summaries[0].headers)["txnwatch.type"] == b"broker-sweep-summary"
    assert BrokerSweepSummary.model_validate_json(summaries[0].value).partitions_covered > 0

    # Aborted while no collector runs: the next one reads the topic back and still closes the partition.
    abort_orphan(admin, h)
    done = txnwatch("collect", *common, "--max-sweeps", "1")
    assert done.returncode == 0, done.stderr
    latest = [r for r in read_all(bootstrap, topic) if r.key == orphan_key][-1]
    assert PartitionSnapshot.model_validate_json(latest.value).open_transactions == ()


# ---------------------------------------------------------------------------- coordinator log positions

TXN_LOG = "__transaction_state"


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    """The topic's end offsets read independently of txnwatch (KafkaConsumer.end_offsets)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        tps = [KafkaTP(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        return {tp.partition: offset for tp, offset in consumer.end_offsets(tps).items()}
    finally:
        consumer.close()


def transaction_log_of(bootstrap: str, transactional_id: str) -> list[tuple[int, int, TxnStatus | None]]:
    """(partition, offset, status; None for a tombstone) of every `__transaction_state` record of the id."""
    out = []
    for r in read_all(bootstrap, TXN_LOG):
        try:
            if decode_key(r.key).transactional_id != transactional_id:
                continue
            value = decode_value(r.value)
        except DecodeError:
            continue
        out.append((r.partition, r.offset, None if value is None else value.status))
    return out


def test_sweep_publishes_the_transaction_log_position_after_real_transactions(
    admin: KafkaAdminClient, bootstrap: str, unique: str
) -> None:
    truth = run_workload(
        bootstrap, "--scenario", "steady", "--topic-prefix", unique, "--seconds", "1", "--abort-ratio", "0"
    )
    committed = [t for t in truth["transactions"] if t["kind"] == "committed"]
    assert committed
    tid = committed[-1]["transactional_id"]
    # commit() returns at PrepareCommit; wait until the coordinator has logged the end of the id's last one.
    deadline = time.monotonic() + 30
    while not (log := transaction_log_of(bootstrap, tid)) or log[-1][2] is not TxnStatus.COMPLETE_COMMIT:
        assert time.monotonic() < deadline, f"no CompleteCommit for {tid} in {TXN_LOG}: {log}"
        time.sleep(0.2)

    for _ in range(5):  # nothing else writes to the log now, but an expiring id could: compare a quiet moment
        before = end_offsets(bootstrap, TXN_LOG)
        result = collector(admin, without_history=True).sweep()  # an empty snapshot for every partition
        after = end_offsets(bootstrap, TXN_LOG)
        if before == after:
            break
    (position,) = result.positions
    assert (position.topic, position.cluster, position.sweep_id) == (TXN_LOG, "test", result.sweep_id)
    assert position.partitions == len(after) == 3  # the test bed's transaction.state.log.num.partitions
    assert position.end_offsets == after
    assert position.as_of_ms >= max(s.observed_at_ms for s in [*result.snapshots, *result.empties])
    # Every record of the transaction committed before the sweep lies below the position.
    for partition, offset, _ in log:
        assert offset < position.end_offsets[partition]

    # Published on the snapshot topic after the sweep's other records, with its header.
    topic = f"{unique}out.producer-state"
    ensure_topics(admin, {topic: OutputTopicSettings(partitions=1)})
    publisher = Publisher(
        KafkaSink(producer_for(KafkaSettings(bootstrap_servers=bootstrap))),
        snapshot_topic=topic,
        coordinator_topic=f"{unique}out.coordinator-state",
    )
    try:
        publisher.publish_sweep(result)
    finally:
        publisher.close()
    records = read_all(bootstrap, topic)
    assert records[-1].key == b"__position__-__transaction_state"
    assert dict(records[-1].headers)["txnwatch.type"] == COORDINATOR_LOG_POSITION_TYPE.encode()
    assert CoordinatorLogPosition.model_validate_json(records[-1].value) == position


def test_cli_describe_mode_publishes_the_coordinator_state_position(bootstrap: str, unique: str) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"{unique}described")
    producer.init_transactions()
    producer.close()
    prefix = f"{unique}d"
    done = txnwatch(
        "collect",
        "--bootstrap-server",
        bootstrap,
        "--once",
        "--publish",
        "--coordinator-source",
        "describe",
        "--topic-prefix",
        prefix,
        "--metrics-port",
        "0",
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    (position,) = [CoordinatorLogPosition.model_validate(p) for p in out["coordinator_log_positions"]]
    coordinator_topic = f"{prefix}.coordinator-state"
    assert position.topic == coordinator_topic and position.partitions == 6
    # The topic is new and only this poll wrote to it: every record it published lies below the position.
    assert position.end_offsets == end_offsets(bootstrap, coordinator_topic)
    assert sum(position.end_offsets.values()) == len(out["coordinator_records"]) > 0
    assert f"{unique}described" in {r["transactional_id"] for r in out["coordinator_records"]}
    positions = [
        r for r in read_all(bootstrap, f"{prefix}.producer-state") if r.key.startswith(b"__position__")
    ]
    assert [r.key for r in positions] == [f"__position__-{coordinator_topic}".encode()]
    assert dict(positions[0].headers)["txnwatch.type"] == b"coordinator-log-position"
    assert CoordinatorLogPosition.model_validate_json(positions[0].value) == position


class ListsAfter(KafkaWire):
    """The real wire; `before_listing` runs as the poll sends its ListTransactions (what happened between the
    sweep and the poll's listing)."""

    before_listing: Callable[[], None] | None = None

    def list_transactions(
        self,
        *,
        producer_ids: Sequence[int] = (),
        states: Sequence[str] = (),
        duration_filter_ms: int | None = None,
    ) -> ListingResult:
        hook, self.before_listing = self.before_listing, None
        if hook is not None:
            hook()
        return super().list_transactions(
            producer_ids=producer_ids, states=states, duration_filter_ms=duration_filter_ms
        )


def test_describe_mode_describes_again_an_id_a_sweep_saw_open(
    admin: KafkaAdminClient,
    bootstrap: str,
    unique: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A real producer commits T1; a poll records its completion. It begins T2, a sweep reports T2 open, and T2
    commits before the next poll lists: both listings say CompleteCommit with the same producer id. The poll
    after the sweep (`_collect_once`, as `collect` runs it) describes the id again and publishes T2's
    completion, stamped after the sweep's report: else the record of T1's completion would stand, and a
    position would vouch for it against the report of T2."""
    topic, tid = f"{unique}between", f"{unique}between"
    ensure_workload_topics(admin, [topic], 1)
    wire = ListsAfter(admin, request_timeout_ms=5_000)
    poller = CoordinatorPoller(wire, clock_ms=lambda: time.time_ns() // 1_000_000)
    producer = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=tid)

    def completed_in_listing() -> None:
        # commit_transaction() returns at PrepareCommit; CompleteCommit follows the markers.
        deadline = time.monotonic() + 15
        while not any(
            (t.transactional_id, t.state) == (tid, "CompleteCommit")
            for t in wire.list_transactions().listings
        ):
            assert time.monotonic() < deadline, f"{tid} never listed CompleteCommit"
            time.sleep(0.1)

    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send(topic, b"t1")
        producer.commit_transaction()
        completed_in_listing()
        t1 = {r.transactional_id: r for r in poller.poll()}[tid]
        assert t1.state is CoordinatorState.COMPLETE_COMMIT

        producer.begin_transaction()
        producer.send(topic, b"t2")
        producer.flush()  # on the leader: the sweep sees it open

        def commit_t2() -> None:
            producer.commit_transaction()
            completed_in_listing()

        wire.before_listing = commit_t2
        capsys.readouterr()
        assert _collect_once(collector(admin), None, poller, wire, "test", "json") == 0
        out = json.loads(capsys.readouterr().out)
    finally:
        producer.close()
    (report,) = [PartitionSnapshot.model_validate(s) for s in out["snapshots"] if s["topic"] == topic]
    (t2_open,) = report.open_transactions
    assert t2_open.producer_id == t1.producer_id
    (t2,) = [
        CoordinatorRecord.model_validate(r)
        for r in out["coordinator_records"]
        if r["transactional_id"] == tid
    ]
    assert (t2.state, t2.producer_id) == (
        CoordinatorState.COMPLETE_COMMIT,
        t1.producer_id,
    )  # the same listing
    assert t2.start_timestamp_ms > t1.start_timestamp_ms  # T2's: the coordinator's AddPartitions time
    assert t2.last_update_timestamp_ms > report.observed_at_ms


def read_all(bootstrap: str, topic: str) -> list[Any]:
    """Every record of `topic`, in offset order per partition (so per key in publishing order)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        tps = [KafkaTP(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        end = consumer.end_offsets(tps)
        records: list[Any] = []
        deadline = time.monotonic() + 30
        while any(consumer.position(tp) < end[tp] for tp in tps) and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=500).values():
                records.extend(batch)
        return sorted(records, key=lambda r: (r.partition, r.offset))
    finally:
        consumer.close()


# ------------------------------------------------------------------------------- three brokers, faults


THREE_NODES = TestBedConfig(nodes=3, partition_verification=False)


@pytest.fixture(scope="module", autouse=True)
def _three_nodes_early(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    """Start the 3-node cluster in the background while the one-broker tests run (it takes 30-50 s here)."""
    state: dict[str, Any] = {}
    wanted = any(
        "cluster3" in item.fixturenames for item in request.session.items if item.module is request.module
    )
    if wanted:
        state_dir = tmp_path_factory.mktemp("three-nodes")
        state["dir"] = state_dir

        def start() -> None:
            try:
                state["cluster"] = start_cluster(THREE_NODES, state_dir)
            except BaseException as exc:
                state["error"] = exc

        state["thread"] = threading.Thread(target=start, daemon=True)
        state["thread"].start()
    yield state
    if wanted:
        state["thread"].join(timeout=120)
        stop_cluster(state["dir"], timeout_s=0.5)  # throwaway: no graceful shutdown needed


@pytest.fixture(scope="module")
def cluster3(_three_nodes_early: dict[str, Any]) -> Cluster:
    _three_nodes_early["thread"].join(timeout=180)
    if "error" in _three_nodes_early:
        raise _three_nodes_early["error"]
    cluster: Cluster = _three_nodes_early["cluster"]
    return cluster


class StaleFirstView:
    """The real wire, except that the first metadata answer is a given (stale) view."""

    def __init__(self, wire: KafkaWire, stale: ClusterView) -> None:
        self._wire = wire
        self._stale: ClusterView | None = stale

    def metadata(self) -> ClusterView:
        view, self._stale = self._stale, None
        return view if view is not None else self._wire.metadata()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._wire, name)


def test_three_brokers_stale_leaders_and_an_unreachable_broker(cluster3: Cluster, unique: str) -> None:
    admin3 = connect_admin(
        KafkaSettings(bootstrap_servers=cluster3.bootstrap_servers), request_timeout_ms=5_000
    )
    try:
        # dev.kafka returns once DescribeCluster lists 3 brokers, fenced ones included (kafka-python asks with
        # include_fenced_brokers); topics created before all 3 are unfenced would skip the late one.
        requests = RequestLog()
        wire = KafkaWire(admin3, request_timeout_ms=5_000, requests=requests)
        deadline = time.monotonic() + 60
        while set(wire.metadata().brokers) != {1, 2, 3} and time.monotonic() < deadline:
            time.sleep(0.5)
        spread, replicated = f"{unique}spread", f"{unique}replicated"
        admin3.create_topics([NewTopic(spread, 6, 1), NewTopic(replicated, 3, 3)])
        wait_for_leaders(admin3, [spread, replicated])
        # New partitions become led on each broker at its own pace: wait until a sweep covers them all.
        deadline = time.monotonic() + 30
        while True:
            result = Collector(wire, cluster="test", settings=SETTINGS, open_partitions=set()).sweep()
            if result.partitions_covered == result.partitions_total or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert result.partitions_covered == result.partitions_total
        view = wire.metadata()
        assert set(view.brokers) == {1, 2, 3}

        # Stale metadata: every partition of `spread` points at the wrong (live) broker. The brokers answer
        # NOT_LEADER_OR_FOLLOWER, the collector refreshes metadata and asks the real leaders, in the same sweep.
        # Up to three tries: on a loaded machine a KRaft broker can miss a heartbeat and really lose its leaders
        # mid-sweep, which the collector rightly reports as uncovered; each try says what it lost.
        tries: list[tuple[int, int, dict[int, dict[str, int]], list[str]]] = []
        for _ in range(3):
            view = wire.metadata()
            stale = ClusterView(
                view.brokers,
                {tp: (leader % 3) + 1 if tp[0] == spread else leader for tp, leader in view.leaders.items()},
                view.internal_topics,
            )
            col = Collector(
                StaleFirstView(wire, stale), cluster="test", settings=SETTINGS, open_partitions=None
            )  # type: ignore[arg-type]
            before = sum(requests.by_broker("DescribeProducers").values())
            result = col.sweep()
            asked = sum(requests.by_broker("DescribeProducers").values()) - before
            uncovered = {s.broker: dict(s.errors) for s in result.summaries if s.errors}
            tries.append((result.partitions_covered, asked, uncovered, result.problems))
            if result.partitions_covered == result.partitions_total == len(view.leaders) and not uncovered:
                break
        assert result.partitions_covered == result.partitions_total == len(view.leaders), tries
        assert not uncovered, tries
        assert {tp for tp in empties(result) if tp[0] == spread} == {(spread, p) for p in range(6)}
        assert asked > 3, tries  # a second round was needed

        # One broker dies (SIGKILL): the sweep still covers the others, and says what it missed.
        victim = 3
        node = next(n for n in cluster3.nodes if n.node_id == victim)
        os.kill(node.pid, signal.SIGKILL)
        col = Collector(wire, cluster="test", settings=SETTINGS, open_partitions=set())
        began = time.monotonic()
        result = col.sweep()
        assert time.monotonic() - began < 30
        led_by_live = {tp for tp, leader in view.leaders.items() if leader in (1, 2)}
        by_broker = {s.broker: s for s in result.summaries}
        assert sum(by_broker[b].partitions_covered for b in (1, 2)) >= len(led_by_live)
        lost = sum(by_broker[victim].errors.values()) + sum(
            by_broker[-1].errors.values() if -1 in by_broker else ()
        )
        assert by_broker[victim].partitions_covered == 0
        assert lost >= sum(1 for leader in view.leaders.values() if leader == victim)
        # Backed off on the next sweep; partitions it led with other replicas move and are covered again.
        deadline = time.monotonic() + 45
        moved_and_covered = False
        while time.monotonic() < deadline and not moved_and_covered:
            time.sleep(1)
            result = col.sweep()
            moved = wire.metadata().leaders
            live_led = sum(1 for leader in moved.values() if leader in (1, 2))
            moved_and_covered = (
                all(moved[(replicated, p)] in (1, 2) for p in range(3))
                and result.partitions_covered >= live_led
            )
        assert moved_and_covered
        by_broker = {s.broker: s for s in result.summaries}
        assert not by_broker[1].errors and not by_broker[2].errors
        errors = {e for s in result.summaries for e in s.errors}
        assert errors <= {"BROKER_BACKOFF", "BROKER_UNREACHABLE", "REQUEST_TIMED_OUT", "LEADER_NOT_AVAILABLE"}
    finally:
        admin3.close()


def wait_for_leaders(admin: KafkaAdminClient, topics: list[str]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        described = admin.describe_topics(topics)
        if len(described) == len(topics) and all(
            p["leader_id"] >= 0 for t in described for p in t["partitions"]
        ):
            return
        time.sleep(0.2)
    raise AssertionError(f"{topics} have no leaders")


def test_a_publish_to_a_cluster_gone_away_fails_within_its_timeout(tmp_path: Path) -> None:
    """The collector's publish waits at most its timeout when every broker is gone (the flush and the records'
    results share one deadline). Before, the flush alone waited 60 s and each result up to 60 s more: a cluster
    back within that minute was never said to have been away, and the sweep, the probes and /healthz waited."""
    bed = start_cluster(TestBedConfig(nodes=1), tmp_path / "bed")
    try:
        topic = f"sink-{uuid.uuid4().hex[:6]}"
        admin = KafkaAdminClient(bootstrap_servers=bed.bootstrap_servers)
        try:
            admin.create_topics([NewTopic(topic, 1, 1)])
        finally:
            admin.close()
        sink = KafkaSink(
            producer_for(KafkaSettings(bootstrap_servers=bed.bootstrap_servers), max_block_ms=3_000),
            timeout_s=3.0,
        )
        try:
            sink.send_all([OutRecord(topic, b"k", b"before", [])])  # metadata known, a record acknowledged
            stop_cluster(tmp_path / "bed", timeout_s=5)
            began = time.monotonic()
            with pytest.raises(AdminError, match=r"not acknowledged within 3s|Produce"):
                sink.send_all([OutRecord(topic, b"k", b"after", [])])
            took = time.monotonic() - began
        finally:
            with contextlib.suppress(Exception):
                sink.close()
    finally:
        stop_cluster(tmp_path / "bed", timeout_s=0.5)
    assert took < 8, took
