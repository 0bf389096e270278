"""The package as a user installs it: the wheel and the sdist built with `python -m build`, the wheel installed in a
fresh venv with its core dependencies (no stream extra), and its commands run from there against the session
broker: `txnwatch --version`, `collect --once` (it sees a real orphan), `proposals list` (it lists the orphan's
candidate) and `stream` (it says what to install). Spark is not importable in that venv.

The venv is made without pip (`venv --without-pip`, fast) and filled by this venv's pip (`pip --python`), from the
package index through the pip cache.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import time
import tomllib
import uuid
import zipfile
from pathlib import Path

import pytest
from workloads import Proposals, plan_by_hand, run_workload

from admin.wire.kafka_wire import KafkaWire

pytestmark = pytest.mark.broker

ROOT = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
CLUSTER = "wheel-test"
# Installing the wheel and the core's dependencies into an empty venv (about 20 s here with a warm pip cache, on
# 2 shared cores).
INSTALL_LIMIT_S = 60.0
RUN_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The sdist and the wheel, as `python -m build` makes them (the wheel is built from the sdist, so an sdist
    that misses a file fails here)."""
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (sdist,) = out.glob("txnwatch-*.tar.gz")
    (wheel,) = out.glob("txnwatch-*.whl")
    return sdist, wheel


@pytest.fixture(scope="module")
def venv(dists: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv holding the wheel and the core's dependencies only (`pip install txnwatch`)."""
    _, wheel = dists
    root = tmp_path_factory.mktemp("wheel-venv") / "venv"
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=60)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(root / "bin" / "python"), "install", "-q", str(wheel)],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    took_s = time.monotonic() - started
    assert done.returncode == 0, done.stderr[-3000:]
    print(f"\nfresh venv with the wheel and its core dependencies in {took_s:.1f} s")
    assert took_s < INSTALL_LIMIT_S
    return root


def clean_env() -> dict[str, str]:
    """This process's environment without TXNWATCH_* and PYTHONPATH: a Spark session built earlier in the same
    pytest process puts the checkout on PYTHONPATH (streaming/session.py), and pip then found txnwatch already
    installed and left the fresh venv without it."""
    return {k: v for k, v in os.environ.items() if not k.startswith("TXNWATCH_") and k != "PYTHONPATH"}


def run(venv: Path, workdir: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """A command of the venv (`txnwatch`, `python`), run in `workdir`: not the checkout, so nothing of it can be
    imported by accident."""
    return subprocess.run(
        [str(venv / "bin" / argv[0]), *argv[1:]],
        cwd=workdir,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )


def test_the_sdist_and_the_wheel_hold_the_rooms_and_the_core_requires_no_spark(
    dists: tuple[Path, Path],
) -> None:
    sdist, wheel = dists
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert {
        "pyproject.toml",
        "README.md",
        "txnwatch_cli.py",
        "streaming/job.py",
        "admin/cli/main.py",
    } <= names
    with zipfile.ZipFile(wheel) as whl:
        files = set(whl.namelist())
        (meta,) = [n for n in files if n.endswith(".dist-info/METADATA")]
        requires = [
            line.removeprefix("Requires-Dist: ")
            for line in whl.read(meta).decode().splitlines()
            if line.startswith("Requires-Dist: ")
        ]
    assert {"txnwatch_cli.py", "detectors/py.typed", "common/py.typed", "streaming/cli.py"} <= files
    spark_side = [r for r in requires if r.split()[0].split("=")[0].split(">")[0] in {"pyspark", "pandas"}]
    assert spark_side and all('extra == "stream"' in r for r in spark_side), requires


def test_the_installed_wheel_runs_without_spark(venv: Path, tmp_path: Path) -> None:
    done = run(venv, tmp_path, "txnwatch", "--version")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert f"txnwatch {VERSION}" in lines and "pyspark none" in lines, done.stdout
    probe = (
        "import importlib.util, json, admin; "
        "print(json.dumps([admin.__file__, [m for m in ('pyspark', 'pandas', 'pyarrow', 'py4j') "
        "if importlib.util.find_spec(m) is not None]]))"
    )
    done = run(venv, tmp_path, "python", "-c", probe)
    assert done.returncode == 0, done.stderr
    admin_file, importable = json.loads(done.stdout)
    assert admin_file.startswith(str(venv)), admin_file  # the installed package, not the checkout
    assert importable == []
    done = run(venv, tmp_path, "python", "-c", "import pyspark")
    assert done.returncode == 1 and "ModuleNotFoundError: No module named 'pyspark'" in done.stderr


def test_collect_and_proposals_from_the_wheel_against_a_real_broker(
    venv: Path, tmp_path: Path, bootstrap: str, wire: KafkaWire
) -> None:
    prefix = f"whl{uuid.uuid4().hex[:8]}"
    truth = run_workload(bootstrap, "--scenario", "hanging", "--topic-prefix", f"{prefix}-hang-")
    (orphan,) = [t for t in truth["transactions"] if t["kind"] == "hanging"]
    common = ("--bootstrap-server", bootstrap, "--cluster", CLUSTER, "--topic-prefix", prefix)

    done = run(
        venv, tmp_path, "txnwatch", "collect", "--once", *common, "--output", "json", "--metrics-port", "0"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    sweep = json.loads(done.stdout)
    seen = [
        (s["topic"], s["partition"], t["producer_id"], t["start_offset"])
        for s in sweep["snapshots"]
        for t in s["open_transactions"]
    ]
    assert (orphan["topic"], orphan["partition"], orphan["producer_id"], orphan["start_offset"]) in seen, seen

    proposals = Proposals(bootstrap, prefix, cluster=CLUSTER)
    candidate = plan_by_hand(
        wire, orphan["topic"], orphan["partition"], orphan["producer_id"], cluster=CLUSTER
    )
    proposals.publish(candidate)
    done = run(venv, tmp_path, "txnwatch", "proposals", "list", *common, "--output", "json", "--fail-if-any")
    assert done.returncode == 6, done.stderr[-3000:]  # candidates-listed
    assert [c["candidate_id"] for c in json.loads(done.stdout)] == [candidate.candidate_id]


def test_stream_from_the_wheel_says_to_install_the_stream_extra(
    venv: Path, tmp_path: Path, bootstrap: str
) -> None:
    done = run(venv, tmp_path, "txnwatch", "stream", "--bootstrap-server", bootstrap)
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("txnwatch stream: ") and "pip install 'txnwatch[stream]'" in done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
