"""Sustained throughput of the streaming job's reconcile query (local[2]) on a real broker, one input at a time.

`python -m benchmarks.bench_stream [--only coordinator|snapshot|both] [--coordinator-batch 10000]
[--snapshot-batch 5000] [--trigger "5 seconds"] [--steady-batches 6] [--phase-budget-s 210] [--plain-read]
[--profile [DIR]] [--log-partitions 50] [--snapshot-without-coordinator]` starts its own test bed (one KRaft
node, 512 MB heap, in a temporary directory) and produces real-shaped input with kafka-python. It then runs
`streaming.job.start(..., queries=("reconcile",))` once per input on one SparkSession built as `txnwatch stream`
builds it (`streaming.session.build_session` with `streaming.job.spark_conf()`, `spark.sql.shuffle.partitions`
4, the job's 32 state buckets and its other defaults), each time over a backlog and with a fresh checkpoint. The
transaction log topics have Kafka's 50 partitions of `__transaction_state` (`--log-partitions`):

- coordinator: `__transaction_state` bytes from detectors.codec: Empty -> Ongoing -> PrepareCommit ->
  CompleteCommit, with the TV2 epoch bump, 1-3 topics x 1-4 partitions and ClientTransactionVersion 2. They go to a
  normal topic that the job reads through `transaction_log_topic` (clients cannot write __transaction_state). The
  snapshot topic is empty.
- snapshot: PartitionSnapshot JSON (header txnwatch.type=partition-snapshot, key "topic-partition") for many
  partitions with 1-2 open transactions each, sweep after sweep, and after each sweep the collector's
  CoordinatorLogPosition of the phase's own transaction log topic. That log holds, written before the first
  sweep at the partition Kafka's coordinator would use, one Ongoing record per producer id of the snapshots that
  lists every partition the producer id is open on, with a timeout longer than the run: every transaction is its
  coordinator's own open transaction and stays OPEN, as on a real cluster. `--snapshot-without-coordinator`: no
  such record and no position (the input before), so every transaction seen past the grace is a withheld
  would-be HANGING (UNCONFIRMED, no-coordinator-state), explained with the models.

`maxOffsetsPerTrigger` bounds every batch, so with a backlog every batch is full and starts as soon as the previous
one ends. The figures come from `query.recentProgress`:

- rows/s per batch (numInputRows / batchDuration);
- sustained rows/s: rows / batch time over the steady batches, i.e. the data batches after the warm-up ones,
  without a short tail batch;
- batch duration p50/p99 and the median durationMs breakdown.

Alongside them it measures:

- the CPU seconds of the driver, Spark's JVM and its Python workers over the steady batches (/proc; this
  depends far less than the wall clock on whatever else the machine runs);
- per stateful stage: the rows, RocksDB memory, the checkpoint's state directory, and the entries and bytes of
  each state variable (`variable_figures`), read back with the state data source after the query stops.

`--plain-read` adds, after each input's reconcile query, the limit on the same cores: the same topic read from the
start on the same session, with the same maxOffsetsPerTrigger and trigger, by Spark's Kafka source alone into a
noop sink ("plain read"), and for snapshots also through the job's own parse (`sources.parse_snapshots`: from_json
with the snapshot schema and the problem checks) into a noop sink ("parse"). The same figures come out for them,
and every query's sustained rate as a share of its input's plain read (`share_of_plain_read`).

`--profile` profiles one more batch after the steady ones of each reconcile query (never a measured one): py-spy
on Spark's Python workers and a JFR recording of Spark's JVM. The JSON gets the share of each part of the work
(PY_PARTS, JVM_PARTS) and the top frames; the raw files stay in DIR (default: the temporary directory, kept
with --keep).

Every phase stops by itself, when the input is consumed, when there are enough steady batches, or at its time
budget. The whole run takes 4-7 minutes, 3-4 more with --plain-read. Stopping a query mid-batch makes Spark log an InterruptedException from
the sink: expected. The output is a table and one JSON line (the last line of stdout).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pickle
import platform
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.admin import NewTopic
from kafka.structs import TopicPartition

from common.settings import KafkaSettings, Settings, StreamSettings
from common.topics import TopicSettings
from detectors.codec import TxnLogKey, TxnLogValue, TxnStatus, encode_key, encode_value
from detectors.contract import COORDINATOR_LOG_POSITION_TYPE, TYPE_HEADER, position_key
from detectors.currency import coordinator_partition
from detectors.models import CoordinatorLogPosition, OpenTransaction, PartitionSnapshot
from dev.kafka import TestBedConfig, start_cluster, stop_cluster

Json = dict[str, Any]
TARGET_ROWS_PER_S = 20_000
TARGET_STATE_BYTES_PER_ID = 1024
DATA_TOPICS = ["orders", "payments-eu", "inventory.events", "clickstream-v2", "billing", "shipments.dlq"]
SNAPSHOT_HEADERS = [("txnwatch.type", b"partition-snapshot")]
RECONCILE = "txnwatch-reconcile"
SWEEP_INTERVAL_MS = 5_000  # between two sweeps of the snapshot input


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def trigger_seconds(trigger: str) -> float:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|millisecond|milliseconds|s|second|seconds)\s*", trigger)
    if not m:
        raise SystemExit(f"--trigger: expected e.g. '5 seconds' or '500 ms', got {trigger!r}")
    value = float(m.group(1))
    return value / 1000 if m.group(2).startswith("m") else value


# ------------------------------------------------------------------------------------------ input


def _partitions(rng: random.Random) -> tuple[tuple[str, tuple[int, ...]], ...]:
    topics = sorted(rng.sample(DATA_TOPICS, rng.randint(1, 3)))
    return tuple((t, tuple(sorted(rng.sample(range(64), rng.randint(1, 4))))) for t in topics)


def coordinator_lifecycle(
    rng: random.Random,
    transactional_id: str,
    producer_id: int,
    txns: int,
    t0_ms: int,
    *,
    stable_partitions: bool = False,
) -> list[tuple[bytes, bytes]]:
    """What a 4.3 coordinator writes for one TV2 transactional id: Empty at InitProducerId, then per
    transaction Ongoing (epoch e), PrepareCommit and CompleteCommit (epoch e+1: TV2 bumps it at EndTxn).
    `stable_partitions`: every transaction writes the same partitions (a Kafka Streams thread's tasks), else each
    draws its own."""
    key = encode_key(TxnLogKey(transactional_id))
    epoch = rng.randint(0, 200)
    timeout = rng.choice((60_000, 30_000, 900_000))
    now = t0_ms

    def value(status: TxnStatus, parts: Any, start: int) -> bytes:
        return encode_value(
            TxnLogValue(
                version=1,
                producer_id=producer_id,
                producer_epoch=epoch,
                transaction_timeout_ms=timeout,
                status=status,
                partitions=parts,
                last_update_timestamp_ms=now,
                start_timestamp_ms=start,
                previous_producer_id=producer_id,
                client_transaction_version=2,
            )
        )

    out = [(key, value(TxnStatus.EMPTY, None, -1))]
    stable = _partitions(rng) if stable_partitions else None
    for _ in range(txns):
        now += rng.randint(1, 50)
        start = now
        parts = stable or _partitions(rng)
        out.append((key, value(TxnStatus.ONGOING, parts, start)))
        now += rng.randint(5, 2_000)
        epoch += 1
        out.append((key, value(TxnStatus.PREPARE_COMMIT, parts, start)))
        now += rng.randint(1, 20)
        out.append((key, value(TxnStatus.COMPLETE_COMMIT, (), start)))
    return out


def coordinator_records(
    ids: int, txns_per_id: int, concurrent: int, seed: int, run: str, *, stable_partitions: bool = False
) -> Iterator[tuple[bytes, bytes]]:
    """Lifecycles of `ids` transactional ids; `concurrent` of them interleave in log order at any time."""
    rng = random.Random(seed)
    t0 = int(time.time() * 1000) - 3_600_000
    for first in range(0, ids, concurrent):
        chunk = [
            coordinator_lifecycle(
                rng,
                f"{run}-app-{i:07d}",
                1_000 + i,
                txns_per_id,
                t0 + i * 5,
                stable_partitions=stable_partitions,
            )
            for i in range(first, min(ids, first + concurrent))
        ]
        # Round-robin over the chunk's lifecycles: each id's records stay in order, ids interleave.
        for step in range(1 + 3 * txns_per_id):
            for lifecycle in chunk:
                yield lifecycle[step]


# A producer id writes to the partitions of a few neighbouring partition groups only (as a real producer writes
# to a few topics' partitions), so its coordinator record lists at most PRODUCERS_PER_PARTITION x 3 partitions.
PRODUCERS_PER_PARTITION = 4
PRODUCER_ID_BASE = 10_000
Record = tuple[bytes, bytes] | tuple[bytes, bytes, list[tuple[str, bytes]]]


def snapshot_partitions(partitions: int) -> list[tuple[str, int]]:
    """The (topic, partition) the snapshots describe, by index."""
    return [(DATA_TOPICS[i % len(DATA_TOPICS)], i // len(DATA_TOPICS)) for i in range(partitions)]


def producers_of_partition(i: int, producers: int) -> list[int]:
    """The producer ids whose transactions may be open on the partition of index `i`."""
    return [PRODUCER_ID_BASE + (i // 3 + j) % producers for j in range(PRODUCERS_PER_PARTITION)]


def producer_epoch(producer_id: int) -> int:
    """One epoch per producer id (a producer's transactions here are one long transaction of its coordinator)."""
    return producer_id % 50


def snapshot_records(
    partitions: int,
    sweeps: int,
    producers: int,
    sweep_interval_ms: int,
    seed: int,
    run: str,
    *,
    t0_ms: int | None = None,
    max_timeout_ms: int = 900_000,
    after_sweep: Callable[[str, int], Record] | None = None,
) -> Iterator[Record]:
    """PartitionSnapshot JSON, one per partition per sweep: 1-2 open transactions each, every transaction open
    for 1-3 sweeps (then a new one starts further on), producer ids drawn from a pool smaller than the partition
    count (`producers_of_partition`), so one producer id is open on several partitions (what stage 2 keys by).
    `after_sweep(sweep_id, as_of_ms)`, if given, adds one record after each sweep's snapshots (the collector's
    position), stamped after every snapshot of the sweep."""
    rng = random.Random(seed)
    tps = snapshot_partitions(partitions)
    # The sweeps end now, as a backlog does: observed_at in the future would keep every transaction from
    # expiring (the job expires on processing time), and the open state would only grow.
    t0 = int(time.time() * 1000) - sweeps * sweep_interval_ms if t0_ms is None else t0_ms
    # per partition: list of [producer_id, epoch, start_offset, start_ms, sweeps_left]
    slots: list[list[list[int]]] = [[] for _ in tps]
    next_offset = [rng.randint(0, 10_000) for _ in tps]
    for sweep in range(sweeps):
        observed = t0 + sweep * sweep_interval_ms
        sweep_id = f"{run}-{sweep + 1}"
        for i, (topic, partition) in enumerate(tps):
            live = [s for s in slots[i] if s[4] > 0]
            want = rng.randint(1, 2) if not live else len(live)
            used = {s[0] for s in live}
            candidates = producers_of_partition(i, producers)
            while len(live) < want:
                pid = rng.choice(candidates)
                if pid in used:
                    continue
                used.add(pid)
                next_offset[i] += rng.randint(1, 500)
                live.append(
                    [
                        pid,
                        producer_epoch(pid),
                        next_offset[i],
                        observed - rng.randint(50, 3_000),
                        rng.randint(1, 3),
                    ]
                )
            slots[i] = live
            hw = next_offset[i] + rng.randint(1, 300)
            snap = PartitionSnapshot(
                cluster="bench",
                sweep_id=sweep_id,
                observed_at_ms=observed + rng.randint(0, 500),
                leader=1,
                topic=topic,
                partition=partition,
                open_transactions=tuple(
                    OpenTransaction(
                        producer_id=s[0],
                        producer_epoch=s[1],
                        coordinator_epoch=0,
                        start_offset=s[2],
                        start_timestamp_ms=s[3],
                        start_batch_producer_epoch=s[1],
                        last_sequence=rng.randint(0, 5_000),
                        last_timestamp_ms=observed - rng.randint(0, 50),
                    )
                    for s in sorted(live, key=lambda s: s[2])
                ),
                last_stable_offset=min(s[2] for s in live),
                high_watermark=hw,
                max_transaction_timeout_ms=max_timeout_ms,
            )
            yield f"{topic}-{partition}".encode(), snap.model_dump_json().encode()
            for s in live:
                s[4] -= 1
        if after_sweep is not None:
            yield after_sweep(sweep_id, observed + 1_000)


def snapshot_coordinator_records(
    partitions: int, producers: int, start_ms: int, timeout_ms: int, run: str
) -> Iterator[tuple[str, bytes, bytes]]:
    """(transactional id, key, value): for each producer id of the snapshots, one Ongoing TV2 record that lists
    every partition the producer id may be open on, started before the first sweep, with a timeout longer than
    the run. So every transaction of the snapshots is its coordinator's own open transaction, as on a real
    cluster, and its verdict is OPEN (detectors.rules.decide: Ongoing, current producer id, partition listed)."""
    tps = snapshot_partitions(partitions)
    listed: dict[int, set[tuple[str, int]]] = {}
    for i, tp in enumerate(tps):
        for pid in producers_of_partition(i, producers):
            listed.setdefault(pid, set()).add(tp)
    for pid, tp_set in sorted(listed.items()):
        tid = f"{run}-snap-{pid}"
        by_topic: dict[str, list[int]] = {}
        for topic, partition in sorted(tp_set):
            by_topic.setdefault(topic, []).append(partition)
        value = TxnLogValue(
            version=1,
            producer_id=pid,
            producer_epoch=producer_epoch(pid),
            transaction_timeout_ms=timeout_ms,
            status=TxnStatus.ONGOING,
            partitions=tuple((t, tuple(ps)) for t, ps in by_topic.items()),
            last_update_timestamp_ms=start_ms,
            start_timestamp_ms=start_ms,
            previous_producer_id=pid,
            client_transaction_version=2,
        )
        yield tid, encode_key(TxnLogKey(tid)), encode_value(value)


def produce_to_coordinator_partitions(
    bootstrap: str, topic: str, partitions: int, records: Iterator[tuple[str, bytes, bytes]]
) -> dict[int, int]:
    """Write coordinator records where Kafka's coordinator would (`coordinator_partition` of the transactional
    id: the job's currency checks that partition); returns the topic's end offsets after them."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=20)
    n = 0
    try:
        for tid, key, value in records:
            producer.send(topic, key=key, value=value, partition=coordinator_partition(tid, partitions))
            n += 1
        producer.flush(timeout=300)
    finally:
        producer.close(timeout=30)
    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        ends = consumer.end_offsets([TopicPartition(topic, p) for p in range(partitions)])
    finally:
        consumer.close()
    log(f"wrote {n:,} Ongoing coordinator records for the snapshots' producer ids to {topic}")
    return {tp.partition: offset for tp, offset in ends.items()}


def position_record(
    log_topic: str, partitions: int, end_offsets: dict[int, int]
) -> Callable[[str, int], Record]:
    """The collector's `CoordinatorLogPosition` after a sweep, for `snapshot_records(after_sweep=...)`: the
    coordinator records were all written before the first sweep, so every sweep's position has the same ends."""

    def after_sweep(sweep_id: str, as_of_ms: int) -> Record:
        position = CoordinatorLogPosition(
            cluster="bench",
            sweep_id=sweep_id,
            topic=log_topic,
            partitions=partitions,
            as_of_ms=as_of_ms,
            end_offsets=end_offsets,
        )
        return (
            position_key(log_topic),
            position.model_dump_json().encode(),
            [(TYPE_HEADER, COORDINATOR_LOG_POSITION_TYPE.encode())],
        )

    return after_sweep


def produce(bootstrap: str, topic: str, records: Iterator[Record], headers: Any = None) -> Json:
    """Write `records` to `topic`: (key, value) with `headers`, or (key, value, their own headers)."""
    producer = KafkaProducer(
        bootstrap_servers=bootstrap,
        acks=1,
        linger_ms=20,
        batch_size=512 * 1024,
        max_request_size=4 * 1024 * 1024,
    )
    began = time.monotonic()
    n = size = 0
    try:
        for key, value, *own in records:
            producer.send(topic, key=key, value=value, headers=own[0] if own else headers)
            n += 1
            size += len(key) + len(value)
        producer.flush(timeout=300)
    finally:
        producer.close(timeout=30)
    elapsed = time.monotonic() - began
    log(f"produced {n:,} records ({size / 1e6:.1f} MB) to {topic} in {elapsed:.1f}s ({n / elapsed:,.0f}/s)")
    return {"records": n, "bytes": size, "seconds": round(elapsed, 1), "mean_record_bytes": round(size / n)}


# ------------------------------------------------------------------------------------------ phases


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (the p99 of fewer than 100 batches is their maximum)."""
    s = sorted(values)
    return s[max(0, math.ceil(q / 100 * len(s)) - 1)]


def end_offset_total(progress: Json, topic: str) -> int:
    total = 0
    for src in progress.get("sources", []):
        end = src.get("endOffset")
        if isinstance(end, str):
            end = json.loads(end)
        if isinstance(end, dict) and topic in end:
            total += sum(int(v) for v in end[topic].values())
    return total


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


_TICKS = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[str, int, float] | None:
    """(command, parent pid, CPU seconds of the process itself) from /proc/<pid>/stat."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    f = raw[raw.rindex(")") + 2 :].split()
    return raw[raw.index("(") + 1 : raw.rindex(")")], int(f[1]), sum(int(x) for x in f[11:13]) / _TICKS


# Every process of the tree ever sampled, with its last CPU: Python workers come and go (a query's workers exit
# when it stops), and a parent's "children" time would count them under whoever reaped them.
_SEEN: dict[int, tuple[str, float]] = {}


def tree_cpu_s(root: int, exclude: set[int]) -> dict[str, float]:
    """CPU seconds used so far by `root` (this driver) and its descendants, by kind: Spark's JVM ("jvm"), the
    Python workers it forks ("python_workers") and this process ("driver"); without the subtrees in `exclude`
    (the broker JVM, which this process also started). A process that exited keeps the CPU of its last sample
    (sampled once per batch: what it used after that is lost, at most one batch of one worker)."""
    stats: dict[int, tuple[str, int, float]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and (st := _stat(int(d.name))) is not None:
            stats[int(d.name)] = st
    children: dict[int, list[int]] = {}
    for pid, (_, ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    todo = [root]
    while todo:
        pid = todo.pop()
        if pid in exclude or pid not in stats:
            continue
        comm, _, cpu = stats[pid]
        _SEEN[pid] = ("driver" if pid == root else "jvm" if comm == "java" else "python_workers", cpu)
        todo.extend(children.get(pid, []))
    out = {"jvm": 0.0, "python_workers": 0.0, "driver": 0.0}
    for kind, cpu in _SEEN.values():
        out[kind] += cpu
    return out


# The stateful stages' state variables (streaming/reconcile.py): stage 1 keeps an owner per transactional id
# (map state), stage 2 a view per producer id in one of two maps and small per-bucket values (pickled blobs).
# "owners" and "views" are the one-dict-per-bucket values of earlier releases (empty once migrated).
STAGE1_IDS = ("owner", "owners")
STAGE2_VIEWS = ("views_kept", "views_expiring", "views")


def _variables(props: str) -> list[tuple[str, str]]:
    """(name, type) of each state variable the state metadata lists for a transformWithState operator."""
    try:
        parsed = json.loads(props or "{}")
    except ValueError:
        return []
    if not isinstance(parsed, dict):
        return []
    return [
        (str(v.get("stateName")), str(v.get("stateVariableType")))
        for v in parsed.get("stateVariables", [])
        # Spark's own variables ("$procTimers_keyToTimestamp", ...) are not the stages' state
        if isinstance(v, dict) and v.get("stateName") and not str(v.get("stateName")).startswith("$")
    ]


def variable_figures(spark: Any, checkpoint: Path, op_id: int, var: str) -> Json:
    """One state variable read back with the state data source: its entries and the bytes of what it holds.
    A map's entries are its keys (ids); its bytes are the stored columns as JSON (a measure of the payload, not
    RocksDB's encoding). A blob value (a pickled object per bucket) counts the entries of the unpickled
    object and the pickle's bytes."""
    from pyspark.sql import functions as F

    df = (
        spark.read.format("statestore")
        .option("operatorId", op_id)
        .option("stateVarName", var)
        .load(str(checkpoint))
    )
    if "user_map_value" in df.columns:
        row = df.select(
            F.count(F.lit(1)).alias("n"),
            F.sum(
                F.octet_length(F.to_json(F.col("user_map_key")))
                + F.octet_length(F.to_json(F.col("user_map_value")))
            ).alias("b"),
        ).first()
        n, b, buckets = int(row.n or 0), int(row.b or 0), None
    else:
        buckets = n = b = 0
        value_fields = df.schema["value"].dataType.fieldNames() if "value" in df.columns else []
        # One bucket at a time (toLocalIterator): the driver need not hold every bucket's pickle at once.
        for r in df.select("value").toLocalIterator():
            buckets += 1
            if value_fields == ["blob"]:
                blob = bytes(r.value.blob)
                loaded = pickle.loads(blob)
                n += len(loaded) if hasattr(loaded, "__len__") else 1
                b += len(blob)
            else:
                n += 1
    return {
        "buckets": buckets,
        "rows": n,
        "payload_bytes": b,
        "payload_bytes_per_row": round(b / n, 1) if n else None,
    }


def state_figures(spark: Any, checkpoint: Path, last: Json) -> list[Json]:
    """Per stateful stage, after the query stopped: rows and RocksDB bytes from the last progress
    (numRowsTotal, memoryUsedBytes, customMetrics.rocksdbSstFileSize), the checkpoint's state directory, and
    each state variable read back with the state data source (`variable_figures`)."""
    names: dict[int, str] = {}
    variables_of: dict[int, list[tuple[str, str]]] = {}
    for r in spark.read.format("state-metadata").load(str(checkpoint)).collect():
        props = r.asDict().get("operatorProperties") or ""
        found = _variables(props)
        variables_of[int(r.operatorId)] = found
        var_names = {name for name, _ in found}
        names[int(r.operatorId)] = (
            "stage1 (transactional id)"
            if var_names & set(STAGE1_IDS)
            else "stage2 (producer id)"
            if var_names & set(STAGE2_VIEWS)
            else r.operatorName
        )
    out = []
    # The progress lists the stateful operators in operator id order (stage 2 is operator 0: it is planned
    # first, on top of stage 1); the state metadata names them.
    for op_id, op in enumerate(last.get("stateOperators", [])):
        stage = names.get(op_id, f"operator {op_id}")
        rows = int(op.get("numRowsTotal") or 0)
        cm = op.get("customMetrics") or {}
        state_dir = checkpoint / "state" / str(op_id)
        ck_bytes = dir_bytes(state_dir) if state_dir.exists() else 0
        sst = int(cm.get("rocksdbSstFileSize") or 0)
        mem = int(op.get("memoryUsedBytes") or 0)
        variables: dict[str, Json] = {}
        for var, kind in variables_of.get(op_id, []):
            try:
                variables[var] = variable_figures(spark, checkpoint, op_id, var) | {"type": kind}
            except Exception as exc:  # a variable the reader cannot read leaves the others' figures
                log(f"state variable {var} of operator {op_id} not readable: {str(exc).splitlines()[0]}")
        out.append(
            {
                "operator_id": op_id,
                "stage": stage,
                "rows": rows,
                "variables": variables,
                "memory_used_bytes": mem,
                "rocksdb_sst_bytes": sst,
                "checkpoint_dir_bytes": ck_bytes,
                "memory_bytes_per_row": round(mem / rows, 1) if rows else None,
                "checkpoint_bytes_per_row": round(ck_bytes / rows, 1) if rows else None,
                "all_updates_ms": op.get("allUpdatesTimeMs"),
                "commit_ms": op.get("commitTimeMs"),
                "rocksdb_get_count": cm.get("rocksdbGetCount"),
                "rocksdb_put_count": cm.get("rocksdbPutCount"),
                "timers": {
                    k: cm.get(k) for k in ("numRegisteredTimers", "numDeletedTimers", "numExpiredTimers")
                },
            }
        )
    return out


# What each phase runs over the same input topic, on the same session, with the same maxOffsetsPerTrigger and
# trigger: the reconcile query (the job), or a noop sink behind Spark's Kafka source alone ("plain read": the
# limit any query of that topic has on these cores) or behind the job's snapshot parse (`sources.parse_snapshots`
# and `good_snapshots_and_positions`: header filter, from_json with PARTITION_SNAPSHOT_SCHEMA, the problem checks).
STAGES = ("reconcile", "plain read", "parse")


def start_noop(
    spark: Any, *, stage: str, bootstrap: str, input_topic: str, batch: int, trigger: str, checkpoint: Path
) -> Any:
    """A query of `input_topic` into Spark's noop sink: the Kafka source as the job reads it (its own
    `read_kafka`, the same options), and for "parse" the job's snapshot parse on top."""
    from streaming import sources

    raw = sources.read_kafka(
        spark,
        sources.KafkaSource(
            topic=input_topic,
            options={"kafka.bootstrap.servers": bootstrap},
            starting_offsets="earliest",
            max_offsets_per_trigger=batch,
        ),
    )
    df = raw if stage == "plain read" else sources.good_snapshots_and_positions(sources.parse_snapshots(raw))
    return (
        df.writeStream.queryName(f"bench-{stage.replace(' ', '-')}")
        .format("noop")
        .outputMode("append")
        .trigger(processingTime=trigger)
        .option("checkpointLocation", str(checkpoint))
        .start()
    )


def _children(pid: int) -> list[int]:
    """The child processes of `pid`, of all its threads (the JVM forks Python from threads other than main)."""
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return out


def spark_pids(me: int, broker_pids: set[int]) -> tuple[int | None, list[int]]:
    """(Spark's JVM, the Python processes it started: the pyspark daemon and any worker not forked by it)."""
    jvm = next((c for c in _children(me) if c not in broker_pids and (_stat(c) or ("",))[0] == "java"), None)
    if jvm is None:
        return None, []
    return jvm, [c for c in _children(jvm) if (_stat(c) or ("",))[0].startswith("python")]


class Profilers:
    """py-spy on Spark's Python processes (with the workers they fork) and a JFR recording of Spark's JVM, over
    one batch. Both sample; py-spy stops each worker briefly per sample (100 Hz), so a profiled batch is never one
    of the measured ones."""

    def __init__(self, out: Path, phase: str, me: int, broker_pids: set[int]) -> None:
        import subprocess

        self.out, self.phase = out, phase
        out.mkdir(parents=True, exist_ok=True)
        self.jvm, pythons = spark_pids(me, broker_pids)
        self.spies = []
        # py-spy comes with the dev extra, into the venv this runs from (not necessarily on PATH)
        spy = shutil.which(
            "py-spy", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
        )
        if spy is None:
            raise SystemExit("--profile needs py-spy (pip install -e '.[dev]')")
        for pid in pythons:
            raw = out / f"{phase}-python-{pid}.txt"
            self.spies.append(
                (
                    raw,
                    subprocess.Popen(
                        [
                            spy,
                            "record",
                            "--pid",
                            str(pid),
                            "--subprocesses",
                            "--rate",
                            "100",
                            "--format",
                            "raw",
                            "--nonblocking",
                            "--output",
                            str(raw),
                        ],
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    ),
                )
            )
        self.jfr = out / f"{phase}-jvm.jfr"
        if self.jvm is not None:
            subprocess.run(
                [
                    "jcmd",
                    str(self.jvm),
                    "JFR.start",
                    "name=bench",
                    "settings=profile",
                    f"filename={self.jfr}",
                ],
                check=False,
                capture_output=True,
            )
        log(f"[{phase}] profiling one batch: py-spy on {pythons}, JFR on {self.jvm}")

    def stop(self) -> Json:
        import signal
        import subprocess

        if self.jvm is not None:
            subprocess.run(
                ["jcmd", str(self.jvm), "JFR.stop", "name=bench"], check=False, capture_output=True
            )
        stacks: dict[str, int] = {}
        for raw, proc in self.spies:
            proc.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
            if raw.exists():
                for line in raw.read_text().splitlines():
                    stack, _, n = line.rpartition(" ")
                    if stack and n.isdigit():
                        stacks[stack] = stacks.get(stack, 0) + int(n)
        return {
            "python": summarize_py_spy(stacks),
            "jvm": summarize_jfr(self.jfr) if self.jfr.exists() else None,
            "files": str(self.out),
        }


def _top(counts: dict[str, int], total: int, n: int = 25) -> list[Json]:
    return [
        {"frame": k, "samples": v, "share": round(v / total, 3)}
        for k, v in sorted(counts.items(), key=lambda kv: -kv[1])[:n]
    ]


# What a Python worker sample was doing: the first of these (in this order) with a frame on the sample's stack.
PY_PARTS = (
    (
        "explaining verdicts (pydantic models: build_verdict, plan_abort, model JSON)",
        ("build_verdict (", "plan_abort (", "model_validate_json (", "model_dump_json (", "BaseModel."),
    ),
    (
        "state round trips to the JVM (value and map state, timers)",
        (
            "StatefulProcessorApiClient.",
            "ValueStateClient.",
            "MapStateClient.",
            "ListStateClient.",
            "MapStateIterator.",
            "MapStateKeyValuePairIterator.",
        ),
    ),
    ("state (un)pickling (_load, _save)", ("_load (", "_save (")),
    (
        "pyspark: input Arrow → pandas, regrouped per key (row_stream)",
        ("row_stream (", "generate_data_batches ("),
    ),
    ("input pandas → lists (_columns)", ("_columns (",)),
    ("the rules and bookkeeping (detectors/)", ("detectors/",)),
    ("the handlers' own lines", ("handleInputRows (", "handleExpiredTimer (")),
    ("pyspark: output pandas → Arrow", ("PandasToArrowConversion.", "dump_stream (")),
)


def summarize_py_spy(stacks: dict[str, int]) -> Json:
    """py-spy's raw stacks ("process <pid>:<cmd>;...;frame;frame count", root first, one "process" frame per
    fork level) → the share of each part of the workers' work (PY_PARTS), and the functions that took the
    samples themselves. Samples in pyspark's daemon.py (its fork loop; a worker waiting there between tasks) are
    counted apart.
    A frame is "function (file)" without the line, so one function is one entry."""
    self_: dict[str, int] = {}
    parts: dict[str, int] = {}
    total = daemon = 0
    for stack, n in stacks.items():
        split = stack.split(";")
        frames = [re.sub(r":\d+\)$", ")", f) for f in split if not f.startswith("process ") and f.strip()]
        if not frames:
            continue
        # The daemon's own loop, and a worker back in it between tasks (waiting on its socket: py-spy's
        # --nonblocking sampling cannot always tell a wait from work)
        if sum(1 for f in split if f.startswith("process ")) < 2 or frames[-1].endswith("(daemon.py)"):
            daemon += n
            continue
        total += n
        self_[frames[-1]] = self_.get(frames[-1], 0) + n
        part = next((name for name, marks in PY_PARTS if any(m in f for f in frames for m in marks)), "other")
        parts[part] = parts.get(part, 0) + n
    return {
        "samples": total,
        "daemon_samples": daemon,
        "parts": _top(parts, total or 1, len(PY_PARTS) + 1),
        "self": _top(self_, total or 1),
    }


# What a JVM sample was doing: the first of these found from the sampled frame outwards (JFR's class names).
JVM_PARTS = (
    ("Kafka source", ("org.apache.kafka.", "org.apache.spark.sql.kafka010.")),
    (
        "JSON parse (from_json)",
        ("JacksonParser", "ReaderBasedJsonParser", "JsonToStructs", "jackson.core.json.Utf8"),
    ),
    ("JSON write (to_json)", ("JacksonGenerator", "WriterBasedJsonGenerator", "StructsToJson")),
    (
        "Python state server (state get/put for the workers)",
        ("TransformWithStateInPySparkStateServer", "TransformWithStateInPandasStateServer"),
    ),
    ("state store (RocksDB)", ("rocksdb", "RocksDB", "state.StateStore", "StateStoreProvider")),
    (
        "Arrow to and from Python",
        ("org.apache.arrow.", "ArrowWriter", "ArrowConverters", "ArrowColumnVector"),
    ),
    ("Python runner I/O", ("PythonRunner", "PythonArrowInput", "PythonArrowOutput", "PythonWorker")),
    ("shuffle", ("org.apache.spark.shuffle.", "ShuffleBlockFetcher", "UnsafeShuffle", "ExternalSorter")),
    ("generated code (rows, explode, expressions)", ("GeneratedClass", "GenerateExec", "UnsafeRow")),
)


def summarize_jfr(path: Path) -> Json | None:
    """JFR's Java execution samples of Spark's JVM → the share of each part of the work (JVM_PARTS), the
    methods that took the samples themselves, and the threads."""
    import subprocess

    done = subprocess.run(
        ["jfr", "print", "--json", "--stack-depth", "64", "--events", "jdk.ExecutionSample", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        return {"error": done.stderr.strip()[-300:]}
    events = json.loads(done.stdout).get("recording", {}).get("events", [])
    self_: dict[str, int] = {}
    parts: dict[str, int] = {}
    threads: dict[str, int] = {}
    for e in events:
        v = e.get("values", {})
        frames = [  # the sampled frame first
            f"{f['method']['type']['name'].replace('/', '.')}.{f['method']['name']}"
            for f in (v.get("stackTrace") or {}).get("frames", [])
            if f.get("method")
        ]
        if not frames:
            continue
        self_[frames[0]] = self_.get(frames[0], 0) + 1
        thread_name = (v.get("sampledThread") or {}).get("javaName") or "?"
        part = next(
            (name for f in frames for name, marks in JVM_PARTS if any(m in f for m in marks)),
            # the state server's thread (it also builds encoders, pickles rows), the query's own thread (planning)
            "Python state server (state get/put for the workers)"
            if thread_name.startswith("stateConnectionListener")
            else "the query's driver thread (planning, progress)"
            if thread_name.startswith("stream execution thread")
            else "other",
        )
        parts[part] = parts.get(part, 0) + 1
        thread = re.sub(r" \[id = .*", "", thread_name)
        thread = re.sub(r"\d+", "N", thread)
        threads[thread] = threads.get(thread, 0) + 1
    total = sum(self_.values()) or 1
    return {
        "samples": sum(self_.values()),
        "parts": _top(parts, total, len(JVM_PARTS) + 3),
        "self": _top(self_, total),
        "threads": _top(threads, total, 10),
    }


def run_phase(
    spark: Any,
    *,
    name: str,
    stage: str = "reconcile",
    bootstrap: str,
    prefix: str,
    log_topic: str,
    input_topic: str,
    total: int,
    batch: int,
    trigger: str,
    warmup: int,
    steady_wanted: int,
    budget_s: float,
    workdir: Path,
    broker_pids: set[int],
    progress_out: Path | None,
    state_buckets: int,
    profile_dir: Path | None = None,
) -> Json:
    """One query (`stage`: the reconcile query, or a noop sink behind the plain read or the parse) over a
    backlog of `total` rows in `input_topic`; stops by itself. With `profile_dir`, one more batch after the
    steady ones is profiled (Profilers)."""
    from streaming import job

    checkpoint = workdir / f"checkpoint-{name}-{stage.replace(' ', '-')}"
    load_before = Path("/proc/loadavg").read_text().strip()
    log(
        f"[{name} {stage}] over {total:,} rows of {input_topic}, maxOffsetsPerTrigger {batch:,}, "
        f"trigger {trigger}; loadavg {load_before}"
    )
    began = time.monotonic()
    me = os.getpid()
    # CPU seconds of this process tree when each batch was first seen finished (the driver polls every 0.2 s;
    # with a backlog the next batch starts at once, so the difference between two is one batch's CPU).
    cpu_at: dict[int, dict[str, float]] = {}
    if stage == "reconcile":
        settings = Settings(
            cluster="bench",
            kafka=KafkaSettings(bootstrap_servers=bootstrap),
            topics=TopicSettings(prefix=prefix),
            stream=StreamSettings(
                checkpoint_location=str(checkpoint),
                trigger=trigger,
                starting_offsets="earliest",
                max_offsets_per_trigger=batch,
                state_buckets=state_buckets,
                transaction_log_topic=log_topic,
                metrics_port=0,
            ),
        )
        opts = job.StreamOptions(settings=settings, kafka_options={"bootstrap.servers": bootstrap})
        job.ensure_topics(opts, settings.kafka.client_kwargs())
        running = job.start(spark, opts, out=None, queries=("reconcile",))  # returns after the first batch
        (query,) = running.queries
        failed, stop = (
            running.failed,
            running.stop,
        )  # stop also removes its listener: the next phase must not pay for it
    else:
        query = start_noop(
            spark,
            stage=stage,
            bootstrap=bootstrap,
            input_topic=input_topic,
            batch=batch,
            trigger=trigger,
            checkpoint=checkpoint,
        )

        def failed() -> str | None:
            exc = query.exception()
            return None if exc is None else str(exc)

        stop = query.stop
    stop_reason = "time budget"
    profilers: Profilers | None = None
    profile: Json | None = None
    try:
        while True:
            problem = failed()
            if problem:
                raise RuntimeError(problem)
            last = query.lastProgress
            if last is not None and last["batchId"] not in cpu_at:
                cpu_at[last["batchId"]] = tree_cpu_s(me, broker_pids)
                rows, ms = last["numInputRows"], max(last["batchDuration"], 1)
                log(
                    f"[{name} {stage}] batch {last['batchId']}: {rows:,} rows in {ms / 1000:.1f}s "
                    f"({rows / ms * 1000:,.0f}/s), read {end_offset_total(last, input_topic):,}/{total:,}"
                )
                if profilers is not None:
                    profile = profilers.stop()
                    stop_reason = "enough steady batches, one more profiled"
                    break
                if end_offset_total(last, input_topic) >= total:
                    stop_reason = "input consumed"
                    break
                if sum(1 for p in query.recentProgress if p["numInputRows"] > 0) >= warmup + steady_wanted:
                    stop_reason = "enough steady batches"
                    if profile_dir is None or stage != "reconcile":
                        break
                    # The next batch started as this one ended (a backlog): profile it to its end.
                    profilers = Profilers(profile_dir, f"{name}-{stage.replace(' ', '-')}", me, broker_pids)
            if time.monotonic() - began > budget_s:
                break
            time.sleep(0.2)
    finally:
        if profilers is not None and profile is None:
            profile = profilers.stop()
        stop()
    wall = time.monotonic() - began
    load_after = Path("/proc/loadavg").read_text().strip()
    progress = [json.loads(p.json) for p in query.recentProgress]
    if progress_out is not None:
        with progress_out.open("a") as f:
            for p in progress:
                f.write(json.dumps({"phase": name, "stage": stage, **p}) + "\n")
    data = [p for p in progress if p["numInputRows"] > 0]
    # The steady batches are the ones wanted, no more: a batch profiled (or cut off by the time budget while it
    # was being profiled) is none of the measured ones.
    steady = data[warmup : warmup + steady_wanted]
    if steady and steady[-1]["numInputRows"] < 0.9 * batch:
        steady = steady[:-1]  # the tail (input ran out) is no steady batch
    rows = sum(p["numInputRows"] for p in steady)
    durations = [p["batchDuration"] / 1000 for p in steady]
    breakdown_keys = sorted({k for p in steady for k in p.get("durationMs", {})})
    breakdown = {k: statistics.median(p["durationMs"].get(k, 0) for p in steady) for k in breakdown_keys}
    # Steady CPU: from the end of the last warm-up batch to the end of the last steady batch.
    cpu: dict[str, float] = {}
    if steady and data[warmup - 1]["batchId"] in cpu_at and steady[-1]["batchId"] in cpu_at:
        end, begin = cpu_at[steady[-1]["batchId"]], cpu_at[data[warmup - 1]["batchId"]]
        cpu = {k: round(end[k] - begin[k], 1) for k in end}
    cpu_s = sum(cpu.values()) if cpu else None
    states = (
        state_figures(spark, checkpoint / RECONCILE, progress[-1] if progress else {})
        if stage == "reconcile"
        else []
    )
    result = {
        "phase": name,
        "stage": stage,
        "state_buckets": state_buckets,
        "input_topic": input_topic,
        "input_rows": total,
        "max_offsets_per_trigger": batch,
        "trigger": trigger,
        "stop_reason": stop_reason,
        "wall_s": round(wall, 1),
        "batches": len(progress),
        "warmup_batches": [
            {"batch": p["batchId"], "rows": p["numInputRows"], "s": p["batchDuration"] / 1000}
            for p in data[:warmup]
        ],
        "steady_batches": len(steady),
        "steady_rows": rows,
        "sustained_rows_per_s": round(rows / sum(durations)) if steady else None,
        "batch_rows_per_s": [round(p["numInputRows"] / (p["batchDuration"] / 1000)) for p in steady],
        "batch_s": [round(d, 2) for d in durations],
        "batch_s_p50": round(statistics.median(durations), 2) if steady else None,
        "batch_s_p99": round(percentile(durations, 99), 2) if steady else None,
        "duration_ms_median": breakdown,
        "cpu_s": round(cpu_s, 1) if cpu_s is not None else None,
        "cpu_s_by_process": cpu,
        "cpu_ms_per_1k_rows": round(cpu_s / rows * 1e6) if cpu_s and rows else None,
        # What the same CPU work would sustain on 2 idle cores (an upper bound: assumes both stay busy).
        "idle_2core_rows_per_s": round(rows / (cpu_s / 2)) if cpu_s and rows else None,
        "state": states,
        "profile": profile,
        "loadavg_before": load_before,
        "loadavg_after": load_after,
    }
    log(f"[{name} {stage}] stopped ({stop_reason}) after {wall:.0f}s; loadavg {load_after}")
    return result


# ------------------------------------------------------------------------------------------ report


def _summed(variables: Json, names: tuple[str, ...]) -> Json:
    """The rows and payload bytes of the named state variables together (an id is in one of them)."""
    rows = sum(variables.get(n, {}).get("rows", 0) for n in names)
    size = sum(variables.get(n, {}).get("payload_bytes", 0) for n in names)
    return {
        "rows": rows,
        "payload_bytes": size,
        "payload_bytes_per_row": round(size / rows, 1) if rows else None,
    }


def state_per_id(results: list[Json]) -> Json | None:
    """State bytes per transactional id, from the coordinator run (one id = one stage-1 owner and one stage-2
    view): payload (what the state holds) and RocksDB's in-memory footprint."""
    coord = next(
        (r for r in results if r["phase"] == "coordinator" and r.get("stage", "reconcile") == "reconcile"),
        None,
    )
    if coord is None:
        return None
    by = {s["stage"]: s for s in coord["state"]}
    s1, s2 = by.get("stage1 (transactional id)"), by.get("stage2 (producer id)")
    if not s1:
        return None
    owner = _summed(s1["variables"], STAGE1_IDS)
    view = _summed((s2 or {}).get("variables", {}), STAGE2_VIEWS)
    ids = owner["rows"] or s1["rows"]
    if not ids:
        return None
    payload = (owner["payload_bytes"] + view["payload_bytes"]) / ids
    memory = (s1["memory_used_bytes"] + (s2["memory_used_bytes"] if s2 else 0)) / ids
    checkpoint = (s1["checkpoint_dir_bytes"] + (s2["checkpoint_dir_bytes"] if s2 else 0)) / ids
    return {
        "transactional_ids": ids,
        "stage1_payload_bytes_per_id": owner["payload_bytes_per_row"],
        "stage2_view_payload_bytes_per_id": view["payload_bytes_per_row"],
        "payload_bytes_per_id": round(payload, 1),
        "rocksdb_memory_bytes_per_id": round(memory, 1),
        "checkpoint_bytes_per_id": round(checkpoint, 1),
    }


def print_report(results: list[Json], trigger_s: float, per_id: Json | None) -> None:
    print()
    print(
        f"{'input':<12} {'stage':<10} {'batch':>7} {'steady':>6} {'rows/s':>7} {'min/s':>6} {'max/s':>6} {'p50 s':>6} "
        f"{'p99 s':>6} {'CPU ms/1k':>9} {'idle-2-core/s':>13} {'of plain':>8}  target (>= {TARGET_ROWS_PER_S:,}/s, p99 < {trigger_s:g} s)"
    )
    for r in results:
        rates = r["batch_rows_per_s"] or [0]
        met = (
            bool(r["sustained_rows_per_s"])
            and r["sustained_rows_per_s"] >= TARGET_ROWS_PER_S
            and r["batch_s_p99"] < trigger_s
        )
        print(
            f"{r['phase']:<12} {r.get('stage', 'reconcile'):<10} {r['max_offsets_per_trigger']:>7,} {r['steady_batches']:>6} "
            f"{r['sustained_rows_per_s'] or 0:>7,} {min(rates):>6,} {max(rates):>6,} {r['batch_s_p50'] or 0:>6} "
            f"{r['batch_s_p99'] or 0:>6} {r['cpu_ms_per_1k_rows'] or 0:>9,} {r['idle_2core_rows_per_s'] or 0:>13,} "
            f"{format(r['share_of_plain_read'], '.0%') if r.get('share_of_plain_read') else '-':>8}  "
            f"{'met' if met else 'NOT met'}"
        )
    for r in results:
        print(
            f"\n{r['phase']} {r.get('stage', 'reconcile')} ({r['stop_reason']}; loadavg before {r['loadavg_before'].split()[0]}, after "
            f"{r['loadavg_after'].split()[0]}): median durationMs "
            + ", ".join(f"{k} {v:,.0f}" for k, v in r["duration_ms_median"].items())
        )
        if r["cpu_s_by_process"]:
            print(
                f"  CPU over the steady batches: {r['cpu_s']} s ("
                + ", ".join(f"{k} {v} s" for k, v in r["cpu_s_by_process"].items())
                + ")"
            )
        for s in r["state"]:
            payload = ", ".join(
                f"{var} {v['rows']:,} rows x {v['payload_bytes_per_row']} B"
                for var, v in s["variables"].items()
            )
            print(
                f"  {s['stage']:<26} rows {s['rows']:>8,}  last batch: state updates {s['all_updates_ms']:,} ms "
                f"(task sum), commit {s['commit_ms']} ms; RocksDB memory {s['memory_bytes_per_row']} B/row, "
                f"checkpoint dir {s['checkpoint_bytes_per_row']} B/row; payload: {payload or '-'}"
            )
        prof = r.get("profile") or {}
        for side in ("python", "jvm"):
            p = prof.get(side) or {}
            if p.get("samples"):
                print(
                    f"  profile, {side} ({p['samples']:,} samples), self: "
                    + "; ".join(f"{x['frame']} {x['share']:.0%}" for x in p["self"][:8])
                )
                print(
                    f"  profile, {side}, parts: "
                    + "; ".join(f"{x['frame']} {x['share']:.0%}" for x in p["parts"])
                )
    if per_id:
        print(
            f"\nstate per transactional id ({per_id['transactional_ids']:,} ids): payload "
            f"{per_id['payload_bytes_per_id']} B (stage 1 {per_id['stage1_payload_bytes_per_id']} + stage 2 view "
            f"{per_id['stage2_view_payload_bytes_per_id']}), RocksDB memory {per_id['rocksdb_memory_bytes_per_id']} B, "
            f"checkpoint {per_id['checkpoint_bytes_per_id']} B; target <= {TARGET_STATE_BYTES_PER_ID} B"
        )
    print()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_stream",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--only", choices=("coordinator", "snapshot", "both"), default="both")
    parser.add_argument("--trigger", default="5 seconds", help="the reconcile trigger (the job's default)")
    parser.add_argument(
        "--coordinator-batch", type=int, default=10_000, help="maxOffsetsPerTrigger for coordinator records"
    )
    parser.add_argument(
        "--snapshot-batch", type=int, default=5_000, help="maxOffsetsPerTrigger for snapshots"
    )
    parser.add_argument("--warmup-batches", type=int, default=2, help="first data batches left out (>= 1)")
    parser.add_argument("--steady-batches", type=int, default=6, help="steady batches wanted per input")
    parser.add_argument(
        "--ids",
        type=int,
        default=None,
        help="transactional ids (default: enough records for the batches wanted, plus one)",
    )
    parser.add_argument("--txns-per-id", type=int, default=1, help="commits per id (1 + 3 records each)")
    parser.add_argument(
        "--stable-partitions",
        action="store_true",
        help="every transaction of an id writes the same partitions (a Kafka Streams thread's tasks)",
    )
    parser.add_argument(
        "--concurrent-ids",
        type=int,
        default=2_000,
        help="transactional ids whose records interleave in the log at any time",
    )
    parser.add_argument(
        "--log-partitions",
        type=int,
        default=50,
        help="partitions of the transaction log topics (default: Kafka's %(default)s for __transaction_state)",
    )
    parser.add_argument(
        "--snapshot-without-coordinator",
        action="store_true",
        help="the snapshot phase as before: no coordinator record and no collector position, so no view is "
        "ever current and transactions seen past the grace are withheld would-be HANGING (UNCONFIRMED)",
    )
    parser.add_argument(
        "--partitions", type=int, default=5_000, help="data partitions the snapshots describe"
    )
    parser.add_argument(
        "--sweeps",
        type=int,
        default=None,
        help="collector sweeps (5 s apart) of snapshots (default: enough for the batches wanted)",
    )
    parser.add_argument(
        "--producers", type=int, default=None, help="producer id pool (default partitions / 3)"
    )
    parser.add_argument("--snapshot-partitions", type=int, default=6, help="partitions of the snapshot topic")
    parser.add_argument("--phase-budget-s", type=float, default=210.0, help="time limit of each query run")
    parser.add_argument("--heap", default="512m", help="broker heap")
    parser.add_argument("--state-buckets", type=int, default=32, help="the job's --state-buckets")
    parser.add_argument(
        "--shuffle-partitions",
        type=int,
        default=4,
        help="spark.sql.shuffle.partitions (the job's default: 4)",
    )
    parser.add_argument(
        "--plain-read",
        action="store_true",
        help="after each reconcile run, the same input through Spark's Kafka source alone to a noop sink, and "
        "(snapshots) through the job's parse alone: the limit on these cores, in the same run",
    )
    parser.add_argument(
        "--profile",
        nargs="?",
        const="",
        metavar="DIR",
        help="profile one more batch after the steady ones of each reconcile run: py-spy on the Python workers, "
        "JFR on Spark's JVM; the share of each part of the work in the JSON, the raw files in DIR (default: the "
        "temporary directory, see --keep)",
    )
    parser.add_argument("--bootstrap", help="use this running broker instead of starting a test bed")
    parser.add_argument("--progress-out", type=Path, help="append every batch's progress (JSON lines) here")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory (checkpoints)")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    if args.warmup_batches < 1:
        parser.error("--warmup-batches must be at least 1 (the first batch starts the Python workers)")

    trigger_s = trigger_seconds(args.trigger)
    # +1: the tail batch; +1 more for the profiled batch
    batches_wanted = args.warmup_batches + args.steady_batches + 1 + (0 if args.profile is None else 1)
    records_per_id = 1 + 3 * args.txns_per_id
    ids = args.ids or math.ceil(args.coordinator_batch * batches_wanted / records_per_id)
    sweeps = args.sweeps or math.ceil(args.snapshot_batch * batches_wanted / args.partitions)
    producers = args.producers or max(3, args.partitions // 3)
    phases = ("coordinator", "snapshot") if args.only == "both" else (args.only,)
    run = uuid.uuid4().hex[:6]

    overall = time.monotonic()
    load_start = Path("/proc/loadavg").read_text().strip()
    log(f"loadavg at start: {load_start}")
    workdir = Path(tempfile.mkdtemp(prefix="txnwatch-bench-stream-"))
    state_dir = workdir / "testbed"
    broker_pids: set[int] = set()
    if args.bootstrap:
        log(f"using the running broker at {args.bootstrap}")
        bootstrap = args.bootstrap
    else:
        log(f"starting a one-node test bed (heap {args.heap}) in {state_dir}")
        for attempt in range(3):
            try:
                cluster = start_cluster(TestBedConfig(heap=args.heap), state_dir)
                break
            except RuntimeError as exc:
                # dev/kafka.py passes the random cluster id as a separate argument; one that starts with "-"
                # (1 in 64) makes kafka-storage's parser fail. Another id fixes it.
                if attempt == 2 or "formatting storage failed" not in str(exc):
                    raise
                log(f"test bed did not start ({str(exc).splitlines()[0]}); again")
        bootstrap = cluster.bootstrap_servers
        broker_pids = {n.pid for n in cluster.nodes}
    spark = None
    results: list[Json] = []
    produced: dict[str, Json] = {}
    try:
        log_topic, snap_log = f"bench{run}.txnlog", f"bench{run}.txnlog-snap"
        prefix_coord, prefix_snap = f"bench{run}c", f"bench{run}s"
        admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=60_000)
        try:
            admin.create_topics(
                [
                    NewTopic(log_topic, args.log_partitions, 1),
                    NewTopic(snap_log, args.log_partitions, 1),
                    NewTopic(f"{prefix_coord}.producer-state", args.snapshot_partitions, 1),
                    NewTopic(f"{prefix_snap}.producer-state", args.snapshot_partitions, 1),
                ]
            )
        finally:
            admin.close()
        if "coordinator" in phases:
            log(
                f"coordinator input: {ids:,} transactional ids x {records_per_id} records, "
                f"{args.concurrent_ids:,} interleaved"
            )
            produced["coordinator"] = produce(
                bootstrap,
                log_topic,
                coordinator_records(
                    ids,
                    args.txns_per_id,
                    args.concurrent_ids,
                    args.seed,
                    run,
                    stable_partitions=args.stable_partitions,
                ),
            )
        if "snapshot" in phases:
            log(
                f"snapshot input: {args.partitions:,} partitions x {sweeps} sweeps, {producers:,} producer ids"
            )
            # The sweeps end now, as a backlog does (snapshot_records)
            t0_ms = int(time.time() * 1000) - sweeps * SWEEP_INTERVAL_MS
            # A timeout longer than the whole run: no transaction becomes LATE or COORDINATOR_OVERDUE while it
            # is read (the cluster's transaction.max.timeout.ms, in every snapshot, is the same)
            timeout_ms = max(3_600_000, sweeps * SWEEP_INTERVAL_MS + 900_000)
            after_sweep = None
            if not args.snapshot_without_coordinator:
                ends = produce_to_coordinator_partitions(
                    bootstrap,
                    snap_log,
                    args.log_partitions,
                    snapshot_coordinator_records(args.partitions, producers, t0_ms - 60_000, timeout_ms, run),
                )
                produced["snapshot_coordinator"] = {"records": sum(ends.values())}
                after_sweep = position_record(snap_log, args.log_partitions, ends)
            produced["snapshot"] = produce(
                bootstrap,
                f"{prefix_snap}.producer-state",
                snapshot_records(
                    args.partitions,
                    sweeps,
                    producers,
                    SWEEP_INTERVAL_MS,
                    args.seed,
                    run,
                    t0_ms=t0_ms,
                    max_timeout_ms=timeout_ms,
                    after_sweep=after_sweep,
                ),
                headers=SNAPSHOT_HEADERS,
            )

        from streaming import job  # imported late: pyspark is slow to import
        from streaming.session import build_session

        spark = build_session(
            master="local[2]",
            app_name="txnwatch-bench-stream",
            extra_conf={
                **job.spark_conf(),
                "spark.sql.shuffle.partitions": str(args.shuffle_partitions),
                "spark.ui.enabled": "false",
                "spark.ui.showConsoleProgress": "false",  # no progress bar in the output
            },
        )
        spark.sparkContext.setLogLevel("ERROR")
        common: dict[str, Any] = {
            "spark": spark,
            "bootstrap": bootstrap,
            "trigger": args.trigger,
            "warmup": args.warmup_batches,
            "steady_wanted": args.steady_batches,
            "budget_s": args.phase_budget_s,
            "workdir": workdir,
            "broker_pids": broker_pids,
            "progress_out": args.progress_out,
            "state_buckets": args.state_buckets,
            "profile_dir": None if args.profile is None else Path(args.profile or workdir / "profile"),
        }
        # Each input: the reconcile query, then (--plain-read) the same rows through less of it.
        limits = {"coordinator": ("plain read",), "snapshot": ("plain read", "parse")}
        if "coordinator" in phases:
            results.append(
                run_phase(
                    name="coordinator",
                    prefix=prefix_coord,
                    log_topic=log_topic,
                    input_topic=log_topic,
                    total=produced["coordinator"]["records"],
                    batch=args.coordinator_batch,
                    **common,
                )
            )
            for stage in limits["coordinator"] if args.plain_read else ():
                results.append(
                    run_phase(
                        name="coordinator",
                        stage=stage,
                        prefix=prefix_coord,
                        log_topic=log_topic,
                        input_topic=log_topic,
                        total=produced["coordinator"]["records"],
                        batch=args.coordinator_batch,
                        **common,
                    )
                )
        if "snapshot" in phases:
            results.append(
                run_phase(
                    name="snapshot",
                    prefix=prefix_snap,
                    log_topic=snap_log,
                    input_topic=f"{prefix_snap}.producer-state",
                    total=produced["snapshot"]["records"],
                    batch=args.snapshot_batch,
                    **common,
                )
            )
            for stage in limits["snapshot"] if args.plain_read else ():
                results.append(
                    run_phase(
                        name="snapshot",
                        stage=stage,
                        prefix=prefix_snap,
                        log_topic=snap_log,
                        input_topic=f"{prefix_snap}.producer-state",
                        total=produced["snapshot"]["records"],
                        batch=args.snapshot_batch,
                        **common,
                    )
                )
    finally:
        if spark is not None:
            spark.stop()
        if not args.bootstrap:
            stop_cluster(state_dir)
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    load_end = Path("/proc/loadavg").read_text().strip()
    total_s = time.monotonic() - overall
    log(f"loadavg at end: {load_end}; whole run {total_s:.0f}s")

    per_id = state_per_id(results)
    # Each stage's rate as a share of the plain read of the same input, measured in this run.
    plain = {r["phase"]: r["sustained_rows_per_s"] for r in results if r["stage"] == "plain read"}
    for r in results:
        limit = plain.get(r["phase"])
        r["share_of_plain_read"] = (
            round(r["sustained_rows_per_s"] / limit, 3) if limit and r["sustained_rows_per_s"] else None
        )
    print_report(results, trigger_s, per_id)
    figures = {
        "benchmark": "bench_stream",
        "command": "python -m benchmarks.bench_stream "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "master": "local[2]",
        "shuffle_partitions": args.shuffle_partitions,
        "targets": {
            "rows_per_s": TARGET_ROWS_PER_S,
            "p99_below_s": trigger_s,
            "state_bytes_per_transactional_id": TARGET_STATE_BYTES_PER_ID,
        },
        "input": {
            "coordinator": {
                "ids": ids,
                "records_per_id": records_per_id,
                "concurrent_ids": args.concurrent_ids,
                "stable_partitions": args.stable_partitions,
                "log_partitions": args.log_partitions,
                **produced.get("coordinator", {}),
            },
            "snapshot": {
                "with_coordinator_records": not args.snapshot_without_coordinator,
                "coordinator_records": produced.get("snapshot_coordinator", {}).get("records", 0),
                "log_partitions": args.log_partitions,
                "partitions": args.partitions,
                "sweeps": sweeps,
                "producer_ids": producers,
                "topic_partitions": args.snapshot_partitions,
                **produced.get("snapshot", {}),
            },
        },
        "loadavg_start": load_start,
        "loadavg_end": load_end,
        "total_s": round(total_s, 1),
        "state_per_transactional_id": per_id,
        "phases": results,
    }
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
