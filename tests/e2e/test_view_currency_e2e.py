"""End to end: a coordinator view that is behind never yields a HANGING verdict (issue: a live transaction was
called HANGING while the job's view of `__transaction_state` lagged the snapshots).

Real broker, real `txnwatch collect`, the real job. A busy transactional workload writes coordinator records
faster than a throttled job (`--max-offsets-per-trigger`) reads them: the view is behind and stays behind. Two
healthy producers then hold transactions open well past the grace period (one had just committed a transaction,
so a lagging view shows it completed: the issue's case; one is new, so the lagging view has never heard of its
producer id), and a real orphan is made. While behind: no candidate at all, the withheld verdicts and the lag are
on /metrics, and the console says it is catching up. Then the job is restarted on the same checkpoint without the
throttle: it catches up, the healthy transactions (still open) are OPEN, the orphan gets its candidate (first seen
while behind), and the healthy ones never get one.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.admin import NewTopic
from kafka.structs import TopicPartition
from pyspark.sql import SparkSession
from test_stream_e2e import Console, first_batch_done, read_topic, scrape, wait_for
from workloads import ROOT, run_workload

from common.settings import KafkaSettings, Settings, StreamSettings, overlay
from common.topics import TopicSettings
from detectors.currency import coordinator_partition
from detectors.models import AbortCandidate, HangingReason
from streaming import job

pytestmark = pytest.mark.e2e

# The healthy transactions stay open until the test releases them, at most this long (the test bed's
# transaction.max.timeout.ms is 60 s): well past the grace (4 s), and through the catch-up.
HOLD_MAX_S = 52.0


class Healthy(threading.Thread):
    """A transactional producer that (optionally) commits one transaction, then holds one open until released
    (or HOLD_MAX_S) and commits it."""

    def __init__(
        self, bootstrap: str, topic: str, partition: int, *, commit_first: bool, transactional_id: str
    ) -> None:
        super().__init__(daemon=True)
        self.transactional_id = transactional_id
        self.bootstrap, self.topic, self.partition, self.commit_first = (
            bootstrap,
            topic,
            partition,
            commit_first,
        )
        self.opened = threading.Event()
        self.release = threading.Event()
        self.released_by_timeout = False
        self.error: BaseException | None = None
        self.start_offset: int | None = None

    def run(self) -> None:
        try:
            producer = KafkaProducer(
                bootstrap_servers=self.bootstrap,
                transactional_id=self.transactional_id,
                transaction_timeout_ms=60_000,
            )
            producer.init_transactions()
            if self.commit_first:
                producer.begin_transaction()
                producer.send(self.topic, b"first", partition=0).get(timeout=30)
                producer.commit_transaction()
            producer.begin_transaction()
            md = producer.send(self.topic, b"held", partition=self.partition).get(timeout=30)
            self.start_offset = md.offset
            self.opened.set()
            self.released_by_timeout = not self.release.wait(HOLD_MAX_S)
            producer.commit_transaction()
            producer.close(timeout=10)
        except BaseException as exc:  # reported by the test
            self.error = exc
            self.opened.set()


def metric_sum(metrics: dict, name: str) -> float:
    return sum(v for _, v in metrics.get(name, []))


@pytest.fixture
def collector(bootstrap: str, tmp_path: Path) -> Iterator[str]:
    prefix = f"cur{uuid.uuid4().hex[:8]}"
    log = (tmp_path / "collector.log").open("w")
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "txnwatch_cli", "collect", "--bootstrap-server", bootstrap),
            *("--interval", "2", "--topic-prefix", prefix, "--cluster", "cur", "--metrics-port", "0"),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
    )
    try:
        yield prefix
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def test_no_candidate_while_the_view_is_behind_and_the_orphan_once_current(
    spark: SparkSession, bootstrap: str, collector: str, tmp_path: Path
) -> None:
    prefix = collector
    settings = Settings(
        cluster="cur", kafka=KafkaSettings(bootstrap_servers=bootstrap), topics=TopicSettings(prefix=prefix)
    )
    healthy_topic = f"{prefix}-healthy"
    # One transaction first: a fresh broker creates __transaction_state on first use.
    run_workload(bootstrap, "--scenario", "steady", "--topic-prefix", f"{prefix}-first-", "--seconds", "1")
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(healthy_topic, 3, 1)])
    log_partitions = len(admin.describe_topics(["__transaction_state"])[0]["partitions"])
    admin.close()
    # The busy workload, the orphan and the healthy transaction that committed first all live on coordinator
    # partition 0, the one the job stays behind on (a transactional id's records are all in its partition).
    on_busy = ("--coordinator-partition", f"0/{log_partitions}")

    def on_busy_partition(base: str) -> str:
        return next(
            t
            for t in (f"{base}-{uuid.uuid4().hex[:8]}" for _ in range(10_000))
            if coordinator_partition(t, log_partitions) == 0
        )

    # the case: a committed transaction, then a long one the lagging view cannot see yet
    a = Healthy(
        bootstrap, healthy_topic, 1, commit_first=True, transactional_id=on_busy_partition("healthy-a")
    )
    # a producer id the lagging view has never seen (its records are on the busy partition, not read yet)
    b = Healthy(
        bootstrap, healthy_topic, 2, commit_first=False, transactional_id=on_busy_partition("healthy-b")
    )
    # Coordinator records faster than the throttled job reads them (3 per transaction, tens of transactions/s).
    busy = subprocess.Popen(
        [
            *(sys.executable, "-m", "dev.workload", "--bootstrap-server", bootstrap, "--scenario", "steady"),
            *("--topic-prefix", f"{prefix}-busy-", "--seconds", "240", "--rate", "1000", "--producers", "4"),
            *on_busy,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=ROOT,
    )
    console = Console()

    def options(max_offsets: int | None) -> job.StreamOptions:
        stream = StreamSettings(
            checkpoint_location=str(tmp_path / "checkpoints"),
            trigger="2 seconds",
            starting_offsets="earliest",
            coordinator_max_offsets_per_trigger=max_offsets,
            expire_after_ms=60_000,
            metrics_port=0,
        )
        return job.StreamOptions(
            settings=overlay(settings, {"stream": stream}), kafka_options={"bootstrap.servers": bootstrap}
        )

    job.ensure_topics(options(None), settings.kafka.client_kwargs())
    try:
        # A backlog before the job starts: the busy workload has written a few hundred coordinator records.
        begin = log_end(bootstrap)
        wait_for(lambda: log_end(bootstrap) >= begin + 500, 60, "the busy workload's first records")
        # 5 coordinator records per 2 s batch: the 500-record backlog alone keeps the view behind for minutes,
        # however fast or slow the busy workload runs on a loaded machine (a rate race made this test flaky).
        throttled = job.start(spark, options(5), out=console, queries=("reconcile",))
        try:
            wait_for(lambda: first_batch_done(throttled, "txnwatch-reconcile"), 240, "the job's first batch")
            a.start()
            b.start()
            assert a.opened.wait(60) and b.opened.wait(60) and not (a.error or b.error), (a.error, b.error)
            held_at = time.monotonic()
            orphan = next(
                t
                for t in run_workload(
                    bootstrap, "--scenario", "hanging", "--topic-prefix", f"{prefix}-hang-", *on_busy
                )["transactions"]
                if t["kind"] == "hanging"
            )

            # Behind: the healthy transactions and the orphan are all past the grace, and nothing is proven.
            def withheld() -> dict | None:
                m = scrape(throttled.metrics_port)
                return m if metric_sum(m, "txnwatch_withheld_verdicts") >= 3 else None

            try:
                behind = wait_for(withheld, 40, "withheld verdicts while the view is behind")
            except AssertionError:
                seen = scrape(throttled.metrics_port)
                print(
                    console.text()[-3000:], {k: v for k, v in seen.items() if "view" in k or "withheld" in k}
                )
                raise
            for _ in range(3):  # and it stays so
                assert not candidates_of(bootstrap, settings), "a candidate while the view is behind"
                time.sleep(2)
            assert metric_sum(behind, "txnwatch_coordinator_view_records_behind") > 0
            assert metric_sum(behind, "txnwatch_coordinator_view_lag_seconds") > 0
            assert metric_sum(behind, "txnwatch_hanging_transactions") == 0
            print(
                f"\nwhile behind ({time.monotonic() - held_at:.0f}s into the healthy transactions): "
                f"{metric_sum(behind, 'txnwatch_coordinator_view_records_behind'):.0f} records, "
                f"{metric_sum(behind, 'txnwatch_coordinator_view_lag_seconds'):.0f}s; withheld "
                f"{metric_sum(behind, 'txnwatch_withheld_verdicts'):.0f}"
            )
            assert "catching up on the coordinator log" in console.text()
            assert "UNCONFIRMED" in console.text()
        finally:
            throttled.stop()
        busy.terminate()
        busy.wait(timeout=60)
        restarted_at = time.time() * 1000

        # Restarted on the same checkpoint without the throttle: it catches up; the healthy transactions, still
        # open, are OPEN (their owning records are read now), and the orphan is proven.
        caught_up = job.start(spark, options(None), out=console, queries=("reconcile",))
        try:
            started = time.monotonic()

            def healthy_verdicts() -> dict[int, str] | None:
                verdicts, _ = caught_up.live.snapshot()
                kinds = {v.partition: v.kind for v in verdicts if v.topic == healthy_topic}
                return kinds if kinds.get(1) == "OPEN" and kinds.get(2) == "OPEN" else None

            wait_for(
                healthy_verdicts, max(1.0, held_at + HOLD_MAX_S - time.monotonic()), "OPEN healthy verdicts"
            )
            assert not (a.released_by_timeout or b.released_by_timeout), "judged after they committed"
            a.release.set()
            b.release.set()
            a.join(timeout=60)
            b.join(timeout=60)
            assert not (a.error or b.error), (a.error, b.error)

            def orphan_candidate() -> list:
                return [c for c in candidates_of(bootstrap, settings) if c.topic == orphan["topic"]]

            (c,) = wait_for(orphan_candidate, 240, "the orphan's candidate once the view is current")
            print(
                f"current, healthy OPEN and orphan proven {time.monotonic() - started:.1f}s after the restart"
            )
            assert c.reason is HangingReason.COORDINATOR_COMPLETED
            assert (c.spec.partition, c.spec.producer_id, c.start_offset) == (
                orphan["partition"],
                orphan["producer_id"],
                orphan["start_offset"],
            )
            assert c.evidence.first_seen_ms is not None and c.evidence.first_seen_ms < restarted_at
            assert c.evidence.view_current_as_of_ms is not None
            assert (
                c.evidence.view_current_as_of_ms
                >= (c.evidence.judged_as_of_ms or 0)
                >= c.evidence.first_seen_ms
            )
            wait_for(
                lambda: (
                    metric_sum(scrape(caught_up.metrics_port), "txnwatch_coordinator_view_records_behind")
                    == 0
                ),
                120,
                "the view to be current",
            )
            assert "coordinator view current" in console.text()
            named = {x.topic for x in candidates_of(bootstrap, settings)}
            assert healthy_topic not in named  # never, behind or current
        finally:
            caught_up.stop()
    finally:
        for h in (a, b):
            h.release.set()
        if busy.poll() is None:
            busy.kill()
            busy.wait(timeout=30)


def log_end(bootstrap: str) -> int:
    """Records in __transaction_state so far (the sum of its end offsets)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        parts = [
            TopicPartition("__transaction_state", p)
            for p in consumer.partitions_for_topic("__transaction_state")
        ]
        return sum(consumer.end_offsets(parts).values())
    finally:
        consumer.close()


def candidates_of(bootstrap: str, settings: Settings) -> list[AbortCandidate]:
    return [
        AbortCandidate.model_validate_json(r.value)
        for r in read_topic(bootstrap, settings.topics.abort_candidates)
    ]
