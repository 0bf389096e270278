"""A commit marker lost on a real three-node bed, and its remedy (issue 30 item 7): `txnwatch proposals commit`.

Kafka documents (KAFKA-20716) that an unclean leader election can drop commit/abort markers. Made here for real:
a kafka-python transactional producer writes to P (replicas L and F, `unclean.leader.election.enable`,
`min.insync.replicas=1`) and to Q; the collector sees the transaction open on P; F is paused (SIGSTOP) once it
holds the data, so the commit's marker lands on L alone (L drops F from the ISR after `replica.lag.time.max.ms`,
then appends the marker); the coordinator writes PrepareCommit listing P and Q, the markers, CompleteCommit. L is
killed, F resumed and elected leader uncleanly (Admin electLeaders UNCLEAN): F holds the data open and no marker.

The owner lives on, as in the field (issue 39): the same producer commits a one-record transaction on a topic of C
every 100 ms from then on, so the producer id's newest coordinator record is a transaction that began after the
orphan was seen open and does not list P — what `owner-moved-on` proves an ABORT from.

Then the job's own code judges it: the collector sweeps past the grace while the owner commits,
`__transaction_state` is read and decoded with the job's decoder (`streaming.sources.decode_batches`), stage 1
(`detectors.tracking.advance_owners`, one batch up to the commit and two of the owner's later transactions)
carries the PrepareCommit's partitions over to the CompleteCommit record, and stage 2
(`detectors.tracking.reconcile_bucket`, with the collector's reports and positions) opens a HANGING
`lost-commit-marker` candidate with a COMMIT, never an ABORT. `proposals abort` refuses it by name (exit 3,
nothing written); `proposals commit --execute` first refuses while the transactional id is live at the marker's
epoch (kafka-python is a TV0/TV1 client: its epoch does not move per transaction), then, once the id is
initialised again, writes the COMMIT (exit 0): the LSO moves past it and a read_committed consumer gets the
records on P.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import NewTopic
from stage2_rows import applied_row, batch, fact_row, open_row, position_row
from transaction_log import coordinator_log, decoded, stage1_rows
from workloads import (
    PROPOSALS_CLUSTER,
    Proposals,
    lso,
    partition_batches,
    partition_replicas,
    producer_row,
    read_committed_values,
)

from admin.collect.collector import Collector
from admin.wire.kafka_wire import KafkaWire
from common.settings import CollectorSettings
from detectors.contract import TRANSACTION_LOG_TOPIC
from detectors.currency import coordinator_partition
from detectors.models import AbortCandidate, DetectionLimits, HangingReason
from detectors.tracking import BucketState, Fact, ReconcileConfig, advance_owners
from dev.kafka import Cluster, Node, TestBedConfig, start_cluster, stop_cluster, stop_node

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


def owner_commits_elsewhere(producer: KafkaProducer, topic: str, stop: threading.Event) -> threading.Thread:
    """The owner lives on: the same producer (kafka-python: its epoch does not move per transaction) commits a
    one-record transaction on `topic` every 100 ms until `stop`; returned once it committed its first."""
    first = threading.Event()

    def run() -> None:
        while not stop.is_set():
            producer.begin_transaction()
            producer.send(topic, b"busy", partition=0).get(timeout=10)
            producer.commit_transaction()
            first.set()
            time.sleep(0.1)

    thread = threading.Thread(target=run, name="busy-owner", daemon=True)
    thread.start()
    assert first.wait(30), "the owner's first transaction after the commit"
    return thread


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
    p, q, busy = f"{unique}p", f"{unique}q", f"{unique}busy"
    proposals_prefix = f"{unique}tw"
    admin.create_topics(
        [
            NewTopic(
                p,
                replica_assignments={0: [leader, follower]},
                topic_configs={"unclean.leader.election.enable": "true", "min.insync.replicas": "1"},
            ),
            NewTopic(q, replica_assignments={0: [c]}),
            NewTopic(busy, replica_assignments={0: [c]}),
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
    before_commit = collector.sweep()
    (seen,) = [s for s in before_commit.snapshots if s.topic == p]
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

    # The owner lives on: it commits elsewhere every 100 ms while the collector sweeps, past the grace after the
    # commit and at least the skew after the owner's first transaction (what owner-moved-on would rest on).
    stop = threading.Event()
    busy_owner = owner_commits_elsewhere(producer, busy, stop)
    try:
        busy_since = time.time()
        time.sleep(
            max(
                busy_since + (LIMITS.clock_skew_ms + 1_000) / 1000 - time.time(),
                (committed_at + LIMITS.grace_ms + LIMITS.clock_skew_ms + 500) / 1000 - time.time(),
            )
        )
        collector.sweep()
        time.sleep(1)
        report = collector.sweep()
        records = coordinator_log(alive, log_partition)
        assert busy_owner.is_alive(), "the owner stopped committing before the report"
    finally:
        stop.set()
        busy_owner.join(15)
        producer.close()
    collector_admin.close()
    (snapshot,) = [s for s in report.snapshots if s.topic == p]
    (txn,) = snapshot.open_transactions
    assert (txn.start_offset, txn.seen_open_ms) == (start, open_before.seen_open_ms)

    # Stage 1 on the log up to the end measured at the report, in three batches as the job would read it; then
    # stage 2 on the reports, positions and facts.
    (position,) = report.positions
    end = position.end_offsets[log_partition]
    records = [r for r in records if r.offset < end]
    every = decoded(records, compact=False)
    ours = [r for r in every if r["producer_id"] == pid]
    commit_at = next(r["source_offset"] for r in ours if r["state"] == "CompleteCommit")
    assert [r["state"] for r in ours if r["source_offset"] > commit_at].count("CompleteCommit") >= 10
    # The job's batches: up to two of the owner's transactions after the commit (the decoder drops the commit's
    # Complete record, a middle one, and stage 1 folds the rest), then its transactions until 3 s before the
    # report, then the rest.
    first = [r["source_offset"] for r in ours if r["source_offset"] > commit_at][5]
    cut = snapshot.observed_at_ms - 3_000
    slices = [
        [r for r in records if r.offset <= first],
        [r for r in records if r.offset > first and r.timestamp <= cut],
        [r for r in records if r.offset > first and r.timestamp > cut],
    ]
    batches = [decoded(s) for s in slices if s]
    owners: dict[str, Any] = {}
    facts: list[Fact] = [f for b in batches for f in advance_owners(owners, stage1_rows(b))]
    config = ReconcileConfig(limits=LIMITS, expire_after_ms=600_000, view_ttl_ms=3_600_000, bootstrap=alive)
    bucket = BucketState(config, {}, {})
    (first_position,) = before_commit.positions
    batch(bucket, seen.observed_at_ms, open_row(seen), position_row(first_position))
    ends = {n: position.end_offsets.get(n, 0) for n in range(position.partitions)}
    events = batch(
        bucket,
        snapshot.observed_at_ms,
        *(fact_row(f) for f in facts),
        applied_row(ends),
        open_row(snapshot),
        position_row(position),
    )
    verdicts = [(e["event"], e["kind"], e["reason"]) for e in events]
    print(f"\nstage 2: {verdicts}")
    (opened,) = [e for e in events if e["event"] == "OPENED"]
    candidate = AbortCandidate.model_validate_json(opened["payload"])
    print(f"candidate: {candidate.reason.value}: {candidate.explanation}")
    assert candidate.reason is HangingReason.LOST_COMMIT_MARKER, verdicts
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
