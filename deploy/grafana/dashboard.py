"""The txnwatch Grafana dashboard, authored with grafana-foundation-sdk; writes deploy/grafana/txnwatch.json.

    python deploy/grafana/dashboard.py            # (re)write txnwatch.json
    python deploy/grafana/dashboard.py --check    # exit 1 if txnwatch.json is not what this file builds
    python deploy/grafana/dashboard.py render --prometheus http://127.0.0.1:9090 --out docs/dashboard.png

Every query names its metrics through common/metric_descriptors.py (declared once, as the exporters declare
them), so a renamed metric changes the queries and `--check` asks for the JSON to be written again.

`render` draws every panel from a live Prometheus (/api/v1/query_range) at its gridPos with matplotlib: a
picture of what Grafana would show, for people without a Grafana (docs/alerting.md).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
import urllib.parse
import urllib.request
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
) -> stat.Panel:
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


def build() -> dict[str, Any]:
    """The dashboard as Grafana JSON (a plain dict)."""
    each = (
        "max by (cluster, topic, partition, reason, candidate_id) "
        f"({metrics.HANGING_TRANSACTION_OPEN_SINCE_TIMESTAMP_SECONDS.name}{{{C}}})"
    )
    hanging_table = (
        table.Panel()
        .title("Hanging transactions now: which partition, why, since when, what to run")
        .description(
            "One row per HANGING transaction with an open abort candidate. The last column is the id for "
            "`txnwatch proposals show <id>` (docs/runbook.md)."
        )
        .datasource(DATASOURCE)
        .with_target(_query(f"{each} * 1000", ref="A", instant=True))
        .with_target(_query(f"time() - {each}", ref="B", instant=True))
        .unit("s")
        .override_by_name("open since", [dm.DynamicConfigValue(id_val="unit", value="dateTimeAsIso")])
        .no_value("no hanging transaction")
        .links([_runbook("hanging-transaction", "hanging transaction")])
        .sort_by([gc.TableSortByFieldState().display_name("hanging for").desc(True)])
        .grid_pos(_pos(0, 4, 12, 8))
        .with_transformation(dm.DataTransformerConfig(id_val="merge", options={}))
        .with_transformation(
            dm.DataTransformerConfig(
                id_val="organize",
                options={
                    "excludeByName": {"Time": True, "cluster": True},
                    "indexByName": {
                        "topic": 0,
                        "partition": 1,
                        "reason": 2,
                        "Value #B": 3,
                        "Value #A": 4,
                        "candidate_id": 5,
                    },
                    "renameByName": {
                        "Value #A": "open since",
                        "Value #B": "hanging for",
                        "candidate_id": "txnwatch proposals show",
                    },
                },
            )
        )
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
            _pos(12, 4, 12, 8),
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
            _pos(0, 12, 8, 8),
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
            _pos(8, 12, 8, 8),
            "High watermark minus last stable offset: what read_committed consumers cannot read yet.",
        ),
        _series(
            "Open transactions by verdict (stacked)",
            [_query(f"sum by (kind) ({metrics.OPEN_TRANSACTIONS.name}{{{C}}})", "{{kind}}")],
            "none",
            _pos(16, 12, 8, 8),
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
            _pos(0, 20, 8, 7),
            "HANGING verdicts by reason, and those withheld as UNCONFIRMED by the reason they would have.",
        ),
        _series(
            "Coordinator view lag",
            [_query(f"max by (cluster) ({metrics.COORDINATOR_VIEW_LAG_SECONDS.name}{{{C}}})", "{{cluster}}")],
            "s",
            _pos(8, 20, 8, 7),
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
            _pos(16, 20, 8, 7),
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
            _pos(0, 27, 6, 7),
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
            _pos(6, 27, 6, 7),
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
            _pos(12, 27, 6, 7),
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
            _pos(18, 27, 6, 7),
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
            _pos(0, 34, 12, 7),
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
            _pos(12, 34, 12, 7),
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


# --------------------------------------------------------------------------------------------------------- render


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as response:
        body = json.load(response)
    if body.get("status") != "success":
        raise RuntimeError(f"{url}: {body}")
    return body["data"]


def _legend(fmt: str, labels: dict[str, str]) -> str:
    if not fmt:
        return ", ".join(f"{k}={v}" for k, v in sorted(labels.items())) or "value"
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt)


def _fmt(value: float, unit: str) -> str:
    if unit == "s":
        if value == 0:
            return "0 s"
        if value >= 3600:
            return f"{value / 3600:.1f} h"
        if value >= 120:
            return f"{value / 60:.0f} min" if value % 60 == 0 else f"{value / 60:.1f} min"
        if value < 1:
            return f"{value * 1000:.0f} ms"
        return f"{value:.1f} s" if value < 10 else f"{value:.0f} s"
    if unit == "dateTimeAsIso":
        return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(value / 1000))
    if unit in ("cps", "reqps"):
        return f"{value:.1f}/s" if value < 100 else f"{value:,.0f}/s"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.2f}"


def _mapped(mappings: list[dict[str, Any]], value: float | None) -> dict[str, Any] | None:
    """The result of the panel's value mapping for `value` (None: no series), as Grafana applies the two kinds
    the dashboard uses (a special value `null`, and exact values); None when none applies."""
    for m in mappings:
        if m["type"] == "special" and value is None and m["options"]["match"] == "null":
            return m["options"]["result"]  # type: ignore[no-any-return]
        if m["type"] == "value" and value is not None:
            hit = m["options"].get(_fmt(value, "none"))
            if hit is not None:
                return hit  # type: ignore[no-any-return]
    return None


def _unit(panel: dict[str, Any], field: str | None = None) -> str:
    """The unit Grafana would use for `field` (overrides by name first, then the panel default)."""
    config = panel.get("fieldConfig", {})
    for override in config.get("overrides", []):
        if override["matcher"] == {"id": "byName", "options": field}:
            for prop in override["properties"]:
                if prop["id"] == "unit":
                    return str(prop["value"])
    return str(config.get("defaults", {}).get("unit", ""))


def _table_rows(panel: dict[str, Any], query: Any) -> tuple[list[str], list[list[str]]]:
    """Instant table targets merged on their labels, organised as the panel's transformations say."""
    merged: dict[tuple[tuple[str, str], ...], dict[str, str]] = {}
    for t in panel["targets"]:
        for s in query(t["expr"]):
            key = tuple(sorted(s["metric"].items()))
            merged.setdefault(key, dict(key))[f"Value #{t['refId']}"] = s["value"][1]
    options = next(x["options"] for x in panel.get("transformations", []) if x["id"] == "organize")
    order, rename = options["indexByName"], options["renameByName"]
    columns = sorted(order, key=order.get)
    names = [rename.get(c, c) for c in columns]
    sort = (panel.get("options", {}).get("sortBy") or [{}])[0]
    if sort.get("displayName") in names:
        by = columns[names.index(sort["displayName"])]
        merged = dict(
            sorted(merged.items(), key=lambda kv: float(kv[1].get(by) or 0), reverse=bool(sort.get("desc")))
        )
    rows = []
    for row in merged.values():
        cells = []
        for c, n in zip(columns, names, strict=True):
            v = row.get(c, "")
            cells.append(_fmt(float(v), _unit(panel, n)) if c.startswith("Value") and v else v)
        rows.append(cells)
    return names, rows


def render(
    board: dict[str, Any],
    prometheus_url: str,
    out: Path,
    *,
    start: float,
    end: float,
    step: float = 5.0,
    rate_interval: str = "30s",
) -> list[str]:
    """Query every panel from Prometheus and draw the dashboard into `out` (PNG); returns one line per panel
    saying what it showed."""
    from datetime import UTC, datetime

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, MaxNLocator, MultipleLocator

    def instant(expr: str) -> list[dict[str, Any]]:
        q = substitute(expr, rate_interval=rate_interval)
        data = _get(f"{prometheus_url}/api/v1/query?" + urllib.parse.urlencode({"query": q, "time": end}))
        return data["result"]  # type: ignore[no-any-return]

    def ranged(expr: str) -> list[dict[str, Any]]:
        q = substitute(expr, rate_interval=rate_interval)
        params = {"query": q, "start": start, "end": end, "step": step}
        return _get(f"{prometheus_url}/api/v1/query_range?" + urllib.parse.urlencode(params))["result"]  # type: ignore[no-any-return]

    panels = sorted(board["panels"], key=lambda p: (p["gridPos"]["y"], p["gridPos"]["x"]))
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    row_in, head_in = 0.45, 0.7  # inches per grid row; the title line
    height_in = rows * row_in + head_in
    fig = plt.figure(figsize=(24 * 0.85, height_in), facecolor="#111217")
    span = f"{datetime.fromtimestamp(start, UTC):%H:%M:%S}-{datetime.fromtimestamp(end, UTC):%H:%M:%S} UTC"
    fig.text(
        0.005,
        1 - 0.45 / height_in,
        f"{board['title']}   ·   {span}   ·   cluster: All   ·   drawn from Prometheus by deploy/grafana/dashboard.py",
        color="#d8d9da",
        fontsize=15,
    )
    summary: list[str] = []
    for p in panels:
        g = p["gridPos"]
        # panel box in inches from the top; leave room for the title above and the tick labels below
        box_top = head_in + g["y"] * row_in + 0.32
        box_bottom = head_in + (g["y"] + g["h"]) * row_in - (0.08 if p["type"] != "timeseries" else 0.3)
        left = g["x"] / 24 + (0.004 if p["type"] != "timeseries" else 0.03)
        width = g["w"] / 24 - 0.008 if p["type"] != "timeseries" else (g["w"] / 24 - 0.034) * 0.62
        ax = fig.add_axes(
            (left, 1 - box_bottom / height_in, width, (box_bottom - box_top) / height_in), facecolor="#181b1f"
        )
        for side in ax.spines.values():
            side.set_color("#2c3235")
        ax.tick_params(colors="#9fa7b3", labelsize=8)
        unit = _unit(p)
        fig.text(
            g["x"] / 24 + 0.004, 1 - (box_top - 0.08) / height_in, p["title"], color="#d8d9da", fontsize=10.5
        )
        if p["type"] == "timeseries":
            drawn, peak = 0, 0.0
            found = [(t, s) for t in p["targets"] for s in ranged(t["expr"])]
            stacked = (
                p["fieldConfig"]["defaults"].get("custom", {}).get("stacking", {}).get("mode") == "normal"
            )
            if stacked and found:
                stamps = sorted({float(ts) for _, s in found for ts, _ in s["values"]})
                layers = [{float(ts): float(v) for ts, v in s["values"]} for _, s in found]
                ys_all = [[layer.get(ts, 0.0) for ts in stamps] for layer in layers]
                # matplotlib's stubs list floats only; its date converter takes datetimes (as used here)
                ax.stackplot(
                    [datetime.fromtimestamp(ts, UTC) for ts in stamps],  # type: ignore[arg-type]
                    ys_all,
                    labels=[_legend(t.get("legendFormat", ""), s["metric"]) for t, s in found],
                    alpha=0.75,
                )
                drawn, peak = len(found), max(sum(col) for col in zip(*ys_all, strict=True))
            for t, s in [] if stacked else found:
                xs = [datetime.fromtimestamp(float(ts), UTC) for ts, _ in s["values"]]
                ys = [float(v) for _, v in s["values"]]
                ax.plot(xs, ys, linewidth=1.8, label=_legend(t.get("legendFormat", ""), s["metric"]))  # type: ignore[arg-type]
                drawn += 1
                peak = max([peak, *ys])
            # matplotlib.dates is unannotated, and set_xlim's stubs omit the datetimes its converter takes
            locator = mdates.AutoDateLocator(minticks=2, maxticks=max(3, g["w"] // 2))  # type: ignore[no-untyped-call]
            ax.xaxis.set_major_locator(locator)
            ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S", tz=UTC))  # type: ignore[no-untyped-call]
            ax.set_xlim(datetime.fromtimestamp(start, UTC), datetime.fromtimestamp(end, UTC))  # type: ignore[arg-type]
            ax.set_ylim(0, peak * 1.15 if peak > 0 else 1)
            if unit == "s" and peak > 120:  # whole minutes, hours
                nice = [60, 120, 300, 600, 900, 1800, 3600, 7200, 14400, 21600, 43200, 86400]
                ax.yaxis.set_major_locator(
                    MultipleLocator(next((n for n in nice if peak / n <= 5), nice[-1]))
                )
            else:
                ax.yaxis.set_major_locator(MaxNLocator(nbins=5, integer=unit in ("none", "short")))
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos, u=unit: _fmt(v, u)))
            ax.grid(color="#2c3235", linewidth=0.6)
            if drawn:
                leg = ax.legend(
                    loc="upper left",
                    bbox_to_anchor=(1.01, 1.0),
                    fontsize=7.5,
                    facecolor="#181b1f",
                    edgecolor="#2c3235",
                    borderaxespad=0,
                )
                for text in leg.get_texts():
                    text.set_color("#d8d9da")
            else:
                ax.text(
                    0.5, 0.5, "No data", color="#9fa7b3", ha="center", va="center", transform=ax.transAxes
                )
            summary.append(f"{p['title']}: {drawn} series, max {_fmt(peak, unit)}")
            continue
        ax.set_xticks([])
        ax.set_yticks([])
        if p["type"] == "stat":
            result = instant(p["targets"][0]["expr"])
            value = float(result[0]["value"][1]) if result else None
            defaults = p["fieldConfig"]["defaults"]
            steps = defaults["thresholds"]["steps"]
            color = steps[0]["color"]
            for st in steps[1:]:
                if value is not None and value >= st["value"]:
                    color = st["color"]
            shown = defaults.get("noValue", "No data") if value is None else _fmt(value, unit)
            mapped = _mapped(defaults.get("mappings", []), value)
            if mapped is not None:  # as Grafana: a value mapping's text and color win over the thresholds
                shown, color = mapped.get("text", shown), mapped.get("color", color)
            ax.set_facecolor(
                {"green": "#1a7f37", "orange": "#b35c00", "red": "#a51d2d"}.get(color, "#181b1f")
            )
            ax.text(
                0.5, 0.45, shown, color="white", fontsize=28, ha="center", va="center", transform=ax.transAxes
            )
            summary.append(f"{p['title']}: {shown}")
            continue
        names, cells = _table_rows(p, instant)
        if cells:
            # columns as wide as their longest text, the whole table as wide as the panel
            chars = [max(len(str(x)) for x in [n, *(r[i] for r in cells)]) + 2 for i, n in enumerate(names)]
            tbl = ax.table(
                cellText=cells,
                colLabels=names,
                colWidths=[c / sum(chars) for c in chars],
                loc="upper center",
                cellLoc="left",
                colLoc="left",
            )
            tbl.auto_set_font_size(False)
            # a character of a font of size f points is about 0.6 f points wide
            tbl.set_fontsize(max(8.0, min(10.5, width * 24 * 0.85 * 72 / (sum(chars) * 0.65))))
            tbl.scale(1, 1.9)
            for (r, _c), cell in tbl.get_celld().items():
                cell.set_edgecolor("#2c3235")
                cell.set_facecolor("#22252b" if r == 0 else "#3b1219")
                cell.get_text().set_color("#ffffff" if r else "#9fa7b3")
        else:
            none = p["fieldConfig"]["defaults"].get("noValue", "No data")
            ax.text(0.5, 0.5, none, color="#9fa7b3", ha="center", va="center", transform=ax.transAxes)
        summary.append(f"{p['title']}: {len(cells)} row(s) {cells}")
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80, facecolor=fig.get_facecolor())
    plt.close(fig)
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if txnwatch.json is out of date")
    sub = parser.add_subparsers(dest="command")
    r = sub.add_parser("render", help="draw the dashboard from a live Prometheus into a PNG")
    r.add_argument("--prometheus", required=True, help="base URL, e.g. http://127.0.0.1:9090")
    r.add_argument("--out", type=Path, default=Path("docs/dashboard.png"))
    r.add_argument("--minutes", type=float, default=10.0, help="time range ending now")
    args = parser.parse_args(argv)
    board = build()
    if args.command == "render":
        end = time.time()
        for line in render(
            board, args.prometheus.rstrip("/"), args.out, start=end - args.minutes * 60, end=end
        ):
            print(line)
        return 0
    text = dumps(board)
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
