"""The top-level Dockerfile read as text, next to tests/e2e/test_image.py which builds and runs it: its stages
and targets, that it installs what `make` installs (the same POM and Maven settings for the connector jars, the
project from pyproject.toml, the collector without the Spark side), that it runs as the non-root user the chart
expects, that every path the chart names exists in it, its version labels, and its entrypoint script run for
real from .venv: `collect --help` as the collector starts, and `driver ...` through pyspark's spark-submit as
Spark on Kubernetes starts a driver pod.
"""

from __future__ import annotations

import fnmatch
import importlib.util
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
from typing import Any

import pyspark
import pytest
import yaml

from dev import image

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
VALUES = yaml.safe_load((ROOT / "helm" / "txnwatch" / "values.yaml").read_text())
SPARK_HOME = Path(pyspark.__file__).resolve().parent
RUN_TIMEOUT_S = 120
# The checkout's jars folder (`make jars`), standing in for the image's /opt/txnwatch/jars/spark.
JARS_DIR = ROOT / ".cache" / "jars" / "spark"
KAFKA_SOURCE = "org.apache.spark.sql.kafka010.KafkaSourceProvider"


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
TARGETS = [BY_NAME["collector"], FINAL]
PYPROJECT = (ROOT / "pyproject.toml").read_text()


def _load_requirements_script() -> Any:
    """deploy/image/requirements.py, the script the Dockerfile runs (not a package of the project)."""
    spec = importlib.util.spec_from_file_location("image_requirements", ROOT / "deploy/image/requirements.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


REQUIREMENTS = _load_requirements_script()
SPARK_SIDE, distribution_name, requirements = (
    REQUIREMENTS.SPARK_SIDE,
    REQUIREMENTS.distribution_name,
    REQUIREMENTS.requirements,
)


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
    assert [s.name for s in STAGES] == [
        "jars",
        "collector-deps",
        "stream-deps",
        "wheel",
        "collector",
        "stream",
    ]
    assert (
        image.TARGETS == ("collector", "stream") and FINAL.name == "stream"
    )  # a plain build gives the chart's
    python = ARGS["PYTHON_VERSION"]
    requires = tomllib.loads(PYPROJECT)["project"]["requires-python"]
    assert requires == ">=3.11" and tuple(map(int, python.split("."))) >= (3, 11)
    # The base images are build arguments defaulting to the public images; dev/image.py passes its own.
    assert ARGS["PYTHON_IMAGE"] == "python:${PYTHON_VERSION}-slim-bookworm"
    assert "temurin-17" in ARGS["MAVEN_IMAGE"]
    assert {b.build_arg for b in image.BASES} == {"PYTHON_IMAGE", "MAVEN_IMAGE"}
    for stage in STAGES:
        assert stage.image in ("${PYTHON_IMAGE}", "${MAVEN_IMAGE}") or stage.image in BY_NAME, stage
    # Spark 4 needs Java 17+; the collector has no JVM at all.
    assert "openjdk-17-jre-headless" in FINAL.all("RUN")[0].args
    assert not any("openjdk" in r.args or "apt-get" in r.args for r in BY_NAME["collector"].all("RUN"))


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
    wheel = BY_NAME["wheel"]
    (build,) = [r for r in wheel.all("RUN") if "pip wheel" in r.args]
    assert (
        build.args.split()[-1] == "." and "--no-deps" in build.args
    )  # pyproject.toml's project, not `.[dev]`
    copied = {w.rstrip("/") for c in wheel.all("COPY") for w in c.words()[:-1]}
    assert copied == {
        "pyproject.toml",
        "README.md",
        "txnwatch_cli.py",
        "detectors",
        "common",
        "admin",
        "streaming",
    }
    # Each target installs the wheel with its extras (the collector the core package: no stream extra), index-less
    # on the dependencies its deps stage installed: one the wheel declares and the stage lacks fails the build.
    for target, deps, extras in (
        (BY_NAME["collector"], "collector-deps", "[msk]"),
        (FINAL, "stream-deps", "[stream,msk]"),
    ):
        assert copy_target(target, "/opt/venv") == "/opt/venv"
        assert any(c.flags().get("from") == deps for c in target.all("COPY") if "/opt/venv" in c.words())
        assert any(
            "pip install --no-cache-dir --no-index" in r.args and f'"${{whl}}{extras}"' in r.args
            for r in target.all("RUN")
        )
    # dev/ (the test bed) stays out: nothing the apps run imports it.
    for room in ("detectors", "common", "admin", "streaming"):
        for py in (ROOT / room).rglob("*.py"):
            assert not re.search(r"^\s*(from|import) dev\b", py.read_text(), re.M), py


def test_the_collector_gets_every_dependency_but_the_spark_side() -> None:
    project = tomllib.loads(PYPROJECT)["project"]
    deps = project["dependencies"] + project["optional-dependencies"]["stream"]
    collector, spark = requirements(PYPROJECT, "collector"), requirements(PYPROJECT, "spark")
    assert sorted(collector + spark) == sorted(deps) and not set(collector) & set(spark)
    assert {distribution_name(d) for d in spark} == SPARK_SIDE
    assert "RUN python requirements.py collector" in DOCKERFILE.read_text().replace("    && ", "RUN ")
    assert "RUN python requirements.py spark" in DOCKERFILE.read_text()
    # What the collector image runs never imports the Spark side: admin/, common/, detectors/, the console script and
    # the one module of streaming/ it loads to register `txnwatch stream` (streaming/cli.py).
    modules = "|".join(sorted(SPARK_SIDE))
    files = [
        *(ROOT / "admin").rglob("*.py"),
        *(ROOT / "common").rglob("*.py"),
        *(ROOT / "detectors").rglob("*.py"),
    ]
    files += [ROOT / "txnwatch_cli.py", ROOT / "streaming" / "cli.py"]
    for py in files:
        top_level = re.findall(rf"^(?:from|import) ({modules})\b", py.read_text(), re.M)
        assert not top_level, f"{py.relative_to(ROOT)} imports {top_level} at module level"


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
    # dev/image.py hashes exactly the build context to know when to rebuild.
    sources = {
        w.rstrip("/")
        for s in STAGES
        for c in s.all("COPY")
        if "from" not in c.flags()
        for w in c.words()[:-1]
    }

    def under(source: str, path: str) -> bool:
        return source == path or source.startswith(path + "/")

    assert all(any(under(s, p) for p in image.CONTEXT_PATHS) for s in sources), sources
    assert all(any(under(s, p) for s in sources) for p in image.CONTEXT_PATHS), image.CONTEXT_PATHS
    assert all(not dockerignored(p) for p in image.CONTEXT_PATHS)


def test_labels_carry_the_version() -> None:
    version = tomllib.loads(PYPROJECT)["project"]["version"]
    for target in TARGETS:
        args = dict(a.args.partition("=")[::2] for a in target.all("ARG"))
        assert args["VERSION"] == version == image.version()
        (label,) = target.all("LABEL")
        labels = dict(w.split("=", 1) for w in shlex.split(label.args))
        assert labels["org.opencontainers.image.version"] == "${VERSION}"
        assert labels["org.opencontainers.image.revision"] == "${REVISION}"
        assert labels["org.opencontainers.image.source"] == "${SOURCE}"
        assert labels["org.opencontainers.image.licenses"] == tomllib.loads(PYPROJECT)["project"]["license"]


def test_runs_as_the_non_root_user_the_chart_expects() -> None:
    for target in TARGETS:
        (user,) = target.all("USER")
        uid, gid = (int(x) for x in user.args.split(":"))
        assert uid != 0 and gid != 0
        # Numeric, so the kubelet can enforce runAsNonRoot without reading /etc/passwd.
        assert (uid, gid) == (
            VALUES["podSecurityContext"]["runAsUser"],
            VALUES["podSecurityContext"]["runAsGroup"],
        )
        assert "--uid 10001" in target.all("RUN")[0].args


def test_paths_the_chart_names_exist_in_the_image() -> None:
    env = FINAL.env()
    jars_dir = env["TXNWATCH_STREAM__JARS_DIR"] + "/spark"  # streaming/session.py reads <jars dir>/spark
    assert copy_target(FINAL, "/jars/spark") == jars_dir
    # The SparkApplication's class path is that folder as a Java wildcard (every jar in it, whatever its version).
    assert VALUES["job"]["sparkApplication"]["classPath"].split(":") == [f"{jars_dir}/*"]
    main_file = VALUES["job"]["sparkApplication"]["mainApplicationFile"].removeprefix("local://")
    assert copy_target(FINAL, "txnwatch_cli.py") == main_file
    assert env["SPARK_HOME"] == "/opt/venv/lib/python${PYTHON_VERSION}/site-packages/pyspark"
    assert env["PYSPARK_PYTHON"] == "/opt/venv/bin/python"
    assert env["PATH"].startswith("/opt/venv/bin:")


def test_the_charts_spark_version_is_the_one_the_image_runs() -> None:
    # The image's Spark is its pyspark (pyproject.toml's pin, the same as .venv's); the SparkApplication says so to
    # the operator. The connector jars are not named anywhere in values (a class path wildcard over the folder).
    project = tomllib.loads(PYPROJECT)["project"]
    every = [
        *project["dependencies"],
        *(d for extra in project["optional-dependencies"].values() for d in extra),
    ]
    (pin,) = {d for d in every if distribution_name(d) == "pyspark"}
    wanted = VALUES["job"]["sparkApplication"]["sparkVersion"]
    assert pin == f"pyspark=={'.'.join(wanted.split('.')[:2])}.*"
    assert pyspark.__version__ == wanted
    assert not re.search(r"\.jar\b", (ROOT / "helm" / "txnwatch" / "values.yaml").read_text())


@pytest.mark.jars
def test_the_connector_is_the_poms_one_spark_version() -> None:
    # One connector build in the folder, the POM's spark.version. It may trail the image's Spark by one minor
    # release only while that release's connector is not on Maven Central (docs/testbed.md: 4.3.0 is not, so the
    # POM resolves 4.2.0, and tests/spark runs that pair end to end).
    pom = (ROOT / "dev" / "jvm" / "spark" / "pom.xml").read_text()
    pom_version = re.search(r"<spark\.version>([^<]+)</spark\.version>", pom)
    assert pom_version
    (connector,) = JARS_DIR.glob("spark-sql-kafka-0-10_2.13-*.jar")
    assert connector.name == f"spark-sql-kafka-0-10_2.13-{pom_version.group(1)}.jar"
    spark = tuple(int(x) for x in VALUES["job"]["sparkApplication"]["sparkVersion"].split(".")[:2])
    built = tuple(int(x) for x in pom_version.group(1).split(".")[:2])
    assert built[0] == spark[0] and spark[1] - 1 <= built[1] <= spark[1], (built, spark)


def entrypoint_script() -> tuple[str, str]:
    paths = set()
    for target in TARGETS:
        (entrypoint,) = target.all("ENTRYPOINT")
        (path,) = json.loads(entrypoint.args)  # exec form: signals reach txnwatch / spark-submit directly
        (written,) = [c for c in target.all("COPY") if c.words()[-1] == path]
        assert written.flags()["chmod"] == "0755"
        paths.add((path, written.words()[0]))
    ((path, source),) = paths
    return path, (ROOT / source).read_text()


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


def class_path_here(chart_class_path: str) -> str:
    """The chart's class path with the image's jars folder replaced by the checkout's."""
    image_jars = FINAL.env()["TXNWATCH_STREAM__JARS_DIR"] + "/spark"
    return chart_class_path.replace(image_jars, str(JARS_DIR))


# Run by spark-submit's PythonRunner: asks the driver JVM's system class loader (its -cp, not spark.jars) for Spark's
# Kafka source, and prints the jar it came from.
DRIVER_PROBE = f"""
import sys
from pyspark.java_gateway import launch_gateway
jvm = launch_gateway().jvm
try:
    cls = jvm.java.lang.ClassLoader.getSystemClassLoader().loadClass("{KAFKA_SOURCE}")
except Exception as e:
    sys.exit(f"not on the class path: {{e}}")
print("loaded from", cls.getProtectionDomain().getCodeSource().getLocation().toString())
"""


@pytest.mark.jars
@pytest.mark.parametrize("with_class_path", [True, False])
def test_the_driver_gets_the_jars_folder_from_the_charts_class_path(
    entrypoint: Path, tmp_path: Path, with_class_path: bool
) -> None:
    # Spark on Kubernetes starts the driver container with `driver --properties-file <spark.properties> ...`; the
    # entrypoint runs spark-submit in client mode, whose launcher puts spark.driver.extraClassPath from that file
    # on the driver JVM's -cp (SparkSubmitCommandBuilder), where Java expands the wildcard. (A `local://` glob in
    # spark.jars is not expanded: DependencyUtils.resolveGlobPaths leaves local URIs as written.)
    assert any(JARS_DIR.glob("*.jar")), f"no jars in {JARS_DIR}: run `make jars`"
    conf = VALUES["job"]["sparkApplication"]["classPath"]
    properties = tmp_path / "spark.properties"
    lines = ["spark.master=local[1]", "spark.ui.enabled=false"]
    if with_class_path:
        lines.append(f"spark.driver.extraClassPath={class_path_here(conf)}")
    properties.write_text("\n".join(lines) + "\n")
    probe = tmp_path / "probe.py"
    probe.write_text(DRIVER_PROBE)
    done = run_entrypoint(entrypoint, "driver", "--properties-file", str(properties), str(probe))
    if with_class_path:
        assert done.returncode == 0, done.stderr[-3000:]
        assert f"loaded from file:{JARS_DIR}/spark-sql-kafka-0-10_2.13-" in done.stdout
    else:  # pyspark's own jars do not carry the connector: the class path is what brings it
        # (PythonRunner sends the Python process's stderr to its own stdout)
        assert done.returncode != 0 and "not on the class path" in done.stdout, (
            done.stdout + done.stderr[-3000:]
        )


@pytest.mark.jars
def test_executors_get_the_jars_folder_from_the_charts_class_path() -> None:
    # Spark on Kubernetes hands an executor spark.executor.extraClassPath as SPARK_CLASSPATH
    # (BasicExecutorFeatureStep), which the entrypoint's executor branch appends to its java -cp.
    # pyspark's own Kubernetes backend does so: the step names the conf and the variable, the constant's value is
    # SPARK_CLASSPATH.
    (k8s_jar,) = SPARK_HOME.glob("jars/spark-kubernetes_*.jar")
    with zipfile.ZipFile(k8s_jar) as z:
        step = z.read("org/apache/spark/deploy/k8s/features/BasicExecutorFeatureStep.class")
        assert b"EXECUTOR_CLASS_PATH" in step and b"ENV_CLASSPATH" in step
        assert b"SPARK_CLASSPATH" in z.read("org/apache/spark/deploy/k8s/Constants$.class")
    _, text = entrypoint_script()
    executor = text[text.index("executor)") :]
    cp_match = re.search(r'-cp "([^"]+)"', executor)
    assert cp_match and "${SPARK_CLASSPATH" in cp_match.group(1)

    def java_finds_the_kafka_source(spark_classpath: str) -> bool:
        env = {"PATH": os.environ["PATH"], "SPARK_HOME": str(SPARK_HOME), "SPARK_CLASSPATH": spark_classpath}
        cp = subprocess.run(
            ["bash", "-c", f'printf %s "{cp_match.group(1)}"'],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        # The class has no main method: Java says so once it found it, and "Could not find" when it did not.
        done = subprocess.run(
            ["java", "-cp", cp, KAFKA_SOURCE],
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
            check=False,
        )
        assert "Main method not found" in done.stderr or "Could not find or load main class" in done.stderr, (
            done.stderr
        )
        return "Main method not found" in done.stderr

    assert java_finds_the_kafka_source(class_path_here(VALUES["job"]["sparkApplication"]["classPath"]))
    assert not java_finds_the_kafka_source("")
