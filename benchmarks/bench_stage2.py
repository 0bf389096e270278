"""Stage 2's Python work on bench_stream's snapshot input, in one process, without Spark or a JVM: what a Python
worker does for the reconcile query's second stateful stage, batch after batch, and where its CPU goes.

`python -m benchmarks.bench_stage2 [--batch 100000] [--batches 4] [--rounds 2] [--partitions 5000]
[--without-coordinator] [--profile]` makes bench_stream's snapshot phase input: its snapshots (5,000 partitions,
sweeps 5 s apart, a third as many producer ids), the collector's CoordinatorLogPosition after each sweep, and one
Ongoing coordinator record per producer id written before the first sweep, so every transaction is its
coordinator's own and stays OPEN, as on a real cluster (`--without-coordinator`: no records and no positions, so
every transaction seen past the grace is a withheld HANGING, explained with the models). It shapes them as the job
does, by the job's own code where that is plain Python, and by column name elsewhere:

- the coordinator records go through `sources.decode_batches` (the job's decoder), become stage-1 rows by
  STAGE1_INPUT_COLUMNS and go through the real stage 1 (`ProducerIdFacts`): its view, read and applied facts join
  the first batch, as when the job reads a backlog;
- each open transaction becomes one stage-2 row (`rows.open_transaction_rows`), each position one row per bucket,
  each fact one row for its producer id's bucket or for every bucket (`rows.fact_rows`). Those are Spark column
  expressions, so here the columns come by name from STAGE2_INPUT_COLUMNS: a column named after a field of the
  transaction, of the snapshot or of stage 1's facts takes that field; the few the job computes are listed in
  `_OPEN_COMPUTED`; any other name fails the run. Their Arrow types come from the job's Spark schemas. The
  bucket is the producer id mod the job's bucket count, not Spark's xxhash64: the same spread on consecutive ids.

Per batch and bucket it then does what pyspark's transformWithStateInPandas worker does around the handler: the
bucket's Arrow rows to pandas, one tuple per row (`itertuples`), a DataFrame of them, pulled lazily by
`TransactionReconciler.handleInputRows` on in-memory state variables (dev/fake_state.py: the map states
with the job's TTL on the batch's processing time), the bucket's due timers (`handleExpiredTimer`), and the events
back to Arrow. Processing time is the newest time in the batch's rows, so two runs give the same events.

It runs the handlers as the job does (cyclic GC paused: streaming/gcpause.py) and unwrapped (the collector on), on
the same input in one process, alternately, and prints the CPU per row of each, whether their events are
identical (a hash of every event batch), and what the events were: how many verdicts were explained (new or
changed, so the pydantic models ran) and of which kind. `--profile` adds a run of its own with cProfile's top
functions of its last batch. Neither the JVM's share (Arrow, the state server's round trips, RocksDB) nor Spark's
scheduling is in it: bench_stream measures the whole job. The output ends with one JSON line.
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import io
import json
import pickle
import pstats
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pandas as pd
import pyarrow as pa
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_type

from benchmarks.bench_stream import (
    SWEEP_INTERVAL_MS,
    position_record,
    snapshot_coordinator_records,
    snapshot_records,
)
from common.settings import StreamSettings
from detectors.currency import coordinator_partition
from detectors.models import CoordinatorLogPosition, DetectionLimits
from detectors.tracking import FACT_COLUMNS, STAGE1_INPUT_COLUMNS, STAGE2_INPUT_COLUMNS, ReconcileConfig
from dev.fake_state import Clock, FakeHandle, Timer
from streaming.reconcile import FACT_SCHEMA, ProducerIdFacts, TransactionReconciler
from streaming.rows import _PROVENANCE
from streaming.schemas import COORDINATOR_RECORD_SCHEMA, PARTITION_SNAPSHOT_SCHEMA
from streaming.sources import decode_batches

BUCKETS: int = StreamSettings.model_fields["state_buckets"].default  # the job's `--state-buckets`
LOG_TOPIC = "bench-stage2-log"
LOG_PARTITIONS = 50  # Kafka's partitions of __transaction_state, as bench_stream's log
_TXN_FIELDS = PARTITION_SNAPSHOT_SCHEMA["open_transactions"].dataType.elementType  # type: ignore[attr-defined]
# Stage-2 columns rows.open_transaction_rows computes rather than takes from a field of the snapshot, of its
# transaction or of a fact (with their Spark types): every other column must be named after one of those.
_OPEN_COMPUTED: dict[str, T.DataType] = {
    "bucket": T.LongType(),
    "snapshot_json": T.StringType(),  # the one-transaction snapshot, Spark's to_json
    "lso_lag": T.LongType(),  # high watermark - last stable offset
}
# rows.fact_rows sends these facts to every bucket (every bucket judges against the whole view)
_EVERY_BUCKET = ("applied", "undecodable", "read")
# where a row was read: the Kafka source's columns that sources.coordinator_rows_read renames
_READ_FROM = {
    "read_topic": "kafka_topic",
    "read_partition": "kafka_partition",
    "read_offset": "kafka_offset",
    "read_after": "kafka_read_after",
}


def stage2_arrow_types() -> dict[str, pa.DataType]:
    """The Arrow type of each stage-2 input column, from the Spark types of the fields it is built from."""
    spark: dict[str, T.DataType] = {f.name: f.dataType for f in PARTITION_SNAPSHOT_SCHEMA.fields}
    spark.update({f.name: f.dataType for f in _TXN_FIELDS.fields})
    spark.update({f.name: f.dataType for f in FACT_SCHEMA.fields})
    spark.update(_OPEN_COMPUTED)
    missing = [c for c in STAGE2_INPUT_COLUMNS if c not in spark]
    if missing:
        raise KeyError(f"stage 2 reads {missing}, which bench_stage2 cannot build: teach it how the job does")
    return {c: to_arrow_type(spark[c]) for c in STAGE2_INPUT_COLUMNS}


def _without_nulls(value: Any) -> Any:
    # Spark's to_json leaves null fields out (ignoreNullFields defaults to true)
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def open_rows(snapshot_json: bytes, buckets: int) -> list[list[Any]]:
    """A snapshot's stage-2 rows, one per open transaction (rows.open_transaction_rows), in STAGE2_INPUT_COLUMNS
    order: each column from the transaction's field of its name, else the snapshot's, else `_OPEN_COMPUTED`; a
    fact's column (FACT_COLUMNS) that neither has is null on an open row."""
    s = json.loads(snapshot_json)
    out = []
    for t in s["open_transactions"]:
        one = {**s, "open_transactions": [t]}
        computed = {
            "bucket": t["producer_id"] % buckets,
            "fact": "open",
            "snapshot_json": json.dumps(_without_nulls(one), separators=(",", ":")),
            "lso_lag": s["high_watermark"] - s["last_stable_offset"],
        }
        row = []
        for c in STAGE2_INPUT_COLUMNS:
            if c in computed:
                row.append(computed[c])
            elif c in t:
                row.append(t[c])
            elif c in s:
                row.append(s[c])
            elif c in FACT_COLUMNS:
                row.append(None)
            else:
                raise KeyError(f"stage 2 reads {c!r}: no field of an open transaction's row has that name")
        out.append(row)
    return out


def position_rows(position_json: bytes, buckets: int) -> list[list[Any]]:
    """A collector position's stage-2 rows, one per bucket (rows.open_transaction_rows): the raw JSON as the
    record, its as_of_ms as the fact's time, producer id -1."""
    position = CoordinatorLogPosition.model_validate_json(position_json)
    values = {"producer_id": -1, "fact": "position", "record_json": position_json.decode()}
    values["fact_time_ms"] = position.as_of_ms
    return [[b, *[values.get(c) for c in STAGE2_INPUT_COLUMNS[1:]]] for b in range(buckets)]


def fact_rows(facts: Sequence[Sequence[Any]], buckets: int) -> list[list[Any]]:
    """Stage 1's facts (FACT_COLUMNS) as stage-2 rows (rows.fact_rows): a fact about a producer id to its bucket,
    the view's progress to every bucket; the open-transaction columns null."""
    tail = [None] * (len(STAGE2_INPUT_COLUMNS) - 1 - len(FACT_COLUMNS))
    out: list[list[Any]] = []
    for fact in facts:
        values = dict(zip(FACT_COLUMNS, fact, strict=True))
        targets = range(buckets) if values["fact"] in _EVERY_BUCKET else [values["producer_id"] % buckets]
        out.extend([b, *fact, *tail] for b in targets)
    return out


def stage1_rows(decoded: pa.RecordBatch) -> list[list[Any]]:
    """Decoded coordinator records (sources.decode_batches) as stage 1's rows (sources.coordinator_rows_read,
    rows.coordinator_rows): each column the decoded one of its name, `record_json` the record without where it
    was read from (Spark's to_json keeps null fields there), read_* the Kafka source's kafka_* columns."""
    record = [f.name for f in COORDINATOR_RECORD_SCHEMA.fields if f.name not in _PROVENANCE]
    out = []
    for r in decoded.to_pylist():
        values = {"bucket": 0, "record_json": json.dumps({k: r[k] for k in record}, separators=(",", ":"))}
        out.append([values[c] if c in values else r[_READ_FROM.get(c, c)] for c in STAGE1_INPUT_COLUMNS])
    return out


def coordinator_facts(
    records: Iterator[tuple[str, bytes, bytes]], written_ms: int
) -> tuple[list[Any], dict[int, int]]:
    """The coordinator records through the job's decoder and the real stage 1 (one bucket: facts do not depend
    on it): its facts, and the log's end offsets (each record at its coordinator's partition, as Kafka's
    coordinator writes it)."""
    by_partition: dict[int, list[tuple[bytes, bytes]]] = {}
    for tid, key, value in records:
        by_partition.setdefault(coordinator_partition(tid, LOG_PARTITIONS), []).append((key, value))
    raw: dict[str, list[Any]] = {n: [] for n in ("key", "value", "topic", "partition", "offset", "ts_ms")}
    for partition, rows in sorted(by_partition.items()):  # a task reads its partitions one after the other
        for offset, (key, value) in enumerate(rows):
            for n, v in zip(raw, (key, value, LOG_TOPIC, partition, offset, written_ms), strict=True):
                raw[n].append(v)
    batch = pa.RecordBatch.from_pydict(
        raw,
        schema=pa.schema(
            [("key", pa.binary()), ("value", pa.binary()), ("topic", pa.string()), ("partition", pa.int32()),
             ("offset", pa.int64()), ("ts_ms", pa.int64())]
        ),
    )  # fmt: skip
    decoded = pa.Table.from_batches(list(decode_batches(iter([batch]), compact=True))).combine_chunks()
    (decoded_batch,) = decoded.to_batches() or [pa.RecordBatch.from_pylist([], schema=decoded.schema)]
    stage1 = ProducerIdFacts()
    stage1.init(FakeHandle(Clock(written_ms)))  # type: ignore[arg-type]
    df = pd.DataFrame(stage1_rows(decoded_batch), columns=list(STAGE1_INPUT_COLUMNS), dtype=object)
    facts = [
        tuple(f)
        for out in stage1.handleInputRows((0,), iter([df]), None)  # type: ignore[arg-type]
        for f in out.itertuples(index=False)
    ]
    ends = {p: len(by_partition.get(p, ())) for p in range(LOG_PARTITIONS)}
    return facts, ends


def _default(name: str) -> Any:
    return StreamSettings.model_fields[name].default


def stage2_config() -> ReconcileConfig:
    """Stage 2's config as `txnwatch stream` builds it at its defaults (streaming/job.py), on the bench's log."""
    return ReconcileConfig(
        limits=DetectionLimits(),
        expire_after_ms=_default("expire_after_ms"),
        view_ttl_ms=_default("view_ttl_ms"),
        transaction_log_topic=LOG_TOPIC,
        run_id="bench",
    )


def _arrow_batches(
    rows: list[list[Any]], types: dict[str, pa.DataType], buckets: int
) -> dict[int, pa.RecordBatch]:
    """A batch's rows, bucket → Arrow record batch (what the worker receives per grouping key)."""
    per_bucket: dict[int, list[list[Any]]] = {b: [] for b in range(buckets)}
    for row in rows:
        per_bucket[row[0]].append(row)
    return {
        b: pa.RecordBatch.from_arrays(
            [pa.array([r[i] for r in rs], types[c]) for i, c in enumerate(STAGE2_INPUT_COLUMNS)],
            names=list(STAGE2_INPUT_COLUMNS),
        )
        for b, rs in per_bucket.items()
    }


def stage2_batches(batch: int, batches: int, partitions: int, with_coordinator: bool = True) -> list[bytes]:
    """Per batch (pickled, so only the batch at hand is in memory): (processing time, bucket → Arrow record batch
    of stage-2 rows). A batch is `batch` snapshots and the positions after them; the first also carries stage
    1's facts of the coordinator records."""
    producers = max(1, partitions // 3)
    sweeps = batch * batches // partitions + 1
    t0_ms = int(time.time() * 1000) - SWEEP_INTERVAL_MS
    timeout_ms = max(3_600_000, sweeps * SWEEP_INTERVAL_MS + 900_000)  # as bench_stream: no LATE while read
    types = stage2_arrow_types()
    rows: list[list[Any]] = []
    after_sweep = None
    if with_coordinator:
        records = snapshot_coordinator_records(partitions, producers, t0_ms - 60_000, timeout_ms, "bench")
        facts, ends = coordinator_facts(records, t0_ms - 60_000)
        rows.extend(fact_rows(facts, BUCKETS))
        after_sweep = position_record(LOG_TOPIC, LOG_PARTITIONS, ends)
    out: list[bytes] = []
    snapshots, newest_ms = 0, t0_ms

    def close() -> None:
        # processed right after its newest row arrived
        out.append(pickle.dumps((newest_ms + 500, _arrow_batches(rows, types, BUCKETS))))

    for record in snapshot_records(partitions, sweeps, producers, SWEEP_INTERVAL_MS, 7, "bench", t0_ms=t0_ms,
                                   max_timeout_ms=timeout_ms, after_sweep=after_sweep):  # fmt: skip
        value = record[1]
        if len(record) == 3:  # the collector's position after a sweep (bench_stream.position_record)
            rows.extend(position_rows(value, BUCKETS))
            newest_ms = max(newest_ms, CoordinatorLogPosition.model_validate_json(value).as_of_ms)
            continue
        if snapshots == batch:
            close()
            if len(out) == batches:
                return out
            rows, snapshots = [], 0
        snapshots += 1
        for row in open_rows(value, BUCKETS):
            rows.append(row)
            newest_ms = max(newest_ms, row[STAGE2_INPUT_COLUMNS.index("observed_at_ms")])
    close()
    return out


def _frames(rows: pa.RecordBatch) -> Iterator[pd.DataFrame]:
    # pyspark's worker.py (transform_with_state_func): Arrow → pandas, a tuple per row, regrouped into a DataFrame
    yield pd.DataFrame(list(rows.to_pandas().itertuples(index=False)))


def _count(kinds: dict[str, int], events: pd.DataFrame) -> None:
    for event, kind, explained in zip(events["event"], events["kind"], events["explanation"], strict=True):
        k = f"{event} {kind or ''}{' explained' if explained is not None else ''}".strip()
        kinds[k] = kinds.get(k, 0) + 1


def run(batches: list[bytes], paused: bool, profile: bool) -> dict[str, Any]:
    processor = TransactionReconciler(stage2_config())
    on_rows = TransactionReconciler.handleInputRows
    on_timer = TransactionReconciler.handleExpiredTimer
    if not paused:
        on_rows = on_rows.__wrapped__  # type: ignore[attr-defined]
        on_timer = on_timer.__wrapped__  # type: ignore[attr-defined]
    clock = Clock(0)
    handles = {b: FakeHandle(clock) for b in range(BUCKETS)}
    digest = hashlib.sha256()
    per_batch = []
    profiler = None
    for i, blob in enumerate(batches):
        now_ms, per_bucket = pickle.loads(blob)
        clock.now_ms = now_ms
        outputs: list[pa.RecordBatch] = []
        rows = sum(b.num_rows for b in per_bucket.values())
        if profile and i == len(batches) - 1:
            profiler = cProfile.Profile()
            profiler.enable()
        began = time.process_time()
        for b in range(BUCKETS):
            handle = handles[b]
            processor.init(handle)  # type: ignore[arg-type]
            for events in on_rows(processor, (b,), _frames(per_bucket[b]), Timer(clock)):  # type: ignore[arg-type]
                outputs.append(pa.RecordBatch.from_pandas(events, preserve_index=False))
            # then the bucket's timers that are due, as Spark fires them after the batch's rows
            for at_ms in sorted(t for t in handle.timers if t <= now_ms):
                handle.timers.discard(at_ms)
                for events in on_timer(processor, (b,), Timer(clock), None):  # type: ignore[arg-type]
                    outputs.append(pa.RecordBatch.from_pandas(events, preserve_index=False))
        cpu = time.process_time() - began
        if profiler is not None:
            profiler.disable()
        kinds: dict[str, int] = {}
        for out in outputs:
            events = out.to_pandas()
            digest.update(events.to_json().encode())
            _count(kinds, events)
        per_batch.append(
            {"rows": rows, "cpu_s": round(cpu, 2), "us_per_row": round(cpu / rows * 1e6, 1), "events": kinds}
        )
    top = None
    if profiler is not None:
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(25)
        top = text.getvalue()
    return {"paused": paused, "batches": per_batch, "events_sha256": digest.hexdigest(), "profile": top}


def bench(args: argparse.Namespace) -> dict[str, Any]:
    """The runs, printed as they end; the JSON summary."""
    batches = stage2_batches(args.batch, args.batches, args.partitions, not args.without_coordinator)
    runs = []
    for _ in range(args.rounds):
        for paused in (False, True):
            res = run(batches, paused, profile=False)
            steady = res["batches"][1:] or res["batches"]
            res["steady_us_per_row"] = round(
                sum(b["cpu_s"] for b in steady) / sum(b["rows"] for b in steady) * 1e6, 1
            )
            print(
                f"GC {'paused ' if paused else 'on     '} {res['steady_us_per_row']:>5} us/row over the batches after "
                f"the first; events {res['events_sha256'][:16]}",
                flush=True,
            )
            runs.append(res)
    if args.profile:  # a run of its own: cProfile slows every Python call, so it is no measured run
        print(run(batches, paused=True, profile=True)["profile"])
    print("events per batch (last run):", json.dumps([b["events"] for b in runs[-1]["batches"]]))
    same = len({r["events_sha256"] for r in runs}) == 1
    print(f"events identical in every run: {same}")
    return {"benchmark": "bench_stage2", "batch": args.batch, "batches": args.batches,
            "partitions": args.partitions, "with_coordinator": not args.without_coordinator,
            "identical_events": same, "runs": [{k: v for k, v in r.items() if k != "profile"} for r in runs]}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_stage2", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument(
        "--batch", type=int, default=100_000, help="snapshots per batch (bench_stream's batch)"
    )
    parser.add_argument("--batches", type=int, default=4, help="batches (the first is a warm-up)")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each way, alternately")
    parser.add_argument("--partitions", type=int, default=5_000, help="partitions the snapshots describe")
    parser.add_argument(
        "--without-coordinator",
        action="store_true",
        help="no coordinator records and no positions (bench_stream's --snapshot-without-coordinator)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="one more run (GC paused), cProfile's top functions of its last batch",
    )
    summary = bench(parser.parse_args(argv))
    print(json.dumps(summary))
    return 0 if summary["identical_events"] else 1


if __name__ == "__main__":
    sys.exit(main())
