"""The top-level Dockerfile, checked without Docker (none on these machines): its stages, that it installs what
`make` installs (the same POM and Maven settings for the connector jars, the project from pyproject.toml), that
it runs as the non-root user the chart expects, that every path the chart names exists in it, and its entrypoint
script run for real: `collect --help` as the collector starts, and `driver ...` through pyspark's spark-submit
as Spark on Kubernetes starts a driver pod.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import pyspark
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
VALUES = yaml.safe_load((ROOT / "helm" / "txnwatch" / "values.yaml").read_text())
SPARK_HOME = Path(pyspark.__file__).resolve().parent
RUN_TIMEOUT_S = 120


@dataclass
class Instruction:
    op: str
    args: str
    heredoc: str | None = None

    def flags(self) -> dict[str, str]:
        return dict(re.findall(r"--(\w+)=(\S+)", self.args))

    def words(self) -> list[str]:
        return [w for w in shlex.split(self.args) if not w.startswith("--")]


@dataclass
class Stage:
    image: str
    name: str | None
    steps: list[Instruction] = field(default_factory=list)

    def all(self, op: str) -> list[Instruction]:
        return [i for i in self.steps if i.op == op]

    def env(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for i in self.all("ENV"):
            out.update(dict(w.split("=", 1) for w in shlex.split(i.args)))
        return out


def parse(text: str) -> tuple[dict[str, str], list[Stage]]:
    """Global ARGs and stages of a Dockerfile: continuation lines joined, comments dropped, heredocs kept."""
    args: dict[str, str] = {}
    stages: list[Stage] = []
    lines = iter(text.splitlines())
    for line in lines:
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        while line.endswith("\\"):
            line = line[:-1] + " " + next(lines).strip()
        op, _, rest = line.strip().partition(" ")
        heredoc = None
        if m := re.search(r"<<-?'?(\w+)'?", rest):
            body = []
            for body_line in lines:
                if body_line == m.group(1):
                    break
                body.append(body_line)
            heredoc = "\n".join(body) + "\n"
        step = Instruction(op.upper(), rest.strip(), heredoc)
        if step.op == "FROM":
            image, _, name = step.args.partition(" AS ")
            stages.append(Stage(image.strip(), name.strip() or None))
        elif not stages:
            assert step.op == "ARG", step
            key, _, default = step.args.partition("=")
            args[key] = default
        else:
            stages[-1].steps.append(step)
    return args, stages


ARGS, STAGES = parse(DOCKERFILE.read_text())
FINAL = STAGES[-1]
BY_NAME = {s.name: s for s in STAGES if s.name}


def copy_target(stage: Stage, source: str) -> str:
    for c in stage.all("COPY"):
        words = c.words()
        if source in words[:-1]:
            return words[-1]
    raise AssertionError(f"nothing copies {source}")


def dockerignored(path: str) -> bool:
    """Whether .dockerignore leaves `path` out of the build context (last matching pattern wins)."""
    ignored = False
    for raw in (ROOT / ".dockerignore").read_text().splitlines():
        pattern = raw.strip()
        if not pattern or pattern.startswith("#"):
            continue
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/")
        if fnmatch.fnmatch(path, pattern) or path.startswith(pattern + "/"):
            ignored = not negate
    return ignored


def test_stages_and_base_images() -> None:
    assert [s.name for s in STAGES] == ["jars", "venv", None]
    python = ARGS["PYTHON_VERSION"]
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert requires == ">=3.11" and tuple(map(int, python.split("."))) >= (3, 11)
    assert BY_NAME["venv"].image == FINAL.image == "python:${PYTHON_VERSION}-slim-bookworm"
    # Spark 4 needs Java 17+.
    assert "openjdk-17-jre-headless" in FINAL.all("RUN")[0].args
    assert "temurin-17" in BY_NAME["jars"].image


def test_it_resolves_the_jars_as_make_does() -> None:
    makefile = (ROOT / "Makefile").read_text()
    mvn = re.search(r"^MVN\s*:=\s*(.+)$", makefile, re.M)
    recipe = re.search(r"^\t\$\(MVN\) (-f dev/jvm/spark/pom.xml .+)$", makefile, re.M)
    assert mvn and recipe
    make_cmd = shlex.split(mvn.group(1)) + shlex.split(recipe.group(1).replace("$(abspath $(JARS))", "JARS"))
    (run,) = BY_NAME["jars"].all("RUN")
    docker_cmd = shlex.split(run.args)
    strip = lambda cmd: [w for w in cmd if not w.startswith("-DoutputDirectory=")]  # noqa: E731
    assert strip(docker_cmd) == strip(make_cmd)
    out = next(w for w in docker_cmd if w.startswith("-DoutputDirectory=")).split("=", 1)[1]
    assert copy_target(FINAL, out) == "/opt/txnwatch/jars/spark"


def test_it_installs_the_project_without_dev_tools() -> None:
    venv = BY_NAME["venv"]
    (install,) = [r for r in venv.all("RUN") if "pip install" in r.args]
    assert install.args.split()[-1] == "."  # pyproject.toml's runtime dependencies, not `.[dev]`, not -e
    copied = {w.rstrip("/") for c in venv.all("COPY") for w in c.words()[:-1]}
    assert copied == {"pyproject.toml", "README.md", "txnwatch_cli.py", "detectors", "admin", "streaming"}
    # dev/ (the test bed) stays out: nothing the apps run imports it.
    for room in ("detectors", "admin", "streaming"):
        for py in (ROOT / room).rglob("*.py"):
            assert not re.search(r"^\s*(from|import) dev\b", py.read_text(), re.M), py


def test_copied_paths_exist_and_reach_the_build_context() -> None:
    for stage in STAGES:
        for c in stage.all("COPY"):
            if "from" in c.flags() or c.heredoc is not None:
                continue
            for source in c.words()[:-1]:
                path = source.rstrip("/")
                assert (ROOT / path).exists(), f"COPY {source}: no such path"
                assert not dockerignored(path), f"COPY {source}: left out by .dockerignore"
    assert dockerignored(".venv") and dockerignored(".cache") and dockerignored("tests")


def test_runs_as_the_non_root_user_the_chart_expects() -> None:
    (user,) = FINAL.all("USER")
    uid, gid = (int(x) for x in user.args.split(":"))
    assert uid != 0 and gid != 0
    # Numeric, so the kubelet can enforce runAsNonRoot without reading /etc/passwd.
    assert (uid, gid) == (
        VALUES["podSecurityContext"]["runAsUser"],
        VALUES["podSecurityContext"]["runAsGroup"],
    )
    assert "--uid 10001" in FINAL.all("RUN")[0].args


def test_paths_the_chart_names_exist_in_the_image() -> None:
    env = FINAL.env()
    jars_dir = env["TXNWATCH_STREAM__JARS_DIR"] + "/spark"  # streaming/session.py reads <jars dir>/spark
    assert copy_target(FINAL, "/jars/spark") == jars_dir
    assert {
        str(Path(j.removeprefix("local://")).parent)
        for j in VALUES["job"]["sparkApplication"]["connectorJars"]
    } == {jars_dir}
    main_file = VALUES["job"]["sparkApplication"]["mainApplicationFile"].removeprefix("local://")
    assert copy_target(FINAL, "txnwatch_cli.py") == main_file
    assert env["SPARK_HOME"] == "/opt/venv/lib/python${PYTHON_VERSION}/site-packages/pyspark"
    assert env["PYSPARK_PYTHON"] == "/opt/venv/bin/python"
    assert env["PATH"].startswith("/opt/venv/bin:")


def entrypoint_script() -> tuple[str, str]:
    (entrypoint,) = FINAL.all("ENTRYPOINT")
    (path,) = json.loads(entrypoint.args)  # exec form: signals reach txnwatch / spark-submit directly
    (written,) = [c for c in FINAL.all("COPY") if c.heredoc is not None and c.words()[-1] == path]
    assert written.flags()["chmod"] == "0755"
    assert written.heredoc is not None
    return path, written.heredoc


@pytest.fixture
def entrypoint(tmp_path: Path) -> Path:
    _, text = entrypoint_script()
    script = tmp_path / "entrypoint.sh"
    script.write_text(text)
    script.chmod(0o755)
    return script


def run_entrypoint(script: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "SPARK_HOME": str(SPARK_HOME),
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "SPARK_DRIVER_BIND_ADDRESS": "127.0.0.1",
        "SPARK_LOCAL_IP": "127.0.0.1",
    }
    return subprocess.run(
        [str(script), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )


def test_entrypoint_is_valid_bash_and_runs_txnwatch(entrypoint: Path) -> None:
    assert subprocess.run(["bash", "-n", str(entrypoint)], check=False).returncode == 0
    done = run_entrypoint(entrypoint, "collect", "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: txnwatch collect")
    (cmd,) = FINAL.all("CMD")
    assert run_entrypoint(entrypoint, *json.loads(cmd.args)).returncode == 0


def test_entrypoint_starts_a_driver_as_spark_on_kubernetes_does(entrypoint: Path) -> None:
    # The container args of a Spark driver pod: `driver --properties-file ... --class PythonRunner <main> <args>`.
    # (spark-submit here runs the Python application, so it needs the main file given as the operator does.)
    done = run_entrypoint(
        entrypoint,
        "driver",
        "--master",
        "local[1]",
        "--conf",
        "spark.ui.enabled=false",
        str(ROOT / "txnwatch_cli.py"),
        "stream",
        "--help",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "usage: txnwatch stream" in done.stdout


def test_entrypoint_starts_executors_with_a_class_pyspark_ships() -> None:
    _, text = entrypoint_script()
    (cls,) = re.findall(r"org\.apache\.spark\.scheduler\.cluster\.k8s\.\w+", text)
    (jar,) = SPARK_HOME.glob("jars/spark-kubernetes_*.jar")
    with zipfile.ZipFile(jar) as z:
        assert cls.replace(".", "/") + ".class" in z.namelist()
