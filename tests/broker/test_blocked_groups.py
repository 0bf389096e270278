"""A hanging offset commit names whom it blocks, on the real broker.

A real orphan on `__consumer_offsets` (the `hanging-offsets` workload: TxnOffsetCommit without AddOffsetsToTxn,
then a commit) leaves its group's offsets pending. The group's read_committed consumer really stalls: its
OffsetFetch with require_stable answers UNSTABLE_OFFSET_COMMIT, so it never gets its committed position. Another
group placed on the same `__consumer_offsets` partition is not stalled (measured here, against what one might
assume). The collector reads the group from the start batch's record keys, `txnwatch proposals show` names it,
with its members, and the abort ends the stall.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.admin import NewTopic
from kafka.structs import OffsetAndMetadata, TopicPartition
from workloads import plan_by_hand, run_workload

from admin.wire.kafka_wire import KafkaWire
from admin.wire.types import StartBatch
from detectors.groups import CONSUMER_OFFSETS_TOPIC, offsets_partition_for

pytestmark = pytest.mark.broker

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = "broker-tests"


def committed_within(bootstrap: str, group: str, tp: TopicPartition, seconds: float) -> tuple[bool, Any]:
    """(answered, offset) of a read_committed consumer's committed() for `group`, given `seconds` to answer.

    kafka-python retries UNSTABLE_OFFSET_COMMIT like Kafka's Java consumer does, so a stalled group's call does
    not return; the thread is left to end with the consumer's close.
    """
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        isolation_level="read_committed",
    )
    result: list[Any] = []

    def ask() -> None:
        try:
            result.append(consumer.committed(tp))
        except Exception as exc:  # an error is an answer too, and says it is not stalled
            result.append(exc)

    thread = threading.Thread(target=ask, daemon=True)
    thread.start()
    thread.join(seconds)
    answered = bool(result)
    with contextlib.suppress(Exception):
        consumer.close(autocommit=False)
    return answered, result[0] if result else None


def a_group_on(partition: int, partitions: int, prefix: str) -> str:
    return next(
        g for i in range(10_000) if offsets_partition_for(g := f"{prefix}{i}", partitions) == partition
    )


def txnwatch(
    bootstrap: str, prefix: str, *args: str, output: str = "json"
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TXNWATCH_")}
    command = [sys.executable, "-m", "txnwatch_cli", "proposals", *args]
    command += [
        "--bootstrap-server",
        bootstrap,
        "--cluster",
        CLUSTER,
        "--topic-prefix",
        prefix,
        "--output",
        output,
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=90, check=False, cwd=ROOT, env=env)


def publish(bootstrap: str, topic: str, candidate: Any) -> None:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(topic, 1, 1, topic_configs={"cleanup.policy": "compact"})])
    finally:
        admin.close()
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    try:
        producer.send(
            topic, key=candidate.candidate_id.encode(), value=candidate.model_dump_json().encode()
        ).get(30)
    finally:
        producer.close()


def test_a_hanging_offset_commit_names_the_group_it_blocks(
    bootstrap: str, unique: str, wire: KafkaWire
) -> None:
    truth = run_workload(bootstrap, "--scenario", "hanging-offsets", "--topic-prefix", unique)
    committed, hanging = (
        next(t for t in truth["transactions"] if t["kind"] == k) for k in ("committed", "hanging")
    )
    group = f"{committed['transactional_id']}-group"  # dev/workload.py's hanging_offsets
    assert hanging["topic"] == CONSUMER_OFFSETS_TOPIC
    partitions = len(wire._admin.describe_topics([CONSUMER_OFFSETS_TOPIC])[0]["partitions"])
    placed = hanging["partition"]
    assert offsets_partition_for(group, partitions) == placed  # Kafka's placement, computed the same way
    tp = TopicPartition(committed["topic"], committed["partition"])

    # The group really stalls; a neighbour on the same __consumer_offsets partition does not.
    neighbour = a_group_on(placed, partitions, f"{unique}neighbour-")
    c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=neighbour, enable_auto_commit=False)
    c.assign([tp])
    c.commit({tp: OffsetAndMetadata(1, "", -1)})
    c.close()
    assert committed_within(bootstrap, group, tp, 6)[0] is False, "the blocked group's offset fetch answered"
    answered, offset = committed_within(bootstrap, neighbour, tp, 10)
    assert answered and offset == 1, f"the neighbour group should still fetch its offset, got {offset!r}"

    # A member of the blocked group: it joins, then waits for its committed position.
    member = KafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        isolation_level="read_committed",
    )
    member.subscribe([tp.topic])
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            try:
                member.poll(timeout_ms=200)
            except Exception:
                time.sleep(0.2)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    try:
        # The collector's read of the start batch names the group.
        key = ((CONSUMER_OFFSETS_TOPIC, placed), hanging["start_offset"])
        leader = wire.metadata([CONSUMER_OFFSETS_TOPIC]).leaders[key[0]]
        start = wire.fetch_start_batches({leader: [key]})[key]
        assert isinstance(start, StartBatch) and start.offset_commit_group == group

        # `proposals show` names it, with its member, and says it is stalled now.
        prefix = f"{unique}tw"
        candidate = plan_by_hand(
            wire, CONSUMER_OFFSETS_TOPIC, placed, hanging["producer_id"], cluster=CLUSTER
        )
        publish(bootstrap, f"{prefix}.abort-candidates", candidate)
        deadline = time.monotonic() + 30
        while True:
            shown = txnwatch(bootstrap, prefix, "show", candidate.candidate_id)
            assert shown.returncode == 0, shown.stderr
            blocked = json.loads(shown.stdout)["blocked_group"]
            if blocked["members"] or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert blocked["group"] == group and blocked["unstable"] is True and blocked["error"] is None
        assert blocked["members"] == 1, blocked
        assert neighbour in blocked["neighbours"]
        table = txnwatch(bootstrap, prefix, "show", candidate.candidate_id, output="table").stdout
        assert f"consumer group {group}" in table and "UNSTABLE_OFFSET_COMMIT" in table

        # The abort ends the stall.
        aborted = txnwatch(bootstrap, prefix, "abort", candidate.candidate_id, "--execute")
        assert aborted.returncode == 0, aborted.stdout + aborted.stderr
        assert wire.group_standing(group, [(tp.topic, tp.partition)]).unstable is False
    finally:
        stop.set()
        poller.join(5)
        member.close(autocommit=False)
    answered, offset = committed_within(bootstrap, group, tp, 10)
    assert answered, "the group's committed offset still does not answer after the abort"
