"""How long the streaming job takes to become current on a large transaction log, from an empty checkpoint.

`python -m benchmarks.bench_catchup [--records 1000000] [--log-partitions 50] [--batch N] [--bootstrap B]`
starts its own one-node test bed (unless --bootstrap), writes `--records` real-shaped `__transaction_state`
records (benchmarks.bench_stream.coordinator_records: Empty, then Ongoing / PrepareCommit / CompleteCommit per
transaction, TV2) to a normal topic with the log's partition count, and publishes one `CoordinatorLogPosition`
for that topic's end offsets, as the collector would right after a sweep. It then starts the reconcile query
(`streaming.job.start(..., queries=("reconcile",))`, local[2], 4 shuffle partitions and the job's defaults as
`txnwatch stream` builds them, reading that topic through
`transaction_log_topic`) on an empty checkpoint and times, from the start of the query:

- the first batch (Python workers, RocksDB, and with no --batch the whole log at once);
- when the view is current (the job's own VIEW report: every partition applied up to the position), which is
  when HANGING verdicts can be proven again;
- the view's records behind over time (sampled every 2 s).

It stops by itself (--budget-s). The last line of stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.admin import NewTopic
from kafka.structs import TopicPartition

from benchmarks.bench_stream import RECONCILE, coordinator_records, log, produce, state_figures, state_per_id
from common.settings import KafkaSettings, Settings, StreamSettings
from common.topics import TopicSettings
from detectors.contract import COORDINATOR_LOG_POSITION_TYPE
from detectors.models import CoordinatorLogPosition
from dev.kafka import TestBedConfig, start_cluster, stop_cluster


def publish_position(
    bootstrap: str, log_topic: str, snapshot_topic: str, partitions: int
) -> CoordinatorLogPosition:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        ends = consumer.end_offsets([TopicPartition(log_topic, p) for p in range(partitions)])
    finally:
        consumer.close()
    position = CoordinatorLogPosition(
        cluster="bench",
        sweep_id="bench-1",
        topic=log_topic,
        partitions=partitions,
        as_of_ms=int(time.time() * 1000),
        end_offsets={tp.partition: offset for tp, offset in ends.items()},
    )
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    try:
        producer.send(
            snapshot_topic,
            key=f"__position__-{log_topic}".encode(),
            value=position.model_dump_json().encode(),
            headers=[("txnwatch.type", COORDINATOR_LOG_POSITION_TYPE.encode())],
        ).get(timeout=60)
    finally:
        producer.close()
    return position


def read_state(checkpoint: Path) -> int:
    from streaming import job
    from streaming.session import build_session

    spark = build_session(
        master="local[2]",
        app_name="txnwatch-bench-catchup-state",
        # One bucket of views at 1M ids is ~12 MB pickled, and the state reader holds a partition's at once.
        extra_conf={**job.spark_conf(), "spark.ui.enabled": "false", "spark.driver.memory": "6g"},
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        # Two stateful operators (stage 2 is operator 0); the row counts come from the pickled dicts.
        states = state_figures(spark, checkpoint, {"stateOperators": [{}, {}]})
    finally:
        spark.stop()
    per_id = state_per_id([{"phase": "coordinator", "state": states}])
    log(f"state per transactional id: {per_id}")
    print(json.dumps({"checkpoint": str(checkpoint), "state": states, "state_per_transactional_id": per_id}))
    return 0


def read_state_in_own_process(checkpoint: Path) -> dict[str, Any]:
    """`read_state` in a fresh Python and JVM (6 GB driver); its JSON line, or {} if it failed."""
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_catchup", "--read-state", str(checkpoint)],
        stdout=subprocess.PIPE,
        text=True,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        log(f"reading the state back failed (exit {done.returncode})")
        return {}
    read: dict[str, Any] = json.loads(lines[-1])
    return read


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_catchup",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--records", type=int, default=1_000_000, help="transaction log records to catch up on"
    )
    parser.add_argument(
        "--log-partitions", type=int, default=50, help="Kafka's default for __transaction_state"
    )
    parser.add_argument("--batch", type=int, help="--coordinator-max-offsets-per-trigger (default: none)")
    parser.add_argument("--trigger", default="5 seconds")
    parser.add_argument("--budget-s", type=float, default=900.0, help="give up after this long")
    parser.add_argument("--heap", default="512m", help="broker heap")
    parser.add_argument("--bootstrap", help="use this running broker instead of starting a test bed")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--last-record-only",
        action="store_true",
        help="write only each id's last record (CompleteCommit): --records ids, one record each (state size at "
        "many ids without 4x the log)",
    )
    parser.add_argument(
        "--state",
        action="store_true",
        help="after the view is current, read the state back (state data source) and report bytes per id",
    )
    parser.add_argument(
        "--read-state",
        type=Path,
        metavar="QUERY_CHECKPOINT",
        help="only read the state of an existing reconcile checkpoint (<checkpoint>/txnwatch-reconcile) back and "
        "report bytes per id; no broker",
    )
    args = parser.parse_args(argv)
    if args.read_state:
        return read_state(args.read_state)

    run = uuid.uuid4().hex[:6]
    workdir = Path(tempfile.mkdtemp(prefix="txnwatch-bench-catchup-"))
    state_dir = workdir / "testbed"
    started_bed = False
    spark = None
    result: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "records_wanted": args.records,
        "log_partitions": args.log_partitions,
        "batch": args.batch,
        "trigger": args.trigger,
        "loadavg_start": Path("/proc/loadavg").read_text().strip(),
    }
    try:
        if args.bootstrap:
            bootstrap = args.bootstrap
        else:
            log(f"starting a one-node test bed (heap {args.heap}) in {state_dir}")
            bootstrap = start_cluster(TestBedConfig(heap=args.heap), state_dir).bootstrap_servers
            started_bed = True
        log_topic, prefix = f"catchup{run}.txnlog", f"catchup{run}"
        snapshot_topic = f"{prefix}.producer-state"
        admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=60_000)
        try:
            admin.create_topics([NewTopic(log_topic, args.log_partitions, 1), NewTopic(snapshot_topic, 1, 1)])
        finally:
            admin.close()
        if args.last_record_only:
            ids = args.records
            records = (
                r
                for i, r in enumerate(coordinator_records(ids, 1, 1_000, args.seed, run))
                if (i // 1_000) % 4 == 3
            )
        else:
            ids = max(1, args.records // 4)  # 1 + 3 records per id (one transaction each)
            records = coordinator_records(ids, 1, 1_000, args.seed, run)
        result["ids"] = ids
        result["last_record_only"] = args.last_record_only
        result["produced"] = produce(bootstrap, log_topic, records)
        position = publish_position(bootstrap, log_topic, snapshot_topic, args.log_partitions)
        result["position_records"] = sum(position.end_offsets.values())

        from streaming import job  # imported late: pyspark is slow to import
        from streaming.session import build_session

        spark = build_session(
            master="local[2]",
            app_name="txnwatch-bench-catchup",
            # As `txnwatch stream` builds it (streaming/cli.py): 4 shuffle partitions, so 4 state partitions per
            # stateful stage, not Spark's 200.
            extra_conf={**job.spark_conf(), "spark.sql.shuffle.partitions": "4", "spark.ui.enabled": "false"},
        )
        spark.sparkContext.setLogLevel("ERROR")
        settings = Settings(
            cluster="bench",
            kafka=KafkaSettings(bootstrap_servers=bootstrap),
            topics=TopicSettings(prefix=prefix),
            stream=StreamSettings(
                checkpoint_location=str(workdir / "checkpoint"),
                trigger=args.trigger,
                starting_offsets="earliest",
                coordinator_max_offsets_per_trigger=args.batch,
                transaction_log_topic=log_topic,
                metrics_port=0,
            ),
        )
        opts = job.StreamOptions(settings=settings, kafka_options={"bootstrap.servers": bootstrap})
        job.ensure_topics(opts, settings.kafka.client_kwargs())
        log(f"reconcile query from an empty checkpoint over {result['position_records']:,} records")
        began = time.monotonic()
        running = job.start(spark, opts, out=None, queries=("reconcile",))
        samples: list[tuple[float, int]] = []
        first_batch_s = current_s = None
        try:
            query = running.queries[0]
            next_sample = 0.0
            while time.monotonic() - began < args.budget_s:
                elapsed = time.monotonic() - began
                if first_batch_s is None and query.lastProgress is not None:
                    first_batch_s = elapsed
                lag = running.live.view_lag()
                if lag is not None and elapsed >= next_sample:
                    samples.append((round(elapsed, 1), int(lag["records_behind"])))
                    next_sample = elapsed + 2.0
                if lag is not None and lag["current"]:
                    current_s = elapsed
                    break
                if running.failed():
                    raise RuntimeError(running.failed())
                time.sleep(0.25)
            # The view turns current inside the batch's sink, before Spark posts the batch's progress.
            waited = time.monotonic()
            while running.queries[0].lastProgress is None and time.monotonic() - waited < 120:
                time.sleep(0.5)
            if first_batch_s is None and running.queries[0].lastProgress is not None:
                first_batch_s = time.monotonic() - began
        finally:
            last_progress = running.queries[0].lastProgress
            running.stop()
        if args.state and last_progress is not None:
            # Read back in a JVM of its own: this session's driver (1 GB) ran out of heap on 1M ids' state.
            spark.stop()
            spark = None
            read = read_state_in_own_process(workdir / "checkpoint" / RECONCILE)
            result["state"] = read.get("state")
            result["state_per_transactional_id"] = read.get("state_per_transactional_id")
        result.update(
            first_batch_s=None if first_batch_s is None else round(first_batch_s, 1),
            current_after_s=None if current_s is None else round(current_s, 1),
            records_per_s=None if not current_s else round(result["position_records"] / current_s),
            records_behind_samples=samples,
            loadavg_end=Path("/proc/loadavg").read_text().strip(),
        )
        log(
            f"current after {result['current_after_s']} s (first batch {result['first_batch_s']} s) on "
            f"{result['position_records']:,} records: {result['records_per_s']} records/s"
        )
    finally:
        if spark is not None:
            spark.stop()
        if started_bed:
            stop_cluster(state_dir)
    print(json.dumps(result))
    return 0 if result.get("current_after_s") is not None else 1


if __name__ == "__main__":
    raise SystemExit(main())
