"""JSON schemas for kubeconform, made offline and cached under .cache/k8s-schemas/ (a second run reads them back).

- Kubernetes kinds: PyPI `kubernetes-validate` ships strict schemas per Kubernetes version whose `$ref`s point
  into one shared `_definitions.json`, which kubeconform cannot follow; each kind's file is written with the
  definitions it reaches inlined under `$defs`.
- Custom resources: the CRDs of the operators' Go modules at exact versions (`go mod download`), converted the
  way kubeconform's scripts/openapi2jsonschema.py does (objects with `properties` reject other keys, also at the
  root as with DENY_ROOT_ADDITIONAL_PROPERTIES; int-or-string becomes oneOf string/integer).

Files are named for kubeconform's `{{ .ResourceKind }}{{ .KindSuffix }}.json` template (deployment-apps-v1.json,
service-v1.json, sparkapplication-sparkoperator-v1beta2.json).
"""

from __future__ import annotations

import copy
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.metadata import version
from pathlib import Path
from typing import Any

import kubernetes_validate
import yaml

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES_VERSION = "1.35.0"
# Operators whose custom resources the chart renders: (Go module, version, CRD files in the module).
CRD_MODULES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (
        "github.com/kubeflow/spark-operator/v2",
        "v2.5.2",
        ("config/crd/bases/sparkoperator.k8s.io_sparkapplications.yaml",),
    ),
    (
        "github.com/prometheus-operator/prometheus-operator",
        "v0.85.0",
        (
            "example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml",
            "example/prometheus-operator-crd/monitoring.coreos.com_podmonitors.yaml",
            "example/prometheus-operator-crd/monitoring.coreos.com_prometheusrules.yaml",
        ),
    ),
)
FORMAT = 1  # bump when the conversion below changes: the cache key includes it
CACHE_DIR = ROOT / ".cache" / "k8s-schemas"
SCHEMA_TEMPLATE = "{{ .ResourceKind }}{{ .KindSuffix }}.json"

_DEFS_REF = re.compile(r"^(?:/api/_definitions\.json)?#/\$defs/(?P<name>.+)$")


def schema_dir() -> Path:
    """The folder of every schema (built on the first call, then read from the cache)."""
    crds = hashlib.sha256(repr(CRD_MODULES).encode()).hexdigest()[:12]
    key = f"k8s{KUBERNETES_VERSION}-kv{version('kubernetes-validate')}-crds{crds}-f{FORMAT}"
    target = CACHE_DIR / key
    if (target / ".complete").exists():
        return target
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    with _lock(CACHE_DIR / ".lock"):
        if (target / ".complete").exists():
            return target
        work = Path(tempfile.mkdtemp(prefix="schemas-", dir=CACHE_DIR))
        try:
            _write_core_schemas(work)
            for module, ver, paths in CRD_MODULES:
                module_dir = go_mod_download(module, ver)
                for rel in paths:
                    _write_crd_schemas(module_dir / rel, work)
            (work / ".complete").write_text("")
            if target.exists():
                shutil.rmtree(target)
            work.rename(target)
        finally:
            if work.exists():
                shutil.rmtree(work)
    return target


@contextmanager
def _lock(path: Path) -> Iterator[None]:
    with path.open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def go_mod_download(module: str, ver: str) -> Path:
    """The module's source folder in the Go module cache, downloaded at exactly this version."""
    go = shutil.which("go")
    if go is None:
        raise RuntimeError("`go` is needed to download the operators' CRDs (Debian: golang-go)")
    with tempfile.TemporaryDirectory() as cwd:  # outside any module: `go mod download mod@version` as is
        done = subprocess.run(
            [go, "mod", "download", "-json", f"{module}@{ver}"],
            capture_output=True,
            text=True,
            cwd=cwd,
            timeout=600,
            env={**os.environ, "GOFLAGS": "-mod=mod"},
        )
    if done.returncode != 0:
        raise RuntimeError(f"go mod download {module}@{ver} failed:\n{done.stdout}\n{done.stderr}")
    return Path(json.loads(done.stdout)["Dir"])


# ----------------------------------------------------------------------------------- Kubernetes kinds


def _write_core_schemas(out: Path) -> None:
    source = (
        Path(kubernetes_validate.__file__).parent
        / "kubernetes-json-schema"
        / f"v{KUBERNETES_VERSION}-local-strict"
    )
    definitions = json.loads((source / "_definitions.json").read_text())["$defs"]
    for path in sorted(source.glob("*.json")):
        if path.name in ("_definitions.json", "all.json"):
            continue
        schema = json.loads(path.read_text())
        if "x-kubernetes-group-version-kind" not in schema:
            continue  # a definition, not a kind one can apply
        (out / path.name).write_text(json.dumps(inline_definitions(schema, definitions)))


def inline_definitions(schema: dict[str, Any], definitions: dict[str, Any]) -> dict[str, Any]:
    """`schema` with every definition it reaches (through `/api/_definitions.json#/$defs/...` or `#/$defs/...`)
    copied under its own `$defs` and every such `$ref` made local."""
    needed: dict[str, Any] = {}
    pending: list[Any] = [schema]
    while pending:
        for name in _refs(pending.pop()):
            if name not in needed:
                needed[name] = definitions[name]
                pending.append(definitions[name])
    out = _localise(copy.deepcopy(schema))
    out.pop("$id", None)
    out["$defs"] = {name: _localise(copy.deepcopy(d)) for name, d in needed.items()}
    return out


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and (m := _DEFS_REF.match(ref)):
            yield m.group("name")
        for value in node.values():
            yield from _refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _refs(value)


def _localise(node: Any) -> Any:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and (m := _DEFS_REF.match(ref)):
            node["$ref"] = f"#/$defs/{m.group('name')}"
        for value in node.values():
            _localise(value)
    elif isinstance(node, list):
        for value in node:
            _localise(value)
    return node


# ----------------------------------------------------------------------------------- custom resources


def _write_crd_schemas(crd_file: Path, out: Path) -> None:
    for doc in yaml.safe_load_all(crd_file.read_text()):
        if not doc or doc.get("kind") != "CustomResourceDefinition":
            continue
        kind = doc["spec"]["names"]["kind"]
        group = doc["spec"]["group"].split(".")[0]
        for ver in doc["spec"]["versions"]:
            schema = ver.get("schema", {}).get("openAPIV3Schema")
            if schema is None:
                continue
            converted = replace_int_or_string(additional_properties(copy.deepcopy(schema)))
            (out / f"{kind}-{group}-{ver['name']}".lower()).with_suffix(".json").write_text(
                json.dumps(converted)
            )


def additional_properties(node: Any) -> Any:
    """kubeconform's openapi2jsonschema.additional_properties (with DENY_ROOT_ADDITIONAL_PROPERTIES): every
    object that lists `properties` and says nothing else about other keys rejects them (kubectl's behaviour).
    Like the script, it does not look inside lists (allOf/anyOf branches keep their own rules)."""
    if isinstance(node, dict):
        if "properties" in node and "additionalProperties" not in node:
            node["additionalProperties"] = False
        for value in node.values():
            additional_properties(value)
    return node


def replace_int_or_string(node: Any) -> Any:
    """kubeconform's openapi2jsonschema.replace_int_or_string: `format: int-or-string` → oneOf string/integer."""
    if isinstance(node, dict):
        return {
            k: (
                {"oneOf": [{"type": "string"}, {"type": "integer"}]}
                if isinstance(v, dict) and v.get("format") == "int-or-string"
                else replace_int_or_string(v)
            )
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [replace_int_or_string(v) for v in node]
    return node
