"""detectors/ stays pure: no I/O or framework imports and no clock (STYLE.md section 1)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

DETECTORS = Path(__file__).resolve().parents[2] / "detectors"
FORBIDDEN_MODULES = frozenset(
    {
        "pyspark",
        "kafka",
        "prometheus_client",
        "socket",
        "requests",
        "urllib",
        "urllib3",
        "http",
        "subprocess",
        "threading",
        "multiprocessing",
        "asyncio",
        "time",  # no clock at all: `now_ms` is an argument
    }
)
# (module, attribute) calls that read a clock, however they are reached.
CLOCK_CALLS = frozenset(
    {
        ("time", "time"),
        ("time", "time_ns"),
        ("time", "monotonic"),
        ("time", "monotonic_ns"),
        ("time", "perf_counter"),
        ("datetime", "now"),
        ("datetime", "utcnow"),
        ("datetime", "today"),
        ("date", "today"),
    }
)


def _violations(source: str, filename: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source, filename=filename)):
        if isinstance(node, ast.Import):
            found += [f"import {a.name}" for a in node.names if a.name.split(".")[0] in FORBIDDEN_MODULES]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            root = node.module.split(".")[0]
            if root in FORBIDDEN_MODULES:
                found.append(f"from {node.module} import ...")
            for alias in node.names:
                if (node.module.split(".")[-1], alias.name) in CLOCK_CALLS:
                    found.append(f"from {node.module} import {alias.name}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", None)
            if (name, node.func.attr) in CLOCK_CALLS:
                found.append(f"{name}.{node.func.attr}()")
    return [f"{filename}:{v}" for v in found]


def detector_files() -> list[Path]:
    files = sorted(DETECTORS.rglob("*.py"))
    assert files, f"no modules under {DETECTORS}"
    return files


@pytest.mark.parametrize("path", detector_files(), ids=lambda p: p.name)
def test_detectors_module_is_pure(path: Path) -> None:
    assert _violations(path.read_text(encoding="utf-8"), path.name) == []


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        pytest.param("import time", ["import time"], id="importing-time-at-all"),
        pytest.param("import kafka.admin", ["import kafka.admin"], id="kafka-submodule"),
        pytest.param("from pyspark.sql import functions", ["from pyspark.sql import ..."], id="pyspark"),
        pytest.param("import urllib.request as u", ["import urllib.request"], id="aliased-urllib"),
        pytest.param("from datetime import datetime\ndatetime.now()", ["datetime.now()"], id="datetime-now"),
        pytest.param(
            "import datetime\ndatetime.datetime.utcnow()", ["datetime.utcnow()"], id="module-utcnow"
        ),
        pytest.param("from datetime import date\ndate.today()", ["date.today()"], id="date-today"),
        pytest.param(
            "from time import monotonic",
            ["from time import ...", "from time import monotonic"],
            id="from-time",
        ),
        pytest.param(
            "from datetime import UTC, datetime\ndatetime.fromtimestamp(0, tz=UTC)",
            [],
            id="formatting-is-fine",
        ),
    ],
)
def test_the_guard_catches_what_it_should(source: str, expected: list[str]) -> None:
    assert [v.split(":", 1)[1] for v in _violations(source, "x.py")] == expected
