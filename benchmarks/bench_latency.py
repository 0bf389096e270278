"""Detection latency: from an orphan's first write to its OPENED abort candidate, with the pipeline warm.

`python -m benchmarks.bench_latency [--per-kind 20] [--spacing-s 3] [--interval 10] [--probe-interval-ms 1000]
[--trigger "5 seconds"] [--stack]`
starts its own one-node test bed (partition verification off, 512 MB heap, temporary directory, and Kafka's
default 50 partitions of `__transaction_state` and `__consumer_offsets`: harness.detection_bed), `txnwatch
collect` as a subprocess and the
streaming job (all three queries, `local[2]`, 4 shuffle partitions as `txnwatch stream` builds it) in this
process, and a steady transactional workload (committed and aborted transactions, 5/s) for the whole run. Every
setting defaults to what the project ships: the collector's sweep interval (`common.settings.CollectorSettings`,
10 s) and probe interval (1 s), the job's trigger (`StreamSettings`), the grace and clock-skew tolerance
(`DetectionLimits`, 4 s and 2 s). Once the job has run a few batches, it makes real orphans of every kind
dev/workload.py knows, round robin, one run every `--spacing-s` seconds, until each kind has at least `--per-kind`
orphans, each run on topics of its own (so each orphan is the oldest open transaction of its partition, as a
hanging transaction on a real cluster is; `--stack` puts every run of a kind on the same partitions instead):

- after-commit (`hanging`), after-abort via a late produce (`hanging-after-abort`), on `__consumer_offsets`
  (`hanging-offsets`), several partitions of one producer (`hanging-multi`, 3 orphans per run);

each kind twice over (`--owners`): with an owner that restarts and closes at once, and with one that lives on (the
same producer commits a one-record transaction on another topic every `--busy-ms` for `--busy-for-s`, in a
process of its own, then restarts: a Kafka Streams thread or an application after a late write). A busy owner's
orphan counts as found while it still committed when its candidate came within the busy period.

Latency of one orphan = CreateTime of its first OPENED record on `<prefix>.abort-candidates` (the job's driver
writes it) − the orphan batch's timestamp (the producer's clock, which is this machine's). Where it went
(`breakdown`, read back from the snapshot topic): the collector's first sighting, the report the candidate's proof
rests on (its evidence's `observed_at_ms`), that report on the topic, and the job's part from there to the
candidate; `ordered_proofs` counts the proofs on a report the clocks had not settled yet (`detectors.rules.settled`
false: ordered by the transaction log's offsets).
Any candidate that names no orphan is a false positive (the steady workload makes none). The last line of stdout
is one JSON object.
"""

from __future__ import annotations

import argparse
import itertools
import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition

from benchmarks.harness import (
    ORPHAN_KINDS,
    OWNERS,
    BusyOwners,
    Steady,
    job_cpu_s,
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
from common.settings import CollectorSettings
from detectors.contract import SNAPSHOT_TYPE, TYPE_HEADER
from detectors.models import DetectionLimits, PartitionSnapshot
from detectors.rules import TxnFacts, settled
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
            "probe_interval_ms": args.probe_interval_ms,
            "trigger": args.trigger,
            "grace_ms": args.grace_ms,
            "clock_skew_ms": args.clock_skew_ms,
            "owners": args.owners,
            "busy_ms": args.busy_ms,
            "busy_for_s": args.busy_for_s,
        },
        "loadavg_start": loadavg(),
        "started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
    }
    kinds = args.kinds
    # Every kind with each way its owner ends: the orphans of a (kind, owner) pair are counted apart.
    pairs = [(k, o) for k in kinds for o in args.owners]
    detection = {"grace_ms": args.grace_ms, "clock_skew_ms": args.clock_skew_ms}
    with pipeline(
        workdir,
        interval_s=args.interval,
        trigger=args.trigger,
        detection_overrides=detection,
        collector_args=("--probe-interval-ms", str(args.probe_interval_ms)),
    ) as p:
        wait_until(lambda: p.first_batches_done(1), 300, "the job's first batch")
        # The scenarios' topics exist before the first orphan, so no orphan waits for a new topic's metadata.
        admin = KafkaAdminClient(bootstrap_servers=p.bootstrap, client_id="bench-admin")
        try:
            # One topic per run: every orphan is the first open transaction of its partition, so it alone pins
            # the partition's last stable offset, as a hanging transaction does on a real cluster. Orphans piled
            # behind an older open one on one partition are a case of their own (--stack).
            for run_index in range(1 if args.stack else args.per_kind):
                for owner in args.owners:
                    prefix = run_prefix(run_index, owner)
                    ensure_topics(admin, [f"{prefix}hanging", f"{prefix}hanging-after-abort"], 3)
                    ensure_topics(admin, [f"{prefix}hanging-multi"], 4)
                    ensure_topics(admin, [f"{prefix}hanging-offsets"], 1)
                    if owner == "busy":
                        ensure_topics(admin, [f"{prefix}owner-busy"], 1)
        finally:
            admin.close()
        steady = Steady(p.bootstrap, "lat-steady-", rate=5.0)
        steady.start()
        wait_until(lambda: p.first_batches_done(1 + args.warm_batches), 300, "warm-up batches")
        log(
            f"warm (load {loadavg()}); making orphans: {args.per_kind} per kind of {kinds}, owners {args.owners}"
        )
        loads = [loadavg()]
        cpu_from, wall_from = job_cpu_s(), time.monotonic()
        truths: list[Json] = []
        counts = dict.fromkeys(pairs, 0)
        made_runs = 0
        runs = dict.fromkeys(pairs, 0)
        busy = BusyOwners(p.bootstrap, args.busy_ms, args.busy_for_s, workdir)
        for pair in itertools.cycle(pairs):
            if all(n >= args.per_kind for n in counts.values()):
                break
            if counts[pair] >= args.per_kind:
                continue
            kind, owner = pair
            began = time.monotonic()
            prefix = run_prefix(0 if args.stack else runs[pair], owner)
            orphans = busy.make(kind, prefix) if owner == "busy" else make_orphans(p.bootstrap, kind, prefix)
            runs[pair] += 1
            made_runs += 1
            truths.extend(orphans)
            counts[pair] += len(orphans)
            if made_runs % 10 == 0:
                loads.append(loadavg())
                log(
                    f"{made_runs} runs, {len(truths)} orphans, {len(p.watcher.opened())} opened, "
                    f"{busy.running()} owners busy (load {loads[-1]})"
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
        # Found while its owner still committed: a busy owner's orphan found after the owner ended would be the
        # restart's proof, not the busy owner's.
        result["busy_owner_exits"] = busy.close(args.busy_for_s + 60)
        # CPU per second of the orphan phase: the job's JVM and Python workers, and this process (the driver's
        # Python, and the workloads' producers); not the broker's or the collector's.
        result["job_cpu_s_per_s"] = round((job_cpu_s() - cpu_from) / (time.monotonic() - wall_from), 2)
        steady.stop()
        loads.append(loadavg())
        opened = p.watcher.opened()
        durations = p.reconcile_durations_s()
        limits = DetectionLimits(grace_ms=args.grace_ms, clock_skew_ms=args.clock_skew_ms)
        proofs = {key: seen.candidate.evidence.observed_at_ms for key, seen in opened.items()}
        reports = proving_reports(p.bootstrap, p.settings.topics.producer_state, truths, limits, proofs)
        result["steady_transactions"] = steady.transactions
        result["steady_error"] = repr(steady.error) if steady.error else None
    rows: list[Json] = []
    for t in truths:
        s = opened.get(orphan_key(t))
        written = t["start_timestamp_ms"]
        report = reports.get(orphan_key(t))
        rows.append(
            {
                "kind": t["orphan_kind"],
                "owner": t["owner"],
                # a busy owner's orphan: found while the owner still committed (its busy period after the orphan)
                "while_busy": None
                if s is None or t["owner"] != "busy"
                else s.record_ts_ms - written < args.busy_for_s * 1000,
                "topic": t["topic"],
                "partition": t["partition"],
                "written_ms": written,
                "latency_s": None if s is None else round((s.record_ts_ms - written) / 1000, 2),
                "reason": None if s is None else s.candidate.reason.value,
                # Where the seconds went: the collector's first sighting, the report the proof rests on (its
                # request sent), that report on the snapshot topic, the job's part.
                "first_seen_s": None if report is None else round((report.seen_open_ms - written) / 1000, 2),
                "proving_report_s": None
                if report is None
                else round((report.observed_at_ms - written) / 1000, 2),
                "report_published_s": None
                if report is None
                else round((report.published_ms - written) / 1000, 2),
                "job_s": None
                if s is None or report is None
                else round((s.record_ts_ms - report.published_ms) / 1000, 2),
                # proven on a report before the clocks could settle it: ordered by the log's offsets
                "ordered": None if report is None else report.ordered,
            }
        )
    false_positives = [k for k in opened if k not in wanted]
    per_kind = {
        pair_name(k, o): summary(
            [r["latency_s"] for r in rows if (r["kind"], r["owner"]) == (k, o) and r["latency_s"] is not None]
        )
        | {
            "orphans": sum((r["kind"], r["owner"]) == (k, o) for r in rows),
            "missed": sum((r["kind"], r["owner"]) == (k, o) and r["latency_s"] is None for r in rows),
        }
        for k, o in pairs
    }
    per_owner = {
        o: summary([r["latency_s"] for r in rows if r["owner"] == o and r["latency_s"] is not None])
        | {
            "orphans": sum(r["owner"] == o for r in rows),
            "missed": sum(r["owner"] == o and r["latency_s"] is None for r in rows),
            "found_while_busy": sum(bool(r["while_busy"]) for r in rows if r["owner"] == o)
            if o == "busy"
            else None,
        }
        for o in args.owners
    }
    result.update(
        orphans=len(rows),
        found=sum(r["latency_s"] is not None for r in rows),
        false_positives=len(false_positives),
        all=summary([r["latency_s"] for r in rows if r["latency_s"] is not None]),
        per_kind=per_kind,
        per_owner=per_owner,
        reasons=sorted({r["reason"] for r in rows if r["reason"]}),
        ordered_proofs=sum(bool(r.get("ordered")) for r in rows),
        reconcile_batch_s=summary(durations),
        breakdown={
            part: summary([r[part] for r in rows if r[part] is not None])
            for part in ("first_seen_s", "proving_report_s", "report_published_s", "job_s")
        },
        loadavg_during=loads,
        loadavg_end=loadavg(),
        rows=rows,
    )
    return result


def run_prefix(run_index: int, owner: str = "restart") -> str:
    return f"lat-{run_index}-" if owner == "restart" else f"lat-{run_index}-{owner}-"


def pair_name(kind: str, owner: str) -> str:
    return f"{kind}, owner {'restarts' if owner == 'restart' else 'lives on'}"


@dataclass(frozen=True)
class ProvingReport:
    seen_open_ms: int  # the collector's first sighting of the orphan
    observed_at_ms: int  # the report the candidate's proof rests on: its request's send time
    published_ms: int  # that report's CreateTime on the snapshot topic
    ordered: bool  # that report came before the one that settles it by the clocks (rules.settled)


def proving_reports(
    bootstrap: str,
    topic: str,
    truths: list[Json],
    limits: DetectionLimits,
    proofs: dict[tuple[str, int, int, int], int],
) -> dict[tuple[str, int, int, int], ProvingReport]:
    """Per orphan, read back from the start of the snapshot topic: the report its candidate's evidence names
    (`proofs`: the `observed_at_ms` it was judged on), else the first report that settles it by the clocks."""
    wanted = {orphan_key(t) for t in truths}
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False
    )
    found: dict[tuple[str, int, int, int], ProvingReport] = {}
    try:
        parts = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
        consumer.assign(parts)
        ends = consumer.end_offsets(parts)
        while any(consumer.position(tp) < ends[tp] for tp in parts):
            for records in consumer.poll(timeout_ms=1000).values():
                for r in records:
                    if dict(r.headers).get(TYPE_HEADER) != SNAPSHOT_TYPE.encode() or r.value is None:
                        continue
                    snap = PartitionSnapshot.model_validate_json(r.value)
                    for t in snap.open_transactions:
                        key = (snap.topic, snap.partition, t.producer_id, t.start_offset)
                        if key not in wanted or t.seen_open_ms is None:
                            continue
                        facts = TxnFacts(
                            snap.topic, snap.partition, t.producer_id, t.first_batch_epoch, t.open_since_ms,
                            snap.observed_at_ms, seen_open_ms=t.seen_open_ms,
                        )  # fmt: skip
                        if proofs.get(key) == snap.observed_at_ms:
                            ordered = not settled(facts, limits)
                            found[key] = ProvingReport(
                                t.seen_open_ms, snap.observed_at_ms, r.timestamp, ordered
                            )
                        elif key not in found and key not in proofs and settled(facts, limits):
                            found[key] = ProvingReport(
                                t.seen_open_ms, snap.observed_at_ms, r.timestamp, False
                            )
    finally:
        consumer.close()
    return found


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
    parser.add_argument(
        "--owners",
        nargs="+",
        default=list(OWNERS),
        choices=list(OWNERS),
        help="how each orphan's owner ends: restart (at once) and busy (lives on: commits elsewhere every "
        "--busy-ms for --busy-for-s, then restarts); each kind is made with each (default: both)",
    )
    parser.add_argument(
        "--busy-ms", type=int, default=200, help="a busy owner's commit interval in ms (default %(default)s)"
    )
    parser.add_argument(
        "--busy-for-s",
        type=float,
        default=45.0,
        help="how long a busy owner commits after its orphan (default %(default)s)",
    )
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
    parser.add_argument(
        "--probe-interval-ms",
        type=int,
        default=CollectorSettings().probe_interval_ms,
        help="the collector's --probe-interval-ms, 0: full sweeps only (default: the shipped %(default)s)",
    )
    parser.add_argument(
        "--stack",
        action="store_true",
        help="every run of a kind on the same partitions, each orphan behind the open ones before it",
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
