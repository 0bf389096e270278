"""`txnwatch inspect` against the real broker: a hanging orphan and a healthy open transaction side by side, each
with the rules' verdict, and the live decoded `__transaction_state` of a real transaction."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin._transactions import AbortTransactionSpec
from kafka.structs import TopicPartition
from workloads import run_workload

pytestmark = pytest.mark.broker

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if not k.startswith("TXNWATCH_")},
    )


def inspect(bootstrap: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run("-m", "txnwatch_cli", "inspect", *args, "--bootstrap-server", bootstrap)


def test_inspect_partition_of_a_hanging_orphan(bootstrap: str, unique: str) -> None:
    truth = run_workload(bootstrap, "--scenario", "hanging", "--topic-prefix", unique)
    (h,) = [t for t in truth["transactions"] if t["kind"] == "hanging"]
    where = ["--topic", h["topic"], "--partition", str(h["partition"])]

    done = inspect(bootstrap, "partition", *where, "--output", "json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["last_stable_offset"] == h["start_offset"] and report["lso_lag"] >= 1
    assert report["max_transaction_timeout_ms"] == 60_000
    (t,) = report["open_transactions"]
    assert (t["producer_id"], t["producer_epoch"], t["start_offset"]) == (
        h["producer_id"],
        h["producer_epoch"],
        h["start_offset"],
    )
    assert t["start_timestamp_ms"] == h["start_timestamp_ms"]
    assert t["age_ms"] >= 0
    # The coordinator finished the transaction this producer id belongs to (this partition was never in it), and
    # the workload's producer restarted: Empty at the next epoch.
    c = t["coordinator"]
    assert c["transactional_id"] == h["transactional_id"]
    assert (c["state"], c["producer_epoch"]) == ("Empty", h["owner_epoch"])
    assert c["partition_listed"] is False
    # The verdict is rules.classify's on the DescribeTransactions view: not shown current, and without the time
    # the coordinator completed, so "completed before the report" is not proven here: never HANGING.
    verdict = t["verdict"]
    assert verdict["kind"] in ("OPEN", "LATE") and verdict["evidence"]["view_current_as_of_ms"] is None
    assert t["note"] == verdict["explanation"] and "Empty" in t["note"]

    table = inspect(bootstrap, "partition", *where, "--output", "table")  # not a terminal: JSON by default
    assert table.returncode == 0, table.stderr
    assert f"{h['topic']}-{h['partition']}  leader 1  LSO {h['start_offset']}" in table.stdout
    assert h["transactional_id"] in table.stdout and "Empty" in table.stdout
    assert "Verdict" in table.stdout and "shows as UNCONFIRMED" in table.stdout

    # Leave the shared broker clean: abort the orphan (WriteTxnMarkers, coordinator epoch 0).
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.abort_transaction(
            AbortTransactionSpec(
                TopicPartition(h["topic"], h["partition"]), h["producer_id"], h["producer_epoch"], 0
            )
        )
    finally:
        admin.close()


def test_inspect_partition_of_a_healthy_open_transaction(bootstrap: str, unique: str) -> None:
    topic = f"{unique}healthy"
    run_workload(
        bootstrap, "--scenario", "steady", "--topic-prefix", topic, "--seconds", "0.2", "--topics", "1"
    )
    steady_topic = f"{topic}steady-0"
    producer = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"{unique}open")
    producer.init_transactions()
    producer.begin_transaction()
    md = producer.send(steady_topic, b"open", partition=1).get(timeout=30)
    try:
        done = inspect(
            bootstrap, "partition", "--topic", steady_topic, "--partition", "1", "--output", "json"
        )
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        (t,) = [
            t for t in report["open_transactions"] if t["coordinator"]["transactional_id"] == f"{unique}open"
        ]
        assert t["start_offset"] == md.offset and t["start_timestamp_ms"] == md.timestamp
        assert t["coordinator"]["state"] == "Ongoing" and t["coordinator"]["partition_listed"] is True
        assert t["verdict"]["kind"] == "OPEN" and "lists the partition" in t["note"]
    finally:
        producer.commit_transaction()
        producer.close()


def test_inspect_unknown_partition_fails_clearly(bootstrap: str, unique: str) -> None:
    done = inspect(bootstrap, "partition", "--topic", f"{unique}nope", "--partition", "0")
    assert done.returncode == 1
    assert "does not exist" in done.stderr


def test_coordinator_log_decodes_a_real_transaction(bootstrap: str, unique: str) -> None:
    txn_id = f"{unique}logged"
    run_workload(
        bootstrap, "--scenario", "steady", "--topic-prefix", unique, "--seconds", "0.1", "--topics", "1"
    )
    producer = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=txn_id)
    producer.init_transactions()
    producer.begin_transaction()
    producer.send(f"{unique}steady-0", b"x", partition=0).get(timeout=30)
    producer.commit_transaction()
    producer.close()

    done = inspect(
        bootstrap,
        "coordinator-log",
        "--transactional-id",
        txn_id,
        "--from-beginning",
        "--timeout-ms",
        "3000",
        "--output",
        "json",
    )
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in done.stdout.splitlines()]
    assert records and {r["transactional_id"] for r in records} == {txn_id}
    states = [r["state"] for r in records]
    assert states[0] == "Empty" and "Ongoing" in states and states[-1] == "CompleteCommit"
    ongoing = next(r for r in records if r["state"] == "Ongoing")
    assert {"topic": f"{unique}steady-0", "partition": 0} in ongoing["partitions"]
    assert all(r["origin"] == "transaction-log" and r["source_offset"] >= 0 for r in records)

    table = inspect(
        bootstrap,
        "coordinator-log",
        "--from-beginning",
        "--max-records",
        "3",
        "--timeout-ms",
        "3000",
        "--output",
        "table",  # not a terminal: JSON by default
    )
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split("\t")[:4] == ["Partition", "Offset", "Timestamp", "TransactionalId"]
    assert len(lines) == 4
