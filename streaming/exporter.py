"""The driver's Prometheus endpoint: the latest verdicts and windows, as gauges built at scrape time.

A custom collector yields only what is current (partitions with open transactions, verdicts not yet gone), so
no series goes stale and nothing needs deleting. Query health comes from a StreamingQueryListener.
Producer ids and transactional ids never become labels.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, Histogram, disable_created_metrics, start_http_server
from prometheus_client import Counter as PromCounter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from pyspark.sql.streaming.listener import StreamingQueryListener

log = logging.getLogger("txnwatch.stream.metrics")


@dataclass
class VerdictState:
    topic: str
    partition: int
    kind: str
    reason: str | None
    lso_lag: int | None
    age_ms: int
    candidate: bool
    withheld: str | None = None
    candidate_id: str | None = None
    # approximate (the time the verdict was made minus the age the snapshot showed): within one snapshot's delay
    open_since_ms: int | None = None


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
        with self._lock:
            for r in rows:
                if r.event == "VIEW":
                    self.view = json.loads(r.payload)
                    continue
                key = (r.topic, int(r.partition), int(r.producer_id))
                if r.event == "VERDICT":
                    self.verdicts[key] = VerdictState(
                        r.topic,
                        int(r.partition),
                        r.kind,
                        r.reason,
                        r.lso_lag,
                        int(r.age_ms),
                        r.candidate_id is not None,
                        r.withheld,
                        r.candidate_id,
                        int(r.event_time_ms) - int(r.age_ms),
                    )
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


class VerdictCollector(Collector):
    """Builds the metric contract of ARCHITECTURE.md from LiveState on every scrape."""

    def __init__(self, state: LiveState, cluster: str) -> None:
        self.state = state
        self.cluster = cluster

    def collect(self) -> Iterator[GaugeMetricFamily]:
        verdicts, windows = self.state.snapshot()
        c = self.cluster
        duration = GaugeMetricFamily(
            "txnwatch_max_active_transaction_duration_seconds",
            "KIP-664 MaxActiveTransactionDuration: age of the oldest open transaction, per partition with open "
            "transactions (newest snapshot).",
            labels=["cluster", "topic", "partition"],
        )
        late_by_broker: Counter[int] = Counter()
        for (topic, partition), w in sorted(windows.items()):
            if w.open_count > 0:
                duration.add_metric([c, topic, str(partition)], w.duration_ms / 1000)
                late_by_broker[w.leader] += int(w.late)
        yield duration
        late = GaugeMetricFamily(
            "txnwatch_partitions_with_late_transactions",
            "KIP-664 PartitionsWithLateTransactionsCount: leader partitions whose oldest open transaction is "
            "older than transaction.max.timeout.ms (+ buffer), per broker.",
            labels=["cluster", "broker"],
        )
        for broker in sorted({w.leader for w in windows.values()}):
            late.add_metric([c, str(broker)], late_by_broker[broker])
        yield late
        cluster_late = GaugeMetricFamily(
            "txnwatch_cluster_partitions_with_late_transactions",
            "PartitionsWithLateTransactionsCount summed over the cluster.",
            labels=["cluster"],
        )
        cluster_late.add_metric([c], sum(late_by_broker.values()))
        yield cluster_late

        hanging = GaugeMetricFamily(
            "txnwatch_hanging_transactions",
            "Open transactions proven HANGING, by reason.",
            labels=["cluster", "reason"],
        )
        for reason, n in sorted(Counter(v.reason for v in verdicts if v.kind == "HANGING").items()):
            hanging.add_metric([c, str(reason)], n)
        yield hanging
        candidates = GaugeMetricFamily(
            "txnwatch_abort_candidates", "Open abort candidates (HANGING, not yet gone).", labels=["cluster"]
        )
        candidates.add_metric([c], sum(1 for v in verdicts if v.candidate))
        yield candidates
        # One series per hanging transaction, so an alert can name its partition and the command to act on it:
        # bounded by the hanging transactions (each an incident), gone with them (no stale series). The candidate
        # id is a hash, not a producer or transactional id.
        each = GaugeMetricFamily(
            "txnwatch_hanging_transaction_open_since_timestamp_seconds",
            "Each HANGING transaction with an open abort candidate: when it opened (Unix time, within one "
            "snapshot's delay), by partition, reason and candidate id (txnwatch proposals show <candidate_id>).",
            labels=["cluster", "topic", "partition", "reason", "candidate_id"],
        )
        for v in sorted(verdicts, key=lambda v: (v.topic, v.partition, v.candidate_id or "")):
            if v.kind == "HANGING" and v.candidate_id is not None and v.open_since_ms is not None:
                each.add_metric(
                    [c, v.topic, str(v.partition), str(v.reason), v.candidate_id], v.open_since_ms / 1000
                )
        yield each
        stuck = GaugeMetricFamily(
            "txnwatch_stuck_prepare_transactions",
            "Transactions whose coordinator is in PrepareCommit/PrepareAbort with markers overdue (alert only).",
            labels=["cluster"],
        )
        stuck.add_metric([c], sum(1 for v in verdicts if v.kind == "STUCK_PREPARE"))
        yield stuck
        kinds = GaugeMetricFamily(
            "txnwatch_open_transactions", "Open transactions by verdict kind.", labels=["cluster", "kind"]
        )
        for kind, n in sorted(Counter(v.kind for v in verdicts).items()):
            kinds.add_metric([c, kind], n)
        yield kinds
        lag = GaugeMetricFamily(
            "txnwatch_last_stable_offset_lag",
            "High watermark minus last stable offset, per partition with open transactions.",
            labels=["cluster", "topic", "partition"],
        )
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

    def _view_metrics(self, verdicts: list[VerdictState]) -> Iterator[GaugeMetricFamily]:
        c = self.cluster
        withheld = GaugeMetricFamily(
            "txnwatch_withheld_verdicts",
            "Open transactions a HANGING rule holds for, withheld as UNCONFIRMED: by why (reason) and by the "
            "HANGING reason they would have (would_be). Judged again when the coordinator view is current.",
            labels=["cluster", "reason", "would_be"],
        )
        counts = Counter((v.withheld, v.reason) for v in verdicts if v.kind == "UNCONFIRMED")
        for (why, would_be), n in sorted(counts.items(), key=str):
            withheld.add_metric([c, why or "", would_be or ""], n)
        yield withheld
        view = self.state.view_lag()
        lag = GaugeMetricFamily(
            "txnwatch_coordinator_view_lag_seconds",
            "How far the job's coordinator view is behind the newest position of the coordinator log the "
            "collector measured (0 when current). HANGING verdicts are withheld while it is behind.",
            labels=["cluster"],
        )
        behind = GaugeMetricFamily(
            "txnwatch_coordinator_view_records_behind",
            "Coordinator log records below the collector's newest positions that the job has not applied yet.",
            labels=["cluster"],
        )
        current = GaugeMetricFamily(
            "txnwatch_coordinator_view_current_timestamp_seconds",
            "The coordinator view is current as of this time (every partition); absent until first current.",
            labels=["cluster"],
        )
        if view is not None and view["measured"]:
            lag.add_metric([c], view["lag_ms"] / 1000)
            behind.add_metric([c], view["records_behind"])
            if view["current_as_of_ms"] is not None:
                current.add_metric([c], view["current_as_of_ms"] / 1000)
        yield lag
        yield behind
        yield current


class Health:
    """Query health metrics, fed by the listener and the sinks."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.batch_duration = Histogram(
            "txnwatch_stream_batch_duration_seconds",
            "Micro-batch duration.",
            ["query"],
            registry=registry,
            buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60),
        )
        self.input_rows = PromCounter(
            "txnwatch_stream_input_rows",
            "Rows read, by query and source.",
            ["query", "source"],
            registry=registry,
        )
        self.dead_letters = PromCounter(
            "txnwatch_dead_letter_records",
            "Malformed input records sent to the dead-letter topic.",
            ["source"],
            registry=registry,
        )
        self.offsets_behind = Gauge(
            "txnwatch_stream_source_offsets_behind_latest",
            "Kafka source lag in offsets after the last batch (max over partitions), by query and source; for the "
            "transaction log this is the coordinator-record lag.",
            ["query", "source"],
            registry=registry,
        )
        self.last_batch = Gauge(
            "txnwatch_stream_last_batch_timestamp_seconds",
            "When each query last finished a batch.",
            ["query"],
            registry=registry,
        )


class HealthListener(StreamingQueryListener):
    """Turns query progress into Health metrics. Runs on the driver's listener thread: fast, never raises."""

    # A failure repeats with every progress event (every batch of every query): one warning per this many seconds,
    # the rest at debug.
    WARN_EVERY_S = 300.0

    def __init__(self, health: Health) -> None:
        self.health = health
        self._warned_at: float | None = None

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        try:
            p = event.progress
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
        pass

    def onQueryTerminated(self, event: Any) -> None:
        pass


def _source_name(description: str) -> str:
    # KafkaV2[Subscribe[__transaction_state]] -> __transaction_state
    if "[" in description:
        return description.rsplit("[", 1)[-1].rstrip("]")
    return description


def serve(registry: CollectorRegistry, host: str, port: int) -> Any:
    """Start the /metrics endpoint (a daemon thread); returns the server (`server_port` is the bound port, port
    0 picks a free one; `shutdown()` stops it)."""
    # `_created` series double every counter's output and nobody alerts on them. (prometheus_client's switch
    # is process-wide and read at scrape time.)
    disable_created_metrics()  # type: ignore[no-untyped-call]  # prometheus_client leaves it unannotated
    server, _ = start_http_server(port, addr=host, registry=registry)
    return server
