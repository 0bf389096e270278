"""deploy/grafana/txnwatch.json: built by deploy/grafana/dashboard.py (held in sync here), every panel query valid
PromQL (`promtool check rules` over them as recording rules) on documented metrics, datasource only through the
`datasource` variable, a `cluster` variable used everywhere, units set, a stable uid and a grid without overlaps;
stats that say NO DATA in red when their component is not scraped (never a green 0), and runbook links."""

from __future__ import annotations

import copy
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from metric_contract import documented

from dev.gotools import ensure

ROOT = Path(__file__).resolve().parents[2]
GENERATOR = ROOT / "deploy" / "grafana" / "dashboard.py"
RENDERER = ROOT / "deploy" / "grafana" / "render.py"
JSON_PATH = ROOT / "deploy" / "grafana" / "txnwatch.json"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
# Grafana unit ids the panels may use (Grafana's valueFormats): seconds, plain numbers, counts and requests per
# second, dates.
UNITS = {"s", "none", "short", "cps", "reqps", "dateTimeAsIso"}


def load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"txnwatch_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def generator() -> ModuleType:
    return load(GENERATOR)


def renderer() -> ModuleType:
    return load(RENDERER)


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
    r = renderer()
    mappings = by_title["Targets up"]["fieldConfig"]["defaults"]["mappings"]
    assert r.mapped(mappings, None) == {"text": "NO DATA: not scraped", "color": "red", "index": 0}
    assert r.mapped(mappings, 0.0)["text"] == "DOWN"
    assert r.mapped(mappings, 1.0)["text"] == "UP"


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


def tables() -> dict[str, dict[str, Any]]:
    """The tables by the words before the colon of their title."""
    return {p["title"].split(":")[0]: p for p in board()["panels"] if p["type"] == "table"}


def columns(panel: dict[str, Any]) -> list[str]:
    """A table's columns as its organize transformation orders and names them."""
    (organize,) = [t["options"] for t in panel["transformations"] if t["id"] == "organize"]
    order = sorted(organize["indexByName"], key=organize["indexByName"].get)
    return [organize["renameByName"].get(field, field) for field in order]


def test_the_hanging_table_names_the_partition_whose_how_long_its_lso_lag_and_the_candidate() -> None:
    hanging = tables()["Hanging transactions now"]
    assert columns(hanging) == [
        "cluster",
        "topic",
        "partition",
        "transactional id",
        "producer id",
        "reason",
        "open for",
        "open since",
        "LSO lag (records)",
        "blocked groups",
        "txnwatch proposals show",
    ]
    exprs = [t["expr"] for t in hanging["targets"]]
    assert all("txnwatch_hanging_transaction_open_since_timestamp_seconds" in e for e in exprs)
    # the LSO lag joins each row on its partition, keeping the row's labels (merge joins rows on equal labels)
    assert "group_left max by (cluster, topic, partition) (txnwatch_last_stable_offset_lag" in exprs[2]
    # how many consumer groups the collector found held up on the row's partition, joined the same way
    assert "group_left count by (cluster, topic, partition) (txnwatch_collector_blocked_groups" in exprs[3]
    assert "consumer groups" in hanging["description"]
    # a transaction no coordinator record names shows (none named), and its row still merges
    assert all('"transactional_id", "(none named)"' in e for e in exprs)


def test_drill_down_tables_name_the_partitions_of_each_state() -> None:
    t = tables()
    expected = {
        "Stuck in prepare": (
            "txnwatch_stuck_prepare_transaction_open_since_timestamp_seconds",
            "transactional id",
        ),
        "Coordinator overdue": (
            "txnwatch_coordinator_overdue_transaction_open_since_timestamp_seconds",
            "transactional id",
        ),
        "Withheld (UNCONFIRMED)": ("txnwatch_withheld_verdict_open_since_timestamp_seconds", "would be"),
        "Uncovered partitions": ("txnwatch_collector_partition_uncovered", "reason"),
        "Blocked consumer groups": ("txnwatch_collector_blocked_groups", "consumer group"),
    }
    for title, (metric, column) in expected.items():
        panel = t[title]
        assert all(metric in target["expr"] for target in panel["targets"]), title
        assert column in columns(panel), title
        assert all(target["instant"] and target["format"] == "table" for target in panel["targets"]), title
    for title in ("Stuck in prepare", "Coordinator overdue", "Withheld (UNCONFIRMED)"):
        assert {"topic", "partition", "open for", "open since", "LSO lag (records)"} <= set(columns(t[title]))
    # each uncovered partition and each blocked group by name, not a count
    assert columns(t["Uncovered partitions"]) == ["cluster", "topic", "partition", "reason"]
    assert columns(t["Blocked consumer groups"]) == ["cluster", "topic", "partition", "consumer group", "why"]


def test_the_stats_open_their_tables() -> None:
    b = board()
    by_id = {p["id"]: p for p in b["panels"]}
    opened = {}
    for panel in stats():
        for link in panel["fieldConfig"]["defaults"].get("links", []):
            url = link["url"]
            assert url.startswith(
                "/d/${__dashboard.uid}?${__url_time_range}&${__all_variables}&viewPanel="
            ), url
            target = by_id[int(url.rpartition("=")[2])]
            assert target["type"] == "table"
            opened[panel["title"]] = target["title"].split(":")[0]
    assert opened == {
        "Hanging transactions": "Hanging transactions now",
        "Stuck in prepare": "Stuck in prepare",
        "Withheld (UNCONFIRMED)": "Withheld (UNCONFIRMED)",
    }


def test_the_json_is_in_grafanas_dashboard_model() -> None:
    r = renderer()
    assert r.schema_problems(board()) == []
    # a key Grafana's model does not know is found
    b = board()
    b["panels"][0]["gridPos"]["width"] = 3
    b["panels"][8]["fieldConfig"]["defaults"]["colour"] = "red"
    assert r.schema_problems(b) == ["/panels[0]/gridPos/width", "/panels[8]/fieldConfig/defaults/colour"]


def test_the_renderer_can_draw_every_panel_and_names_what_it_cannot() -> None:
    r = renderer()
    panels = board()["panels"]
    assert [problem for panel in panels for problem in r.undrawable(panel)] == []
    hanging = copy.deepcopy(panels[8])
    hanging["type"] = "bargauge"
    assert r.undrawable(hanging) == [
        f"{hanging['title']}: panel type 'bargauge' (drawn: stat, table, timeseries)"
    ]
    table = copy.deepcopy(panels[8])
    table["transformations"].insert(0, {"id": "joinByField", "options": {}})
    table["fieldConfig"]["overrides"][0]["properties"][0]["value"] = "bytes"
    table["targets"][0]["instant"] = False
    assert r.undrawable(table) == [
        f"{table['title']}: table target A is not an instant query in table format",
        f"{table['title']}: unit 'bytes'",
        f"{table['title']}: transformation joinByField",
    ]


class Answers:
    """Prometheus's instant answers for a table's queries (a fake: the table logic is pure)."""

    step = 15.0

    def __init__(self, answers: dict[str, list[dict[str, Any]]]) -> None:
        self.answers = answers

    def instant(self, expr: str) -> list[dict[str, Any]]:
        return next(a for prefix, a in self.answers.items() if expr.startswith(prefix))

    def ranged(self, expr: str) -> list[dict[str, Any]]:
        raise AssertionError("a table asks for instant answers")


def test_a_table_merges_its_queries_row_by_row_as_grafana_does() -> None:
    r = renderer()
    withheld = tables()["Withheld (UNCONFIRMED)"]
    one = {
        "cluster": "c",
        "topic": "t",
        "partition": "0",
        "transactional_id": "a",
        "reason": "r",
        "would_be": "w",
    }
    # the second has no transactional id label: Grafana's table leaves the cell empty
    two = {"cluster": "c", "topic": "t", "partition": "1", "reason": "r", "would_be": "w"}
    answers = Answers(
        {
            "label_replace(max by": [
                {"metric": one, "value": [0, "1700000000000"]},
                {"metric": two, "value": [0, "1700000600000"]},
            ],
            "time() -": [{"metric": one, "value": [0, "900"]}, {"metric": two, "value": [0, "300"]}],
            "0 *": [{"metric": one, "value": [0, "5"]}],
        }
    )
    t = r.table(withheld, answers, 1700000900000)
    assert t.columns == [
        "cluster",
        "topic",
        "partition",
        "transactional id",
        "withheld: why",
        "would be",
        "open for",
        "open since",
        "LSO lag (records)",
    ]
    assert t.rows == [  # longest open first, as saved
        ["c", "t", "0", "a", "r", "w", "15 min", "2023-11-14 22:13:20", "5"],
        ["c", "t", "1", "", "r", "w", "5 min", "2023-11-14 22:23:20", ""],
    ]
    # frames with different labels (here the lag's, whose rows all lack the transactional id) are not merged
    # as Grafana might: refused, not drawn wrong (the dashboard's label_replace keeps the label in every row)
    answers.answers["0 *"] = [{"metric": two, "value": [0, "5"]}]
    with pytest.raises(r.Unsupported, match="merge of frames with different labels"):
        r.table(withheld, answers, 1700000900000)


def test_nan_is_no_value_as_grafanas_reducers_say() -> None:
    r = renderer()
    # histogram_quantile over no rate answers NaN: Grafana's Last * skips it, as it skips a null
    values = [r.sample("0.5"), r.sample("NaN")]
    assert values == [0.5, None]
    assert r.reduced(values, "lastNotNull") == 0.5
    assert r.reduced([r.sample("NaN")], "max") is None
