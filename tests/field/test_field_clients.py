"""The field's clients under their own faults, watched by txnwatch (issue 31, item 3).

Kafka Streams exactly_once_v2 (two instances, a rebalance, one paused past its transaction timeout and fenced on
waking, one SIGKILLed and restarted) and librdkafka consume-transform-produce workers (one paused inside a
transaction past its timeout, one SIGKILLed inside one), all from dev/field_clients.py, write their transactions
to a broker of this module's own while the real collector and the streaming job watch. Their input's event time
is three hours old, and both clients carry it to their outputs.

Every verdict the job gives on this broker (its only writers are these clients) is recorded from the job's own
event sink, and /metrics is scraped every second. Expected, from the scenario's truth (each fault's transaction as
its coordinator described it, and when the coordinator aborted it):

- no HANGING, STUCK_PREPARE, COORDINATOR_OVERDUE or UNCONFIRMED verdict, and no abort candidate, ever;
- LATE only for a faulted transaction (its producer id, one of its partitions), only between its fault and its
  coordinator's abort (plus the time a report takes to reach a verdict), and after that no verdict of it;
- OPEN verdicts on every kind of partition these clients write (output, Streams' repartition and changelog);
- MaxActiveTransactionDuration never beyond a transaction timeout plus the reporting delay (the records' hours-old
  timestamps must not count), a paused transaction seen growing in it; PartitionsWithLateTransactionsCount 0 on
  every scrape (no transaction outlives the broker's transaction.max.timeout.ms: their coordinator aborts them at
  their own 10 s).
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaConsumer
from kafka.structs import TopicPartition
from prometheus_client.parser import text_string_to_metric_families
from pyspark.sql import SparkSession
from workloads import partition_batches

from common.settings import KafkaSettings, Settings, StreamSettings
from common.topics import TopicSettings
from dev.field_clients import (
    RDKAFKA_TRANSACTION_TIMEOUT_MS,
    STREAMS_TRANSACTION_TIMEOUT_MS,
    FaultRecord,
    FieldScenario,
)
from dev.kafka import Cluster, TestBedConfig, start_cluster, stop_cluster
from streaming import job

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

CLUSTER = "field"
COLLECT_INTERVAL_S = 1
# From a transaction's state at its leader to a verdict on it: the collector's interval, a job batch or two (2 s
# trigger, longer on 2 loaded cores). A verdict about a moment up to this long ago is still about that moment.
REPORT_DELAY_MS = 20_000
TIMEOUT_MS = max(STREAMS_TRANSACTION_TIMEOUT_MS, RDKAFKA_TRANSACTION_TIMEOUT_MS)
NEVER = {"HANGING", "STUCK_PREPARE", "COORDINATOR_OVERDUE", "UNCONFIRMED"}


@dataclass(frozen=True)
class Seen:
    """One event of the job's event sink (streaming/sinks.py), as recorded when the sink applied it."""

    event: str
    topic: str
    partition: int
    producer_id: int
    start_offset: int
    kind: str | None
    reason: str | None
    withheld: str | None
    event_time_ms: int
    age_ms: int | None
    candidate_id: str | None

    @property
    def open_since_ms(self) -> int | None:
        return None if self.age_ms is None else self.event_time_ms - self.age_ms


@dataclass
class Recorder:
    """Every event the job's sink applies (the job's LiveState.apply_events, wrapped), and /metrics every second."""

    port: int
    events: list[Seen] = field(default_factory=list)
    scrapes: list[tuple[int, dict[str, list[tuple[dict[str, str], float]]]]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def wrap(self, live: Any) -> None:
        apply: Callable[[Any], None] = live.apply_events

        def recording(rows: Any) -> None:
            rows = list(rows)
            self.events += [
                Seen(
                    r.event,
                    r.topic,
                    int(r.partition),
                    int(r.producer_id),
                    int(r.start_offset),
                    r.kind,
                    r.reason,
                    r.withheld,
                    int(r.event_time_ms),
                    None if r.age_ms is None else int(r.age_ms),
                    r.candidate_id,
                )
                for r in rows
                if r.event != "VIEW"
            ]
            apply(rows)

        live.apply_events = recording

    def start_scraping(self) -> None:
        threading.Thread(target=self._scrape, daemon=True).start()

    def _scrape(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(OSError):  # a missed scrape is only a gap
                self.scrapes.append((int(time.time() * 1000), scrape(self.port)))
            time.sleep(1)

    def stop(self) -> None:
        self._stop.set()


def scrape(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(body):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def wait_for(predicate: Callable[[], Any], timeout_s: float, what: str, poll_s: float = 1.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")


def read_topic(bootstrap: str, topic: str) -> list[Any]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, consumer_timeout_ms=2000)
    try:
        parts = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or []]
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        return list(consumer)
    finally:
        consumer.close()


@dataclass
class Run:
    """The module's one run: its broker, the scenario's truth, what the job said and /metrics showed."""

    bed: Cluster
    scenario: FieldScenario
    faults: list[FaultRecord]
    recorder: Recorder
    candidates: list[Any]
    final_verdicts: list[Any]
    collector_log: Path
    seconds: float


@pytest.fixture(scope="module")
def run(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    """One broker, one collector, one job and every field client, for the module: the scenario runs to its end
    here, the tests read what was recorded."""
    began = time.monotonic()
    directory = tmp_path_factory.mktemp("field")
    # A broker of its own: the KIP-664 counts are per broker, and other modules' orphans must not be in them.
    bed = start_cluster(TestBedConfig(nodes=1, heap="384m"), directory / "bed")
    prefix = f"fld{uuid.uuid4().hex[:6]}"
    collector_log = directory / "collector.log"
    collector: subprocess.Popen[bytes] | None = None
    running: job.RunningJob | None = None
    scenario = FieldScenario(bed.bootstrap_servers, f"{prefix}-", directory / "clients")
    recorder: Recorder | None = None
    try:
        with collector_log.open("wb") as log:
            collector = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "txnwatch_cli",
                    "collect",
                    "--bootstrap-server",
                    bed.bootstrap_servers,
                    "--interval",
                    str(COLLECT_INTERVAL_S),
                    "--topic-prefix",
                    prefix,
                    "--cluster",
                    CLUSTER,
                    "--metrics-port",
                    "0",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        settings = Settings(
            cluster=CLUSTER,
            kafka=KafkaSettings(bootstrap_servers=bed.bootstrap_servers),
            topics=TopicSettings(prefix=prefix),
            stream=StreamSettings(
                checkpoint_location=str(directory / "checkpoint"),
                trigger="2 seconds",
                starting_offsets="earliest",
                expire_after_ms=20_000,
                metrics_port=0,
            ),
        )
        # The windows (KIP-664 durations) every 2 s too, not every 15 s: a 10 s transaction is to be seen in them.
        opts = job.StreamOptions(
            settings=settings,
            kafka_options={"bootstrap.servers": bed.bootstrap_servers},
            secondary_trigger="2 seconds",
        )
        job.ensure_topics(opts, settings.kafka.client_kwargs())
        running = job.start(spark, opts, out=None)
        recorder = Recorder(running.metrics_port)
        recorder.wrap(running.live)
        recorder.start_scraping()
        scenario.start()  # while the job's first batch starts its Python workers
        reconcile = next(q for q in running.queries if q.name == "txnwatch-reconcile")
        wait_for(lambda: reconcile.lastProgress is not None, 240, "the job's first batch")
        scenario.phase(f"the job's first batch done ({time.monotonic() - began:.0f}s into the module)")

        def first_open() -> bool:
            assert collector is not None and collector.poll() is None, collector_log.read_text()[-3000:]
            return any(e.kind == "OPEN" for e in recorder.events)

        wait_for(first_open, 120, "a first OPEN verdict")
        faults = scenario.run_faults()
        scenario.stop()
        # Every client stopped between or after its transactions: once reported, nothing is open on the broker.
        wait_for(
            lambda: (
                not running.live.snapshot()[0]
                and time.time() * 1000 > scenario.phases[-1][0] + REPORT_DELAY_MS
            ),
            120,
            "no verdict left once the clients stopped",
        )
        scenario.phase("no verdict left")
        assert running.failed() is None, running.failed()
        final = running.live.snapshot()[0]
        recorder.stop()
        yield Run(
            bed,
            scenario,
            faults,
            recorder,
            [r for r in read_topic(bed.bootstrap_servers, settings.topics.abort_candidates)],
            final,
            collector_log,
            time.monotonic() - began,
        )
    finally:
        scenario.stop()
        if recorder is not None:
            recorder.stop()
        if running is not None:
            running.stop()
        if collector is not None:
            collector.terminate()
            collector.wait(timeout=30)
        stop_cluster(directory / "bed")


def verdicts(r: Run) -> list[Seen]:
    return [e for e in r.recorder.events if e.event == "VERDICT"]


def faulted(r: Run, e: Seen) -> FaultRecord | None:
    """The fault whose transaction `e` could be about: same producer id, one of its partitions."""
    for f in r.faults:
        if e.producer_id == f.producer_id and (e.topic, e.partition) in f.partitions:
            return f
    return None


def test_the_scenario_made_every_fault_and_the_clients_recovered(run: Run) -> None:
    """The truth the other tests rely on: each fault caught a transaction its coordinator then aborted (by its
    10 s timeout at the latest; an ABORT marker on its partitions), each client wrote again, and the paused
    Streams instance was fenced on waking and the paused librdkafka worker's transaction failed."""
    print(f"\nfield run: {run.seconds:.0f}s; timeline:")
    for at, what in run.scenario.phases:
        print(f"  {at}  {what}")
    kinds = {(f.client, f.kind) for f in run.faults}
    assert kinds == {
        ("streams-a", "paused"),
        ("rdk-1", "paused"),
        ("streams-b", "killed"),
        ("rdk-2", "killed"),
    }
    for f in run.faults:
        print(f"  {f}")
        assert f.aborted_ms is not None and f.recovered_ms is not None
        assert f.aborted_epoch is not None and f.aborted_epoch > f.producer_epoch, f
        # How it ended is read from its partitions, not from the id's state (by the time it is asked, the
        # restarted client may have ended newer transactions of the id): the first marker of the producer id at an
        # epoch past the transaction's is an ABORT. Ended by the timeout, or by the restarted Streams instance's
        # InitProducerId, which fences an Ongoing transaction and aborts it first
        # (TransactionCoordinator.handleInitProducerId, case ONGOING: prepareFenceProducerEpoch), the abort bumps
        # the epoch; the id's earlier commits are at or below it (TV2 writes a transaction's markers at the next
        # epoch, librdkafka's TV1 at its own), later ones after it. Not the repartition topic's partitions:
        # Streams deletes their records once consumed (DeleteRecords).
        for topic, partition in f.partitions:
            if topic.endswith("-repartition"):
                continue
            markers = [
                b
                for b in partition_batches(run.bed.bootstrap_servers, topic, partition)
                if b.control and b.producer_id == f.producer_id and b.producer_epoch > f.producer_epoch
            ]
            assert markers and markers[0].marker == "ABORT", (f, topic, partition, markers[:3])
        # Aborted by its coordinator by the timeout at the latest (the restarted Streams instance's InitProducerId
        # may end it first); the paused ones only by the timeout: nothing else could end them.
        took_ms = f.aborted_ms - f.transaction_started_ms
        assert took_ms <= TIMEOUT_MS + 5_000, f
        assert f.kind == "killed" or took_ms >= TIMEOUT_MS - 1_000, f
    # On waking, the paused instance's producer finds its transaction gone: fenced (ProducerFencedException or
    # InvalidProducerEpochException: Streams' TaskMigratedException, it rejoins), or, when it wakes inside its
    # commit, InvalidTxnStateException from EndTxn, which Streams 4.3 treats as fatal to the stream thread (the
    # application's handler replaces the thread). Both seen on this bed.
    a = run.scenario.clients["streams-a"].stderr_text()
    fenced = "Detected that the thread is being fenced" in a
    replaced = (
        "Replacing thread in the streams uncaught exception handler" in a and "InvalidTxnStateException" in a
    )
    print(f"  streams-a on waking: {'fenced' if fenced else ''}{' thread replaced' if replaced else ''}")
    assert fenced or replaced, a[-3000:]
    assert run.scenario.clients["rdk-1"].seen_since(0, "FAILED")


def test_no_hanging_verdict_and_no_candidate(run: Run) -> None:
    counts = Counter((e.topic, e.kind) for e in verdicts(run))
    print(f"\nverdicts by topic and kind: {dict(counts)}")
    wrong = [e for e in verdicts(run) if e.kind in NEVER]
    assert not wrong, wrong[:20]
    # No OPENED, RESOLVED or WITHDRAWN event, and no verdict naming a candidate.
    named = [
        e for e in run.recorder.events if e.candidate_id is not None or e.event not in ("VERDICT", "GONE")
    ]
    assert not named, named[:20]
    assert run.candidates == []


def test_open_verdicts_on_every_kind_of_partition_the_clients_write(run: Run) -> None:
    t = run.scenario.topics
    open_topics = {e.topic for e in verdicts(run) if e.kind == "OPEN"}
    expected = {
        t.streams_output,
        f"{t.application_id}-counts-repartition",
        f"{t.application_id}-counts-changelog",
        t.rdkafka_output,
    }
    assert expected <= open_topics, open_topics


def test_late_only_while_a_faulted_transaction_is_late_and_gone_once_aborted(run: Run) -> None:
    late = [e for e in verdicts(run) if e.kind == "LATE"]
    print(f"\nLATE verdicts: {late}")
    # The job's "open since" is never earlier than the transaction's start (it is held between the collector's
    # reports), so it says nothing about which transaction a LATE verdict is about; its start offset does: one
    # transaction per faulted partition is LATE, and only from the fault to its abort plus a report's delay.
    late_starts: dict[tuple[str, str, int], set[int]] = {}
    for e in late:
        f = faulted(run, e)
        if f is None or e.event_time_ms < f.fault_ms:
            # Not a scripted fault: a transaction that ran past its timeout on its own (a rebalance can hold a
            # Streams thread in poll with its transaction open; seen once, 33 s before the kill, on a repartition
            # partition). LATE is right only if txnwatch saw it open that long: its age counts from the
            # collector's sightings, never from the records' (3-hour-old) timestamps.
            assert e.age_ms is not None and e.age_ms >= min(
                STREAMS_TRANSACTION_TIMEOUT_MS, RDKAFKA_TRANSACTION_TIMEOUT_MS
            ), e
            continue
        assert f.aborted_ms is not None
        assert f.fault_ms <= e.event_time_ms <= f.aborted_ms + REPORT_DELAY_MS, (e, f)
        late_starts.setdefault((f.client, e.topic, e.partition), set()).add(e.start_offset)
    assert all(len(starts) == 1 for starts in late_starts.values()), late_starts
    # Once its coordinator aborted it (and a report had time to say so), no verdict is about the faulted
    # transaction: a later verdict of the same producer id there is about a later transaction (another start
    # offset, open since after the fault).
    for f in run.faults:
        assert f.aborted_ms is not None
        after = [
            e
            for e in verdicts(run)
            if faulted(run, e) == f and e.event_time_ms > f.aborted_ms + REPORT_DELAY_MS
        ]
        stale = [
            e
            for e in after
            if e.start_offset in late_starts.get((f.client, e.topic, e.partition), set())
            or (e.open_since_ms is not None and e.open_since_ms < f.fault_ms)
        ]
        assert not stale, (f, stale)
    assert run.final_verdicts == []


def test_kip664_metrics(run: Run) -> None:
    """MaxActiveTransactionDuration counts from a transaction's start at its leader, never from its records'
    hours-old timestamps; no partition is late by the broker's transaction.max.timeout.ms (60 s)."""
    durations: list[tuple[int, str, str, float]] = []
    late_counts: list[float] = []
    for at, m in run.recorder.scrapes:
        durations += [
            (at, lb["topic"], lb["partition"], v)
            for lb, v in m.get("txnwatch_max_active_transaction_duration_seconds", [])
        ]
        late_counts += [v for _, v in m.get("txnwatch_partitions_with_late_transactions", [])]
        late_counts += [v for _, v in m.get("txnwatch_cluster_partitions_with_late_transactions", [])]
    longest = max(durations, key=lambda d: d[3])
    print(f"\n{len(run.recorder.scrapes)} scrapes; longest MaxActiveTransactionDuration: {longest}")
    assert late_counts and set(late_counts) == {0.0}, Counter(late_counts)
    assert longest[3] <= (TIMEOUT_MS + REPORT_DELAY_MS) / 1000, longest
    # A paused transaction is seen growing: some partition of a paused fault shows seconds of it while paused.
    paused = [f for f in run.faults if f.kind == "paused"]
    seen = [
        d
        for d in durations
        for f in paused
        if (d[1], int(d[2])) in f.partitions and f.fault_ms <= d[0] <= (f.aborted_ms or 0) + REPORT_DELAY_MS
    ]
    assert max((d[3] for d in seen), default=0.0) >= 3.0, seen
