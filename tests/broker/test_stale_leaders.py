"""A deposed leader reached through stale metadata (issue 30, item 4), on a real three-node test bed.

Kafka answers DescribeProducers from the local log of any replica with error NONE (`Partition.activeProducerState`
via `ReplicaManager.activeProducerState`: no leadership check), and the request carries no leader epoch. A former
leader that fell out of the ISR therefore reports a transaction open after the new leader has its commit marker.
The collector must not publish that as the partition's state.

How the former leader is made to lag, with Kafka's own mechanisms only: the partition's leadership moves away
from it (AlterPartitionReassignments + ElectLeaders), its JVM is paused (SIGSTOP) until the new leader drops it
from the ISR (`replica.lag.time.max.ms` 3 s here), two 100 KB records and the transaction's commit marker are
written, and it resumes with replication to it throttled (`follower.replication.throttled.replicas` names it,
`follower.replication.throttled.rate` is 1 B/s over a 60 s window, `replica.fetch.max.bytes` 64 KB): its first
fetch takes one 100 KB record, which leaves it out of sync and over its quota, so it stops short of the marker.

The collector is given the metadata as it was before the move, on every call (a cache that every broker it asks
still serves): it routes the partition to the former leader at the old epoch. Its answer is dropped because the
broker itself, asked ListOffsets at that epoch, answers FENCED_LEADER_EPOCH; the same request at -1 would not say
which epoch it answers for, and DescribeProducers cannot be fenced at all.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import ConfigResource, ConfigResourceType, NewTopic
from workloads import move_leader, partition_replicas

from admin.collect.collector import Collector
from admin.wire.kafka_wire import KafkaWire
from admin.wire.types import ClusterView
from common.settings import CollectorSettings
from detectors.contract import TRANSACTION_LOG_TOPIC
from detectors.currency import coordinator_partition
from dev.kafka import Cluster, TestBedConfig, start_cluster, stop_cluster

pytestmark = pytest.mark.broker

SETTINGS = CollectorSettings(retry_backoff_ms=100, request_timeout_ms=5_000)
LAGGING_FOLLOWER = TestBedConfig(
    nodes=3,
    extra={
        "replica.lag.time.max.ms": "3000",  # the paused former leader leaves the ISR within seconds
        "replica.fetch.max.bytes": "65536",  # one 100 KB record per fetch, then the throttle holds
        "replication.quota.window.num": "60",  # the throttle's 1 B/s is measured over 60 s, not 11
        "broker.session.timeout.ms": "30000",  # a pause of a few seconds does not fence the broker
    },
)


@pytest.fixture(scope="module")
def bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    state_dir: Path = tmp_path_factory.mktemp("stale-leaders")
    cluster = start_cluster(LAGGING_FOLLOWER, state_dir)
    try:
        yield cluster
    finally:
        stop_cluster(state_dir)


class StaleMetadata:
    """The real wire, except that every metadata answer is a view read earlier (a stale cache everywhere)."""

    def __init__(self, wire: KafkaWire, view: ClusterView) -> None:
        self._wire = wire
        self._view = view

    def metadata(self, topics: Any = None) -> ClusterView:
        return self._view

    def __getattr__(self, name: str) -> Any:
        return getattr(self._wire, name)


def open_producers(wire: KafkaWire, broker: int, tp: tuple[str, int]) -> set[int]:
    """Producer ids with an open transaction in `broker`'s own log of `tp` (DescribeProducers asked of it)."""
    (batch,) = wire.describe_producers({broker: [[tp]]})
    assert batch.error is None, batch.error
    answer = batch.results[tp]
    assert answer.error is None, f"broker {broker}: {answer.error}"
    return {p.producer_id for p in answer.producers if p.current_txn_start_offset >= 0}


def test_a_former_leader_out_of_the_isr_is_not_reported_as_the_partitions_state(
    bed: Cluster, unique: str
) -> None:
    """The former leader still has the transaction open (checked by asking it directly), the new leader has its
    marker. Routed by stale metadata, the collector asks the former leader: its answer is dropped, counted as
    NOT_LEADER_OF_RECORD, and nothing is published for the partition. Before the fix the collector published the
    former leader's answer: a snapshot with the committed transaction open, led by the wrong broker."""
    admin = KafkaAdminClient(bootstrap_servers=bed.bootstrap_servers, request_timeout_ms=5_000)
    wire = KafkaWire(admin, request_timeout_ms=5_000)
    topic = f"{unique}orders"
    tp = (topic, 0)
    # Not the active KRaft controller: a paused controller would hold the ISR change (AlterPartition) for its
    # request timeout, and with it every acks=all write to the partition.
    (quorum,) = admin.describe_metadata_quorum()["topics"][0]["partitions"]
    former, new = [n.node_id for n in bed.nodes if n.node_id != quorum["leader_id"]]
    # The transaction's coordinator must not be the paused node, or its commit would wait for the pause. The
    # first transactional producer makes `__transaction_state`.
    warm = KafkaProducer(bootstrap_servers=bed.bootstrap_servers, transactional_id=f"{unique}warm-up")
    warm.init_transactions()
    warm.close()
    log_leaders = {p: partition_replicas(admin, TRANSACTION_LOG_TOPIC, p)[0] for p in range(3)}
    tid = next(
        f"{unique}tx{i}"
        for i in range(100)
        if log_leaders[coordinator_partition(f"{unique}tx{i}", 3)] != former
    )
    coordinator = log_leaders[coordinator_partition(tid, 3)]
    admin.create_topics(
        [
            NewTopic(
                topic,
                replica_assignments={0: [former, new]},
                topic_configs={"follower.replication.throttled.replicas": f"0:{former}"},
            )
        ]
    )
    # The former leader's replication, once it is a follower out of sync (Kafka throttles no replica in sync).
    # (kafka-python's own list of dynamic configs lacks it: the broker validates it.)
    throttle = ConfigResource(
        ConfigResourceType.BROKER, str(former), configs={"follower.replication.throttled.rate": "1"}
    )
    assert admin.alter_configs([throttle], raise_on_unknown=False) == {"broker": {str(former): "OK"}}
    producer = KafkaProducer(bootstrap_servers=bed.bootstrap_servers, transactional_id=tid, acks="all")
    paused = False
    former_pid = next(n.pid for n in bed.nodes if n.node_id == former)
    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send(topic, b"x", partition=0).get(timeout=30)
        stale = wire.metadata()
        assert stale.leaders[tp] == former and tp in stale.leader_epochs
        old_epoch = stale.leader_epochs[tp]
        pid = next(iter(open_producers(wire, former, tp)))

        move_leader(admin, topic, 0, to=new)
        # A record while every node runs: the producer learns the new leader (the former answers
        # NOT_LEADER_OR_FOLLOWER), so nothing it sends later waits on the paused node.
        producer.send(topic, b"y", partition=0).get(timeout=30)
        os.kill(former_pid, signal.SIGSTOP)
        paused = True
        # Acknowledged once the new leader has dropped the paused node from the ISR (acks=all).
        for _ in range(2):
            producer.send(topic, b"z" * 100_000, partition=0).get(timeout=30)
        producer.commit_transaction()
        # CompleteCommit: the markers were acknowledged by the ISR, which no longer holds the paused node.
        deadline = time.monotonic() + 30
        while wire.describe_transactions({coordinator: [tid]})[0].state != "CompleteCommit":
            assert time.monotonic() < deadline, "the transaction never completed"
            time.sleep(0.2)
        assert pid not in open_producers(wire, new, tp)
        os.kill(former_pid, signal.SIGCONT)
        paused = False

        # The former leader answers, with error NONE, from its lagging log: the transaction still open.
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(AssertionError):
                if pid in open_producers(wire, former, tp):
                    break
            assert time.monotonic() < deadline, (
                "the resumed former leader does not report the transaction open"
            )
            time.sleep(0.3)
        assert wire.list_offsets({former: [tp]}, {tp: old_epoch})[tp].error == "FENCED_LEADER_EPOCH"

        stale_wire: Any = StaleMetadata(wire, stale)
        collector = Collector(stale_wire, cluster="test", settings=SETTINGS, open_partitions={tp})
        result = collector.sweep()
        reported = [
            (s.leader, [t.producer_id for t in s.open_transactions])
            for s in result.snapshots + result.empties
            if (s.topic, s.partition) == tp
        ]
        assert reported == [], f"published the former leader's answer: {reported}"
        by_broker = {s.broker: s.errors for s in result.summaries}
        assert by_broker[former].get("NOT_LEADER_OF_RECORD") == 1
        assert any(f"broker {former}" in p and "FENCED_LEADER_EPOCH" in p for p in result.problems)
        # No claim either way: the partition keeps its last published (open) state.
        assert collector.open_partitions is not None and tp in collector.open_partitions

        # With metadata as it is, the new leader is asked and says the transaction is over.
        fresh = Collector(wire, cluster="test", settings=SETTINGS, open_partitions={tp}).sweep()
        assert [(s.leader, s.open_transactions) for s in fresh.empties if (s.topic, s.partition) == tp] == [
            (new, ())
        ]
        assert pid in open_producers(wire, former, tp)  # still stale: the drop above was not luck of timing
    finally:
        if paused:
            os.kill(former_pid, signal.SIGCONT)
        with contextlib.suppress(Exception):
            producer.close(timeout=5)
        admin.close()
