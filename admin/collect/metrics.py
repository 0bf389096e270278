"""The collector's own Prometheus metrics (explicit registry): sweep health, requests and errors by API, what
runs (`txnwatch_build_info`), and the endpoint that serves them with the /healthz and /readyz probes.

Named `txnwatch_collector_*` in base units; `_total` only on counters; names, help and labels are declared once
in common/metric_descriptors.py (the dashboard and the alert checks use the same). No producer or transactional
ids in labels; the broker label is bounded by the cluster size.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable, Mapping
from importlib import metadata
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    start_http_server,
)

from admin.wire.types import TP, SweepResult
from common import metric_descriptors as metrics
from common.probes import with_probes
from detectors.health import (
    ProbeAnswer,
    Progress,
    build_info,
    loop_turning,
    progress_recent,
)

if TYPE_CHECKING:
    from admin.collect.blocked import BlockedReport

SWEEP_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0)
# Series of txnwatch_collector_partition_uncovered per sweep: a broker down can leave thousands of partitions
# undescribed, and the by-reason gauge counts them all anyway.
MAX_UNCOVERED_SERIES = 100


def _gauge(d: metrics.Metric, registry: CollectorRegistry) -> Gauge:
    return Gauge(d.name, d.help, d.labels, registry=registry)


def _counter(d: metrics.Metric, registry: CollectorRegistry) -> Counter:
    return Counter(d.name, d.help, d.labels, registry=registry)


def _histogram(d: metrics.Metric, registry: CollectorRegistry, *, buckets: tuple[float, ...]) -> Histogram:
    return Histogram(d.name, d.help, d.labels, registry=registry, buckets=buckets)


class CollectorMetrics:
    """Every collector metric, registered in `registry` (a fresh one by default)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        reg = self.registry
        self.build_info = _gauge(metrics.BUILD_INFO, reg)
        self.build_info.labels(**installed_versions()).set(1)
        self.sweep_duration = _histogram(metrics.COLLECTOR_SWEEP_DURATION_SECONDS, reg, buckets=SWEEP_BUCKETS)
        self.coordinator_expiries_withheld = _counter(metrics.COLLECTOR_COORDINATOR_EXPIRIES_WITHHELD, reg)
        self.coordinator_positions_withheld = _counter(metrics.COLLECTOR_COORDINATOR_POSITIONS_WITHHELD, reg)
        self.sweep_failures = _counter(metrics.COLLECTOR_SWEEP_FAILURES, reg)
        self.partitions_scanned = _gauge(metrics.COLLECTOR_PARTITIONS_SCANNED, reg)
        self.partitions_described = _counter(metrics.COLLECTOR_PARTITIONS_DESCRIBED, reg)
        self.partitions_uncovered = _gauge(metrics.COLLECTOR_PARTITIONS_UNCOVERED, reg)
        self.partition_uncovered = _gauge(metrics.COLLECTOR_PARTITION_UNCOVERED, reg)
        self.blocked_groups = _gauge(metrics.COLLECTOR_BLOCKED_GROUPS, reg)
        self.blocked_groups_left_out = _gauge(metrics.COLLECTOR_BLOCKED_GROUPS_LEFT_OUT, reg)
        self.open_transactions = _gauge(metrics.COLLECTOR_OPEN_TRANSACTIONS, reg)
        self.partitions_with_open_transactions = _gauge(
            metrics.COLLECTOR_PARTITIONS_WITH_OPEN_TRANSACTIONS, reg
        )
        self.new_open_transactions = _counter(metrics.COLLECTOR_OPEN_TRANSACTIONS_SEEN, reg)
        self.probes = _counter(metrics.COLLECTOR_PROBES, reg)
        self.redescribes = _counter(metrics.COLLECTOR_REDESCRIBES, reg)
        self.start_batch_cache = _gauge(metrics.COLLECTOR_START_BATCH_CACHE_ENTRIES, reg)
        self.requests = _counter(metrics.COLLECTOR_REQUESTS, reg)
        self.errors = _counter(metrics.COLLECTOR_ERRORS, reg)
        self.records_published = _counter(metrics.COLLECTOR_RECORDS_PUBLISHED, reg)
        self.last_success = _gauge(metrics.COLLECTOR_LAST_SUCCESS_TIMESTAMP_SECONDS, reg)

    def request_sent(self, api: str, error: str | None) -> None:
        """A request the wire sent (admin.wire.requests.RequestObserver)."""
        self.requests.labels(api=api, outcome="ok" if error is None else "error").inc()
        if error is not None:
            self.errors.labels(api=api, error=error).inc()

    def partition_errors(self, api: str, error: str, count: int) -> None:
        """Errors a broker returned for some partitions of an answered request (RequestObserver)."""
        self.errors.labels(api=api, error=error).inc(count)

    def observe_sweep(
        self, result: SweepResult, *, cached_start_batches: int, uncovered: Mapping[TP, str] | None = None
    ) -> None:
        """One sweep's figures; `uncovered` names each partition it could not describe and why."""
        self.sweep_duration.observe(result.duration_s)
        self.partitions_scanned.clear()  # no stale series for brokers that left
        for summary in result.summaries:
            if summary.broker >= 0:
                self.partitions_scanned.labels(broker=str(summary.broker)).set(summary.partitions_covered)
        self.partitions_described.inc(result.partitions_covered)
        reasons: dict[str, int] = {}
        for summary in result.summaries:
            for reason, count in summary.errors.items():
                reasons[reason] = reasons.get(reason, 0) + count
        self.partitions_uncovered.clear()
        for reason, count in reasons.items():
            self.partitions_uncovered.labels(reason=reason).set(count)
        self.partition_uncovered.clear()  # a partition described again has no series
        for (topic, partition), reason in uncovered_series(uncovered or {}, MAX_UNCOVERED_SERIES):
            self.partition_uncovered.labels(topic=topic, partition=str(partition), reason=reason).set(1)
        self.open_transactions.set(result.open_transactions)
        self.partitions_with_open_transactions.set(len(result.snapshots))
        self.new_open_transactions.inc(result.new_transactions)
        self.start_batch_cache.set(cached_start_batches)

    def observe_blocked_groups(self, report: BlockedReport) -> None:
        """The last sweep's blocked consumer groups (admin/collect/blocked.py); the series of groups no longer held up go."""
        self.blocked_groups.clear()
        for b in report.blocked:
            self.blocked_groups.labels(
                topic=b.topic, partition=str(b.partition), group=b.group, reason=b.reason
            ).set(1)
        self.blocked_groups_left_out.clear()
        for reason, count in report.left_out.items():
            self.blocked_groups_left_out.labels(reason=reason).set(count)


def uncovered_series(uncovered: Mapping[TP, str], limit: int) -> list[tuple[TP, str]]:
    """The partitions to export, at most `limit`: by reason, then topic and partition, so the same ones stay
    listed from sweep to sweep while the cause lasts."""
    return sorted(uncovered.items(), key=lambda item: (item[1], item[0]))[:limit]


def installed_versions() -> dict[str, str]:
    """The labels of txnwatch_build_info, from the installed distributions (detectors.health.build_info)."""
    return build_info(metadata.version, platform.python_version())


class LoopHealth:
    """When the sweep loop last turned and last published a sweep (monotonic), answering /healthz and /readyz.

    `run()` (admin/collect/collector.py) reports; the endpoint's threads read. Each field is one float written by one
    thread, so no lock is needed.
    """

    def __init__(
        self, *, ready_within_ms: int, stall_after_ms: int, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self.ready_within_ms = ready_within_ms
        self.stall_after_ms = stall_after_ms
        self._monotonic = monotonic
        self._last_turn_ms = self._now_ms()
        self._last_published_ms: int | None = None

    def _now_ms(self) -> int:
        return round(self._monotonic() * 1000)

    def turned(self) -> None:
        """The loop turned: a sweep (or a poll) began or ended, or a pause between them did."""
        self._last_turn_ms = self._now_ms()

    def published(self) -> None:
        """A sweep was built and published."""
        self._last_published_ms = self._last_turn_ms = self._now_ms()

    def live(self) -> ProbeAnswer:
        return loop_turning(
            last_turn_ms=self._last_turn_ms, now_ms=self._now_ms(), stall_after_ms=self.stall_after_ms
        )

    def ready(self) -> ProbeAnswer:
        return progress_recent(
            [Progress("sweep published", self._last_published_ms, self.ready_within_ms)],
            now_ms=self._now_ms(),
        )


def serve(
    metrics: CollectorMetrics, port: int, addr: str = "0.0.0.0", *, health: LoopHealth | None = None
) -> Any:
    """Start the /metrics endpoint on a daemon thread, with /healthz and /readyz when given `health`; returns the
    server (has `shutdown()`)."""
    # No `_created` series: they are not in the metric contract (docs/collector.md), double every counter's
    # output, and the streaming job's endpoint leaves them out too (streaming/exporter.py).
    disable_created_metrics()  # type: ignore[no-untyped-call]  # prometheus_client leaves it unannotated
    # prometheus_client's own server keeps its choice of address family and its quiet request handler; the
    # probes are put in front of its app (wsgiref's set_app) before any probe could be due.
    server, _thread = start_http_server(port, addr=addr, registry=metrics.registry)
    if health is not None:
        server.set_app(with_probes(server.get_app(), health))
    return server
