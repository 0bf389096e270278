"""The txnwatch Grafana dashboard, authored with grafana-foundation-sdk; writes deploy/grafana/txnwatch.json.

    python deploy/grafana/dashboard.py            # (re)write txnwatch.json
    python deploy/grafana/dashboard.py --check    # exit 1 if txnwatch.json is not what this file builds

Every query names its metrics through common/metric_descriptors.py (declared once, as the exporters declare
them), so a renamed metric changes the queries and `--check` asks for the JSON to be written again.

deploy/grafana/render.py draws the written JSON from a live Prometheus (docs/alerting.md).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import common as gc
from grafana_foundation_sdk.builders import dashboard as gd
from grafana_foundation_sdk.builders import prometheus, stat, table, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import prometheus as pm

import common.metric_descriptors as metrics

HERE = Path(__file__).resolve().parent
JSON_PATH = HERE / "txnwatch.json"
UID = "txnwatch-overview"
DATASOURCE = common.DataSourceRef(type_val="prometheus", uid="${datasource}")
C = 'cluster=~"$cluster"'  # every query is filtered by the cluster variable (All = .*, which also matches no label)
# Where docs/runbook.md is published: panel links are RUNBOOK#<anchor>, as the alerts' runbook_url (the Helm chart
# replaces this prefix with alerting.runbookBaseUrl; docs/alerting.md says how without it).
RUNBOOK = "https://github.com/txnwatch/txnwatch/blob/main/docs/runbook.md"
# A stat whose series are missing means its component is not scraped (gone, not zero): say so, in red.
NO_DATA = "NO DATA: not scraped"


def _query(expr: str, legend: str = "", ref: str = "A", *, instant: bool = False) -> prometheus.Dataquery:
    q = prometheus.Dataquery().expr(expr).ref_id(ref).datasource(DATASOURCE)
    if legend:
        q = q.legend_format(legend)
    if instant:
        q = q.instant().format(pm.PromQueryFormat.TABLE)
    return q


def _pos(x: int, y: int, w: int, h: int) -> dm.GridPos:
    return dm.GridPos(h=h, w=w, x=x, y=y)


def _thresholds(*steps: tuple[float | None, str]) -> gd.ThresholdsConfig:
    return (
        gd.ThresholdsConfig()
        .mode(dm.ThresholdsMode.ABSOLUTE)
        .steps([dm.Threshold(value=v, color=c) for v, c in steps])
    )


def _runbook(anchor: str, what: str) -> gd.DashboardLink:
    return (
        gd.DashboardLink(f"Runbook: {what}")
        .type(dm.DashboardLinkType.LINK)
        .url(f"{RUNBOOK}#{anchor}")
        .target_blank(True)
    )


def _no_data_in_red() -> dm.ValueMapping:
    """Grafana draws a stat without any series through this mapping (the `null` special value): red text,
    never the green of a 0."""
    return dm.SpecialValueMap(
        options=dm.DashboardSpecialValueMapOptions(
            match=dm.SpecialValueMatch.NULL, result=dm.ValueMappingResult(text=NO_DATA, color="red", index=0)
        )
    )


def _stat(
    title: str,
    expr: str,
    unit: str,
    pos: dm.GridPos,
    desc: str,
    warn: float,
    color: str,
    runbook: tuple[str, str],
    mappings: Sequence[dm.ValueMapping] = (),
    drill: tuple[int, str] | None = None,
) -> stat.Panel:
    """A stat; `drill` (panel id, what it lists): clicking its value opens that table."""
    return (
        stat.Panel()
        .title(title)
        .description(desc)
        .datasource(DATASOURCE)
        .with_target(_query(expr))
        .unit(unit)
        .grid_pos(pos)
        .thresholds(_thresholds((None, "green"), (warn, color)))
        .no_value(NO_DATA)
        .mappings([_no_data_in_red(), *mappings])
        .links([_runbook(*runbook)])
        .color_mode(common.BigValueColorMode.BACKGROUND)
        .graph_mode(common.BigValueGraphMode.AREA)
        .reduce_options(gc.ReduceDataOptions().calcs(["lastNotNull"]))
        .data_links([_viewed(*drill)] if drill else [])
    )


def _series(
    title: str, targets: Sequence[prometheus.Dataquery], unit: str, pos: dm.GridPos, desc: str
) -> timeseries.Panel:
    panel = (
        timeseries.Panel()
        .title(title)
        .description(desc)
        .datasource(DATASOURCE)
        .unit(unit)
        .grid_pos(pos)
        .min(0)
        .line_width(2)
        .fill_opacity(10)
        .legend(
            gc.VizLegendOptions()
            .display_mode(common.LegendDisplayMode.TABLE)
            .placement(common.LegendPlacement.RIGHT)
            .show_legend(True)
            .calcs(["lastNotNull", "max"])
        )
    )
    for t in targets:
        panel = panel.with_target(t)
    return panel


def _viewed(panel_id: int, what: str) -> gd.DashboardLink:
    """A data link that opens panel `panel_id` of this dashboard alone, keeping the time range and variables."""
    return (
        gd.DashboardLink(f"Show {what}")
        .type(dm.DashboardLinkType.LINK)
        .url(f"/d/${{__dashboard.uid}}?${{__url_time_range}}&${{__all_variables}}&viewPanel={panel_id}")
    )


# The columns the per-transaction tables share after their labels: how long it has been open, since when, and how
# many records read_committed consumers of the partition cannot read yet (the partition's LSO lag).
OPEN_FOR, OPEN_SINCE, LSO_LAG = "open for", "open since", "LSO lag (records)"
NO_TRANSACTIONAL_ID = "(none named)"


def _partition_table(
    title: str,
    desc: str,
    metric: metrics.Metric,
    columns: Sequence[tuple[str, str]],
    pos: dm.GridPos,
    runbook: tuple[str, str],
    no_value: str,
    last: Sequence[tuple[str, str]] = (),
    by_partition: Sequence[tuple[str, str]] = (),
) -> table.Panel:
    """One row per series of an `<x>_open_since_timestamp_seconds` metric (one per transaction or partition in
    that state): its labels as `columns` (label, header), then open for, open since and the LSO lag, then each of
    `by_partition` (header, a query by cluster, topic and partition), then `last`. Instant queries over the same
    label set, merged row by row on those labels."""
    labels = ["cluster", *(label for label, _ in columns), *(label for label, _ in last)]
    each = f"max by ({', '.join(labels)}) ({metric.name}{{{C}}})"
    if "transactional_id" in labels:
        # Empty when no coordinator record names one, and Prometheus drops an empty label: a frame whose rows all
        # lack it (the LSO lag's, on such a partition only) would not merge with the others on equal labels.
        each = f'label_replace({each}, "transactional_id", "{NO_TRANSACTIONAL_ID}", "transactional_id", "")'
    lso = f"max by (cluster, topic, partition) ({metrics.LAST_STABLE_OFFSET_LAG.name}{{{C}}})"
    # each per-partition figure on each row of its partition, like the LSO lag (blank where it has no series)
    extra = {f"Value #{chr(ord('D') + i)}": (header, q) for i, (header, q) in enumerate(by_partition)}
    order = [
        "cluster",
        *(label for label, _ in columns),
        "Value #B",
        "Value #A",
        "Value #C",
        *extra,
        *(x for x, _ in last),
    ]
    panel = (
        table.Panel()
        .title(title)
        .description(desc)
        .datasource(DATASOURCE)
        .with_target(_query(f"{each} * 1000", ref="A", instant=True))
        .with_target(_query(f"time() - {each}", ref="B", instant=True))
        # the partition's lag on each row: the same labels as A and B (merge joins rows on equal labels)
        .with_target(
            _query(f"0 * {each} + on (cluster, topic, partition) group_left {lso}", ref="C", instant=True)
        )
        .unit("s")
        .override_by_name(OPEN_SINCE, [dm.DynamicConfigValue(id_val="unit", value="dateTimeAsIso")])
        .override_by_name(LSO_LAG, [dm.DynamicConfigValue(id_val="unit", value="short")])
        .no_value(no_value)
        .links([_runbook(*runbook)])
        .sort_by([gc.TableSortByFieldState().display_name(OPEN_FOR).desc(True)])
        .grid_pos(pos)
        .with_transformation(dm.DataTransformerConfig(id_val="merge", options={}))
        .with_transformation(
            dm.DataTransformerConfig(
                id_val="organize",
                options={
                    "excludeByName": {"Time": True},
                    "indexByName": {name: i for i, name in enumerate(order)},
                    "renameByName": {
                        **dict(columns),
                        **dict(last),
                        "Value #A": OPEN_SINCE,
                        "Value #B": OPEN_FOR,
                        "Value #C": LSO_LAG,
                        **{ref: header for ref, (header, _) in extra.items()},
                    },
                },
            )
        )
    )
    for ref, (header, q) in extra.items():
        panel = panel.with_target(
            _query(f"0 * {each} + on (cluster, topic, partition) group_left {q}", ref=ref[-1], instant=True)
        ).override_by_name(header, [dm.DynamicConfigValue(id_val="unit", value="short")])
    return panel


TOPIC_PARTITION = (("topic", "topic"), ("partition", "partition"))
BLOCKED_GROUPS = "blocked groups"
# Panel ids, fixed: the stats' data links open the drill-down tables by id (viewPanel).
HANGING_TABLE_ID, STUCK_TABLE_ID, OVERDUE_TABLE_ID, WITHHELD_TABLE_ID, UNCOVERED_TABLE_ID = 9, 10, 11, 12, 13
BLOCKED_TABLE_ID = 14


def _label_table(
    title: str, desc: str, expr: str, columns: Sequence[tuple[str, str]], no_value: str
) -> table.Panel:
    """One row per series of one instant query of a metric whose series are always 1: its labels as `columns`
    (label, header), the value left out."""
    order = ["cluster", *(label for label, _ in columns)]
    return (
        table.Panel()
        .title(title)
        .description(desc)
        .datasource(DATASOURCE)
        .with_target(_query(expr, instant=True))
        .unit("none")
        .no_value(no_value)
        .with_transformation(
            dm.DataTransformerConfig(
                id_val="organize",
                options={
                    "excludeByName": {"Time": True, "Value": True},
                    "indexByName": {name: i for i, name in enumerate(order)},
                    "renameByName": dict(columns),
                },
            )
        )
    )


def build() -> dict[str, Any]:
    """The dashboard as Grafana JSON (a plain dict)."""
    hanging_table = _partition_table(
        "Hanging transactions now: which partition, whose, why, since when, what to run",
        "One row per HANGING transaction with an open abort candidate, longest open first: its partition, its "
        "transactional id (as the coordinator record it was proven against names it; (none named) without one) and "
        "producer id, the reason it was proven on, how long and since when it is open, the partition's LSO lag, how "
        "many consumer groups the collector found held up there (named in the blocked consumer groups table; blank: "
        "none found, or not looked up), and the id for `txnwatch proposals show <id>`, which reads them live "
        "(docs/runbook.md).",
        metrics.HANGING_TRANSACTION_OPEN_SINCE_TIMESTAMP_SECONDS,
        [
            *TOPIC_PARTITION,
            ("transactional_id", "transactional id"),
            ("producer_id", "producer id"),
            ("reason", "reason"),
        ],
        _pos(0, 4, 24, 8),
        ("hanging-transaction", "hanging transaction"),
        "no hanging transaction",
        last=[("candidate_id", "txnwatch proposals show")],
        by_partition=[
            (
                BLOCKED_GROUPS,
                f"count by (cluster, topic, partition) ({metrics.COLLECTOR_BLOCKED_GROUPS.name}{{{C}}})",
            )
        ],
    )
    stuck_table = _partition_table(
        "Stuck in prepare: which partition, which transactional id",
        "Partitions whose transaction's coordinator decided (PrepareCommit/PrepareAbort) and whose marker is "
        "overdue, by transactional id: never abort these, the brokers must finish them (docs/runbook.md).",
        metrics.STUCK_PREPARE_TRANSACTION_OPEN_SINCE_TIMESTAMP_SECONDS,
        [*TOPIC_PARTITION, ("transactional_id", "transactional id")],
        _pos(0, 12, 12, 6),
        ("stuck-prepare", "stuck prepare"),
        "nothing stuck in prepare",
    )
    overdue_table = _partition_table(
        "Coordinator overdue: which partition, which transactional id",
        "Partitions with a transaction still Ongoing at its coordinator past its timeout and the coordinator's "
        "abort interval, by transactional id: the coordinator should have aborted it (docs/runbook.md).",
        metrics.COORDINATOR_OVERDUE_TRANSACTION_OPEN_SINCE_TIMESTAMP_SECONDS,
        [*TOPIC_PARTITION, ("transactional_id", "transactional id")],
        _pos(12, 18, 12, 6),
        ("coordinator-overdue", "coordinator overdue"),
        "no coordinator overdue",
    )
    withheld_table = _partition_table(
        "Withheld (UNCONFIRMED): which partition, why, what it would be",
        "Partitions with a transaction a HANGING rule holds for, withheld as UNCONFIRMED: why (the view is not "
        "current, a record did not decode, ...) and the HANGING reason it would have. No proof yet: judged again "
        "once the evidence is current (docs/runbook.md).",
        metrics.WITHHELD_VERDICT_OPEN_SINCE_TIMESTAMP_SECONDS,
        [
            *TOPIC_PARTITION,
            ("transactional_id", "transactional id"),
            ("reason", "withheld: why"),
            ("would_be", "would be"),
        ],
        _pos(0, 18, 12, 6),
        ("view-behind", "view behind"),
        "no verdict withheld",
    )
    uncovered_table = (
        _label_table(
            "Uncovered partitions: which, and why the last sweep could not describe them",
            "Each partition the collector's last sweep could not describe (DescribeProducers) and why: blind spots, "
            "where no verdict is made. At most 100 are named; the count by reason "
            f"({metrics.COLLECTOR_PARTITIONS_UNCOVERED.name}) has them all (docs/runbook.md).",
            f"max by (cluster, topic, partition, reason) ({metrics.COLLECTOR_PARTITION_UNCOVERED.name}{{{C}}})",
            [*TOPIC_PARTITION, ("reason", "reason")],
            "every partition described",
        )
        .links([_runbook("collector-down", "collector down")])
        .sort_by([gc.TableSortByFieldState().display_name("reason")])
        .grid_pos(_pos(0, 24, 12, 8))
    )
    blocked_table = (
        _label_table(
            "Blocked consumer groups: whom a long-open transaction holds up",
            "Consumer groups the collector found held up on partitions whose oldest transaction has been open "
            "--blocked-groups-after-ms (default 1 minute), hanging or not yet: committed-at-lso (its committed "
            "offset is at or past the partition's LSO, where read_committed members wait) or pending-offset-commit "
            "(its offset commit is the transaction on __consumer_offsets). At most 100; what was left out, and the "
            f"errors, by reason: {metrics.COLLECTOR_BLOCKED_GROUPS_LEFT_OUT.name} (docs/runbook.md).",
            f"max by (cluster, topic, partition, group, reason) ({metrics.COLLECTOR_BLOCKED_GROUPS.name}{{{C}}})",
            [*TOPIC_PARTITION, ("group", "consumer group"), ("reason", "why")],
            "no consumer group held up",
        )
        .links([_runbook("hanging-transaction", "hanging transaction")])
        .sort_by([gc.TableSortByFieldState().display_name("topic")])
        .grid_pos(_pos(12, 12, 12, 6))
    )
    # Zero where nothing hangs, but only while the job is scraped: txnwatch_hanging_transactions and
    # txnwatch_withheld_verdicts have no series at 0, txnwatch_abort_candidates always has one.
    while_the_job_is_scraped = f"0 * sum({metrics.ABORT_CANDIDATES.name}{{{C}}})"
    panels: list[Any] = [
        _stat(
            "Hanging transactions",
            f"sum({metrics.HANGING_TRANSACTIONS.name}{{{C}}}) or {while_the_job_is_scraped}",
            "none",
            _pos(0, 0, 3, 4),
            "Open transactions proven HANGING (abort candidates). NO DATA: the streaming job is not scraped.",
            1,
            "red",
            ("hanging-transaction", "hanging transaction"),
            drill=(HANGING_TABLE_ID, "the hanging transactions"),
        ),
        _stat(
            "Partitions with late transactions",
            f"sum({metrics.CLUSTER_PARTITIONS_WITH_LATE_TRANSACTIONS.name}{{{C}}})",
            "none",
            _pos(3, 0, 3, 4),
            "KIP-664 PartitionsWithLateTransactionsCount over the cluster. NO DATA: the job is not scraped.",
            1,
            "orange",
            ("late-transactions", "late transactions"),
        ),
        _stat(
            "Stuck in prepare",
            f"sum({metrics.STUCK_PREPARE_TRANSACTIONS.name}{{{C}}})",
            "none",
            _pos(6, 0, 3, 4),
            "STUCK_PREPARE: never abort these; the brokers must finish them. NO DATA: the job is not scraped.",
            1,
            "red",
            ("stuck-prepare", "stuck prepare"),
            drill=(STUCK_TABLE_ID, "the partitions stuck in prepare"),
        ),
        _stat(
            "Withheld (UNCONFIRMED)",
            f"sum({metrics.WITHHELD_VERDICTS.name}{{{C}}}) or {while_the_job_is_scraped}",
            "none",
            _pos(9, 0, 3, 4),
            "A HANGING rule holds but the coordinator view is not current: no proof yet. NO DATA: the job is "
            "not scraped.",
            1,
            "orange",
            ("view-behind", "view behind"),
            drill=(WITHHELD_TABLE_ID, "the withheld verdicts"),
        ),
        _stat(
            "Coordinator view lag",
            f"max({metrics.COORDINATOR_VIEW_LAG_SECONDS.name}{{{C}}})",
            "s",
            _pos(12, 0, 3, 4),
            "How far the job's view of __transaction_state is behind the collector's newest measurement.",
            120,
            "orange",
            ("view-behind", "view behind"),
        ),
        _stat(
            "Since the last collector sweep",
            f"time() - max({metrics.COLLECTOR_LAST_SUCCESS_TIMESTAMP_SECONDS.name}{{{C}}})",
            "s",
            _pos(15, 0, 3, 4),
            "Seconds since the collector last published a sweep. NO DATA: the collector is not scraped (or has "
            "published none since it started).",
            180,
            "red",
            ("collector-down", "collector down"),
        ),
        _stat(
            "Since the last stream batch",
            f'time() - max({metrics.STREAM_LAST_BATCH_TIMESTAMP_SECONDS.name}{{{C}, query="txnwatch-reconcile"}})',
            "s",
            _pos(18, 0, 3, 4),
            "Seconds since the reconcile query last finished a batch (TxnwatchStreamStalled at 300). NO DATA: "
            "the streaming job is not scraped (or has finished no batch since it started).",
            300,
            "red",
            ("stream-down", "stream down"),
        ),
        _stat(
            "Targets up",
            f'min(up{{job=~"(.+-)?txnwatch-(collector|stream)", {C}}})',
            "none",
            _pos(21, 0, 3, 4),
            "1 (UP) when every txnwatch scrape target answers, 0 (DOWN) when one does not (TxnwatchCollectorDown, "
            "TxnwatchStreamDown); NO DATA: no target at all (TxnwatchCollectorAbsent, TxnwatchStreamAbsent).",
            1,
            "green",
            ("target-vanished", "target vanished"),
            [
                dm.ValueMap(
                    options={
                        "0": dm.ValueMappingResult(text="DOWN", color="red", index=1),
                        "1": dm.ValueMappingResult(text="UP", color="green", index=2),
                    }
                )
            ],
        ),
        hanging_table,
        stuck_table,
        overdue_table,
        withheld_table,
        uncovered_table,
        blocked_table,
        _series(
            "MaxActiveTransactionDuration (KIP-664): top 10 partitions",
            [
                _query(
                    "topk(10, max by (cluster, topic, partition) "
                    f"({metrics.MAX_ACTIVE_TRANSACTION_DURATION_SECONDS.name}{{{C}}}))",
                    "{{topic}}-{{partition}}",
                )
            ],
            "s",
            _pos(12, 24, 12, 8),
            "Age of the oldest open transaction per partition (only partitions with open transactions).",
        ),
        _series(
            "PartitionsWithLateTransactionsCount (KIP-664) by broker",
            [
                _query(
                    f"sum by (cluster, broker) ({metrics.PARTITIONS_WITH_LATE_TRANSACTIONS.name}{{{C}}})",
                    "broker {{broker}}",
                ),
                _query(
                    f'sum by (cluster, broker) ({metrics.LATE_PARTITIONS.name}{{{C},two_phase_commit="true"}})',
                    "broker {{broker}}: two-phase commit",
                    "B",
                ),
            ],
            "none",
            _pos(0, 32, 8, 8),
            "Leader partitions whose oldest open transaction is older than transaction.max.timeout.ms; the "
            "two-phase commit series counts those whose late transaction is a KIP-939 two-phase-commit one (no "
            "timeout: its transaction manager ends it; the late alert leaves them out).",
        ),
        _series(
            "LSO lag: top 10 partitions (records)",
            [
                _query(
                    f"topk(10, max by (cluster, topic, partition) ({metrics.LAST_STABLE_OFFSET_LAG.name}{{{C}}}))",
                    "{{topic}}-{{partition}}",
                )
            ],
            "short",
            _pos(8, 32, 8, 8),
            "High watermark minus last stable offset: what read_committed consumers cannot read yet.",
        ),
        _series(
            "Open transactions by verdict (stacked)",
            [_query(f"sum by (kind) ({metrics.OPEN_TRANSACTIONS.name}{{{C}}})", "{{kind}}")],
            "none",
            _pos(16, 32, 8, 8),
            "OPEN, LATE, HANGING, STUCK_PREPARE, COORDINATOR_OVERDUE, UNCONFIRMED (docs/detection.md).",
        )
        .stacking(gc.StackingConfig().mode(common.StackingMode.NORMAL))
        .fill_opacity(60),
        _series(
            "Candidates by reason",
            [
                _query(f"sum by (reason) ({metrics.HANGING_TRANSACTIONS.name}{{{C}}})", "HANGING {{reason}}"),
                _query(
                    f"sum by (would_be) ({metrics.WITHHELD_VERDICTS.name}{{{C}}})",
                    "withheld {{would_be}}",
                    "B",
                ),
            ],
            "none",
            _pos(0, 40, 8, 7),
            "HANGING verdicts by reason, and those withheld as UNCONFIRMED by the reason they would have.",
        ),
        _series(
            "Coordinator view lag",
            [_query(f"max by (cluster) ({metrics.COORDINATOR_VIEW_LAG_SECONDS.name}{{{C}}})", "{{cluster}}")],
            "s",
            _pos(8, 40, 8, 7),
            "0 when the view of __transaction_state is current; HANGING is withheld while it is not.",
        ),
        _series(
            "Coordinator records behind",
            [
                _query(
                    f"max by (cluster) ({metrics.COORDINATOR_VIEW_RECORDS_BEHIND.name}{{{C}}})", "{{cluster}}"
                )
            ],
            "short",
            _pos(16, 40, 8, 7),
            "Coordinator log records below the collector's newest positions the job has not applied yet.",
        ),
        _series(
            "Collector sweep duration",
            [
                _query(
                    "histogram_quantile(0.5, sum by (le) "
                    f"(rate({metrics.COLLECTOR_SWEEP_DURATION_SECONDS.bucket}{{{C}}}[$__rate_interval])))",
                    "p50",
                ),
                _query(
                    "histogram_quantile(0.99, sum by (le) "
                    f"(rate({metrics.COLLECTOR_SWEEP_DURATION_SECONDS.bucket}{{{C}}}[$__rate_interval])))",
                    "p99",
                    "B",
                ),
            ],
            "s",
            _pos(0, 47, 6, 7),
            "One sweep of every partition leader (DescribeProducers, start batches, publish).",
        ),
        _series(
            "Stream batch duration (p99)",
            [
                _query(
                    "histogram_quantile(0.99, sum by (le, query) "
                    f"(rate({metrics.STREAM_BATCH_DURATION_SECONDS.bucket}{{{C}}}[$__rate_interval])))",
                    "{{query}}",
                )
            ],
            "s",
            _pos(6, 47, 6, 7),
            "Micro-batch duration per query.",
        ),
        _series(
            "Input rates",
            [
                _query(
                    f"sum by (source) (rate({metrics.STREAM_INPUT_ROWS.total}{{{C}}}[$__rate_interval]))",
                    "{{source}}",
                ),
                _query(
                    "sum by (type) "
                    f"(rate({metrics.COLLECTOR_RECORDS_PUBLISHED.total}{{{C}}}[$__rate_interval]))",
                    "published {{type}}",
                    "B",
                ),
            ],
            "cps",
            _pos(12, 47, 6, 7),
            "Rows the job reads per source, records the collector publishes per type.",
        ),
        _series(
            "Dead letters",
            [
                _query(
                    f"sum by (source) (increase({metrics.DEAD_LETTER_RECORDS.total}{{{C}}}[$__rate_interval]))",
                    "{{source}}",
                )
            ],
            "short",
            _pos(18, 47, 6, 7),
            "Input records the job could not parse or decode (kept in the dead-letter topic).",
        ),
        _series(
            "Stream source lag (records)",
            [
                _query(
                    f"max by (query, source) ({metrics.STREAM_SOURCE_OFFSETS_BEHIND_LATEST.name}{{{C}}})",
                    "{{query}} {{source}}",
                )
            ],
            "short",
            _pos(0, 54, 12, 7),
            "Offsets behind the end of each source after the last batch.",
        ),
        _series(
            "Collector errors",
            [
                _query(
                    f"sum by (api, error) (rate({metrics.COLLECTOR_ERRORS.total}{{{C}}}[$__rate_interval]))",
                    "{{api}} {{error}}",
                )
            ],
            "reqps",
            _pos(12, 54, 12, 7),
            "Request failures and per-partition errors by API and Kafka error name (ACLs are named here).",
        ),
    ]
    board = (
        gd.Dashboard("txnwatch: hanging transactions")
        .uid(UID)
        .description("Kafka hanging transactions: KIP-664 metrics, verdicts, candidates, pipeline health.")
        .tags(["kafka", "transactions", "txnwatch"])
        .timezone("utc")
        .time("now-1h", "now")
        .refresh("30s")
        .tooltip(dm.DashboardCursorSync.CROSSHAIR)
        .with_variable(gd.DatasourceVariable("datasource").label("Data source").type("prometheus"))
        .with_variable(
            gd.QueryVariable("cluster")
            .label("Cluster")
            .datasource(DATASOURCE)
            .query(f"label_values({metrics.ABORT_CANDIDATES.name}, cluster)")
            .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .multi(True)
            .include_all(True)
            .all_value(".*")
            .current(dm.VariableOption(selected=True, text="All", value="$__all"))
        )
    )
    # the data links' ids (viewPanel) are the tables' places in this list
    tables = [hanging_table, stuck_table, overdue_table, withheld_table, uncovered_table, blocked_table]
    ids = [
        HANGING_TABLE_ID,
        STUCK_TABLE_ID,
        OVERDUE_TABLE_ID,
        WITHHELD_TABLE_ID,
        UNCOVERED_TABLE_ID,
        BLOCKED_TABLE_ID,
    ]
    if [panels.index(t) + 1 for t in tables] != ids:
        raise RuntimeError("a drill-down table moved: the stats' data links would open another panel")
    for i, panel in enumerate(panels, start=1):
        board = board.with_panel(panel.id(i))
    return json.loads(json.dumps(board.build(), cls=JSONEncoder))  # type: ignore[no-any-return]


def dumps(board: dict[str, Any]) -> str:
    return json.dumps(board, indent=2, sort_keys=True) + "\n"


# ----------------------------------------------------------------------------------- queries, as Prometheus sees them


def panel_queries(board: dict[str, Any]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """Every (panel, target) pair with a PromQL expression."""
    for panel in board.get("panels", []):
        for target in panel.get("targets", []):
            if target.get("expr"):
                yield panel, target


def substitute(expr: str, *, rate_interval: str = "1m", interval: str = "15s", range_: str = "1h") -> str:
    """A panel expression with Grafana's variables replaced, as Prometheus would receive it (cluster = All)."""
    out = expr.replace("$__rate_interval", rate_interval).replace("$__interval", interval)
    out = out.replace("$__range", range_)
    return re.sub(r"\$\{?cluster\}?", ".*", out)


def recording_rules(board: dict[str, Any], **subst: str) -> dict[str, Any]:
    """Every panel expression as a recording rule, for `promtool check rules`."""
    rules = [
        {
            "record": f"txnwatch_dashboard:panel{panel['id']}_{target['refId']}",
            "expr": substitute(target["expr"], **subst),
        }
        for panel, target in panel_queries(board)
    ]
    return {"groups": [{"name": "txnwatch-dashboard-queries", "rules": rules}]}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if txnwatch.json is out of date")
    args = parser.parse_args(argv)
    text = dumps(build())
    if args.check:
        if not JSON_PATH.exists() or JSON_PATH.read_text() != text:
            print(f"{JSON_PATH} is out of date: run python deploy/grafana/dashboard.py", file=sys.stderr)
            return 1
        return 0
    JSON_PATH.write_text(text)
    print(f"wrote {JSON_PATH}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
