"""deploy/grafana/txnwatch.json: built by deploy/grafana/dashboard.py (held in sync here), every panel query valid
PromQL (`promtool check rules` over them as recording rules) on documented metrics, datasource only through the
`datasource` variable, a `cluster` variable used everywhere, units set, a stable uid and a grid without overlaps;
stats that say NO DATA in red when their component is not scraped (never a green 0), and runbook links."""

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


def stats() -> list[dict[str, Any]]:
    return [p for p in board()["panels"] if p["type"] == "stat"]


def test_no_stat_turns_a_missing_job_into_a_green_zero() -> None:
    assert stats()
    for panel in stats():
        (target,) = panel["targets"]
        # `or vector(0)` answers 0 when every series is gone, which a stat shows as a healthy green 0
        assert "vector(" not in target["expr"], panel["title"]
        defaults = panel["fieldConfig"]["defaults"]
        assert defaults["noValue"].startswith("NO DATA"), panel["title"]
        null_maps = [
            m for m in defaults["mappings"] if m["type"] == "special" and m["options"]["match"] == "null"
        ]
        assert [m["options"]["result"]["color"] for m in null_maps] == ["red"], panel["title"]


def test_the_stats_the_pipeline_needs_and_their_drawing_without_data() -> None:
    by_title = {p["title"]: p for p in stats()}
    batch = by_title["Since the last stream batch"]["targets"][0]["expr"]
    assert "txnwatch_stream_last_batch_timestamp_seconds" in batch and 'query="txnwatch-reconcile"' in batch
    assert "up{" in by_title["Targets up"]["targets"][0]["expr"]
    # the renderer draws what Grafana would: the null mapping's red NO DATA, UP/DOWN for the up stat
    g = generator()
    mappings = by_title["Targets up"]["fieldConfig"]["defaults"]["mappings"]
    assert g._mapped(mappings, None) == {"text": "NO DATA: not scraped", "color": "red", "index": 0}
    assert g._mapped(mappings, 0.0)["text"] == "DOWN"
    assert g._mapped(mappings, 1.0)["text"] == "UP"


def test_stats_and_the_hanging_table_link_to_runbook_sections_that_exist() -> None:
    headings = {
        re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        for line in (ROOT / "docs" / "runbook.md").read_text().splitlines()
        if line.startswith("#")
    }
    base = generator().RUNBOOK
    linked = [p for p in board()["panels"] if p["type"] in ("stat", "table")]
    for panel in linked:
        (link,) = panel["links"]
        page, _, anchor = link["url"].partition("#")
        assert page == base and anchor in headings, (panel["title"], link["url"])
        assert link["targetBlank"] is True
