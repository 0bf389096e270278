"""The reconcile query's throughput on coordinator logs shaped as real producers shape them, in one sitting.

`python -m benchmarks.bench_shapes [--shapes worst flink streams streams-varied] [--coordinator-batch 100000]
[--warmup-batches 3] [--steady-batches 4]` runs `benchmarks.bench_stream --only coordinator --plain-read` once per
shape, one after the other (each with its own test bed, and its plain read of the same input right after the
reconcile query, on the same session), and reports each shape's sustained rows/s, its share of the plain read,
the batch p50 and the CPU per 1k rows. The shapes (`__transaction_state` records, TV2, 50 partitions):

- **worst**: every transactional id used once, 2,000 interleaved (4 records an id): each record is an id the
  job has not seen, the most state round trips per record (bench_stream's default);
- **flink**: a new id per sink subtask per checkpoint, used once, 64 subtasks writing at a time (4 records an
  id, far fewer interleaved);
- **streams**: a Kafka Streams exactly_once_v2 application: 200 ids (threads), each committing 50 times in a row
  on the same partitions (its tasks'; 151 records an id; at the 100 ms commit interval that is 5 s of its log);
- **streams-varied**: the same, each transaction on partitions of its own (1-3 topics x 1-4 partitions drawn
  anew): every Prepare lists other partitions than the one before, so the decoder keeps far more of them.

The last line of stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
Json = dict[str, Any]

SHAPES: dict[str, tuple[str, ...]] = {
    "worst": ("--txns-per-id", "1", "--concurrent-ids", "2000"),
    "flink": ("--txns-per-id", "1", "--concurrent-ids", "64"),
    "streams": ("--txns-per-id", "50", "--concurrent-ids", "200", "--stable-partitions"),
    # The same with each transaction on partitions of its own: every Prepare lists other partitions than the
    # one before, which the decoder must keep (docs/streaming.md, stage 1), so far fewer records fold.
    "streams-varied": ("--txns-per-id", "50", "--concurrent-ids", "200"),
}


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def _phase(phases: list[Json], stage: str) -> Json:
    return next(p for p in phases if p["phase"] == "coordinator" and p["stage"] == stage)


def run_shape(shape: str, args: argparse.Namespace) -> Json:
    command = [
        *(sys.executable, "-m", "benchmarks.bench_stream", "--only", "coordinator", "--plain-read"),
        *("--coordinator-batch", str(args.coordinator_batch)),
        *("--warmup-batches", str(args.warmup_batches), "--steady-batches", str(args.steady_batches)),
        *SHAPES[shape],
    ]
    print(f"[bench shapes] {shape}: {' '.join(command[1:])} (load {loadavg()})", file=sys.stderr, flush=True)
    load_before = loadavg()
    done = subprocess.run(command, cwd=ROOT, stdout=subprocess.PIPE, text=True, check=True)
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    reconcile, plain = _phase(figures["phases"], "reconcile"), _phase(figures["phases"], "plain read")
    return {
        "shape": shape,
        "args": list(SHAPES[shape]),
        "input": figures["input"]["coordinator"],
        "reconcile_rows_per_s": reconcile["sustained_rows_per_s"],
        "plain_read_rows_per_s": plain["sustained_rows_per_s"],
        "share_of_plain_read": reconcile["share_of_plain_read"],
        "batch_s_p50": reconcile.get("batch_s_p50"),
        "cpu_ms_per_1k_rows": reconcile.get("cpu_ms_per_1k_rows"),
        "load_before": load_before,
        "load_after": loadavg(),
        "phases": figures["phases"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_shapes",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--coordinator-batch", type=int, default=100_000, help="maxOffsetsPerTrigger")
    parser.add_argument("--warmup-batches", type=int, default=3)
    parser.add_argument("--steady-batches", type=int, default=4)
    args = parser.parse_args(argv)
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    shapes = [run_shape(s, args) for s in args.shapes]
    print(
        json.dumps(
            {
                "benchmark": "shapes",
                "started": started,
                "command": "python -m benchmarks.bench_shapes " + " ".join(argv or sys.argv[1:]),
                "shapes": shapes,
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
