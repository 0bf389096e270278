"""End to end: the streaming job turns a candidate RESOLVED after `txnwatch proposals abort --execute`.

Real broker, real `txnwatch collect`, the real job (Spark, real connector): a real orphan (dev/workload.py
--scenario hanging) gets its OPENED candidate on `<prefix>.abort-candidates`; the real CLI (a subprocess, as
on-call runs it) aborts it; the job then writes RESOLVED for that candidate id, and `proposals list` no longer
shows it. Its own job, collector and prefix: it relies on no other module.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kafka import KafkaConsumer
from kafka.structs import TopicPartition
from pyspark.sql import SparkSession
from test_stream_e2e import Console, first_batch_done, read_topic, wait_for
from workloads import Proposals, produce_plain, read_committed_values, run_workload, start_workload

from common.settings import KafkaSettings, Settings, StreamSettings
from common.topics import TopicSettings
from detectors.models import AbortCandidate, HangingReason
from streaming import job

pytestmark = pytest.mark.e2e

CLUSTER = "e2e-abort"
DETECTION_TIMEOUT_S = 240.0
# The busy owner commits for this long after its orphan; the proof must come well inside it.
OWNER_BUSY_S = 100
# After the abort: the collector's next sweep (5 s) no longer lists the transaction, and the job's next
# batches (5 s trigger) forget it. Generous on a shared 2-core machine; a RESOLVED that never comes fails.
RESOLVE_TIMEOUT_S = 120.0


@dataclass
class Env:
    bootstrap: str
    settings: Settings
    running: job.RunningJob
    console: Console


@pytest.fixture(scope="module")
def env(spark: SparkSession, bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    prefix = f"e2eab{uuid.uuid4().hex[:8]}"
    settings = Settings(
        cluster=CLUSTER,
        kafka=KafkaSettings(bootstrap_servers=bootstrap),
        topics=TopicSettings(prefix=prefix),
        stream=StreamSettings(
            checkpoint_location=str(tmp_path_factory.mktemp("abort-checkpoints")),
            trigger="5 seconds",
            starting_offsets="earliest",
            expire_after_ms=20_000,
            metrics_port=0,
        ),
    )
    log = (tmp_path_factory.mktemp("abort-collector") / "collector.log").open("w")
    collector = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "txnwatch_cli",
            "collect",
            "--bootstrap-server",
            bootstrap,
            "--interval",
            "5",
            "--topic-prefix",
            prefix,
            "--cluster",
            CLUSTER,
            "--metrics-port",
            "0",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )
    running: job.RunningJob | None = None
    try:
        opts = job.StreamOptions(settings=settings, kafka_options={"bootstrap.servers": bootstrap})
        job.ensure_topics(opts, settings.kafka.client_kwargs())
        console = Console()
        running = job.start(spark, opts, out=console)
        started = running
        wait_for(lambda: first_batch_done(started, "txnwatch-reconcile"), 240, "the job's first batch")
        yield Env(bootstrap, settings, running, console)
    finally:
        if running is not None:
            running.stop()
        collector.terminate()
        collector.wait(timeout=30)
        log.close()


def candidates(env: Env) -> list[AbortCandidate]:
    return [
        AbortCandidate.model_validate_json(r.value)
        for r in read_topic(env.bootstrap, env.settings.topics.abort_candidates)
        if r.value is not None
    ]


def opened_on(env: Env, topic: str) -> list[AbortCandidate]:
    return [c for c in candidates(env) if c.topic == topic and c.status.value == "OPENED"]


def resolved_as(env: Env, candidate_id: str) -> list[AbortCandidate]:
    return [c for c in candidates(env) if c.candidate_id == candidate_id and c.status.value == "RESOLVED"]


def child_running(workload: subprocess.Popen[str], main_class: str) -> int | None:
    """The pid of the workload's child process running `main_class` (its Java owner), while it runs; None once it
    exited (a zombie not yet reaped has no command line)."""
    children = Path(f"/proc/{workload.pid}/task/{workload.pid}/children")
    try:
        pids = [int(p) for p in children.read_text().split()]
    except OSError:
        return None
    for pid in pids:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if main_class.encode() in cmdline:
            return pid
    return None


def end_offset(bootstrap: str, topic: str, read_committed: bool = False) -> int:
    """Partition 0's end: its high watermark, or (read_committed) its last stable offset."""
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        isolation_level="read_committed" if read_committed else "read_uncommitted",
    )
    try:
        tp = TopicPartition(topic, 0)
        return int(consumer.end_offsets([tp])[tp])
    finally:
        consumer.close()


def committed_records(bootstrap: str, topic: str, timeout_s: float = 30) -> int:
    """How many records a read_committed consumer receives from partition 0, from its start to its end."""
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, isolation_level="read_committed"
    )
    count = 0
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        end = consumer.end_offsets([tp])[tp]
        deadline = time.monotonic() + timeout_s
        while consumer.position(tp) < end:
            assert time.monotonic() < deadline, (
                f"reading {topic}-0 to {end} took longer than {timeout_s:.0f}s"
            )
            count += sum(len(records) for records in consumer.poll(timeout_ms=500).values())
    finally:
        consumer.close()
    return count


def test_candidate_resolved_after_the_cli_abort(env: Env) -> None:
    truth = run_workload(
        env.bootstrap, "--scenario", "hanging", "--topic-prefix", f"{env.settings.topics.prefix}-hang-"
    )
    (h,) = [t for t in truth["transactions"] if t["kind"] == "hanging"]
    topic, partition, start = h["topic"], h["partition"], h["start_offset"]
    produce_plain(env.bootstrap, topic, partition, b"after-the-orphan")
    made = time.monotonic()

    def opened() -> list[AbortCandidate]:
        return [c for c in candidates(env) if c.topic == topic and c.status.value == "OPENED"]

    (candidate,) = wait_for(opened, DETECTION_TIMEOUT_S, "the orphan's OPENED candidate")
    detected = time.monotonic()
    assert (candidate.partition, candidate.start_offset, candidate.spec.producer_id) == (
        partition,
        start,
        h["producer_id"],
    )

    proposals = Proposals(env.bootstrap, env.settings.topics.prefix, cluster=CLUSTER)
    assert proposals.candidates == env.settings.topics.abort_candidates
    listed = proposals.run("list")
    assert listed.returncode == 0, listed.stderr
    assert candidate.candidate_id in [c["candidate_id"] for c in json.loads(listed.stdout)]

    done = proposals.run("abort", candidate.candidate_id, "--execute", "--actor", "e2e")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["outcome"] == "ABORTED"
    aborted = time.monotonic()
    assert b"after-the-orphan" in read_committed_values(env.bootstrap, topic, partition, start)

    def resolved() -> list[AbortCandidate]:
        return [
            c
            for c in candidates(env)
            if c.candidate_id == candidate.candidate_id and c.status.value == "RESOLVED"
        ]

    (done_candidate,) = wait_for(resolved, RESOLVE_TIMEOUT_S, "the job's RESOLVED for the aborted candidate")
    print(
        f"\ndetected {detected - made:.1f}s after the orphan; RESOLVED {time.monotonic() - aborted:.1f}s "
        "after the abort"
    )
    assert done_candidate.resolved_at_ms is not None
    # Once per candidate: one OPENED, one RESOLVED, in that order, under one key.
    mine = [c for c in candidates(env) if c.candidate_id == candidate.candidate_id]
    assert [c.status.value for c in mine] == ["OPENED", "RESOLVED"]
    assert "RESOLVED" in env.console.text() and candidate.candidate_id in env.console.text()
    listed = proposals.run("list")
    assert listed.returncode == 0, listed.stderr
    assert candidate.candidate_id not in [c["candidate_id"] for c in json.loads(listed.stdout)]


def test_an_orphan_whose_owner_keeps_committing_is_proven_while_it_runs_and_aborted_once_it_restarts(
    env: Env,
) -> None:
    """The owner lives on: after its orphan, the same kafka-python producer (transaction version 0/1: one epoch
    for every transaction) commits a one-record transaction on another topic every 100 ms. The orphan is
    HANGING owner-moved-on while the owner still commits; `proposals abort` refuses by name while the owner is
    live at the orphan's epoch and says to restart it; once the application restarts (InitProducerId moves the
    epoch), the abort is SAFE, executes, and the job resolves the candidate."""
    prefix = env.settings.topics.prefix
    proc, truth = start_workload(
        env.bootstrap,
        "--scenario",
        "hanging",
        "--topic-prefix",
        f"{prefix}-busy-",
        "--owner-busy-ms",
        "100",
        "--owner-busy-for-s",
        str(OWNER_BUSY_S),
    )
    made = time.monotonic()
    try:
        (h,) = [t for t in truth["transactions"] if t["kind"] == "hanging"]

        def opened() -> list[AbortCandidate]:
            return [c for c in candidates(env) if c.topic == h["topic"] and c.status.value == "OPENED"]

        (candidate,) = wait_for(opened, OWNER_BUSY_S - 20, "the busy owner's orphan's OPENED candidate")
        detected = time.monotonic() - made
        assert proc.poll() is None, "the owner stopped committing before the proof"
        assert candidate.reason is HangingReason.OWNER_MOVED_ON, candidate.explanation
        assert (candidate.spec.producer_id, candidate.spec.producer_epoch, candidate.start_offset) == (
            h["producer_id"],
            h["producer_epoch"],
            h["start_offset"],
        )
        assert candidate.spec.transaction_result == "ABORT"

        proposals = Proposals(env.bootstrap, prefix, cluster=CLUSTER)
        # `show` gives the remedy for an owner live at the orphan's epoch: restart that producer.
        shown = proposals.run("show", candidate.candidate_id)
        assert shown.returncode == 0, (shown.stdout, shown.stderr)
        verify = json.loads(shown.stdout)["verify"]
        assert verify["outcome"] == "REFUSED", verify
        (live_owner,) = [line for line in verify["changes"] if line.startswith("live-owner-same-epoch: ")]
        assert h["transactional_id"] in live_owner and "restart that producer" in live_owner
        refused = proposals.run("abort", candidate.candidate_id)
        assert refused.returncode == 3, (refused.stdout, refused.stderr)
        assert "live-owner-same-epoch" in refused.stdout and "restart that producer" in refused.stdout
    finally:
        assert proc.wait(timeout=OWNER_BUSY_S + 60) == 0  # the busy period ends, then the owner restarts
    done = proposals.run("abort", candidate.candidate_id, "--execute", "--actor", "e2e")
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert json.loads(done.stdout)["outcome"] == "ABORTED"

    def resolved() -> list[AbortCandidate]:
        return [
            c
            for c in candidates(env)
            if c.candidate_id == candidate.candidate_id and c.status.value == "RESOLVED"
        ]

    wait_for(resolved, RESOLVE_TIMEOUT_S, "the job's RESOLVED for the busy owner's candidate")
    print(f"\nbusy owner: proven {detected:.1f}s after the orphan, while the owner committed every 100 ms")


def test_a_tv2_owner_that_keeps_committing_has_its_orphan_proven_and_aborted_while_it_runs(env: Env) -> None:
    """The same busy owner under transaction version 2: a Kafka 4.x Java producer (dev/jvm/owner/BusyOwner.java,
    `--owner-client java`) on the bed's TV2 cluster, whose epoch moves by one at every EndTxn. Its commit right
    after the orphan already leaves the orphan's epoch behind, and every later transaction runs at a later epoch, so
    an ABORT marker at the orphan's epoch cannot catch one of them: the orphan is HANGING owner-moved-on while the
    owner commits every 100 ms, `proposals abort --execute` verifies it SAFE and aborts it while the owner still
    commits (no restart), the job resolves the candidate, and every busy commit of the owner stays committed."""
    prefix = f"{env.settings.topics.prefix}-tv2-"
    busy_topic = f"{prefix}owner-busy"  # dev/workload.py's <topic-prefix>owner-busy
    proc, truth = start_workload(
        env.bootstrap,
        "--scenario",
        "hanging",
        "--topic-prefix",
        prefix,
        "--owner-client",
        "java",
        "--owner-busy-ms",
        "100",
        "--owner-busy-for-s",
        str(OWNER_BUSY_S),
    )
    made = time.monotonic()
    finished = False
    try:
        (h,) = [t for t in truth["transactions"] if t["kind"] == "hanging"]
        topic, partition, start = h["topic"], h["partition"], h["start_offset"]
        # The truth is printed once the owner committed the orphan's transaction (and moved its epoch on).
        owner = child_running(proc, "BusyOwner")
        assert owner is not None, "the workload runs no Java owner"
        produce_plain(env.bootstrap, topic, partition, b"after-the-orphan")

        (candidate,) = wait_for(
            lambda: opened_on(env, topic), OWNER_BUSY_S - 30, "the TV2 owner's orphan's OPENED candidate"
        )
        detected = time.monotonic() - made
        assert child_running(proc, "BusyOwner") == owner, "the Java owner stopped committing before the proof"
        assert candidate.reason is HangingReason.OWNER_MOVED_ON, candidate.explanation
        assert (candidate.partition, candidate.start_offset) == (partition, start)
        assert (candidate.spec.producer_id, candidate.spec.producer_epoch) == (
            h["producer_id"],
            h["producer_epoch"],
        )
        assert candidate.spec.transaction_result == "ABORT"
        # Judged against the owner's own record, written by a TV2 client past the orphan's epoch.
        c = candidate.evidence.coordinator
        assert c is not None and c.producer_id == h["producer_id"], candidate.explanation
        assert c.client_transaction_version == 2, c
        assert c.producer_epoch > h["producer_epoch"], c

        busy_before = end_offset(env.bootstrap, busy_topic)
        proposals = Proposals(env.bootstrap, env.settings.topics.prefix, cluster=CLUSTER)
        done = proposals.run("abort", candidate.candidate_id, "--execute", "--actor", "e2e")
        owner_after = child_running(proc, "BusyOwner")
        aborted = time.monotonic() - made
        assert done.returncode == 0, (done.stdout, done.stderr)
        assert json.loads(done.stdout)["outcome"] == "ABORTED", done.stdout
        assert owner_after == owner, (
            "the Java owner stopped before the abort returned: not aborted while it runs"
        )
        assert b"after-the-orphan" in read_committed_values(env.bootstrap, topic, partition, start)
        # The owner's next transactions commit as before the marker.
        wait_for(
            lambda: end_offset(env.bootstrap, busy_topic, read_committed=True) > busy_before,
            30,
            "a busy commit of the owner after the abort",
            poll_s=0.5,
        )

        wait_for(
            lambda: resolved_as(env, candidate.candidate_id),
            RESOLVE_TIMEOUT_S,
            "the job's RESOLVED for the TV2 owner's candidate",
        )
        resolved = time.monotonic() - made
        finished = True
    finally:
        if not finished:
            proc.terminate()  # the owner's stdin closes with it: it stops committing and exits
        rc = proc.wait(timeout=OWNER_BUSY_S + 120)
    assert proc.stderr is not None
    log = proc.stderr.read()
    assert rc == 0, log
    (said,) = re.findall(rf"the owner committed (\d+) transactions on {re.escape(busy_topic)} ", log)
    assert committed_records(env.bootstrap, busy_topic) == int(said), log
    print(
        f"\nTV2 busy owner: proven {detected:.1f}s after the orphan and ABORTED at {aborted:.1f}s while it committed "
        f"every 100 ms; RESOLVED at {resolved:.1f}s; {said} busy commits in {OWNER_BUSY_S}s, all read_committed"
    )
