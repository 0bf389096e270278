"""Metric names are declared once (common/metric_descriptors.py): every metric an alert rule or a dashboard query
names is declared there, and the docs' metric tables list exactly the declared metrics, with their types and
labels. A renamed metric fails here instead of leaving a dead alert, panel or doc row."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from metric_contract import documented

from common import metric_descriptors as metrics

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "txnwatch-rules.yaml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "txnwatch-rules.test.yaml"
DASHBOARD = ROOT / "deploy" / "grafana" / "txnwatch.json"
# Names a PromQL expression may use that are not metrics of ours: Prometheus' own `up`, and the recording rules
# the dashboard test makes of its panels.
NOT_OURS = re.compile(r"^(up|txnwatch_dashboard:.*)$")


def metric_names(expr: str) -> set[str]:
    return {n for n in re.findall(r"\btxnwatch_[\w:]+", expr) if not NOT_OURS.match(n)}


def rule_exprs() -> list[tuple[str, str]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [(r.get("alert") or r.get("record") or "?", r["expr"]) for g in groups for r in g["rules"]]


def dashboard_exprs() -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []

    def walk(node: Any, title: str) -> None:
        if isinstance(node, dict):
            title = node.get("title", title)
            for key in ("expr", "query"):
                if isinstance(node.get(key), str):
                    out.append((title, node[key]))
            for v in node.values():
                walk(v, title)
        elif isinstance(node, list):
            for v in node:
                walk(v, title)

    walk(json.loads(DASHBOARD.read_text()), "dashboard")
    return out


@pytest.mark.parametrize(("where", "expr"), rule_exprs(), ids=lambda x: x if len(x) < 60 else None)
def test_every_metric_an_alert_names_is_declared(where: str, expr: str) -> None:
    names = metric_names(expr)
    assert names or "up{" in expr, f"{where}: no metric in {expr!r}"
    assert names - set(metrics.SERIES) == set(), where


def test_every_metric_the_alert_tests_feed_is_declared() -> None:
    # promtool's test series must be real series too, or an alert test passes on a metric nobody exports.
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    names = {
        n for t in tests for s in t.get("input_series", []) for n in metric_names(s["series"].split("{")[0])
    }
    assert names and names - set(metrics.SERIES) == set()


def test_every_metric_a_dashboard_query_names_is_declared() -> None:
    exprs = dashboard_exprs()
    assert len(exprs) >= 20
    for title, expr in exprs:
        assert metric_names(expr) - set(metrics.SERIES) == set(), f"{title}: {expr}"


def test_the_docs_tables_list_exactly_the_declared_metrics() -> None:
    docs = {d.name: (d.type, d.labels) for d in documented().values()}
    declared = {
        m.series[0] if m.type == "counter" else m.name: (m.type, frozenset(m.labels))
        for m in metrics.ALL.values()
    }
    assert docs == declared


def test_each_component_declares_distinct_names_and_only_build_info_is_shared() -> None:
    assert len({m.name for m in metrics.STREAM}) == len(metrics.STREAM)
    assert len({m.name for m in metrics.COLLECTOR}) == len(metrics.COLLECTOR)
    assert set(metrics.STREAM) & set(metrics.COLLECTOR) == {metrics.BUILD_INFO}
    assert all(
        m.name.startswith("txnwatch_collector_") for m in metrics.COLLECTOR if m is not metrics.BUILD_INFO
    )
    # base units and `_total` only on counters (STYLE.md §7): a counter's declared name has no suffix of its own
    assert not [m.name for m in metrics.ALL.values() if m.name.endswith("_total")]
    assert metrics.STREAM_INPUT_ROWS.total == "txnwatch_stream_input_rows_total"
    with pytest.raises(ValueError, match="not a counter"):
        _ = metrics.ABORT_CANDIDATES.total
