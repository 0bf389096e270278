"""`make demo`: a local Kafka broker, real traffic (steady, one late, one really hanging transaction), the
collector and the streaming job, shown to a person; it ends by aborting the hanging transaction with `txnwatch
proposals abort --execute` (verified, audited) and showing the partition unblocked. `DEMO_SECONDS` bounds it
(at least 300 for the abort: Spark's first micro-batch alone takes a minute or two here); Ctrl-C stops everything
it started.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dev.kafka import TestBedConfig, start_cluster, stop_cluster

ROOT = Path(__file__).resolve().parent.parent
DEMO_DIR = ROOT / ".cache" / "demo"
NOISE = (
    "TransformWithStateInPandas",
    "Using Spark's default log4j",
    "To adjust logging level",
    "WARN ",
    "WARNING: Using incubator",
    "Setting default log level",
    "NativeCodeLoader",
)


def say(msg: str = "") -> None:
    print(msg, flush=True)


def banner(title: str) -> None:
    say()
    say(f"── {title} " + "─" * max(0, 72 - len(title)))


def txnwatch(*args: str) -> list[str]:
    return [sys.executable, "-m", "txnwatch_cli", *args]


def workload(bootstrap: str, *args: str, log: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "dev.workload", "--bootstrap-server", bootstrap, "--json", *args],
        stdout=subprocess.PIPE,
        stderr=log.open("a"),
        text=True,
    )


# While the demo runs commands at the end, the job's lines wait here, so the two do not interleave.
HELD: list[str] = []
HOLD = threading.Event()


def flush_held() -> None:
    while HELD:
        say("  (the job) " + HELD.pop(0).strip())


def relay(proc: subprocess.Popen[str]) -> None:
    """Copy the job's console to ours, minus Spark's start-up chatter."""
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.strip() and not any(n in line for n in NOISE):
            if HOLD.is_set():
                HELD.append(line)
            else:
                say("  " + line.rstrip())


def metric_lines(port: int, names: Sequence[str]) -> list[str]:
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    except OSError:
        return []  # not serving yet (the job is still starting)
    return [line for line in body.splitlines() if line.startswith(tuple(names))]


def read_candidates(bootstrap: str) -> list[dict[str, Any]]:
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(
        "txnwatch.abort-candidates",
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        consumer_timeout_ms=3000,
    )
    try:
        return [json.loads(r.value) for r in consumer]
    finally:
        consumer.close()


def candidate_for(bootstrap: str, h: dict[str, Any]) -> str | None:
    """The id of the candidate the job proposed for the demo's hanging transaction while it is OPENED (the
    latest record of each id counts: RESOLVED follows OPENED on the same key)."""
    latest = {c["candidate_id"]: c for c in read_candidates(bootstrap)}
    for c in latest.values():
        if (c["topic"], c["partition"], c["start_offset"], c["status"]) == (
            h["topic"],
            h["partition"],
            h["start_offset"],
            "OPENED",
        ):
            return str(c["candidate_id"])
    return None


def produce_plain(bootstrap: str, topic: str, partition: int, value: bytes) -> int:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    try:
        return int(producer.send(topic, value, partition=partition).get(timeout=30).offset)
    finally:
        producer.close()


def last_stable_offset(bootstrap: str, topic: str, partition: int) -> int:
    from kafka import KafkaConsumer
    from kafka.structs import TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed", group_id=None)
    try:
        tp = TopicPartition(topic, partition)
        return int(consumer.end_offsets([tp])[tp])  # read_committed: the LSO
    finally:
        consumer.close()


def run_shown(*args: str) -> int:
    """Run one txnwatch command, printing it first as a person would type it, and its output indented."""
    shown = " ".join(a if " " not in a else repr(a) for a in args)
    say(f"$ txnwatch {shown}")
    done = subprocess.run(txnwatch(*args), capture_output=True, text=True, timeout=120, check=False)
    for line in (done.stdout + done.stderr).splitlines():
        if line.strip() and not line.startswith("txnwatch stream: metrics on"):
            say("  " + line)
    say(f"  (exit {done.returncode})")
    flush_held()
    return done.returncode


def abort_the_orphan(bootstrap: str, h: dict[str, Any], candidate_id: str, after: int) -> bool:
    """list, show, dry run, --execute, the LSO before and after, the job resolving it, a second --execute.
    True when the abort went through and the partition is unblocked."""
    topic, partition = h["topic"], h["partition"]
    HOLD.set()
    common = ("--bootstrap-server", bootstrap, "--cluster", "demo", "--output", "table")
    run_shown("proposals", "list", *common)
    run_shown("proposals", "show", candidate_id, *common)
    run_shown("proposals", "abort", candidate_id, *common)  # dry run: verify only
    before = last_stable_offset(bootstrap, topic, partition)
    code = run_shown("proposals", "abort", candidate_id, "--execute", "--actor", "demo", *common)
    now = last_stable_offset(bootstrap, topic, partition)
    say(
        f"{topic}-{partition}: last stable offset {before} -> {now}; the record at offset {after} is "
        + ("now readable by read_committed consumers" if now > after else "still held back")
    )
    if code == 0:
        # The job sees the transaction gone on its next sweep and resolves the candidate.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and candidate_for(bootstrap, h) is not None:
            time.sleep(1)
        flush_held()
        if candidate_for(bootstrap, h) is None:
            say(f"the job resolved candidate {candidate_id} (RESOLVED on txnwatch.abort-candidates)")
        say("running it again is a no-op:")
        run_shown("proposals", "abort", candidate_id, "--execute", "--actor", "demo", *common)
    HOLD.clear()
    return code == 0 and now > after


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dev.demo", description=__doc__)
    parser.add_argument("--seconds", type=float, default=float(os.environ.get("DEMO_SECONDS", "300")))
    parser.add_argument("--metrics-port", type=int, default=9465)
    args = parser.parse_args(argv)
    DEMO_DIR.mkdir(parents=True, exist_ok=True)
    log = DEMO_DIR / "demo.log"
    procs: list[subprocess.Popen[str]] = []
    state_dir = DEMO_DIR / "testbed"
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    deadline = time.monotonic() + args.seconds
    try:
        banner("1/6 Kafka")
        cluster = start_cluster(TestBedConfig(partition_verification=False), state_dir)
        b = cluster.bootstrap_servers
        say(
            f"Apache Kafka 4.3 (KRaft) on {b}, ready in {cluster.started_in_s:.0f}s. Partition verification is off, "
            "so a buggy client can leave a real hanging transaction."
        )

        banner("2/6 collector: txnwatch collect --interval-ms 5000")
        procs.append(
            subprocess.Popen(
                txnwatch(
                    "collect",
                    "--bootstrap-server",
                    b,
                    "--interval-ms",
                    "5000",
                    "--cluster",
                    "demo",
                    "--metrics-port",
                    "0",
                ),
                stdout=log.open("a"),
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
        say(
            "Sweeps every partition leader (DescribeProducers) and publishes snapshots to txnwatch.producer-state."
        )

        banner("3/6 streaming job: txnwatch stream (Spark, local)")
        stream = subprocess.Popen(
            txnwatch(
                "stream",
                "--bootstrap-server",
                b,
                "--cluster",
                "demo",
                "--checkpoint-location",
                str(DEMO_DIR / f"checkpoints-{int(time.time())}"),
                "--starting-offsets",
                "earliest",
                "--master",
                "local[2]",
                "--conf",
                "spark.sql.shuffle.partitions=2",
                "--metrics-port",
                str(args.metrics_port),
                "--expire-after-ms",
                "20000",
                "--output",  # its stdout is a pipe to us: lines for people, not JSON
                "table",
            ),
            stdout=subprocess.PIPE,
            stderr=log.open("a"),
            text=True,
        )
        procs.append(stream)
        threading.Thread(target=relay, args=(stream,), daemon=True).start()
        say(f"Metrics: http://127.0.0.1:{args.metrics_port}/metrics   (logs: {log})")
        say("Spark's first micro-batch takes a minute on a small machine; verdict changes appear below.")

        banner("4/6 traffic")
        steady = workload(
            b,
            "--scenario",
            "steady",
            "--topic-prefix",
            "demo-",
            "--seconds",
            str(max(10, int(args.seconds) - 60)),
            "--rate",
            "5",
            log=log,
        )
        procs.append(steady)
        late = workload(
            b,
            "--scenario",
            "late",
            "--topic-prefix",
            "demo-",
            "--hold-ms",
            "55000",
            "--backdate-ms",
            "90000",
            log=log,
        )
        procs.append(late)
        assert late.stdout is not None
        late_truth = json.loads(late.stdout.readline())["transactions"][0]
        say(
            f"steady: committed and aborted transactions on demo-steady-*; late: one transaction held open on "
            f"{late_truth['topic']}-{late_truth['partition']} by a producer whose clock is 90s behind"
        )
        time.sleep(5)
        hang = workload(b, "--scenario", "hanging", "--topic-prefix", "demo-", log=log)
        out, _ = hang.communicate(timeout=120)
        h = next(t for t in json.loads(out)["transactions"] if t["kind"] == "hanging")
        say(
            f"hanging: producer {h['producer_id']} ({h['transactional_id']}) wrote {h['topic']}-{h['partition']} "
            f"at offset {h['start_offset']} without adding the partition, then committed, and restarted (its id "
            f"is at epoch {h['owner_epoch']} now): nothing will ever close it."
        )

        # Held back from read_committed readers until the orphan before it ends.
        after = produce_plain(b, h["topic"], h["partition"], b"written-after-the-orphan")
        say(f"one ordinary record after it, at offset {after}: read_committed consumers cannot read it")

        banner("5/6 what txnwatch sees (until its abort candidate, DEMO_SECONDS or Ctrl-C)")
        started, said_ready = time.monotonic(), False
        candidate_id: str | None = None
        unblocked = False
        abort_reserve_s = 90  # the verified abort at the end, and the job resolving the candidate
        while time.monotonic() < deadline - abort_reserve_s and not stop.is_set():
            if stream.poll() is not None:
                say(f"the streaming job exited with {stream.returncode}; see {log}")
                return 1
            ready = bool(metric_lines(args.metrics_port, ("txnwatch_stream_last_batch_timestamp_seconds{",)))
            if ready and not said_ready:
                say(
                    f"  (Spark finished its first micro-batch after {time.monotonic() - started:.0f}s; the "
                    "hanging transaction needs the grace period, 10s, before it is called HANGING)"
                )
                said_ready = True
            elif not said_ready and int(time.monotonic() - started) % 30 == 29:
                say(f"  (Spark is still on its first micro-batch: {time.monotonic() - started:.0f}s)")
            if said_ready and candidate_id is None:
                candidate_id = candidate_for(b, h)
                if candidate_id is not None:
                    time.sleep(3)  # let the job's lines reach the console before the next section
                    break
            time.sleep(1)
        banner("abort candidates (txnwatch.abort-candidates)")
        for c in read_candidates(b):
            # The verified path, not the record's kafka_cli: Kafka's line re-checks nothing, and `show` offers it
            # only while verification says SAFE.
            say(
                f"  {c['status']:8} {c['topic']}-{c['partition']} producer {c['spec']['producer_id']} "
                f"reason {c['reason']}\n           txnwatch proposals show {c['candidate_id']} "
                f"--bootstrap-server {b} --cluster demo"
            )
        if candidate_id is None:
            say(
                "\nno abort candidate for the hanging transaction yet: run with a larger DEMO_SECONDS (>= 300)"
            )
        elif not stop.is_set():
            banner("6/6 the verified abort (txnwatch proposals)")
            unblocked = abort_the_orphan(b, h, candidate_id, after)
        banner("metrics now")
        for line in metric_lines(
            args.metrics_port,
            (
                "txnwatch_abort_candidates",
                "txnwatch_hanging_transactions",
                "txnwatch_partitions_with_late_transactions",
                "txnwatch_max_active_transaction_duration_seconds",
            ),
        ):
            say("  " + line)
        if stop.is_set():
            return 0
        if not unblocked:
            say("the demo did not end with the partition unblocked (see above)")
        return 0 if unblocked else 1
    except KeyboardInterrupt:
        say("\nstopping")
        return 0
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        stop_cluster(state_dir)
        say(f"stopped everything the demo started (logs in {DEMO_DIR})")


if __name__ == "__main__":
    sys.exit(main())
