"""What the detection benchmarks share: a one-node test bed, `txnwatch collect` as a subprocess, the streaming job
(all three queries, in this process, on `local[2]` with the job's own conf), a watcher of the candidates topic,
the orphan makers of dev/workload.py called in-process, and small statistics helpers.

Nothing here is a test: bench_latency and bench_peers drive it, and tests/e2e/test_bench_smoke.py runs a tiny
part of it (the orphan makers and the figures) against the session's broker.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kafka import KafkaAdminClient, KafkaConsumer
from kafka.structs import TopicPartition

from dev import workload
from dev.kafka import JARS_DIR, ROOT, Cluster, TestBedConfig, start_cluster, stop_cluster

Json = dict[str, Any]

# The orphan kinds the test bed can make (dev/workload.py scenario, orphans per run).
ORPHAN_KINDS: dict[str, tuple[str, int]] = {
    "after-commit": ("hanging", 1),
    "after-abort": ("hanging-after-abort", 1),
    "consumer-offsets": ("hanging-offsets", 1),
    "multi-partition": ("hanging-multi", 3),
}


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def job_cpu_s(exclude: tuple[str, ...] = ("kafka.Kafka", "txnwatch_cli")) -> float:
    """CPU seconds (user + system) used so far by this process and its descendants (the job's JVM and Python
    workers), leaving out the subtrees whose command line names one of `exclude` (the test bed's broker, the
    collector). Linux /proc; the clock tick from sysconf."""
    tick = os.sysconf("SC_CLK_TCK")
    children: dict[int, list[int]] = {}
    stats: dict[int, tuple[str, float]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # gone meanwhile
        fields = stat[stat.rindex(")") + 2 :].split()
        # utime, stime, and those of its children that ended (a Python worker Spark let go).
        ppid, used = int(fields[1]), sum(int(x) for x in fields[11:15])
        children.setdefault(ppid, []).append(int(entry.name))
        stats[int(entry.name)] = (cmdline, used / tick)
    total, todo = 0.0, [os.getpid()]
    while todo:
        pid = todo.pop()
        cmdline, cpu = stats.get(pid, ("", 0.0))
        if pid != os.getpid() and any(x in cmdline for x in exclude):
            continue
        total += cpu
        todo.extend(children.get(pid, ()))
    return total


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system, its ended children's included) used so far by one process (Linux /proc)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def machine() -> Json:
    import kafka
    import pyspark

    java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr.splitlines()
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "java": java[0] if java else "?",
        "pyspark": pyspark.__version__,
        "kafka_python": kafka.__version__,
        "kafka_broker": next((p.name for p in (JARS_DIR / "kafka").glob("kafka_2.13-*.jar")), "?"),
    }


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def summary(values: list[float]) -> Json:
    if not values:
        return {"n": 0}
    return {
        "n": len(values),
        "p50": round(percentile(values, 50), 1),
        "p95": round(percentile(values, 95), 1),
        "max": round(max(values), 1),
        "min": round(min(values), 1),
    }


# How the orphan's owner ends (dev/workload.py): it restarts and closes at once, or it lives on first (commits a
# one-record transaction elsewhere every few hundred ms, as a Kafka Streams thread or an application after a late
# write does), then restarts and closes.
OWNERS = ("restart", "busy")


def make_orphans(bootstrap: str, kind: str, prefix: str) -> list[Json]:
    """Run one dev/workload.py orphan scenario in-process (its owner restarts at once); returns the orphans'
    ground truth (dicts)."""
    scenario, _ = ORPHAN_KINDS[kind]
    args = workload.parser().parse_args(
        ["--bootstrap-server", bootstrap, "--scenario", scenario, "--topic-prefix", prefix, "--json"]
    )
    truth = workload.run(args, lambda _t: None)
    return [t.__dict__ | {"orphan_kind": kind, "owner": "restart"} for t in truth if t.kind == "hanging"]


class BusyOwners:
    """Orphan scenarios whose owner lives on, each `python -m dev.workload --owner-busy-ms` in a process of its own
    (the owners' commits do not share the driver's interpreter): `make` returns once the orphan is made (the
    workload prints its truth first), while the owner goes on committing for `busy_for_s`; `close` waits for
    them to end (restarted and closed) and stops what is left."""

    def __init__(self, bootstrap: str, busy_ms: int, busy_for_s: float, log_dir: Path) -> None:
        self.bootstrap, self.busy_ms, self.busy_for_s, self.log_dir = bootstrap, busy_ms, busy_for_s, log_dir
        self.procs: list[subprocess.Popen[str]] = []

    def make(self, kind: str, prefix: str) -> list[Json]:
        scenario, _ = ORPHAN_KINDS[kind]
        log_file = (self.log_dir / f"busy-owner-{len(self.procs)}.log").open("w")
        command = [sys.executable, "-m", "dev.workload", "--bootstrap-server", self.bootstrap, "--json"]
        command += ["--scenario", scenario, "--topic-prefix", prefix, "--owner-busy-ms", str(self.busy_ms)]
        command += ["--owner-busy-for-s", str(self.busy_for_s)]
        proc = subprocess.Popen(
            command,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=log_file,
            text=True,
        )
        log_file.close()
        self.procs.append(proc)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            proc.wait(30)
            raise RuntimeError(
                f"dev.workload {scenario} with a busy owner printed no truth (exit {proc.returncode})"
            )
        truth = json.loads(line)["transactions"]
        return [t | {"orphan_kind": kind, "owner": "busy"} for t in truth if t["kind"] == "hanging"]

    def running(self) -> int:
        return sum(p.poll() is None for p in self.procs)

    def close(self, timeout_s: float) -> list[int | None]:
        """Wait for every owner to end (at most `timeout_s` in all), stop the rest; their exit codes."""
        deadline = time.monotonic() + timeout_s
        for p in self.procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)
        return [p.returncode for p in self.procs]


def scenario_args(bootstrap: str, scenario: str, prefix: str, *extra: str) -> argparse.Namespace:
    return workload.parser().parse_args(
        ["--bootstrap-server", bootstrap, "--scenario", scenario, "--topic-prefix", prefix, *extra]
    )


@dataclass
class Seen:
    """One record of the candidates topic as the watcher read it."""

    candidate: Any  # detectors.models.AbortCandidate
    record_ts_ms: int  # CreateTime: when the job's driver wrote it
    seen_ms: int


@dataclass
class CandidateWatcher:
    """Follows `<prefix>.abort-candidates` from the beginning in a thread."""

    bootstrap: str
    topic: str
    seen: list[Seen] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True, name="candidate-watcher")
        self._thread.start()

    def _run(self) -> None:
        from detectors.models import AbortCandidate

        consumer = KafkaConsumer(
            bootstrap_servers=self.bootstrap, enable_auto_commit=False, client_id="bench-watcher"
        )
        try:
            parts = [TopicPartition(self.topic, p) for p in consumer.partitions_for_topic(self.topic) or []]
            consumer.assign(parts)
            consumer.seek_to_beginning(*parts)
            while not self._stop.is_set():
                for records in consumer.poll(timeout_ms=500).values():
                    for r in records:
                        if r.value is None:
                            continue
                        self.seen.append(
                            Seen(
                                AbortCandidate.model_validate_json(r.value),
                                r.timestamp,
                                int(time.time() * 1000),
                            )
                        )
        finally:
            consumer.close()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def opened(self) -> dict[tuple[str, int, int, int], Seen]:
        """The first OPENED record per (topic, partition, producer id, start offset)."""
        out: dict[tuple[str, int, int, int], Seen] = {}
        for s in list(self.seen):
            c = s.candidate
            if c.status.value != "OPENED":
                continue
            out.setdefault((c.topic, c.partition, c.spec.producer_id, c.start_offset), s)
        return out


def orphan_key(t: Json) -> tuple[str, int, int, int]:
    return (t["topic"], t["partition"], t["producer_id"], t["start_offset"])


@dataclass
class Pipeline:
    """A test bed, the collector and the job. `up()` as a context manager."""

    cluster: Cluster
    prefix: str
    collector: subprocess.Popen[str]
    running: Any  # streaming.job.RunningJob
    spark: Any
    watcher: CandidateWatcher
    settings: Any

    @property
    def bootstrap(self) -> str:
        return self.cluster.bootstrap_servers

    def reconcile_durations_s(self) -> list[float]:
        q = next(q for q in self.running.queries if q.name == "txnwatch-reconcile")
        return [p["batchDuration"] / 1000 for p in q.recentProgress if p.get("numInputRows", 0) > 0]

    def first_batches_done(self, n: int) -> bool:
        q = next(q for q in self.running.queries if q.name == "txnwatch-reconcile")
        return len(q.recentProgress) >= n


# Kafka's default for `transaction.state.log.num.partitions`: the job reads (and the collector positions) as
# many coordinator partitions as a real cluster has, not the test bed's 3.
KAFKA_TRANSACTION_LOG_PARTITIONS = 50
# Kafka's default for `offsets.topic.num.partitions`: the orphaned offset commits spread over as many
# `__consumer_offsets` partitions as on a real cluster, not piled on the test bed's 3.
KAFKA_OFFSETS_TOPIC_PARTITIONS = 50


def detection_bed(**overrides: Any) -> TestBedConfig:
    """The detection benchmarks' one-node test bed: partition verification off (the late-produce orphan needs
    it), a 512 MB heap (two shared cores), and Kafka's default 50 partitions of `__transaction_state` and of
    `__consumer_offsets`."""
    extra = {
        "transaction.state.log.num.partitions": str(KAFKA_TRANSACTION_LOG_PARTITIONS),
        "offsets.topic.num.partitions": str(KAFKA_OFFSETS_TOPIC_PARTITIONS),
    }
    fields: Json = {"nodes": 1, "partition_verification": False, "heap": "512m", "extra": extra}
    return TestBedConfig(**(fields | overrides))


def shipped_interval_s() -> float:
    """The collector's default sweep interval (`txnwatch collect`), in seconds."""
    from common.settings import CollectorSettings

    return CollectorSettings().interval_s


def shipped_trigger() -> str:
    """The job's default reconcile trigger (`txnwatch stream`)."""
    from common.settings import StreamSettings

    return StreamSettings().trigger


@contextmanager
def pipeline(
    workdir: Path,
    *,
    interval_s: float | None = None,
    trigger: str | None = None,
    bed: TestBedConfig | None = None,
    stream_overrides: Json | None = None,
    detection_overrides: Json | None = None,
    collector_args: tuple[str, ...] = (),
    spark_conf: dict[str, str] | None = None,
) -> Iterator[Pipeline]:
    """Start bed → collector → job → watcher; stop all of it (by pid / handle) on exit. Without `interval_s`,
    `trigger` or `bed`: the collector's and the job's shipped defaults, on `detection_bed()`. `spark_conf`
    overrides the job's Spark configuration (a variant measured against the shipped one)."""
    interval_s = shipped_interval_s() if interval_s is None else interval_s
    trigger = shipped_trigger() if trigger is None else trigger
    from common.settings import KafkaSettings, Settings, StreamSettings
    from common.topics import TopicSettings
    from detectors.models import DetectionLimits

    state_dir = workdir / "testbed"
    bed = bed or detection_bed()
    log(f"starting a one-node test bed in {state_dir} (load {loadavg()})")
    cluster = start_cluster(bed, state_dir)
    collector = None
    spark = None
    running = None
    watcher = None
    collector_log = (workdir / "collector.log").open("w")
    try:
        prefix = "bench"
        settings = Settings(
            cluster="bench",
            kafka=KafkaSettings(bootstrap_servers=cluster.bootstrap_servers),
            topics=TopicSettings(prefix=prefix),
            detection=DetectionLimits(**(detection_overrides or {})),
            stream=StreamSettings(
                checkpoint_location=str(workdir / "checkpoint"),
                master="local[2]",
                trigger=trigger,
                starting_offsets="earliest",
                metrics_port=0,
                **(stream_overrides or {}),
            ),
        )
        from streaming import job
        from streaming.session import build_session

        opts = job.StreamOptions(
            settings=settings, kafka_options={"bootstrap.servers": cluster.bootstrap_servers}
        )
        job.ensure_topics(opts, settings.kafka.client_kwargs())
        collector = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "txnwatch_cli",
                "collect",
                "--bootstrap-server",
                cluster.bootstrap_servers,
                "--interval-ms",
                str(round(interval_s * 1000)),
                "--topic-prefix",
                prefix,
                "--cluster",
                "bench",
                "--metrics-port",
                "0",
                *collector_args,
            ],
            stdout=collector_log,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=ROOT,
        )
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        # As `txnwatch stream` builds it (streaming/cli.py): 4 shuffle partitions and the job's conf.
        spark = build_session(
            master="local[2]",
            app_name="txnwatch-bench",
            extra_conf={
                "spark.sql.shuffle.partitions": "4",
                **job.spark_conf(),
                "spark.ui.enabled": "false",
                "spark.ui.showConsoleProgress": "false",
                **(spark_conf or {}),
            },
        )
        spark.sparkContext.setLogLevel("ERROR")
        running = job.start(spark, opts, out=(workdir / "job-console.log").open("w"))
        watcher = CandidateWatcher(cluster.bootstrap_servers, settings.topics.abort_candidates)
        watcher.start()
        yield Pipeline(cluster, prefix, collector, running, spark, watcher, settings)
    finally:
        if watcher is not None:
            watcher.stop()
        if running is not None:
            running.stop()
        if spark is not None:
            spark.stop()
        if collector is not None:
            collector.terminate()
            try:
                collector.wait(timeout=30)
            except subprocess.TimeoutExpired:
                collector.kill()
        collector_log.close()
        stop_cluster(state_dir)


def transaction_log_partitions(bootstrap: str) -> int | None:
    """The partitions of the bed's `__transaction_state` as the broker reports them (None before the first
    transactional producer made Kafka create it)."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="bench-describe")
    try:
        (topic,) = admin.describe_topics(["__transaction_state"])
    finally:
        admin.close()
    return len(topic.get("partitions") or []) or None


def wait_until(predicate: Callable[[], Any], timeout_s: float, what: str, poll_s: float = 1.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll_s)
    raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")


class Steady(threading.Thread):
    """dev/workload.py's steady scenario in a thread, in slices, until stopped: committed and aborted
    transactions, never an orphan."""

    def __init__(self, bootstrap: str, prefix: str, rate: float = 5.0) -> None:
        super().__init__(daemon=True, name="steady")
        self.bootstrap, self.prefix, self.rate = bootstrap, prefix, rate
        self.stopping = threading.Event()
        self.transactions = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        admin = KafkaAdminClient(bootstrap_servers=self.bootstrap, client_id="bench-steady")
        try:
            seed = 0
            while not self.stopping.is_set():
                seed += 1
                args = scenario_args(
                    self.bootstrap,
                    "steady",
                    self.prefix,
                    "--seconds",
                    "20",
                    "--rate",
                    str(self.rate),
                    "--seed",
                    str(seed),
                )
                truth = workload.steady(self.bootstrap, admin, args)
                self.transactions += len({(t.transactional_id, t.start_offset) for t in truth})
        except BaseException as exc:  # reported by the benchmark
            self.error = exc
        finally:
            admin.close()

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=60)
