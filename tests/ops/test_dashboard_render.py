"""deploy/grafana/render.py draws deploy/grafana/txnwatch.json from a real Prometheus 3.16 (dev/gotools.py): the
series an incident leaves (a hanging transaction, one stuck in prepare, two withheld verdicts, one without a
transactional id, uncovered partitions, the pipeline's counters) are backfilled into its TSDB with `promtool tsdb
create-blocks-from openmetrics`, and every panel's PromQL is answered by it. Every panel of the JSON must be drawn
with its data (the tables' rows name what the series carry), and a panel the renderer cannot draw fails the render.
The live test (tests/e2e/test_alerts_live.py) draws the same JSON from the real collector and job."""

from __future__ import annotations

import importlib.util
import json
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from dev.gotools import ensure

ROOT = Path(__file__).resolve().parents[2]
JSON_PATH = ROOT / "deploy" / "grafana" / "txnwatch.json"
STEP_S = 15
MINUTES = 15
HANGING_CANDIDATE = "8f14e45fceea167a5a36dedd4bea2543"


def renderer() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "txnwatch_render", ROOT / "deploy" / "grafana" / "render.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


render = renderer()


def openmetrics(end: int) -> str:
    """Fifteen minutes of an incident, one sample per STEP_S: families (name, type, [(labels, value at t)])."""
    start = end - MINUTES * 60
    hang_opened = start + 120
    c = 'cluster="t"'

    def since(opened: int) -> Any:
        return lambda t: opened if t >= opened else None

    families: list[tuple[str, str, list[tuple[str, Any]]]] = [
        (
            "txnwatch_hanging_transaction_open_since_timestamp_seconds",
            "gauge",
            [
                (
                    f'{c},topic="orders",partition="3",transactional_id="orders-tx-1",producer_id="4001",'
                    f'reason="coordinator-completed",candidate_id="{HANGING_CANDIDATE}"',
                    since(hang_opened),
                )
            ],
        ),
        ("txnwatch_hanging_transactions", "gauge", [(f'{c},reason="coordinator-completed"', lambda t: 1)]),
        ("txnwatch_abort_candidates", "gauge", [(c, lambda t: 1)]),
        (
            "txnwatch_last_stable_offset_lag",
            "gauge",
            [
                (f'{c},topic="orders",partition="3"', lambda t: 42),
                (f'{c},topic="payments",partition="1"', lambda t: 7),
                # only the withheld partition without a transactional id has a lag: its frame still merges
                (f'{c},topic="audit",partition="2"', lambda t: 3),
            ],
        ),
        (
            "txnwatch_max_active_transaction_duration_seconds",
            "gauge",
            [(f'{c},topic="orders",partition="3"', lambda t: max(0, t - hang_opened))],
        ),
        ("txnwatch_stuck_prepare_transactions", "gauge", [(c, lambda t: 1)]),
        (
            "txnwatch_stuck_prepare_transaction_open_since_timestamp_seconds",
            "gauge",
            [(f'{c},topic="payments",partition="1",transactional_id="payments-7"', since(start + 300))],
        ),
        (
            "txnwatch_withheld_verdict_open_since_timestamp_seconds",
            "gauge",
            [
                (
                    f'{c},topic="audit",partition="0",transactional_id="audit-1",reason="coordinator-view-behind",'
                    'would_be="coordinator-completed"',
                    since(start + 600),
                ),
                # no coordinator record names one: the label is empty, so Prometheus has none
                (
                    f'{c},topic="audit",partition="2",reason="coordinator-record-undecodable",'
                    'would_be="coordinator-expired"',
                    since(start + 660),
                ),
            ],
        ),
        (
            "txnwatch_withheld_verdicts",
            "gauge",
            [
                (f'{c},reason="coordinator-view-behind",would_be="coordinator-completed"', lambda t: 1),
                (f'{c},reason="coordinator-record-undecodable",would_be="coordinator-expired"', lambda t: 1),
            ],
        ),
        (
            "txnwatch_collector_partitions_uncovered",
            "gauge",
            [(f'{c},reason="LEADER_NOT_AVAILABLE"', lambda t: 2)],
        ),
        (
            "txnwatch_collector_partition_uncovered",
            "gauge",
            [
                (f'{c},topic="payments",partition="5",reason="LEADER_NOT_AVAILABLE"', lambda t: 1),
                (f'{c},topic="payments",partition="6",reason="LEADER_NOT_AVAILABLE"', lambda t: 1),
            ],
        ),
        (
            "txnwatch_collector_blocked_groups",
            "gauge",
            [
                (
                    f'{c},topic="orders",partition="3",group="orders-app",reason="committed-at-lso"',
                    lambda t: 1 if t >= hang_opened else None,
                ),
                (
                    f'{c},topic="orders",partition="3",group="orders-audit",reason="committed-at-lso"',
                    lambda t: 1 if t >= hang_opened else None,
                ),
            ],
        ),
        ("txnwatch_collector_last_success_timestamp_seconds", "gauge", [(c, lambda t: t)]),
        (
            "txnwatch_stream_last_batch_timestamp_seconds",
            "gauge",
            [(f'{c},query="txnwatch-reconcile"', lambda t: t - 3)],
        ),
        (
            "txnwatch_open_transactions",
            "gauge",
            [
                (f'{c},kind="HANGING",two_phase_commit="false"', lambda t: 1 if t >= hang_opened else 0),
                (f'{c},kind="OPEN",two_phase_commit="false"', lambda t: 3),
            ],
        ),
        (
            "txnwatch_stream_input_rows",
            "counter",
            [(f'{c},query="txnwatch-reconcile",source="snapshots"', lambda t: 10 * (t - start))],
        ),
        (
            "up",
            "gauge",
            [(f'{c},job="txnwatch-stream"', lambda t: 1), (f'{c},job="txnwatch-collector"', lambda t: 1)],
        ),
    ]
    lines = []
    for name, kind, series in families:
        lines.append(f"# TYPE {name} {kind}")
        sample = f"{name}_total" if kind == "counter" else name
        for labels, value_at in series:
            for t in range(start, end + 1, STEP_S):
                value = value_at(t)
                if value is not None:
                    lines.append(f"{sample}{{{labels}}} {value} {t}")
    return "\n".join([*lines, "# EOF", ""])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    """A real Prometheus serving the backfilled incident; (base URL, the incident's last second)."""
    tmp = tmp_path_factory.mktemp("prometheus")
    end = int(time.time()) // STEP_S * STEP_S
    (tmp / "incident.om").write_text(openmetrics(end))
    backfill = subprocess.run(
        [
            str(ensure("promtool")),
            "tsdb",
            "create-blocks-from",
            "openmetrics",
            str(tmp / "incident.om"),
            str(tmp / "tsdb"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert backfill.returncode == 0, backfill.stdout + backfill.stderr
    (tmp / "prometheus.yml").write_text("global:\n  scrape_interval: 15s\n")
    port = free_port()
    log = (tmp / "prometheus.log").open("w")
    proc = subprocess.Popen(
        [
            str(ensure("prometheus")),
            f"--config.file={tmp / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (tmp / "prometheus.log").read_text()
            try:
                with urllib.request.urlopen(f"{base}/-/ready", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "prometheus not ready in 60 s"
            time.sleep(0.5)
        yield base, end
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def draw(prometheus: tuple[str, int], out: Path, board_path: Path = JSON_PATH) -> list[Any]:
    base, end = prometheus
    drawn = render.render_file(
        board_path, base, out, start=end - MINUTES * 60, end=end, step=STEP_S, rate_interval="1m"
    )
    return drawn  # type: ignore[no-any-return]


def test_every_panel_of_the_json_is_drawn_with_its_data(prometheus: tuple[str, int], tmp_path: Path) -> None:
    out = tmp_path / "dashboard.png"
    drawn = draw(prometheus, out)
    board = json.loads(JSON_PATH.read_text())
    assert [(d.title, d.type) for d in drawn] == [(p["title"], p["type"]) for p in board["panels"]]
    assert out.stat().st_size > 50_000
    print("\n".join(f"{d.title} [{d.type}]: {d.shows}" for d in drawn))
    tables = {d.title.split(":")[0]: d.shows for d in drawn if d.type == "table"}
    stats = {d.title: d.shows for d in drawn if d.type == "stat"}
    series = {d.title.split(":")[0]: d.shows for d in drawn if d.type == "timeseries"}

    hanging = tables["Hanging transactions now"]
    for cell in (
        "'topic': 'orders'",
        "'partition': '3', 'transactional id': 'orders-tx-1', 'producer id': '4001'",
        "coordinator-completed",
        "'LSO lag (records)': '42'",
        "'blocked groups': '2'",
    ):
        assert cell in hanging, hanging
    assert f"'txnwatch proposals show': '{HANGING_CANDIDATE}'" in hanging
    assert "'open for': '13 min'" in hanging, hanging  # opened two minutes into the fifteen
    stuck = tables["Stuck in prepare"]
    assert "'transactional id': 'payments-7'" in stuck and "'LSO lag (records)': '7'" in stuck, stuck
    assert tables["Coordinator overdue"].endswith("no row: no coordinator overdue")
    withheld = tables["Withheld (UNCONFIRMED)"]
    assert withheld.startswith("2 row(s)"), withheld
    assert "'transactional id': 'audit-1'" in withheld, withheld
    assert "'transactional id': '(none named)', 'withheld: why': 'coordinator-record-undecodable'" in withheld
    assert "'open since': '" in withheld and withheld.endswith("'LSO lag (records)': '3'}]"), withheld
    assert "'would be': 'coordinator-expired'" in withheld, withheld
    uncovered = tables["Uncovered partitions"]
    assert uncovered.startswith("2 row(s)"), uncovered
    assert "'topic': 'payments', 'partition': '5', 'reason': 'LEADER_NOT_AVAILABLE'" in uncovered, uncovered
    blocked = tables["Blocked consumer groups"]
    assert blocked.startswith("2 row(s)"), blocked
    for group in ("orders-app", "orders-audit"):
        assert f"'partition': '3', 'consumer group': '{group}', 'why': 'committed-at-lso'" in blocked, blocked
    assert stats["Hanging transactions"] == stats["Stuck in prepare"] == "1"
    assert stats["Withheld (UNCONFIRMED)"] == "2"
    assert stats["Targets up"] == "UP"
    assert stats["Since the last stream batch"] == "3 s"
    assert series["MaxActiveTransactionDuration (KIP-664)"].startswith("1 series: orders-3 13 min 13 min")


def test_a_panel_the_renderer_cannot_draw_fails_the_render(
    prometheus: tuple[str, int], tmp_path: Path
) -> None:
    board = json.loads(JSON_PATH.read_text())
    board["panels"][-1]["type"] = "gauge"
    board["panels"][8]["transformations"].append({"id": "reduce", "options": {}})
    path = tmp_path / "board.json"
    path.write_text(json.dumps(board))
    with pytest.raises(render.Unsupported) as refused:
        draw(prometheus, tmp_path / "x.png", path)
    assert "panel type 'gauge'" in str(refused.value) and "transformation reduce" in str(refused.value)
    assert not (tmp_path / "x.png").exists()
