"""The collector's own Prometheus metrics (explicit registry): sweep health, requests and errors by API.

Named `txnwatch_collector_*` in base units; `_total` only on counters. No producer or transactional ids in
labels; the broker label is bounded by the cluster size.
"""

from __future__ import annotations

import threading
from collections import Counter as Tally

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    start_http_server,
)

from admin.seams import SweepResult

NAMESPACE = "txnwatch"
SUBSYSTEM = "collector"
SWEEP_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0)


class RequestLog:
    """Counts every request the wire sends, by (api, broker, outcome); feeds Prometheus when given metrics.

    `outcome` is "ok" or the error name. Thread-safe: the wire reports from kafka-python's IO thread.
    """

    def __init__(self, metrics: CollectorMetrics | None = None) -> None:
        self._metrics = metrics
        self._lock = threading.Lock()
        self.counts: Tally[tuple[str, int, str]] = Tally()

    def record(self, api: str, broker: int, error: str | None = None) -> None:
        outcome = error or "ok"
        with self._lock:
            self.counts[(api, broker, outcome)] += 1
        if self._metrics is not None:
            self._metrics.requests.labels(api=api, outcome="ok" if error is None else "error").inc()
            if error is not None:
                self._metrics.errors.labels(api=api, error=error).inc()

    def record_partition_error(self, api: str, error: str, count: int = 1) -> None:
        """An error a broker returned for some partitions of an otherwise answered request."""
        if self._metrics is not None and count:
            self._metrics.errors.labels(api=api, error=error).inc(count)

    def snapshot(self) -> Tally[tuple[str, int, str]]:
        with self._lock:
            return Tally(self.counts)

    def by_broker(self, api: str) -> dict[int, int]:
        """Requests of one API sent to each broker, whatever their outcome."""
        out: dict[int, int] = {}
        with self._lock:
            for (a, broker, _), n in self.counts.items():
                if a == api:
                    out[broker] = out.get(broker, 0) + n
        return out


class CollectorMetrics:
    """Every collector metric, registered in `registry` (a fresh one by default)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        reg = self.registry
        ns, sub = NAMESPACE, SUBSYSTEM
        self.sweep_duration = Histogram(
            "sweep_duration_seconds",
            "Duration of one sweep of the cluster.",
            buckets=SWEEP_BUCKETS,
            namespace=ns,
            subsystem=sub,
            registry=reg,
        )
        self.sweep_failures = Counter(
            "sweep_failures",
            "Sweeps that failed as a whole (no metadata, publish error).",
            namespace=ns,
            subsystem=sub,
            registry=reg,
        )
        self.partitions_scanned = Gauge(
            "partitions_scanned",
            "Partitions described in the last sweep, by the leader that answered.",
            ["broker"],
            namespace=ns,
            subsystem=sub,
            registry=reg,
        )
        self.partitions_described = Counter(
            "partitions_described",
            "Partitions described by DescribeProducers, over all sweeps.",
            namespace=ns,
            subsystem=sub,
            registry=reg,
        )
        self.partitions_uncovered = Gauge(
            "partitions_uncovered",
            "Partitions the last sweep could not describe, by reason (an error name, LEADER_NOT_AVAILABLE, "
            "BROKER_BACKOFF).",
            ["reason"],
            namespace=ns,
            subsystem=sub,
            registry=reg,
        )
        self.open_transactions = Gauge(
            "open_transactions",
            "Open transactions partition leaders reported in the last sweep.",
            namespace=ns,
            subsystem=sub,
            registry=reg,
        )
        self.partitions_with_open_transactions = Gauge(
            "partitions_with_open_transactions",
            "Partitions with at least one open transaction in the last sweep.",
            namespace=ns,
            subsystem=sub,
            registry=reg,
        )
        self.new_open_transactions = Counter(
            "open_transactions_seen",
            "Open transactions seen for the first time.",
            namespace=ns,
            subsystem=sub,
            registry=reg,
        )
        self.start_batch_cache = Gauge(
            "start_batch_cache_entries",
            "Open transactions whose start batch is cached.",
            namespace=ns,
            subsystem=sub,
            registry=reg,
        )
        self.requests = Counter(
            "requests",
            "Requests sent to brokers, by API and outcome.",
            ["api", "outcome"],
            namespace=ns,
            subsystem=sub,
            registry=reg,
        )
        self.errors = Counter(
            "errors",
            "Errors by API and Kafka error name (request failures and per-partition errors).",
            ["api", "error"],
            namespace=ns,
            subsystem=sub,
            registry=reg,
        )
        self.records_published = Counter(
            "records_published",
            "Records produced, by type.",
            ["type"],
            namespace=ns,
            subsystem=sub,
            registry=reg,
        )
        self.last_success = Gauge(
            "last_success_timestamp_seconds",
            "Unix time at which the last sweep finished and was published.",
            namespace=ns,
            subsystem=sub,
            registry=reg,
        )

    def observe_sweep(self, result: SweepResult, *, cached_start_batches: int) -> None:
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
        self.open_transactions.set(result.open_transactions)
        self.partitions_with_open_transactions.set(len(result.snapshots))
        self.new_open_transactions.inc(result.new_transactions)
        self.start_batch_cache.set(cached_start_batches)


def serve(metrics: CollectorMetrics, port: int, addr: str = "0.0.0.0") -> object:
    """Start the /metrics endpoint on a daemon thread; returns the server (has `shutdown()`)."""
    # No `_created` series: they are not in the metric contract (docs/collector.md), double every counter's
    # output, and the streaming job's endpoint leaves them out too (streaming/exporter.py).
    disable_created_metrics()  # type: ignore[no-untyped-call]  # prometheus_client leaves it unannotated
    server, _thread = start_http_server(port, addr=addr, registry=metrics.registry)
    return server
