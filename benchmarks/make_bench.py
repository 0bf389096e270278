"""`make bench`: run the benchmarks, keep their raw figures, rewrite the tables of docs/BENCHMARKS.md.

`python -m benchmarks.make_bench [--only latency,peers] [--render-only] [--smoke]` runs each benchmark as
`python -m benchmarks.<module> ARGS` from the checkout, one after the other (never two at once: they share two
cores), takes the JSON object each prints last, and writes it with the run's facts (command, UTC start, wall time,
load average before and after, exit code) to `benchmarks/results/<name>.json`. It then rewrites every block
between `<!-- bench:<name> -->` and `<!-- /bench:<name> -->` in docs/BENCHMARKS.md from those files, so a table is
always the last run of its command. A benchmark that fails keeps its previous result file, and the exit code says
so. `--render-only` rewrites the tables from the files without running anything; `--smoke` runs the cheap ones
with tiny arguments into a temporary directory and renders a copy of the document there (tests use it).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
DOC = ROOT / "docs" / "BENCHMARKS.md"
Json = dict[str, Any]


@dataclass(frozen=True)
class Bench:
    name: str
    module: str
    args: tuple[str, ...]
    smoke_args: tuple[str, ...] | None  # None: not part of --smoke (needs a broker or minutes)


BENCHES: tuple[Bench, ...] = (
    Bench("codec", "bench_codec", (), ("--records", "300", "--repeat", "1")),
    Bench("rules", "bench_rules", ("--repeat", "7"), ("--n", "2000", "--model-n", "200", "--repeat", "1")),
    Bench("collector", "bench_collector", (), None),
    Bench(
        "stream",
        "bench_stream",
        (
            "--coordinator-batch",
            "100000",
            "--snapshot-batch",
            "100000",
            "--warmup-batches",
            "5",
            "--steady-batches",
            "6",
            # the same input through Spark's Kafka source alone (and the parse alone): the limit, side by side
            "--plain-read",
            # one more batch of each input profiled (py-spy, JFR): where the time goes
            "--profile",
        ),
        None,
    ),
    # The same 20k rows/s offered with a 10 s trigger: what a longer trigger buys in throughput.
    Bench(
        "stream_10s",
        "bench_stream",
        (
            "--trigger",
            "10 seconds",
            "--coordinator-batch",
            "200000",
            "--snapshot-batch",
            "200000",
            "--warmup-batches",
            "3",
            "--steady-batches",
            "5",
        ),
        None,
    ),
    Bench("catchup", "bench_catchup", ("--records", "1000000"), None),
    Bench("state1m", "bench_catchup", ("--records", "1000000", "--last-record-only", "--state"), None),
    # A steady batch once the job remembers 10k, 100k and 1M ids, on a 50-partition log (about 20 minutes).
    Bench("state", "bench_state", (), None),
    Bench("latency", "bench_latency", ("--per-kind", "20"), None),
    # What the margins cost (docs/BENCHMARKS.md, Detection latency): the defaults before this benchmark
    # (grace 10 s, skew 5 s); and today's defaults with a 1 s trigger, for those who pay for faster detection.
    Bench(
        "latency_strict",
        "bench_latency",
        ("--per-kind", "10", "--grace-ms", "10000", "--clock-skew-ms", "5000", "--owners", "restart"),
        None,
    ),
    Bench(
        "latency_fast",
        "bench_latency",
        ("--per-kind", "20", "--trigger", "1 second", "--owners", "restart"),
        None,
    ),
    Bench("peers", "bench_peers", (), None),
    # The job and the collector on a quiet and a busy cluster, shipped vs Spark's batch at every trigger.
    Bench("idle", "bench_idle", (), None),
    # The reconcile query on Streams-, Flink- and worst-case-shaped coordinator logs, each beside its plain read.
    Bench("shapes", "bench_shapes", (), None),
)


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def run_one(bench: Bench, args: tuple[str, ...], results: Path) -> bool:
    command = [sys.executable, "-m", f"benchmarks.{bench.module}", *args]
    shown = f"python -m benchmarks.{bench.module} {shlex.join(args)}".strip()
    print(f"[make bench] {bench.name}: {shown} (load {loadavg()})", file=sys.stderr, flush=True)
    meta: Json = {"command": shown, "started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())}
    meta["loadavg_before"] = loadavg()
    began = time.monotonic()
    done = subprocess.run(command, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    meta.update(
        wall_s=round(time.monotonic() - began, 1), loadavg_after=loadavg(), returncode=done.returncode
    )
    last = next((line for line in reversed(done.stdout.splitlines()) if line.startswith("{")), None)
    if last is None:
        print(f"[make bench] {bench.name}: no JSON result (exit {done.returncode})", file=sys.stderr)
        return False
    results.mkdir(parents=True, exist_ok=True)
    (results / f"{bench.name}.json").write_text(
        json.dumps({"meta": meta, "result": json.loads(last)}, indent=1) + "\n"
    )
    print(f"[make bench] {bench.name}: done in {meta['wall_s']} s (exit {done.returncode})", file=sys.stderr)
    return done.returncode == 0


# ------------------------------------------------------------------------------------------ rendering


def _n(v: Any, fmt: str = ",") -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float) and fmt == ",":
        return f"{v:,.1f}"
    return format(v, fmt)


def _load1(s: str | None) -> str:
    return s.split()[0] if s else "?"


def _meta_line(meta: Json) -> str:
    return (
        f"`{meta['command']}`, {meta['started_utc']} UTC, {meta['wall_s']:.0f} s, load average "
        f"{_load1(meta.get('loadavg_before'))} → {_load1(meta.get('loadavg_after'))}"
        + ("" if meta.get("returncode", 0) == 0 else f", exit {meta['returncode']}")
    )


def render_run(all_results: dict[str, Json]) -> str:
    machine: Json = {}
    for name in ("latency", "peers"):
        if name in all_results:
            machine = all_results[name]["result"].get("machine", {})
    lines = []
    if machine:
        lines.append(
            f"Machine: {machine.get('cpus')} cores; Python {machine.get('python')}; {machine.get('java')}; "
            f"PySpark {machine.get('pyspark')}; kafka-python {machine.get('kafka_python')}; broker "
            f"{str(machine.get('kafka_broker', '')).removesuffix('.jar')} (one KRaft node from the Maven jars)."
        )
        lines.append("")
    lines += ["| benchmark | command, start, wall, load average (1 min, before → after) |", "|---|---|"]
    for b in BENCHES:
        if b.name in all_results:
            lines.append(f"| {b.name} | {_meta_line(all_results[b.name]['meta'])} |")
    return "\n".join(lines)


# bench_latency's breakdown, in the order the seconds pass.
LATENCY_PARTS = (
    ("first_seen_s", "the collector's first sighting"),
    ("proving_report_s", "the report the proof rests on (sent)"),
    ("report_published_s", "that report on the snapshot topic"),
    ("job_s", "from there to the candidate (the job's part)"),
)


def _part_label(key: str, label: str, r: Json) -> str:
    # Runs before the proofs ordered by offsets (no `ordered_proofs`) took the first report that settles it.
    if key == "proving_report_s" and "ordered_proofs" not in r:
        return "the first report that settles it (sent)"
    return label


def render_latency(r: Json) -> str:
    lines = [
        "| orphans | found | false positives | p50 | p95 | max | min | reconcile batch p50 / p95 | load average "
        "start → during → end |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    a, batch = r.get("all", {}), r.get("reconcile_batch_s", {})
    during = r.get("loadavg_during") or []
    lines.append(
        f"| {r.get('orphans')} | {r.get('found')} | {r.get('false_positives')} | **{a.get('p50')} s** | "
        f"**{a.get('p95')} s** | {a.get('max')} s | {a.get('min')} s | {batch.get('p50')} / {batch.get('p95')} s | "
        f"{_load1(r.get('loadavg_start'))} → {max((float(x.split()[0]) for x in during), default=0):.1f} (max) → "
        f"{_load1(r.get('loadavg_end'))} |"
    )
    lines += ["", "| kind | orphans | found | p50 | p95 | max |", "|---|---|---|---|---|---|"]
    for kind, k in (r.get("per_kind") or {}).items():
        lines.append(
            f"| {kind} | {k.get('orphans')} | {k.get('orphans', 0) - k.get('missed', 0)} | {k.get('p50')} s | "
            f"{k.get('p95')} s | {k.get('max')} s |"
        )
    owners = r.get("per_owner") or {}
    if owners:
        lines += [
            "",
            "| the orphan's owner | orphans | found | found while it still committed | p50 | p95 | max |",
            "|---|---|---|---|---|---|---|",
        ]
        for owner, o in owners.items():
            ends = "lives on (commits elsewhere, then restarts)" if owner == "busy" else "restarts at once"
            busy = o.get("found_while_busy")
            lines.append(
                f"| {ends} | {o.get('orphans')} | {o.get('orphans', 0) - o.get('missed', 0)} | "
                f"{'—' if busy is None else busy} | {o.get('p50')} s | {o.get('p95')} s | {o.get('max')} s |"
            )
    parts = r.get("breakdown") or {}
    if parts:
        lines += [
            "",
            "| after the orphan's write | p50 | p95 | max |",
            "|---|---|---|---|",
            *(
                f"| {_part_label(key, label, r)} | {parts[key].get('p50')} s | {parts[key].get('p95')} s | "
                f"{parts[key].get('max')} s |"
                for key, label in LATENCY_PARTS
                if key in parts
            ),
        ]
    lines += ["", f"Reasons given: {', '.join(r.get('reasons') or []) or 'none'}."]
    if r.get("ordered_proofs") is not None:
        lines.append(
            f"Proven on a report the clocks had not settled yet (ordered by the transaction log's offsets): "
            f"{r['ordered_proofs']} of {r.get('found')}."
        )
    if r.get("job_cpu_s_per_s") is not None:
        lines.append(
            f"CPU while the orphans were made and found: {r['job_cpu_s_per_s']} s per s (the job's JVM and Python "
            "workers, and the benchmark's process with the driver's Python and the workloads' producers)."
        )
    s = r.get("settings") or {}
    if s:
        probe = s.get("probe_interval_ms")
        lines.append(
            f"Settings: collector `--interval {s.get('interval_s')}`"
            + (f" `--probe-interval-ms {probe}`" if probe is not None else "")
            + f", trigger {s.get('trigger')}, grace "
            f"{s.get('grace_ms')} ms, clock-skew tolerance {s.get('clock_skew_ms')} ms"
            + (
                f"; `__transaction_state` of {s['transaction_log_partitions']} partitions."
                if s.get("transaction_log_partitions")
                else "."
            )
        )
    return "\n".join(lines)


PEER_SCENARIOS = (
    "steady",
    "late",
    "long legit",
    "hanging",
    "hanging-after-abort",
    "hanging-offsets",
    "live under coordinator lag",
)
HANGING = ("hanging", "hanging-after-abort", "hanging-offsets")
JOB_CLIENTS = "txnwatch job (Spark's Kafka clients)"  # bench_peers.request_owner's name for them
PEER_LABEL = {
    "hanging": "hanging after commit",
    "hanging-after-abort": "hanging after abort (late produce)",
    "hanging-offsets": "hanging on `__consumer_offsets`",
}


def render_peers(r: Json) -> str:
    tools = (
        "find-hanging 15 min",
        "find-hanging 0 min",
        "kafka-python 15 min",
        "kafka-python 0 min",
        "JMX late",
        "txnwatch",
    )
    first, fps = r.get("first_found_s", {}), r.get("false_positives", {})
    scenarios = r.get("scenarios", {})
    scen_keys: dict[str, set[tuple[str, int, int]]] = {
        s: {(t["topic"], t["partition"], t["producer_id"]) for t in v.get("truth", [])}
        for s, v in scenarios.items()
    }
    duration = r.get("observation_s") or r.get("duration_s") or 0.0
    header = (
        "| scenario | " + " | ".join(f"`{t}`" if t != "txnwatch" else "**txnwatch**" for t in tools) + " |"
    )
    lines = [header, "|---|" + "---|" * len(tools)]
    for s in PEER_SCENARIOS:
        if s not in scenarios and s != "steady":
            continue
        cells = []
        for t in tools:
            if s in HANGING:
                v = first.get(t, {}).get(s)
                cells.append(f"found at {v:.0f} s" if v is not None else f"not in {duration:.0f} s")
            else:
                wrong = [k for k in fps.get(t, []) if tuple(k) in scen_keys.get(s, set())]
                if s == "steady":
                    named = {tuple(k) for v in scen_keys.values() for k in v}
                    wrong = [k for k in fps.get(t, []) if tuple(k) not in named]
                cells.append(f"**{len(wrong)} false**" if wrong else "none (correct)")
        lines.append(f"| {PEER_LABEL.get(s, s)} | " + " | ".join(cells) + " |")
    walls, reqs = r.get("wall_s", {}), r.get("requests_per_run", {})
    by_owner = r.get("requests_by_owner", {})
    total_s = r.get("duration_s") or duration or 60.0
    ours = (
        f"{by_owner.get('txnwatch collector and job driver', 0) / (total_s / 5):.1f} per 5 s sweep (collector and "
        f"driver) + {by_owner.get(JOB_CLIENTS, 0) / (total_s / 60):,.0f}/min "
        "(Spark's Kafka source and sink)"
    )
    lines.append(
        "| wall time per run (median) | "
        + " | ".join(
            (f"{walls.get(t, {}).get('p50')} s" if walls.get(t, {}).get("n") else "continuous")
            if t != "txnwatch"
            else f"continuous (batch p50 {r.get('reconcile_batch_s', {}).get('p50')} s)"
            for t in tools
        )
        + " |"
    )
    lines.append(
        "| requests per run | "
        + " | ".join(
            (str(reqs.get(t)) if reqs.get(t) is not None else "JMX read (no Kafka request)")
            if t != "txnwatch"
            else ours
            for t in tools
        )
        + " |"
    )
    bd = r.get("backdated", {}).get("found", {})
    if bd:
        lines.append(
            "| backdated 21 min: found | "
            + " | ".join(
                ", ".join(bd[t])
                if isinstance(bd.get(t), list) and bd.get(t)
                else ("—" if t not in bd else "none")
                for t in tools
            )
            + " |"
        )
    mins = total_s / 60
    lines += [
        "",
        "Requests the broker logged per client over the run ("
        + f"{r.get('duration_s') or duration:.0f} s): "
        + "; ".join(
            f"{k} {v:,} ({v / mins:,.0f}/min)" for k, v in sorted(by_owner.items(), key=lambda kv: -kv[1])
        )
        + ".",
        "",
        "Outcomes: "
        + "; ".join(f"{k}: {v}" for k, v in (r.get("outcomes") or {}).items())
        + f"; steady transactions {r.get('steady_transactions')}; burst transactions "
        f"{r.get('burst_transactions')}. Load average {_load1(r.get('loadavg_start'))} at the start, "
        f"{_load1(r.get('loadavg_observation_end'))} at the end of the observation.",
    ]
    lag = r.get("view_lag_samples") or []
    if lag:
        behind = [x["records_behind"] for x in lag if x.get("records_behind") is not None]
        not_current = sum(1 for x in lag if not x.get("current"))
        lines.append(
            f"While the live transaction was open, the job's view was not current in {not_current} of {len(lag)} "
            f"samples (records behind up to {max(behind, default=0):,})."
        )
    return "\n".join(lines)


def _cpu_split(ph: Json) -> str:
    cpu = ph.get("cpu_s_by_process") or {}
    total = sum(cpu.values())
    if not total:
        return "n/a"
    return " / ".join(f"{cpu.get(k, 0) / total:.0%}" for k in ("jvm", "python_workers", "driver"))


def render_stream(r: Json) -> str:
    """One row per phase: the reconcile query of each input and, when the run had them (`--plain-read`), the same
    input through Spark's Kafka source alone and through the job's parse alone, with each rate as a share of the
    plain read measured in the same run."""
    lines = [
        "| input | query | batch (rows) | sustained rows/s | share of the plain read | batch p50 | batch p99 | CPU ms "
        "per 1k rows | CPU JVM / Python workers / driver | rows/s the CPU allows on 2 idle cores | target met | "
        "load average before → after |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    target = r.get("targets", {})
    for ph in r.get("phases", []):
        stage = ph.get("stage", "reconcile")
        met = (ph.get("sustained_rows_per_s") or 0) >= target.get("rows_per_s", 20_000) and (
            ph.get("batch_s_p99") or 1e9
        ) < target.get("p99_below_s", 5)
        share = ph.get("share_of_plain_read")
        rate = _n(ph.get("sustained_rows_per_s"))
        lines.append(
            f"| {ph['phase']} | {stage if stage != 'reconcile' else 'reconcile (the job)'} | "
            f"{_n(ph.get('max_offsets_per_trigger'))} | {f'**{rate}**' if stage == 'reconcile' else rate} | "
            f"{f'{share:.0%}' if share is not None and stage != 'plain read' else '—'} | "
            f"{ph.get('batch_s_p50')} s | {ph.get('batch_s_p99')} s | {_n(ph.get('cpu_ms_per_1k_rows'))} | "
            f"{_cpu_split(ph)} | {_n(ph.get('idle_2core_rows_per_s'))} | "
            f"{('yes' if met else 'no') if stage == 'reconcile' else '—'} | {_load1(ph.get('loadavg_before'))} → "
            f"{_load1(ph.get('loadavg_after'))} |"
        )
    for ph in r.get("phases", []):
        stage = ph.get("stage", "reconcile")
        lines.append("")
        lines.append(
            f"{ph['phase']}{'' if stage == 'reconcile' else f' ({stage})'} steady batches (s): "
            f"{', '.join(str(x) for x in ph.get('batch_s', []))}."
        )
    for ph in r.get("phases", []):
        lines += _profile_lines(ph)
    per_id = r.get("state_per_transactional_id")
    if per_id:
        lines += [
            "",
            f"State per transactional id at {_n(per_id.get('transactional_ids'))} ids: payload "
            f"{per_id.get('payload_bytes_per_id')} B, checkpoint {per_id.get('checkpoint_bytes_per_id')} B.",
        ]
    return "\n".join(lines)


def render_idle(r: Json) -> str:
    """One row per variant and cluster: CPU seconds per second of the job and of the collector."""
    lines = [
        "| job's Spark conf | cluster | job (CPU s/s) | collector (CPU s/s) | together | reconcile batches (with rows) "
        "in the window | load average |",
        "|---|---|---|---|---|---|---|",
    ]
    for v in r.get("variants", []):
        name = "shipped" if v["variant"] == "shipped" else "a batch at every trigger (Spark's default)"
        for cluster in ("quiet", "busy"):
            w = v[cluster]
            lines.append(
                f"| {name} | {cluster} ({w['seconds']:.0f} s) | {w['job_cpu_s_per_s']:.3f} | "
                f"{w['collector_cpu_s_per_s']:.3f} | **{w['together_cpu_s_per_s']:.3f}** | "
                f"{w['reconcile_batches']} ({w['reconcile_batches_with_rows']}) | {_load1(w.get('load'))} |"
            )
    return "\n".join(lines)


def render_shapes(r: Json) -> str:
    """One row per shape: the reconcile query beside the plain read of the same input, one sitting."""
    lines = [
        "| shape | records an id | reconcile rows/s | plain read rows/s | share of the plain read | batch p50 | "
        "CPU ms per 1k rows | load average before → after |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in r.get("shapes", []):
        share = s.get("share_of_plain_read")
        lines.append(
            f"| {s['shape']} | {s['input'].get('records_per_id')} | **{_n(s.get('reconcile_rows_per_s'))}** | "
            f"{_n(s.get('plain_read_rows_per_s'))} | {f'{share:.1%}' if share is not None else 'n/a'} | "
            f"{s.get('batch_s_p50')} s | {_n(s.get('cpu_ms_per_1k_rows'))} | {_load1(s.get('load_before'))} → "
            f"{_load1(s.get('load_after'))} |"
        )
    return "\n".join(lines)


def _profile_lines(ph: Json) -> list[str]:
    """Where one profiled batch's time went (`bench_stream --profile`: the batch after the steady ones)."""
    prof = ph.get("profile") or {}
    out = []
    for side, label in (("python", "Python workers (py-spy)"), ("jvm", "Spark's JVM (JFR, Java code only)")):
        p = prof.get(side) or {}
        if not p.get("samples"):
            continue
        parts = "; ".join(f"{x['frame']} {x['share']:.0%}" for x in p.get("parts", []) if x["share"] >= 0.01)
        out.append(f"- {label}, {p['samples']:,} samples: {parts}.")
    if out:
        out.insert(
            0, f"\nWhere a {ph['phase']} batch's time went (one batch after the steady ones, profiled):\n"
        )
    return out


def render_catchup(r: Json, state: Json | None) -> str:
    lines = [
        "| run | records | ids | first batch | current after | records/s | load average start → end |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, x in (("1M-record log", r), ("1M ids, last record each", state)):
        if not x:
            continue
        lines.append(
            f"| {label} | {_n(x.get('position_records'))} | {_n(x.get('ids'))} | {_n(x.get('first_batch_s'))} s | "
            f"**{x.get('current_after_s')} s** | {_n(x.get('records_per_s'))} | {_load1(x.get('loadavg_start'))} → "
            f"{_load1(x.get('loadavg_end'))} |"
        )
    per_id = (state or {}).get("state_per_transactional_id")
    if per_id:
        lines += [
            "",
            f"State at {_n(per_id.get('transactional_ids'))} ids: payload **{per_id.get('payload_bytes_per_id')} B** per "
            f"id (stage 1 {per_id.get('stage1_payload_bytes_per_id')} B, stage 2 view "
            f"{per_id.get('stage2_view_payload_bytes_per_id')} B), checkpoint {per_id.get('checkpoint_bytes_per_id')} "
            f"B per id on disk"
            # read back in a process of its own, which has no RocksDB memory figure of the run
            + (
                f", RocksDB memory {per_id['rocksdb_memory_bytes_per_id']} B per id."
                if per_id.get("rocksdb_memory_bytes_per_id")
                else "."
            ),
        ]
    return "\n".join(lines)


def _mb(v: Any) -> str:
    return "n/a" if v is None else f"{v / 1e6:,.2f} MB"


def _cpu_per_batch(x: Json) -> str:
    cpu = x.get("cpu_s_per_batch") or {}
    return f"{x.get('cpu_s_per_batch_total')} s ({' / '.join(str(cpu.get(k, 0)) for k in ('jvm', 'python_workers', 'driver'))})"


# The RocksDB figures of the query progress's customMetrics that say where a commit's time and bytes go.
STATE_METRICS = (
    "rocksdbLoadLatencyMs",
    "rocksdbCommitWriteBatchLatency",
    "rocksdbCommitFlushLatency",
    "rocksdbCommitCompactLatency",
    "rocksdbCommitCheckpointLatency",
    "rocksdbCommitFileSyncLatencyMs",
    "rocksdbChangeLogWriterCommitLatencyMs",
    "rocksdbGetCount",
    "rocksdbPutCount",
    "rocksdbTotalBytesWritten",
    "rocksdbSstFileSize",
)


def _state_names(x: Json, op_id: Any) -> str:
    """An operator's state variables (the state metadata's names), which say which stage it is."""
    layout = next((o for o in x.get("state_layout") or [] if o.get("operator_id") == op_id), {})
    names = [v.split(" ")[0] for v in layout.get("state_variables") or [] if not v.startswith("$")]
    return ", ".join(names)


def render_state(r: Json) -> str:
    """One row per N (`bench_state`), then where each N's steady batch went and the growth from the smallest N."""
    s = r.get("settings") or {}
    lines = [
        "| ids | catch-up | steady batch p50 | p99 (trigger) | input rows per batch | CPU per batch (JVM / Python "
        "workers / driver) | checkpoint written per batch | peak RSS: Spark JVM / largest Python worker | rows in "
        "state | dead letters | view current after | load average before → after |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for x in r.get("per_ids", []):
        if "error" in x:
            lines.append(f"| {_n(x.get('ids'))} | failed ({x['error']}) |" + " |" * 10)
            continue
        mem, dead = x.get("memory") or {}, x.get("dead_letters") or {}
        lines.append(
            f"| {_n(x.get('ids'))} | {x.get('catchup_s')} s | **{x.get('batch_s_p50')} s** | "
            f"**{x.get('batch_s_p99')} s** ({x.get('trigger_s')} s) | {_n(round(x.get('input_rows_per_batch_p50') or 0))} | "
            f"{_cpu_per_batch(x)} | {_mb(x.get('checkpoint_bytes_per_batch'))} | "
            f"{mem.get('spark_jvm_peak_rss_mb')} / {mem.get('python_worker_peak_rss_mb')} MB | "
            f"{_n(x.get('rows_in_state'))} | {dead.get('snapshot_topic', 0) + dead.get('transaction_log', 0)} | "
            f"{x.get('view_current_after_batches')} batches | {_load1(x.get('loadavg_steady_before'))} → "
            f"{_load1(x.get('loadavg_steady_after'))} |"
        )
    g = r.get("growth") or {}
    if g:
        lines += [
            "",
            f"From {_n(g.get('from_ids'))} to {_n(g.get('to_ids'))} ids: steady batch p50 ×{g.get('batch_s_p50')}, "
            f"p99 ×{g.get('batch_s_p99')}, checkpoint bytes per batch ×{g.get('checkpoint_bytes_per_batch')} "
            f"(goal: at most ×{g.get('goal_at_most')} from 10k to 1M).",
        ]
    for x in r.get("per_ids", []):
        if "error" in x:
            continue
        parts = ", ".join(f"{k} {v:,.0f}" for k, v in (x.get("duration_ms_median") or {}).items() if v)
        lines += ["", f"{_n(x.get('ids'))} ids, median durationMs of a steady batch (ms): {parts}."]
        for op in x.get("state_operators", []):
            cm = op.get("custom_metrics_p50") or {}
            metrics = ", ".join(f"{k} {_n(round(cm[k]))}" for k in STATE_METRICS if cm.get(k))
            names = _state_names(x, op.get("operator_id")) or op.get("operator_name")
            lines.append(
                f"- operator {op.get('operator_id')} (state: {names}): updates "
                f"{_n(op.get('all_updates_ms_p50'))} ms, commit {_n(op.get('commit_ms_p50'))} ms (medians), rows "
                f"{_n(op.get('rows_total'))}" + (f"; {metrics}" if metrics else "") + "."
            )
        by_kind = x.get("checkpoint_bytes_per_batch_by_kind") or {}
        lines.append(
            "- checkpoint per batch by file kind: "
            + ", ".join(f"{k} {_mb(v)}" for k, v in by_kind.items())
            + f"; python workers' peak RSS summed {(x.get('memory') or {}).get('python_workers_sum_peak_rss_mb')} MB."
        )
    feeds = [x.get("feeder") or {} for x in r.get("per_ids", []) if "error" not in x]
    if feeds and feeds[0]:
        f = feeds[0]
        lines += [
            "",
            f"Steady input: {s.get('txn_per_s')} transactions/s of existing ids ({f.get('transactions_per_s')} "
            f"measured), a sweep every {s.get('sweep_s')} s over {_n(s.get('sweep_partitions'))} partitions "
            f"({f.get('snapshots_open_per_sweep')} snapshots with open transactions and "
            f"{f.get('snapshots_empty_per_sweep')} empty ones per sweep, then the position), on a "
            f"{s.get('log_partitions')}-partition log; trigger {s.get('trigger')}, {s.get('state_buckets')} state "
            f"buckets, {s.get('shuffle_partitions')} shuffle partitions, local[2]. Load average "
            f"{_load1(r.get('loadavg_start'))} at the start, {_load1(r.get('loadavg_end'))} at the end.",
        ]
    return "\n".join(lines)


def render_codec(r: Json) -> str:
    lines = [
        "| records/s | `decode_value` | `decode_values` (batch) | engine `decode` | engine, compiled |",
        "|---|---|---|---|---|",
    ]
    for row in r.get("results", []):
        lines.append(
            f"| {row['dataset']} | **{_n(row.get('decode_value_per_s'))}** | {_n(row.get('decode_values_per_s'))} | "
            f"{_n(row.get('engine_decode_per_s'))} | {_n(row.get('engine_compiled_per_s'))} |"
        )
    return "\n".join(lines)


def render_rules(r: Json) -> str:
    lines = ["| path | CPU best /s | CPU median /s |", "|---|---|---|"]
    for row in r.get("results", []):
        lines.append(
            f"| {row['path']} | {_n(row.get('cpu_best_per_s'))} | {_n(row.get('cpu_median_per_s'))} |"
        )
    return "\n".join(lines)


def render_collector(r: Json) -> str:
    rows = [
        ("partitions swept", r.get("partitions")),
        ("first sweep", f"{r.get('first_sweep_s')} s"),
        (
            "steady sweep, median (min / max)",
            f"**{r.get('steady_sweep_s_median')} s** ({r.get('steady_sweep_s_min')} / {r.get('steady_sweep_s_max')})",
        ),
        ("`txnwatch collect --once`", f"{r.get('collect_once_cli_s')} s"),
        (
            "`TransactionsCommand find-hanging --broker-id 1`, median",
            f"{r.get('find_hanging_broker_id_s_median')} s",
        ),
        (
            "`TransactionsCommand list` (JVM start and connect)",
            f"{r.get('transactions_command_list_s_median')} s",
        ),
        (
            "DescribeProducers requests per broker per sweep (limit)",
            f"{r.get('describe_producers_requests_per_broker')} ({r.get('describe_producers_request_limit')})",
        ),
        (
            "open transactions found (txnwatch / find-hanging)",
            f"{r.get('open_transactions_seen')} / {r.get('find_hanging_rows')}",
        ),
    ]
    if "probe_s_median" in r:
        rows.append(
            (
                "probe between sweeps (ListOffsets of every partition), median (max)",
                f"{r['probe_s_median']} s ({r.get('probe_s_max')}); requests per broker "
                f"{r.get('probe_list_offsets_requests_per_broker')}",
            )
        )
    return "\n".join(["| measurement | value |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows)])


def _one(name: str, render: Callable[[Json], str]) -> Callable[[dict[str, Json]], str | None]:
    """The block of benchmark `name`, drawn from its own result file (None: no result yet)."""
    return lambda res: render(res[name]["result"]) if name in res else None


RENDERERS: dict[str, Callable[[dict[str, Json]], str | None]] = {
    "run": lambda res: render_run(res) if res else None,
    **{name: _one(name, render_latency) for name in ("latency", "latency_strict", "latency_fast")},
    "peers": _one("peers", render_peers),
    **{name: _one(name, render_stream) for name in ("stream", "stream_10s")},
    "catchup": lambda res: (
        render_catchup(
            res["catchup"]["result"] if "catchup" in res else {}, res.get("state1m", {}).get("result")
        )
        if ("catchup" in res or "state1m" in res)
        else None
    ),
    "state": _one("state", render_state),
    "codec": _one("codec", render_codec),
    "rules": _one("rules", render_rules),
    "collector": _one("collector", render_collector),
    "idle": _one("idle", render_idle),
    "shapes": _one("shapes", render_shapes),
}


def load_results(results: Path) -> dict[str, Json]:
    out = {}
    for b in BENCHES:
        f = results / f"{b.name}.json"
        if f.exists():
            out[b.name] = json.loads(f.read_text())
    return out


def render(doc: Path, results: Path) -> list[str]:
    """Rewrite every marked block of `doc` that has results; returns the blocks rewritten."""
    res = load_results(results)
    text = doc.read_text()
    done = []
    for name, fn in RENDERERS.items():
        begin, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
        if begin not in text or end not in text:
            continue
        body = fn(res)
        if body is None:
            continue
        head, rest = text.split(begin, 1)
        _, tail = rest.split(end, 1)
        text = f"{head}{begin}\n{body}\n{end}{tail}"
        done.append(name)
    doc.write_text(text)
    return done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.make_bench", description=__doc__)
    parser.add_argument("--only", help="comma-separated names: " + ",".join(b.name for b in BENCHES))
    parser.add_argument("--render-only", action="store_true", help="rewrite the tables from the result files")
    parser.add_argument(
        "--smoke", action="store_true", help="tiny runs of the cheap benchmarks into a temp dir"
    )
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--doc", type=Path, default=DOC)
    args = parser.parse_args(argv)
    names = [b.name for b in BENCHES]
    only = args.only.split(",") if args.only else names
    unknown = set(only) - set(names)
    if unknown:
        parser.error(f"unknown benchmark(s) {sorted(unknown)}; known: {names}")
    ok = True
    results, doc = args.results, args.doc
    if args.smoke:
        tmp = Path(tempfile.mkdtemp(prefix="txnwatch-make-bench-"))
        results = tmp / "results"
        doc = tmp / "BENCHMARKS.md"
        doc.write_text(args.doc.read_text())
    if not args.render_only:
        for b in BENCHES:
            if b.name not in only:
                continue
            if args.smoke:
                if b.smoke_args is None:
                    continue
                ok &= run_one(b, b.smoke_args, results)
            else:
                ok &= run_one(b, b.args, results)
    rewritten = render(doc, results)
    print(f"[make bench] rewrote {', '.join(rewritten) or 'nothing'} in {doc}", file=sys.stderr)
    if args.smoke:
        print(json.dumps({"doc": str(doc), "results": str(results), "rewritten": rewritten}))
    return 0 if ok else 1


if __name__ == "__main__":
    os.chdir(ROOT)
    raise SystemExit(main())
