"""The driver's Prometheus endpoint: the latest verdicts and windows as gauges built at scrape time (nothing to
delete), `txnwatch_stream_state_stale` while they are not refreshed, query health from a StreamingQueryListener
(`DriverHealth`, the probes) and `txnwatch_build_info`. Families come from common/metric_descriptors.py; what
each means and why a hanging series outlives a Kafka outage: docs/streaming.md, "Metrics".
"""

from __future__ import annotations

import json
import logging
import platform
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Gauge,
    Histogram,
    disable_created_metrics,
    make_wsgi_app,
    start_http_server,
)
from prometheus_client import Counter as PromCounter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from pyspark.sql.streaming.listener import StreamingQueryListener

from common import metric_descriptors as metrics
from common.probes import with_probes
from detectors.health import (
    ProbeAnswer,
    Progress,
    build_info,
    loop_turning,
    progress_recent,
)
from detectors.kip664 import LatePartition, count_late_partitions

log = logging.getLogger("txnwatch.stream.metrics")


def _gauge(d: metrics.Metric) -> GaugeMetricFamily:
    return GaugeMetricFamily(d.name, d.help, labels=d.labels)


def _counter(d: metrics.Metric) -> CounterMetricFamily:
    return CounterMetricFamily(d.name, d.help, labels=d.labels)


@dataclass
class VerdictState:
    topic: str
    partition: int
    producer_id: int
    kind: str
    reason: str | None
    lso_lag: int | None
    candidate: bool
    withheld: str | None = None
    candidate_id: str | None = None
    # approximate (the time the verdict was made minus the age the snapshot showed): within one snapshot's delay.
    # No age is kept: stage 2 tells a verdict only when it changes (detectors.tracking.VerdictNews), so an age
    # would be as of the last change; an age at any moment is that moment minus this.
    open_since_ms: int | None = None
    # The coordinator owns it as a KIP-939 two-phase-commit transaction (no timeout; detectors.rules).
    two_phase_commit: bool = False
    start_offset: int | None = None
    # The HANGING proof its open candidate stands on: the reason and when it opened, as proven. Kept while the
    # verdict only waits (detectors.tracking.withdraws_proof): after a Kafka outage the job can judge the
    # transaction younger than proven, OPEN for a while, and its candidate stays OPENED; so does its page.
    proven_reason: str | None = None
    proven_open_since_ms: int | None = None
    # The transactional id of the coordinator record it was judged against (None without one).
    transactional_id: str | None = None
    # The transactional id its candidate was proven against (as `proven_reason`): the page names the owner the
    # proof named, and its labels do not change while the candidate is open (a record expiring meanwhile).
    proven_transactional_id: str | None = None


@dataclass
class WindowState:
    leader: int
    window_end_ms: int
    observed_at_ms: int
    duration_ms: int
    late: bool
    open_count: int


class LiveState:
    """What the foreachBatch sinks learned, read by the collector at scrape time (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.verdicts: dict[tuple[str, int, int], VerdictState] = {}
        self.windows: dict[tuple[str, int], WindowState] = {}
        self.view: dict[str, Any] | None = None  # the coordinator view's lag (detectors.currency.ViewLag)

    def apply_events(self, rows: Iterable[Any]) -> None:
        """Stage 2's events of a batch. A VERDICT replaces what is known of its transaction: stage 2 emits one
        only when something read here changes, and every one again at the first batches of a run of the job (this
        state starts empty in a new driver); a GONE removes it."""
        with self._lock:
            for r in rows:
                if r.event == "VIEW":
                    self.view = json.loads(r.payload)
                    continue
                key = (r.topic, int(r.partition), int(r.producer_id))
                if r.event == "VERDICT":
                    known = self.verdicts.get(key)
                    verdict = VerdictState(
                        r.topic,
                        int(r.partition),
                        int(r.producer_id),
                        r.kind,
                        r.reason,
                        r.lso_lag,
                        r.candidate_id is not None,
                        r.withheld,
                        r.candidate_id,
                        int(r.event_time_ms) - int(r.age_ms),
                        bool(r.two_phase_commit),
                        int(r.start_offset),
                        transactional_id=r.transactional_id,
                    )
                    self.verdicts[key] = _with_proof(verdict, known)
                elif r.event == "GONE":
                    self.verdicts.pop(key, None)

    def apply_windows(self, rows: Iterable[Any]) -> None:
        with self._lock:
            for r in rows:
                key = (r.topic, int(r.partition))
                newest = r.newest
                end_ms = int(r.window.end.timestamp() * 1000)
                known = self.windows.get(key)
                if known is not None and known.observed_at_ms > newest.observed_at_ms:
                    continue
                self.windows[key] = WindowState(
                    int(r.leader),
                    end_ms,
                    int(newest.observed_at_ms),
                    int(newest.duration_ms),
                    bool(newest.late),
                    int(newest.open_count),
                )

    def snapshot(self) -> tuple[list[VerdictState], dict[tuple[str, int], WindowState]]:
        with self._lock:
            return list(self.verdicts.values()), dict(self.windows)

    def view_lag(self) -> dict[str, Any] | None:
        with self._lock:
            return None if self.view is None else dict(self.view)


def _with_proof(verdict: VerdictState, known: VerdictState | None) -> VerdictState:
    """The verdict with the proof its open candidate stands on: the reason and the transactional id it was first
    proven HANGING on (the candidate's own, so the page's labels hold for the candidate's life) and when the
    transaction opened as the newest HANGING verdict says; kept while the same candidate stays open; none once it
    is withdrawn (or never was proven here)."""
    if verdict.candidate_id is None:
        return verdict
    same = (
        known is not None and known.candidate_id == verdict.candidate_id and known.proven_reason is not None
    )
    if verdict.kind == "HANGING":
        if same and known is not None:
            verdict.proven_reason = known.proven_reason
            verdict.proven_transactional_id = known.proven_transactional_id
        else:
            verdict.proven_reason = verdict.reason
            verdict.proven_transactional_id = verdict.transactional_id
        verdict.proven_open_since_ms = verdict.open_since_ms
    elif same and known is not None:
        verdict.proven_reason, verdict.proven_open_since_ms = known.proven_reason, known.proven_open_since_ms
        verdict.proven_transactional_id = known.proven_transactional_id
    return verdict


class VerdictCollector(Collector):
    """Builds the job's metrics (common.metric_descriptors; docs/streaming.md, Metrics) from LiveState on
    every scrape."""

    def __init__(self, state: LiveState, cluster: str) -> None:
        self.state = state
        self.cluster = cluster

    def collect(self) -> Iterator[Metric]:
        verdicts, windows = self.state.snapshot()
        c = self.cluster
        duration = _gauge(metrics.MAX_ACTIVE_TRANSACTION_DURATION_SECONDS)
        for (topic, partition), w in sorted(windows.items()):
            if w.open_count > 0:
                duration.add_metric([c, topic, str(partition)], w.duration_ms / 1000)
        yield duration
        oldest_is_two_phase_commit = _oldest_is_two_phase_commit(verdicts)
        counts = count_late_partitions(
            LatePartition(w.leader, w.open_count > 0 and w.late, oldest_is_two_phase_commit.get(key, False))
            for key, w in windows.items()
        )
        late = _gauge(metrics.PARTITIONS_WITH_LATE_TRANSACTIONS)
        for broker, n in counts.per_broker.items():
            late.add_metric([c, str(broker)], n)
        yield late
        cluster_late = _gauge(metrics.CLUSTER_PARTITIONS_WITH_LATE_TRANSACTIONS)
        cluster_late.add_metric([c], counts.cluster)
        yield cluster_late
        # The same count split by whether the late transaction (the partition's oldest open one, which KIP-664
        # counts) is a KIP-939 two-phase-commit one: those have no timeout and wait for their transaction manager,
        # so the late alert can leave them out. Both values for every broker, so `two_phase_commit="false"` is 0
        # (not absent) where only 2PC transactions are late.
        late_split = _gauge(metrics.LATE_PARTITIONS)
        for broker, n in counts.per_broker.items():
            two_pc = counts.two_phase_commit_per_broker[broker]
            late_split.add_metric([c, str(broker), "false"], n - two_pc)
            late_split.add_metric([c, str(broker), "true"], two_pc)
        yield late_split

        hanging = _gauge(metrics.HANGING_TRANSACTIONS)
        for reason, n in sorted(Counter(v.reason for v in verdicts if v.kind == "HANGING").items()):
            hanging.add_metric([c, str(reason)], n)
        yield hanging
        candidates = _gauge(metrics.ABORT_CANDIDATES)
        candidates.add_metric([c], sum(1 for v in verdicts if v.candidate))
        yield candidates
        # One series per hanging transaction, so an alert can name its partition, whose transaction it is and the
        # command to act on it: bounded by the hanging transactions (each an incident), there as long as its
        # candidate is open (proven HANGING, not withdrawn, not resolved), labelled with the transactional id and
        # the reason it was proven on (the id empty without a coordinator record) and its producer id.
        each = _gauge(metrics.HANGING_TRANSACTION_OPEN_SINCE_TIMESTAMP_SECONDS)
        for v in sorted(verdicts, key=lambda v: (v.topic, v.partition, v.candidate_id or "")):
            if (
                v.candidate_id is not None
                and v.proven_reason is not None
                and v.proven_open_since_ms is not None
            ):
                each.add_metric(
                    [
                        c,
                        v.topic,
                        str(v.partition),
                        v.proven_transactional_id or "",
                        str(v.producer_id),
                        v.proven_reason,
                        v.candidate_id,
                    ],
                    v.proven_open_since_ms / 1000,
                )
        yield each
        stuck = _gauge(metrics.STUCK_PREPARE_TRANSACTIONS)
        stuck.add_metric([c], sum(1 for v in verdicts if v.kind == "STUCK_PREPARE"))
        yield stuck
        # Per partition, so the stuck-prepare and overdue pages name the partition and the transactional id to
        # look at: only the transactions in that state (each one a page), gone when it leaves it.
        yield _open_since_each(
            metrics.STUCK_PREPARE_TRANSACTION_OPEN_SINCE_TIMESTAMP_SECONDS,
            (v for v in verdicts if v.kind == "STUCK_PREPARE"),
            lambda v: (c, v.topic, str(v.partition), v.transactional_id or ""),
        )
        yield _open_since_each(
            metrics.COORDINATOR_OVERDUE_TRANSACTION_OPEN_SINCE_TIMESTAMP_SECONDS,
            (v for v in verdicts if v.kind == "COORDINATOR_OVERDUE"),
            lambda v: (c, v.topic, str(v.partition), v.transactional_id or ""),
        )
        kinds = _gauge(metrics.OPEN_TRANSACTIONS)
        for (kind, two_pc), n in sorted(Counter((v.kind, v.two_phase_commit) for v in verdicts).items()):
            kinds.add_metric([c, kind, "true" if two_pc else "false"], n)
        yield kinds
        lag = _gauge(metrics.LAST_STABLE_OFFSET_LAG)
        per_partition: dict[tuple[str, int], int] = {}
        for v in verdicts:
            if v.lso_lag is not None:
                per_partition[(v.topic, v.partition)] = max(
                    per_partition.get((v.topic, v.partition), 0), v.lso_lag
                )
        for (topic, partition), value in sorted(per_partition.items()):
            lag.add_metric([c, topic, str(partition)], value)
        yield lag
        yield from self._view_metrics(verdicts)

    def _view_metrics(self, verdicts: list[VerdictState]) -> Iterator[Metric]:
        c = self.cluster
        withheld = _gauge(metrics.WITHHELD_VERDICTS)
        counts = Counter((v.withheld, v.reason) for v in verdicts if v.kind == "UNCONFIRMED")
        for (why, would_be), n in sorted(counts.items(), key=str):
            withheld.add_metric([c, why or "", would_be or ""], n)
        yield withheld
        yield _open_since_each(
            metrics.WITHHELD_VERDICT_OPEN_SINCE_TIMESTAMP_SECONDS,
            (v for v in verdicts if v.kind == "UNCONFIRMED"),
            lambda v: (
                c,
                v.topic,
                str(v.partition),
                v.transactional_id or "",
                v.withheld or "",
                v.reason or "",
            ),
        )
        view = self.state.view_lag()
        lag = _gauge(metrics.COORDINATOR_VIEW_LAG_SECONDS)
        behind = _gauge(metrics.COORDINATOR_VIEW_RECORDS_BEHIND)
        current = _gauge(metrics.COORDINATOR_VIEW_CURRENT_TIMESTAMP_SECONDS)
        if view is not None and view["measured"]:
            lag.add_metric([c], view["lag_ms"] / 1000)
            behind.add_metric([c], view["records_behind"])
            if view["current_as_of_ms"] is not None:
                current.add_metric([c], view["current_as_of_ms"] / 1000)
        yield lag
        yield behind
        yield current
        yield from self._undecodable_metrics(view)

    def _undecodable_metrics(self, view: dict[str, Any] | None) -> Iterator[Metric]:
        # Kept in the stage's state, so the counter survives restarts (it restarts from the checkpoint's count).
        records = _counter(metrics.COORDINATOR_RECORDS_UNDECODABLE)
        pending = _gauge(metrics.COORDINATOR_RECORDS_UNDECODABLE_PENDING)
        if view is not None:
            records.add_metric([self.cluster], view.get("undecodable_records", 0))
            pending.add_metric([self.cluster], view.get("undecodable_pending", 0))
        yield records
        yield pending


class StateStaleness(Collector):
    """`txnwatch_stream_state_stale`: whether the verdicts served beside it are being refreshed, decided as /readyz
    decides (`DriverHealth.ready`), so the probe and the metric never disagree."""

    def __init__(self, driver: DriverHealth, cluster: str) -> None:
        self.driver = driver
        self.cluster = cluster

    def collect(self) -> Iterator[Metric]:
        stale = _gauge(metrics.STREAM_STATE_STALE)
        stale.add_metric([self.cluster], 0 if self.driver.ready().ok else 1)
        yield stale


def _open_since_each(
    d: metrics.Metric, verdicts: Iterable[VerdictState], labels: Callable[[VerdictState], tuple[str, ...]]
) -> GaugeMetricFamily:
    """One series per label set of `verdicts`: when the oldest of its transactions opened (Unix seconds). Two
    transactions can share a label set (two producers of one partition whose coordinator record is unknown have
    the same empty transactional id), and an exposition may carry each label set only once."""
    oldest_ms: dict[tuple[str, ...], int] = {}
    for v in verdicts:
        if v.open_since_ms is not None:
            key = labels(v)
            oldest_ms[key] = min(oldest_ms.get(key, v.open_since_ms), v.open_since_ms)
    family = _gauge(d)
    for key, open_since_ms in sorted(oldest_ms.items()):
        family.add_metric(list(key), open_since_ms / 1000)
    return family


def _oldest_is_two_phase_commit(verdicts: Iterable[VerdictState]) -> dict[tuple[str, int], bool]:
    """Per partition: is its oldest open transaction (lowest start offset, the one KIP-664 judges late) a
    two-phase-commit one? Partitions without a verdict are absent (counted as not 2PC: the alert stays on)."""
    oldest: dict[tuple[str, int], VerdictState] = {}
    for v in verdicts:
        known = oldest.get((v.topic, v.partition))
        if v.start_offset is not None and (
            known is None or known.start_offset is None or v.start_offset < known.start_offset
        ):
            oldest[(v.topic, v.partition)] = v
    return {key: v.two_phase_commit for key, v in oldest.items()}


class Health:
    """Query health metrics, fed by the listener and the sinks."""

    def __init__(self, registry: CollectorRegistry) -> None:
        def declared(kind: type[Any], d: metrics.Metric, **more: Any) -> Any:
            return kind(d.name, d.help, d.labels, registry=registry, **more)

        buckets = (0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60)
        self.batch_duration: Histogram = declared(
            Histogram, metrics.STREAM_BATCH_DURATION_SECONDS, buckets=buckets
        )
        self.input_rows: PromCounter = declared(PromCounter, metrics.STREAM_INPUT_ROWS)
        self.dead_letters: PromCounter = declared(PromCounter, metrics.DEAD_LETTER_RECORDS)
        self.offsets_behind: Gauge = declared(Gauge, metrics.STREAM_SOURCE_OFFSETS_BEHIND_LATEST)
        self.last_batch: Gauge = declared(Gauge, metrics.STREAM_LAST_BATCH_TIMESTAMP_SECONDS)
        self.build_info: Gauge = declared(Gauge, metrics.BUILD_INFO)
        self.build_info.labels(**installed_versions()).set(1)

    def count_dead_letters_from_zero(self, sources: Iterable[str]) -> None:
        """Show each source's dead-letter count from 0 before its first: a series that first appears at 1 is no
        increase to Prometheus, and the alert on dead letters (`increase()`) would miss a driver's first."""
        for source in sources:
            self.dead_letters.labels(source)


def installed_versions() -> dict[str, str]:
    """The labels of txnwatch_build_info, from the installed distributions (detectors.health.build_info)."""
    return build_info(metadata.version, platform.python_version())


class DriverHealth:
    """The driver's probes: /healthz while its supervising loop (streaming/job.py `run`) turns, /readyz while every
    query finished a batch, or found nothing to do, within its window (monotonic time throughout).

    The loop's turns come from the main thread, the queries' progress from the listener thread; the endpoint's
    threads read. Each entry is replaced whole, so no lock is needed.
    """

    def __init__(self, *, stall_after_ms: int, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.stall_after_ms = stall_after_ms
        self._monotonic = monotonic
        self._last_turn_ms = self._now_ms()
        self._windows: dict[str, int] = {}  # query name -> ready within ms
        self._names: dict[str, str] = {}  # query id -> name (Spark's idle event carries only the id)
        # query name -> when it last finished a batch or found nothing to do
        self._progress: dict[str, int] = {}
        self._stopped: str | None = None  # why the queries are stopped, while they are

    def _now_ms(self) -> int:
        return round(self._monotonic() * 1000)

    def turned(self) -> None:
        """The driver's loop turned (its calls into Spark's JVM answered)."""
        self._last_turn_ms = self._now_ms()

    def expect(self, name: str, ready_within_ms: int) -> None:
        """The job runs this query: the driver is ready only once it moved, and while it keeps moving. Every query
        is expected before the first starts (they start one after another)."""
        self._windows = {**self._windows, name: ready_within_ms}

    def started(self, query_id: str, name: str) -> None:
        self._names = {**self._names, query_id: name}
        self._stopped = None

    def stop(self, why: str) -> None:
        """The queries stopped (to be started again): not ready, for this reason, until they move again."""
        self._stopped = why
        self._names, self._progress = {}, {}

    def moved(self, query_id: str, name: str | None = None) -> None:
        """The query finished a batch, or checked its sources and found nothing new (Spark's idle event)."""
        known = name or self._names.get(query_id)
        if known is not None:
            self._progress = {**self._progress, known: self._now_ms()}

    def live(self) -> ProbeAnswer:
        return loop_turning(
            last_turn_ms=self._last_turn_ms, now_ms=self._now_ms(), stall_after_ms=self.stall_after_ms
        )

    def ready(self) -> ProbeAnswer:
        windows, progress, stopped = self._windows, self._progress, self._stopped
        if stopped is not None:
            return ProbeAnswer(False, f"not ready: {stopped}")
        if not windows:
            return ProbeAnswer(False, "not ready: no query started yet")
        return progress_recent(
            [Progress(f"{name} batch", progress.get(name), within) for name, within in windows.items()],
            now_ms=self._now_ms(),
        )


class HealthListener(StreamingQueryListener):
    """Turns query progress into Health metrics. Runs on the driver's listener thread: fast, never raises."""

    # A failure repeats with every progress event (every batch of every query): one warning per this many seconds,
    # the rest at debug.
    WARN_EVERY_S = 300.0

    def __init__(self, health: Health, driver: DriverHealth | None = None) -> None:
        self.health = health
        self.driver = driver
        self._warned_at: float | None = None

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        try:
            p = event.progress
            if self.driver is not None:
                self.driver.moved(str(p.id), p.name)
            query = p.name or str(p.id)
            self.health.batch_duration.labels(query).observe(p.batchDuration / 1000)
            self.health.last_batch.labels(query).set(time.time())
            for s in p.sources:
                source = _source_name(s.description)
                self.health.input_rows.labels(query, source).inc(s.numInputRows)
                behind = (s.metrics or {}).get("maxOffsetsBehindLatest")
                if behind is not None:
                    self.health.offsets_behind.labels(query, source).set(float(behind))
        except Exception:  # a metrics hiccup must never disturb the query: say so, and go on
            self._report_failure()

    def _report_failure(self) -> None:
        # logging does not raise (a failing handler reports through Handler.handleError).
        now = time.monotonic()
        if self._warned_at is None or now - self._warned_at >= self.WARN_EVERY_S:
            self._warned_at = now
            log.warning("query progress not turned into metrics (repeats logged at debug)", exc_info=True)
        else:
            log.debug("query progress not turned into metrics", exc_info=True)

    def onQueryIdle(self, event: Any) -> None:
        # Spark checked the sources and found nothing new: the query is current, as after a batch.
        try:
            if self.driver is not None:
                self.driver.moved(str(event.id))
        except Exception:
            self._report_failure()

    def onQueryTerminated(self, event: Any) -> None:
        pass


def _source_name(description: str) -> str:
    # KafkaV2[Subscribe[__transaction_state]] -> __transaction_state
    if "[" in description:
        return description.rsplit("[", 1)[-1].rstrip("]")
    return description


class Endpoint:
    """One server for the driver's whole run: /healthz and /readyz from `driver`, and /metrics from the registry of
    the queries last started (`show`). After a Kafka outage `run` (streaming/job.py) stops the queries and starts
    them again; the probes answer all the while, and /metrics keeps serving what the stopped queries last knew,
    marked stale (`StateStaleness`): were it to answer 503, Prometheus would drop the hanging series and resolve
    their pages while the partitions still hang. 503 only before the first queries started (nothing known yet)."""

    def __init__(self, host: str, port: int, driver: DriverHealth) -> None:
        self.driver = driver
        self._metrics_app: Any = None
        self.server = serve(CollectorRegistry(), host, port)
        self.server.set_app(with_probes(self._current_metrics, driver))

    def show(self, registry: CollectorRegistry) -> None:
        self._metrics_app = make_wsgi_app(registry)

    def queries_stopped(self, why: str) -> None:
        """The queries stop: /readyz says `why`, and /metrics goes on with their last values, stale."""
        self.driver.stop(why)

    def _current_metrics(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        app = self._metrics_app
        if app is not None:
            return app(environ, start_response)  # type: ignore[no-any-return]
        body = b"no metrics: the queries have not started yet\n"
        start_response("503 Service Unavailable", [("Content-Type", "text/plain; charset=utf-8")])
        return [body]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def serve(registry: CollectorRegistry, host: str, port: int, driver: DriverHealth | None = None) -> Any:
    """Start the /metrics endpoint (a daemon thread), with /healthz and /readyz when given `driver`; returns the
    server (`server_port` is the bound port, port 0 picks a free one; `shutdown()` stops it)."""
    # `_created` series double every counter's output and nobody alerts on them. (prometheus_client's switch
    # is process-wide and read at scrape time.)
    disable_created_metrics()  # type: ignore[no-untyped-call]  # prometheus_client leaves it unannotated
    # prometheus_client's server keeps its choice of address family and its quiet request handler; the probes
    # are put in front of its app (wsgiref's set_app) right away.
    server, _ = start_http_server(port, addr=host, registry=registry)
    if driver is not None:
        server.set_app(with_probes(server.get_app(), driver))
    return server
