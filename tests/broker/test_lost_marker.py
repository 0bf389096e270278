"""A commit marker lost on a real three-node bed, and its remedy (issue 30 item 7): `txnwatch proposals commit`.

Kafka documents (KAFKA-20716) that an unclean leader election can drop commit/abort markers. Made here for real:
a kafka-python transactional producer writes to P (replicas L and F, `unclean.leader.election.enable`,
`min.insync.replicas=1`) and to Q; the collector sees the transaction open on P; F is paused (SIGSTOP) once it
holds the data, so the commit's marker lands on L alone (L drops F from the ISR after `replica.lag.time.max.ms`,
then appends the marker); the coordinator writes PrepareCommit listing P and Q, the markers, CompleteCommit. L is
killed, F resumed and elected leader uncleanly (Admin electLeaders UNCLEAN): F holds the data open and no marker.

Then the job's own code judges it: the collector sweeps past the grace, `__transaction_state` is read and decoded
with the job's decoder (`streaming.sources.decode_batches`), stage 1 (`detectors.tracking.advance_owners`) carries
the PrepareCommit's partitions over to the CompleteCommit record, and `detectors.rules.classify` says HANGING
`lost-commit-marker`. `proposals abort` refuses it by name (exit 3, nothing written); `proposals commit --execute`
first refuses while the transactional id is live at the marker's epoch (kafka-python is a TV0/TV1 client: its
epoch does not move per transaction), then, once the id is initialised again, writes the COMMIT (exit 0): the LSO
moves past it and a read_committed consumer gets the records on P.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.admin import NewTopic
from kafka.structs import TopicPartition
from workloads import (
    PROPOSALS_CLUSTER,
    Proposals,
    lso,
    partition_batches,
    partition_replicas,
    producer_row,
    read_committed_values,
)

from admin.collector import Collector
from admin.wire import KafkaWire
from common.settings import CollectorSettings
from detectors.abort import plan_abort
from detectors.contract import TRANSACTION_LOG_TOPIC
from detectors.currency import coordinator_partition
from detectors.models import CoordinatorRecord, DetectionLimits, HangingReason, VerdictKind
from detectors.rules import classify
from detectors.tracking import CoordinatorRow, advance_owners
from dev.kafka import Cluster, Node, TestBedConfig, start_cluster, stop_cluster, stop_node
from streaming.sources import decode_batches

pytestmark = pytest.mark.broker

LOG_PARTITIONS = 3
LIMITS = DetectionLimits()  # the job's defaults: 4 s grace, 2 s clock skew
BED = TestBedConfig(
    nodes=3,
    extra={
        # One replica per `__transaction_state` partition: the coordinator stays on the third broker, C, away
        # from P's two replicas (a paused F in its ISR would hold its PrepareCommit back).
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": str(LOG_PARTITIONS),
        # L drops the paused F from P's ISR within seconds, and the controller fences the killed L quickly.
        "replica.lag.time.max.ms": "2000",
        "broker.heartbeat.interval.ms": "500",
        "broker.session.timeout.ms": "3000",
    },
)


@pytest.fixture(scope="module")
def bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    state_dir: Path = tmp_path_factory.mktemp("lost-marker")
    cluster = start_cluster(BED, state_dir)
    try:
        yield cluster
    finally:
        for node in cluster.nodes:  # a paused node would not stop
            with contextlib.suppress(ProcessLookupError):
                os.kill(node.pid, signal.SIGCONT)
        stop_cluster(state_dir)


def node(bed: Cluster, node_id: int) -> Node:
    (n,) = [n for n in bed.nodes if n.node_id == node_id]
    return n


def bootstrap_of(bed: Cluster, *node_ids: int) -> str:
    return ",".join(f"127.0.0.1:{node(bed, i).broker_port}" for i in node_ids)


def wait_for(what: str, check: Any, timeout_s: float = 30) -> Any:
    """Poll `check()` until it returns something truthy (exceptions of a cluster in motion count as not yet)."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except Exception as exc:  # brokers going down and up: ask again
            last = exc
        if last and not isinstance(last, Exception):
            return last
        time.sleep(0.3)
    raise AssertionError(f"{what}: still {last!r} after {timeout_s:.0f}s")


def coordinator_state(bootstrap: str, coordinator: int, tid: str) -> str:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        (d,) = KafkaWire(admin).describe_transactions({coordinator: [tid]})
        return d.state
    finally:
        admin.close()


def leader_of(bootstrap: str, topic: str) -> int:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        return partition_replicas(admin, topic, 0)[0]
    finally:
        admin.close()


def elect_uncleanly(bootstrap: str, topic: str, to: int) -> int | None:
    """One ElectLeaders UNCLEAN for partition 0 of `topic` (a fresh client: fresh metadata); its leader after."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.elect_leaders(1, {topic: [0]}, raise_errors=False)  # 1: UNCLEAN
        leader = partition_replicas(admin, topic, 0)[0]
        return leader if leader == to else None
    finally:
        admin.close()


def coordinator_log(bootstrap: str, partition: int) -> list[dict[str, Any]]:
    """`__transaction_state`'s partition read to its end now, through the job's decoder (`decode_batches`, as the
    job runs it: compact), one dict of DECODED_SCHEMA's columns per row."""
    tp = TopicPartition(TRANSACTION_LOG_TOPIC, partition)
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None)
    records: list[Any] = []
    try:
        consumer.assign([tp])
        end = consumer.end_offsets([tp])[tp]
        consumer.seek_to_beginning(tp)
        deadline = time.monotonic() + 20
        while consumer.position(tp) < end and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=500).values():
                records += [r for r in batch if r.offset < end]
    finally:
        consumer.close()
    raw = pa.RecordBatch.from_pydict(
        {
            "key": pa.array([r.key for r in records], pa.binary()),
            "value": pa.array([r.value for r in records], pa.binary()),
            "topic": pa.array([TRANSACTION_LOG_TOPIC] * len(records), pa.string()),
            "partition": pa.array([partition] * len(records), pa.int32()),
            "offset": pa.array([r.offset for r in records], pa.int64()),
            "ts_ms": pa.array([r.timestamp for r in records], pa.int64()),
        }
    )
    (decoded,) = list(decode_batches(iter([raw]), compact=True))
    return decoded.to_pylist()  # type: ignore[no-any-return]


def coordinator_view(rows: list[dict[str, Any]], producer_id: int) -> CoordinatorRecord:
    """Stage 1 on the decoded rows: the record the job's view holds for the producer id. Each row becomes the
    record JSON the job builds (`streaming.rows.coordinator_rows`: the decoded fields, provenance left out)."""
    fields = set(CoordinatorRecord.model_fields) - {
        "schema_version",
        "source_partition",
        "source_offset",
        "source_timestamp_ms",
        "origin",
    }
    stage1 = [
        CoordinatorRow(
            r["transactional_id"],
            r["producer_id"],
            r["previous_producer_id"],
            r["next_producer_id"],
            r["tombstone"],
            r["last_update_timestamp_ms"],
            r["source_offset"],
            CoordinatorRecord.model_validate({k: r[k] for k in fields}).model_dump_json(),
            r["state"],
        )
        for r in rows
        if r["error"] is None
    ]
    views = [f for f in advance_owners({}, stage1) if f[0] == producer_id and f[1] == "view"]
    (view,) = views
    assert view[3] is not None
    return CoordinatorRecord.model_validate_json(view[3])


def test_a_commit_marker_lost_to_an_unclean_election_is_restored_with_a_commit_never_aborted(
    bed: Cluster,
) -> None:
    began = time.monotonic()
    unique = f"lm{uuid.uuid4().hex[:8]}-"
    admin = KafkaAdminClient(bootstrap_servers=bed.bootstrap_servers)
    # `__transaction_state` exists once a first id is initialised; then pick an id whose coordinator is C and
    # put P on the other two brokers.
    warm = KafkaProducer(bootstrap_servers=bed.bootstrap_servers, transactional_id=f"{unique}warm-up")
    warm.init_transactions()
    warm.close()
    nodes = [n.node_id for n in bed.nodes]
    log_partition = 0
    c = partition_replicas(admin, TRANSACTION_LOG_TOPIC, log_partition)[0]
    tid = next(
        f"{unique}tx-{i}"
        for i in range(1000)
        if coordinator_partition(f"{unique}tx-{i}", LOG_PARTITIONS) == 0
    )
    leader, follower = [n for n in nodes if n != c]
    p, q = f"{unique}p", f"{unique}q"
    proposals_prefix = f"{unique}tw"
    admin.create_topics(
        [
            NewTopic(
                p,
                replica_assignments={0: [leader, follower]},
                topic_configs={"unclean.leader.election.enable": "true", "min.insync.replicas": "1"},
            ),
            NewTopic(q, replica_assignments={0: [c]}),
            # txnwatch's own topics on C, which stays up throughout
            NewTopic(
                f"{proposals_prefix}.abort-candidates",
                replica_assignments={0: [c]},
                topic_configs={"cleanup.policy": "compact"},
            ),
            NewTopic(f"{proposals_prefix}.audit", replica_assignments={0: [c]}),
        ]
    )
    wait_for(f"{p} led by {leader}", lambda: leader_of(bed.bootstrap_servers, p) == leader)
    admin.close()

    # The transaction: two records on P, one on Q; acks=all, so F holds P's records once the sends return.
    producer = KafkaProducer(bootstrap_servers=bed.bootstrap_servers, transactional_id=tid)
    producer.init_transactions()
    producer.begin_transaction()
    start = producer.send(p, b"p-1", partition=0).get(timeout=10).offset
    producer.send(p, b"p-2", partition=0).get(timeout=10)
    producer.send(q, b"q-1", partition=0).get(timeout=10)
    admin = KafkaAdminClient(bootstrap_servers=bed.bootstrap_servers)
    (described,) = [x for x in admin.describe_topics([p])[0]["partitions"] if x["partition_index"] == 0]
    admin.close()
    assert sorted(described["isr_nodes"]) == sorted([leader, follower]), described

    # The collector sees it open on P before the commit (its admin reaches the cluster through C, always up).
    collector_admin = KafkaAdminClient(bootstrap_servers=bootstrap_of(bed, c))
    collector = Collector(
        KafkaWire(collector_admin, request_timeout_ms=5_000),
        cluster=PROPOSALS_CLUSTER,
        settings=CollectorSettings(retry_backoff_ms=100, request_timeout_ms=5_000),
        open_partitions=set(),
    )
    (seen,) = [s for s in collector.sweep().snapshots if s.topic == p]
    (open_before,) = seen.open_transactions
    assert open_before.start_offset == start and open_before.seen_open_ms is not None

    # F paused: the COMMIT marker lands on L alone, once L dropped F from the ISR.
    os.kill(node(bed, follower).pid, signal.SIGSTOP)
    try:
        time.sleep((LIMITS.clock_skew_ms + 500) / 1000)  # seen open before the commit, past the skew
        producer.commit_transaction()
        up = bootstrap_of(bed, c, leader)
        wait_for("CompleteCommit", lambda: coordinator_state(up, c, tid) == "CompleteCommit")
        committed_at = int(time.time() * 1000)
        # (Retried: a client may pick the paused F for its metadata, and a paused broker still accepts
        # connections, then never answers.)
        on_leader = wait_for("the marker on L", lambda: partition_batches(up, p, 0, timeout_s=5))
        assert [(b.producer_id, b.marker) for b in on_leader if b.control] == [
            (open_before.producer_id, "COMMIT")
        ]
        producer.close()
        # L dies with the only copy of the marker; F comes back and is elected uncleanly.
        stop_node(bed, leader, kill=True)
    finally:
        os.kill(node(bed, follower).pid, signal.SIGCONT)
    alive = bootstrap_of(bed, c, follower)
    wait_for(f"{follower} elected leader of {p} uncleanly", lambda: elect_uncleanly(alive, p, follower), 60)
    lost_at = time.monotonic()
    on_follower = partition_batches(alive, p, 0)
    assert [b.values for b in on_follower] == [(b"p-1",), (b"p-2",)]  # the data, no marker
    assert not any(b.control for b in on_follower)
    admin = KafkaAdminClient(bootstrap_servers=alive)
    wire = KafkaWire(admin)
    pid = open_before.producer_id
    assert producer_row(wire, p, 0, pid) == (open_before.producer_epoch, -1, start)
    assert lso(wire, p, 0) == start
    admin.close()
    assert read_committed_values(alive, q, 0, 0) == [b"q-1"]  # committed everywhere else

    # The collector, past the grace after the commit, twice; then the job's view, read after those sweeps.
    time.sleep(max(0.0, (committed_at + LIMITS.grace_ms + LIMITS.clock_skew_ms + 500) / 1000 - time.time()))
    collector.sweep()
    time.sleep(1)
    (snapshot,) = [s for s in collector.sweep().snapshots if s.topic == p]
    collector_admin.close()
    (txn,) = snapshot.open_transactions
    assert (txn.start_offset, txn.seen_open_ms) == (start, open_before.seen_open_ms)
    record = coordinator_view(coordinator_log(alive, log_partition), pid)
    assert record.state is not None and record.state.value == "CompleteCommit"
    assert record.prepared_partitions is not None
    assert {(x.topic, x.partition) for x in record.prepared_partitions} == {(p, 0), (q, 0)}
    verdict = classify(
        txn,
        snapshot,
        record,
        now_ms=snapshot.observed_at_ms,
        limits=LIMITS,
        view_current_ms=snapshot.observed_at_ms,  # the log was read to its end after the sweep
        first_seen_ms=txn.seen_open_ms,
    )
    print(f"\nverdict: {verdict.kind.value} {verdict.reason}: {verdict.explanation}")
    assert (verdict.kind, verdict.reason) == (VerdictKind.HANGING, HangingReason.LOST_COMMIT_MARKER)
    candidate = plan_abort(snapshot, txn, verdict, first_detected_ms=snapshot.observed_at_ms)
    assert candidate.spec.transaction_result == "COMMIT"

    proposals = Proposals(alive, proposals_prefix)
    proposals.publish(candidate)
    before = partition_batches(alive, p, 0)

    # `proposals abort` refuses it by name: an ABORT would undo a commit its client was told succeeded.
    refused = proposals.run("abort", candidate.candidate_id, "--execute")
    assert refused.returncode == 3, refused.stderr
    audit = json.loads(refused.stdout)
    assert audit["outcome"] == "REFUSED" and audit["marker_written"] is False
    assert "lost-commit-marker: " in audit["message"] and "txnwatch proposals commit" in audit["message"]
    assert partition_batches(alive, p, 0) == before

    # `proposals commit` refuses while tx-1 is live at the marker's epoch (a TV0/TV1 client keeps its epoch) ...
    live_owner = proposals.run("commit", candidate.candidate_id, "--execute")
    assert live_owner.returncode == 3, live_owner.stderr
    assert "live-owner-same-epoch: " in json.loads(live_owner.stdout)["message"]
    assert partition_batches(alive, p, 0) == before
    # ... and once the id is initialised again (its epoch moves on), restores the commit.
    again = KafkaProducer(bootstrap_servers=alive, transactional_id=tid)
    again.init_transactions()
    again.close()
    done = proposals.run("commit", candidate.candidate_id, "--execute")
    assert done.returncode == 0, done.stderr
    audit = json.loads(done.stdout)
    print(f"proposals commit: {audit['outcome']}: {audit['message']}")
    assert audit["outcome"] == "COMMITTED" and audit["marker_written"] is True
    assert audit["marker"]["transaction_result"] == "COMMIT"
    after = partition_batches(alive, p, 0)
    (marker,) = [b for b in after if b.control]
    assert (marker.producer_id, marker.producer_epoch, marker.marker, marker.coordinator_epoch) == (
        pid,
        open_before.producer_epoch,
        "COMMIT",
        0,
    )
    admin = KafkaAdminClient(bootstrap_servers=alive)
    assert (lso(KafkaWire(admin), p, 0) or 0) > start
    admin.close()
    assert read_committed_values(alive, p, 0, start) == [b"p-1", b"p-2"]
    print(f"lost at +{lost_at - began:.0f}s, restored at +{time.monotonic() - began:.0f}s")
