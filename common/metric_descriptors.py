"""Every Prometheus metric txnwatch exports, declared once: name, type, help and label names. Plain data, no
prometheus_client: both exporters, deploy/grafana/dashboard.py and the tests that hold the alert rules and the
docs' metric tables to it read it, so a renamed metric cannot leave a dead panel, alert or doc row
(docs/alerting.md, "Tests").
"""

from __future__ import annotations

from typing import Literal, NamedTuple

from detectors.health import BUILD_INFO_LABELS

MetricType = Literal["gauge", "counter", "histogram"]


class Metric(NamedTuple):
    """One metric family. `name` is what the exporter declares: a counter's samples add `_total`, a
    histogram's `_bucket`, `_sum` and `_count` (`series`)."""

    name: str
    type: MetricType
    help: str
    labels: tuple[str, ...] = ()

    @property
    def series(self) -> tuple[str, ...]:
        """The sample names Prometheus stores: what a query or an alert expression names."""
        if self.type == "counter":
            return (f"{self.name}_total",)
        if self.type == "histogram":
            return (f"{self.name}_bucket", f"{self.name}_sum", f"{self.name}_count")
        return (self.name,)

    @property
    def total(self) -> str:
        """A counter's sample name (`<name>_total`).

        Raises:
            ValueError: for a metric that is not a counter.
        """
        if self.type != "counter":
            raise ValueError(f"{self.name} is a {self.type}, not a counter")
        return f"{self.name}_total"

    @property
    def bucket(self) -> str:
        """A histogram's bucket series (`<name>_bucket`), for histogram_quantile.

        Raises:
            ValueError: for a metric that is not a histogram.
        """
        if self.type != "histogram":
            raise ValueError(f"{self.name} is a {self.type}, not a histogram")
        return f"{self.name}_bucket"


# The streaming job's driver (streaming/exporter.py).
MAX_ACTIVE_TRANSACTION_DURATION_SECONDS = Metric(
    "txnwatch_max_active_transaction_duration_seconds",
    "gauge",
    "KIP-664 MaxActiveTransactionDuration: age of the oldest open transaction, per partition with open "
    "transactions (newest snapshot).",
    ("cluster", "topic", "partition"),
)
PARTITIONS_WITH_LATE_TRANSACTIONS = Metric(
    "txnwatch_partitions_with_late_transactions",
    "gauge",
    "KIP-664 PartitionsWithLateTransactionsCount: leader partitions whose oldest open transaction is older "
    "than transaction.max.timeout.ms (+ buffer), per broker.",
    ("cluster", "broker"),
)
CLUSTER_PARTITIONS_WITH_LATE_TRANSACTIONS = Metric(
    "txnwatch_cluster_partitions_with_late_transactions",
    "gauge",
    "PartitionsWithLateTransactionsCount summed over the cluster.",
    ("cluster",),
)
LATE_PARTITIONS = Metric(
    "txnwatch_late_partitions",
    "gauge",
    'PartitionsWithLateTransactionsCount per broker split by two_phase_commit: "true" where the late '
    '(oldest open) transaction is a KIP-939 two-phase-commit one, else "false" (also when unknown). The two '
    "sum to txnwatch_partitions_with_late_transactions.",
    ("cluster", "broker", "two_phase_commit"),
)
HANGING_TRANSACTIONS = Metric(
    "txnwatch_hanging_transactions",
    "gauge",
    "Open transactions proven HANGING, by reason.",
    ("cluster", "reason"),
)
ABORT_CANDIDATES = Metric(
    "txnwatch_abort_candidates",
    "gauge",
    "Open abort candidates (HANGING, not yet gone).",
    ("cluster",),
)
HANGING_TRANSACTION_OPEN_SINCE_TIMESTAMP_SECONDS = Metric(
    "txnwatch_hanging_transaction_open_since_timestamp_seconds",
    "gauge",
    "Each HANGING transaction with an open abort candidate: when it opened (Unix time, within one "
    "snapshot's delay), by partition, transactional id (empty when no coordinator record names one), producer "
    "id, reason and candidate id (txnwatch proposals show <candidate_id>), as proven.",
    ("cluster", "topic", "partition", "transactional_id", "producer_id", "reason", "candidate_id"),
)
STUCK_PREPARE_TRANSACTIONS = Metric(
    "txnwatch_stuck_prepare_transactions",
    "gauge",
    "Transactions whose coordinator is in PrepareCommit/PrepareAbort with markers overdue (alert only).",
    ("cluster",),
)
STUCK_PREPARE_TRANSACTION_OPEN_SINCE_TIMESTAMP_SECONDS = Metric(
    "txnwatch_stuck_prepare_transaction_open_since_timestamp_seconds",
    "gauge",
    "Each partition with a STUCK_PREPARE transaction (its coordinator decided, its marker is overdue), by "
    "transactional id: when the oldest such transaction opened (Unix time, within one snapshot's delay). Only "
    "while it is stuck.",
    ("cluster", "topic", "partition", "transactional_id"),
)
COORDINATOR_OVERDUE_TRANSACTION_OPEN_SINCE_TIMESTAMP_SECONDS = Metric(
    "txnwatch_coordinator_overdue_transaction_open_since_timestamp_seconds",
    "gauge",
    "Each partition with a COORDINATOR_OVERDUE transaction (Ongoing past its timeout and the coordinator's abort "
    "interval), by transactional id: when the oldest such transaction opened (Unix time, within one snapshot's "
    "delay). Only while it is overdue.",
    ("cluster", "topic", "partition", "transactional_id"),
)
WITHHELD_VERDICT_OPEN_SINCE_TIMESTAMP_SECONDS = Metric(
    "txnwatch_withheld_verdict_open_since_timestamp_seconds",
    "gauge",
    "Each partition with a transaction withheld as UNCONFIRMED, by transactional id (empty when no coordinator "
    "record names one), why (reason) and the HANGING reason it would have (would_be): when the oldest such "
    "transaction opened (Unix time, within one snapshot's delay). Only while it is withheld.",
    ("cluster", "topic", "partition", "transactional_id", "reason", "would_be"),
)
OPEN_TRANSACTIONS = Metric(
    "txnwatch_open_transactions",
    "gauge",
    "Open transactions by verdict kind, and whether the coordinator owns them as KIP-939 two-phase-commit "
    "transactions (no timeout).",
    ("cluster", "kind", "two_phase_commit"),
)
LAST_STABLE_OFFSET_LAG = Metric(
    "txnwatch_last_stable_offset_lag",
    "gauge",
    "High watermark minus last stable offset, per partition with open transactions.",
    ("cluster", "topic", "partition"),
)
WITHHELD_VERDICTS = Metric(
    "txnwatch_withheld_verdicts",
    "gauge",
    "Open transactions a HANGING rule holds for, withheld as UNCONFIRMED: by why (reason) and by the "
    "HANGING reason they would have (would_be). Judged again when the coordinator view is current.",
    ("cluster", "reason", "would_be"),
)
COORDINATOR_VIEW_LAG_SECONDS = Metric(
    "txnwatch_coordinator_view_lag_seconds",
    "gauge",
    "How far the job's coordinator view is behind the newest position of the coordinator log the collector "
    "measured (0 when current). HANGING verdicts are withheld while it is behind.",
    ("cluster",),
)
COORDINATOR_VIEW_RECORDS_BEHIND = Metric(
    "txnwatch_coordinator_view_records_behind",
    "gauge",
    "Coordinator log records below the collector's newest positions that the job has not applied yet.",
    ("cluster",),
)
COORDINATOR_VIEW_CURRENT_TIMESTAMP_SECONDS = Metric(
    "txnwatch_coordinator_view_current_timestamp_seconds",
    "gauge",
    "The coordinator view is current as of this time (every partition); absent until first current.",
    ("cluster",),
)
COORDINATOR_RECORDS_UNDECODABLE = Metric(
    "txnwatch_coordinator_records_undecodable",
    "counter",
    "Coordinator records read that did not decode (on the dead-letter topic): their content is lost, so "
    "verdicts that depend on their transactional id (or partition) are withheld until superseded.",
    ("cluster",),
)
COORDINATOR_RECORDS_UNDECODABLE_PENDING = Metric(
    "txnwatch_coordinator_records_undecodable_pending",
    "gauge",
    "Transactional ids (and partitions, when the key did not decode either) whose newest coordinator record "
    "did not decode: verdicts that depend on them are UNCONFIRMED (coordinator-record-undecodable).",
    ("cluster",),
)
STREAM_BATCH_DURATION_SECONDS = Metric(
    "txnwatch_stream_batch_duration_seconds",
    "histogram",
    "Micro-batch duration.",
    ("query",),
)
STREAM_INPUT_ROWS = Metric(
    "txnwatch_stream_input_rows",
    "counter",
    "Rows read, by query and source.",
    ("query", "source"),
)
DEAD_LETTER_RECORDS = Metric(
    "txnwatch_dead_letter_records",
    "counter",
    "Malformed input records sent to the dead-letter topic.",
    ("source",),
)
STREAM_SOURCE_OFFSETS_BEHIND_LATEST = Metric(
    "txnwatch_stream_source_offsets_behind_latest",
    "gauge",
    "Kafka source lag in offsets after the last batch (max over partitions), by query and source; for the "
    "transaction log this is the coordinator-record lag.",
    ("query", "source"),
)
STREAM_LAST_BATCH_TIMESTAMP_SECONDS = Metric(
    "txnwatch_stream_last_batch_timestamp_seconds",
    "gauge",
    "When each query last finished a batch.",
    ("query",),
)
STREAM_STATE_STALE = Metric(
    "txnwatch_stream_state_stale",
    "gauge",
    "1 while the verdicts and windows served are the last the job knew, not being refreshed: its queries are "
    "stopped (Kafka does not answer) or have not finished a batch within their readiness window (as /readyz); "
    "0 while current.",
    ("cluster",),
)

# Both components: what runs.
BUILD_INFO = Metric(
    "txnwatch_build_info",
    "gauge",
    "What runs: txnwatch's version and those of Python, PySpark and kafka-python (always 1).",
    BUILD_INFO_LABELS,
)

# The collector (admin/collect/metrics.py): txnwatch_collector_*.
COLLECTOR_SWEEP_DURATION_SECONDS = Metric(
    "txnwatch_collector_sweep_duration_seconds",
    "histogram",
    "Duration of one sweep of the cluster.",
    (),
)
COLLECTOR_COORDINATOR_EXPIRIES_WITHHELD = Metric(
    "txnwatch_collector_coordinator_expiries_withheld",
    "counter",
    "Transactional ids gone from ListTransactions but not tombstoned (--coordinator-source describe), "
    "because the current coordinator of their __transaction_state partition could not show they expired: a "
    "coordinator move, a partition loading or without a leader. Counted once per poll that met them.",
    (),
)
COLLECTOR_COORDINATOR_POSITIONS_WITHHELD = Metric(
    "txnwatch_collector_coordinator_positions_withheld",
    "counter",
    "Describe-fallback polls (--coordinator-source describe) that published no position of the coordinator-state "
    "topic because they may have missed a changed state, by reason: metadata-failed, "
    "transaction-log-not-visible, partition-without-leader, leader-moved, leader-not-serving, "
    "transactional-ids-hidden, listing-failed, duration-listing-failed, describe-failed. The job proves no "
    "HANGING on such a poll.",
    ("reason",),
)
COLLECTOR_SWEEP_FAILURES = Metric(
    "txnwatch_collector_sweep_failures",
    "counter",
    "Sweeps that failed as a whole (no metadata, publish error).",
    (),
)
COLLECTOR_PARTITIONS_SCANNED = Metric(
    "txnwatch_collector_partitions_scanned",
    "gauge",
    "Partitions described in the last sweep, by the leader that answered.",
    ("broker",),
)
COLLECTOR_PARTITIONS_DESCRIBED = Metric(
    "txnwatch_collector_partitions_described",
    "counter",
    "Partitions described by DescribeProducers, over all sweeps.",
    (),
)
COLLECTOR_PARTITIONS_UNCOVERED = Metric(
    "txnwatch_collector_partitions_uncovered",
    "gauge",
    "Partitions the last sweep could not describe, by reason (an error name, LEADER_NOT_AVAILABLE, "
    "BROKER_BACKOFF).",
    ("reason",),
)
COLLECTOR_PARTITION_UNCOVERED = Metric(
    "txnwatch_collector_partition_uncovered",
    "gauge",
    "Each partition the last sweep could not describe, by reason (always 1); at most 100, by reason then "
    "partition: txnwatch_collector_partitions_uncovered counts them all.",
    ("topic", "partition", "reason"),
)
COLLECTOR_BLOCKED_GROUPS = Metric(
    "txnwatch_collector_blocked_groups",
    "gauge",
    "Each consumer group a long-open transaction holds up (always 1), on the partitions whose oldest open "
    "transaction has been open --blocked-groups-after-ms: reason committed-at-lso (its committed offset is at or "
    "past the partition's last stable offset, where read_committed members wait) or pending-offset-commit (on "
    "__consumer_offsets, the group whose offset commit the transaction holds). Only while it is so; at most 100.",
    ("topic", "partition", "group", "reason"),
)
COLLECTOR_BLOCKED_GROUPS_LEFT_OUT = Metric(
    "txnwatch_collector_blocked_groups_left_out",
    "gauge",
    "What the last sweep's blocked-groups lookup left out, by reason: partition-cap (partitions open that long "
    "beyond the 20 oldest, not asked), series-cap (groups found beyond the 100 exported), no-group-listed "
    "(partitions not asked because ListGroups named no group: none exists, or Describe on groups is missing), or "
    "a Kafka error name (groups or group partitions whose committed offsets did not answer with it; a failed "
    "ListGroups counts 1).",
    ("reason",),
)
COLLECTOR_OPEN_TRANSACTIONS = Metric(
    "txnwatch_collector_open_transactions",
    "gauge",
    "Open transactions partition leaders reported in the last sweep.",
    (),
)
COLLECTOR_PARTITIONS_WITH_OPEN_TRANSACTIONS = Metric(
    "txnwatch_collector_partitions_with_open_transactions",
    "gauge",
    "Partitions with at least one open transaction in the last sweep.",
    (),
)
COLLECTOR_OPEN_TRANSACTIONS_SEEN = Metric(
    "txnwatch_collector_open_transactions_seen",
    "counter",
    "Open transactions seen for the first time.",
    (),
)
COLLECTOR_PROBES = Metric(
    "txnwatch_collector_probes",
    "counter",
    "Probes between sweeps: ListOffsets of every partition, to see new open transactions sooner.",
    (),
)
COLLECTOR_REDESCRIBES = Metric(
    "txnwatch_collector_redescribes",
    "counter",
    "Partitions described again between sweeps, once a report of them could prove a young open transaction.",
    (),
)
COLLECTOR_START_BATCH_CACHE_ENTRIES = Metric(
    "txnwatch_collector_start_batch_cache_entries",
    "gauge",
    "Open transactions whose start batch is cached.",
    (),
)
COLLECTOR_REQUESTS = Metric(
    "txnwatch_collector_requests",
    "counter",
    "Requests sent to brokers, by API and outcome.",
    ("api", "outcome"),
)
COLLECTOR_ERRORS = Metric(
    "txnwatch_collector_errors",
    "counter",
    "Errors by API and Kafka error name (request failures and per-partition errors).",
    ("api", "error"),
)
COLLECTOR_RECORDS_PUBLISHED = Metric(
    "txnwatch_collector_records_published",
    "counter",
    "Records produced, by type.",
    ("type",),
)
COLLECTOR_LAST_SUCCESS_TIMESTAMP_SECONDS = Metric(
    "txnwatch_collector_last_success_timestamp_seconds",
    "gauge",
    "Unix time at which the last sweep finished and was published.",
    (),
)


# Every metric of each component (build_info in both), and every sample name a query may use.
STREAM: tuple[Metric, ...] = (
    MAX_ACTIVE_TRANSACTION_DURATION_SECONDS,
    PARTITIONS_WITH_LATE_TRANSACTIONS,
    CLUSTER_PARTITIONS_WITH_LATE_TRANSACTIONS,
    LATE_PARTITIONS,
    HANGING_TRANSACTIONS,
    ABORT_CANDIDATES,
    HANGING_TRANSACTION_OPEN_SINCE_TIMESTAMP_SECONDS,
    STUCK_PREPARE_TRANSACTIONS,
    STUCK_PREPARE_TRANSACTION_OPEN_SINCE_TIMESTAMP_SECONDS,
    COORDINATOR_OVERDUE_TRANSACTION_OPEN_SINCE_TIMESTAMP_SECONDS,
    WITHHELD_VERDICT_OPEN_SINCE_TIMESTAMP_SECONDS,
    OPEN_TRANSACTIONS,
    LAST_STABLE_OFFSET_LAG,
    WITHHELD_VERDICTS,
    COORDINATOR_VIEW_LAG_SECONDS,
    COORDINATOR_VIEW_RECORDS_BEHIND,
    COORDINATOR_VIEW_CURRENT_TIMESTAMP_SECONDS,
    COORDINATOR_RECORDS_UNDECODABLE,
    COORDINATOR_RECORDS_UNDECODABLE_PENDING,
    STREAM_BATCH_DURATION_SECONDS,
    STREAM_INPUT_ROWS,
    DEAD_LETTER_RECORDS,
    STREAM_SOURCE_OFFSETS_BEHIND_LATEST,
    STREAM_LAST_BATCH_TIMESTAMP_SECONDS,
    STREAM_STATE_STALE,
    BUILD_INFO,
)
COLLECTOR: tuple[Metric, ...] = (
    BUILD_INFO,
    COLLECTOR_SWEEP_DURATION_SECONDS,
    COLLECTOR_COORDINATOR_EXPIRIES_WITHHELD,
    COLLECTOR_COORDINATOR_POSITIONS_WITHHELD,
    COLLECTOR_SWEEP_FAILURES,
    COLLECTOR_PARTITIONS_SCANNED,
    COLLECTOR_PARTITIONS_DESCRIBED,
    COLLECTOR_PARTITIONS_UNCOVERED,
    COLLECTOR_PARTITION_UNCOVERED,
    COLLECTOR_BLOCKED_GROUPS,
    COLLECTOR_BLOCKED_GROUPS_LEFT_OUT,
    COLLECTOR_OPEN_TRANSACTIONS,
    COLLECTOR_PARTITIONS_WITH_OPEN_TRANSACTIONS,
    COLLECTOR_OPEN_TRANSACTIONS_SEEN,
    COLLECTOR_PROBES,
    COLLECTOR_REDESCRIBES,
    COLLECTOR_START_BATCH_CACHE_ENTRIES,
    COLLECTOR_REQUESTS,
    COLLECTOR_ERRORS,
    COLLECTOR_RECORDS_PUBLISHED,
    COLLECTOR_LAST_SUCCESS_TIMESTAMP_SECONDS,
)
ALL: dict[str, Metric] = {m.name: m for m in (*STREAM, *COLLECTOR)}
SERIES: dict[str, Metric] = {series: m for m in ALL.values() for series in m.series}
