"""`txnwatch proposals abort --execute` side by side with Kafka's own `kafka-transactions.sh abort`
(TransactionsCommand from the kafka-tools jar), on a TV2 cluster (the session's test bed) and on a TV0 cluster
(a module-scoped one-node bed formatted with transaction.version=0).

Two identical real orphans (dev/workload.py --scenario hanging, each on its own topic with the same layout) are
aborted one each way. Both must end the same: one ABORT control batch after the orphan, with the orphan's producer
id and epoch and coordinator epoch 0 (the leader reported -1: nobody ever wrote a marker there), the leader's
producer entry closed the same way, the LSO past the start offset, and a read_committed consumer reading past it
(the orphan's record filtered out as aborted, the record after it delivered).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaAdminClient
from workloads import (
    Batch,
    Proposals,
    lso,
    partition_batches,
    plan_by_hand,
    produce_plain,
    producer_row,
    read_committed_values,
    run_workload,
)

from admin.wire.kafka_wire import KafkaWire
from dev.kafka import TestBedConfig, start_cluster, stop_cluster
from dev.oracle import run_tool, transactions_command

pytestmark = pytest.mark.broker


@pytest.fixture(scope="module", params=["tv2", "tv0"])
def bed(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, int]]:
    """(bootstrap, transaction.version): the session's TV2 bed, or a TV0 bed of this module's own."""
    if request.param == "tv2":
        yield request.getfixturevalue("bootstrap"), 2
        return
    state_dir: Path = tmp_path_factory.mktemp("tv0-testbed")
    cluster = start_cluster(
        TestBedConfig(nodes=1, partition_verification=False, transaction_version=0), state_dir
    )
    try:
        yield cluster.bootstrap_servers, 0
    finally:
        stop_cluster(state_dir)


def finalized_transaction_version(bootstrap: str) -> int:
    """transaction.version as the cluster reports it (Kafka's FeatureCommand, `kafka-features.sh describe`)."""
    done = run_tool("org.apache.kafka.tools.FeatureCommand", ["--bootstrap-server", bootstrap, "describe"])
    assert done.returncode == 0, done.stderr
    line = next(x for x in done.stdout.splitlines() if "Feature: transaction.version" in x)
    return int(line.split("FinalizedVersionLevel:")[1].split()[0])


def orphan_with_a_record_after(bootstrap: str, prefix: str) -> dict[str, Any]:
    truth = run_workload(bootstrap, "--scenario", "hanging", "--topic-prefix", prefix)
    (h,) = [t for t in truth["transactions"] if t["kind"] == "hanging"]
    h["after_offset"] = produce_plain(bootstrap, h["topic"], h["partition"], b"after-the-orphan")
    return h  # type: ignore[no-any-return]


def markers_after(batches: list[Batch], producer_id: int, start: int) -> list[Batch]:
    return [b for b in batches if b.control and b.producer_id == producer_id and b.base_offset > start]


def wait_lso_past(wire: KafkaWire, topic: str, partition: int, start: int, timeout_s: float = 15) -> int:
    deadline = time.monotonic() + timeout_s
    while True:
        now = lso(wire, topic, partition)
        if (now is not None and now > start) or time.monotonic() > deadline:
            assert now is not None and now > start, f"LSO of {topic}-{partition} is {now}, not past {start}"
            return now
        time.sleep(0.2)


def test_txnwatch_and_kafka_cli_abort_end_the_same(bed: tuple[str, int]) -> None:
    bootstrap, version = bed
    assert finalized_transaction_version(bootstrap) == version
    unique = f"t{uuid.uuid4().hex[:8]}-"
    ours = orphan_with_a_record_after(bootstrap, f"{unique}ours-")
    theirs = orphan_with_a_record_after(bootstrap, f"{unique}kafka-")
    # kafka-python 3.0.12 sends EndTxn v3 at most, so even on the TV2 bed its transactions end the pre-KIP-890
    # way: the coordinator's COMMIT marker on the well-behaved partition carries the transaction's own epoch
    # (a TV2 client's would carry the next one). The beds differ in the coordinator's log format and rules.
    (commit,) = [b for b in partition_batches(bootstrap, ours["topic"], 0) if b.control]
    assert (commit.marker, commit.producer_epoch) == ("COMMIT", ours["producer_epoch"])
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    wire = KafkaWire(admin)
    try:
        # The two set-ups are identical: same partition, same offsets, the leader reports the same shape.
        for h in (ours, theirs):
            assert (h["partition"], h["start_offset"]) == (ours["partition"], ours["start_offset"])
            assert producer_row(wire, h["topic"], h["partition"], h["producer_id"]) == (
                h["producer_epoch"],
                -1,  # no marker ever written on this partition for this producer
                h["start_offset"],
            )
            assert lso(wire, h["topic"], h["partition"]) == h["start_offset"]

        # One way: txnwatch, verified (the workload's producer restarted after the orphan: its id is at the next
        # epoch, so no live owner at the marker's).
        proposals = Proposals(bootstrap, f"{unique}tw")
        candidate = plan_by_hand(wire, ours["topic"], ours["partition"], ours["producer_id"])
        proposals.publish(candidate)
        done = proposals.run("abort", candidate.candidate_id, "--execute", "--actor", "side-by-side")
        assert done.returncode == 0, done.stderr
        record = json.loads(done.stdout)
        assert record["outcome"] == "ABORTED" and record["marker_written"] is True

        # The other: Kafka's tool, by start offset (it reads the epochs from DescribeProducers itself).
        transactions_command(
            bootstrap,
            "abort",
            "--topic",
            theirs["topic"],
            "--partition",
            str(theirs["partition"]),
            "--start-offset",
            str(theirs["start_offset"]),
        )

        ended: dict[str, Any] = {}
        for name, h in (("txnwatch", ours), ("kafka-transactions.sh", theirs)):
            topic, partition, start, pid = h["topic"], h["partition"], h["start_offset"], h["producer_id"]
            after_lso = wait_lso_past(wire, topic, partition, start)
            batches = partition_batches(bootstrap, topic, partition)
            (marker,) = markers_after(batches, pid, start)
            (orphan_batch,) = [b for b in batches if b.base_offset == start]
            assert orphan_batch.transactional and orphan_batch.values == (b"orphan",)
            # The marker closes exactly the orphan: same producer id and epoch, coordinator epoch 0, placed
            # after the record written behind the orphan.
            assert marker.marker == "ABORT" and marker.transactional
            assert (marker.producer_id, marker.producer_epoch) == (pid, h["producer_epoch"])
            assert marker.base_offset == h["after_offset"] + 1
            assert after_lso == marker.base_offset + 1  # nothing open any more: the LSO is the high watermark
            values = read_committed_values(bootstrap, topic, partition, start)
            assert b"after-the-orphan" in values and b"orphan" not in values
            ended[name] = {
                "marker": (
                    marker.marker,
                    marker.producer_epoch - h["producer_epoch"],
                    marker.coordinator_epoch,
                ),
                "marker_offset_minus_start": marker.base_offset - start,
                "lso_minus_start": after_lso - start,
                "leader_row": producer_row(wire, topic, partition, pid),
                "read_committed": values,
            }
            # The leader closed the producer's entry with the marker's epochs.
            assert ended[name]["leader_row"] == (h["producer_epoch"], marker.coordinator_epoch, -1)
        print(f"\ntransaction.version={version}: {ended}")
        assert ended["txnwatch"] == ended["kafka-transactions.sh"]
        assert ended["txnwatch"]["marker"] == ("ABORT", 0, 0)
        # txnwatch's audit holds what it sent, the same as what landed.
        (audit,) = proposals.endings(1)
        assert audit.marker is not None and (audit.marker.producer_epoch, audit.marker.coordinator_epoch) == (
            ours["producer_epoch"],
            0,
        )
    finally:
        admin.close()
