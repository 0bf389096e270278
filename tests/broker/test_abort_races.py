"""`proposals abort --execute` racing the cluster on the real broker: the producer commits or aborts, or the
partition's leader moves, or the orphan's live owner adds the partition and writes there (a COLLISION), after the
abort verified the transaction and before its marker went out.

A real race between verification and the marker is a few milliseconds wide. Each one here is made with a real
`admin.wire.kafka_wire.KafkaWire` whose `write_abort_marker` first does the racing act for real on the broker (the producer
commits, the leader moves), then sends the marker as usual: a real broker race in a fixed order. The abort runs
in this process through `admin.proposals.verified_marker.abort` (what `txnwatch proposals abort --execute` runs) and its ending
is published to the audit topic as the CLI publishes it. The partition is read back to the byte (control batches
included) to see which markers exist.

Covered elsewhere: two concurrent executions of one proposal write one marker (tests/broker/test_proposals.py
`test_two_concurrent_executions_write_one_marker`); resolved before execute (committed, or aborted with Kafka's
tool), an epoch moved, Ongoing, a live owner at the orphan's epoch, PrepareCommit: refused
(tests/broker/test_abort_refusals.py).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.admin import NewTopic
from kafka.structs import TopicPartition
from workloads import (
    lso,
    move_leader,
    partition_batches,
    partition_replicas,
    plan_by_hand,
    producer_row,
    read_committed_values,
    run_workload,
)

from admin.proposals.verified_marker import AbortAttempt, TopicAuditLog, abort
from admin.wire.kafka_wire import KafkaWire
from dev.kafka import Cluster, TestBedConfig, start_cluster, stop_cluster, stop_node
from dev.workload import raw_transactional_produce

pytestmark = pytest.mark.broker


class RacingWire(KafkaWire):
    """A real wire whose first `write_abort_marker` runs `race` (a real act on the broker) before sending."""

    def __init__(self, admin: KafkaAdminClient, race: Callable[[int], None]) -> None:
        super().__init__(admin)
        self._race: Callable[[int], None] | None = race
        self.sent: list[tuple[int, str | None]] = []  # (broker, its answer) per marker sent

    def write_abort_marker(self, broker: int, **marker: Any) -> str | None:
        if self._race is not None:
            race, self._race = self._race, None
            race(broker)
        answer = super().write_abort_marker(broker, **marker)
        self.sent.append((broker, answer))
        return answer


def execute_in_process(
    bootstrap: str,
    wire: KafkaWire,
    candidate: Any,
    prefix: str,
    *,
    allow_live_owner: bool = False,
    allow_leader_change: bool = False,
) -> AbortAttempt:
    """`proposals abort --execute` as the CLI runs it: the audit topic, the claim, the abort, its ending
    published. `allow_live_owner`: `--allow-live-owner`, for the collision test only (dev/workload.py's orphans
    end with their producer restarted: their id is at a later epoch than the orphan's). `allow_leader_change`:
    `--allow-leader-change`, for the tests that move the orphan's leader (an abort across a leader change is
    refused, `leader-changed-since-start`)."""
    audit_topic = f"{prefix}.audit"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        if audit_topic not in admin.list_topics():
            admin.create_topics([NewTopic(audit_topic, 1, -1)])
    finally:
        admin.close()
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=0)
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None)
    try:
        log = TopicAuditLog(producer, consumer, audit_topic)
        attempt = abort(
            wire,
            candidate,
            execute=True,
            actor="race-test",
            audit_log=log,
            allow_live_owner=allow_live_owner,
            allow_leader_change=allow_leader_change,
        )
        log.append(attempt.audit)
        return attempt
    finally:
        producer.close()
        consumer.close()


def orphan(bootstrap: str, prefix: str, transactional_id: str) -> dict[str, Any]:
    truth = run_workload(
        bootstrap, "--scenario", "hanging", "--topic-prefix", prefix, "--transactional-id", transactional_id
    )
    (h,) = [t for t in truth["transactions"] if t["kind"] == "hanging"]
    return h  # type: ignore[no-any-return]


def controls_from(batches: Any, offset: int) -> list[tuple[str, int, int]]:
    """(marker, producer id, producer epoch) of every control batch at or after `offset`."""
    return [
        (b.marker, b.producer_id, b.producer_epoch) for b in batches if b.control and b.base_offset >= offset
    ]


# ------------------------------------------------------------------------ the producer ends it meanwhile


@pytest.mark.parametrize("ending", ["commit", "abort"])
def test_producer_ends_the_transaction_while_execute_runs(bootstrap: str, unique: str, ending: str) -> None:
    """An orphan of transactional id T (its coordinator completed, the partition never added: verification
    passes). After the abort verified it, T's producer comes back: InitProducerId (a newer epoch), a transaction
    that adds the orphan's partition and writes to it (the batch joins the open transaction at the planned start
    offset), then commits or aborts it; its marker ends the orphan's records too. Our marker, planned at the old
    epoch, then reaches the leader: fenced (INVALID_PRODUCER_EPOCH). Refused, exit 3, nothing written by us: the
    only control batch after the orphan is the producer's own, and the audit says so."""
    txn_id = f"{unique}race-tx"
    h = orphan(bootstrap, f"{unique}r-", txn_id)
    topic, partition, start, pid = h["topic"], h["partition"], h["start_offset"], h["producer_id"]
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        wire = RacingWire(admin, race=lambda _leader: None)
        candidate = plan_by_hand(wire, topic, partition, pid)
        producer_epochs: list[int] = []

        def producer_ends_it(_leader: int) -> None:
            producer = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=txn_id, acks="all")
            try:
                producer.init_transactions()
                producer_epochs.append(int(producer._transaction_manager.producer_id_and_epoch.epoch))
                producer.begin_transaction()
                producer.send(topic, b"racing", partition=partition).get(timeout=30)
                if ending == "commit":
                    producer.commit_transaction()
                else:
                    producer.abort_transaction()
            finally:
                producer.close(timeout=10)

        wire._race = producer_ends_it
        before = partition_batches(bootstrap, topic, partition)
        assert controls_from(before, start) == []
        attempt = execute_in_process(bootstrap, wire, candidate, f"{unique}tw")
        lso_after = lso(wire, topic, partition)
    finally:
        admin.close()

    record = attempt.audit
    assert attempt.exit_code == 3, record.message
    assert record.outcome.value == "REFUSED" and record.marker_written is False
    assert "INVALID_PRODUCER_EPOCH" in record.message and "nothing was written" in record.message
    assert record.verify is not None and record.verify.outcome.value == "SAFE"  # it had verified: a real race
    (leader, answer), *more = wire.sent
    assert answer == "INVALID_PRODUCER_EPOCH" and not more
    after = partition_batches(bootstrap, topic, partition)
    assert after[: len(before)] == before  # nothing before it changed
    # One control batch after the orphan: the producer's, at its newer epoch; none at the planned epoch.
    ((marker, marker_pid, marker_epoch),) = controls_from(after, start)
    assert marker == ending.upper() and marker_pid == pid
    assert marker_epoch > candidate.spec.producer_epoch and marker_epoch >= producer_epochs[0]
    assert (lso_after or 0) > start
    visible = read_committed_values(bootstrap, topic, partition, start, timeout_s=3)
    if ending == "commit":
        # Kafka's behaviour, not ours: the producer's COMMIT covers the orphan's records (one open transaction).
        assert visible[:2] == [b"orphan", b"racing"]
    else:
        assert b"orphan" not in visible and b"racing" not in visible
    print(
        f"\n{ending}: marker planned at epoch {candidate.spec.producer_epoch} fenced by the leader "
        f"(broker {leader}); the producer's {marker} at epoch {marker_epoch}"
    )


# ---------------------------------------------------------------- the live owner writes to the partition meanwhile


def test_live_owner_that_writes_between_verify_and_marker_is_a_collision(bootstrap: str, unique: str) -> None:
    """A kafka-python producer (transaction version 0: AddPartitionsToTxn and EndTxn v3 at most), kept running,
    is the orphan's owner. Its transaction writes to partition 0 (added) and, as a buggy client does, to
    partition 1 without adding it (a raw Produce v9 batch with its producer id, epoch and sequence; partition
    verification is off on the bed), then commits: partition 1 holds an orphan at epoch E, and the owner stays
    live at E (CompleteCommit). `proposals abort --execute --allow-live-owner` verifies the orphan; between
    verification and the marker the owner's next transaction adds partition 1 and writes "collided" there. The
    leader takes it into the orphan's open transaction (same producer id and epoch: no new transaction starts),
    the marker aborts both, and the post-check passes (nothing open, the LSO past the orphan). Today's code
    ended this ABORTED, exit 0. The coordinator read after the marker lists partition 1: COLLISION, exit 5.

    What the owner sees next (the collision report says it): its next write to partition 1 and its commit
    succeed; a read_committed reader gets that later record, never "collided"."""
    topic, txn_id = f"{unique}owned", f"{unique}owner-tx"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(topic, 2, 1)])
    owner = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=txn_id, acks="all")
    try:
        owner.init_transactions()
        pe = owner._transaction_manager.producer_id_and_epoch
        pid, epoch = int(pe.producer_id), int(pe.epoch)
        owner.begin_transaction()
        owner.send(topic, b"committed", partition=0).get(timeout=30)
        start = raw_transactional_produce(
            admin,
            topic=topic,
            partition=1,
            transactional_id=txn_id,
            producer_id=pid,
            producer_epoch=epoch,
            base_sequence=0,
            timestamp_ms=int(time.time() * 1000),
            value=b"orphan",
        )
        # The orphan's batch was this client's sequence 0 on partition 1: its next batch there is 1.
        owner._transaction_manager.set_sequence_number(TopicPartition(topic, 1), 1)
        owner.commit_transaction()
        wire = RacingWire(admin, race=lambda _leader: None)
        assert producer_row(wire, topic, 1, pid) == (epoch, -1, start)
        candidate = plan_by_hand(wire, topic, 1, pid)
        joined: list[tuple[int, int, int] | None] = []

        def owner_writes(_leader: int) -> None:
            owner.begin_transaction()
            owner.send(topic, b"collided", partition=1).get(timeout=30)
            joined.append(producer_row(wire, topic, 1, pid))

        wire._race = owner_writes
        attempt = execute_in_process(bootstrap, wire, candidate, f"{unique}tw", allow_live_owner=True)
        record = attempt.audit
        # The owner's batch joined the orphan's open transaction: same epoch, same start offset.
        assert joined == [(epoch, -1, start)]
        assert attempt.exit_code == 5, record.message
        assert record.outcome.value == "COLLISION" and record.marker_written is True
        assert record.allow_live_owner and record.verify is not None and record.verify.waived
        assert record.post_check is not None and record.post_check.ok
        assert [answer for _, answer in wire.sent] == [None]
        assert f"{txn_id} now lists {topic}-1 in its transaction" in record.collision[0]
        assert (
            f"the leader of {topic}-1 took records of producer {pid} since verification (its last sequence moved "
            "from 0 to 1)"
        ) in record.collision
        assert record.message.startswith(
            f"COLLISION: marker written by broker {wire.sent[0][0]}, post-check passed"
        )
        # One ABORT after the orphan, at its epoch; the owner's batch lies between the two.
        batches = partition_batches(bootstrap, topic, 1)
        assert controls_from(batches, start) == [("ABORT", pid, epoch)]
        assert [b.values for b in batches if not b.control] == [(b"orphan",), (b"collided",)]

        # The owner goes on as if nothing happened, and Kafka lets it.
        owner.send(topic, b"after", partition=1).get(timeout=30)
        owner.commit_transaction()
    finally:
        owner.close(timeout=10)
        admin.close()
    visible = read_committed_values(bootstrap, topic, 1, start)
    assert visible == [b"after"]
    (commit,) = [b for b in partition_batches(bootstrap, topic, 1) if b.control and b.marker == "COMMIT"]
    assert (commit.producer_id, commit.producer_epoch) == (pid, epoch)
    print(f"\ncollision: {record.message}")


# --------------------------------------------------------------------------------- the leader moves meanwhile


@pytest.fixture(scope="module")
def three_node_bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    state_dir: Path = tmp_path_factory.mktemp("race-testbed")
    cluster = start_cluster(TestBedConfig(nodes=3, partition_verification=False), state_dir)
    try:
        yield cluster
    finally:
        stop_cluster(state_dir)


def test_leader_moves_between_verify_and_marker_is_followed(three_node_bed: Cluster) -> None:
    """The orphan's partition has three replicas. After verification, its leader is moved to another replica
    (preferred-leader election; the old leader stays up as a follower). The marker sent to the old leader is
    answered NOT_LEADER_OR_FOLLOWER (nothing written there); the abort reads metadata again and verifies again at
    the new leader, whose leader epoch is not the one the orphan's start batch was appended in: refused,
    `leader-changed-since-start` (an election, clean or not, could have lost a commit marker), nothing written.
    With `--allow-leader-change` (the operator checked) the same race is followed: the marker goes to the new
    leader, exactly one ABORT control batch on the partition, written by it."""
    bootstrap = three_node_bed.bootstrap_servers
    unique = f"m{uuid.uuid4().hex[:8]}-"
    h = orphan(bootstrap, f"{unique}r-", f"{unique}tx")
    topic, partition, start, pid = h["topic"], h["partition"], h["start_offset"], h["producer_id"]
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    moved: dict[str, Any] = {}
    try:
        old, replicas = partition_replicas(admin, topic, partition)
        assert len(replicas) == 3
        new = next(r for r in replicas if r != old)

        def move(to_broker: int) -> None:
            assert to_broker == old
            moved["seconds"] = move_leader(admin, topic, partition, new)

        wire = RacingWire(admin, race=move)
        candidate = plan_by_hand(wire, topic, partition, pid)
        started = candidate.evidence.start_batch_leader_epoch
        assert started is not None and started == wire.metadata([topic]).leader_epochs[(topic, partition)]
        refused = execute_in_process(bootstrap, wire, candidate, f"{unique}tw")
        record = refused.audit
        assert refused.exit_code == 3, record.message
        assert record.outcome.value == "REFUSED" and record.leader_moves == 1 and not record.marker_written
        assert wire.sent == [(old, "NOT_LEADER_OR_FOLLOWER")]
        assert record.before is not None and record.before.leader == new  # verified again at the new leader
        assert record.before.leader_epoch != started  # the new leader's (or unknown, if it had not caught up)
        assert "leader-changed-since-start: the leader of" in record.message
        assert controls_from(partition_batches(bootstrap, topic, partition), start) == []

        moved.clear()
        old, new = new, next(r for r in replicas if r not in (old, new))
        wire = RacingWire(admin, race=move)
        attempt = execute_in_process(bootstrap, wire, candidate, f"{unique}tw", allow_leader_change=True)
        record = attempt.audit
        assert attempt.exit_code == 0, record.message
        assert record.outcome.value == "ABORTED" and record.leader_moves == 1 and record.allow_leader_change
        assert record.verify is not None and record.verify.waived[0].startswith("leader-changed-since-start:")
        assert wire.sent == [(old, "NOT_LEADER_OR_FOLLOWER"), (new, None)]
        assert f"marker written by broker {new}" in record.message
        assert record.before is not None and record.before.leader == new  # verified again at the new leader
        batches = partition_batches(bootstrap, topic, partition)
        assert controls_from(batches, start) == [("ABORT", pid, candidate.spec.producer_epoch)]
        assert partition_replicas(admin, topic, partition)[0] == new
        assert (lso(wire, topic, partition) or 0) > start
    finally:
        admin.close()
    print(f"\nleader {old} -> {new} in {moved['seconds']:.1f}s between verify and marker; followed")


def test_leader_stopped_between_verify_and_marker_writes_nothing(three_node_bed: Cluster) -> None:
    """The same, but the old leader is stopped (controlled shutdown) after verification: the marker cannot reach
    it. The attempt fails without a marker anywhere (no control batch on the partition); a second run verifies at
    the new leader and refuses (`leader-changed-since-start`: the leader changed since the orphan began), and a
    third, with `--allow-leader-change`, aborts there, once."""
    bootstrap = three_node_bed.bootstrap_servers
    unique = f"s{uuid.uuid4().hex[:8]}-"
    h = orphan(bootstrap, f"{unique}r-", f"{unique}tx")
    topic, partition, start, pid = h["topic"], h["partition"], h["start_offset"], h["producer_id"]
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    old = -1
    try:
        old, _ = partition_replicas(admin, topic, partition)

        def stop_the_leader(to_broker: int) -> None:
            assert to_broker == old
            stop_node(three_node_bed, old)
            deadline = time.monotonic() + 60
            while partition_replicas(admin, topic, partition)[0] in (old, -1):
                assert time.monotonic() < deadline, "no new leader after the old one stopped"
                time.sleep(0.3)

        wire = RacingWire(admin, race=stop_the_leader)
        candidate = plan_by_hand(wire, topic, partition, pid)
        first = execute_in_process(bootstrap, wire, candidate, f"{unique}tw")
        print(f"\nold leader stopped: {first.audit.outcome.value}: {first.audit.message}; sent {wire.sent}")
        # Not ABORTED: a marker that follows the move is verified at the new leader, in another leader epoch.
        assert first.audit.outcome.value in ("FAILED", "REFUSED")
        new = partition_replicas(admin, topic, partition)[0]
        assert new != old
        assert [b for b, _ in wire.sent] == [old]
        assert controls_from(partition_batches(bootstrap, topic, partition), start) == []
        refused = execute_in_process(
            bootstrap, RacingWire(admin, race=lambda _b: None), candidate, f"{unique}tw"
        )
        assert refused.audit.outcome.value == "REFUSED", refused.audit.message
        assert "leader-changed-since-start: the leader of" in refused.audit.message
        assert controls_from(partition_batches(bootstrap, topic, partition), start) == []
        again = execute_in_process(
            bootstrap,
            RacingWire(admin, race=lambda _b: None),
            candidate,
            f"{unique}tw",
            allow_leader_change=True,
        )
        assert again.audit.outcome.value == "ABORTED", again.audit.message
        assert f"marker written by broker {new}" in again.audit.message
        assert controls_from(partition_batches(bootstrap, topic, partition), start) == [
            ("ABORT", pid, candidate.spec.producer_epoch)
        ]
    finally:
        admin.close()
        from dev.kafka import node_running, start_node

        (node,) = [n for n in three_node_bed.nodes if n.node_id == old] or [None]
        if node is not None and not node_running(node.pid):
            start_node(three_node_bed, old)
