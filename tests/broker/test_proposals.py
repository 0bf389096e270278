"""`txnwatch proposals` against the real broker: a real orphan aborted with `--execute` (the LSO moves and a
read_committed consumer reads past it), a dry run that writes nothing, a live transaction refused (and, once it
committed, refused again: it changed since the plan), a second execution that is a no-op, two concurrent
executions that write one marker, and an audit record for every attempt.

No Spark here: each test plans its candidate with `detectors.abort.plan_abort` from what the leader reports and
publishes it to the candidates topic itself, as the streaming job would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.admin import NewTopic
from kafka.structs import OffsetAndMetadata, TopicPartition
from workloads import leader_state, lso, plan_by_hand, read_committed_values, run_workload

from admin.wire.kafka_wire import KafkaWire
from detectors.models import AbortCandidate, AuditRecord

pytestmark = pytest.mark.broker

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = "broker-tests"


class Bed:
    """One test's topics and a way to run `txnwatch proposals` on them."""

    def __init__(self, bootstrap: str, unique: str) -> None:
        self.bootstrap = bootstrap
        self.prefix = f"{unique}tw"
        self.candidates = f"{self.prefix}.abort-candidates"
        self.audit = f"{self.prefix}.audit"

    def command(self, *args: str) -> list[str]:
        return [
            sys.executable,
            "-m",
            "txnwatch_cli",
            "proposals",
            *args,
            "--bootstrap-server",
            self.bootstrap,
            "--cluster",
            CLUSTER,
            "--topic-prefix",
            self.prefix,
            "--output",
            "json",
        ]

    @staticmethod
    def env() -> dict[str, str]:
        return {k: v for k, v in os.environ.items() if not k.startswith("TXNWATCH_")}

    def txnwatch(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.command(*args),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            cwd=ROOT,
            env=self.env(),
        )

    def publish(self, candidate: AbortCandidate) -> None:
        admin = KafkaAdminClient(bootstrap_servers=self.bootstrap)
        try:
            if self.candidates not in admin.list_topics():
                admin.create_topics(
                    [NewTopic(self.candidates, 1, 1, topic_configs={"cleanup.policy": "compact"})]
                )
        finally:
            admin.close()
        producer = KafkaProducer(bootstrap_servers=self.bootstrap, acks="all")
        try:
            producer.send(
                self.candidates,
                key=candidate.candidate_id.encode(),
                value=candidate.model_dump_json().encode(),
            ).get(timeout=30)
        finally:
            producer.close()

    def audits(self, expected: int, timeout_s: float = 20) -> list[AuditRecord]:
        consumer = KafkaConsumer(bootstrap_servers=self.bootstrap, enable_auto_commit=False, group_id=None)
        out: list[AuditRecord] = []
        try:
            tp = TopicPartition(self.audit, 0)
            consumer.assign([tp])
            consumer.seek_to_beginning(tp)
            deadline = time.monotonic() + timeout_s
            # At least `expected` records, and everything up to the end offset once they are there.
            while time.monotonic() < deadline:
                for records in consumer.poll(timeout_ms=500).values():
                    out += [AuditRecord.model_validate_json(r.value) for r in records]
                if len(out) >= expected and consumer.position(tp) >= consumer.end_offsets([tp])[tp]:
                    break
        finally:
            consumer.close()
        return out


@pytest.fixture
def bed(bootstrap: str, unique: str) -> Bed:
    return Bed(bootstrap, unique)


def commit_offset(bootstrap: str, group: str, topic: str, partition: int, offset: int) -> None:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    try:
        tp = TopicPartition(topic, partition)
        consumer.assign([tp])
        consumer.commit({tp: OffsetAndMetadata(offset, "", -1)})
    finally:
        consumer.close()


def orphan(bootstrap: str, unique: str) -> dict[str, Any]:
    truth = run_workload(bootstrap, "--scenario", "hanging", "--topic-prefix", unique)
    (h,) = [t for t in truth["transactions"] if t["kind"] == "hanging"]
    return h  # type: ignore[no-any-return]


def test_orphan_aborted_with_execute_unblocks_read_committed(
    bed: Bed, wire: KafkaWire, bootstrap: str, unique: str
) -> None:
    h = orphan(bootstrap, unique)
    topic, partition, start = h["topic"], h["partition"], h["start_offset"]
    # A record after the orphan: held back from read_committed readers until the orphan is aborted.
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    producer.send(topic, b"after-the-orphan", partition=partition).get(timeout=30)
    producer.close()
    candidate = plan_by_hand(wire, topic, partition, h["producer_id"], cluster=CLUSTER)
    assert (candidate.spec.producer_epoch, candidate.start_offset) == (h["producer_epoch"], start)
    assert candidate.spec.coordinator_epoch >= 0
    bed.publish(candidate)
    assert lso(wire, topic, partition) == start
    # A read_committed application that consumed everything it could: its group sits at the LSO.
    stuck_group = f"{unique}billing"
    commit_offset(bootstrap, stuck_group, topic, partition, start)

    listed = bed.txnwatch("list")
    assert listed.returncode == 0, listed.stderr
    assert [c["candidate_id"] for c in json.loads(listed.stdout)] == [candidate.candidate_id]

    shown = bed.txnwatch("show", candidate.candidate_id)
    assert shown.returncode == 0, shown.stderr
    show = json.loads(shown.stdout)
    assert show["live"]["last_stable_offset"] == start and show["live_lso_lag"] >= 1
    assert show["live"]["producer"]["current_txn_start_offset"] == start
    # The workload's producer restarted after the orphan (dev/workload.py): its id is Empty at the next epoch, so
    # no batch of it can join the orphan's transaction unfenced, and the abort needs no --allow-live-owner.
    owner = show["live"]["coordinator"]
    assert h["owner_epoch"] == h["producer_epoch"] + 1
    assert (owner["state"], owner["producer_epoch"]) == ("Empty", h["owner_epoch"])
    assert owner["partition_listed"] is False
    assert show["verify"]["outcome"] == "SAFE" and show["verify"]["waived"] == []
    assert show["stuck_groups"] == {stuck_group: start}
    assert (
        show["act"]["txnwatch"].endswith("--execute") and "kafka-transactions.sh" in show["act"]["kafka_cli"]
    )
    assert show["act"]["txnwatch_allow_live_owner"] is None  # the refusal does not apply: no flag offered

    done = bed.txnwatch("abort", candidate.candidate_id, "--execute", "--actor", "on-call")
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout)
    assert record["outcome"] == "ABORTED" and record["marker_written"] is True
    assert record["marker"]["coordinator_epoch"] == candidate.spec.coordinator_epoch
    assert record["after"]["last_stable_offset"] > start
    assert lso(wire, topic, partition) > start  # type: ignore[operator]
    assert b"after-the-orphan" in read_committed_values(bootstrap, topic, partition, start)

    # Executing again: the transaction is gone, a clear no-op.
    again = bed.txnwatch("abort", candidate.candidate_id, "--execute", "--actor", "on-call")
    assert again.returncode == 4, again.stderr
    assert json.loads(again.stdout)["outcome"] == "ALREADY_RESOLVED"
    assert "aborted by on-call" in again.stderr

    # Aborted: no longer pending.
    listed = bed.txnwatch("list")
    assert listed.returncode == 0 and json.loads(listed.stdout) == []

    # The execution claimed the candidate before its marker; the second run ended at the audit log.
    audits = bed.audits(3)
    assert [(a.candidate_id, a.outcome.value, a.actor) for a in audits] == [
        (candidate.candidate_id, "CLAIMED", "on-call"),
        (candidate.candidate_id, "ABORTED", "on-call"),
        (candidate.candidate_id, "ALREADY_RESOLVED", "on-call"),
    ]
    assert audits[0].audit_id == audits[1].audit_id
    assert audits[1].before is not None and audits[1].before.last_stable_offset == start


def test_dry_run_writes_nothing(bed: Bed, wire: KafkaWire, bootstrap: str, unique: str) -> None:
    h = orphan(bootstrap, unique)
    topic, partition, start = h["topic"], h["partition"], h["start_offset"]
    candidate = plan_by_hand(wire, topic, partition, h["producer_id"], cluster=CLUSTER)
    bed.publish(candidate)

    dry = bed.txnwatch("abort", candidate.candidate_id)
    assert dry.returncode == 0, dry.stderr
    record = json.loads(dry.stdout)
    assert record["outcome"] == "DRY_RUN" and record["marker_written"] is False and record["marker"] is None
    assert record["verify"]["outcome"] == "SAFE"
    assert lso(wire, topic, partition) == start
    _, _, producers, _ = leader_state(wire, topic, partition)
    assert [p.current_txn_start_offset for p in producers if p.producer_id == h["producer_id"]] == [start]
    (audit,) = bed.audits(1)
    assert audit.outcome.value == "DRY_RUN" and audit.execute is False

    # Leave the shared broker clean.
    done = bed.txnwatch("abort", candidate.candidate_id, "--execute")
    assert done.returncode == 0, done.stderr


def test_live_transaction_is_refused(bed: Bed, wire: KafkaWire, bootstrap: str, unique: str) -> None:
    topic = f"{unique}live"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(topic, 1, 1)])
    finally:
        admin.close()
    producer = KafkaProducer(
        bootstrap_servers=bootstrap,
        transactional_id=f"{unique}live-tx",
        acks="all",
        transaction_timeout_ms=60_000,
    )
    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send(topic, b"in-flight", partition=0).get(timeout=30)
        producer.flush()
        (pid,) = [p.producer_id for p in leader_state(wire, topic, 0)[2] if p.current_txn_start_offset >= 0]
        candidate = plan_by_hand(
            wire, topic, 0, pid, cluster=CLUSTER
        )  # a (wrong) candidate planned by hand for a live transaction
        bed.publish(candidate)
        before = lso(wire, topic, 0)
        assert before == candidate.start_offset

        refused = bed.txnwatch("abort", candidate.candidate_id, "--execute", "--actor", "on-call")
        assert refused.returncode == 3, refused.stderr
        record = json.loads(refused.stdout)
        assert record["outcome"] == "REFUSED" and record["marker_written"] is False
        assert "Ongoing" in record["message"] and f"{topic}-0" in record["message"]
        assert record["before"]["coordinator"]["state"] == "Ongoing"
        assert lso(wire, topic, 0) == before
        # Nothing was broken: the transaction commits and its record is readable.
        producer.commit_transaction()
    finally:
        producer.close()
    assert b"in-flight" in read_committed_values(bootstrap, topic, 0, 0)

    # Committed between plan and execute: refused, nothing written, audited too; `list` no longer shows it.
    after_commit = lso(wire, topic, 0)
    late = bed.txnwatch("abort", candidate.candidate_id, "--execute", "--actor", "on-call")
    assert late.returncode == 3, late.stderr
    record = json.loads(late.stdout)
    assert record["marker_written"] is False and "changed since the plan" in record["message"]
    assert record["verify"]["outcome"] == "ALREADY_RESOLVED"
    assert lso(wire, topic, 0) == after_commit
    assert [a.outcome.value for a in bed.audits(2)] == ["REFUSED", "REFUSED"]
    listed = bed.txnwatch("list")
    assert listed.returncode == 0 and json.loads(listed.stdout) == []


def test_two_concurrent_executions_write_one_marker(
    bed: Bed, wire: KafkaWire, bootstrap: str, unique: str
) -> None:
    h = orphan(bootstrap, unique)
    topic, partition, start = h["topic"], h["partition"], h["start_offset"]
    candidate = plan_by_hand(wire, topic, partition, h["producer_id"], cluster=CLUSTER)
    bed.publish(candidate)
    hw_before = leader_state(wire, topic, partition)[3].high_watermark

    # Two on-call engineers press enter at the same moment.
    procs = [
        subprocess.Popen(
            bed.command("abort", candidate.candidate_id, "--execute", "--actor", who),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=bed.env(),
        )
        for who in ("alice", "bob")
    ]
    results = [(p.wait(timeout=120), *p.communicate()) for p in procs]
    codes = sorted(code for code, _, _ in results)
    assert codes == [0, 4], results
    outcomes = sorted(json.loads(out)["outcome"] for _, out, _ in results)
    assert outcomes == ["ABORTED", "ALREADY_RESOLVED"], results

    # Exactly one control record (the ABORT marker) was appended: the high watermark moved by one.
    after = leader_state(wire, topic, partition)[3]
    assert after.high_watermark == hw_before + 1
    assert after.last_stable_offset is not None and after.last_stable_offset > start
    # Each run that verified SAFE claimed first; a run that started after the abort ended found it in the log.
    audits = bed.audits(3)
    endings = sorted(a.outcome.value for a in audits if a.outcome.value != "CLAIMED")
    assert endings == ["ABORTED", "ALREADY_RESOLVED"]
    assert 1 <= sum(1 for a in audits if a.outcome.value == "CLAIMED") <= 2
    assert sum(1 for a in audits if a.marker_written) == 1


def test_abort_named_by_topic_partition_and_start_offset_like_kafkas_tool(
    bed: Bed, wire: KafkaWire, bootstrap: str, unique: str
) -> None:
    """`proposals abort --topic --partition --start-offset`, as `kafka-transactions.sh abort` names a
    transaction: an offset the job proposes nothing for is refused by name and nothing is written; the
    candidate's own offset aborts it. `list --fail-if-any` exits 6 while it is pending, 0 once aborted."""
    h = orphan(bootstrap, unique)
    topic, partition, start = h["topic"], h["partition"], h["start_offset"]
    candidate = plan_by_hand(wire, topic, partition, h["producer_id"], cluster=CLUSTER)
    bed.publish(candidate)
    where = ("--topic", topic, "--partition", str(partition))

    pending = bed.txnwatch("list", "--fail-if-any")
    assert pending.returncode == 6, pending.stderr
    assert [c["candidate_id"] for c in json.loads(pending.stdout)] == [candidate.candidate_id]

    refused = bed.txnwatch(
        "abort", *where, "--start-offset", str(start + 1), "--execute", "--actor", "on-call"
    )
    assert (refused.returncode, refused.stdout) == (3, ""), refused.stderr
    said = json.loads(refused.stderr)
    assert said["exit_code"] == 3 and said["error"].startswith("refused, no marker written: not-proposed: ")
    assert lso(wire, topic, partition) == start  # nothing written

    done = bed.txnwatch("abort", *where, "--start-offset", str(start), "--execute", "--actor", "on-call")
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout)
    assert (record["candidate_id"], record["outcome"]) == (candidate.candidate_id, "ABORTED")
    assert lso(wire, topic, partition) > start  # type: ignore[operator]

    cleared = bed.txnwatch("list", "--fail-if-any")
    assert (cleared.returncode, json.loads(cleared.stdout)) == (0, []), cleared.stderr
