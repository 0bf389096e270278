"""End to end: real broker → real `txnwatch collect` → Kafka → the Spark job (real connector) → candidates and
/metrics. The scenarios come from dev/workload.py; the expectations from its ground truth.

One job runs for the module (its first batch starts Python workers and reads the whole transaction log, which
takes a while on 2 cores), and one hanging transaction is made for it (a module fixture that waits for its
candidate): each test asks for what it needs and none relies on another having run. Detection latency, from the
moment the hanging transaction exists, is printed here and measured in benchmarks/, not asserted.
"""

from __future__ import annotations

import io
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.admin import NewTopic
from kafka.structs import TopicPartition
from prometheus_client.parser import text_string_to_metric_families
from pyspark.sql import SparkSession
from workloads import run_workload, start_workload

from common.settings import KafkaSettings, Settings, StreamSettings, overlay
from common.topics import TopicSettings
from detectors.models import AbortCandidate, HangingReason
from streaming import job

pytestmark = pytest.mark.e2e

# Generous: the test fails only when detection never happens (latency is benchmarks/' business).
DETECTION_TIMEOUT_S = 240.0


class Console(io.TextIOBase):
    """A thread-safe console the job prints to; tests read what a person would have seen."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.lines: list[str] = []

    def write(self, s: str) -> int:
        with self._lock:
            self.lines.extend(line for line in s.splitlines() if line.strip())
        return len(s)

    def text(self) -> str:
        with self._lock:
            return "\n".join(self.lines)


@dataclass
class Env:
    bootstrap: str
    prefix: str
    settings: Settings
    opts: job.StreamOptions
    collector: subprocess.Popen[str]
    console: Console


class ModuleJob:
    """The module's job on the module's checkpoint, started when a test first needs it. The restart test stops
    and starts it again; the dead-letter test stops it (its own job then has the two cores, and the query names,
    to itself). A test after either finds it running again: none relies on another test having run."""

    def __init__(self, spark: SparkSession, env: Env) -> None:
        self.spark, self.env = spark, env
        self.current: job.RunningJob | None = None

    def ensure(self) -> job.RunningJob:
        if self.current is None:
            started = job.start(self.spark, self.env.opts, out=self.env.console)
            self.current = started
            wait_for(lambda: first_batch_done(started, "txnwatch-reconcile"), 240, "the job's first batch")
        return self.current

    def stop(self) -> None:
        if self.current is not None:
            self.current.stop()
            self.current = None


@dataclass
class Hanging:
    truth: dict  # dev/workload.py's ground truth of the hanging transaction
    candidate: AbortCandidate  # the one OPENED for it


def read_topic(bootstrap: str, topic: str) -> list:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, consumer_timeout_ms=2000)
    parts = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or []]
    consumer.assign(parts)
    consumer.seek_to_beginning(*parts)
    records = list(consumer)
    consumer.close()
    return records


def scrape(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(body):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def wait_for(predicate, timeout_s: float, what: str, poll_s: float = 1.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")


def first_batch_done(running: job.RunningJob, name: str) -> bool:
    q = next(q for q in running.queries if q.name == name)
    return q.lastProgress is not None


@pytest.fixture(scope="module")
def env(bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    prefix = f"e2e{uuid.uuid4().hex[:8]}"
    settings = Settings(
        cluster="e2e",
        kafka=KafkaSettings(bootstrap_servers=bootstrap),
        topics=TopicSettings(prefix=prefix),
        stream=StreamSettings(
            checkpoint_location=str(tmp_path_factory.mktemp("checkpoints")),
            trigger="5 seconds",
            starting_offsets="earliest",
            expire_after_ms=20_000,
            metrics_port=0,
        ),
    )
    log = (tmp_path_factory.mktemp("collector") / "collector.log").open("w")
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
            "e2e",
            "--metrics-port",
            "0",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )
    opts = job.StreamOptions(settings=settings, kafka_options={"bootstrap.servers": bootstrap})
    job.ensure_topics(opts, settings.kafka.client_kwargs())
    try:
        yield Env(bootstrap, prefix, settings, opts, collector, Console())
    finally:
        collector.terminate()
        collector.wait(timeout=30)
        log.close()


@pytest.fixture(scope="module")
def module_job(spark: SparkSession, env: Env) -> Iterator[ModuleJob]:
    holder = ModuleJob(spark, env)
    try:
        yield holder
    finally:
        holder.stop()


@pytest.fixture
def running(module_job: ModuleJob) -> job.RunningJob:
    return module_job.ensure()


def candidates(env: Env) -> list[AbortCandidate]:
    return [
        AbortCandidate.model_validate_json(r.value)
        for r in read_topic(env.bootstrap, env.settings.topics.abort_candidates)
    ]


@pytest.fixture(scope="module")
def hanging(env: Env, module_job: ModuleJob) -> Hanging:
    """A real hanging transaction (dev/workload.py), once the module's job has OPENED its candidate."""
    module_job.ensure()
    truth = run_workload(env.bootstrap, "--scenario", "hanging", "--topic-prefix", f"{env.prefix}-hang-")
    made_at = time.monotonic()
    (h,) = [t for t in truth["transactions"] if t["kind"] == "hanging"]

    def opened() -> list[AbortCandidate]:
        return [c for c in candidates(env) if c.topic == h["topic"] and c.status.value == "OPENED"]

    found = wait_for(opened, DETECTION_TIMEOUT_S, "the hanging transaction's candidate")
    print(f"\ndetection latency: {time.monotonic() - made_at:.1f}s")
    (c,) = found
    return Hanging(h, c)


def test_hanging_yields_one_candidate_late_and_steady_none(
    env: Env, running: job.RunningJob, hanging: Hanging
) -> None:
    late_started = time.time()
    late_proc, late_truth = start_workload(
        env.bootstrap,
        "--scenario",
        "late",
        "--topic-prefix",
        f"{env.prefix}-late-",
        "--hold-ms",
        "75000",
        "--backdate-ms",
        "120000",
    )
    late = late_truth["transactions"][0]
    steady = run_workload(
        env.bootstrap, "--scenario", "steady", "--topic-prefix", f"{env.prefix}-steady-", "--seconds", "3"
    )
    h, c = hanging.truth, hanging.candidate
    assert [x for x in candidates(env) if x.topic == h["topic"]] == [c]  # one candidate, opened once
    assert c.reason is HangingReason.COORDINATOR_COMPLETED
    assert (c.spec.topic, c.spec.partition, c.spec.producer_id, c.spec.producer_epoch) == (
        h["topic"],
        h["partition"],
        h["producer_id"],
        h["producer_epoch"],
    )
    assert c.start_offset == h["start_offset"]
    assert c.spec.coordinator_epoch == 0  # the leader reports -1 before any marker: never send -1
    assert f"--start-offset {h['start_offset']}" in c.kafka_cli
    # The console names the verified path for the new candidate, never Kafka's unverified abort line.
    console = env.console.text()
    assert "HANGING" in console and f"txnwatch proposals show {c.candidate_id}" in console
    assert f"txnwatch proposals abort {c.candidate_id}" in console and "kafka-transactions.sh" not in console

    # The long transaction: MaxActiveTransactionDuration follows it as observed (from the collector's first
    # sighting), never from its records stamped 120 s in the past; no candidate names it. (Its coordinator aborts
    # it at its 60 s timeout, so it is never LATE by what was observed, whatever its stamps say.)
    def late_duration() -> float:
        m = scrape(running.metrics_port)
        durations = {
            (lb["topic"], lb["partition"]): v
            for lb, v in m.get("txnwatch_max_active_transaction_duration_seconds", [])
        }
        return durations.get((late["topic"], str(late["partition"])), 0.0)

    wait_for(lambda: late_duration() > 20, 60, "the long transaction in the KIP-664 metrics")
    observed = late_duration()
    assert observed <= time.time() - late_started + 1, (observed, "aged from its records' stamps")
    m = scrape(running.metrics_port)
    lso = {(lb["topic"], lb["partition"]): v for lb, v in m["txnwatch_last_stable_offset_lag"]}
    assert lso[(h["topic"], str(h["partition"]))] > 0
    assert sum(v for lb, v in m["txnwatch_abort_candidates"]) >= 1
    # Checked once the late transaction has ended: neither it nor the steady ones were ever named.
    late_proc.wait(timeout=120)
    steady_topics = {t["topic"] for t in steady["transactions"]}
    named = {x.topic for x in candidates(env)}
    assert late["topic"] not in named
    assert not (steady_topics & named)


def test_restart_from_checkpoint_opens_nothing_twice(
    env: Env, module_job: ModuleJob, hanging: Hanging
) -> None:
    h = hanging.truth
    before = [c for c in candidates(env) if c.topic == h["topic"]]
    assert before == [hanging.candidate]
    module_job.stop()
    again = module_job.ensure()  # the same checkpoint
    reconcile = next(q for q in again.queries if q.name == "txnwatch-reconcile")
    start_batch = reconcile.lastProgress["batchId"] if reconcile.lastProgress else -1
    wait_for(
        lambda: reconcile.lastProgress and reconcile.lastProgress["batchId"] >= start_batch + 3,
        180,
        "three batches after the restart",
    )
    after = [c for c in candidates(env) if c.topic == h["topic"]]
    assert [c.status.value for c in after] == ["OPENED"]
    assert after[0].candidate_id == before[0].candidate_id
    # State survived: the verdict is HANGING again without a new OPENED.
    m = scrape(again.metrics_port)
    assert sum(v for _, v in m["txnwatch_abort_candidates"]) >= 1


def loaded_from_dfs(progress: dict) -> int:
    """State stores this batch loaded from the checkpoint (opened anew) rather than found open."""
    return sum(
        int((op.get("customMetrics") or {}).get("rocksdbNumLoadedFromDfs") or 0)
        for op in progress.get("stateOperators", [])
    )


def probe(port: int, path: str) -> int:
    try:
        return int(urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10).status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_planned_restart_reopens_the_state_stores_and_shows_nothing_of_it(
    env: Env, module_job: ModuleJob, hanging: Hanging
) -> None:
    """`--restart-queries-every-s`: the queries stop between two batches and start again from their checkpoints,
    and their state stores are opened anew from it (RocksDB then writes a fresh MANIFEST, the file every snapshot
    carries, which otherwise grows with each batch). Nobody watching sees it: every scrape during the restart
    still counts the hanging transaction's candidate, /readyz stays 200, and the candidate is not opened again."""
    running = module_job.ensure()
    h = hanging.truth

    def reconcile() -> Any:
        return next(q for q in running.queries if q.name == "txnwatch-reconcile")

    before = reconcile()
    wait_for(lambda: len(before.recentProgress) >= 2, 120, "a second batch of this run")
    assert (
        loaded_from_dfs(before.recentProgress[-1]) == 0
    )  # an open store is not loaded again batch after batch
    seen: list[tuple[float, int]] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            m = scrape(running.metrics_port)
            seen.append(
                (
                    sum(v for _, v in m.get("txnwatch_abort_candidates", [])),
                    probe(running.metrics_port, "/readyz"),
                )
            )
            time.sleep(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        wait_for(lambda: len(seen) >= 3, 30, "scrapes before the restart", 0.2)
        pinned = set(running.callback_connections)  # py4j's connection of each query's JVM thread
        took = running.restart_queries()
        after = reconcile()
        # Its stores opened anew, from the checkpoint, by the new run's first batch. Not necessarily its first
        # progress: a restarted query that finds no new input runs no batch and reports an idle progress after
        # 10 s, with no state loaded (CI saw it under load).
        wait_for(
            lambda: (
                len(after.recentProgress) >= 3 and any(loaded_from_dfs(p) > 0 for p in after.recentProgress)
            ),
            120,
            "three batches after the restart, one of them loading the state stores from the checkpoint",
        )
    finally:
        stop.set()
        watcher.join(timeout=30)
    print(f"\nplanned restart: queries stopped for {took:.1f}s; {len(seen)} scrapes meanwhile")
    assert (after.id, after.runId) != (
        before.id,
        before.runId,
    ) and after.id == before.id  # same query, new run
    # The stopped queries' py4j connections were closed (each by its own thread, which then ended): a restart
    # leaves no thread behind, here or in the JVM.
    assert 1 <= len(pinned) <= len(running.queries), pinned
    wait_for(lambda: all(c.socket is None for c in pinned), 30, "the old queries' py4j connections to close")
    assert all(candidates_seen >= 1 and ready == 200 for candidates_seen, ready in seen), seen
    mine = [c for c in candidates(env) if c.topic == h["topic"]]
    assert [c.status.value for c in mine] == ["OPENED"] and mine[
        0
    ].candidate_id == hanging.candidate.candidate_id


def test_corrupt_records_go_to_dead_letter_and_the_job_keeps_running(
    spark: SparkSession, env: Env, module_job: ModuleJob, tmp_path: Path
) -> None:
    module_job.stop()  # if an earlier test started it: this test's own job runs alone
    # __transaction_state cannot be written by clients: copy a real record of it into a normal topic and put a
    # corrupt one beside it, then point the job's transaction-log source at that copy. A short steady workload
    # makes sure the log has records whatever ran before.
    run_workload(
        env.bootstrap, "--scenario", "steady", "--topic-prefix", f"{env.prefix}-dl-", "--seconds", "1"
    )
    log_copy = f"{env.prefix}-txnlog-copy"
    admin = KafkaAdminClient(bootstrap_servers=env.bootstrap)
    admin.create_topics([NewTopic(log_copy, 1, 1)])
    admin.close()
    real = [r for r in read_topic(env.bootstrap, "__transaction_state") if r.value is not None][:1]
    assert real, "the transaction log has records after the steady workload"
    producer = KafkaProducer(bootstrap_servers=env.bootstrap)
    producer.send(log_copy, key=real[0].key, value=real[0].value)
    producer.send(log_copy, key=b"\x00\x00\x00\x03abc", value=b"\x00\x01\xff\xff")  # truncated v1 value
    producer.send(
        env.settings.topics.producer_state,
        key=b"x-0",
        value=b"{this is not json",
        headers=[("txnwatch.type", b"partition-snapshot")],
    )
    producer.flush()
    producer.close()
    stream = StreamSettings(
        checkpoint_location=str(tmp_path / "ck"),
        trigger="2 seconds",
        starting_offsets="earliest",
        transaction_log_topic=log_copy,
        metrics_port=0,
    )
    settings = overlay(env.settings, {"stream": stream})
    opts = job.StreamOptions(settings=settings, kafka_options={"bootstrap.servers": env.bootstrap})
    dead = job.start(spark, opts, out=None, queries=("dead-letter", "reconcile"))
    try:

        def dead_letters() -> list:
            return read_topic(env.bootstrap, env.settings.topics.dead_letter)

        records = wait_for(lambda: len(dead_letters()) >= 2 and dead_letters(), 240, "two dead letters")
        by_source = {dict(r.headers)["txnwatch.source"].decode(): r for r in records}
        assert set(by_source) >= {"transaction-log", "producer-state"}
        bad_log = by_source["transaction-log"]
        assert bad_log.value == b"\x00\x01\xff\xff"  # raw bytes kept, nothing lost
        assert dict(bad_log.headers)["txnwatch.source-topic"].decode() == log_copy
        assert b"undecodable" in dict(bad_log.headers)["txnwatch.error"]
        assert by_source["producer-state"].value == b"{this is not json"
        # The job keeps running past them: two more reconcile batches with input complete (the collector
        # publishes every 5 s).
        reconcile = next(q for q in dead.queries if q.name == "txnwatch-reconcile")
        seen = reconcile.lastProgress["batchId"] if reconcile.lastProgress else -1

        def two_more_batches() -> bool:
            assert dead.failed() is None, dead.failed()
            done = {p["batchId"] for p in reconcile.recentProgress if p["numInputRows"] > 0}
            return len({b for b in done if b > seen}) >= 2

        wait_for(two_more_batches, 120, "two more reconcile batches after the dead letters")
        assert all(q.isActive for q in dead.queries), dead.failed()
        m = scrape(dead.metrics_port)
        counts = {lb["source"]: v for lb, v in m["txnwatch_dead_letter_records_total"]}
        assert counts["transaction-log"] >= 1 and counts["producer-state"] >= 1
    finally:
        dead.stop()
