"""The package split: `pip install txnwatch` (the core) runs `collect`, `inspect` and `proposals` without Spark, and
`txnwatch stream` without the stream extra says what to install (exit 1) instead of a traceback.

The core's commands run here in a Python that refuses to import the stream extra's modules (a meta path finder
first in line), as they would in a venv without them; tests/e2e/test_wheel.py installs the built wheel in a fresh
venv and runs it against a real broker.
"""

from __future__ import annotations

import ast
import json
import os
import socket
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from common.cli_options import ALL_COMMANDS

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]

# The stream extra's distributions, and the top-level modules they install (protobuf's is google.protobuf).
STREAM_EXTRA = {"pyspark", "pandas", "pyarrow", "protobuf"}
REFUSED_MODULES = ("pyspark", "py4j", "pandas", "pyarrow", "google.protobuf")
CORE_ROOMS = ("admin", "common", "detectors")

# Run in a fresh interpreter: refuse the stream extra's modules, import every module of the core's rooms and the
# console script, show every command's help, run each command against a closed port, then report as JSON.
WITHOUT_SPARK = r"""
import contextlib, importlib, io, json, pkgutil, sys

REFUSED = tuple(sys.argv[1].split(","))
CLOSED = sys.argv[2]


class RefuseStreamExtra:
    def find_spec(self, name, path=None, target=None):
        if any(name == r or name.startswith(r + ".") for r in REFUSED):
            raise ModuleNotFoundError(f"No module named {name!r} (refused by the test)", name=name)
        return None


sys.meta_path.insert(0, RefuseStreamExtra())
report = {"imported": [], "help": {}, "runs": {}}
for room in ("admin", "common", "detectors"):
    package = importlib.import_module(room)
    report["imported"].append(room)
    for info in pkgutil.walk_packages(package.__path__, room + "."):
        importlib.import_module(info.name)
        report["imported"].append(info.name)

import txnwatch_cli

report["version"] = txnwatch_cli.version_text()
commands = [
    ["collect", "--once"],
    ["stream"],
    ["inspect", "partition", "--topic", "t", "--partition", "0"],
    ["inspect", "coordinator-log"],
    ["proposals", "list"],
    ["proposals", "show", "c-1"],
    ["proposals", "abort", "c-1"],
    ["proposals", "commit", "c-1"],
    ["proposals", "watch"],
]
for argv in commands:
    name = " ".join(a for a in argv[:2] if not a.startswith("-"))
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        txnwatch_cli.main([*argv, "--help"])
    report["help"][name] = out.getvalue()
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = txnwatch_cli.main([*argv, "--bootstrap-server", CLOSED, "--timeout-ms", "500"])
    report["runs"][name] = {"code": code, "stderr": err.getvalue()}
report["loaded"] = sorted(m for m in sys.modules if any(m == r or m.startswith(r + ".") for r in REFUSED))
print(json.dumps(report))
"""


def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on: connections are refused at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def without_spark() -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TXNWATCH_")}
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_SPARK, ",".join(REFUSED_MODULES), f"127.0.0.1:{closed_port()}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return report


def project() -> dict[str, object]:
    project: dict[str, object] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return project


def distribution(requirement: str) -> str:
    return requirement.split(";")[0].split("[")[0].split("=")[0].split("<")[0].split(">")[0].strip().lower()


def test_the_core_dependencies_hold_nothing_of_spark_and_the_stream_extra_does() -> None:
    meta = project()
    core = {distribution(r) for r in meta["dependencies"]}  # type: ignore[attr-defined]
    extras: dict[str, list[str]] = meta["optional-dependencies"]  # type: ignore[assignment]
    assert not core & STREAM_EXTRA, core
    assert {distribution(r) for r in extras["stream"]} == STREAM_EXTRA
    # make test installs `.[dev]`: everything, the job included.
    assert "txnwatch[stream]" in extras["dev"]


def test_every_module_of_the_core_imports_without_the_stream_extra(without_spark: dict[str, object]) -> None:
    imported = without_spark["imported"]
    assert isinstance(imported, list)
    for room in CORE_ROOMS:
        files = {p for p in (ROOT / room).rglob("*.py") if "__pycache__" not in p.parts}
        modules = {
            ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__") for p in files
        }
        assert modules <= set(imported), modules - set(imported)
    assert without_spark["loaded"] == []
    assert "pyspark" in str(without_spark["version"])  # --version names it ("none" where not installed)


def test_no_module_of_the_core_imports_the_stream_extra_even_inside_a_function() -> None:
    """What the run above cannot reach (an import inside a function no command called): no import statement of
    the core's rooms or the console script names a module of the stream extra."""
    found = []
    for path in [ROOT / "txnwatch_cli.py", *(p for room in CORE_ROOMS for p in (ROOT / room).rglob("*.py"))]:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and node.level == 0
                else []
            )
            found += [
                f"{path.relative_to(ROOT)}:{node.lineno} {n}"
                for n in names
                if any(n == r or n.startswith(r + ".") for r in REFUSED_MODULES)
            ]
    assert found == []


@pytest.mark.parametrize("command", [c for c in ALL_COMMANDS if c != "stream"])
def test_the_core_commands_run_without_the_stream_extra(
    command: str, without_spark: dict[str, object]
) -> None:
    """Each runs to its own end against a closed port: the cluster unreachable (exit 1), in one line."""
    runs = without_spark["runs"]
    helps = without_spark["help"]
    assert isinstance(runs, dict) and isinstance(helps, dict)
    assert "exit codes:" in helps[command]
    assert runs[command]["code"] == 1, runs[command]
    stderr = runs[command]["stderr"]
    assert "127.0.0.1:" in stderr and "Traceback" not in stderr and "pyspark" not in stderr, stderr


def test_stream_without_its_extra_says_what_to_install(without_spark: dict[str, object]) -> None:
    runs = without_spark["runs"]
    helps = without_spark["help"]
    assert isinstance(runs, dict) and isinstance(helps, dict)
    assert "--checkpoint-location" in helps["stream"]  # its help needs nothing of Spark
    assert runs["stream"]["code"] == 1, runs["stream"]
    stderr = runs["stream"]["stderr"]
    assert stderr.startswith("txnwatch stream: ") and len(stderr.splitlines()) == 1, stderr
    assert "pip install 'txnwatch[stream]'" in stderr and "pyspark" in stderr, stderr
