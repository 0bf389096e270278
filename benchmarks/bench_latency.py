"""Detection latency: from an orphan's first write to its OPENED abort candidate, with the pipeline warm.

`python -m benchmarks.bench_latency [--per-kind 20] [--spacing-s 3] [--interval 10] [--trigger "5 seconds"]`
starts its own one-node test bed (partition verification off, 512 MB heap, temporary directory, and Kafka's
default 50 partitions of `__transaction_state`: harness.detection_bed), `txnwatch collect` as a subprocess and the
streaming job (all three queries, `local[2]`, 4 shuffle partitions as `txnwatch stream` builds it) in this
process, and a steady transactional workload (committed and aborted transactions, 5/s) for the whole run. Every
setting defaults to what the project ships: the collector's sweep interval (`common.settings.CollectorSettings`,
10 s), the job's trigger (`StreamSettings`, 5 s), the grace and clock-skew tolerance (`DetectionLimits`, 4 s and
2 s). Once the job has run a few batches, it makes real orphans of
every kind dev/workload.py knows, round robin, one run every `--spacing-s` seconds, until each kind has at least
`--per-kind` orphans:

- after-commit (`hanging`), after-abort via a late produce (`hanging-after-abort`), on `__consumer_offsets`
  (`hanging-offsets`), several partitions of one producer (`hanging-multi`, 3 orphans per run).

Latency of one orphan = CreateTime of its first OPENED record on `<prefix>.abort-candidates` (the job's driver
writes it) − the orphan batch's timestamp (the producer's clock, which is this machine's). Any candidate that
names no orphan is a false positive (the steady workload makes none). The last line of stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import itertools
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from kafka import KafkaAdminClient

from benchmarks.harness import (
    ORPHAN_KINDS,
    Steady,
    loadavg,
    log,
    machine,
    make_orphans,
    orphan_key,
    pipeline,
    shipped_interval_s,
    shipped_trigger,
    summary,
    transaction_log_partitions,
    wait_until,
)
from detectors.models import DetectionLimits
from dev.workload import ensure_topics

Json = dict[str, Any]


def run(args: argparse.Namespace) -> Json:
    workdir = Path(tempfile.mkdtemp(prefix="txnwatch-bench-latency-"))
    result: Json = {
        "benchmark": "latency",
        "command": "python -m benchmarks.bench_latency " + " ".join(args.argv),
        "machine": machine(),
        "settings": {
            "interval_s": args.interval,
            "trigger": args.trigger,
            "grace_ms": args.grace_ms,
            "clock_skew_ms": args.clock_skew_ms,
        },
        "loadavg_start": loadavg(),
        "started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
    }
    kinds = args.kinds
    detection = {"grace_ms": args.grace_ms, "clock_skew_ms": args.clock_skew_ms}
    with pipeline(
        workdir, interval_s=args.interval, trigger=args.trigger, detection_overrides=detection
    ) as p:
        wait_until(lambda: p.first_batches_done(1), 300, "the job's first batch")
        # The scenarios' topics exist before the first orphan, so no orphan waits for a new topic's metadata.
        admin = KafkaAdminClient(bootstrap_servers=p.bootstrap, client_id="bench-admin")
        try:
            ensure_topics(admin, ["lat-hanging", "lat-hanging-after-abort"], 3)
            ensure_topics(admin, ["lat-hanging-multi"], 4)
            ensure_topics(admin, ["lat-hanging-offsets"], 1)
        finally:
            admin.close()
        steady = Steady(p.bootstrap, "lat-steady-", rate=5.0)
        steady.start()
        wait_until(lambda: p.first_batches_done(1 + args.warm_batches), 300, "warm-up batches")
        log(f"warm (load {loadavg()}); making orphans: {args.per_kind} per kind of {kinds}")
        loads = [loadavg()]
        truths: list[Json] = []
        counts = dict.fromkeys(kinds, 0)
        made_runs = 0
        for kind in itertools.cycle(kinds):
            if all(n >= args.per_kind for n in counts.values()):
                break
            if counts[kind] >= args.per_kind:
                continue
            began = time.monotonic()
            orphans = make_orphans(p.bootstrap, kind, "lat-")
            made_runs += 1
            truths.extend(orphans)
            counts[kind] += len(orphans)
            if made_runs % 10 == 0:
                loads.append(loadavg())
                log(
                    f"{made_runs} runs, {len(truths)} orphans, {len(p.watcher.opened())} opened (load {loads[-1]})"
                )
            time.sleep(max(0.0, args.spacing_s - (time.monotonic() - began)))
        last_made = time.monotonic()
        # Measured, not assumed: the log the job and the collector followed in this run.
        result["settings"]["transaction_log_partitions"] = transaction_log_partitions(p.bootstrap)
        wanted = {orphan_key(t) for t in truths}

        def all_found() -> bool:
            return wanted <= set(p.watcher.opened())

        try:
            wait_until(all_found, args.tail_s, "every orphan's candidate", poll_s=2.0)
        except TimeoutError as exc:
            log(str(exc))
        result["tail_s"] = round(time.monotonic() - last_made, 1)
        steady.stop()
        loads.append(loadavg())
        opened = p.watcher.opened()
        durations = p.reconcile_durations_s()
        result["steady_transactions"] = steady.transactions
        result["steady_error"] = repr(steady.error) if steady.error else None
    rows: list[Json] = []
    for t in truths:
        s = opened.get(orphan_key(t))
        rows.append(
            {
                "kind": t["orphan_kind"],
                "topic": t["topic"],
                "partition": t["partition"],
                "written_ms": t["start_timestamp_ms"],
                "latency_s": None
                if s is None
                else round((s.record_ts_ms - t["start_timestamp_ms"]) / 1000, 2),
                "reason": None if s is None else s.candidate.reason.value,
            }
        )
    false_positives = [k for k in opened if k not in wanted]
    per_kind = {
        k: summary([r["latency_s"] for r in rows if r["kind"] == k and r["latency_s"] is not None])
        | {
            "orphans": sum(r["kind"] == k for r in rows),
            "missed": sum(r["kind"] == k and r["latency_s"] is None for r in rows),
        }
        for k in kinds
    }
    result.update(
        orphans=len(rows),
        found=sum(r["latency_s"] is not None for r in rows),
        false_positives=len(false_positives),
        all=summary([r["latency_s"] for r in rows if r["latency_s"] is not None]),
        per_kind=per_kind,
        reasons=sorted({r["reason"] for r in rows if r["reason"]}),
        reconcile_batch_s=summary(durations),
        loadavg_during=loads,
        loadavg_end=loadavg(),
        rows=rows,
    )
    return result


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_latency",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--per-kind", type=int, default=20, help="orphans wanted per kind (default %(default)s)"
    )
    parser.add_argument("--kinds", nargs="+", default=list(ORPHAN_KINDS), choices=list(ORPHAN_KINDS))
    parser.add_argument("--spacing-s", type=float, default=3.0, help="seconds between orphan runs")
    parser.add_argument(
        "--interval",
        type=float,
        default=shipped_interval_s(),
        help="the collector's sweep interval in seconds (default: the shipped %(default)s)",
    )
    parser.add_argument(
        "--trigger", default=shipped_trigger(), help="the job's --trigger (default: the shipped %(default)s)"
    )
    defaults = DetectionLimits()
    parser.add_argument(
        "--grace-ms", type=int, default=defaults.grace_ms, help="detection.grace_ms (default %(default)s)"
    )
    parser.add_argument(
        "--clock-skew-ms",
        type=int,
        default=defaults.clock_skew_ms,
        help="detection.clock_skew_ms (default %(default)s)",
    )
    parser.add_argument("--warm-batches", type=int, default=3, help="reconcile batches after the first one")
    parser.add_argument("--tail-s", type=float, default=120.0, help="wait this long after the last orphan")
    parser.add_argument("--out", type=Path, help="also write the JSON result here")
    return parser


def main(argv: list[str] | None = None) -> int:
    import sys

    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv
    result = run(args)
    a = result["all"]
    log(
        f"{result['found']}/{result['orphans']} found, {result['false_positives']} false positives; latency "
        f"p50 {a.get('p50')} s, p95 {a.get('p95')} s, max {a.get('max')} s; load {result['loadavg_start']} → "
        f"{result['loadavg_end']}"
    )
    line = json.dumps(result)
    if args.out:
        args.out.write_text(line + "\n")
    print(line)
    return 0 if result["found"] == result["orphans"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
