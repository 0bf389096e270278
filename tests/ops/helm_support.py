"""Helm and kubeconform as the chart tests run them: binaries from dev/gotools.py, Helm's homes in a temp dir,
renders parsed into objects, every object validated with kubeconform -strict against k8s_schemas' schemas."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from k8s_schemas import KUBERNETES_VERSION, SCHEMA_TEMPLATE, schema_dir

from dev.gotools import ensure

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "txnwatch"
CI_VALUES = CHART / "ci"
HELM_TIMEOUT_S = 120
# The custom resources the chart renders only where the cluster serves their CRDs (`--api-versions` stands in for
# a cluster that does).
CRD_API_VERSIONS = (
    "monitoring.coreos.com/v1/ServiceMonitor",
    "monitoring.coreos.com/v1/PrometheusRule",
    "sparkoperator.k8s.io/v1beta2/SparkApplication",
)


@dataclass
class Helm:
    binary: Path
    home: Path

    def env(self) -> dict[str, str]:
        h = str(self.home)
        return {**os.environ, "HELM_CACHE_HOME": h, "HELM_CONFIG_HOME": h, "HELM_DATA_HOME": h}

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.binary), *args],
            capture_output=True,
            text=True,
            env=self.env(),
            cwd=ROOT,
            timeout=HELM_TIMEOUT_S,
            check=False,
        )

    def template(
        self,
        *values: Path,
        set_values: Mapping[str, str] | None = None,
        release: str = "txnwatch",
        api_versions: Sequence[str] = CRD_API_VERSIONS,
    ) -> subprocess.CompletedProcess[str]:
        args = [
            "template",
            release,
            str(CHART),
            "--namespace",
            "monitoring",
            "--kube-version",
            KUBERNETES_VERSION,
            *(f"--api-versions={v}" for v in api_versions),
        ]
        for v in values:
            args += ["-f", str(v)]
        for key, value in (set_values or {}).items():
            args += ["--set-string", f"{key}={value}"]
        return self.run(*args)


def notes(h: Helm, values: Path, workdir: Path, api_versions: Sequence[str] = CRD_API_VERSIONS) -> str:
    """NOTES.txt rendered as `helm install` would print it (that needs a cluster; `helm template` skips NOTES):
    a copy of the chart renders the same text into a ConfigMap."""
    chart = workdir / "txnwatch"
    shutil.copytree(CHART, chart, symlinks=False)
    text = (chart / "templates" / "NOTES.txt").read_text()
    (chart / "templates" / "NOTES.txt").unlink()
    (chart / "templates" / "_notes.tpl").write_text('{{- define "test.notes" -}}\n' + text + "{{- end -}}\n")
    (chart / "templates" / "notes.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes\ndata:\n"
        '  notes: {{ include "test.notes" . | toJson }}\n'
    )
    args = [
        "template",
        "txnwatch",
        str(chart),
        "--namespace",
        "monitoring",
        "--kube-version",
        KUBERNETES_VERSION,
        *(f"--api-versions={v}" for v in api_versions),
    ]
    done = h.run(*args, "-f", str(values), "--show-only", "templates/notes.yaml")
    assert done.returncode == 0, done.stderr
    return str(yaml.safe_load(done.stdout)["data"]["notes"])


def helm(home: Path) -> Helm:
    home.mkdir(parents=True, exist_ok=True)
    return Helm(ensure("helm"), home)


@dataclass
class Rendered:
    text: str
    objects: list[dict[str, Any]]

    def kinds(self) -> list[str]:
        return sorted(o["kind"] for o in self.objects)

    def one(self, kind: str, name_suffix: str = "") -> dict[str, Any]:
        found = [o for o in self.objects if o["kind"] == kind and o["metadata"]["name"].endswith(name_suffix)]
        assert len(found) == 1, (
            f"{len(found)} {kind} named *{name_suffix}: {[o['metadata']['name'] for o in found]}"
        )
        return found[0]

    def all(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == kind]


def rendered(done: subprocess.CompletedProcess[str]) -> Rendered:
    assert done.returncode == 0, done.stderr
    return Rendered(done.stdout, [o for o in yaml.safe_load_all(done.stdout) if o])


def kubeconform(manifest: Path) -> dict[str, Any]:
    """kubeconform -strict over a rendered file: its JSON report (every resource must have a schema)."""
    done = subprocess.run(
        [
            str(ensure("kubeconform")),
            "-strict",
            "-summary",
            "-output",
            "json",
            "-kubernetes-version",
            KUBERNETES_VERSION,
            "-schema-location",
            f"{schema_dir()}/{SCHEMA_TEMPLATE}",
            str(manifest),
        ],
        capture_output=True,
        text=True,
        timeout=HELM_TIMEOUT_S,
        check=False,
    )
    report: dict[str, Any] = json.loads(done.stdout)
    report["returncode"] = done.returncode
    report["stderr"] = done.stderr
    return report


def pod_specs(r: Rendered) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every pod spec the chart makes (Deployments, the SparkApplication's pod templates, the executor pod
    template of a k8s:// driver, the `helm test` pod), named."""
    for d in r.all("Deployment"):
        yield d["metadata"]["name"], d["spec"]["template"]["spec"]
    for pod in r.all("Pod"):
        yield pod["metadata"]["name"], pod["spec"]
    for app in r.all("SparkApplication"):
        for role in ("driver", "executor"):
            yield f"{app['metadata']['name']}/{role}", app["spec"][role]["template"]["spec"]
    for cm in r.all("ConfigMap"):
        for key, text in cm.get("data", {}).items():
            if key.endswith("pod-template.yaml"):
                yield f"{cm['metadata']['name']}/{key}", yaml.safe_load(text)["spec"]
