"""What the job and the collector cost when nothing happens, and on a busy cluster.

`python -m benchmarks.bench_idle [--warmup-s 90] [--measure-s 120] [--busy-rate 5]
[--variants shipped no-data-batches] [--out benchmarks/results/idle.json]`
starts, for each variant in turn (each in a process of its own, so each has its own JVM), a one-node test bed
(harness.detection_bed), `txnwatch collect` and the streaming job at their shipped defaults (a sweep every 10 s, a
probe every 1 s, the job's 5 s trigger, `local[2]`). After `--warmup-s` it measures, over `--measure-s` each:

- **quiet**: no transaction at all on the cluster;
- **busy**: dev/workload.py's steady scenario (committed and aborted transactions, `--busy-rate` a second) in a
  process of its own, left out of both figures.

The job's figure is this process and its descendants (the driver's Python, its JVM, the Python workers; the
candidates watcher's consumer thread is in it too), the collector's its own process: CPU seconds per second of
wall time, from /proc. Variants: `shipped` (the job's conf as `txnwatch stream` sets it) and `no-data-batches`
(`spark.sql.streaming.noDataMicroBatches.enabled=true`, Spark's default: every trigger runs a batch, data or not).
The reconcile batches run in each window are counted from the query's progress. The last line of stdout is one
JSON object.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import (
    job_cpu_s,
    loadavg,
    log,
    machine,
    pipeline,
    process_cpu_s,
    shipped_interval_s,
    shipped_trigger,
)
from dev.kafka import ROOT

Json = dict[str, Any]

VARIANTS: dict[str, dict[str, str]] = {
    "shipped": {},
    "no-data-batches": {"spark.sql.streaming.noDataMicroBatches.enabled": "true"},
}

# Left out of the job's figure: the broker, the collector (measured on its own), the busy phase's workload.
NOT_THE_JOB = ("kafka.Kafka", "txnwatch_cli", "dev.workload")


def _batches(running: Any, since_ms: float) -> tuple[int, int]:
    """Reconcile batches (all, with input rows) whose progress began at or after `since_ms` (epoch ms)."""
    from datetime import datetime

    q = next(q for q in running.queries if q.name == "txnwatch-reconcile")
    ids: dict[int, int] = {}
    for p in q.recentProgress:
        began = datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp() * 1000
        if began >= since_ms:
            ids[p["batchId"]] = max(ids.get(p["batchId"], 0), p.get("numInputRows", 0))
    return len(ids), sum(1 for rows in ids.values() if rows)


def _window(p: Any, seconds: float) -> Json:
    since_ms = time.time() * 1000
    job0, col0, wall0 = job_cpu_s(NOT_THE_JOB), process_cpu_s(p.collector.pid), time.monotonic()
    time.sleep(seconds)
    wall = time.monotonic() - wall0
    job = (job_cpu_s(NOT_THE_JOB) - job0) / wall
    collector = (process_cpu_s(p.collector.pid) - col0) / wall
    batches, with_rows = _batches(p.running, since_ms)
    return {
        "seconds": round(wall, 1),
        "job_cpu_s_per_s": round(job, 3),
        "collector_cpu_s_per_s": round(collector, 3),
        "together_cpu_s_per_s": round(job + collector, 3),
        "reconcile_batches": batches,
        "reconcile_batches_with_rows": with_rows,
        "load": loadavg(),
    }


def run_variant(name: str, args: argparse.Namespace) -> Json:
    with (
        tempfile.TemporaryDirectory(prefix="txnwatch-bench-idle-") as tmp,
        pipeline(Path(tmp), spark_conf=VARIANTS[name]) as p,
    ):
        log(f"{name}: warming up {args.warmup_s:.0f}s (load {loadavg()})")
        time.sleep(args.warmup_s)
        quiet = _window(p, args.measure_s)
        log(f"{name}: quiet {quiet}")
        busy_s = args.measure_s + 30
        steady = subprocess.Popen(
            [
                *(sys.executable, "-m", "dev.workload", "--bootstrap-server", p.bootstrap),
                *("--scenario", "steady", "--seconds", str(busy_s), "--rate", str(args.busy_rate)),
                *("--topic-prefix", "idle-steady-"),
            ],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            time.sleep(15)  # its producers up and transactions flowing
            busy = _window(p, args.measure_s)
        finally:
            steady.wait(timeout=busy_s + 120)
        log(f"{name}: busy {busy}")
    return {"variant": name, "spark_conf": VARIANTS[name], "quiet": quiet, "busy": busy}


def run(args: argparse.Namespace) -> Json:
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    results = []
    for name in args.variants:
        child = subprocess.run(
            [
                *(sys.executable, "-m", "benchmarks.bench_idle", "--variant", name),
                *("--warmup-s", str(args.warmup_s), "--measure-s", str(args.measure_s)),
                *("--busy-rate", str(args.busy_rate)),
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
            check=True,
        )
        results.append(json.loads(child.stdout.strip().splitlines()[-1]))
    return {
        "benchmark": "idle",
        "started": started,
        "command": "python -m benchmarks.bench_idle " + " ".join(sys.argv[1:]),
        "machine": machine(),
        "settings": {
            "interval_s": shipped_interval_s(),
            "probe_interval_ms": 1000,
            "trigger": shipped_trigger(),
            "warmup_s": args.warmup_s,
            "measure_s": args.measure_s,
            "busy_rate": args.busy_rate,
        },
        "variants": results,
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_idle",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--warmup-s", type=float, default=90.0, help="after the job's start, before measuring"
    )
    parser.add_argument("--measure-s", type=float, default=120.0, help="each window (quiet, busy)")
    parser.add_argument("--busy-rate", type=float, default=5.0, help="busy: transactions a second")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--variant", choices=list(VARIANTS), help=argparse.SUPPRESS)  # one, in a child
    parser.add_argument("--out", type=Path, help="also write the JSON result here")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result = run_variant(args.variant, args) if args.variant else run(args)
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
