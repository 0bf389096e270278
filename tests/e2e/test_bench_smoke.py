"""Smoke runs of benchmarks/ (benchmarks are not tests; this only checks that their parts still run).

Tiny: `make_bench --smoke` (the codec and rules benchmarks with a few hundred records, tables rendered into a
copy of docs/BENCHMARKS.md), one orphan of each kind on the session's broker with the makers the latency and peers
benchmarks use, one call of each one-shot peer, and the peers/latency tables rendered from canned figures.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kafka import KafkaAdminClient
from kafka.structs import TopicPartition

from dev.kafka import ROOT, Cluster

sys.path.insert(0, str(ROOT))  # benchmarks/ is not an installed package: it runs from the checkout
from benchmarks import bench_latency, bench_peers, bench_state, bench_stream, harness, make_bench
from benchmarks.harness import ORPHAN_KINDS, make_orphans, percentile, summary
from common.settings import CollectorSettings, StreamSettings
from detectors.codec import decode_key, decode_value
from detectors.currency import coordinator_partition
from detectors.models import (
    CoordinatorLogPosition,
    CoordinatorRecord,
    DetectionLimits,
    PartitionSnapshot,
    VerdictKind,
)
from detectors.rules import coord_facts, judge, txn_facts

pytestmark = [pytest.mark.e2e, pytest.mark.jars]


def test_make_bench_smoke_renders_tables() -> None:
    began = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.make_bench", "--smoke"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert {"codec", "rules", "run"} <= set(out["rewritten"])
    doc = Path(out["doc"]).read_text()
    assert "decode_value" in doc and "python -m benchmarks.bench_codec --records 300" in doc
    assert time.monotonic() - began < 120


def test_orphan_makers_leave_open_transactions(bootstrap: str, unique: str) -> None:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        for kind, (_, per_run) in ORPHAN_KINDS.items():
            orphans = make_orphans(bootstrap, kind, unique)
            assert len(orphans) == per_run, kind
            for o in orphans:
                tp = TopicPartition(o["topic"], o["partition"])
                state = admin.describe_producers([tp])[tp]
                open_ = {
                    (p.producer_id, p.current_transaction_start_offset)
                    for p in state.active_producers
                    if p.current_transaction_start_offset >= 0
                }
                assert (o["producer_id"], o["start_offset"]) in open_, (kind, o)
        # What bench_latency records of its bed: the broker's own count (the session's bed has 3)
        (described,) = admin.describe_topics(["__transaction_state"])
        assert harness.transaction_log_partitions(bootstrap) == len(described["partitions"]) >= 1
    finally:
        admin.close()


def test_one_shot_peers_run(kafka_cluster: Cluster, bootstrap: str, tmp_path: Path, unique: str) -> None:
    (orphan,) = make_orphans(bootstrap, "after-commit", unique)
    key = {"topic": orphan["topic"], "partition": orphan["partition"], "producer_id": orphan["producer_id"]}
    rows, wall = bench_peers.find_hanging_rows(bootstrap, 0, f"peer-fh0-{unique}smoke", tmp_path)
    assert key in rows and wall > 0
    rows, _ = bench_peers.kafka_python_rows(bootstrap, 0, f"peer-kp0-{unique}smoke")
    assert key not in rows  # it asks only the coordinators, which completed this transaction
    if not kafka_cluster.nodes:
        pytest.skip("TXNWATCH_TEST_BOOTSTRAP: an external test bed, no JMX port known")
    value, _ = bench_peers.jmx_late(kafka_cluster.jmx_urls[kafka_cluster.nodes[0].node_id])
    assert value >= 0


def test_tables_render_from_canned_figures(tmp_path: Path) -> None:
    assert percentile([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 95) == 10
    assert summary([3.0, 1.0, 2.0]) == {"n": 3, "p50": 2.0, "p95": 3.0, "max": 3.0, "min": 1.0}
    latency = {
        "orphans": 2,
        "found": 2,
        "false_positives": 0,
        "all": summary([18.0, 21.0]),
        "per_kind": {"after-commit": summary([18.0, 21.0]) | {"orphans": 2, "missed": 0}},
        "reconcile_batch_s": summary([2.0, 3.0]),
        "loadavg_start": "1.0 1.0 1.0",
        "loadavg_during": ["2.0 1.0 1.0"],
        "loadavg_end": "1.5 1.0 1.0",
        "reasons": ["coordinator-completed"],
        "breakdown": {"proving_report_s": summary([6.1, 6.4]), "job_s": summary([4.0, 9.0])},
    }
    k = ("t", 0, 7)
    peers = {
        "duration_s": 420.0,
        "scenarios": {
            "late": {"truth": [{"topic": "t", "partition": 0, "producer_id": 7, "start_offset": 0}]},
            "hanging": {"truth": [{"topic": "h", "partition": 2, "producer_id": 1, "start_offset": 0}]},
        },
        "first_found_s": {"txnwatch": {"hanging": 19.0}, "find-hanging 0 min": {"hanging": 4.0}},
        "false_positives": {"find-hanging 0 min": [list(k)]},
        "wall_s": {"find-hanging 0 min": summary([3.5])},
        "requests_per_run": {"find-hanging 0 min": 6.0},
        "requests_by_owner": {"peer-fh0": 6},
    }
    results = tmp_path / "results"
    results.mkdir()
    meta = {"command": "python -m x", "started_utc": "2026-11-23 17:00:00", "wall_s": 1.0}
    for name, r in (("latency", latency), ("peers", peers)):
        (results / f"{name}.json").write_text(json.dumps({"meta": meta, "result": r}))
    doc = tmp_path / "doc.md"
    doc.write_text(
        "a\n<!-- bench:latency -->\nold\n<!-- /bench:latency -->\nb\n<!-- bench:peers -->\n<!-- /bench:peers -->\n"
    )
    assert make_bench.render(doc, results) == ["latency", "peers"]
    text = doc.read_text()
    assert "old" not in text and "**21.0 s**" in text
    assert "| the first report that settles it (sent) | 6.1 s | 6.4 s | 6.4 s |" in text
    assert "| from there to the candidate (the job's part) | 4.0 s | 9.0 s | 9.0 s |" in text
    assert "found at 19 s" in text and "found at 4 s" in text and "**1 false**" in text


def test_state_table_renders_from_canned_figures(tmp_path: Path) -> None:
    """bench_state's table: one row per N with its figures, and the growth from the smallest N to the largest."""

    def one(ids: int, p50: float, written: int) -> dict[str, object]:
        return {
            "ids": ids,
            "catchup_s": 12.5,
            "batch_s_p50": p50,
            "batch_s_p99": p50 + 1,
            "trigger_s": 5.0,
            "input_rows_per_batch_p50": 3_000,
            "cpu_s_per_batch": {"jvm": 2.0, "python_workers": 1.5, "driver": 0.25},
            "cpu_s_per_batch_total": 3.75,
            "checkpoint_bytes_per_batch": written,
            "checkpoint_bytes_per_batch_by_kind": {"changelog": written},
            "memory": {"spark_jvm_peak_rss_mb": 1500, "python_worker_peak_rss_mb": 170},
            "rows_in_state": 160,
            "dead_letters": {"snapshot_topic": 0, "transaction_log": 0},
            "view_current_after_batches": "30/30",
            "duration_ms_median": {"addBatch": 3000},
            "state_operators": [{"operator_id": 0, "operator_name": "tws", "commit_ms_p50": 40.0}],
        }

    state = {"per_ids": [one(10_000, 3.0, 2_000_000), one(1_000_000, 6.0, 9_000_000)]}
    state["growth"] = bench_state.growth(state["per_ids"])
    assert state["growth"]["batch_s_p50"] == 2.0 and state["growth"]["checkpoint_bytes_per_batch"] == 4.5
    results = tmp_path / "results"
    results.mkdir()
    meta = {"command": "python -m x", "started_utc": "2026-11-27 09:00:00", "wall_s": 1.0}
    (results / "state.json").write_text(json.dumps({"meta": meta, "result": state}))
    doc = tmp_path / "doc.md"
    doc.write_text("a\n<!-- bench:state -->\nold\n<!-- /bench:state -->\nb\n")
    assert make_bench.render(doc, results) == ["state"]
    text = doc.read_text()
    assert "old" not in text and "| 1,000,000 | 12.5 s | **6.0 s** | **7.0 s** (5.0 s) |" in text
    assert "steady batch p50 ×2.0" in text and "checkpoint bytes per batch ×4.5" in text
    assert "9.00 MB" in text and "commit 40.0 ms" in text


def test_stream_snapshot_input_is_open_at_its_coordinator() -> None:
    """bench_stream's snapshot phase: every open transaction is its producer id's Ongoing transaction on a log of
    Kafka's 50 partitions, so the rules judge it OPEN, even on a view current as of the snapshot (as on a real
    cluster); each sweep is followed by a position of that log."""
    partitions, sweeps, producers, timeout_ms = 600, 6, 200, 3_600_000
    t0_ms = int(time.time() * 1000) - sweeps * 5_000
    views: dict[int, CoordinatorRecord] = {}
    for tid, key, value in bench_stream.snapshot_coordinator_records(
        partitions, producers, t0_ms - 60_000, timeout_ms, "t"
    ):
        assert decode_key(key).transactional_id == tid
        decoded = decode_value(value)
        assert decoded is not None
        record = CoordinatorRecord.from_log_value(
            tid,
            decoded,
            source_partition=coordinator_partition(tid, 50),
            source_offset=0,
            source_timestamp_ms=t0_ms,
        )
        assert len(record.partitions) <= 3 * bench_stream.PRODUCERS_PER_PARTITION
        views[record.producer_id] = record
    after = bench_stream.position_record("t.txnlog-snap", 50, {p: 1 for p in range(50)})
    limits = DetectionLimits()
    now_ms = int(time.time() * 1000) + 600_000  # read up to ten minutes later: still not late
    verdicts: dict[VerdictKind, int] = {}
    positions = 0
    for record in bench_stream.snapshot_records(
        partitions,
        sweeps,
        producers,
        5_000,
        7,
        "t",
        t0_ms=t0_ms,
        max_timeout_ms=timeout_ms,
        after_sweep=after,
    ):
        if len(record) == 3:
            position = CoordinatorLogPosition.model_validate_json(record[1])
            assert position.partitions == 50 and record[2] == [("txnwatch.type", b"coordinator-log-position")]
            positions += 1
            continue
        snap = PartitionSnapshot.model_validate_json(record[1])
        for txn in snap.open_transactions:
            t = txn_facts(txn, snap, first_seen_ms=t0_ms)
            c = coord_facts(views[txn.producer_id])
            decision = judge(t, c, now_ms, limits, view_current_ms=snap.observed_at_ms)
            verdicts[decision.kind] = verdicts.get(decision.kind, 0) + 1
    assert positions == sweeps
    assert set(verdicts) == {VerdictKind.OPEN} and verdicts[VerdictKind.OPEN] > partitions * sweeps


def test_detection_benchmarks_default_to_shipped_settings_and_50_log_partitions() -> None:
    """bench_latency's collector interval and trigger are the shipped ones, and its bed's __transaction_state has
    Kafka's default partition count (the run records the count the broker reported)."""
    args = bench_latency.build_parser().parse_args([])
    assert args.interval == CollectorSettings().interval_s
    assert args.trigger == StreamSettings().trigger
    assert args.probe_interval_ms == CollectorSettings().probe_interval_ms and not args.stack
    assert (args.grace_ms, args.clock_skew_ms) == (
        DetectionLimits().grace_ms,
        DetectionLimits().clock_skew_ms,
    )
    bed = harness.detection_bed()
    assert bed.extra["transaction.state.log.num.partitions"] == "50"
    assert not bed.partition_verification and bed.heap == "512m"
    (latency,) = [b for b in make_bench.BENCHES if b.name == "latency"]
    assert "--interval" not in latency.args and "--trigger" not in latency.args
    assert not any("--log-partitions" in b.args for b in make_bench.BENCHES if b.module == "bench_stream")
