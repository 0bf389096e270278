"""deploy/prometheus/txnwatch-rules.yaml: `promtool check rules` and `promtool test rules` (Prometheus 3.16 from
dev/gotools.py), and what every alert must carry: a severity, a summary, a description and an absolute runbook
URL whose anchor exists, over metrics the docs define; and that no component can vanish without an alert."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from metric_contract import documented

from dev.gotools import ensure

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "txnwatch-rules.yaml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "txnwatch-rules.test.yaml"
RUNBOOK = ROOT / "docs" / "runbook.md"
EXAMPLE_CONFIG = ROOT / "deploy" / "prometheus" / "prometheus.yml"
# The documented default (docs/alerting.md); the chart replaces it with alerting.runbookBaseUrl.
RUNBOOK_BASE_URL = "https://github.com/txnwatch/txnwatch/blob/main/docs/runbook.md"


def promtool(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(ensure("promtool")), *args], capture_output=True, text=True, timeout=120, cwd=cwd
    )


def alerts() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [r for g in groups for r in g["rules"] if "alert" in r]


def anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to dashes."""
    out = set()
    for line in markdown.splitlines():
        m = re.match(r"#{1,6} (.+)", line)
        if m:
            out.add(re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-"))
    return out


def test_promtool_check_rules_is_clean() -> None:
    done = promtool("check", "rules", str(RULES))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in done.stdout


def test_the_example_scrape_config_is_valid_and_loads_the_rules() -> None:
    done = promtool("check", "config", str(EXAMPLE_CONFIG))
    assert done.returncode == 0, done.stdout + done.stderr
    config = yaml.safe_load(EXAMPLE_CONFIG.read_text())
    assert config["rule_files"] == [RULES.name]
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    # the names the alerts' `up{job=~...}` match
    assert set(jobs) == {"txnwatch-collector", "txnwatch-stream"}
    assert jobs["txnwatch-stream"]["honor_labels"] is True
    assert all("cluster" in j["static_configs"][0]["labels"] for j in jobs.values())


def test_promtool_test_rules_passes() -> None:
    done = promtool("test", "rules", RULE_TESTS.name, cwd=RULE_TESTS.parent)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_every_alert_is_tested_firing_and_quiet() -> None:
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    fired: set[str] = set()
    quiet: set[str] = set()
    for t in tests:
        for case in t.get("alert_rule_test", []):
            (fired if case.get("exp_alerts") else quiet).add(case["alertname"])
    names = {a["alert"] for a in alerts()}
    assert names - fired == set(), "alerts never seen firing in txnwatch-rules.test.yaml"
    assert names - quiet == set(), "alerts never seen staying quiet in txnwatch-rules.test.yaml"


@pytest.mark.parametrize("alert", alerts(), ids=lambda a: a["alert"])
def test_alert_carries_severity_text_and_a_runbook_anchor_that_exists(alert: dict[str, Any]) -> None:
    assert alert["labels"]["severity"] in ("critical", "warning")
    notes = alert["annotations"]
    assert notes["summary"] and notes["description"]
    # absolute: an alert receiver (Slack, PagerDuty) cannot open a repository-relative path
    page, _, anchor = notes["runbook_url"].partition("#")
    assert page == RUNBOOK_BASE_URL
    assert anchor in anchors(RUNBOOK.read_text()), f"docs/runbook.md has no heading for #{anchor}"


@pytest.mark.parametrize("alert", alerts(), ids=lambda a: a["alert"])
def test_alert_uses_only_documented_metrics(alert: dict[str, Any]) -> None:
    names = set(re.findall(r"\b(txnwatch_\w+|up)\b", alert["expr"]))
    assert names, alert["expr"]
    assert names - set(documented()) - {"up"} == set()


def test_the_hanging_alert_names_partition_reason_and_the_command() -> None:
    (hanging,) = [a for a in alerts() if a["alert"] == "TxnwatchHangingTransaction"]
    assert hanging["labels"]["severity"] == "critical"
    text = hanging["annotations"]["description"]
    for needle in (
        "{{ $labels.topic }}-{{ $labels.partition }}",
        "{{ $labels.reason }}",
        "`txnwatch proposals show {{ $labels.candidate_id }}`",
    ):
        assert needle in text
    # the labels the annotation uses survive the aggregation
    for label in ("topic", "partition", "reason", "candidate_id", "cluster"):
        assert label in hanging["expr"]


def test_every_component_has_a_vanished_target_alert_beside_its_down_alert() -> None:
    # `up == 0` needs an `up` series: a target no Prometheus scrapes any more has none, so only absent() fires.
    down = {
        m.group(1): a
        for a in alerts()
        if (m := re.fullmatch(r'up\{job=~"([^"]+)"\} == 0', a["expr"].strip()))
    }
    assert len(down) == 2, down  # the collector's and the stream's
    for pattern, down_alert in down.items():
        (vanished,) = [a for a in alerts() if f'absent(up{{job=~"{pattern}"}})' in a["expr"]]
        assert vanished["labels"]["severity"] == down_alert["labels"]["severity"] == "critical"
        # long enough to ride out a Prometheus restart or a redeploy, short enough for a night shift
        assert vanished["for"] == "5m"
        assert vanished["annotations"]["runbook_url"].endswith("#target-vanished")
