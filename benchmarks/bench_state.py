"""What a steady batch of the reconcile query costs once the job remembers N transactional ids.

`python -m benchmarks.bench_state [--ids 10000,100000,1000000] [--log-partitions 50] [--steady-s 180]
[--txn-per-s 200] [--sweep-s 10] [--sweep-partitions 1000] [--profile [DIR]]` starts its own one-node test bed
(1 GB heap, temporary directory) and then, for each N in `--ids`, in a Python process and Spark JVM of its own
(so each N's memory peaks are its own):

1. A transaction log topic with `--log-partitions` partitions (Kafka's default for `__transaction_state` is 50),
   compacted as `__transaction_state` is, holding what a compacted log of N ids keeps: each id's last record, a
   CompleteCommit of one TV2 transaction (bench_stream.coordinator_lifecycle's bytes from detectors.codec), on
   the id's coordinator partition (Kafka's hash of the id), and one CoordinatorLogPosition of that topic, measured
   as the collector measures it (admin.collect.position.measure_log_position: high watermarks, then log ends).
2. The reconcile query alone (`streaming.job.start(..., queries=("reconcile",))`, reading the topic through
   `transaction_log_topic`) from a fresh checkpoint, with the job's own Spark settings (build_session,
   job.spark_conf(), 4 shuffle partitions, `--state-buckets` 32, 5 s trigger, local[2]); catch-up = from the start
   of the query until the job's view is current (its VIEW report).
3. A steady input for `--steady-s`, written by a feeder process of its own (its CPU is not the job's):
   `--txn-per-s` transactions of existing ids picked at random (Ongoing, then PrepareCommit and CompleteCommit
   with the TV2 epoch bump, 50-1000 ms later), each on 1-3 of `--sweep-partitions` data partitions, and every
   `--sweep-s` one collector sweep as the collector publishes it (admin.collect.publish's records): a PartitionSnapshot
   for each partition with an open transaction (the ids in Ongoing at that moment: the job judges them OPEN), an
   empty one for each partition whose transactions closed since the last sweep, the broker's sweep summary, then
   the log topic's CoordinatorLogPosition, measured against the broker right after the sweep.
   `--publish-all-partitions` publishes a snapshot of every swept partition instead (an upper bound).

Per N it reports: catch-up seconds; the steady batches (those that started after the feeder did, without the first
`--warmup-batches`): batch p50/p99 against the trigger, the median durationMs breakdown, and per stateful operator
the median allUpdatesTimeMs, commitTimeMs and customMetrics of the query progress and its rows at the end; CPU
seconds per steady batch of the driver, Spark's JVM and its Python workers (/proc, bench_stream.tree_cpu_s:
from the end of the last warm-up batch to the end of the last steady one, divided by the steady batches); bytes
written under the query checkpoint's state directory, listed after every batch (a file first seen, or grown, in
that listing counts for that batch: changelog, zip, sst and others apart), and their total over the steady
batches divided by them; peak RSS (VmHWM) of Spark's JVM and of the largest Python worker, and the workers'
largest sum at one moment; load average before and after; the job's dead letters over the whole run (a batch read
of both inputs through the job's own parse: a position the job refuses would land there), and whether the view
stayed current. Over all N: the growth from the smallest to the largest N of steady batch p50/p99 and of the
checkpoint bytes per batch. State variables are not read back: rows come from the progress (numRowsTotal),
whatever the stateful stages keep.

`--profile` profiles one more batch after the steady ones (bench_stream.Profilers: py-spy and JFR). The last line
of stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import NewTopic

from benchmarks.bench_stream import (
    DATA_TOPICS,
    RECONCILE,
    Profilers,
    coordinator_lifecycle,
    percentile,
    tree_cpu_s,
    trigger_seconds,
)
from benchmarks.harness import loadavg, log, machine
from detectors.codec import TxnLogKey, TxnLogValue, TxnStatus, decode_value, encode_key, encode_value
from detectors.currency import coordinator_partition
from detectors.models import BrokerSweepSummary, CoordinatorLogPosition, OpenTransaction, PartitionSnapshot
from dev.kafka import TestBedConfig, start_cluster, stop_cluster

Json = dict[str, Any]
CLUSTER = "bench"
PRODUCER_ID_BASE = 1_000
# The log's records were last updated an hour ago: well inside the job's view TTL (24 h), as on a live cluster.
LOG_AGE_MS = 3_600_000
TXN_MS = (50, 1_000)  # how long a steady transaction stays open (uniform)
BROKER_MAX_TXN_TIMEOUT_MS = 900_000


# ------------------------------------------------------------------------------------------ the log


def transactional_id(run: str, i: int) -> str:
    return f"{run}-app-{i:07d}"


def compacted_record(run: str, seed: int, i: int, t0_ms: int) -> tuple[bytes, bytes]:
    """What compaction keeps of id `i`: the CompleteCommit that ends its one transaction (the last record of
    bench_stream's TV2 lifecycle). Each id draws from a generator of its own, so the feeder can rebuild it."""
    rng = random.Random(seed * 100_000_000 + i)
    return coordinator_lifecycle(rng, transactional_id(run, i), PRODUCER_ID_BASE + i, 1, t0_ms + i)[-1]


def produce_log(
    bootstrap: str, topic: str, partitions: int, records: Iterator[tuple[str, bytes, bytes]]
) -> Json:
    """(transactional id, key, value) → each on the id's coordinator partition, as the coordinator writes it."""
    producer = KafkaProducer(
        bootstrap_servers=bootstrap, acks="all", linger_ms=20, batch_size=512 * 1024, max_request_size=4 << 20
    )
    began = time.monotonic()
    n = size = 0
    try:
        for tid, key, value in records:
            producer.send(topic, key=key, value=value, partition=coordinator_partition(tid, partitions))
            n += 1
            size += len(key) + len(value)
        producer.flush(timeout=600)
    finally:
        producer.close(timeout=30)
    elapsed = time.monotonic() - began
    log(f"wrote {n:,} log records ({size / 1e6:.1f} MB) to {topic} in {elapsed:.1f} s")
    return {"records": n, "bytes": size, "seconds": round(elapsed, 1)}


class Positions:
    """Measures the log topic's CoordinatorLogPosition as the collector does, and publishes sweeps' records."""

    def __init__(self, bootstrap: str, log_topic: str, snapshot_topic: str) -> None:
        from admin.collect.publish import KafkaSink
        from admin.wire.kafka_wire import KafkaWire

        self.log_topic, self.snapshot_topic = log_topic, snapshot_topic
        self.admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="bench-state-collector")
        self.wire = KafkaWire(self.admin)
        self.sink = KafkaSink(
            KafkaProducer(
                bootstrap_servers=bootstrap, acks="all", linger_ms=5, client_id="bench-state-sweeps"
            )
        )

    def measure(self, sweep_id: str, as_of_ms: int) -> CoordinatorLogPosition:
        from admin.collect.position import measure_log_position

        view = self.wire.metadata([self.log_topic])
        position, problems = measure_log_position(
            self.wire,
            view,
            self.log_topic,
            cluster=CLUSTER,
            sweep_id=sweep_id,
            as_of_ms=as_of_ms,
            log_end_offsets=True,
        )
        if position is None or problems:
            raise RuntimeError(f"no position of {self.log_topic}: {problems}")
        return position

    def publish(
        self,
        snapshots: list[PartitionSnapshot],
        summaries: list[BrokerSweepSummary],
        position: CoordinatorLogPosition,
    ) -> None:
        from admin.collect.publish import position_record, snapshot_record, summary_record

        t = self.snapshot_topic
        self.sink.send_all(
            [
                *(snapshot_record(t, s) for s in snapshots),
                *(summary_record(t, s) for s in summaries),
                position_record(t, position),
            ]
        )

    def close(self) -> None:
        self.sink.close()
        self.admin.close()


# ------------------------------------------------------------------------------------------ the feeder


@dataclass
class Open:
    """One steady transaction between its Ongoing and its PrepareCommit."""

    i: int
    producer_id: int
    epoch: int
    timeout_ms: int
    start_ms: int
    ends_ms: int
    partitions: tuple[tuple[str, int, int], ...]  # (topic, partition, start offset)


@dataclass
class FeedStats:
    transactions_started: int = 0
    transactions_completed: int = 0
    log_records: int = 0
    sweeps: int = 0
    snapshots_open: int = 0
    snapshots_empty: int = 0
    open_transactions_swept: int = 0
    sweep_ms: list[int] = field(default_factory=list)


class Feeder:
    """The steady input: transactions of existing ids on the log topic, and a collector sweep every `sweep_s`."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rng = random.Random(args.seed + 1)
        self.t0_ms = args.t0_ms
        self.tps = [
            (DATA_TOPICS[j % len(DATA_TOPICS)], j // len(DATA_TOPICS)) for j in range(args.sweep_partitions)
        ]
        self.next_offset = {tp: self.rng.randint(0, 10_000) for tp in self.tps}
        self.epochs: dict[int, tuple[int, int]] = {}  # id → (epoch, timeout) after its last transaction
        self.open: dict[int, Open] = {}
        self.swept_open: set[tuple[str, int]] = set()
        self.last_sweep_ms: int | None = None
        self.stats = FeedStats()
        self.producer = KafkaProducer(
            bootstrap_servers=args.bootstrap, acks="all", linger_ms=5, client_id="bench-state-coordinator"
        )
        self.positions = Positions(args.bootstrap, args.log_topic, args.snapshot_topic)

    def _send(self, i: int, value: TxnLogValue) -> None:
        tid = transactional_id(self.args.run, i)
        self.producer.send(
            self.args.log_topic,
            key=encode_key(TxnLogKey(tid)),
            value=encode_value(value),
            partition=coordinator_partition(tid, self.args.log_partitions),
        )
        self.stats.log_records += 1

    def _epoch_and_timeout(self, i: int) -> tuple[int, int]:
        known = self.epochs.get(i)
        if known is not None:
            return known
        value = decode_value(compacted_record(self.args.run, self.args.seed, i, self.t0_ms)[1])
        assert value is not None
        return value.producer_epoch, value.transaction_timeout_ms

    def begin(self, now_ms: int) -> None:
        if len(self.open) >= self.args.ids:  # every id is in a transaction: a producer runs one at a time
            return
        i = self.rng.randrange(self.args.ids)
        while i in self.open:
            i = self.rng.randrange(self.args.ids)
        epoch, timeout = self._epoch_and_timeout(i)
        parts = []
        for tp in sorted(self.rng.sample(self.tps, self.rng.randint(1, 3))):
            parts.append((tp[0], tp[1], self.next_offset[tp]))
            self.next_offset[tp] += self.rng.randint(1, 50)  # the transaction's records
        txn = Open(
            i, PRODUCER_ID_BASE + i, epoch, timeout, now_ms, now_ms + self.rng.randint(*TXN_MS), tuple(parts)
        )
        self.open[i] = txn
        self._send(i, self._value(txn, TxnStatus.ONGOING, txn.epoch, now_ms))
        self.stats.transactions_started += 1

    def end(self, txn: Open, now_ms: int) -> None:
        # TV2: EndTxn bumps the epoch; PrepareCommit and CompleteCommit carry the new one.
        self._send(txn.i, self._value(txn, TxnStatus.PREPARE_COMMIT, txn.epoch + 1, now_ms))
        self._send(txn.i, self._value(txn, TxnStatus.COMPLETE_COMMIT, txn.epoch + 1, now_ms + 1))
        for topic, partition, _ in txn.partitions:
            self.next_offset[(topic, partition)] += 1  # the commit marker
        self.epochs[txn.i] = (txn.epoch + 1, txn.timeout_ms)
        del self.open[txn.i]
        self.stats.transactions_completed += 1

    def _value(self, txn: Open, status: TxnStatus, epoch: int, now_ms: int) -> TxnLogValue:
        by_topic: dict[str, list[int]] = {}
        for topic, partition, _ in txn.partitions:
            by_topic.setdefault(topic, []).append(partition)
        parts = (
            () if status == TxnStatus.COMPLETE_COMMIT else tuple((t, tuple(ps)) for t, ps in by_topic.items())
        )
        return TxnLogValue(
            version=1,
            producer_id=txn.producer_id,
            producer_epoch=epoch,
            transaction_timeout_ms=txn.timeout_ms,
            status=status,
            partitions=parts,
            last_update_timestamp_ms=now_ms,
            start_timestamp_ms=txn.start_ms,
            previous_producer_id=txn.producer_id,
            client_transaction_version=2,
        )

    def sweep(self) -> None:
        """One sweep as the collector publishes it: snapshots of the partitions with open transactions, empties
        for those that closed since, the summary, then the position measured after the answers."""
        began = time.monotonic()
        self.stats.sweeps += 1
        sweep_id = f"{self.args.run}-{self.stats.sweeps}"
        observed = int(time.time() * 1000)
        by_tp: dict[tuple[str, int], list[OpenTransaction]] = {}
        for txn in self.open.values():
            for topic, partition, start in txn.partitions:
                by_tp.setdefault((topic, partition), []).append(
                    OpenTransaction(
                        producer_id=txn.producer_id,
                        producer_epoch=txn.epoch,
                        coordinator_epoch=0,
                        start_offset=start,
                        start_timestamp_ms=txn.start_ms,
                        start_batch_producer_epoch=txn.epoch,
                        last_sequence=self.rng.randint(0, 50),
                        last_timestamp_ms=min(observed, txn.start_ms + 5),
                        opened_after_ms=self.last_sweep_ms,
                        seen_open_ms=observed + 2,
                    )
                )
        publish_all = self.args.publish_all_partitions
        empty = [tp for tp in (self.tps if publish_all else sorted(self.swept_open)) if tp not in by_tp]
        snapshots = [self._snapshot(sweep_id, observed, tp, by_tp.get(tp, [])) for tp in sorted(by_tp)]
        snapshots += [self._snapshot(sweep_id, observed, tp, []) for tp in empty]
        summary = BrokerSweepSummary(
            cluster=CLUSTER,
            sweep_id=sweep_id,
            observed_at_ms=observed,
            broker=self.args.leader,
            partitions_covered=len(self.tps),
        )
        # Every coordinator record sent so far is acknowledged before as_of: the coordinator acts (and a leader
        # reports) only on records committed to the log.
        self.producer.flush(timeout=60)
        position = self.positions.measure(sweep_id, int(time.time() * 1000))
        self.positions.publish(snapshots, [summary], position)
        self.swept_open = set(by_tp)
        self.last_sweep_ms = observed
        self.stats.snapshots_open += len(by_tp)
        self.stats.snapshots_empty += len(empty)
        self.stats.open_transactions_swept += sum(len(v) for v in by_tp.values())
        self.stats.sweep_ms.append(round((time.monotonic() - began) * 1000))

    def _snapshot(
        self, sweep_id: str, observed: int, tp: tuple[str, int], txns: list[OpenTransaction]
    ) -> PartitionSnapshot:
        txns.sort(key=lambda t: t.start_offset)
        hw = self.next_offset[tp]
        return PartitionSnapshot(
            cluster=CLUSTER,
            sweep_id=sweep_id,
            observed_at_ms=observed,
            leader=self.args.leader,
            topic=tp[0],
            partition=tp[1],
            open_transactions=tuple(txns),
            last_stable_offset=txns[0].start_offset if txns else hw,
            high_watermark=hw,
            max_transaction_timeout_ms=BROKER_MAX_TXN_TIMEOUT_MS,
        )

    def run(self, stop: list[bool]) -> Json:
        began = time.monotonic()
        next_sweep = began + self.args.sweep_s
        while not stop[0]:
            now = time.monotonic()
            now_ms = int(time.time() * 1000)
            due = int((now - began) * self.args.txn_per_s) - self.stats.transactions_started
            for _ in range(min(due, self.args.ids - len(self.open))):
                self.begin(now_ms)
            for txn in [t for t in self.open.values() if t.ends_ms <= now_ms]:
                self.end(txn, now_ms)
            if now >= next_sweep:
                self.sweep()
                next_sweep += self.args.sweep_s
            time.sleep(0.01)
        self.producer.flush(timeout=60)
        s = self.stats
        return {
            "seconds": round(time.monotonic() - began, 1),
            "transactions_started": s.transactions_started,
            "transactions_completed": s.transactions_completed,
            "transactions_per_s": round(s.transactions_started / max(time.monotonic() - began, 1e-9), 1),
            "log_records": s.log_records,
            "ids_touched": len(set(self.epochs) | set(self.open)),
            "sweeps": s.sweeps,
            "snapshots_open_per_sweep": round(s.snapshots_open / s.sweeps, 1) if s.sweeps else None,
            "snapshots_empty_per_sweep": round(s.snapshots_empty / s.sweeps, 1) if s.sweeps else None,
            "open_transactions_per_sweep": round(s.open_transactions_swept / s.sweeps, 1)
            if s.sweeps
            else None,
            "sweep_ms_p50": statistics.median(s.sweep_ms) if s.sweep_ms else None,
        }


def feed(args: argparse.Namespace) -> int:
    """The feeder process: runs until SIGTERM, then prints its figures (one JSON line)."""
    stop = [False]

    def on_term(_sig: int, _frame: Any) -> None:
        stop[0] = True

    signal.signal(signal.SIGTERM, on_term)
    feeder = Feeder(args)
    print(json.dumps(feeder.run(stop)), flush=True)  # before closing: the figures are out whatever happens
    feeder.producer.close(timeout=10)
    feeder.positions.close()
    return 0


# ------------------------------------------------------------------------------------------ /proc


def _status_kb(pid: int, field_name: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            tasks = list(Path(f"/proc/{p}/task").iterdir())
        except OSError:  # exited meanwhile
            continue
        for task in tasks:
            try:
                kids = [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
            out += kids
            todo += kids
    return out


@dataclass
class Memory:
    """Peak RSS of Spark's JVM and of its Python workers (sampled; each process's own VmHWM is its peak)."""

    jvm: int | None = None
    jvm_hwm_kb: int = 0
    worker_hwm_kb: dict[int, int] = field(default_factory=dict)
    workers_sum_max_kb: int = 0

    def sample(self, me: int, exclude: set[int]) -> None:
        if self.jvm is None:
            self.jvm = next((p for p in _descendants(me) if p not in exclude and _comm(p) == "java"), None)
        if self.jvm is None:
            return
        self.jvm_hwm_kb = max(self.jvm_hwm_kb, _status_kb(self.jvm, "VmHWM"))
        total = 0
        for p in _descendants(self.jvm):
            if _comm(p).startswith("python"):
                self.worker_hwm_kb[p] = max(self.worker_hwm_kb.get(p, 0), _status_kb(p, "VmHWM"))
                total += _status_kb(p, "VmRSS")
        self.workers_sum_max_kb = max(self.workers_sum_max_kb, total)

    def figures(self) -> Json:
        return {
            "spark_jvm_peak_rss_mb": round(self.jvm_hwm_kb / 1024),
            "python_worker_peak_rss_mb": round(max(self.worker_hwm_kb.values(), default=0) / 1024),
            "python_workers_sum_peak_rss_mb": round(self.workers_sum_max_kb / 1024),
            "driver_python_peak_rss_mb": round(_status_kb(os.getpid(), "VmHWM") / 1024),
        }


# ------------------------------------------------------------------------------------------ checkpoint


def file_kind(path: Path) -> str:
    if path.suffix in (".changelog", ".zip", ".sst"):
        return path.suffix[1:]
    return "crc" if path.suffix == ".crc" else "other"


class StateFiles:
    """Bytes written under a state directory, by listing it: a file first seen counts whole, a file that grew
    counts its growth (files deleted by Spark's maintenance take nothing back)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.sizes: dict[Path, int] = {}

    def added(self) -> dict[str, int]:
        out: dict[str, int] = {}
        if not self.root.exists():
            return out
        for p in self.root.rglob("*"):
            try:
                size = p.stat().st_size if p.is_file() else None
            except OSError:  # deleted while listed
                continue
            if size is None:
                continue
            grown = size - self.sizes.get(p, 0)
            if grown > 0:
                out[file_kind(p)] = out.get(file_kind(p), 0) + grown
            self.sizes[p] = size
        return out


# ------------------------------------------------------------------------------------------ one N


def _numbers(d: Json | None) -> dict[str, float]:
    return {k: float(v) for k, v in (d or {}).items() if isinstance(v, (int, float))}


def operator_figures(steady: list[Json], last: Json) -> list[Json]:
    """Per stateful operator (in the progress's order): medians over the steady batches and rows at the end."""
    out = []
    for op_id, op in enumerate(last.get("stateOperators", [])):
        ops = [p["stateOperators"][op_id] for p in steady if len(p.get("stateOperators", [])) > op_id]
        metrics = sorted({k for o in ops for k in _numbers(o.get("customMetrics"))})
        out.append(
            {
                "operator_id": op_id,
                "operator_name": op.get("operatorName"),
                "rows_total": op.get("numRowsTotal"),
                "all_updates_ms_p50": _median([o.get("allUpdatesTimeMs") for o in ops]),
                "commit_ms_p50": _median([o.get("commitTimeMs") for o in ops]),
                "all_removals_ms_p50": _median([o.get("allRemovalsTimeMs") for o in ops]),
                "rows_updated_p50": _median([o.get("numRowsUpdated") for o in ops]),
                "memory_used_bytes": op.get("memoryUsedBytes"),
                "custom_metrics_p50": {
                    k: _median([_numbers(o.get("customMetrics")).get(k) for o in ops]) for k in metrics
                },
            }
        )
    return out


def _median(values: list[Any]) -> float | None:
    nums = [float(v) for v in values if isinstance(v, (int, float))]
    return round(statistics.median(nums), 1) if nums else None


def state_variables(spark: Any, checkpoint: Path) -> list[Json]:
    """Each stateful operator's name and state variables as the state metadata lists them (names only: the
    stages' layout is theirs to change)."""
    out: list[Json] = []
    try:
        rows = spark.read.format("state-metadata").load(str(checkpoint)).collect()
    except Exception as exc:  # figures without names are still figures
        log(f"state metadata not readable: {exc}")
        return out
    for r in rows:
        try:  # {"stateVariables": [{"stateName": ..., "stateVariableType": ...}, ...]} for transformWithState
            props = json.loads(r.asDict().get("operatorProperties") or "{}")
        except ValueError:
            props = {}
        if not isinstance(props, dict):
            props = {}
        names = [
            f"{v.get('stateName')} ({v.get('stateVariableType')})"
            for v in props.get("stateVariables", [])
            if isinstance(v, dict)
        ]
        out.append(
            {"operator_id": int(r.operatorId), "operator_name": r.operatorName, "state_variables": names}
        )
    return out


def dead_letters(spark: Any, bootstrap: str, snapshot_topic: str, log_topic: str) -> Json:
    """The job's dead letters over everything written to its two inputs: a batch read through its own parse."""
    from streaming import sources

    def read(topic: str) -> Any:
        return (
            spark.read.format("kafka")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", topic)
            .option("startingOffsets", "earliest")
            .option("includeHeaders", "true")
            .load()
        )

    snap = sources.snapshot_dead_letters(sources.parse_snapshots(read(snapshot_topic), cluster=CLUSTER))
    coord = sources.coordinator_dead_letters(
        sources.decode_transaction_log(read(log_topic)), "transaction-log"
    )
    bad = [r.asDict() for r in snap.limit(5).collect()] + [r.asDict() for r in coord.limit(5).collect()]
    return {
        "snapshot_topic": snap.count(),
        "transaction_log": coord.count(),
        "examples": [str(b.get("error")) for b in bad],
    }


def last_batch_id(query: Any) -> int:
    last = query.lastProgress
    return -1 if last is None else int(last["batchId"])


def run_one(args: argparse.Namespace, n: int) -> Json:
    """One N: the log, the catch-up, the steady phase; in this process and its own Spark JVM."""
    from admin.collect.publish import ensure_topics
    from common.settings import KafkaSettings, Settings, StreamSettings
    from common.topics import TopicSettings
    from streaming import job
    from streaming.session import build_session

    run = f"s{uuid.uuid4().hex[:6]}"
    workdir = Path(tempfile.mkdtemp(prefix=f"txnwatch-bench-state-{n}-"))
    bootstrap = args.bootstrap
    log_topic, prefix = f"{run}.txnlog", run
    result: Json = {"ids": n, "loadavg_before": loadavg(), "workdir": str(workdir)}
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=60_000)
    try:
        admin.create_topics(
            [NewTopic(log_topic, args.log_partitions, 1, topic_configs={"cleanup.policy": "compact"})]
        )
    finally:
        admin.close()
    settings = Settings(
        cluster=CLUSTER,
        kafka=KafkaSettings(bootstrap_servers=bootstrap),
        topics=TopicSettings(prefix=prefix),
        stream=StreamSettings(
            checkpoint_location=str(workdir / "checkpoint"),
            master="local[2]",
            trigger=args.trigger,
            starting_offsets="earliest",
            state_buckets=args.state_buckets,
            coordinator_read_tasks=args.coordinator_read_tasks,
            transaction_log_topic=log_topic,
            metrics_port=0,
        ),
    )
    opts = job.StreamOptions(settings=settings, kafka_options={"bootstrap.servers": bootstrap})
    job.ensure_topics(opts, settings.kafka.client_kwargs())
    snapshot_topic = settings.topics.producer_state
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=60_000)
    try:  # the collector's topic, as `txnwatch collect` creates it
        ensure_topics(admin, {snapshot_topic: settings.collector.producer_state_topic})
    finally:
        admin.close()

    t0_ms = int(time.time() * 1000) - LOG_AGE_MS
    result["log"] = produce_log(
        bootstrap,
        log_topic,
        args.log_partitions,
        ((transactional_id(run, i), *compacted_record(run, args.seed, i, t0_ms)) for i in range(n)),
    )
    positions = Positions(bootstrap, log_topic, snapshot_topic)
    try:
        # The broker that leads the data partitions in the snapshots: the test bed's one node.
        leader = min(positions.wire.metadata([log_topic]).brokers)
        position = positions.measure(f"{run}-catchup", int(time.time() * 1000))
        positions.publish([], [], position)
    finally:
        positions.close()
    result["log"]["position_records"] = sum(position.end_offsets.values())

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = build_session(
        master="local[2]",
        app_name="txnwatch-bench-state",
        extra_conf={
            **job.spark_conf(),
            "spark.sql.shuffle.partitions": str(args.shuffle_partitions),
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
        },
    )
    spark.sparkContext.setLogLevel("ERROR")
    me = os.getpid()
    memory = Memory()
    feeder: subprocess.Popen[str] | None = None
    running = None
    try:
        log(
            f"[{n:,} ids] reconcile query from an empty checkpoint over {result['log']['position_records']:,} records"
        )
        began = time.monotonic()
        running = job.start(spark, opts, out=None, queries=("reconcile",))  # returns after the first batch
        (query,) = running.queries
        first_batch_s = time.monotonic() - began
        while True:
            lag = running.live.view_lag()
            if lag is not None and lag["current"]:
                break
            if running.failed():
                raise RuntimeError(running.failed())
            if time.monotonic() - began > args.catchup_budget_s:
                raise RuntimeError(f"the view was not current after {args.catchup_budget_s:.0f} s")
            memory.sample(me, set())
            time.sleep(0.25)
        result["catchup_s"] = round(time.monotonic() - began, 1)
        result["first_batch_s"] = round(first_batch_s, 1)
        log(f"[{n:,} ids] current after {result['catchup_s']} s; steady input for {args.steady_s:.0f} s")

        # The view turns current inside a batch's sink, before Spark posts that batch's progress: the steady
        # phase starts once the next progress is posted (that batch's, or one more).
        seen = last_batch_id(query)
        while last_batch_id(query) == seen:
            if time.monotonic() - began > args.catchup_budget_s:
                raise RuntimeError("no batch was posted after the view turned current")
            time.sleep(0.2)
        last_before = last_batch_id(query)
        files = StateFiles(workdir / "checkpoint" / RECONCILE / "state")
        files.added()  # what catch-up wrote is not the steady phase's
        feeder = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "benchmarks.bench_state",
                "--feed",
                "--bootstrap",
                bootstrap,
                "--ids",
                str(n),
                "--run",
                run,
                "--t0-ms",
                str(t0_ms),
                "--log-topic",
                log_topic,
                "--log-partitions",
                str(args.log_partitions),
                "--snapshot-topic",
                snapshot_topic,
                "--leader",
                str(leader),
                "--seed",
                str(args.seed),
                "--txn-per-s",
                str(args.txn_per_s),
                "--sweep-s",
                str(args.sweep_s),
                "--sweep-partitions",
                str(args.sweep_partitions),
                *(["--publish-all-partitions"] if args.publish_all_partitions else []),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        exclude = {feeder.pid}
        steady_began = time.monotonic()
        cpu_at: dict[int, dict[str, float]] = {}
        written: dict[int, dict[str, int]] = {}
        current_at: dict[int, bool] = {}
        kinds_seen: dict[str, int] = {}
        profilers: Profilers | None = None
        profile: Json | None = None
        profile_dir = None if args.profile is None else Path(args.profile or workdir / "profile")
        load_before = loadavg()
        while True:
            problem = running.failed()
            if problem:
                raise RuntimeError(problem)
            if feeder.poll() is not None:
                raise RuntimeError(f"the feeder exited early ({feeder.returncode})")
            memory.sample(me, exclude)
            last = query.lastProgress
            if last is not None and last["batchId"] > last_before and last["batchId"] not in cpu_at:
                b = last["batchId"]
                cpu_at[b] = tree_cpu_s(me, exclude)
                written[b] = files.added()
                lag = running.live.view_lag() or {}
                current_at[b] = bool(lag.get("current"))
                verdicts, _ = running.live.snapshot()
                for kind, count in Counter(v.kind for v in verdicts).items():
                    kinds_seen[kind] = max(kinds_seen.get(kind, 0), count)
                log(
                    f"[{n:,} ids] batch {b}: {last['numInputRows']:,} rows in {last['batchDuration'] / 1000:.1f} s, "
                    f"state written {sum(written[b].values()) / 1e6:.1f} MB, view current {current_at[b]}"
                )
                if profilers is not None:
                    profile = profilers.stop()
                    profilers = None
                    break
                enough = len(cpu_at) >= args.warmup_batches + 2  # at least two steady batches
                if time.monotonic() - steady_began >= args.steady_s and enough:
                    if profile_dir is None:
                        break
                    # The next batch is profiled, never one of the measured ones.
                    profilers = Profilers(profile_dir, f"state-{n}", me, set())
            if time.monotonic() - steady_began > args.steady_s + 300:
                log(f"[{n:,} ids] no batch ended in the 300 s after the steady phase: stopping")
                break
            time.sleep(0.2)
        load_after = loadavg()
        feeder.send_signal(signal.SIGTERM)
        try:
            out, _ = feeder.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            log(f"[{n:,} ids] the feeder did not stop in 120 s: killed (its figures may be missing)")
            feeder.kill()
            out, _ = feeder.communicate(timeout=30)
        lines = [line for line in (out or "").splitlines() if line.startswith("{")]
        result["feeder"] = json.loads(lines[-1]) if lines else None
        feeder = None
        progress = [json.loads(p.json) for p in query.recentProgress]
        running.stop()
        running = None
        ran = [p for p in progress if p["batchId"] > last_before and p["batchId"] in cpu_at]
        warm, steady = ran[: args.warmup_batches], ran[args.warmup_batches :]
        if profile is not None and steady:
            steady = steady[:-1]  # the profiled batch
        if not warm or not steady:
            raise RuntimeError(f"too few batches in the steady phase: {len(ran)}")
        durations = [p["batchDuration"] / 1000 for p in steady]
        keys = sorted({k for p in steady for k in p.get("durationMs", {})})
        begin, end = cpu_at[warm[-1]["batchId"]], cpu_at[steady[-1]["batchId"]]
        cpu = {k: round((end[k] - begin[k]) / len(steady), 2) for k in end}
        per_batch = [written[p["batchId"]] for p in steady]
        totals: dict[str, int] = {}
        for w in per_batch:
            for k, v in w.items():
                totals[k] = totals.get(k, 0) + v
        trigger_s = trigger_seconds(args.trigger)
        state_vars = state_variables(spark, workdir / "checkpoint" / RECONCILE)
        result.update(
            steady_batches=len(steady),
            warmup_batches=len(warm),
            trigger_s=trigger_s,
            batch_s=[round(d, 2) for d in durations],
            batch_s_p50=round(statistics.median(durations), 2),
            batch_s_p99=round(percentile(durations, 99), 2),
            p99_under_trigger=percentile(durations, 99) < trigger_s,
            input_rows_per_batch_p50=statistics.median(p["numInputRows"] for p in steady),
            duration_ms_median={
                k: statistics.median(p["durationMs"].get(k, 0) for p in steady) for k in keys
            },
            state_operators=operator_figures(steady, ran[-1]),
            state_layout=state_vars,
            rows_in_state=sum(int(op.get("numRowsTotal") or 0) for op in ran[-1].get("stateOperators", [])),
            cpu_s_per_batch=cpu,
            cpu_s_per_batch_total=round(sum(cpu.values()), 2),
            checkpoint_bytes_method=(
                "the query checkpoint's state directory listed after every batch: files first seen (or grown) in "
                "a listing count for that batch; per batch = the steady batches' total / their number"
            ),
            checkpoint_bytes_per_batch=round(sum(totals.values()) / len(steady)),
            checkpoint_bytes_per_batch_by_kind={k: round(v / len(steady)) for k, v in sorted(totals.items())},
            checkpoint_bytes_per_batch_p50=statistics.median(sum(w.values()) for w in per_batch),
            checkpoint_bytes_per_batch_max=max(sum(w.values()) for w in per_batch),
            memory=memory.figures(),
            view_current_after_batches=f"{sum(current_at[p['batchId']] for p in steady)}/{len(steady)}",
            verdict_kinds_max=kinds_seen,
            profile=profile,
            loadavg_steady_before=load_before,
            loadavg_steady_after=load_after,
        )
        result["dead_letters"] = dead_letters(spark, bootstrap, snapshot_topic, log_topic)
    finally:
        if feeder is not None:
            feeder.kill()
            feeder.wait(timeout=30)
        if running is not None:
            running.stop()
        spark.stop()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    result["loadavg_after"] = loadavg()
    return result


# ------------------------------------------------------------------------------------------ all N


def growth(results: list[Json]) -> Json:
    """From the smallest N to the largest: the ratios the goal (at most 1.5x from 10k to 1M ids) is about."""
    done = sorted((r for r in results if r.get("batch_s_p50")), key=lambda r: r["ids"])
    if len(done) < 2:
        return {}
    lo, hi = done[0], done[-1]

    def ratio(key: str) -> float | None:
        return round(hi[key] / lo[key], 2) if lo.get(key) and hi.get(key) is not None else None

    return {
        "from_ids": lo["ids"],
        "to_ids": hi["ids"],
        "batch_s_p50": ratio("batch_s_p50"),
        "batch_s_p99": ratio("batch_s_p99"),
        "checkpoint_bytes_per_batch": ratio("checkpoint_bytes_per_batch"),
        "goal_at_most": 1.5,
    }


def run_child(args: argparse.Namespace, n: int, bootstrap: str) -> Json:
    command = [
        sys.executable,
        "-m",
        "benchmarks.bench_state",
        "--one",
        str(n),
        "--bootstrap",
        bootstrap,
        *args.passthrough,
    ]
    done = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        log(f"[{n:,} ids] failed (exit {done.returncode})")
        return {"ids": n, "error": f"exit {done.returncode}"}
    one: Json = json.loads(lines[-1])
    return one


def print_table(results: list[Json]) -> None:
    print(
        f"\n{'ids':>9} {'catch-up s':>10} {'p50 s':>6} {'p99 s':>6} {'rows/batch':>10} {'CPU s/batch':>11} "
        f"{'ckpt MB/batch':>13} {'JVM MB':>7} {'worker MB':>9} {'state rows':>10} {'dead':>5}"
    )
    for r in results:
        if "error" in r:
            print(f"{r['ids']:>9,} {r['error']}")
            continue
        dead = r.get("dead_letters") or {}
        print(
            f"{r['ids']:>9,} {r['catchup_s']:>10} {r['batch_s_p50']:>6} {r['batch_s_p99']:>6} "
            f"{r['input_rows_per_batch_p50']:>10,} {r['cpu_s_per_batch_total']:>11} "
            f"{r['checkpoint_bytes_per_batch'] / 1e6:>13.2f} {r['memory']['spark_jvm_peak_rss_mb']:>7} "
            f"{r['memory']['python_worker_peak_rss_mb']:>9} {r['rows_in_state']:>10,} "
            f"{dead.get('snapshot_topic', 0) + dead.get('transaction_log', 0):>5}"
        )
    print()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_state",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--ids", default="10000,100000,1000000", help="comma-separated transactional id counts")
    p.add_argument("--log-partitions", type=int, default=50, help="Kafka's default for __transaction_state")
    p.add_argument("--steady-s", type=float, default=180.0, help="seconds of steady input per N")
    p.add_argument("--txn-per-s", type=float, default=200.0, help="steady transactions per second")
    p.add_argument("--sweep-s", type=float, default=10.0, help="seconds between collector sweeps")
    p.add_argument("--sweep-partitions", type=int, default=1_000, help="data partitions a sweep covers")
    p.add_argument(
        "--publish-all-partitions",
        action="store_true",
        help="a snapshot of every swept partition each sweep (the collector publishes only open and just-closed)",
    )
    p.add_argument("--warmup-batches", type=int, default=2, help="steady-phase batches left out (>= 1)")
    p.add_argument("--trigger", default="5 seconds", help="the reconcile trigger (the job's default)")
    p.add_argument("--state-buckets", type=int, default=32, help="the job's --state-buckets")
    p.add_argument(
        "--coordinator-read-tasks",
        type=int,
        default=0,
        help="the job's --coordinator-read-tasks (0: the cores; the log's partition count: one task per partition)",
    )
    p.add_argument(
        "--shuffle-partitions", type=int, default=4, help="spark.sql.shuffle.partitions (the job's 4)"
    )
    p.add_argument("--catchup-budget-s", type=float, default=1_200.0, help="give up on a catch-up after this")
    p.add_argument(
        "--profile",
        nargs="?",
        const="",
        metavar="DIR",
        help="profile one more batch after the steady ones (py-spy, JFR; bench_stream.Profilers)",
    )
    p.add_argument("--heap", default="1g", help="broker heap")
    p.add_argument("--bootstrap", help="use this running broker instead of starting a test bed")
    p.add_argument("--keep", action="store_true", help="keep each N's checkpoint (temporary directory)")
    p.add_argument("--seed", type=int, default=7)
    # internal: one N in a process of its own, and the feeder
    p.add_argument("--one", type=int, help=argparse.SUPPRESS)
    p.add_argument("--feed", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--run", help=argparse.SUPPRESS)
    p.add_argument("--t0-ms", type=int, help=argparse.SUPPRESS)
    p.add_argument("--log-topic", help=argparse.SUPPRESS)
    p.add_argument("--snapshot-topic", help=argparse.SUPPRESS)
    p.add_argument("--leader", type=int, default=1, help=argparse.SUPPRESS)
    return p


# What the parent hands to each N's process unchanged.
PASSTHROUGH = (
    "--log-partitions",
    "--steady-s",
    "--txn-per-s",
    "--sweep-s",
    "--sweep-partitions",
    "--warmup-batches",
    "--trigger",
    "--state-buckets",
    "--coordinator-read-tasks",
    "--shuffle-partitions",
    "--catchup-budget-s",
    "--seed",
)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)
    if args.warmup_batches < 1:
        parser().error("--warmup-batches must be at least 1 (the feeder's first records arrive mid-trigger)")
    if args.feed:
        args.ids = int(args.ids)
        return feed(args)
    if args.one is not None:
        print(json.dumps(run_one(args, args.one)), flush=True)
        return 0

    ids = [int(x) for x in args.ids.split(",")]
    args.passthrough = [
        x for k in PASSTHROUGH for x in (k, str(getattr(args, k.lstrip("-").replace("-", "_"))))
    ]
    args.passthrough += [
        f for f in ("--publish-all-partitions", "--keep") if getattr(args, f[2:].replace("-", "_"))
    ]
    if args.profile is not None:
        args.passthrough += ["--profile", args.profile] if args.profile else ["--profile"]
    began = time.monotonic()
    result: Json = {
        "benchmark": "bench_state",
        "command": "python -m benchmarks.bench_state " + " ".join(argv),
        "machine": machine(),
        "master": "local[2]",
        "settings": {
            "log_partitions": args.log_partitions,
            "steady_s": args.steady_s,
            "txn_per_s": args.txn_per_s,
            "sweep_s": args.sweep_s,
            "sweep_partitions": args.sweep_partitions,
            "publish_all_partitions": args.publish_all_partitions,
            "trigger": args.trigger,
            "state_buckets": args.state_buckets,
            "coordinator_read_tasks": args.coordinator_read_tasks,
            "shuffle_partitions": args.shuffle_partitions,
            "warmup_batches": args.warmup_batches,
        },
        "loadavg_start": loadavg(),
    }
    workdir = Path(tempfile.mkdtemp(prefix="txnwatch-bench-state-"))
    state_dir = workdir / "testbed"
    started_bed = False
    results: list[Json] = []
    try:
        if args.bootstrap:
            bootstrap = args.bootstrap
        else:
            log(f"starting a one-node test bed (heap {args.heap}) in {state_dir} (load {loadavg()})")
            bootstrap = start_cluster(TestBedConfig(heap=args.heap), state_dir).bootstrap_servers
            started_bed = True
        for n in ids:
            one_began = time.monotonic()
            results.append(run_child(args, n, bootstrap))
            results[-1]["wall_s"] = round(time.monotonic() - one_began, 1)
    finally:
        if started_bed:
            stop_cluster(state_dir)
        shutil.rmtree(workdir, ignore_errors=True)
    result.update(
        per_ids=results,
        growth=growth(results),
        loadavg_end=loadavg(),
        total_s=round(time.monotonic() - began, 1),
    )
    print_table(results)
    print(json.dumps(result))
    return 0 if results and all("error" not in r for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
