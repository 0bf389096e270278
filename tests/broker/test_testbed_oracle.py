"""The test bed makes real hanging transactions: Kafka's own tools say so.

These pin the ground every later tier stands on: after `hanging`, TransactionsCommand sees the open transaction
and find-hanging reports it, a read_committed consumer is stuck at the last stable offset, the broker's own
PartitionsWithLateTransactionsCount counts it, and kafka-python's find_hanging_transactions does not see it (it
asks only the coordinators). After `steady`, nothing hangs.
"""

from __future__ import annotations

import time

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.structs import TopicPartition
from workloads import run_workload, start_workload

from dev import oracle
from dev.kafka import Cluster

pytestmark = pytest.mark.broker

HOUR_MS = 3_600_000


def offsets(bootstrap: str, tp: TopicPartition, isolation: str) -> int:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level=isolation, enable_auto_commit=False)
    try:
        return consumer.end_offsets([tp])[tp]
    finally:
        consumer.close()


def test_hanging_scenario_is_hanging_for_kafkas_own_tools(
    kafka_cluster: Cluster, bootstrap: str, unique: str
) -> None:
    truth = run_workload(
        bootstrap, "--scenario", "hanging", "--topic-prefix", unique, "--backdate-ms", str(HOUR_MS)
    )
    assert truth["scenario"] == "hanging"
    hanging = [t for t in truth["transactions"] if t["kind"] == "hanging"]
    assert len(hanging) == 1
    h = hanging[0]
    tp = TopicPartition(h["topic"], h["partition"])

    # The partition leader reports the orphan open at the start offset the workload recorded.
    producers = oracle.describe_producers(bootstrap, h["topic"], h["partition"])
    open_rows = [p for p in producers if p["CurrentTransactionStartOffset"] != "-1"]
    assert [(int(p["ProducerId"]), int(p["CurrentTransactionStartOffset"])) for p in open_rows] == [
        (h["producer_id"], h["start_offset"])
    ]

    # find-hanging, with its default 15-minute threshold, reports exactly this transaction.
    rows = oracle.find_hanging(bootstrap, topic=h["topic"])
    assert [(r["Topic"], int(r["Partition"]), int(r["ProducerId"]), int(r["StartOffset"])) for r in rows] == [
        (h["topic"], h["partition"], h["producer_id"], h["start_offset"])
    ]

    # The committed partition of the same transaction is not hanging.
    committed = [t for t in truth["transactions"] if t["kind"] == "committed"]
    assert committed and all((c["topic"], c["partition"]) != (h["topic"], h["partition"]) for c in committed)

    # read_committed readers are pinned at the LSO = the orphan's start offset, even after later committed data.
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    producer.send(h["topic"], b"after-the-orphan", partition=h["partition"]).get(timeout=30)
    producer.close()
    assert offsets(bootstrap, tp, "read_committed") == h["start_offset"]
    assert offsets(bootstrap, tp, "read_uncommitted") == h["start_offset"] + 2
    reader = KafkaConsumer(
        bootstrap_servers=bootstrap,
        isolation_level="read_committed",
        enable_auto_commit=False,
        consumer_timeout_ms=3000,
    )
    reader.assign([tp])
    reader.seek_to_beginning(tp)
    assert [r.value for r in reader] == []
    reader.close()

    # The broker's own metric counts it (its CreateTime is an hour old, past max.timeout + 5 min).
    if kafka_cluster.nodes:
        late = oracle.jmx_value(
            kafka_cluster.jmx_urls[1],
            "kafka.server:type=ReplicaManager,name=PartitionsWithLateTransactionsCount",
        )
        assert late >= 1

    # kafka-python's find_hanging_transactions asks only the coordinators: it cannot see this orphan.
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        peer = admin.find_hanging_transactions(max_transaction_timeout_ms=0)
    finally:
        admin.close()
    assert all(row["producer_id"] != h["producer_id"] for row in peer)
    assert all(row["transactional_id"] != h["transactional_id"] for row in peer)

    # Kafka's abort (WriteTxnMarkers) releases it: the LSO moves past the start offset.
    oracle.transactions_command(
        bootstrap,
        "abort",
        "--topic",
        h["topic"],
        "--partition",
        str(h["partition"]),
        "--start-offset",
        str(h["start_offset"]),
    )
    assert offsets(bootstrap, tp, "read_committed") > h["start_offset"]
    assert oracle.find_hanging(bootstrap, topic=h["topic"], max_transaction_timeout_min=0) == []


def test_steady_scenario_leaves_nothing_hanging(bootstrap: str, unique: str) -> None:
    truth = run_workload(bootstrap, "--scenario", "steady", "--topic-prefix", unique, "--seconds", "3")
    kinds = {t["kind"] for t in truth["transactions"]}
    assert kinds == {"committed", "aborted"}
    topics = sorted({t["topic"] for t in truth["transactions"]})
    # Markers are written just after EndTxn returns; give them a moment, then nothing may be open at all
    # (threshold 0 minutes: any open transaction would be a candidate).
    deadline = time.monotonic() + 20
    leftover: list[dict[str, str]] = []
    while time.monotonic() < deadline:
        leftover = [
            row
            for t in topics
            for row in oracle.find_hanging(bootstrap, topic=t, max_transaction_timeout_min=0)
        ]
        if not leftover:
            break
        time.sleep(1)
    assert leftover == []
    for t in truth["transactions"]:
        tp = TopicPartition(t["topic"], t["partition"])
        assert offsets(bootstrap, tp, "read_committed") == offsets(bootstrap, tp, "read_uncommitted")


def test_late_scenario_is_open_but_not_hanging(bootstrap: str, unique: str) -> None:
    proc, truth = start_workload(
        bootstrap, "--scenario", "late", "--topic-prefix", unique, "--hold-ms", "20000"
    )
    try:
        (t,) = truth["transactions"]
        assert t["kind"] == "late"
        producers = oracle.describe_producers(bootstrap, t["topic"], t["partition"])
        assert [
            int(p["CurrentTransactionStartOffset"])
            for p in producers
            if int(p["ProducerId"]) == t["producer_id"]
        ] == [t["start_offset"]]
        # The coordinator still owns it with this partition, so even a 0-minute find-hanging says not hanging.
        assert oracle.find_hanging(bootstrap, topic=t["topic"], max_transaction_timeout_min=0) == []
    finally:
        assert proc.wait(timeout=60) == 0, proc.stderr.read() if proc.stderr else ""


def test_hanging_offsets_scenario_pins_consumer_offsets(bootstrap: str, unique: str) -> None:
    truth = run_workload(bootstrap, "--scenario", "hanging-offsets", "--topic-prefix", unique)
    (h,) = [t for t in truth["transactions"] if t["kind"] == "hanging"]
    assert h["topic"] == "__consumer_offsets"
    rows = oracle.find_hanging(bootstrap, topic="__consumer_offsets", max_transaction_timeout_min=0)
    assert (h["partition"], h["producer_id"], h["start_offset"]) in {
        (int(r["Partition"]), int(r["ProducerId"]), int(r["StartOffset"])) for r in rows
    }
    # An abort through the group coordinator's WriteTxnMarkers path releases it.
    oracle.transactions_command(
        bootstrap,
        "abort",
        "--topic",
        "__consumer_offsets",
        "--partition",
        str(h["partition"]),
        "--start-offset",
        str(h["start_offset"]),
    )
    rows = oracle.find_hanging(bootstrap, topic="__consumer_offsets", max_transaction_timeout_min=0)
    assert h["producer_id"] not in {int(r["ProducerId"]) for r in rows}
