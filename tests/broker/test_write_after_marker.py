"""A Produce that lands after its transaction's commit marker, on a real broker (KIP-890's motivating case).

A kafka-python transaction commits on two partitions; then a delayed Produce of the same producer id and epoch (a
retried batch, written here unverified with Produce v9 as a client before TV2 can) lands on both, after the
markers. Each partition holds an open transaction that began after its commit marker. From the coordinator's log
alone it looks like a lost commit marker (the CompleteCommit listed the partition, and the transaction was not seen
open before it): UNCONFIRMED `commit-or-late-write`, no candidate, the LSO pinned for as long as it exists. The
partition's leader tells them apart: the collector reports the leader epoch the start batch was appended in and the
one the leader answers at; equal, so no marker written since can have been lost, and the rules prove HANGING
`write-after-marker`. `proposals abort --execute` then needs no acknowledgement, and afterwards a read_committed
reader gets the committed records and not the late ones.
"""

from __future__ import annotations

import contextlib
import time

import pytest
from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import NewTopic
from transaction_log import coordinator_log, coordinator_view, decoded
from workloads import PROPOSALS_CLUSTER, Proposals, read_committed_values, transaction_log_records

from admin.collect.collector import Collector
from admin.wire.kafka_wire import KafkaWire
from common.settings import CollectorSettings
from detectors.abort import plan_abort
from detectors.contract import TRANSACTION_LOG_TOPIC
from detectors.currency import coordinator_partition
from detectors.models import CoordinatorState, DetectionLimits, HangingReason, VerdictKind
from detectors.rules import classify
from dev.workload import raw_transactional_produce, restart_owner

pytestmark = pytest.mark.broker

LIMITS = DetectionLimits()
SETTINGS = CollectorSettings(retry_backoff_ms=100, request_timeout_ms=10_000)


def test_a_produce_after_the_commit_marker_is_proven_a_write_after_marker_and_aborted(
    bootstrap: str, unique: str
) -> None:
    topic, tid = f"{unique}orders", f"{unique}tx"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(topic, 2, 1)])
    producer = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=tid, acks="all")
    wire = KafkaWire(admin, request_timeout_ms=SETTINGS.request_timeout_ms)
    collector = Collector(wire, cluster=PROPOSALS_CLUSTER, settings=SETTINGS, open_partitions=set())
    try:
        producer.init_transactions()
        pe = producer._transaction_manager.producer_id_and_epoch
        pid, epoch = int(pe.producer_id), int(pe.epoch)
        producer.begin_transaction()
        for p in (0, 1):
            producer.send(topic, b"committed", partition=p).get(timeout=30)
        producer.commit_transaction()
        # EndTxn answers once PrepareCommit is written; the markers follow. The late write comes after them.
        deadline = time.monotonic() + 30
        while transaction_log_records(bootstrap, tid)[-1].state is not CoordinatorState.COMPLETE_COMMIT:
            assert time.monotonic() < deadline, "the commit never completed"
            time.sleep(0.2)
        late_at = int(time.time() * 1000)
        starts = {
            p: raw_transactional_produce(
                admin,
                topic=topic,
                partition=p,
                transactional_id=tid,
                producer_id=pid,
                producer_epoch=epoch,
                base_sequence=1,
                timestamp_ms=late_at,
                value=b"late",
            )
            for p in (0, 1)
        }
        collector.sweep()  # first seen open: after the commit
        time.sleep((LIMITS.grace_ms + LIMITS.clock_skew_ms) / 1000 + 1)
        report = collector.sweep()
        rows = decoded(coordinator_log(bootstrap, coordinator_partition(tid, _log_partitions(admin))))
    finally:
        with contextlib.suppress(Exception):
            producer.close(timeout=5)
    try:
        record = coordinator_view(rows, pid)
        assert record.state is CoordinatorState.COMPLETE_COMMIT
        assert {(tp.topic, tp.partition) for tp in record.prepared_partitions or ()} == {
            (topic, 0),
            (topic, 1),
        }
        snaps = {s.partition: s for s in report.snapshots if s.topic == topic}
        assert set(snaps) == {0, 1}, (report.snapshots, report.problems, starts)
        proposals = Proposals(bootstrap, f"{unique}tw")
        # The application restarts (InitProducerId moves the id's epoch), so its next write there could not join
        # the late transaction: the abort needs no --allow-live-owner (tested on its own elsewhere).
        assert restart_owner(bootstrap, tid) == epoch + 1
        for p, snap in sorted(snaps.items()):
            (txn,) = snap.open_transactions
            assert txn.start_offset == starts[p]
            assert snap.leader_epoch is not None and txn.start_batch_leader_epoch == snap.leader_epoch
            # The log was read to its end after the report: the view is current as of it.
            v = classify(
                txn,
                snap,
                record,
                now_ms=snap.observed_at_ms,
                limits=LIMITS,
                view_current_ms=snap.observed_at_ms,
            )
            assert (v.kind, v.reason) == (VerdictKind.HANGING, HangingReason.WRITE_AFTER_MARKER), (
                v.explanation
            )
            candidate = plan_abort(snap, txn, v, first_detected_ms=snap.observed_at_ms)
            assert candidate.spec.transaction_result == "ABORT"
            proposals.publish(candidate)
            done = proposals.run(
                "abort", candidate.candidate_id, "--execute", "--actor", "write-after-marker"
            )
            assert done.returncode == 0, (done.stdout, done.stderr)
            # The commit is whole; the late write is gone for read_committed readers.
            assert read_committed_values(bootstrap, topic, p, 0)[:1] == [b"committed"]
            assert b"late" not in read_committed_values(bootstrap, topic, p, 0)
    finally:
        admin.close()


def _log_partitions(admin: KafkaAdminClient) -> int:
    (described,) = admin.describe_topics([TRANSACTION_LOG_TOPIC])
    return len(described["partitions"])
