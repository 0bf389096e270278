"""helm/txnwatch/README.md: its values table is the one dev/chart_readme.py generates from values.schema.json and
values.yaml (so it fails when either changes without the README), every value has a described row, and its
`helm install` renders into objects kubeconform accepts."""

from __future__ import annotations

import copy
import json
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from helm_support import CHART, CRD_API_VERSIONS, ROOT, helm, kubeconform, rendered

from dev import chart_readme

SCHEMA: dict[str, Any] = json.loads(chart_readme.SCHEMA.read_text())
VALUES: dict[str, Any] = yaml.safe_load(chart_readme.VALUES.read_text())


def test_the_readme_table_is_the_schemas() -> None:
    assert chart_readme.README.read_text() == chart_readme.expected_readme(), (
        "helm/txnwatch/README.md is out of date: run `python -m dev.chart_readme`"
    )
    done = subprocess.run(
        [sys.executable, "-m", "dev.chart_readme", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_changed_schema_or_default_changes_the_table() -> None:
    # What the check compares: a new key, a changed description or a changed default each give another table.
    table = chart_readme.table(SCHEMA, VALUES)
    added = copy.deepcopy(SCHEMA)
    added["properties"]["tests"]["properties"]["newValue"] = {"type": "string", "description": "A new value."}
    assert "| `tests.newValue` | string |  | A new value. |" in chart_readme.table(added, VALUES)
    described = copy.deepcopy(SCHEMA)
    described["properties"]["cluster"]["description"] = "Another text."
    assert chart_readme.table(described, VALUES) != table
    defaults = copy.deepcopy(VALUES)
    defaults["collector"]["intervalSeconds"] = 30
    assert "| `collector.intervalSeconds` | number | `30` |" in chart_readme.table(SCHEMA, defaults)
    readme = chart_readme.README.read_text()
    assert chart_readme.readme_with_table(readme, chart_readme.table(added, VALUES)) != readme


def test_a_value_without_a_description_is_refused() -> None:
    bare = copy.deepcopy(SCHEMA)
    bare["properties"]["tests"]["properties"]["readyTimeoutSeconds"].pop("description")
    with pytest.raises(chart_readme.UndescribedValue, match=r"tests\.readyTimeoutSeconds"):
        chart_readme.table(bare, VALUES)


def leaf_keys(values: Any, key: str = "") -> Iterator[str]:
    if isinstance(values, dict) and values:
        for name, sub in values.items():
            yield from leaf_keys(sub, f"{key}.{name}" if key else name)
    else:
        yield key


def test_every_value_has_a_row_with_its_default() -> None:
    rows = {r.key: r for r in chart_readme.rows(SCHEMA, VALUES)}
    for key in leaf_keys(VALUES):
        # a value inside a free-form object (resources.requests.cpu) is shown in its object's row
        parts = key.split(".")
        owner = next(
            (".".join(parts[:n]) for n in range(len(parts), 0, -1) if ".".join(parts[:n]) in rows), None
        )
        assert owner is not None, f"values.yaml's {key} has no row in the README's table"
        default = rows[owner].default
        assert default, owner
        assert json.loads(default.strip("`")) == chart_readme.lookup(VALUES, owner.split(".")), owner


def readme_install() -> list[str]:
    (block,) = [
        b
        for b in re.findall(r"^```\n(.*?)^```", chart_readme.README.read_text(), re.S | re.M)
        if "helm install" in b
    ]
    return shlex.split(block.replace("\\\n", " "))


def test_the_readmes_install_renders_valid_objects(tmp_path: Path) -> None:
    argv = readme_install()
    assert (
        argv[:4] == ["helm", "install", "txnwatch", "helm/txnwatch"] and (ROOT / argv[3]).resolve() == CHART
    )
    sets = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
    namespace = argv[argv.index("-n") + 1]
    h = helm(tmp_path / "helm-home")
    args = ["template", argv[2], str(CHART), "-n", namespace, "--kube-version", "1.35.0"]
    args += [f"--api-versions={v}" for v in CRD_API_VERSIONS]  # a cluster with the operators the chart uses
    for s in sets:
        args += ["--set", s]
    r = rendered(h.run(*args))
    manifest = tmp_path / "rendered.yaml"
    manifest.write_text(r.text)
    report = kubeconform(manifest)
    assert report["returncode"] == 0, json.dumps(report["resources"], indent=1) + report["stderr"]
    # each image from the registry the block names
    collector_image = r.one("Deployment", "-collector")["spec"]["template"]["spec"]["containers"][0]["image"]
    assert collector_image == "registry.example.com/txnwatch-collector:0.2.0"
    assert r.one("SparkApplication")["spec"]["image"] == "registry.example.com/txnwatch:0.2.0"
    collector = r.one("Deployment", "-collector")["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in collector["env"]}
    assert env["TXNWATCH_KAFKA__BOOTSTRAP_SERVERS"] == "kafka-0.kafka:9092,kafka-1.kafka:9092"
