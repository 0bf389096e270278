"""`txnwatch proposals abort --execute` refusing on the real broker, each state made for real: the transaction
resolved before execute (aborted by someone else, or committed), the producer's epoch moved at the leader, a live
Ongoing transaction with the partition, the orphan's transactional id live at its epoch (`live-owner-same-epoch`),
and a coordinator in PrepareCommit (three-node bed, a broker stopped).

Each refusal is checked on the broker, not only in the answer: the partition's batches (control batches
included), its LSO and the leader's producer entry are the same after the run as before it, and the audit record
names the outcome and the change. The candidates are planned by hand from what the leader reports (as the job
would plan them; tests/workloads.py `plan_by_hand`).
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.admin import NewTopic
from kafka.structs import TopicPartition
from workloads import (
    Proposals,
    lso,
    partition_batches,
    plan_by_hand,
    produce_plain,
    producer_row,
    read_committed_values,
    run_workload,
)

from admin.wire.kafka_wire import KafkaWire
from detectors.codec import DecodeError, decode_key, decode_value
from detectors.currency import coordinator_partition
from dev.kafka import Cluster, TestBedConfig, start_cluster, stop_cluster
from dev.oracle import parse_table, transactions_command
from dev.workload import raw_transactional_produce

pytestmark = pytest.mark.broker


@dataclass(frozen=True)
class Partition:
    """What a refusal must leave as it was: batches (with control batches), LSO, the producer's leader entry."""

    batches: Any
    lso: int | None
    row: tuple[int, int, int] | None


def state_of(bootstrap: str, wire: KafkaWire, topic: str, partition: int, producer_id: int) -> Partition:
    return Partition(
        partition_batches(bootstrap, topic, partition),
        lso(wire, topic, partition),
        producer_row(wire, topic, partition, producer_id),
    )


def orphan(bootstrap: str, prefix: str, *extra: str) -> dict[str, Any]:
    truth = run_workload(bootstrap, "--scenario", "hanging", "--topic-prefix", prefix, *extra)
    (h,) = [t for t in truth["transactions"] if t["kind"] == "hanging"]
    return h  # type: ignore[no-any-return]


def execute(proposals: Proposals, candidate_id: str, *flags: str) -> tuple[int, dict[str, Any], str]:
    done = proposals.run("abort", candidate_id, "--execute", "--actor", "refusal-test", *flags)
    return done.returncode, json.loads(done.stdout), done.stderr


def test_resolved_before_execute_is_refused(bootstrap: str, wire: KafkaWire, unique: str) -> None:
    """Planned while open, resolved before execute by someone else: aborted with Kafka's tool (an orphan) and
    committed by its producer (a live transaction). Refused, exit 3, the change named, nothing written; only an
    abort txnwatch itself audited earlier makes a second --execute the no-op (exit 4)."""
    proposals = Proposals(bootstrap, f"{unique}tw")
    # An orphan someone else aborts with Kafka's tool between plan and execute.
    h = orphan(bootstrap, f"{unique}o-")
    topic, partition, start = h["topic"], h["partition"], h["start_offset"]
    aborted = plan_by_hand(wire, topic, partition, h["producer_id"])
    proposals.publish(aborted)
    transactions_command(
        bootstrap, "abort", "--topic", topic, "--partition", str(partition), "--start-offset", str(start)
    )
    before = state_of(bootstrap, wire, topic, partition, h["producer_id"])
    assert before.lso is not None and before.lso > start
    code, record, stderr = execute(proposals, aborted.candidate_id)
    assert code == 3, stderr
    assert record["outcome"] == "REFUSED" and record["marker_written"] is False
    assert "changed since the plan" in record["message"]
    assert f"the transaction at offset {start} was committed or aborted since the plan" in record["message"]
    assert state_of(bootstrap, wire, topic, partition, h["producer_id"]) == before

    # A live transaction planned (wrongly) while open, then committed by its producer.
    live_topic = f"{unique}live"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(live_topic, 1, 1)])
    finally:
        admin.close()
    producer = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"{unique}live-tx", acks="all")
    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send(live_topic, b"in-flight", partition=0).get(timeout=30)
        (pid,) = [p.producer_id for p in wire_producers(wire, live_topic) if p.current_txn_start_offset >= 0]
        committed = plan_by_hand(wire, live_topic, 0, pid)
        proposals.publish(committed)
        producer.commit_transaction()
    finally:
        producer.close(timeout=10)
    wait_for(lambda: (lso(wire, live_topic, 0) or 0) > 0, 15, "the commit marker")
    before = state_of(bootstrap, wire, live_topic, 0, pid)
    code, record, stderr = execute(proposals, committed.candidate_id)
    assert code == 3, stderr
    assert record["outcome"] == "REFUSED" and record["marker_written"] is False
    assert "was committed or aborted since the plan" in record["message"]
    assert state_of(bootstrap, wire, live_topic, 0, pid) == before
    audits = proposals.endings(2)
    assert [(a.candidate_id, a.outcome.value) for a in audits] == [
        (aborted.candidate_id, "REFUSED"),
        (committed.candidate_id, "REFUSED"),
    ]
    assert all("since the plan" in a.message and a.marker is None for a in audits)


def wire_producers(wire: KafkaWire, topic: str, partition: int = 0) -> Any:
    tp = (topic, partition)
    leader = wire.metadata([topic]).leaders[tp]
    (batch,) = wire.describe_producers({leader: [[tp]]})
    return batch.results[tp].producers


def wait_for(predicate: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")


def test_epoch_moved_is_refused(bootstrap: str, wire: KafkaWire, unique: str) -> None:
    """The same transactional id initialises again (InitProducerId: same producer id, next epoch) and its next
    transaction writes to the orphan's partition without adding it, as the first did: the leader's entry moves
    to the new epoch while the transaction stays open at the planned start offset."""
    proposals = Proposals(bootstrap, f"{unique}tw")
    h = orphan(bootstrap, f"{unique}e-")
    topic, partition, start, pid = h["topic"], h["partition"], h["start_offset"], h["producer_id"]
    candidate = plan_by_hand(wire, topic, partition, pid)
    proposals.publish(candidate)
    assert candidate.spec.producer_epoch == h["producer_epoch"]

    again = orphan(bootstrap, f"{unique}e-", "--transactional-id", h["transactional_id"])
    assert (again["topic"], again["partition"], again["producer_id"]) == (topic, partition, pid)
    moved = again["producer_epoch"]
    assert moved > h["producer_epoch"]
    before = state_of(bootstrap, wire, topic, partition, pid)
    # What the broker allowed: the newer epoch's batch joined the open transaction, which still starts at the
    # planned offset; no marker was ever written here (coordinator epoch -1).
    assert before.row == (moved, -1, start)
    assert before.lso == start

    code, record, stderr = execute(proposals, candidate.candidate_id)
    assert code == 3, stderr
    assert record["outcome"] == "REFUSED" and record["marker_written"] is False
    assert f"producer epoch moved from {h['producer_epoch']} to {moved}" in record["message"]
    assert state_of(bootstrap, wire, topic, partition, pid) == before
    (audit,) = proposals.endings(1)
    assert (
        audit.outcome.value == "REFUSED" and f"moved from {h['producer_epoch']} to {moved}" in audit.message
    )

    # The broker would have fenced the stale plan's marker too (admin markers: epoch >= the entry's epoch).
    leader = wire.metadata([topic]).leaders[(topic, partition)]
    stale = wire.write_abort_marker(
        leader,
        topic=topic,
        partition=partition,
        producer_id=pid,
        producer_epoch=h["producer_epoch"],
        coordinator_epoch=0,
    )
    assert stale == "INVALID_PRODUCER_EPOCH"
    assert state_of(bootstrap, wire, topic, partition, pid) == before

    # A fresh plan at the moved epoch aborts it (and leaves the shared broker clean); the second run's producer
    # restarted too, so its id is past that epoch and the abort needs no --allow-live-owner.
    fresh = plan_by_hand(wire, topic, partition, pid)
    assert fresh.spec.producer_epoch == moved and again["owner_epoch"] == moved + 1
    proposals.publish(fresh)
    code, record, stderr = execute(proposals, fresh.candidate_id)
    assert code == 0, stderr
    assert (lso(wire, topic, partition) or 0) > start
    # One ABORT marker at the moved epoch closes both orphan batches (the first epoch's and the second's).
    batches = partition_batches(bootstrap, topic, partition)
    assert [(b.marker, b.producer_epoch) for b in batches if b.control] == [("ABORT", moved)]
    assert [b.producer_epoch for b in batches if b.values == (b"orphan",)] == [h["producer_epoch"], moved]
    assert read_committed_values(bootstrap, topic, partition, start, timeout_s=3) == []


def test_ongoing_with_the_partition_is_refused(bootstrap: str, wire: KafkaWire, unique: str) -> None:
    proposals = Proposals(bootstrap, f"{unique}tw")
    topic = f"{unique}ongoing"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(topic, 1, 1)])
    finally:
        admin.close()
    txn_id = f"{unique}ongoing-tx"
    producer = KafkaProducer(
        bootstrap_servers=bootstrap, transactional_id=txn_id, acks="all", transaction_timeout_ms=60_000
    )
    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send(topic, b"in-flight", partition=0).get(timeout=30)
        (pid,) = [p.producer_id for p in wire_producers(wire, topic) if p.current_txn_start_offset >= 0]
        candidate = plan_by_hand(wire, topic, 0, pid)
        proposals.publish(candidate)
        before = state_of(bootstrap, wire, topic, 0, pid)
        code, record, stderr = execute(proposals, candidate.candidate_id)
        assert code == 3, stderr
        assert record["outcome"] == "REFUSED" and record["marker_written"] is False
        assert f"{txn_id}" in record["message"] and "Ongoing" in record["message"]
        assert f"{topic}-0" in record["message"]
        assert state_of(bootstrap, wire, topic, 0, pid) == before
        producer.commit_transaction()  # nothing was broken
    finally:
        producer.close(timeout=10)
    assert b"in-flight" in read_committed_values(bootstrap, topic, 0, 0)
    (audit,) = proposals.endings(1)
    assert audit.outcome.value == "REFUSED" and "Ongoing" in audit.message


def recorded_transaction_versions(bootstrap: str, transactional_id: str) -> list[int]:
    """ClientTransactionVersion of each of the id's records in `__transaction_state` (its own partition), in log
    order: what its coordinator recorded of the client's requests."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, consumer_timeout_ms=2_000)
    try:
        partitions = consumer.partitions_for_topic("__transaction_state") or set()
        tp = TopicPartition("__transaction_state", coordinator_partition(transactional_id, len(partitions)))
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        versions = []
        for r in consumer:
            try:
                if decode_key(r.key).transactional_id != transactional_id:
                    continue
                value = decode_value(r.value)
            except DecodeError:
                continue
            if value is not None:
                versions.append(value.client_transaction_version)
        return versions
    finally:
        consumer.close()


def test_live_owner_at_the_same_epoch_is_refused(bootstrap: str, wire: KafkaWire, unique: str) -> None:
    """The orphan's transactional id is live at the orphan's epoch: its kafka-python producer (AddPartitionsToTxn
    and EndTxn v3 at most, so its coordinator records client transaction version 0 and keeps the epoch from one
    transaction to the next) committed the transaction's other partition, and the coordinator holds it
    CompleteCommit at that epoch. Whether that producer still runs, no broker can tell: any transaction of it that
    adds the orphan's partition would write into the orphan's open transaction. Refused by name, exit 3, nothing
    written. Once the id is initialised again (InitProducerId, as a restarted application does: the next epoch),
    the same candidate is aborted without the flag."""
    proposals = Proposals(bootstrap, f"{unique}tw")
    # No restart after the orphan (--owner-stays-live): the id stays live at the orphan's epoch.
    h = orphan(bootstrap, f"{unique}lo-", "--owner-stays-live")
    assert h["owner_epoch"] == h["producer_epoch"]
    topic, partition, start, pid = h["topic"], h["partition"], h["start_offset"], h["producer_id"]
    txn_id, epoch = h["transactional_id"], h["producer_epoch"]
    assert set(recorded_transaction_versions(bootstrap, txn_id)) == {0}
    candidate = plan_by_hand(wire, topic, partition, pid)
    assert candidate.spec.producer_epoch == epoch
    proposals.publish(candidate)
    before = state_of(bootstrap, wire, topic, partition, pid)
    assert before.lso == start

    code, record, stderr = execute(proposals, candidate.candidate_id)
    assert code == 3, stderr
    assert record["outcome"] == "REFUSED" and record["marker_written"] is False
    assert record["allow_live_owner"] is False and record["verify"]["waived"] == []
    assert (
        f"live-owner-same-epoch: transactional id {txn_id} owns producer {pid} at epoch {epoch}, the marker's, "
        "and is live (CompleteCommit, transaction version 0 or unknown)"
    ) in record["message"]
    assert "--allow-live-owner" in stderr
    owner = record["before"]["coordinator"]
    assert (owner["transactional_id"], owner["state"], owner["producer_epoch"]) == (
        txn_id,
        "CompleteCommit",
        epoch,
    )
    assert state_of(bootstrap, wire, topic, partition, pid) == before

    # What the refusal asks for: the owner's producer starts again (InitProducerId bumps the epoch).
    restarted = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=txn_id, acks="all")
    try:
        restarted.init_transactions()
        assert int(restarted._transaction_manager.producer_id_and_epoch.epoch) == epoch + 1
    finally:
        restarted.close(timeout=10)
    code, record, stderr = execute(proposals, candidate.candidate_id)
    assert code == 0, stderr
    assert record["outcome"] == "ABORTED" and record["verify"]["waived"] == []
    assert record["before"]["coordinator"]["producer_epoch"] == epoch + 1
    assert (lso(wire, topic, partition) or 0) > start
    batches = partition_batches(bootstrap, topic, partition)
    assert [(b.marker, b.producer_epoch) for b in batches if b.control] == [("ABORT", epoch)]
    assert [a.outcome.value for a in proposals.endings(2)] == ["REFUSED", "ABORTED"]


# --------------------------------------------------------------------------------------- PrepareCommit


@pytest.fixture(scope="module")
def three_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    state_dir: Path = tmp_path_factory.mktemp("three-node-testbed")
    cluster = start_cluster(TestBedConfig(nodes=3, partition_verification=False), state_dir)
    try:
        yield cluster
    finally:
        stop_cluster(state_dir)


def stop_node(cluster: Cluster, node_id: int, timeout_s: float = 60) -> None:
    """SIGTERM one broker of the bed (controlled shutdown) and wait until its JVM is gone."""
    (node,) = [n for n in cluster.nodes if n.node_id == node_id]
    os.kill(node.pid, signal.SIGTERM)
    wait_for(lambda: not running(node.pid), timeout_s, f"broker {node_id} to stop")


def isr(admin: KafkaAdminClient, topic: str) -> list[int]:
    (p,) = admin.describe_topics([topic])[0]["partitions"]
    return sorted(p["isr_nodes"])


def running(pid: int) -> bool:
    # The JVM is a child of this process (start_cluster's Popen): once it exits it stays a zombie until reaped.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_prepare_commit_is_refused(three_nodes: Cluster) -> None:
    """A transaction spanning partition B (replicas K and X, min.insync.replicas 2) commits after X stopped: its
    coordinator writes PrepareCommit, and B's leader K refuses the marker (NOT_ENOUGH_REPLICAS, which the marker
    channel retries), so it stays PrepareCommit. The same producer id holds an orphan on partition A (never
    added, led by K): a candidate whose owner is in a Prepare state.

    (With B on X alone, Kafka 4.3's coordinator skips a partition without a leader as "likely deleted" and
    completes the commit: CompleteCommit, and B keeps an open transaction nobody will mark.)"""
    bootstrap = three_nodes.bootstrap_servers
    unique = f"p{uuid.uuid4().hex[:8]}-"
    txn_id = f"{unique}tx"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    wire = KafkaWire(admin)
    producer = KafkaProducer(
        bootstrap_servers=bootstrap, transactional_id=txn_id, acks="all", transaction_timeout_ms=60_000
    )
    try:
        producer.init_transactions()
        pe = producer._transaction_manager.producer_id_and_epoch
        pid, epoch = int(pe.producer_id), int(pe.epoch)
        (listing,) = [t for t in wire.list_transactions(producer_ids=[pid]).listings if t.producer_id == pid]
        coordinator = listing.coordinator
        nodes = sorted(n.node_id for n in three_nodes.nodes)
        victim = next(n for n in reversed(nodes) if n != coordinator)
        keeper = next(n for n in nodes if n != victim)
        topic_b, topic_a = f"{unique}b", f"{unique}a"
        admin.create_topics(
            [
                NewTopic(
                    topic_b,
                    -1,
                    -1,
                    replica_assignments={0: [keeper, victim]},
                    topic_configs={"min.insync.replicas": "2"},
                ),
                NewTopic(topic_a, -1, -1, replica_assignments={0: [keeper]}),
            ]
        )
        wait_for(
            lambda: all(wire.metadata([t]).leaders.get((t, 0), -1) >= 0 for t in (topic_b, topic_a)),
            30,
            "leaders of the new topics",
        )
        producer.begin_transaction()
        producer.send(topic_b, b"in-b", partition=0).get(timeout=30)
        start = raw_transactional_produce(
            admin,
            topic=topic_a,
            partition=0,
            transactional_id=txn_id,
            producer_id=pid,
            producer_epoch=epoch,
            base_sequence=0,
            timestamp_ms=int(time.time() * 1000),
            value=b"orphan",
        )
        produce_plain(bootstrap, topic_a, 0, b"after-the-orphan")
        assert producer_row(wire, topic_a, 0, pid) == (epoch, -1, start)

        stop_node(three_nodes, victim)
        wait_for(
            lambda: victim not in wire.metadata().brokers and isr(admin, topic_b) == [keeper],
            60,
            f"broker {victim} gone from the metadata and from the ISR of {topic_b}-0",
        )
        producer.commit_transaction()  # answered once PrepareCommit is in the transaction log
        described = parse_table(transactions_command(bootstrap, "describe", "--transactional-id", txn_id))
        assert [(d["ProducerId"], d["TransactionState"]) for d in described] == [(str(pid), "PrepareCommit")]
        assert (
            f"{topic_b}-0" in described[0]["TopicPartitions"]
            and topic_a not in described[0]["TopicPartitions"]
        )

        proposals = Proposals(bootstrap, f"{unique}tw")
        candidate = plan_by_hand(wire, topic_a, 0, pid)
        proposals.publish(candidate)
        before = state_of(bootstrap, wire, topic_a, 0, pid)
        assert before.lso == start
        code, record, stderr = execute(proposals, candidate.candidate_id)
        assert code == 3, stderr
        assert record["outcome"] == "REFUSED" and record["marker_written"] is False
        assert f"{txn_id} (producer {pid}) is PrepareCommit" in record["message"]
        assert record["before"]["coordinator"]["state"] == "PrepareCommit"
        assert state_of(bootstrap, wire, topic_a, 0, pid) == before
        (audit,) = proposals.endings(1)
        assert audit.outcome.value == "REFUSED" and "PrepareCommit" in audit.message
        # Still PrepareCommit afterwards: nothing touched the coordinator's transaction either.
        (still,) = parse_table(transactions_command(bootstrap, "describe", "--transactional-id", txn_id))
        assert still["TransactionState"] == "PrepareCommit"
    finally:
        producer.close(timeout=5)
        admin.close()
