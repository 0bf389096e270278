"""The house's walls (STYLE.md section 1): detectors/ stays pure (no I/O or framework imports, no clock), admin/
and streaming/ never import each other, and detectors/ imports neither."""

from __future__ import annotations

import ast
import re
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


# ------------------------------------------------------------------------------------- application plumbing

# What belongs to the apps or common/, never to the domain, found by grepping the text (comments and docstrings
# too: a domain module that talks about reading the environment is already doing an app's job). The AST guard
# above sees imports and calls; this one also sees a name reached some other way (`getattr(os, "environ")` aside).
PLUMBING: dict[str, re.Pattern[str]] = {
    "argparse": re.compile(r"\bargparse\b"),
    "the environment": re.compile(r"\bos\.environ\b|\bgetenv\b|\benviron\["),
    "logging handlers or filters": re.compile(
        r"\blogging\.(Handler|Filter|handlers|StreamHandler|FileHandler)\b|\badd(Handler|Filter)\b|\bhandlers\b"
    ),
    "sockets": re.compile(r"\bsocket\b"),
    "a clock": re.compile(r"\btime\.(time|time_ns|monotonic|monotonic_ns|perf_counter)\b"),
}


def _plumbing(source: str, filename: str) -> list[str]:
    return [
        f"{filename}:{number}: {what}"
        for number, line in enumerate(source.splitlines(), 1)
        for what, pattern in PLUMBING.items()
        if pattern.search(line)
    ]


@pytest.mark.parametrize("path", detector_files(), ids=lambda p: p.name)
def test_detectors_has_no_application_plumbing(path: Path) -> None:
    # Settings, flags, client properties and log redaction live in common/ (issue 23); the domain takes values.
    assert _plumbing(path.read_text(encoding="utf-8"), path.name) == []


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        pytest.param("import argparse", ["x.py:1: argparse"], id="argparse"),
        pytest.param("import os\nx = os.environ.get('A')", ["x.py:2: the environment"], id="os-environ"),
        pytest.param("from os import getenv", ["x.py:1: the environment"], id="getenv"),
        pytest.param(
            "class F(logging.Filter):\n    pass", ["x.py:1: logging handlers or filters"], id="logging-filter"
        ),
        pytest.param(
            "import logging.handlers", ["x.py:1: logging handlers or filters"], id="logging-handlers"
        ),
        pytest.param("h.addFilter(f)", ["x.py:1: logging handlers or filters"], id="add-filter"),
        pytest.param("import socket", ["x.py:1: sockets"], id="socket"),
        pytest.param("t = time.monotonic()", ["x.py:1: a clock"], id="monotonic"),
        pytest.param("now = time.time()", ["x.py:1: a clock"], id="time-time"),
        pytest.param("environment_ms = 1\ntimeout = now_ms - since_ms", [], id="names-that-only-look-alike"),
    ],
)
def test_the_plumbing_grep_catches_what_it_should(source: str, expected: list[str]) -> None:
    assert _plumbing(source, "x.py") == expected


# ----------------------------------------------------------------------------------------------- rooms

ROOT = DETECTORS.parent
# Each room and the rooms it must never import: admin/ and streaming/ stand side by side on common/ (what both apps
# share: settings, flags, topics) and detectors/ (the domain), which imports no other room; common/ may use the
# domain but neither app (txnwatch_cli.py alone knows both apps). The import-linter contracts in pyproject.toml
# (`make lint`) say the same; this test also sees lazy imports and `import_module("...")` by name.
ROOMS: dict[str, frozenset[str]] = {
    "admin": frozenset({"streaming"}),
    "streaming": frozenset({"admin"}),
    "common": frozenset({"admin", "streaming"}),
    "detectors": frozenset({"admin", "streaming", "common"}),
}
IMPORT_FUNCTIONS = frozenset({"import_module", "__import__"})


def _imported_modules(source: str, filename: str, package: str) -> list[str]:
    """Every module a file imports: `import x`, `from x import y`, relative imports resolved against `package`,
    and `importlib.import_module("x")` / `__import__("x")` with a literal name, wherever they stand."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source, filename=filename)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = parts[: len(parts) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            # `from . import streaming` at the top level names a module too.
            found += [module] + [f"{module}.{a.name}" for a in node.names if not node.module]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in IMPORT_FUNCTIONS and isinstance(node.args[0].value, str):
                found.append(node.args[0].value)
    return found


def _room_violations(source: str, filename: str, package: str) -> list[str]:
    forbidden = ROOMS[package.split(".")[0]]
    return [
        f"{filename}: imports {m}"
        for m in _imported_modules(source, filename, package)
        if m.split(".")[0] in forbidden
    ]


def room_files() -> list[tuple[str, Path]]:
    files = [(room, path) for room in ROOMS for path in sorted((ROOT / room).rglob("*.py"))]
    for room in ROOMS:
        assert any(r == room for r, _ in files), f"no modules under {ROOT / room}"
    return files


@pytest.mark.parametrize(("room", "path"), room_files(), ids=lambda x: x if isinstance(x, str) else x.name)
def test_rooms_never_import_each_other(room: str, path: Path) -> None:
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    assert _room_violations(path.read_text(encoding="utf-8"), path.name, package) == []


@pytest.mark.parametrize(
    ("source", "package", "expected"),
    [
        pytest.param("import streaming.job", "admin", ["x.py: imports streaming.job"], id="import"),
        pytest.param("from streaming import job", "admin", ["x.py: imports streaming"], id="from-import"),
        pytest.param(
            "def f():\n    from admin.wire.connect import connect_admin",
            "streaming",
            ["x.py: imports admin.wire.connect"],
            id="lazy-import-inside-a-function",
        ),
        pytest.param("from ..admin import cli", "streaming", ["x.py: imports admin"], id="relative-import"),
        pytest.param(
            "import importlib\nimportlib.import_module('streaming.cli')",
            "admin",
            ["x.py: imports streaming.cli"],
            id="import-module-by-name",
        ),
        pytest.param(
            "from admin.x import y", "detectors", ["x.py: imports admin.x"], id="detectors-imports-no-room"
        ),
        pytest.param(
            "from common.settings import Settings",
            "detectors",
            ["x.py: imports common.settings"],
            id="domain-no-app",
        ),
        pytest.param(
            "from admin import cli", "common", ["x.py: imports admin"], id="common-serves-both-apps"
        ),
        pytest.param("from detectors.models import Snapshot", "admin", [], id="detectors-is-for-everyone"),
        pytest.param("from common.settings import Settings", "streaming", [], id="common-is-for-both-apps"),
        pytest.param("from . import seams", "admin", [], id="own-room-relative"),
        pytest.param("import streamingish", "admin", [], id="a-name-that-only-starts-alike"),
    ],
)
def test_the_room_guard_catches_what_it_should(source: str, package: str, expected: list[str]) -> None:
    assert _room_violations(source, "x.py", package) == expected


# ----------------------------------------------------------------------------------------- no asserts


def _asserts(source: str, filename: str) -> list[str]:
    return [
        f"{filename}:{n.lineno}"
        for n in ast.walk(ast.parse(source, filename=filename))
        if isinstance(n, ast.Assert)
    ]


@pytest.mark.parametrize(
    "path",
    [p for _, p in room_files()] + [ROOT / "txnwatch_cli.py"],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_no_assert_in_the_rooms(path: Path) -> None:
    # `python -O` strips assert statements: a check the program relies on must be an explicit `if` (issue 10
    # found `assert publisher is not None` in admin/cli/main.py). Tests assert; the rooms do not.
    assert _asserts(path.read_text(encoding="utf-8"), path.name) == []


def test_the_assert_guard_sees_asserts_anywhere() -> None:
    assert _asserts("def f(x):\n    if x:\n        assert x is not None, 'y'\n", "x.py") == ["x.py:3"]
