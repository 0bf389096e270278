"""txnwatch side by side with the tools users have today, on one cluster, one run, the same scenarios.

`python -m benchmarks.bench_peers [--duration-s 420] [--cycle-s 20]` starts its own one-node test bed
(partition verification off, transaction.max.timeout.ms 60 s, JMX on), `txnwatch collect --interval 5` and the
streaming job (`local[2]`, 5 s trigger, `--coordinator-max-offsets-per-trigger 150` so that a burst can put its
view of `__transaction_state` behind), and turns the broker's request logger to DEBUG so every request is counted
by client id. It then makes, at t0 (the steady workload runs all along):

- steady (committed and aborted transactions, 2/s), late (open 75 s with a 60 s timeout: the coordinator aborts
  it), long legit (open 50 s, then committed), hanging after commit, hanging after abort via a late produce,
  hanging on `__consumer_offsets`;
- at t0 + 60 s a burst of short transactions on one `__transaction_state` partition, and 10 s into it a live
  transaction on that partition (its producer committed one just before, so a view that is behind shows it
  completed) held open 45 s: "live under coordinator lag". The job's view lag is sampled while it is open.

Every `--cycle-s` it asks each peer and reads txnwatch's candidates topic:

- Kafka's `TransactionsCommand find-hanging` (jars in .cache/jars/kafka) at its default (15 min) and at its smallest
  timeout (0 min; client.id per run from a --command-config file);
- kafka-python's `KafkaAdminClient.find_hanging_transactions` at its default (15 min + 5 min) and at 0 (+ 5 min);
- the broker's `kafka.server:type=ReplicaManager,name=PartitionsWithLateTransactionsCount`, with Kafka's JmxTool;
- txnwatch: OPENED records on `<prefix>.abort-candidates`.

At the end, one orphan of each kind backdated by 21 minutes is made and every one-shot peer asked once more: that
says whether the tool finds it at all once it is older than its threshold (a run cannot wait 20 minutes).
The last line of stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import ConfigResource, ConfigResourceType

from benchmarks.harness import (
    Steady,
    loadavg,
    log,
    machine,
    pipeline,
    scenario_args,
    summary,
    wait_until,
)
from detectors.currency import coordinator_partition
from dev import oracle, workload
from dev.kafka import TestBedConfig

Json = dict[str, Any]
JMX_LATE = "kafka.server:type=ReplicaManager,name=PartitionsWithLateTransactionsCount"
HANGING = ("hanging", "hanging-after-abort", "hanging-offsets")
TOOLS = (
    "find-hanging 15 min",
    "find-hanging 0 min",
    "kafka-python 15 min",
    "kafka-python 0 min",
    "JMX late",
    "txnwatch",
)
REQUEST_LINE = re.compile(r'Completed request:.*?"clientId":"([^"]*)","requestApiKeyName":"([A-Z_]+)"')


class Holder(threading.Thread):
    """A transactional producer that holds one transaction open for `hold_s`, then commits (or aborts)."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        txn_id: str,
        hold_s: float,
        *,
        timeout_ms: int = 60_000,
        commit_first: bool = False,
    ) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.topic, self.txn_id, self.hold_s = bootstrap, topic, txn_id, hold_s
        self.timeout_ms, self.commit_first = timeout_ms, commit_first
        self.opened = threading.Event()
        self.truth: Json = {}
        self.outcome = ""

    def run(self) -> None:
        p = KafkaProducer(
            bootstrap_servers=self.bootstrap,
            transactional_id=self.txn_id,
            transaction_timeout_ms=self.timeout_ms,
        )
        try:
            p.init_transactions()
            if self.commit_first:
                p.begin_transaction()
                p.send(self.topic, b"before", partition=0).get(timeout=30)
                p.commit_transaction()
            p.begin_transaction()
            md = p.send(self.topic, b"held", partition=0).get(timeout=30)
            pe = p._transaction_manager.producer_id_and_epoch
            self.truth = {"topic": self.topic, "partition": 0, "producer_id": int(pe.producer_id)}
            self.truth["start_offset"] = md.offset
            self.opened.set()
            time.sleep(self.hold_s)
            try:
                p.commit_transaction()
                self.outcome = "committed"
            except Exception as exc:  # the coordinator aborted it on its timeout: the late scenario's point
                self.outcome = f"ended by the coordinator ({type(exc).__name__})"
        finally:
            p.close(timeout=10)


class Burst(threading.Thread):
    """Short transactions from `producers` ids that all live on one `__transaction_state` partition."""

    def __init__(self, bootstrap: str, topic: str, ids: list[str], seconds: float) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.topic, self.ids, self.seconds = bootstrap, topic, ids, seconds
        self.transactions = 0

    def run(self) -> None:
        producers = [
            KafkaProducer(bootstrap_servers=self.bootstrap, transactional_id=i, linger_ms=0) for i in self.ids
        ]
        try:
            for p in producers:
                p.init_transactions()
            end = time.monotonic() + self.seconds
            while time.monotonic() < end:
                for p in producers:
                    p.begin_transaction()
                    p.send(self.topic, b"burst", partition=0)
                    p.commit_transaction()
                    self.transactions += 1
        finally:
            for p in producers:
                p.close(timeout=10)


def ids_on(partition: int, base: str, n: int, partitions: int = 3) -> list[str]:
    out: list[str] = []
    i = 0
    while len(out) < n:
        candidate = f"{base}{i}"
        if coordinator_partition(candidate, partitions) == partition:
            out.append(candidate)
        i += 1
    return out


def find_hanging_rows(
    bootstrap: str, minutes: int, client_id: str, config_dir: Path
) -> tuple[list[Json], float]:
    props = config_dir / f"{client_id}.properties"
    props.write_text(f"client.id={client_id}\n")
    began = time.monotonic()
    out = oracle.transactions_command(
        bootstrap,
        "--command-config",
        str(props),
        "find-hanging",
        "--broker-id",
        "1",
        "--max-transaction-timeout",
        str(minutes),
    )
    wall = time.monotonic() - began
    rows = [
        {"topic": r["Topic"], "partition": int(r["Partition"]), "producer_id": int(r["ProducerId"])}
        for r in oracle.parse_table(out)
    ]
    return rows, wall


def kafka_python_rows(bootstrap: str, timeout_ms: int, client_id: str) -> tuple[list[Json], float]:
    began = time.monotonic()
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id=client_id)
    try:
        found = admin.find_hanging_transactions(max_transaction_timeout_ms=timeout_ms)
    finally:
        admin.close()
    wall = time.monotonic() - began
    rows = [
        {
            "topic": tp[0] if isinstance(tp, tuple) else tp.topic,
            "partition": tp[1] if isinstance(tp, tuple) else tp.partition,
            "producer_id": h["producer_id"],
        }
        for h in found
        for tp in h.get("topic_partitions") or [("?", -1)]
    ]
    return rows, wall


def jmx_late(url: str) -> tuple[float, float]:
    began = time.monotonic()
    value = oracle.jmx_value(url, JMX_LATE)
    return value, time.monotonic() - began


def count_requests(log_file: Path) -> Counter[str]:
    counts: Counter[str] = Counter()
    with log_file.open(errors="replace") as f:
        for line in f:
            m = REQUEST_LINE.search(line)
            if m:
                counts[m.group(1)] += 1
    return counts


def request_owner(client_id: str) -> str:
    if client_id.startswith("peer-"):
        return client_id.rsplit("-", 1)[0]
    if (
        client_id.startswith("txnwatch-workload")
        or client_id.startswith("bench-")
        or client_id.startswith("kafka-python-producer")
    ):
        return "workload"
    if client_id.startswith("txnwatch"):
        return "txnwatch collector and job driver"
    if "spark" in client_id or client_id.startswith(("consumer-", "producer-")):
        return "txnwatch job (Spark's Kafka clients)"
    if client_id.isdigit() or client_id.startswith("raft") or client_id.startswith("broker"):
        return "brokers"
    return f"other ({client_id[:30]})"


def run(args: argparse.Namespace) -> Json:
    workdir = Path(tempfile.mkdtemp(prefix="txnwatch-bench-peers-"))
    result: Json = {
        "benchmark": "peers",
        "command": "python -m benchmarks.bench_peers " + " ".join(args.argv),
        "machine": machine(),
        "loadavg_start": loadavg(),
        "started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
    }
    bed = TestBedConfig(nodes=1, partition_verification=False, heap="1g", transaction_max_timeout_ms=60_000)
    first: dict[str, dict[str, float]] = {
        tool: {} for tool in TOOLS
    }  # tool -> scenario -> seconds after made
    fps: dict[str, set[tuple[str, int, int]]] = {tool: set() for tool in TOOLS}
    walls: dict[str, list[float]] = {tool: [] for tool in TOOLS}
    runs: Counter[str] = Counter()
    jmx_samples: list[tuple[float, float]] = []
    lag_samples: list[Json] = []
    with pipeline(
        workdir,
        interval_s=5.0,
        bed=bed,
        stream_overrides={"coordinator_max_offsets_per_trigger": args.coordinator_max_offsets},
    ) as p:
        b = p.bootstrap
        jmx_url = p.cluster.jmx_urls[1]
        wait_until(lambda: p.first_batches_done(1), 300, "the job's first batch")
        steady = Steady(b, "peer-steady-", rate=2.0)
        steady.start()
        wait_until(lambda: p.first_batches_done(4), 300, "warm-up batches")
        admin = KafkaAdminClient(bootstrap_servers=b, client_id="bench-admin")
        admin.alter_configs(
            [
                ConfigResource(
                    ConfigResourceType.BROKER_LOGGER, "1", configs={"kafka.request.logger": "DEBUG"}
                )
            ],
            incremental=True,
        )
        log(f"warm (load {loadavg()}); making the scenarios")
        made: dict[str, float] = {}
        truth: dict[str, list[Json]] = {}
        t0 = time.time()
        late = Holder(b, "peer-late", workload.new_transactional_id("peer-late-"), 75, timeout_ms=60_000)
        legit = Holder(b, "peer-legit", workload.new_transactional_id("peer-legit-"), 50, timeout_ms=60_000)
        workload.ensure_topics(admin, ["peer-late", "peer-legit", "peer-lag", "peer-burst"], 1)
        for name, h in (("late", late), ("long legit", legit)):
            h.start()
            h.opened.wait(60)
            made[name] = time.time()
            truth[name] = [h.truth]
        for scenario in HANGING:
            args_ = scenario_args(b, scenario, "peer-")
            fn = {"hanging": workload.hanging, "hanging-after-abort": workload.hanging_after_abort}.get(
                scenario
            )
            rows = fn(b, admin, args_) if fn else workload.hanging_offsets(b, admin, args_)
            truth[scenario] = [
                {
                    "topic": t.topic,
                    "partition": t.partition,
                    "producer_id": t.producer_id,
                    "start_offset": t.start_offset,
                }
                for t in rows
                if t.kind == "hanging"
            ]
            made[scenario] = min(t.start_timestamp_ms for t in rows if t.kind == "hanging") / 1000
        truth["steady"] = []
        made["steady"] = t0
        lag_partition = 0
        burst = Burst(b, "peer-burst", ids_on(lag_partition, "peer-burst-", 4), args.burst_s)
        live = Holder(b, "peer-lag", ids_on(lag_partition, "peer-lag-", 1)[0], 45, commit_first=True)
        by_key = {(t["topic"], t["partition"], t["producer_id"]): s for s, ts in truth.items() for t in ts}
        hanging_keys = {k for k, s in by_key.items() if s in HANGING}
        cycle = 0
        config_dir = workdir / "peer-configs"
        config_dir.mkdir()
        next_cycle = time.monotonic()
        end = time.monotonic() + args.duration_s
        sampling = threading.Event()

        def sample_lag() -> None:  # the job's own view lag, every second while the live transaction is open
            while not sampling.is_set():
                if live.ident is not None and live.is_alive():
                    lag = p.running.live.view_lag()
                    if lag:
                        lag_samples.append(
                            {
                                "t": round(time.time() - t0, 1),
                                "records_behind": lag.get("records_behind"),
                                "current": lag.get("current"),
                            }
                        )
                time.sleep(1.0)

        sampler = threading.Thread(target=sample_lag, daemon=True)
        sampler.start()

        def note(tool: str, rows: list[Json]) -> None:
            now = time.time()
            for r in rows:
                k = (r["topic"], r["partition"], r["producer_id"])
                s = by_key.get(k)
                if s in HANGING:
                    first[tool].setdefault(s, round(now - made[s], 1))
                else:
                    fps[tool].add(k)

        while time.monotonic() < end:
            elapsed = time.time() - t0
            if burst.ident is None and elapsed >= args.burst_at_s:
                log(f"burst on __transaction_state-{lag_partition} for {args.burst_s:.0f} s")
                burst.start()
            if burst.ident is not None and live.ident is None and elapsed >= args.burst_at_s + 10:
                live.start()
                live.opened.wait(60)
                made["live under coordinator lag"] = time.time()
                truth["live under coordinator lag"] = [live.truth]
                by_key[(live.truth["topic"], 0, live.truth["producer_id"])] = "live under coordinator lag"
            if time.monotonic() >= next_cycle:
                cycle += 1
                next_cycle = time.monotonic() + args.cycle_s
                for tool, minutes in (("find-hanging 0 min", 0), ("find-hanging 15 min", 15)):
                    if tool == "find-hanging 15 min" and cycle % 3 != 1:
                        continue
                    rows, wall = find_hanging_rows(b, minutes, f"peer-fh{minutes}-{cycle}", config_dir)
                    walls[tool].append(wall)
                    runs[tool] += 1
                    note(tool, rows)
                for tool, ms in (("kafka-python 0 min", 0), ("kafka-python 15 min", 900_000)):
                    rows, wall = kafka_python_rows(b, ms, f"peer-kp{ms // 60000}-{cycle}")
                    walls[tool].append(wall)
                    runs[tool] += 1
                    note(tool, rows)
                value, wall = jmx_late(jmx_url)
                walls["JMX late"].append(wall)
                runs["JMX late"] += 1
                jmx_samples.append((round(time.time() - t0, 1), value))
                if value >= len(hanging_keys) and "hanging" not in first["JMX late"]:
                    for s in HANGING:
                        first["JMX late"].setdefault(s, round(time.time() - made[s], 1))
                log(
                    f"t={elapsed:.0f}s cycle {cycle}: txnwatch {len(first['txnwatch'])}, fh0 {len(first['find-hanging 0 min'])}"
                    f" (fp {len(fps['find-hanging 0 min'])}), jmx {value:.0f}, load {loadavg()}"
                )
            time.sleep(1.0)
        result["loadavg_observation_end"] = loadavg()
        result["observation_s"] = round(time.time() - t0, 1)
        sampling.set()
        # txnwatch: when the job wrote each OPENED candidate (the record's CreateTime), not when we looked.
        for (topic, partition, pid, _), seen in p.watcher.opened().items():
            s = by_key.get((topic, partition, pid))
            if s in HANGING:
                first["txnwatch"].setdefault(s, round(seen.record_ts_ms / 1000 - made[s], 1))
            else:
                fps["txnwatch"].add((topic, partition, pid))
        steady.stop()
        burst.join(timeout=60)
        live.join(timeout=60)
        for h in (late, legit):
            h.join(timeout=60)
        result["outcomes"] = {
            "late": late.outcome,
            "long legit": legit.outcome,
            "live under coordinator lag": live.outcome,
        }
        result["burst_transactions"] = burst.transactions
        # Backdated orphans: does each one-shot tool find them once they are older than its threshold?
        backdated: dict[str, Json] = {}
        for scenario in HANGING:
            args_ = scenario_args(b, scenario, "old-", "--backdate-ms", str(21 * 60_000))
            fn = {"hanging": workload.hanging, "hanging-after-abort": workload.hanging_after_abort}.get(
                scenario
            )
            if fn is None:
                continue  # the offset commit's timestamp is the broker's own: it cannot be backdated
            (t,) = [t for t in fn(b, admin, args_) if t.kind == "hanging"]
            backdated[scenario] = {"topic": t.topic, "partition": t.partition, "producer_id": t.producer_id}
        old_found: dict[str, list[str]] = {}
        fh15, _ = find_hanging_rows(b, 15, "peer-fh15-old", config_dir)
        kp, _ = kafka_python_rows(b, 900_000, "peer-kp15-old")
        runs["find-hanging 15 min"] += 1  # their requests count with the others of the same client id prefix
        runs["kafka-python 15 min"] += 1
        for tool, rows in (("find-hanging 15 min", fh15), ("kafka-python 15 min", kp)):
            keys = {(r["topic"], r["partition"], r["producer_id"]) for r in rows}
            old_found[tool] = [
                s for s, t in backdated.items() if (t["topic"], t["partition"], t["producer_id"]) in keys
            ]
        time.sleep(2)
        jmx_old, _ = jmx_late(jmx_url)
        old_found["JMX late"] = [f"count {jmx_old:.0f} with {len(backdated)} backdated orphans"]
        result["backdated"] = {"orphans": backdated, "found": old_found}
        result["reconcile_batch_s"] = summary(p.reconcile_durations_s())
        admin.close()
        log_file = Path(p.cluster.nodes[0].log_file)
        requests = count_requests(log_file)
        result["steady_transactions"] = steady.transactions
        result["duration_s"] = round(time.time() - t0, 1)
    by_owner: Counter[str] = Counter()
    for client, n in requests.items():
        by_owner[request_owner(client)] += n
    result.update(
        scenarios={s: {"made_after_t0_s": round(made[s] - t0, 1), "truth": truth[s]} for s in made},
        first_found_s=first,
        false_positives={tool: sorted(map(list, v)) for tool, v in fps.items()},
        wall_s={tool: summary(w) for tool, w in walls.items()},
        runs=dict(runs),
        requests_by_owner=dict(by_owner),
        requests_per_run={
            tool: round(by_owner.get(owner, 0) / runs[tool], 1) if runs[tool] else None
            for tool, owner in (
                ("find-hanging 0 min", "peer-fh0"),
                ("find-hanging 15 min", "peer-fh15"),
                ("kafka-python 0 min", "peer-kp0"),
                ("kafka-python 15 min", "peer-kp15"),
            )
        },
        jmx_samples=jmx_samples,
        view_lag_samples=lag_samples,
        loadavg_end=loadavg(),
    )
    return result


def main(argv: list[str] | None = None) -> int:
    import sys

    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_peers",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--duration-s", type=float, default=420.0, help="observation after t0 (> 6 min for JMX)"
    )
    parser.add_argument("--cycle-s", type=float, default=20.0, help="how often the one-shot peers are asked")
    parser.add_argument("--burst-at-s", type=float, default=60.0)
    parser.add_argument("--burst-s", type=float, default=30.0)
    parser.add_argument(
        "--coordinator-max-offsets", type=int, default=150, help="the job's coordinator throttle"
    )
    parser.add_argument("--out", type=Path, help="also write the JSON result here")
    args = parser.parse_args(argv)
    args.argv = argv
    result = run(args)
    line = json.dumps(result, default=list)
    if args.out:
        args.out.write_text(line + "\n")
    print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
