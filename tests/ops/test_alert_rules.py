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

from common import metric_descriptors as metrics
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


def test_every_alert_is_tested_firing_at_each_severity_and_quiet() -> None:
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    fired: set[tuple[str, str]] = set()
    quiet: set[str] = set()
    for t in tests:
        for case in t.get("alert_rule_test", []):
            for expected in case.get("exp_alerts") or []:
                fired.add((case["alertname"], expected["exp_labels"]["severity"]))
            if not case.get("exp_alerts"):
                quiet.add(case["alertname"])
    rules = {(a["alert"], a["labels"]["severity"]) for a in alerts()}
    assert rules - fired == set(), "alerts never seen firing at that severity in txnwatch-rules.test.yaml"
    assert {name for name, _ in rules} - quiet == set(), "alerts never seen staying quiet"


# The alerts about a transaction that pins a partition page at once; everything else warns.
PAGES = {"TxnwatchHangingTransaction", "TxnwatchStuckPrepare"}
# txnwatch's own health: a warning, and the same alert critical with a longer `for` when it lasts.
HEALTH = {
    "TxnwatchCollectorDown",
    "TxnwatchCollectorAbsent",
    "TxnwatchCollectorStale",
    "TxnwatchStreamDown",
    "TxnwatchStreamAbsent",
    "TxnwatchStreamStalled",
    "TxnwatchStreamStateStale",
    "TxnwatchStreamFallingBehind",
    "TxnwatchCoordinatorViewBehind",
}


def seconds(duration: str) -> int:
    """A Prometheus duration of one unit (`90s`, `15m`, `1h`) in seconds."""
    m = re.fullmatch(r"(\d+)([smh])", duration)
    assert m, duration
    return int(m.group(1)) * {"s": 1, "m": 60, "h": 3600}[m.group(2)]


def test_only_a_pinned_partition_pages_at_once_and_txnwatchs_own_health_pages_when_it_lasts() -> None:
    by_name: dict[str, dict[str, dict[str, Any]]] = {}
    for a in alerts():
        severity = a["labels"]["severity"]
        assert severity not in by_name.setdefault(a["alert"], {}), f"{a['alert']}: two {severity} rules"
        by_name[a["alert"]][severity] = a
    assert {n for n, tiers in by_name.items() if set(tiers) == {"critical"}} == PAGES
    assert {n for n, tiers in by_name.items() if set(tiers) == {"warning", "critical"}} == HEALTH
    for name in HEALTH:
        warning, critical = by_name[name]["warning"], by_name[name]["critical"]
        # the same condition, held longer: Alertmanager's inhibition (same alertname) then keeps one notification
        assert critical["expr"] == warning["expr"], name
        assert seconds(critical["for"]) > seconds(warning["for"]) >= 60, name
        assert critical["annotations"]["runbook_url"] == warning["annotations"]["runbook_url"], name
    # every other alert warns, with a `for`
    for name, tiers in by_name.items():
        if name not in PAGES | HEALTH:
            assert set(tiers) == {"warning"} and seconds(tiers["warning"]["for"]) >= 60, name


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


def test_the_hanging_alert_names_partition_owner_reason_and_the_command() -> None:
    (hanging,) = [a for a in alerts() if a["alert"] == "TxnwatchHangingTransaction"]
    assert hanging["labels"]["severity"] == "critical"
    # the summary (what a pager shows) names the cluster, how long it has been open (from the series' value) and
    # whose transaction it is
    summary = hanging["annotations"]["summary"]
    assert "{{ $labels.cluster }}" in summary and 'printf "time() - %f" $value | query' in summary
    assert "$labels.transactional_id" in summary and "{{ $labels.producer_id }}" in summary
    text = hanging["annotations"]["description"]
    for needle in (
        "{{ $labels.topic }}-{{ $labels.partition }}",
        "{{ $labels.reason }}",
        "$labels.transactional_id",
        "{{ $labels.producer_id }}",
        "`txnwatch proposals show {{ $labels.candidate_id }}`",
    ):
        assert needle in text
    # the labels the annotations use survive the aggregation: every label the series has, so each hanging
    # transaction is one alert
    labels = ", ".join(metrics.HANGING_TRANSACTION_OPEN_SINCE_TIMESTAMP_SECONDS.labels)
    assert labels == "cluster, topic, partition, transactional_id, producer_id, reason, candidate_id"
    assert hanging["expr"] == (
        f"max by ({labels}) (txnwatch_hanging_transaction_open_since_timestamp_seconds) > 0"
    )


@pytest.mark.parametrize(
    ("name", "series", "labels"),
    [
        (
            "TxnwatchStuckPrepare",
            "txnwatch_stuck_prepare_transaction_open_since_timestamp_seconds",
            ("cluster", "topic", "partition", "transactional_id"),
        ),
        (
            "TxnwatchCoordinatorOverdue",
            "txnwatch_coordinator_overdue_transaction_open_since_timestamp_seconds",
            ("cluster", "topic", "partition", "transactional_id"),
        ),
        (
            "TxnwatchVerdictsWithheld",
            "txnwatch_withheld_verdict_open_since_timestamp_seconds",
            ("cluster", "topic", "partition", "transactional_id", "reason", "would_be"),
        ),
    ],
)
def test_the_alerts_about_a_transaction_name_its_partition_and_transactional_id(
    name: str, series: str, labels: tuple[str, ...]
) -> None:
    (alert,) = [a for a in alerts() if a["alert"] == name]
    # per partition first: the series of the partitions in that state, aggregated by every label it has
    assert alert["expr"].startswith(f"max by ({', '.join(labels)}) ({series}) > 0\n")
    for text in (alert["annotations"]["summary"], alert["annotations"]["description"]):
        assert "{{ $labels.topic }}-{{" in text and "$labels.partition }}" in text
        assert "$labels.transactional_id" in text


def test_every_component_has_a_vanished_target_alert_beside_its_down_alert() -> None:
    # `up == 0` needs an `up` series: a target no Prometheus scrapes any more has none, so only absent() fires.
    down: dict[tuple[str, str], dict[str, Any]] = {
        (m.group(1), a["labels"]["severity"]): a
        for a in alerts()
        if (m := re.fullmatch(r'up\{job=~"([^"]+)"\} == 0', a["expr"].strip()))
    }
    assert len(down) == 4, down  # the collector's and the stream's, each warning and critical
    for (pattern, severity), down_alert in down.items():
        (vanished,) = [
            a
            for a in alerts()
            if f'absent(up{{job=~"{pattern}"}})' in a["expr"] and a["labels"]["severity"] == severity
        ]
        # the warning: long enough to ride out a Prometheus restart or a redeploy; it pages as long as down does
        assert vanished["for"] == ("5m" if severity == "warning" else down_alert["for"])
        assert vanished["annotations"]["runbook_url"].endswith("#target-vanished")
