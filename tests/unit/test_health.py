"""The probes' decisions (detectors/health.py), the collector's /healthz and /readyz over real HTTP with a clock
the test turns (admin/collect/metrics.py, admin/collect/collector.py `run`), and `txnwatch --version`."""

from __future__ import annotations

import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest

from admin.collect.collector import SWEEP_BACKOFF_MAX_S, loop_health, run
from admin.collect.metrics import CollectorMetrics, LoopHealth, serve
from common.settings import CollectorSettings
from detectors.health import (
    NOT_INSTALLED,
    ProbeAnswer,
    Progress,
    build_info,
    collector_windows,
    interval_ms,
    loop_turning,
    probe_response,
    progress_recent,
    stream_ready_within_ms,
)

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------------ pure decisions


@pytest.mark.parametrize(
    ("last_turn_ms", "now_ms", "ok"),
    [
        pytest.param(1_000, 1_000, True, id="just-turned"),
        pytest.param(1_000, 31_000, True, id="at-the-limit-still-live"),
        pytest.param(1_000, 31_001, False, id="past-the-limit-stalled"),
    ],
)
def test_a_loop_is_live_while_it_turned_within_the_limit(last_turn_ms: int, now_ms: int, ok: bool) -> None:
    answer = loop_turning(last_turn_ms=last_turn_ms, now_ms=now_ms, stall_after_ms=30_000)
    assert answer.ok is ok
    assert ("stalled" in answer.reason) is not ok
    assert "\n" not in answer.reason


def test_readiness_names_what_has_not_moved() -> None:
    never = progress_recent([Progress("sweep published", None, 5_000)], now_ms=10_000)
    assert never == ProbeAnswer(False, "not ready: no sweep published yet")
    fresh = Progress("reconcile batch", 9_000, 5_000)
    stale = Progress("windows batch", 2_000, 5_000)
    answer = progress_recent([fresh, stale], now_ms=10_000)
    assert (
        not answer.ok and "windows batch 8.0s ago" in answer.reason and "ready within 5.0s" in answer.reason
    )
    assert progress_recent([fresh], now_ms=14_000).ok
    assert not progress_recent([fresh], now_ms=14_001).ok
    with pytest.raises(ValueError):
        progress_recent([], now_ms=0)


def test_the_collector_windows_follow_interval_and_request_timeout() -> None:
    ready, stall = collector_windows(
        interval_s=10, longest_pause_s=10, request_timeout_ms=15_000, ready_intervals=3, stall_after_s=None
    )
    assert ready == 45_000  # three intervals and one sweep's own time
    assert stall == 10_000 + 10 * 15_000  # the longest pause and a sweep of timed-out requests
    _, fixed = collector_windows(
        interval_s=10, longest_pause_s=10, request_timeout_ms=15_000, ready_intervals=3, stall_after_s=42
    )
    assert fixed == 42_000
    # The collector's own settings reach the same numbers, with its failure backoff as the longest pause.
    health = loop_health(CollectorSettings(interval_s=1, request_timeout_ms=2_000))
    assert health.ready_within_ms == 3_000 + 2_000
    assert health.stall_after_ms == round(SWEEP_BACKOFF_MAX_S * 1000) + 10 * 2_000


def test_a_stream_query_may_take_its_triggers_plus_slack() -> None:
    assert stream_ready_within_ms(trigger_ms=5_000, ready_intervals=3, slack_s=60) == 75_000


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("5 seconds", 5_000),
        ("1 second", 1_000),
        ("interval 1 minute 30 seconds", 90_000),
        ("500ms", 500),
        ("2 MINUTES", 120_000),
        ("0.5 s", 500),
        ("fast", None),
        ("5 fortnights", None),
        ("", None),
        ("5 seconds and more", None),
    ],
)
def test_spark_trigger_intervals_are_read(text: str, ms: int | None) -> None:
    assert interval_ms(text) == ms


def test_probe_paths_answer_200_or_503_with_one_line() -> None:
    up = ProbeAnswer(True, "live: fine")
    down = ProbeAnswer(False, "not ready: no sweep published yet")
    assert probe_response("/healthz", live=lambda: up, ready=lambda: down) == ("200 OK", b"live: fine\n")
    assert probe_response("/readyz", live=lambda: up, ready=lambda: down) == (
        "503 Service Unavailable",
        b"not ready: no sweep published yet\n",
    )
    assert probe_response("/metrics", live=lambda: up, ready=lambda: down) is None


def test_build_info_labels_say_none_for_what_is_not_installed() -> None:
    def version_of(name: str) -> str:
        if name == "pyspark":
            raise metadata.PackageNotFoundError(name)
        return {"txnwatch": "1.2.3", "kafka-python": "3.0.12"}[name]

    assert build_info(version_of, "3.11.2") == {
        "version": "1.2.3",
        "python": "3.11.2",
        "pyspark": NOT_INSTALLED,
        "kafka_python": "3.0.12",
    }


# --------------------------------------------------------------- the collector's endpoint, over HTTP


class Clock:
    def __init__(self) -> None:
        self.s = 1_000.0

    def __call__(self) -> float:
        return self.s


@pytest.fixture
def endpoint() -> Iterator[tuple[str, LoopHealth, Clock]]:
    clock = Clock()
    health = LoopHealth(ready_within_ms=5_000, stall_after_ms=30_000, monotonic=clock)
    server = serve(CollectorMetrics(), 0, "127.0.0.1", health=health)
    try:
        yield f"http://127.0.0.1:{server.server_port}", health, clock
    finally:
        server.shutdown()
        server.server_close()


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_the_collector_endpoint_serves_probes_beside_metrics(endpoint: tuple[str, LoopHealth, Clock]) -> None:
    url, health, clock = endpoint
    assert get(f"{url}/healthz") == (200, "live: the loop turned 0.0s ago\n")
    assert get(f"{url}/readyz") == (503, "not ready: no sweep published yet\n")
    health.published()
    clock.s += 4
    assert get(f"{url}/readyz")[0] == 200
    clock.s += 2  # 6 s since the sweep: past the 5 s window
    status, body = get(f"{url}/readyz")
    assert status == 503 and body.startswith("not ready: last sweep published 6.0s ago")
    clock.s += 30  # 36 s without a turn
    status, body = get(f"{url}/healthz")
    assert status == 503 and body.startswith("stalled:")
    health.turned()
    assert get(f"{url}/healthz")[0] == 200
    status, text = get(f"{url}/metrics")
    assert status == 200 and "txnwatch_collector_sweep_failures_total" in text
    assert f'txnwatch_build_info{{kafka_python="{metadata.version("kafka-python")}"' in text


def test_the_sweep_loop_reports_turns_and_published_sweeps() -> None:
    clock = Clock()
    health = LoopHealth(ready_within_ms=5_000, stall_after_ms=30_000, monotonic=clock)
    turns: list[str] = []

    class Failing:
        def sweep(self) -> Any:
            turns.append("sweep")
            raise RuntimeError("no metadata")

    run(Failing(), lambda _r: None, interval_s=0, stop=threading.Event(), max_sweeps=2, health=health)  # type: ignore[arg-type]
    assert turns == ["sweep", "sweep"]
    assert health.live().ok and not health.ready().ok  # it turns, but publishes nothing

    class Working:
        def sweep(self) -> Any:
            return object()

    run(Working(), lambda _r: None, interval_s=0, stop=threading.Event(), max_sweeps=1, health=health)  # type: ignore[arg-type]
    assert health.ready().ok


def test_build_info_is_exposed_with_the_installed_versions() -> None:
    text = generate_latest(CollectorMetrics().registry).decode()
    line = next(x for x in text.splitlines() if x.startswith("txnwatch_build_info{"))
    assert f'version="{metadata.version("txnwatch")}"' in line and line.endswith(" 1.0")
    assert f'pyspark="{metadata.version("pyspark")}"' in line and 'python="' in line


# ---------------------------------------------------------------------------------- txnwatch --version


def test_version_prints_what_runs_and_exits_0_without_loading_spark() -> None:
    code = (
        "import sys, txnwatch_cli\n"
        "try:\n"
        "    txnwatch_cli.main(['--version'])\n"
        "except SystemExit as exc:\n"
        "    print('exit', exc.code, 'pyspark' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    lines = done.stdout.splitlines()
    assert lines == [
        f"txnwatch {metadata.version('txnwatch')}",
        f"python {sys.version.split()[0]}",
        f"pyspark {metadata.version('pyspark')}",
        f"kafka-python {metadata.version('kafka-python')}",
        "exit 0 False",
    ], done.stderr
    console = subprocess.run(
        [sys.executable, "-m", "txnwatch_cli", "--version"], cwd=ROOT, capture_output=True, timeout=60
    )
    assert console.returncode == 0 and console.stdout.decode().splitlines() == lines[:4]
