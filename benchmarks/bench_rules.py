"""Classification throughput of detectors.rules on one core: the lean `decide` path and the model `classify` path.

Run: .venv/bin/python -m benchmarks.bench_rules [--n 200000] [--repeat 5]

The workload mixes verdicts the way a healthy cluster does (mostly open transactions owned by an Ongoing
coordinator, a few completed, hanging, preparing, retired and late ones). Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable

from detectors.models import (
    CoordinatorRecord,
    CoordinatorState,
    DetectionLimits,
    OpenTransaction,
    PartitionSnapshot,
    TopicPartition,
    VerdictKind,
)
from detectors.rules import CoordFacts, TxnFacts, build_verdict, classify, coord_facts, decide, txn_facts

T0 = 1_750_000_000_000
TARGET_PER_S = 200_000
LIMITS = DetectionLimits()
# (share, scenario) of the workload
MIX = [
    (0.80, "ongoing-listed"),
    (0.05, "completed"),
    (0.04, "not-listed"),
    (0.03, "no-coordinator"),
    (0.03, "previous-producer-id"),
    (0.03, "prepare-commit"),
    (0.02, "late"),
]

Row = tuple[str, int, int, int, int, int, int | None, int | None]


def _coordinator(scenario: str, pid: int, topic: str, partition: int, now: int) -> CoordinatorRecord | None:
    listed = (
        TopicPartition(topic=topic, partition=partition),
        TopicPartition(topic=topic, partition=partition + 1),
    )
    base = {
        "transactional_id": f"tx-{pid}",
        "producer_id": pid,
        "producer_epoch": 5,
        "client_transaction_version": 2,
        "transaction_timeout_ms": 60_000,
        "start_timestamp_ms": now - 30_000,
        "last_update_timestamp_ms": now - 30_000,
    }
    if scenario == "no-coordinator":
        return None
    if scenario in ("ongoing-listed", "late"):
        timeout = 3_600_000 if scenario == "late" else 60_000
        return CoordinatorRecord(
            **{**base, "transaction_timeout_ms": timeout}, state=CoordinatorState.ONGOING, partitions=listed
        )
    if scenario == "not-listed":
        return CoordinatorRecord(**base, state=CoordinatorState.ONGOING, partitions=listed[1:])
    if scenario == "completed":
        return CoordinatorRecord(**base, state=CoordinatorState.COMPLETE_COMMIT, partitions=())
    if scenario == "prepare-commit":
        return CoordinatorRecord(**base, state=CoordinatorState.PREPARE_COMMIT, partitions=listed)
    if scenario == "previous-producer-id":
        return CoordinatorRecord(
            **{**base, "producer_id": pid + 1_000_000, "producer_epoch": 0},
            previous_producer_id=pid,
            state=CoordinatorState.COMPLETE_COMMIT,
            partitions=(),
        )
    raise AssertionError(scenario)


Models = list[tuple[OpenTransaction, PartitionSnapshot, CoordinatorRecord | None]]


def build_models(n: int, seed: int) -> Models:
    """n open transactions as models, one snapshot each, with the coordinator record of their scenario."""
    rng = random.Random(seed)
    now = T0
    scenarios = rng.choices([s for _, s in MIX], weights=[w for w, _ in MIX], k=n)
    out: Models = []
    for i, scenario in enumerate(scenarios):
        pid = 10_000 + i
        topic, partition = f"topic-{i % 50}", i % 64
        age = 20 * 60_000 if scenario == "late" else rng.randint(1_000, 120_000)
        txn = OpenTransaction(
            producer_id=pid,
            producer_epoch=5,
            coordinator_epoch=3,
            start_offset=1_000 + i,
            start_timestamp_ms=now - age,
            start_batch_producer_epoch=5,
            last_sequence=3,
            last_timestamp_ms=now - age // 2,
        )
        snap = PartitionSnapshot(
            cluster="bench",
            sweep_id="s",
            observed_at_ms=now,
            leader=i % 6,
            topic=topic,
            partition=partition,
            open_transactions=(txn,),
            max_transaction_timeout_ms=900_000,
        )
        out.append((txn, snap, _coordinator(scenario, pid, topic, partition, now)))
    return out


def build_lean(models: Models, n: int) -> tuple[list[Row], list[CoordFacts | None]]:
    """n lean rows (plain tuples, as a vectorised stage hands them over) and coordinator facts, cycling
    through the model workload with fresh producer ids."""
    rows: list[Row] = []
    coords: list[CoordFacts | None] = []
    for i in range(n):
        txn, snap, record = models[i % len(models)]
        shift = (i // len(models)) * 10_000_000
        t = txn_facts(txn, snap)
        rows.append(tuple(t._replace(producer_id=t.producer_id + shift)))  # type: ignore[arg-type]
        c = coord_facts(record) if record is not None else None
        if c is not None:
            c = c._replace(
                producer_id=c.producer_id + shift,
                previous_producer_id=c.previous_producer_id + shift if c.previous_producer_id >= 0 else -1,
            )
        coords.append(c)
    return rows, coords


def _rates(fn: Callable[[], object], n: int, repeat: int) -> dict[str, int]:
    """Throughput per CPU second (process time: what one core does, even on a shared machine) and per wall
    second, best and median of `repeat` runs."""
    cpu, wall = [], []
    for _ in range(repeat):
        c0, w0 = time.process_time(), time.perf_counter()
        fn()
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
    return {
        "cpu_best_per_s": round(n / min(cpu)),
        "cpu_median_per_s": round(n / statistics.median(cpu)),
        "wall_best_per_s": round(n / min(wall)),
        "wall_median_per_s": round(n / statistics.median(wall)),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--n", type=int, default=200_000, help="open transactions per run (lean paths)")
    p.add_argument("--model-n", type=int, default=20_000, help="open transactions per run (model path)")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)

    models = build_models(args.model_n, args.seed)
    rows, coords = build_lean(models, args.n)
    facts = [(TxnFacts(*row), c) for row, c in zip(rows, coords, strict=True)]
    now = T0

    def lean_prebuilt() -> None:
        for t, c in facts:
            decide(t, c, now, LIMITS)

    def lean_from_rows() -> None:
        # Facts built per row from plain tuples (e.g. an Arrow batch's rows), then decided.
        for row, c in zip(rows, coords, strict=True):
            decide(TxnFacts(*row), c, now, LIMITS)

    def model_classify() -> None:
        for txn, snap, record in models:
            classify(txn, snap, record, now_ms=now, limits=LIMITS, view_current_ms=snap.observed_at_ms)

    def emitting_pipeline() -> None:
        # What the job does: decide everything, build the Verdict model only for what it emits (not OPEN).
        for txn, snap, record in models:
            c = coord_facts(record) if record is not None else None
            d = decide(txn_facts(txn, snap), c, now, LIMITS)
            if d.kind is not VerdictKind.OPEN:
                build_verdict(d, txn, snap, record, now_ms=now, limits=LIMITS)

    results = []
    for name, fn, n in [
        ("decide (prebuilt facts)", lean_prebuilt, args.n),
        ("decide (TxnFacts from plain rows)", lean_from_rows, args.n),
        ("classify (models -> Verdict + evidence)", model_classify, args.model_n),
        ("models: decide all, build_verdict if not OPEN", emitting_pipeline, args.model_n),
    ]:
        fn()  # warm up
        results.append({"path": name, "n": n, **_rates(fn, n, args.repeat)})

    kinds = Counter(decide(t, c, now, LIMITS).kind.value for t, c in facts)
    width = max(len(r["path"]) for r in results)
    print(f"detectors.rules classification throughput, one core, python {platform.python_version()}")
    print(
        f"workload: {args.n} open transactions (model paths: {args.model_n}); verdicts {dict(sorted(kinds.items()))}"
    )
    cols = ("cpu best/s", "cpu median/s", "wall best/s", "wall median/s")
    print(
        f"{'path':<{width}}  {'n':>7}  "
        + "  ".join(f"{c:>13}" for c in cols)
        + f"  target {TARGET_PER_S:,}/s"
    )
    for r in results:
        keys = ("cpu_best_per_s", "cpu_median_per_s", "wall_best_per_s", "wall_median_per_s")
        ok = "ok" if int(r["cpu_median_per_s"]) >= TARGET_PER_S else "below"
        print(
            f"{r['path']:<{width}}  {r['n']:>7}  " + "  ".join(f"{int(r[k]):>13,}" for k in keys) + f"  {ok}"
        )
    print(
        json.dumps(
            {
                "benchmark": "bench_rules",
                "python": platform.python_version(),
                "machine": platform.machine(),
                "target_per_s": TARGET_PER_S,
                "verdicts": dict(sorted(kinds.items())),
                "results": results,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
