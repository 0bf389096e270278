"""Every command block of README.md and docs/deploy.md runs here, as far as it can without a cluster.

The blocks are read from the Markdown itself (every fenced block), so a doc cannot drift from what is checked:
- `helm install` becomes `helm template` with the same release, namespace and `--set` values, and every rendered
  object goes through kubeconform -strict (with the CRDs, as tests/ops/test_helm_chart.py does);
- the `kubectl create` objects of the same block are built as kubectl would and validated with it; a Secret must be
  in the release's namespace and mounted by the chart's collector, or the apps run without it;
- a values block (YAML) is rendered with the README's required values and validated the same way;
- `txnwatch ...` and `python -m dev.workload ...` lines are parsed by the real argument parsers (placeholders
  such as ID, T, P and O filled in), `txnwatch --version` runs;
- `make X` names a Makefile target; `docker build`/`push` (no Docker engine here) tag the project's version and
  build a target the Dockerfile has; `.venv/bin/pytest FILE` names a test file.
A command of any other kind fails the test until it is given a check here.
"""

from __future__ import annotations

import base64
import re
import shlex
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from helm_support import CHART, CRD_API_VERSIONS, Helm, Rendered, helm, kubeconform, rendered
from k8s_schemas import KUBERNETES_VERSION

import txnwatch_cli
from dev import workload

ROOT = Path(__file__).resolve().parents[2]
DOCS = ("README.md", "docs/deploy.md")
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
YAML_LINE = re.compile(r"^\s*[\w.-]+:(\s|$)")
# What the docs write for a value the reader supplies, and what stands for it in the parsers.
PLACEHOLDERS = {"ID": "c-0123", "T": "orders", "P": "0", "O": "100", "PORT": "9092"}
# Where a block of Spark confs goes in the values: the key the text before it names (deploy.md, s3a keys).
SPARK_CONF_VALUES = ("job", "sparkApplication", "sparkConf")
BOOTSTRAP_ENV = "TXNWATCH_KAFKA__BOOTSTRAP_SERVERS"


@dataclass(frozen=True)
class Block:
    doc: str
    line: int
    text: str

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}"


def blocks() -> list[Block]:
    found = []
    for doc in DOCS:
        text = (ROOT / doc).read_text(encoding="utf-8")
        for m in FENCE.finditer(text):
            found.append(Block(doc, text[: m.start()].count("\n") + 1, m.group(1)))
    return found


def is_values(block: Block) -> bool:
    lines = [line for line in block.text.splitlines() if line.strip()]
    return bool(lines) and all(YAML_LINE.match(line) for line in lines)


def commands(block: Block) -> Iterator[list[str]]:
    """Each command of a shell block as argv: continuation lines joined, comments dropped, `&&` split."""
    for line in block.text.replace("\\\n", " ").splitlines():
        argv: list[str] = []
        for word in shlex.split(line, comments=True):
            if word == "&&":
                yield argv
                argv = []
            else:
                argv.append(word)
        if argv:
            yield argv


def filled(argv: list[str]) -> list[list[str]]:
    """Placeholders filled in; `[--flag]` gives the command with and without it."""
    words = [PLACEHOLDERS.get(w, w) for w in argv]
    optional = [w for w in words if w.startswith("[") and w.endswith("]")]
    if not optional:
        return [words]
    plain = [w for w in words if w not in optional]
    return [plain, [w.strip("[]") for w in words]]


def flag(argv: list[str], *names: str) -> str | None:
    for i, word in enumerate(argv):
        for name in names:
            if word == name:
                return argv[i + 1]
            if word.startswith(name + "="):
                return word.split("=", 1)[1]
    return None


# ------------------------------------------------------------------------------------------ kubectl


def kubectl_object(argv: list[str]) -> dict[str, Any]:
    """The object `kubectl create ...` would send (its `--dry-run=client -o yaml`), for the two forms the docs use."""
    namespace = flag(argv, "-n", "--namespace") or "default"
    if argv[1:3] == ["create", "namespace"]:
        return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": argv[3]}}
    if argv[1:4] == ["create", "secret", "generic"]:
        files = [w.split("=", 1)[1] for w in argv if w.startswith("--from-file=")]
        assert files, f"kubectl create secret generic without --from-file: {argv}"
        data = {Path(f).name: base64.b64encode(b"").decode() for f in files}
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "Opaque",
            "metadata": {"name": argv[4], "namespace": namespace},
            "data": data,
        }
    raise AssertionError(f"no check for this kubectl command yet: {shlex.join(argv)}")


def collector_secret_volumes(r: Rendered) -> set[str]:
    collector = r.one("Deployment", "-collector")
    return {
        v["secret"]["secretName"]
        for v in collector["spec"]["template"]["spec"].get("volumes", [])
        if "secret" in v
    }


# ------------------------------------------------------------------------------------------- helm


def bootstrap_settings(tree: Any) -> Iterator[str]:
    """Every value the render gives TXNWATCH_KAFKA__BOOTSTRAP_SERVERS (env entries and env maps)."""
    if isinstance(tree, dict):
        if tree.get("name") == BOOTSTRAP_ENV and "value" in tree:
            yield str(tree["value"])
        if BOOTSTRAP_ENV in tree:
            yield str(tree[BOOTSTRAP_ENV])
        for value in tree.values():
            yield from bootstrap_settings(value)
    elif isinstance(tree, list):
        for item in tree:
            yield from bootstrap_settings(item)


def helm_template(h: Helm, argv: list[str], *values_files: Path) -> tuple[str, Rendered]:
    """`helm install RELEASE CHART -n NS --set ...` rendered as `helm template` with the same values."""
    assert argv[1] == "install", f"no check for this helm command yet: {shlex.join(argv)}"
    release, chart = argv[2], argv[3]
    assert (ROOT / chart).resolve() == CHART, chart
    namespace = flag(argv, "-n", "--namespace") or "default"
    sets = [w for i, w in enumerate(argv) if argv[i - 1] == "--set"] + [
        w.split("=", 1)[1] for w in argv if w.startswith("--set=")
    ]
    args = [
        "template",
        release,
        str(CHART),
        "--namespace",
        namespace,
        "--kube-version",
        KUBERNETES_VERSION,
        *(f"--api-versions={v}" for v in CRD_API_VERSIONS),
    ]
    for f in values_files:
        args += ["-f", str(f)]
    for s in sets:
        args += ["--set", s]
    return namespace, rendered(h.run(*args))


def assert_valid(manifest_text: str, path: Path) -> None:
    path.write_text(manifest_text)
    report = kubeconform(path)
    assert report["returncode"] == 0, f"{report['resources']} {report['stderr']}"
    assert report["summary"]["invalid"] == 0 and report["summary"]["errors"] == 0, report["summary"]


# ---------------------------------------------------------------------------------------- the rest


def check_txnwatch(argv: list[str]) -> None:
    for words in filled(argv):
        if words[1:] == ["--version"]:
            done = subprocess.run(
                [sys.executable, "-m", "txnwatch_cli", "--version"],
                capture_output=True,
                text=True,
                cwd=ROOT,
                timeout=60,
                check=False,
            )
            assert done.returncode == 0 and f"txnwatch {VERSION}" in done.stdout, done.stdout + done.stderr
            continue
        txnwatch_cli.build_parser().parse_args(
            words[1:]
        )  # argparse exits 2 on an unknown flag or a bad value


def check_make(argv: list[str]) -> None:
    makefile = (ROOT / "Makefile").read_text()
    for target in argv[1:]:
        assert re.search(rf"^{re.escape(target)}:", makefile, re.M), f"make {target}: no such Makefile target"


def check_docker(argv: list[str], built: set[str]) -> None:
    image = flag(argv, "-t", "--tag") if argv[1] == "build" else argv[2]
    assert image is not None and argv[1] in ("build", "push"), f"no check for this docker command: {argv}"
    assert image.rsplit(":", 1)[1] == VERSION, f"{image}: the project's version is {VERSION}"
    if argv[1] == "push":
        assert image in built, f"docker push {image}: not built in this block"
        return
    built.add(image)
    target = flag(argv, "--target")
    dockerfile = (ROOT / "Dockerfile").read_text()
    if target is not None:
        assert re.search(rf"^FROM \S+ AS {re.escape(target)}$", dockerfile, re.M), (
            f"no Dockerfile target {target}"
        )


def check_python(argv: list[str]) -> None:
    assert argv[1:3] == ["-m", "dev.workload"], f"no check for this python command yet: {shlex.join(argv)}"
    for words in filled(argv):
        workload.parser().parse_args(words[3:])


def check_pytest(argv: list[str]) -> None:
    for word in argv[1:]:
        if not word.startswith("-"):
            assert (ROOT / word.split("::")[0]).is_file(), f"{word}: no such test file"


# -------------------------------------------------------------------------------------------- tests


@pytest.fixture(scope="module")
def h(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return helm(tmp_path_factory.mktemp("helm-home"))


def readme_install() -> list[str]:
    """The README's `helm install`: the required values a values block is rendered with."""
    (block,) = [b for b in blocks() if b.doc == "README.md" and "helm install" in b.text]
    (argv,) = [a for a in commands(block) if a[0] == "helm"]
    return argv


@pytest.mark.parametrize("block", blocks(), ids=str)
def test_every_documented_block_runs(block: Block, h: Helm, tmp_path: Path) -> None:
    if is_values(block):
        values = yaml.safe_load(block.text)
        if all(key.startswith("spark.") for key in values):
            # A block of Spark confs: the text before it says they go in job.sparkApplication.sparkConf.
            for key in reversed(SPARK_CONF_VALUES):
                values = {key: values}
        path = tmp_path / "values.yaml"
        path.write_text(yaml.safe_dump(values))
        _, r = helm_template(h, readme_install(), path)
        assert_valid(r.text, tmp_path / "rendered.yaml")
        if "job" not in values:
            return  # other values: rendered and valid is what can be checked for any of them
        app = r.one("SparkApplication")
        # job.sparkConf reaches the session as `txnwatch stream --conf K=V`; job.sparkApplication.sparkConf is
        # spark-submit's, in the SparkApplication's own sparkConf.
        args = app["spec"]["arguments"]
        for key, value in values["job"].get("sparkConf", {}).items():
            assert f"{key}={value}" in args, f"{key} did not reach `txnwatch stream --conf`: {args}"
        for key, value in values["job"].get("sparkApplication", {}).get("sparkConf", {}).items():
            assert app["spec"]["sparkConf"].get(key) == str(value), (
                f"{key} did not reach the SparkApplication"
            )
        return
    run_shell_block(block, h, tmp_path)


def check_helm_install(
    block: Block, argv: list[str], created: list[dict[str, Any]], h: Helm, tmp: Path
) -> None:
    """Rendered with its values, valid together with the block's kubectl objects, each Secret of them in the
    release's namespace and mounted, and the whole bootstrap list reaching the apps (`--set` splits at a comma)."""
    namespace, r = helm_template(h, argv)
    assert_valid(yaml.safe_dump_all([*created, *r.objects]), tmp / "rendered.yaml")
    for secret in (o for o in created if o["kind"] == "Secret"):
        name, where = secret["metadata"]["name"], secret["metadata"]["namespace"]
        assert where == namespace, f"{block}: Secret {name} is created in {where}, the release in {namespace}"
        assert name in collector_secret_volumes(r), f"{block}: the chart never mounts Secret {name}"
    for word in argv:
        if word.startswith("kafka.bootstrapServers="):
            documented = word.split("=", 1)[1].replace("\\,", ",")
            assert set(bootstrap_settings(r.objects)) == {documented}, (
                f"{block}: {documented} not passed whole"
            )


def run_shell_block(block: Block, h: Helm, tmp: Path) -> None:
    created: list[dict[str, Any]] = []  # kubectl's objects, validated with the release that follows them
    built: set[str] = set()
    argvs = list(commands(block))
    assert argvs, f"{block}: no command found"
    for argv in argvs:
        tool = argv[0]
        if tool == "helm":
            check_helm_install(block, argv, created, h, tmp)
        elif tool == "kubectl":
            created.append(kubectl_object(argv))
        elif tool == "txnwatch":
            check_txnwatch(argv)
        elif tool == "make":
            check_make(argv)
        elif tool == "docker":
            check_docker(argv, built)
        elif tool == "python":
            check_python(argv)
        elif tool == ".venv/bin/pytest":
            check_pytest(argv)
        else:
            raise AssertionError(f"{block}: no check for `{shlex.join(argv)}` yet: give it one here")
    if created:
        assert any(a[0] == "helm" for a in argvs), f"{block}: kubectl objects that no release uses"


def test_the_secret_check_catches_the_old_install(h: Helm, tmp_path: Path) -> None:
    # deploy.md's install once created the Secret in kubectl's default namespace and never named it to the chart.
    old = Block(
        "old",
        1,
        "kubectl create secret generic kafka-client --from-file=client.properties\n"
        "helm install txnwatch helm/txnwatch -n monitoring --set kafka.bootstrapServers=k:9092 "
        "--set job.checkpoint.uri=s3a://b/c\n",
    )
    secret_argv, helm_argv = list(commands(old))
    secret = kubectl_object(secret_argv)
    namespace, r = helm_template(h, helm_argv)
    assert secret["metadata"]["namespace"] != namespace
    assert "kafka-client" not in collector_secret_volumes(r)
