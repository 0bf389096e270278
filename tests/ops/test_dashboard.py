"""deploy/grafana/txnwatch.json: built by deploy/grafana/dashboard.py (held in sync here), every panel query valid
PromQL (`promtool check rules` over them as recording rules) on documented metrics, datasource only through the
`datasource` variable, a `cluster` variable used everywhere, units set, a stable uid and a grid without overlaps."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml
from metric_contract import documented

from dev.gotools import ensure

ROOT = Path(__file__).resolve().parents[2]
GENERATOR = ROOT / "deploy" / "grafana" / "dashboard.py"
JSON_PATH = ROOT / "deploy" / "grafana" / "txnwatch.json"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
# Grafana unit ids the panels may use (Grafana's valueFormats): seconds, plain numbers, counts and requests per
# second, dates.
UNITS = {"s", "none", "short", "cps", "reqps", "dateTimeAsIso"}


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("txnwatch_dashboard", GENERATOR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def board() -> dict[str, Any]:
    return json.loads(JSON_PATH.read_text())  # type: ignore[no-any-return]


def test_committed_json_is_what_the_generator_builds() -> None:
    done = subprocess.run(
        [sys.executable, str(GENERATOR), "--check"], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    assert generator().build() == board()


def test_the_sdk_is_pinned() -> None:
    assert '"grafana-foundation-sdk==' in (ROOT / "pyproject.toml").read_text()


def test_every_panel_query_is_valid_promql(tmp_path: Path) -> None:
    rules = generator().recording_rules(board())
    assert len(rules["groups"][0]["rules"]) >= 20
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump(rules))
    done = subprocess.run(
        [str(ensure("promtool")), "check", "rules", str(path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_queries_use_documented_metrics_and_the_cluster_variable() -> None:
    known = set(documented())
    for panel, target in generator().panel_queries(board()):
        expr = target["expr"]
        assert 'cluster=~"$cluster"' in expr, panel["title"]
        for name in re.findall(r"\btxnwatch_\w+", expr):
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            assert name in known or base in known, f"{panel['title']}: {name} is not documented"


def test_datasource_only_through_the_variable_and_no_hard_coded_uids() -> None:
    b = board()
    uids: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if "uid" in node:
                uids.append(node["uid"])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(b)
    assert set(uids) == {"txnwatch-overview", "${datasource}"}
    assert b["uid"] == "txnwatch-overview"
    for panel in b["panels"]:
        assert panel["datasource"] == DATASOURCE, panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE, panel["title"]


def test_variables() -> None:
    variables = {v["name"]: v for v in board()["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    cluster = variables["cluster"]
    assert cluster["type"] == "query"
    assert cluster["datasource"] == DATASOURCE
    assert cluster["query"].startswith("label_values(txnwatch_")
    # All = .*, which also matches series without a cluster label (a scrape config that sets none)
    assert cluster["includeAll"] and cluster["allValue"] == ".*"


def test_every_panel_has_a_unit_and_a_description() -> None:
    for panel in board()["panels"]:
        assert panel["fieldConfig"]["defaults"].get("unit") in UNITS, panel["title"]
        assert panel.get("description"), panel["title"]


def test_the_grid_has_no_overlaps_and_the_panels_the_issue_asks_for() -> None:
    panels = board()["panels"]
    taken: dict[tuple[int, int], str] = {}
    for p in panels:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in taken, f"{p['title']} overlaps {taken[(x, y)]}"
                taken[(x, y)] = p["title"]
    assert len({p["id"] for p in panels}) == len(panels)
    exprs = " ".join(t["expr"] for p in panels for t in p["targets"])
    for metric in (
        "txnwatch_max_active_transaction_duration_seconds",
        "txnwatch_partitions_with_late_transactions",
        "txnwatch_last_stable_offset_lag",
        "txnwatch_hanging_transactions",
        "txnwatch_hanging_transaction_open_since_timestamp_seconds",
        "txnwatch_open_transactions",
        "txnwatch_coordinator_view_lag_seconds",
        "txnwatch_collector_sweep_duration_seconds_bucket",
        "txnwatch_stream_batch_duration_seconds_bucket",
        "txnwatch_stream_input_rows_total",
        "txnwatch_dead_letter_records_total",
    ):
        assert metric in exprs, metric
