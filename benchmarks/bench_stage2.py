"""Stage 2's Python work on bench_stream's snapshot input, in one process, without Spark: what a Python worker does
for the reconcile query's second stateful stage, batch after batch, and where its CPU goes.

`python -m benchmarks.bench_stage2 [--batch 100000] [--batches 4] [--profile]` makes bench_stream's snapshots
(5,000 partitions, sweeps 5 s apart, 1,666 producer ids), shapes them as stage 2's input rows (one per open
transaction, `bucket` = producer id mod 32, the one-transaction snapshot JSON from the model, not Spark's to_json),
and per batch and bucket does what pyspark's transformWithStateInPandas worker does around the handler: the
bucket's Arrow rows to pandas, one tuple per row (`itertuples`), a DataFrame of them, pulled lazily by
`TransactionReconciler.handleInputRows` (in-memory ValueStates, no state server), and its events back to Arrow.

It runs the handler as the job does (cyclic GC paused: streaming/gcpause.py) and unwrapped (the collector on), on
the same input in one process, alternately, and prints the CPU per row of each, whether their events are
identical (a hash of every event batch), and what the events were: how many verdicts were explained (new or
changed, so the pydantic models ran) and of which kind. `--profile` adds a run of its own with cProfile's top
functions of its last batch. Neither the JVM's share (Arrow, the state server's round trips, RocksDB) nor Spark's scheduling is in
it: bench_stream measures the whole job. The output ends with one JSON line.
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
from collections.abc import Iterator
from typing import Any

import pandas as pd
import pyarrow as pa

from benchmarks.bench_stream import snapshot_records
from detectors.models import DetectionLimits, PartitionSnapshot
from detectors.tracking import STAGE2_INPUT_COLUMNS, ReconcileConfig
from streaming.reconcile import TransactionReconciler

BUCKETS = 32
_TYPES = {
    "fact": pa.string(),
    "transactional_id": pa.string(),
    "record_json": pa.string(),
    "topic": pa.string(),
}
_TYPES["snapshot_json"] = pa.string()


def stage2_batches(batch: int, batches: int) -> list[bytes]:
    """Per batch (pickled, so only the batch at hand is in memory): bucket → Arrow record batch of stage-2 rows."""
    records = list(snapshot_records(5_000, batch * batches // 5_000 + 1, 1_666, 5_000, 7, "bench"))
    out = []
    for i in range(batches):
        cols: dict[int, list[list[Any]]] = {b: [[] for _ in STAGE2_INPUT_COLUMNS] for b in range(BUCKETS)}
        for _, value in records[i * batch : (i + 1) * batch]:
            s = PartitionSnapshot.model_validate_json(value)
            for t in s.open_transactions:
                one = s.model_copy(update={"open_transactions": (t,)}).model_dump_json()
                row = (
                    t.producer_id % BUCKETS, t.producer_id, "open", None, None, None, None, s.topic, s.partition,
                    one, s.observed_at_ms, s.leader, t.start_offset, t.producer_epoch, t.start_batch_producer_epoch,
                    t.start_timestamp_ms, t.last_timestamp_ms, s.max_transaction_timeout_ms,
                    s.high_watermark - s.last_stable_offset,
                )  # fmt: skip
                for col, v in zip(cols[row[0]], row, strict=True):
                    col.append(v)
        out.append(
            pickle.dumps(
                {
                    b: pa.RecordBatch.from_arrays(
                        [
                            pa.array(c, _TYPES.get(n, pa.int64()))
                            for n, c in zip(STAGE2_INPUT_COLUMNS, v, strict=True)
                        ],
                        names=list(STAGE2_INPUT_COLUMNS),
                    )
                    for b, v in cols.items()
                }
            )
        )
    return out


class _Value:
    def __init__(self) -> None:
        self.value: tuple[Any, ...] | None = None

    def exists(self) -> bool:
        return self.value is not None

    def get(self) -> tuple[Any, ...] | None:
        return self.value

    def update(self, value: tuple[Any, ...]) -> None:
        self.value = value

    def clear(self) -> None:
        self.value = None


class _Handle:
    def __init__(self) -> None:
        self.states: dict[str, _Value] = {}

    def getValueState(self, name: str, schema: str) -> _Value:
        return self.states.setdefault(name, _Value())

    def registerTimer(self, at_ms: int) -> None:
        pass

    def deleteTimer(self, at_ms: int) -> None:
        pass


class _Timer:
    def __init__(self, now_ms: int) -> None:
        self.now_ms = now_ms

    def getCurrentProcessingTimeInMs(self) -> int:
        return self.now_ms


def _frames(rows: pa.RecordBatch) -> Iterator[pd.DataFrame]:
    # pyspark's worker.py (transform_with_state_func): Arrow → pandas, a tuple per row, regrouped into a DataFrame
    yield pd.DataFrame(list(rows.to_pandas().itertuples(index=False)))


def run(batches: list[bytes], paused: bool, profile: bool) -> dict[str, Any]:
    processor = TransactionReconciler(
        ReconcileConfig(limits=DetectionLimits(), expire_after_ms=60_000, view_ttl_ms=3_600_000)
    )
    handler = TransactionReconciler.handleInputRows
    if not paused:
        handler = handler.__wrapped__  # type: ignore[attr-defined]
    handles = {b: _Handle() for b in range(BUCKETS)}
    digest = hashlib.sha256()
    now_ms = 1_800_000_000_000  # fixed: the events of both runs must be comparable
    per_batch = []
    profiler = None
    for i, blob in enumerate(batches):
        per_bucket = pickle.loads(blob)
        kinds: dict[str, int] = {}
        rows = 0
        if profile and i == len(batches) - 1:
            profiler = cProfile.Profile()
            profiler.enable()
        began = time.process_time()
        for b in range(BUCKETS):
            processor.init(handles[b])  # type: ignore[arg-type]
            rows += per_bucket[b].num_rows
            for events in handler(processor, (b,), _frames(per_bucket[b]), _Timer(now_ms)):
                out = pa.RecordBatch.from_pandas(events, preserve_index=False)
                digest.update(out.to_pandas().to_json().encode())
                for event, kind, explained in zip(
                    events["event"], events["kind"], events["explanation"], strict=True
                ):
                    k = f"{event} {kind or ''}{' explained' if explained is not None else ''}".strip()
                    kinds[k] = kinds.get(k, 0) + 1
        cpu = time.process_time() - began
        if profiler is not None:
            profiler.disable()
        per_batch.append(
            {"rows": rows, "cpu_s": round(cpu, 2), "us_per_row": round(cpu / rows * 1e6, 1), "events": kinds}
        )
    top = None
    if profiler is not None:
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(25)
        top = text.getvalue()
    return {"paused": paused, "batches": per_batch, "events_sha256": digest.hexdigest(), "profile": top}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_stage2", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument(
        "--batch", type=int, default=100_000, help="snapshots per batch (bench_stream's batch)"
    )
    parser.add_argument("--batches", type=int, default=4, help="batches (the first is a warm-up)")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each way, alternately")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="one more run (GC paused), cProfile's top functions of its last batch",
    )
    args = parser.parse_args(argv)
    batches = stage2_batches(args.batch, args.batches)
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
    print("events per batch (last run):", json.dumps(runs[-1]["batches"][-1]["events"]))
    same = len({r["events_sha256"] for r in runs}) == 1
    print(f"events identical in every run: {same}")
    print(json.dumps({"benchmark": "bench_stage2", "batch": args.batch, "batches": args.batches,
                      "identical_events": same, "runs": [{k: v for k, v in r.items() if k != "profile"} for r in runs]}))  # fmt: skip
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
