"""`txnwatch stream` before Spark starts: an unreachable cluster is one clear line, and the sessions it builds
draw no console progress bars."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def test_stream_against_an_unreachable_cluster_fails_with_one_line(tmp_path: Path) -> None:
    # Port 1 on loopback refuses at once; nothing listens there.
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "txnwatch_cli",
            "stream",
            "--bootstrap-server",
            "127.0.0.1:1",
            "--checkpoint-location",
            str(tmp_path / "ck"),
            "--seconds",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if not k.startswith("TXNWATCH_")},
    )
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("txnwatch stream: ") and "127.0.0.1:1" in lines[0]
    assert done.stdout == ""
    assert not (tmp_path / "ck").exists()  # it stopped before Spark or the job touched anything


class _Builder:
    """Records what build_session configures instead of starting a JVM."""

    def __init__(self) -> None:
        self.conf: dict[str, str] = {}

    def master(self, _master: str) -> _Builder:
        return self

    def appName(self, _name: str) -> _Builder:
        return self

    def config(self, key: str, value: str) -> _Builder:
        self.conf[key] = value
        return self

    def getOrCreate(self) -> dict[str, str]:
        return self.conf


def _built_conf(monkeypatch: pytest.MonkeyPatch, extra: dict[str, str] | None = None) -> Any:
    from streaming import session

    class FakeSparkSession:
        builder = _Builder()

    # build_session sets these for Spark's Python workers; monkeypatch puts them back afterwards.
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    monkeypatch.setattr(session, "SparkSession", FakeSparkSession)
    return session.build_session(master="local[1]", extra_conf=extra, jars=[])


def test_sessions_draw_no_console_progress_bars(monkeypatch: pytest.MonkeyPatch) -> None:
    # The bars overwrite the console view's lines and fill logs with carriage returns.
    assert _built_conf(monkeypatch)["spark.ui.showConsoleProgress"] == "false"
    # --conf still wins, for someone who wants them back
    on = _built_conf(monkeypatch, {"spark.ui.showConsoleProgress": "true"})
    assert on["spark.ui.showConsoleProgress"] == "true"
