"""dev/workload.py run the way scripts run it (its CLI with --json), shared by every test tier."""

from __future__ import annotations

import contextlib
import json
import os
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.admin import NewTopic
from kafka.errors import TopicAlreadyExistsError
from kafka.record.default_records import DefaultRecordBatch
from kafka.record.memory_records import MemoryRecords
from kafka.structs import TopicPartition

from detectors.codec import DecodeError, decode_key, decode_value
from detectors.contract import TRANSACTION_LOG_TOPIC
from detectors.models import CoordinatorRecord

ROOT = Path(__file__).resolve().parent.parent


def _command(bootstrap: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "dev.workload", "--bootstrap-server", bootstrap, "--json", *args]


def run_workload(bootstrap: str, *args: str) -> dict[str, Any]:
    """Run a scenario to the end; returns its ground truth."""
    done = subprocess.run(
        _command(bootstrap, *args), capture_output=True, text=True, timeout=180, check=False, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def start_workload(bootstrap: str, *args: str) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    """Start a scenario that holds a transaction open (`late`); returns the process and the ground truth it
    prints while the transaction is still open. The caller waits for the process."""
    proc = subprocess.Popen(
        _command(bootstrap, *args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, proc.stderr.read() if proc.stderr else "the workload printed nothing"
    return proc, json.loads(line)


# ------------------------------------------------------------------------------------------------------------
# Abort tests (tests/broker/test_abort_*.py, tests/e2e/test_abort_resolves_e2e.py): a candidate planned by hand
# from what the leader reports, `txnwatch proposals` run as a subprocess, and the partition read back to the
# byte (control batches included) to see what a marker really wrote.

PROPOSALS_CLUSTER = "abort-tests"


@dataclass(frozen=True)
class Batch:
    """One record batch of a partition as the leader stores it (read_uncommitted raw Fetch)."""

    base_offset: int
    last_offset: int
    producer_id: int
    producer_epoch: int
    transactional: bool
    control: bool
    marker: str | None  # "ABORT" / "COMMIT" for a control batch
    coordinator_epoch: int | None  # from the control record's value (int16 version, int32 coordinator epoch)
    values: tuple[bytes | None, ...]  # the records' values (empty for control batches)


def partition_batches(bootstrap: str, topic: str, partition: int, timeout_s: float = 30) -> list[Batch]:
    """Every batch of one partition from offset 0 to its high watermark, control batches included (a
    read_uncommitted consumer never returns those)."""
    from admin.wire.fetch import fetch_request  # test-side use of the collector's request builder

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    out: list[Batch] = []
    try:
        leader = admin.describe_topics([topic])[0]["partitions"]
        (leader_id,) = [p["leader_id"] for p in leader if p["partition_index"] == partition]
        offset = 0
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            request = fetch_request(
                [(topic, partition, offset)], partition_max_bytes=1 << 20, max_bytes=1 << 20
            )

            async def send(request: Any = request) -> Any:
                return await admin._manager.send(request, node_id=leader_id)

            response = admin._manager.run(send)
            (p,) = [p for t in response.responses for p in t.partitions]
            assert p.error_code == 0, f"Fetch {topic}-{partition} at {offset}: error {p.error_code}"
            for b in MemoryRecords(bytes(p.records or b"")):
                if not isinstance(b, DefaultRecordBatch) or b.last_offset < offset:
                    continue
                records = list(b)
                marker = coordinator_epoch = None
                if b.is_control_batch:
                    (control,) = records
                    marker = "ABORT" if control.abort else "COMMIT"
                    coordinator_epoch = struct.unpack(">hi", control.value)[1]
                out.append(
                    Batch(
                        base_offset=b.base_offset,
                        last_offset=b.last_offset,
                        producer_id=b.producer_id,
                        producer_epoch=b.producer_epoch,
                        transactional=b.is_transactional,
                        control=b.is_control_batch,
                        marker=marker,
                        coordinator_epoch=coordinator_epoch,
                        values=() if b.is_control_batch else tuple(r.value for r in records),
                    )
                )
                offset = b.last_offset + 1
            if offset >= p.high_watermark:
                return out
        raise AssertionError(f"reading {topic}-{partition} took longer than {timeout_s:.0f}s")
    finally:
        admin.close()


def leader_state(wire: Any, topic: str, partition: int) -> tuple[int, int, Any, Any]:
    """(leader, when it answered, its DescribeProducers rows, LSO/HW) of one partition, via `admin.wire.kafka_wire.KafkaWire`."""
    tp = (topic, partition)
    leader = wire.metadata([topic]).leaders[tp]
    (batch,) = wire.describe_producers({leader: [[tp]]})
    return leader, batch.received_at_ms, batch.results[tp].producers, wire.list_offsets({leader: [tp]})[tp]


def producer_row(wire: Any, topic: str, partition: int, producer_id: int) -> tuple[int, int, int] | None:
    """The leader's (producer epoch, coordinator epoch, current transaction start offset) for one producer id."""
    rows = [p for p in leader_state(wire, topic, partition)[2] if p.producer_id == producer_id]
    if not rows:
        return None
    p = rows[0]
    return p.producer_epoch, p.coordinator_epoch, p.current_txn_start_offset


def lso(wire: Any, topic: str, partition: int) -> int | None:
    return leader_state(wire, topic, partition)[3].last_stable_offset  # type: ignore[no-any-return]


def plan_by_hand(
    wire: Any, topic: str, partition: int, producer_id: int, *, cluster: str = PROPOSALS_CLUSTER
) -> Any:
    """An `AbortCandidate` planned from what the leader reports now, as the job would plan it (no coordinator
    view, so reason no-coordinator-state; the test knows the truth and needs no grace), with the leader epochs the
    collector reports: the one its start batch was appended at (its header's partitionLeaderEpoch) and the
    leader's now. Equal, as on a bed whose leader did not change since the orphan: `proposals abort` then needs no
    `--allow-leader-change`."""
    from admin.wire.types import StartBatch, open_transaction
    from detectors.abort import plan_abort
    from detectors.models import DetectionLimits, PartitionSnapshot
    from detectors.rules import classify

    time.sleep(0.05)  # the transaction's last batch is then strictly older than the leader's answer
    leader, observed, producers, offsets = leader_state(wire, topic, partition)
    (p,) = [p for p in producers if p.producer_id == producer_id and p.current_txn_start_offset >= 0]
    tp = (topic, partition)
    epoch = wire.metadata([topic]).leader_epochs.get(tp)
    at = (tp, p.current_txn_start_offset)
    start = wire.fetch_start_batches({leader: [at]}, {tp: epoch} if epoch is not None else None).get(at)
    start_epoch = start.leader_epoch if isinstance(start, StartBatch) else None
    txn = open_transaction(p, None).model_copy(update={"start_batch_leader_epoch": start_epoch})
    snapshot = PartitionSnapshot(
        cluster=cluster,
        sweep_id=uuid.uuid4().hex,
        observed_at_ms=observed,
        leader=leader,
        topic=topic,
        partition=partition,
        open_transactions=(txn,),
        last_stable_offset=offsets.last_stable_offset,
        high_watermark=offsets.high_watermark,
        max_transaction_timeout_ms=60_000,
        leader_epoch=epoch,
    )
    limits = DetectionLimits(grace_ms=0, clock_skew_ms=0)
    verdict = classify(txn, snapshot, None, now_ms=observed, limits=limits, view_current_ms=observed)
    return plan_abort(snapshot, txn, verdict, first_detected_ms=observed)


def read_committed_values(
    bootstrap: str, topic: str, partition: int, offset: int, timeout_s: float = 10
) -> list[bytes]:
    """What a read_committed consumer receives from `offset` on (waits until it receives something)."""
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None, isolation_level="read_committed"
    )
    values: list[bytes] = []
    try:
        tp = TopicPartition(topic, partition)
        consumer.assign([tp])
        consumer.seek(tp, offset)
        deadline = time.monotonic() + timeout_s
        while not values and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                values += [r.value for r in records]
    finally:
        consumer.close()
    return values


def produce_plain(bootstrap: str, topic: str, partition: int, value: bytes) -> int:
    """One non-transactional record (held back from read_committed readers while a transaction before it is
    open); returns its offset."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    try:
        return int(producer.send(topic, value, partition=partition).get(timeout=30).offset)
    finally:
        producer.close()


class Proposals:
    """`txnwatch proposals` on one prefix: publish candidates as the job would, run the real CLI, read audits."""

    def __init__(self, bootstrap: str, prefix: str, cluster: str = PROPOSALS_CLUSTER) -> None:
        self.bootstrap, self.prefix, self.cluster = bootstrap, prefix, cluster
        self.candidates = f"{prefix}.abort-candidates"
        self.audit = f"{prefix}.audit"

    def run(self, *args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "txnwatch_cli",
                "proposals",
                *args,
                "--bootstrap-server",
                self.bootstrap,
                "--cluster",
                self.cluster,
                "--topic-prefix",
                self.prefix,
                "--output",
                "json",
            ],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            cwd=ROOT,
            env={k: v for k, v in os.environ.items() if not k.startswith("TXNWATCH_")},
        )

    def publish(self, candidate: Any) -> None:
        admin = KafkaAdminClient(bootstrap_servers=self.bootstrap)
        try:
            if self.candidates not in admin.list_topics():
                with contextlib.suppress(TopicAlreadyExistsError):
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

    def endings(self, expected: int, timeout_s: float = 20) -> list[Any]:
        """The audit records that end an attempt (not the CLAIMED records an `--execute` takes first)."""
        deadline = time.monotonic() + timeout_s
        while True:
            out = [a for a in self.audits(0, timeout_s=2) if a.outcome.value != "CLAIMED"]
            if len(out) >= expected or time.monotonic() > deadline:
                return out
            time.sleep(0.5)

    def audits(self, expected: int, timeout_s: float = 20) -> list[Any]:
        """Every audit record in order, once at least `expected` were read (or `timeout_s` passed); with
        `expected` 0, what is there now."""
        from detectors.models import AuditRecord

        consumer = KafkaConsumer(bootstrap_servers=self.bootstrap, enable_auto_commit=False, group_id=None)
        out: list[Any] = []
        try:
            tp = TopicPartition(self.audit, 0)
            consumer.assign([tp])
            consumer.seek_to_beginning(tp)
            deadline = time.monotonic() + timeout_s
            end = consumer.end_offsets([tp])[tp]
            while (len(out) < expected or consumer.position(tp) < end) and time.monotonic() < deadline:
                for records in consumer.poll(timeout_ms=500).values():
                    out += [AuditRecord.model_validate_json(r.value) for r in records]
                if len(out) >= expected:
                    end = consumer.end_offsets([tp])[tp]
        finally:
            consumer.close()
        return out


# ------------------------------------------------------------------------------------------------------------
# Fault tests (tests/e2e/test_faults_*.py, tests/broker/test_abort_races.py): moving a partition's leader on a
# three-node test bed while its old leader keeps running.


def partition_replicas(admin: KafkaAdminClient, topic: str, partition: int) -> tuple[int, list[int]]:
    """(leader, replicas in preferred order) of one partition, from the cluster metadata."""
    (p,) = [p for p in admin.describe_topics([topic])[0]["partitions"] if p["partition_index"] == partition]
    return int(p["leader_id"]), [int(r) for r in p["replica_nodes"]]


def move_leader(admin: KafkaAdminClient, topic: str, partition: int, to: int, timeout_s: float = 60) -> float:
    """Make broker `to` (already a replica) the leader of one partition with the public admin APIs: the replica
    list reordered so `to` is preferred (AlterPartitionReassignments, same set: no data moves), then a preferred
    leader election (ElectLeaders). The old leader stays up as a follower. Returns the seconds it took."""
    began = time.monotonic()
    leader, replicas = partition_replicas(admin, topic, partition)
    assert to in replicas, f"broker {to} is not a replica of {topic}-{partition} ({replicas})"
    if leader == to:
        return 0.0
    order = [to] + [r for r in replicas if r != to]
    admin.alter_partition_reassignments({TopicPartition(topic, partition): order})
    deadline = time.monotonic() + timeout_s
    while partition_replicas(admin, topic, partition)[1] != order:
        assert time.monotonic() < deadline, f"{topic}-{partition} replicas never became {order}"
        time.sleep(0.2)
    while True:
        with contextlib.suppress(Exception):  # ELECTION_NOT_NEEDED / not yet in the ISR: ask again
            admin.elect_leaders(0, {topic: [partition]}, raise_errors=False)
        if partition_replicas(admin, topic, partition)[0] == to:
            return time.monotonic() - began
        assert time.monotonic() < deadline, f"{topic}-{partition}: broker {to} never became leader"
        time.sleep(0.3)


def batches_committed(names: Iterable[str]) -> int:
    """Micro-batches a query has committed, from the file names of its `commits/` log: the newest batch id plus
    one. Not the number of files: Spark keeps only the last `minBatchesToRetain` (20 in txnwatch), so the count
    stops growing after a minute or two."""
    ids = [int(n.rsplit("/", 1)[-1]) for n in names if n.rsplit("/", 1)[-1].isdigit()]
    return max(ids) + 1 if ids else 0


def transaction_log_records(bootstrap: str, transactional_id: str) -> list[CoordinatorRecord]:
    """Every record of the id in `__transaction_state`, read to the end offsets asked now, oldest first."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        parts = [
            TopicPartition(TRANSACTION_LOG_TOPIC, p)
            for p in consumer.partitions_for_topic(TRANSACTION_LOG_TOPIC)
        ]
        ends = consumer.end_offsets(parts)
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        found: list[CoordinatorRecord] = []
        deadline = time.monotonic() + 30
        while any(consumer.position(p) < ends[p] for p in parts):
            assert time.monotonic() < deadline, "could not read __transaction_state to its end"
            for records in consumer.poll(timeout_ms=500).values():
                for r in records:
                    with contextlib.suppress(DecodeError):
                        if decode_key(r.key).transactional_id == transactional_id:
                            found.append(
                                CoordinatorRecord.from_log_value(
                                    transactional_id,
                                    decode_value(r.value),
                                    source_partition=r.partition,
                                    source_offset=r.offset,
                                    source_timestamp_ms=r.timestamp,
                                )
                            )
        return sorted(found, key=lambda r: r.source_offset)
    finally:
        consumer.close()
