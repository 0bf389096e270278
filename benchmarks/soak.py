"""`make soak`: five minutes of steady transactional load on a loopback test bed, with a few real orphans made at
known times, while the collector and the streaming job run; does everything keep up, is every orphan found, is
nothing else named, and does memory stay flat?

    python -m benchmarks.soak [--seconds 300] [--ids 200] [--rate 20] [--orphans 3] [--sample-s 10]

It starts its own one-node test bed (partition verification off, for the orphans), `txnwatch collect` as a
subprocess, the streaming job in this process (as `txnwatch stream` runs it: local[2], RocksDB, its three queries),
and the load as a subprocess (`python -m benchmarks.soak load`): `--ids` transactional producers taking turns,
`--rate` transactions per second in total (so each id runs one transaction every ids/rate seconds), one to three
records each, 10 % aborted. The orphans are dev/workload.py's `hanging` scenario (a batch the coordinator never
added, a commit, then its producer restarts), spread over the load; each is aborted `--abort-after-s` after it was
found with `txnwatch proposals abort --execute`, as on-call would. Every `--sample-s` seconds it records the RSS of
the collector, the driver JVM, the driver's Python process and the Python workers (their PSS summed: forked workers
share pages), the driver JVM's heap, the stateful operators' rows and memory, the checkpoint's size on disk, the
job's coordinator view lag, the records of each input its reconcile query has not read yet, the collector's sweep
time, RocksDB's one cache read from the cache itself (pinned: write buffers; evictable: blocks), where the soak
process's own memory is (mapped files or anonymous; glibc malloc's heap; Arrow's pool), and the load average; every
`--gc-every` samples the driver JVM's heap after a full GC (its live set). At the end it stops everything it
started, writes the samples and verdicts to JSON and plots them (docs/soak.png). Exit code 0 when every orphan was
found and nothing else was named.

The job runs in this process, like the e2e tests, so the Spark query progress (state rows) and the JVM (heap) can
be read directly; its Python side is then this process (`driver_python_rss_mb`), a little more than the job alone.
"""

from __future__ import annotations

import argparse
import calendar
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
import urllib.request
import uuid
import zipfile
from pathlib import Path
from typing import Any

from dev.memory import native_python

ROOT = Path(__file__).resolve().parent.parent

# ------------------------------------------------------------------------------------------------ the load


def run_load(args: argparse.Namespace) -> int:
    """The load process: `--ids` producers, `--rate` transactions/s in total, paced to a schedule (a slow
    transaction is caught up, not dropped), for `--seconds`; prints a JSON summary."""
    from kafka import KafkaProducer

    topics = args.topics.split(",")
    threads = max(1, min(args.threads, args.ids))
    totals = {"committed": 0, "aborted": 0, "failed": 0, "max_behind_s": 0.0}
    lock = threading.Lock()
    initialised = threading.Semaphore(0)
    go = threading.Event()
    clock: dict[str, float] = {}

    def worker(k: int) -> None:
        rng = random.Random(k)
        ids = [f"{args.prefix}id-{i:04d}" for i in range(k, args.ids, threads)]
        producers = []
        for tid in ids:
            p = KafkaProducer(
                bootstrap_servers=args.bootstrap_server,
                transactional_id=tid,
                client_id=f"soak-{tid}",
                linger_ms=0,
            )
            p.init_transactions()
            producers.append(p)
        initialised.release()
        go.wait()
        stop_at = clock["stop_at"]
        period = threads / args.rate
        next_at = clock["start"] + k * period / threads
        n = 0
        while True:
            now = time.monotonic()
            if next_at >= stop_at:
                break
            if next_at > now:
                time.sleep(next_at - now)
            behind = time.monotonic() - next_at
            p = producers[n % len(producers)]
            try:
                p.begin_transaction()
                futures = [
                    p.send(rng.choice(topics), value=b"soak", partition=rng.randrange(args.partitions))
                    for _ in range(rng.randint(1, 3))
                ]
                for f in futures:
                    f.get(timeout=30)
                commit = rng.random() >= 0.1
                (p.commit_transaction if commit else p.abort_transaction)()
                outcome = "committed" if commit else "aborted"
            except Exception as exc:  # counted and reported; the load goes on with the next id
                print(f"[load] {exc!r}", file=sys.stderr, flush=True)
                outcome = "failed"
                with contextlib.suppress(Exception):
                    p.abort_transaction()
            with lock:
                totals[outcome] += 1
                totals["max_behind_s"] = max(totals["max_behind_s"], behind)
            n += 1
            next_at += period
        for p in producers:
            p.close(timeout=10)

    started = time.monotonic()
    pool = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(threads)]
    for t in pool:
        t.start()
    # Every producer initialised first (InitProducerId for 200 ids takes a while), then the clock starts.
    for _ in pool:
        if not initialised.acquire(timeout=300):
            print(json.dumps({"event": "failed", "error": "producers not initialised in 300 s"}), flush=True)
            return 1
    clock["start"] = time.monotonic()
    clock["stop_at"] = clock["start"] + args.seconds
    go.set()
    print(json.dumps({"event": "started", "init_s": round(clock["start"] - started, 1)}), flush=True)
    for t in pool:
        t.join(timeout=args.seconds + 120)
    totals["seconds"] = args.seconds
    totals["rate"] = round((totals["committed"] + totals["aborted"]) / args.seconds, 2)
    print(json.dumps({"event": "done", **totals}), flush=True)
    return 0


# ----------------------------------------------------------------------------------------- measurements


def _children() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        out.setdefault(ppid, []).append(int(d.name))
    return out


def _descendants(pid: int, children: dict[int, list[int]]) -> list[int]:
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _cmdline(pid: int) -> str:
    try:
        return (
            (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return ""


def _kb(pid: int, field: str, file: str) -> int:
    try:
        for line in (Path("/proc") / str(pid) / file).read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def rss_mb(pid: int) -> float:
    return _kb(pid, "VmRSS", "status") / 1024


def pss_mb(pid: int) -> float:
    return _kb(pid, "Pss", "smaps_rollup") / 1024


def memory(collector_pid: int, load_pid: int | None, broker_pid: int) -> dict[str, float]:
    """RSS (MB) of the collector, the driver's JVM and Python, the broker and the load; PSS sum of the workers."""
    children = _children()
    mine = _descendants(os.getpid(), children)
    jvms = [p for p in mine if "java" in _cmdline(p).split(" ")[0] and "SparkSubmit" in _cmdline(p)]
    # a JVM forking a helper (Hadoop's shell commands) briefly shows a second process with its command line
    jvms = [p for p in jvms if not any(p in children.get(j, []) for j in jvms)]
    workers = [p for p in mine if "pyspark.daemon" in _cmdline(p) or "pyspark.worker" in _cmdline(p)]
    return {
        "collector_rss_mb": rss_mb(collector_pid),
        "driver_jvm_rss_mb": sum(rss_mb(p) for p in jvms),
        "driver_python_rss_mb": rss_mb(os.getpid()),
        # the RSS split: pages of mapped files (shared libraries' code, read in once as new code paths first run,
        # so bounded by the libraries' size) and anonymous memory (heaps, arenas, stacks: where a leak would be)
        "driver_python_rss_file_mb": _kb(os.getpid(), "RssFile", "status") / 1024,
        "driver_python_rss_anon_mb": _kb(os.getpid(), "RssAnon", "status") / 1024,
        "driver_python_threads": threads(os.getpid()),
        "python_workers_pss_mb": sum(pss_mb(p) for p in workers),
        "python_workers": len(workers),
        "broker_rss_mb": rss_mb(broker_pid),
        "load_rss_mb": rss_mb(load_pid) if load_pid else 0.0,
    }


def python_allocations(
    previous: tracemalloc.Snapshot | None, compare: bool
) -> tuple[tracemalloc.Snapshot | None, dict[str, Any]]:
    """What this process's Python holds (`--tracemalloc`): the memory its allocator traces, every sample, and when
    `compare`, the ten source lines whose allocations grew most since the last comparison. A step in the RSS that
    the traced memory does not take is outside Python's objects (a C library, malloc's arenas)."""
    out: dict[str, Any] = {"python_traced_mb": tracemalloc.get_traced_memory()[0] / 1e6}
    if not compare:
        return previous, out
    snap = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
    if previous is not None:
        out["python_grew_most"] = [
            f"{stat.size_diff / 1e3:+.0f} KB in {stat.count_diff:+d} blocks at {stat.traceback}"
            for stat in snap.compare_to(previous, "lineno")[:10]
        ]
    return snap, out


def threads(pid: int) -> int:
    """The process's threads (a thread's first allocations open a malloc arena: a step in RSS)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    return next((int(line.split()[1]) for line in status.splitlines() if line.startswith("Threads:")), 0)


def scrape(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    from prometheus_client.parser import text_string_to_metric_families

    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(body):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def _total(m: dict[str, list[tuple[dict[str, str], float]]], name: str) -> float | None:
    values = [v for _, v in m.get(name, [])]
    return sum(values) if values else None


def dir_mb(path: Path) -> float:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += (Path(root) / f).stat().st_size
    return total / 1e6


def checkpoint_parts(path: Path) -> dict[str, float]:
    """The checkpoint on disk by kind (MB): the queries' offset and commit logs, the state stores' changelogs
    (one per batch), their snapshots (RocksDB's SST files and each version's zip of metadata), and the rest; and
    how many files of each kind the state stores hold (which of them a creep comes from)."""
    parts = {"checkpoint_logs_mb": 0.0, "checkpoint_changelog_mb": 0.0, "checkpoint_snapshot_mb": 0.0}
    counts = {"changelog": 0, "sst": 0, "zip": 0}
    other = 0.0
    for root, _, files in os.walk(path):
        in_logs = any(part in ("offsets", "commits") for part in Path(root).parts)
        for f in files:
            try:
                size = (Path(root) / f).stat().st_size / 1e6
            except OSError:
                continue
            if in_logs:
                parts["checkpoint_logs_mb"] += size
            elif f.endswith(".changelog"):
                parts["checkpoint_changelog_mb"] += size
                counts["changelog"] += 1
            elif f.endswith((".sst", ".zip")):
                parts["checkpoint_snapshot_mb"] += size
                counts[f.rsplit(".", 1)[1]] += 1
            else:
                other += size
    parts["checkpoint_other_mb"] = other
    return {**parts, **{f"checkpoint_{kind}_files": float(n) for kind, n in counts.items()}}


def newest_manifests_kb(path: Path) -> dict[str, float]:
    """The RocksDB MANIFEST in each state store's newest snapshot zip (KB): the largest, and their sum. RocksDB
    appends to it with every flush and compaction and rewrites it only when a store opens, so it is the part of a
    snapshot that grows for as long as a query runs (the job's planned restarts bound it)."""
    sizes = []
    for store in path.glob("*/state/*/*"):
        zips = [z for z in store.glob("*.zip") if z.stem.split("_")[0].isdigit()]
        if not zips:
            continue
        newest = max(zips, key=lambda z: int(z.stem.split("_")[0]))
        try:
            with zipfile.ZipFile(newest) as f:
                sizes.append(sum(i.file_size for i in f.infolist() if i.filename.startswith("MANIFEST")))
        except (OSError, zipfile.BadZipFile):  # deleted by retention, or still being written
            continue
    return {
        "snapshot_manifest_max_kb": max(sizes, default=0) / 1e3,
        "snapshot_manifest_sum_kb": sum(sizes) / 1e3,
    }


def state_of(running: Any) -> dict[str, Any]:
    """Rows and memory of every stateful operator, from each query's last progress."""
    rows, mem, sst = 0, 0, 0
    by_query: dict[str, int] = {}  # rows per query: which one a step in the total comes from
    for q in running.queries:
        p = q.lastProgress
        if not p:
            continue
        for op in p.get("stateOperators", []):
            op_rows, op_mem = int(op.get("numRowsTotal") or 0), int(op.get("memoryUsedBytes") or 0)
            rows += op_rows
            # With boundedMemoryUsage every RocksDB instance of the JVM shares one cache (blocks, and the write
            # buffers charged to it). Each instance reports the cache's usage divided by the number of instances
            # (plus its own write buffers), and an operator sums its partitions: summed over every operator, the
            # shares come to the shared cache once.
            mem += op_mem
            by_query[q.name] = by_query.get(q.name, 0) + op_rows
            # RocksDB's live SST files: what a snapshot uploads, before the checkpoint's retention
            sst += int((op.get("customMetrics") or {}).get("rocksdbSstFileSize") or 0)
    reconcile = next(q for q in running.queries if q.name == "txnwatch-reconcile")
    p = reconcile.lastProgress or {}
    batch_ms = (p.get("durationMs") or {}).get("triggerExecution")
    return {
        "state_rows": rows,
        "state_memory_mb": mem / 1e6,
        "state_sst_mb": sst / 1e6,
        "state_rows_by_query": by_query,
        "reconcile_batch_s": (batch_ms or 0) / 1000,
        "reconcile_input_rows": int(p.get("numInputRows") or 0),
        "reconcile_batch_id": int(p.get("batchId", -1)),
    }


def backlog(consumer: Any, running: Any) -> dict[str, float]:
    """Records the reconcile query has not processed yet, per input (the topics' end offsets now minus the end
    offsets of its last batch), and how long ago its last batch ended."""
    from kafka.structs import TopicPartition

    reconcile = next(q for q in running.queries if q.name == "txnwatch-reconcile")
    p = reconcile.lastProgress or {}
    out: dict[str, float] = {}
    for source in p.get("sources", []):
        done = (
            json.loads(source["endOffset"]) if isinstance(source["endOffset"], str) else source["endOffset"]
        )
        for topic, parts in (done or {}).items():
            tps = [TopicPartition(topic, int(k)) for k in parts]
            now = consumer.end_offsets(tps)
            name = "log_behind" if topic == "__transaction_state" else "snapshots_behind"
            out[name] = out.get(name, 0) + sum(max(0, now[tp] - parts[str(tp.partition)]) for tp in tps)
    if p.get("timestamp"):  # the batch's start, UTC
        start = calendar.timegm(time.strptime(p["timestamp"][:19], "%Y-%m-%dT%H:%M:%S"))
        took = (p.get("durationMs") or {}).get("triggerExecution", 0) / 1000
        out["last_batch_age_s"] = time.time() - start - took
    return out


def jvm_heap(spark: Any, *, collect: bool = False) -> dict[str, float]:
    """The driver JVM's heap: used now (garbage included: a sawtooth) and committed; with `collect`, also what is
    left after a full collection (`System.gc()`), the live set: G1 may leave old garbage for minutes otherwise."""
    bean = spark._jvm.java.lang.management.ManagementFactory.getMemoryMXBean()
    heap = bean.getHeapMemoryUsage()
    out = {"jvm_heap_used_mb": heap.getUsed() / 1e6, "jvm_heap_committed_mb": heap.getCommitted() / 1e6}
    if collect:
        bean.gc()
        out["jvm_live_heap_mb"] = bean.getHeapMemoryUsage().getUsed() / 1e6
    return out


def rocksdb_cache(spark: Any) -> dict[str, float]:
    """The process's one RocksDB cache (`boundedMemoryUsage`), read from the cache itself rather than from the
    stores' shares: its usage, and the part of it that is pinned. Pinned is what cannot be evicted: the write
    buffers charged to the cache and the blocks in use. The rest is blocks the LRU keeps until the cache is full,
    those of deleted SST files included. The field is private to Spark's RocksDBMemoryManager, hence reflection;
    in local mode the executor's cache is this JVM's."""
    jvm = spark._jvm
    manager = jvm.java.lang.Class.forName(
        "org.apache.spark.sql.execution.streaming.state.RocksDBMemoryManager$"
    )
    field = manager.getDeclaredField("cache")
    field.setAccessible(True)
    cache = field.get(manager.getField("MODULE$").get(None))
    if cache is None:  # no state store opened yet
        return {}
    usage, pinned = cache.getUsage() / 1e6, cache.getPinnedUsage() / 1e6
    return {
        "rocksdb_cache_mb": usage,
        "rocksdb_cache_pinned_mb": pinned,
        "rocksdb_cache_evictable_mb": usage - pinned,
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---------------------------------------------------------------------------------------------- the soak


def candidates(bootstrap: str, topic: str) -> list[Any]:
    from kafka import KafkaConsumer
    from kafka.structs import TopicPartition

    from detectors.models import AbortCandidate

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, consumer_timeout_ms=2000)
    try:
        parts = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or []]
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        return [AbortCandidate.model_validate_json(r.value) for r in consumer if r.value is not None]
    finally:
        consumer.close()


def abort_orphan(bootstrap: str, prefix: str, candidate_id: str) -> dict[str, Any]:
    """What on-call does with a found orphan: `txnwatch proposals abort ID --execute` (verified live, claimed,
    one ABORT marker, post-checked). The orphan's state then ends like any finished transaction's, so the soak's
    state and checkpoint level off instead of holding every orphan of the run."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "txnwatch_cli",
            "proposals",
            "abort",
            candidate_id,
            "--execute",
            "--actor",
            "soak",
            "--bootstrap-server",
            bootstrap,
            "--cluster",
            "soak",
            "--topic-prefix",
            prefix,
            "--output",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        cwd=ROOT,
    )
    try:
        outcome = json.loads(done.stdout).get("outcome")
    except ValueError:
        outcome = None
    return {"abort_exit": done.returncode, "abort_outcome": outcome or done.stderr[-300:]}


def soak(args: argparse.Namespace) -> int:
    from kafka import KafkaAdminClient, KafkaConsumer
    from kafka.admin import NewTopic

    from common.settings import KafkaSettings, Settings, StreamSettings
    from common.topics import TopicSettings
    from dev.kafka import TestBedConfig, start_cluster, stop_cluster
    from streaming import job
    from streaming.session import build_session

    work = Path(tempfile.mkdtemp(prefix="txnwatch-soak-"))
    out_json = Path(args.json)
    out_json.parent.mkdir(parents=True, exist_ok=True)
    prefix = f"soak{uuid.uuid4().hex[:6]}"
    started_procs: list[subprocess.Popen[Any]] = []
    running = None
    spark = None
    samples: list[dict[str, Any]] = []
    orphans: list[dict[str, Any]] = []
    found_at: dict[int, float] = {}
    # the job's planned restarts: when, and how long the queries stopped
    restarts: list[dict[str, float]] = []
    load_summary: dict[str, Any] = {}
    log = (work / "soak.log").open("w")
    allocations: tracemalloc.Snapshot | None = None
    if args.tracemalloc:
        tracemalloc.start()

    def say(msg: str) -> None:
        line = f"[soak {time.strftime('%H:%M:%S')}] {msg}"
        print(line, flush=True)
        print(line, file=log, flush=True)

    def stop_all(*_: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop_all)
    cluster = start_cluster(TestBedConfig(nodes=1, partition_verification=False), work / "testbed")
    bootstrap = cluster.bootstrap_servers
    broker_pid = cluster.nodes[0].pid
    say(f"test bed {bootstrap} (pid {broker_pid}), work dir {work}")
    try:
        load_topics = [f"{prefix}-load-{i}" for i in range(args.topics)]
        admin = KafkaAdminClient(bootstrap_servers=bootstrap)
        admin.create_topics([NewTopic(t, args.partitions, 1) for t in load_topics])
        admin.close()
        collector_port = free_port()
        collector_log = (work / "collector.log").open("w")
        collector = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "txnwatch_cli",
                "collect",
                "--bootstrap-server",
                bootstrap,
                "--interval-ms",
                str(round(args.collector_interval * 1000)),
                "--topic-prefix",
                prefix,
                "--cluster",
                "soak",
                "--metrics-port",
                str(collector_port),
            ],
            stdout=collector_log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )
        started_procs.append(collector)
        settings = Settings(
            cluster="soak",
            kafka=KafkaSettings(bootstrap_servers=bootstrap),
            topics=TopicSettings(prefix=prefix),
            stream=StreamSettings(
                checkpoint_location=str(work / "checkpoints"),
                starting_offsets="earliest",
                expire_after_ms=4 * int(args.collector_interval * 1000),
                metrics_port=0,
            ),
        )
        opts = job.StreamOptions(settings=settings, kafka_options={"bootstrap.servers": bootstrap})
        job.ensure_topics(opts, settings.kafka.client_kwargs())
        spark = build_session(
            master="local[2]",
            app_name="txnwatch-soak",
            extra_conf={
                "spark.sql.shuffle.partitions": "4",
                "spark.ui.enabled": "false",
                **job.spark_conf(),
                **dict(args.conf),
            },
        )
        spark.sparkContext.setLogLevel("ERROR")
        console = (work / "stream-console.log").open("w")
        t_job = time.monotonic()
        running = job.start(spark, opts, out=console)
        reconcile = next(q for q in running.queries if q.name == "txnwatch-reconcile")
        deadline = time.monotonic() + 600
        while reconcile.lastProgress is None:
            if time.monotonic() > deadline or running.failed():
                raise RuntimeError(f"the job did not complete a first batch: {running.failed()}")
            time.sleep(1)
        say(f"job up in {time.monotonic() - t_job:.0f}s (metrics on :{running.metrics_port})")

        load = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "benchmarks.soak",
                "load",
                "--bootstrap-server",
                bootstrap,
                "--prefix",
                f"{prefix}-",
                "--topics",
                ",".join(load_topics),
                "--partitions",
                str(args.partitions),
                "--ids",
                str(args.ids),
                "--rate",
                str(args.rate),
                "--seconds",
                str(args.seconds),
            ],
            stdout=subprocess.PIPE,
            stderr=(work / "load.log").open("w"),
            text=True,
            cwd=ROOT,
        )
        started_procs.append(load)
        assert load.stdout is not None
        first = json.loads(load.stdout.readline() or "{}")
        say(f"load: {args.ids} ids initialised in {first.get('init_s')}s; {args.rate}/s for {args.seconds}s")
        ends = KafkaConsumer(bootstrap_servers=bootstrap)
        t0 = time.monotonic()
        orphan_times = [args.seconds * (i + 1) / (args.orphans + 1) for i in range(args.orphans)]
        pending_orphans = list(orphan_times)
        orphan_proc: subprocess.Popen[str] | None = None
        orphan_made_at = 0.0
        next_sample = t0
        opened_at = time.monotonic()
        last_sweeps: tuple[float, float] | None = None
        load_done_at: float | None = None
        tail_deadline: float | None = None
        while True:
            now = time.monotonic()
            if running.failed():
                raise RuntimeError(running.failed())
            if job.restart_due(opened_at, now, args.restart_queries_every_s):
                took = running.restart_queries()
                opened_at = time.monotonic()
                restarts.append({"at_s": round(now - t0, 1), "took_s": round(took, 1)})
                say(f"planned restart of the queries: stopped for {took:.1f}s")
                continue
            if pending_orphans and orphan_proc is None and now - t0 >= pending_orphans[0]:
                pending_orphans.pop(0)
                orphan_made_at = now - t0
                orphan_proc = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "dev.workload",
                        "--bootstrap-server",
                        bootstrap,
                        "--json",
                        "--scenario",
                        "hanging",
                        "--topic-prefix",
                        f"{prefix}-orphan{len(orphans)}-",
                    ],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    cwd=ROOT,
                )
                started_procs.append(orphan_proc)
            if orphan_proc is not None and orphan_proc.poll() is not None:
                out, err = orphan_proc.communicate()
                if orphan_proc.returncode != 0:
                    raise RuntimeError(f"the orphan workload failed: {err}")
                orphan_proc = None
                (h,) = [t for t in json.loads(out)["transactions"] if t["kind"] == "hanging"]
                # when the orphan's batch was written (the scenario's last step but its commit and restart)
                h["made_at_s"] = round(orphan_made_at, 1)
                orphans.append(h)
                say(
                    f"orphan {len(orphans)}: {h['topic']}-{h['partition']} offset {h['start_offset']} "
                    f"(workload started at +{h['made_at_s']}s, done at +{time.monotonic() - t0:.0f}s)"
                )
            if load_done_at is None and load.poll() is not None:
                load_done_at = now
                load_summary = json.loads(load.stdout.readline() or "{}")
                say(f"load done: {load_summary}")
            if now >= next_sample:
                next_sample += args.sample_s
                sample: dict[str, Any] = {"t_s": round(now - t0, 1), "loadavg_1m": os.getloadavg()[0]}
                sample.update(memory(collector.pid, load.pid if load.poll() is None else None, broker_pid))
                sample.update(state_of(running))
                sample["checkpoint_mb"] = dir_mb(work / "checkpoints")
                sample.update(checkpoint_parts(work / "checkpoints"))
                sample.update(newest_manifests_kb(work / "checkpoints"))
                sample.update(backlog(ends, running))
                sample.update(jvm_heap(spark, collect=len(samples) % args.gc_every == 0))
                sample.update(rocksdb_cache(spark))
                sample.update(native_python())
                if args.tracemalloc:
                    # compared every 5 minutes, not every sample: a snapshot takes seconds
                    every = max(1, round(300 / args.sample_s))
                    allocations, found = python_allocations(allocations, len(samples) % every == 0)
                    sample.update(found)
                try:
                    m = scrape(running.metrics_port)
                    sample["view_lag_s"] = _total(m, "txnwatch_coordinator_view_lag_seconds")
                    sample["records_behind"] = _total(m, "txnwatch_coordinator_view_records_behind")
                    sample["offsets_behind"] = _total(m, "txnwatch_stream_source_offsets_behind_latest")
                    sample["open_transactions"] = _total(m, "txnwatch_open_transactions")
                    sample["abort_candidates"] = _total(m, "txnwatch_abort_candidates")
                    c = scrape(collector_port)
                    sums = (
                        _total(c, "txnwatch_collector_sweep_duration_seconds_sum") or 0.0,
                        _total(c, "txnwatch_collector_sweep_duration_seconds_count") or 0.0,
                    )
                    if last_sweeps and sums[1] > last_sweeps[1]:
                        sample["sweep_s"] = (sums[0] - last_sweeps[0]) / (sums[1] - last_sweeps[1])
                    last_sweeps = sums
                except OSError as exc:
                    say(f"scrape failed: {exc}")
                named = candidates(bootstrap, settings.topics.abort_candidates)
                for i, h in enumerate(orphans):
                    mine = [
                        c
                        for c in named
                        if (c.topic, c.partition, c.start_offset)
                        == (h["topic"], h["partition"], h["start_offset"])
                    ]
                    if i not in found_at and mine:
                        found_at[i] = now - t0
                        h["candidate_id"] = mine[0].candidate_id
                        say(f"orphan {i + 1} found {found_at[i] - h['made_at_s']:.0f}s after it was made")
                for i, h in enumerate(orphans):
                    due = i in found_at and args.abort_after_s >= 0 and "aborted_at_s" not in h
                    if due and now - t0 >= found_at[i] + args.abort_after_s:
                        h.update(abort_orphan(bootstrap, prefix, h["candidate_id"]))
                        h["aborted_at_s"] = round(time.monotonic() - t0, 1)
                        say(f"orphan {i + 1} aborted at +{h['aborted_at_s']}s: exit {h['abort_exit']}")
                sample["candidates"] = len({c.candidate_id for c in named})
                samples.append(sample)
                say(
                    "t={t_s:>5}s load {loadavg_1m:.1f} | rss collector {collector_rss_mb:.0f} jvm "
                    "{driver_jvm_rss_mb:.0f} py {driver_python_rss_mb:.0f} workers {python_workers_pss_mb:.0f} "
                    "({python_workers}) MB | state rows {state_rows} | view lag {view_lag_s} s | batch "
                    "{reconcile_batch_s:.1f}s | candidates {candidates}".format(**sample)
                )
            if load_done_at is not None and not pending_orphans and orphan_proc is None:
                if tail_deadline is None:
                    tail_deadline = now + args.tail_s
                aborted = args.abort_after_s < 0 or all("aborted_at_s" in h for h in orphans)
                if len(found_at) == len(orphans) and aborted and now >= load_done_at + 3 * args.sample_s:
                    break
                if now >= tail_deadline:
                    say("tail deadline reached with orphans not found")
                    break
            time.sleep(0.5)
    except KeyboardInterrupt:
        say("interrupted")
    finally:
        final: list[Any] = []
        progress: dict[str, Any] = {}
        try:  # what the checks and the JSON need, read before anything stops; never in the way of stopping
            final = candidates(bootstrap, f"{prefix}.abort-candidates") if samples else []
            if running is not None:
                progress = {
                    q.name: json.loads(q.lastProgress.json) for q in running.queries if q.lastProgress
                }
        except Exception as exc:
            say(f"reading the final candidates or progress failed: {exc!r}")
        if running is not None:
            running.stop()
        if spark is not None:
            spark.stop()
        for p in started_procs:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
        stop_cluster(work / "testbed")
        for data in ("testbed", "checkpoints"):  # the logs stay for a look
            shutil.rmtree(work / data, ignore_errors=True)
        say(f"stopped the job, the collector, the load and the test bed; logs in {work}")

    orphan_keys = {(h["topic"], h["partition"], h["start_offset"]) for h in orphans}
    false = [c for c in final if (c.topic, c.partition, c.start_offset) not in orphan_keys]
    result = {
        "args": {k: v for k, v in vars(args).items() if k != "func"},
        "load": load_summary,
        "orphans": [
            {**h, "found_after_s": round(found_at[i] - h["made_at_s"], 1) if i in found_at else None}
            for i, h in enumerate(orphans)
        ],
        "false_candidates": [c.model_dump(mode="json") for c in false],
        "restarts": restarts,
        "samples": samples,
        "last_progress": progress,
    }
    result["levels"] = levels(result)
    out_json.write_text(json.dumps(result, indent=1, default=str))  # progress holds UUIDs
    plot(result, Path(args.png))
    print(summary(result))
    say(f"samples in {out_json}, plot in {args.png}")
    aborts_ok = args.abort_after_s < 0 or all(h.get("abort_exit") == 0 for h in orphans)
    return 0 if len(found_at) == len(orphans) == args.orphans and not false and aborts_ok else 1


def _during_load(result: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for s in result["samples"] if s["t_s"] <= result["args"]["seconds"]]


# The curves whose level and drift the soak reports: memory, state and the checkpoint (issue: each must level off).
LEVEL_KEYS = (
    ("collector_rss_mb", "collector RSS (MB)"),
    ("driver_jvm_rss_mb", "driver JVM RSS (MB)"),
    ("jvm_live_heap_mb", "driver JVM heap after a full GC (MB)"),
    ("jvm_heap_committed_mb", "driver JVM heap committed (MB)"),
    ("driver_python_rss_mb", "driver Python RSS (MB)"),
    ("python_traced_mb", "  of which Python's objects, traced (MB; --tracemalloc)"),
    ("driver_python_rss_file_mb", "  of which mapped files: libraries' code (MB)"),
    ("driver_python_rss_anon_mb", "  of which anonymous memory (MB)"),
    ("malloc_heap_mb", "  of which glibc malloc's heap (MB)"),
    ("malloc_free_mb", "    of that, free in malloc's arenas (MB)"),
    ("arrow_pool_mb", "  Arrow's pool, allocated (MB)"),
    ("python_workers_pss_mb", "Python workers PSS, summed (MB)"),
    ("state_rows", "state rows, all operators"),
    ("state_memory_mb", "RocksDB's shared cache, blocks and write buffers, as the stores report it (MB)"),
    ("rocksdb_cache_mb", "RocksDB's shared cache, read from the cache (MB)"),
    ("rocksdb_cache_pinned_mb", "  of which pinned: write buffers, blocks in use (MB)"),
    ("rocksdb_cache_evictable_mb", "  of which evictable blocks (MB)"),
    ("state_sst_mb", "state stores' live SST files (MB)"),
    ("checkpoint_mb", "checkpoint on disk (MB)"),
    ("checkpoint_logs_mb", "  of which offset and commit logs (MB)"),
    ("checkpoint_changelog_mb", "  of which state changelogs (MB)"),
    ("checkpoint_snapshot_mb", "  of which state snapshots, SST and zip (MB)"),
    ("checkpoint_zip_files", "  snapshot zips, all state stores (files)"),
    ("checkpoint_sst_files", "  snapshot SST files, all state stores (files)"),
    ("snapshot_manifest_sum_kb", "  RocksDB MANIFESTs in the stores' newest snapshots, summed (KB)"),
    ("reconcile_batch_s", "reconcile batch (s)"),
)


def level_and_drift(points: list[tuple[float, float]]) -> dict[str, float] | None:
    """The level (median) of a curve over a window and its drift: the least-squares slope, per hour and as a
    share of the level. A median and a fitted slope, not first-against-last, so one GC or one compaction at
    either end does not decide the figure."""
    if len(points) < 3:
        return None
    ts = [t for t, _ in points]
    vs = [v for _, v in points]
    mt, mv = sum(ts) / len(ts), sum(vs) / len(vs)
    var = sum((t - mt) ** 2 for t in ts)
    slope = sum((t - mt) * (v - mv) for t, v in points) / var if var else 0.0
    level = sorted(vs)[len(vs) // 2]
    per_hour = slope * 3600
    return {
        "level": level,
        "min": min(vs),
        "max": max(vs),
        "drift_per_hour": per_hour,
        "drift_pct_per_hour": 100 * per_hour / level if level else 0.0,
        "points": len(points),
    }


def levels(result: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Each curve's level and drift over the second half of the load: past the warm-up and past the checkpoint's
    retention (`minBatchesToRetain`, 20 batches plus Spark's 30% slack: 10 minutes for the windows query, which
    runs a batch every 20 s or so) in a run of 20 minutes or more."""
    seconds = result["args"]["seconds"]
    window = [s for s in _during_load(result) if s["t_s"] >= seconds / 2]
    out: dict[str, dict[str, float]] = {}
    for key, _ in LEVEL_KEYS:
        found = level_and_drift([(s["t_s"], s[key]) for s in window if s.get(key) is not None])
        if found is not None:
            out[key] = found
    return out


def summary(result: dict[str, Any]) -> str:
    samples = _during_load(result)
    if not samples:
        return "no samples"
    third = samples[len(samples) // 3 :]  # past the warm-up (JIT, first RocksDB files, workers starting)

    def span(key: str, rows: list[dict[str, Any]]) -> str:
        vals = [s[key] for s in rows if s.get(key) is not None]
        return f"{min(vals):.1f}..{max(vals):.1f}" if vals else "n/a"

    lines = [
        f"load: {result['load']}",
        "orphans: "
        + ", ".join(
            f"made +{h['made_at_s']}s found after {h['found_after_s']}s"
            + (f", aborted at +{h['aborted_at_s']}s ({h['abort_outcome']})" if "aborted_at_s" in h else "")
            for h in result["orphans"]
        ),
        f"false candidates: {len(result['false_candidates'])}",
        "planned restarts: "
        + (", ".join(f"+{r['at_s']}s ({r['took_s']}s)" for r in result.get("restarts", [])) or "none"),
        f"load average (1 min) during the load: {span('loadavg_1m', samples)}",
    ]
    for key in (
        "collector_rss_mb",
        "driver_jvm_rss_mb",
        "driver_python_rss_mb",
        "python_workers_pss_mb",
        "jvm_heap_used_mb",
        "jvm_heap_committed_mb",
        "jvm_live_heap_mb",
        "state_rows",
        "state_memory_mb",
        "checkpoint_mb",
        "view_lag_s",
        "snapshots_behind",
        "log_behind",
        "last_batch_age_s",
        "reconcile_batch_s",
        "sweep_s",
    ):
        lines.append(f"{key}: whole load {span(key, samples)}; after the first third {span(key, third)}")
    lines += [
        "",
        f"levels over the second half of the load (t >= {result['args']['seconds'] / 2:.0f} s):",
        "| curve | level (median) | range | drift per hour | drift per hour, % of level |",
        "|---|---|---|---|---|",
    ]
    names = dict(LEVEL_KEYS)
    for key, f in result.get("levels", {}).items():
        lines.append(
            f"| {names[key]} | {f['level']:.1f} | {f['min']:.1f}–{f['max']:.1f} | {f['drift_per_hour']:+.1f} "
            f"| {f['drift_pct_per_hour']:+.1f}% |"
        )
    return "\n".join(lines)


def plot(result: dict[str, Any], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = result["samples"]
    # minutes on the axis for a long run; the orphan and end markers below use the same unit
    unit, div = ("minutes", 60.0) if result["args"]["seconds"] >= 1200 else ("seconds", 1.0)
    t = [x["t_s"] / div for x in s]
    fig, axes = plt.subplots(4, 1, figsize=(10, 13), sharex=True)
    mem = axes[0]
    for key, label in (
        ("driver_jvm_rss_mb", "driver JVM (RSS)"),
        ("python_workers_pss_mb", "Python workers (PSS, sum)"),
        ("driver_python_rss_mb", "driver Python (RSS)"),
        ("collector_rss_mb", "collector (RSS)"),
        ("jvm_heap_used_mb", "driver JVM heap used"),
    ):
        mem.plot(t, [x.get(key) for x in s], label=label)
    live = [(x["t_s"], x["jvm_live_heap_mb"]) for x in s if x.get("jvm_live_heap_mb") is not None]
    if live:
        mem.plot(
            [a / div for a, _ in live],
            [b for _, b in live],
            "ko",
            ms=4,
            label="driver JVM heap after a full GC",
        )
    mem.set_ylabel("MB")
    mem.set_title(
        f"txnwatch soak: {result['args']['ids']} transactional ids, {result['args']['rate']} transactions/s in "
        f"total, {result['args']['seconds'] / div:.0f} {unit}, {len(result['orphans'])} orphans"
    )
    mem.legend(loc="upper left", fontsize=8)
    st = axes[1]
    st.plot(t, [x.get("state_rows") for x in s], label="state rows (all operators)", color="tab:purple")
    st.set_ylabel("rows")
    st2 = st.twinx()
    st2.plot(t, [x.get("checkpoint_mb") for x in s], label="checkpoint on disk (MB)", color="tab:gray")
    st2.plot(t, [x.get("state_memory_mb") for x in s], label="RocksDB's shared cache (MB)", color="tab:olive")
    st2.plot(
        t,
        [x.get("checkpoint_snapshot_mb") for x in s],
        label="of the checkpoint: state snapshots (MB)",
        color="tab:gray",
        ls="--",
    )
    st2.set_ylabel("MB")
    st.legend(loc="upper left", fontsize=8)
    st2.legend(loc="upper right", fontsize=8)
    # the two curves too small to read on the first panels: RocksDB's cache split, and the soak's own Python
    near = axes[2]
    py = near.twinx()
    for ax, key, label, color, ls in (
        (near, "rocksdb_cache_mb", "RocksDB's cache (MB)", "tab:olive", "-"),
        (near, "rocksdb_cache_pinned_mb", "  pinned: write buffers", "tab:olive", "--"),
        (near, "rocksdb_cache_evictable_mb", "  evictable blocks", "tab:olive", ":"),
        (py, "driver_python_rss_mb", "soak's Python RSS (MB)", "tab:blue", "-"),
        (py, "driver_python_rss_anon_mb", "  anonymous", "tab:blue", "--"),
        (py, "malloc_heap_mb", "  glibc malloc's heap", "tab:blue", ":"),
    ):
        ax.plot(t, [x.get(key) for x in s], label=label, color=color, ls=ls)
    near.set_ylabel("MB")
    near.legend(loc="upper left", fontsize=8)
    py.set_ylabel("MB")
    py.legend(loc="upper right", fontsize=8)
    lag = axes[3]
    lag.plot(t, [x.get("view_lag_s") for x in s], label="coordinator view lag (s)", color="tab:red")
    lag.plot(t, [x.get("reconcile_batch_s") for x in s], label="reconcile batch (s)", color="tab:blue")
    lag.plot(t, [x.get("sweep_s") for x in s], label="collector sweep (s)", color="tab:green")
    lag.plot(t, [x.get("last_batch_age_s") for x in s], label="since the last batch (s)", color="tab:cyan")
    lag.plot(t, [x.get("loadavg_1m") for x in s], label="load average (1 min)", color="tab:gray", ls=":")
    behind = lag.twinx()
    behind.plot(t, [x.get("snapshots_behind") for x in s], label="snapshots not yet read", color="tab:brown")
    behind.plot(t, [x.get("log_behind") for x in s], label="log records not yet read", color="tab:pink")
    behind.set_ylabel("records")
    behind.legend(loc="upper right", fontsize=8)
    for h in result["orphans"]:
        lag.axvline(h["made_at_s"] / div, color="black", ls="--", lw=0.8)
        if h["found_after_s"] is not None:
            lag.axvline((h["made_at_s"] + h["found_after_s"]) / div, color="tab:orange", ls="--", lw=0.8)
    lag.axvline(result["args"]["seconds"] / div, color="black", lw=0.8)
    for r in result.get("restarts", []):  # the job's planned restarts, on every panel
        for ax in axes:
            ax.axvline(r["at_s"] / div, color="tab:green", ls=":", lw=1.2)
    lag.set_xlabel(
        f"{unit} since the load started (dashed: orphan made, black; found, orange; solid: load ends; "
        "dotted green: planned restart)"
    )
    lag.set_ylabel("s")
    lag.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=90)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    from streaming.cli import spark_conf_pair

    parser = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what")
    load = sub.add_parser("load", help="the load process (started by the soak)")
    load.add_argument("--bootstrap-server", required=True)
    load.add_argument("--prefix", required=True)
    load.add_argument("--topics", required=True, help="comma-separated")
    load.add_argument("--partitions", type=int, default=3)
    load.add_argument("--ids", type=int, default=200)
    load.add_argument("--rate", type=float, default=20.0, help="transactions per second, all ids together")
    load.add_argument("--seconds", type=float, default=300.0)
    load.add_argument("--threads", type=int, default=4)
    sub.add_parser("plot", help="draw the picture again from a run's samples: --json FILE --png FILE plot")
    parser.add_argument("--seconds", type=float, default=300.0, help="how long the load runs")
    parser.add_argument("--ids", type=int, default=200, help="transactional ids")
    parser.add_argument("--rate", type=float, default=20.0, help="transactions per second, all ids together")
    parser.add_argument(
        "--orphans",
        type=int,
        default=None,
        help="real orphans, spread over the load (default: one per 10 minutes, 3 or more)",
    )
    parser.add_argument("--topics", type=int, default=4)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--collector-interval", type=float, default=5.0)
    parser.add_argument(
        "--sample-s",
        type=float,
        default=None,
        help="default: 10 s for runs under 20 minutes, 30 s for longer ones",
    )
    parser.add_argument(
        "--gc-every",
        type=int,
        default=None,
        help="a full GC of the driver JVM every N samples (default: a minute)",
    )
    parser.add_argument(
        "--tail-s", type=float, default=240.0, help="after the load: how long to wait for orphans"
    )
    parser.add_argument(
        "--abort-after-s",
        type=float,
        default=60.0,
        help="abort each orphan this long after it was found, as on-call would (negative: never)",
    )
    parser.add_argument(
        "--conf",
        action="append",
        default=[],
        type=spark_conf_pair,
        metavar="KEY=VALUE",
        help="a Spark setting for the job, as `txnwatch stream --conf` takes it (repeatable)",
    )
    parser.add_argument(
        "--restart-queries-every-s",
        type=float,
        default=900.0,
        help="the job's planned restarts (`txnwatch stream --restart-queries-every-s`, 6 h by default there): "
        "often enough here that an hour shows the snapshots' level between them (0: never)",
    )
    parser.add_argument(
        "--tracemalloc",
        action="store_true",
        help="trace this process's Python allocations: the traced total in every sample, and every 5 minutes the "
        "ten source lines that grew most (python_grew_most in the JSON); slows its Python down",
    )
    parser.add_argument("--json", default=str(ROOT / ".cache" / "soak" / "soak.json"))
    parser.add_argument("--png", default=str(ROOT / "docs" / "soak.png"))
    args = parser.parse_args(argv)
    if args.what == "load":
        return run_load(args)
    if args.what == "plot":
        plot(json.loads(Path(args.json).read_text()), Path(args.png))
        return 0
    if args.sample_s is None:
        args.sample_s = 10.0 if args.seconds < 1200 else 30.0
    if args.gc_every is None:
        args.gc_every = max(1, round(60 / args.sample_s))
    if args.orphans is None:
        args.orphans = max(3, int(args.seconds // 600))
    return soak(args)


if __name__ == "__main__":
    sys.exit(main())
