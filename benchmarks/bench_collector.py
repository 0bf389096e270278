"""One collector sweep of 10,000 partitions on a real local broker, beside Kafka's `find-hanging --broker-id`.

`python -m benchmarks.bench_collector [--partitions 10000] [--hanging 50] [--sweeps 5]` starts its own test bed
(one KRaft node, 2 GB heap, in a temporary directory), creates the partitions (plus the internal topics) and a
few real hanging transactions, then times: the first sweep (start batches fetched), steady-state sweeps (cached),
`txnwatch collect --once` end to end, and `TransactionsCommand find-hanging --broker-id 1` (same cluster, same
partitions, JVM start included; `list` is timed too, as the JVM-and-connect floor), and the probe between sweeps (ListOffsets of every
partition, `admin/collect/redescribe.py`). DescribeProducers and the probe's ListOffsets requests are counted per broker.
Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kafka import KafkaAdminClient
from kafka.admin import NewTopic
from kafka.errors import KafkaError
from kafka.protocol.metadata import CoordinatorType

from admin.collect.collector import Collector, SweepResult
from admin.collect.redescribe import Redescribes
from admin.wire.connect import connect_admin
from admin.wire.kafka_wire import KafkaWire
from admin.wire.requests import RequestLog
from common.settings import CollectorSettings, KafkaSettings
from detectors.models import DetectionLimits
from dev import oracle
from dev.kafka import TestBedConfig, start_cluster, stop_cluster
from dev.workload import raw_transactional_produce

ROOT = Path(__file__).resolve().parent.parent
# KRaft refuses a CreateTopics that writes more than 10,000 records (topic + partition records): stay well under.
PARTITIONS_PER_CREATE = 2_000


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def create_partitions(admin: KafkaAdminClient, total: int, per_topic: int) -> list[str]:
    topics: list[str] = []
    batch: list[NewTopic] = []
    made = 0
    i = 0
    while made < total:
        n = min(per_topic, total - made)
        name = f"bench-{i:03d}"
        batch.append(NewTopic(name, n, 1))
        topics.append(name)
        made += n
        i += 1
        if sum(t.num_partitions for t in batch) >= PARTITIONS_PER_CREATE or made >= total:
            admin.create_topics(batch)
            batch = []
    return topics


def wait_until_all_led(wire: KafkaWire, expected: int, timeout_s: float) -> float:
    """Sweep until every partition answers (a broker creates thousands of logs slowly); returns the wait."""
    began = time.monotonic()
    collector = Collector(wire, cluster="bench", settings=CollectorSettings(), open_partitions=set())
    while True:
        result = collector.sweep()
        if result.partitions_total >= expected and result.partitions_covered == result.partitions_total:
            return time.monotonic() - began
        if time.monotonic() - began > timeout_s:
            raise TimeoutError(f"{result.partitions_covered}/{result.partitions_total} partitions answer")
        log(f"  {result.partitions_covered}/{result.partitions_total} partitions answer; waiting")
        time.sleep(2)


def make_hanging(admin: KafkaAdminClient, topics: list[str], count: int) -> None:
    """Real orphans (unverified Produce v9 batches from producer ids no coordinator knows), spread over topics."""
    now = int(time.time() * 1000)
    for k in range(count):
        raw_transactional_produce(
            admin,
            topic=topics[k % len(topics)],
            partition=k // len(topics),
            transactional_id=f"bench-orphan-{k}",
            producer_id=900_000 + k,
            producer_epoch=0,
            base_sequence=0,
            timestamp_ms=now - 3_600_000,
            value=b"orphan",
        )


def create_internal_topics(admin: KafkaAdminClient) -> None:
    """__consumer_offsets and __transaction_state appear on the first FindCoordinator of their kind."""
    for key_type in (CoordinatorType.GROUP, CoordinatorType.TRANSACTION):
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                admin._manager.run(admin._find_coordinator_ids, ["bench-warm-up"], key_type)
                break
            except KafkaError:
                time.sleep(0.5)


def timed_sweep(collector: Collector, requests: RequestLog) -> tuple[SweepResult, float, dict[int, int]]:
    before = requests.by_broker("DescribeProducers")
    began = time.perf_counter()
    result = collector.sweep()
    elapsed = time.perf_counter() - began
    after = requests.by_broker("DescribeProducers")
    return result, elapsed, {b: after.get(b, 0) - before.get(b, 0) for b in after}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_collector", description=__doc__)
    parser.add_argument("--partitions", type=int, default=10_000, help="user partitions to create")
    parser.add_argument("--partitions-per-topic", type=int, default=500)
    parser.add_argument("--hanging", type=int, default=50, help="real hanging transactions to create")
    parser.add_argument("--sweeps", type=int, default=5, help="steady-state sweeps timed")
    parser.add_argument("--tool-runs", type=int, default=3, help="TransactionsCommand runs timed")
    parser.add_argument("--heap", default="2g", help="broker heap")
    args = parser.parse_args(argv)

    state_dir = Path(tempfile.mkdtemp(prefix="txnwatch-bench-collector-"))
    log(f"starting a one-node test bed (heap {args.heap}) in {state_dir}")
    cluster = start_cluster(TestBedConfig(heap=args.heap, partition_verification=False), state_dir)
    admin: KafkaAdminClient | None = None
    try:
        bootstrap = cluster.bootstrap_servers
        admin = connect_admin(KafkaSettings(bootstrap_servers=bootstrap), request_timeout_ms=60_000)
        began = time.monotonic()
        topics = create_partitions(admin, args.partitions, args.partitions_per_topic)
        log(f"created {args.partitions} partitions in {len(topics)} topics ({time.monotonic() - began:.1f}s)")
        requests = RequestLog()
        wire = KafkaWire(admin, request_timeout_ms=60_000, requests=requests)
        waited = wait_until_all_led(wire, args.partitions, timeout_s=900)
        log(f"every partition answers after {waited:.1f}s more")
        make_hanging(admin, topics, args.hanging)
        create_internal_topics(admin)

        settings = CollectorSettings()
        collector = Collector(wire, cluster="bench", settings=settings, open_partitions=set())
        first, first_s, first_requests = timed_sweep(collector, requests)
        steady: list[float] = []
        steady_requests: list[dict[int, int]] = []
        for _ in range(args.sweeps):
            result, elapsed, reqs = timed_sweep(collector, requests)
            steady.append(elapsed)
            steady_requests.append(reqs)
        total = result.partitions_total
        limit = math.ceil(total / settings.describe_batch_size)
        assert all(n <= limit for reqs in [first_requests, *steady_requests] for n in reqs.values()), (
            first_requests,
            steady_requests,
        )
        assert result.open_transactions >= args.hanging, result.open_transactions

        # The probe between sweeps (admin/collect/redescribe.py): ListOffsets of every partition, a pair per broker.
        prober = Collector(
            wire,
            cluster="bench",
            settings=settings,
            open_partitions=set(),
            redescribes=Redescribes(DetectionLimits()),
        )
        prober.sweep()
        probes: list[float] = []
        before = requests.by_broker("ListOffsets")
        for _ in range(args.sweeps):
            began = time.perf_counter()
            answered = prober.probe()
            probes.append(time.perf_counter() - began)
        after = requests.by_broker("ListOffsets")
        probe_requests = {b: (n - before.get(b, 0)) / args.sweeps for b, n in after.items()}

        env = {k: v for k, v in os.environ.items() if not k.startswith("TXNWATCH_")}
        began = time.perf_counter()
        once = subprocess.run(
            [sys.executable, "-m", "txnwatch_cli", "collect", "--bootstrap-server", bootstrap, "--once"],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
            cwd=ROOT,
            env=env,
        )
        once_s = time.perf_counter() - began
        assert once.returncode == 0, once.stderr
        once_out = json.loads(once.stdout)

        tool_runs: list[float] = []
        rows: list[dict[str, str]] = []
        for _ in range(args.tool_runs):
            began = time.perf_counter()
            rows = oracle.find_hanging(bootstrap, broker_id=1)
            tool_runs.append(time.perf_counter() - began)
        floor_runs = []
        for _ in range(args.tool_runs):
            began = time.perf_counter()
            oracle.transactions_command(bootstrap, "list")
            floor_runs.append(time.perf_counter() - began)

        figures: dict[str, Any] = {
            "benchmark": "collector",
            "partitions": total,
            "user_partitions": args.partitions,
            "brokers": 1,
            "hanging_transactions": args.hanging,
            "open_transactions_seen": result.open_transactions,
            "first_sweep_s": round(first_s, 3),
            "first_sweep_start_batch_fetches": first.start_batch_fetches,
            "steady_sweep_s_median": round(statistics.median(steady), 3),
            "steady_sweep_s_min": round(min(steady), 3),
            "steady_sweep_s_max": round(max(steady), 3),
            "describe_producers_requests_per_broker": first_requests,
            "describe_producers_request_limit": limit,
            "probe_s_median": round(statistics.median(probes), 3),
            "probe_s_max": round(max(probes), 3),
            "probe_partitions_answered": answered,
            "probe_list_offsets_requests_per_broker": probe_requests,
            "collect_once_cli_s": round(once_s, 3),
            "collect_once_cli_sweep_s": once_out["duration_s"],
            "find_hanging_broker_id_s_median": round(statistics.median(tool_runs), 3),
            "find_hanging_rows": len(rows),
            "transactions_command_list_s_median": round(statistics.median(floor_runs), 3),
            "broker_ready_s": round(cluster.started_in_s, 1),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "load_average_1m": round(os.getloadavg()[0], 2),
        }
        print_table(figures)
        print(json.dumps(figures))
        return 0
    finally:
        if admin is not None:
            admin.close()
        stop_cluster(state_dir)


def print_table(f: dict[str, Any]) -> None:
    lines = [
        f"Collector sweep, {f['partitions']} partitions ({f['user_partitions']} user + internal) on 1 broker, "
        f"{f['hanging_transactions']} hanging transactions",
        "",
        f"{'measurement':58} {'seconds':>9}",
        f"{'first sweep (start batches fetched: ' + str(f['first_sweep_start_batch_fetches']) + ')':58} "
        f"{f['first_sweep_s']:>9.3f}",
        f"{'steady sweep, median of runs (min / max)':58} {f['steady_sweep_s_median']:>9.3f}"
        f"   ({f['steady_sweep_s_min']:.3f} / {f['steady_sweep_s_max']:.3f})",
        f"{'txnwatch collect --once (process, connect, sweep, print)':58} {f['collect_once_cli_s']:>9.3f}",
        f"{'  of which the sweep':58} {f['collect_once_cli_sweep_s']:>9.3f}",
        f"{'probe between sweeps, ListOffsets of every partition (median)':58} {f['probe_s_median']:>9.3f}",
        f"{'TransactionsCommand find-hanging --broker-id 1 (median)':58} {f['find_hanging_broker_id_s_median']:>9.3f}",
        f"{'TransactionsCommand list (JVM + connect floor, median)':58} {f['transactions_command_list_s_median']:>9.3f}",
        "",
        f"DescribeProducers requests per broker per sweep: {f['describe_producers_requests_per_broker']} "
        f"(limit ceil(partitions/500) = {f['describe_producers_request_limit']})",
        f"open transactions seen: {f['open_transactions_seen']}; find-hanging rows: {f['find_hanging_rows']}",
    ]
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
