"""dev/workload.py run the way scripts run it (its CLI with --json), shared by every test tier."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _command(bootstrap: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "dev.workload", "--bootstrap-server", bootstrap, "--json", *args]


def run_workload(bootstrap: str, *args: str) -> dict[str, Any]:
    """Run a scenario to the end; returns its ground truth."""
    done = subprocess.run(
        _command(bootstrap, *args), capture_output=True, text=True, timeout=180, check=False, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def start_workload(bootstrap: str, *args: str) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    """Start a scenario that holds a transaction open (`late`); returns the process and the ground truth it
    prints while the transaction is still open. The caller waits for the process."""
    proc = subprocess.Popen(
        _command(bootstrap, *args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, proc.stderr.read() if proc.stderr else "the workload printed nothing"
    return proc, json.loads(line)
