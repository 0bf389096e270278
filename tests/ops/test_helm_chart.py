"""The Helm chart (helm/txnwatch): lint --strict, a render per mode and for SASL, every object valid for
Kubernetes 1.35 and the operators' CRDs (kubeconform -strict), the apps' real flags and TXNWATCH_* settings,
security contexts, the alert rules and dashboard read from deploy/, and bad values refused with a clear message.

Also: the custom resources only where their CRDs are served (and NOTES.txt saying so when not), probes tied to
progress in every pod that runs a component, the alerting values in every rule and the dashboard, and the
`helm test` hook's script run for real against a local HTTP server.

Helm and kubeconform come from dev/gotools.py; the schemas from tests/ops/k8s_schemas.py (cached in .cache/).
"""

from __future__ import annotations

import http.server
import json
import os
import re
import subprocess
import sys
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from helm_support import (
    CHART,
    CI_VALUES,
    CRD_API_VERSIONS,
    ROOT,
    Helm,
    Rendered,
    helm,
    kubeconform,
    notes,
    pod_specs,
    rendered,
)

import txnwatch_cli
from common.settings import Settings
from streaming.session import MALLOC_ENV

RULES = ROOT / "deploy" / "prometheus" / "txnwatch-rules.yaml"
DASHBOARD = ROOT / "deploy" / "grafana" / "txnwatch.json"
SPARK_JARS = ROOT / ".cache" / "jars" / "spark"

# values file → the kinds it renders.
MODES: dict[str, list[str]] = {
    "spark-application-values.yaml": [
        "ConfigMap",  # dashboard
        "Deployment",  # collector
        "Pod",  # the `helm test` hook
        "PodDisruptionBudget",
        "PodDisruptionBudget",
        "PrometheusRule",
        "Role",
        "RoleBinding",
        "Service",
        "Service",
        "ServiceAccount",
        "ServiceMonitor",
        "SparkApplication",
    ],
    "spark-application-pvc-values.yaml": [
        "ConfigMap",
        "Deployment",
        "PersistentVolumeClaim",
        "Pod",  # the `helm test` hook
        "PodDisruptionBudget",
        "PodDisruptionBudget",
        "PrometheusRule",
        "Role",
        "RoleBinding",
        "Service",
        "Service",
        "ServiceAccount",
        "ServiceMonitor",
        "SparkApplication",
    ],
    # local[*]: no executors, so no Role.
    "deployment-local-values.yaml": [
        "ConfigMap",
        "Deployment",
        "Deployment",
        "Pod",  # the `helm test` hook
        "PodDisruptionBudget",
        "PodDisruptionBudget",
        "PrometheusRule",
        "Service",
        "Service",
        "ServiceAccount",
        "ServiceMonitor",
    ],
    "deployment-k8s-values.yaml": [
        "ConfigMap",
        "ConfigMap",  # the executor pod template
        "Deployment",
        "Deployment",
        "Pod",  # the `helm test` hook
        "PodDisruptionBudget",
        "PodDisruptionBudget",
        "PrometheusRule",
        "Role",
        "RoleBinding",
        "Service",
        "Service",
        "ServiceAccount",
        "ServiceMonitor",
    ],
    "sasl-values.yaml": [
        "ConfigMap",
        "Deployment",
        "Pod",  # the `helm test` hook
        "PodDisruptionBudget",
        "PodDisruptionBudget",
        "PrometheusRule",
        "Role",
        "RoleBinding",
        "Service",
        "Service",
        "ServiceAccount",
        "ServiceMonitor",
        "SparkApplication",
    ],
}


@pytest.fixture(scope="module")
def h(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return helm(tmp_path_factory.mktemp("helm-home"))


@pytest.fixture(scope="module")
def renders(h: Helm) -> dict[str, Rendered]:
    return {name: rendered(h.template(CI_VALUES / name)) for name in MODES}


def settings_from_env(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The Settings the apps would build from this environment (and nothing else of ours)."""
    for name in list(os.environ):
        if name.startswith("TXNWATCH_"):
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return Settings()


def container(pod: dict[str, Any], name: str) -> dict[str, Any]:
    (c,) = [c for c in pod["containers"] if c["name"] == name]
    return c


def env_map(c: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in c.get("env", []) if "value" in e}


def test_the_chart_reads_the_alerting_files_from_deploy() -> None:
    # Helm reads only files inside the chart: these links make the one source in deploy/ part of it.
    for link, target in (("txnwatch-rules.yaml", RULES), ("txnwatch.json", DASHBOARD)):
        path = CHART / "files" / link
        assert path.is_symlink(), f"{path} should link to {target}"
        assert path.resolve() == target.resolve(), path.resolve()
        assert target.exists(), f"{target} is missing: the chart cannot render its PrometheusRule/dashboard"


@pytest.mark.parametrize("values", sorted(MODES))
def test_lint_strict(h: Helm, values: str) -> None:
    done = h.run("lint", "--strict", str(CHART), "-f", str(CI_VALUES / values))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 chart(s) failed" in done.stdout


def test_package_carries_the_real_rules_and_dashboard(h: Helm, tmp_path: Path) -> None:
    done = h.run("package", str(CHART), "--destination", str(tmp_path))
    assert done.returncode == 0, done.stderr
    (tgz,) = tmp_path.glob("txnwatch-*.tgz")
    with tarfile.open(tgz) as tar:
        names = tar.getnames()
        for member, source in (
            ("txnwatch/files/txnwatch-rules.yaml", RULES),
            ("txnwatch/files/txnwatch.json", DASHBOARD),
        ):
            f = tar.extractfile(member)
            assert f is not None, names
            assert f.read() == source.read_bytes(), f"{member} differs from {source}"
        assert "txnwatch/ci/sasl-values.yaml" in names  # the example values travel with the chart


@pytest.mark.parametrize("values", sorted(MODES))
def test_every_object_is_valid_for_kubernetes_and_the_operators(
    renders: dict[str, Rendered], values: str, tmp_path: Path
) -> None:
    r = renders[values]
    assert r.kinds() == sorted(MODES[values])
    manifest = tmp_path / "rendered.yaml"
    manifest.write_text(r.text)
    report = kubeconform(manifest)
    summary = report["summary"]
    assert report["returncode"] == 0, json.dumps(report["resources"], indent=1) + report["stderr"]
    assert summary["valid"] == len(r.objects), summary
    assert summary["invalid"] == summary["errors"] == summary["skipped"] == 0, summary


@pytest.mark.parametrize("values", sorted(MODES))
def test_pods_run_non_root_read_only_without_escalation(renders: dict[str, Rendered], values: str) -> None:
    specs = list(pod_specs(renders[values]))
    assert specs
    for name, pod in specs:
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        for c in pod["containers"]:
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True, name
            assert sc["allowPrivilegeEscalation"] is False, name
            assert sc["capabilities"]["drop"] == ["ALL"], name


def test_collector_runs_the_real_command_with_real_settings(
    renders: dict[str, Rendered], monkeypatch: pytest.MonkeyPatch
) -> None:
    r = renders["spark-application-values.yaml"]
    dep = r.one("Deployment", "-collector")
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"] == {"type": "Recreate"}
    pod = dep["spec"]["template"]["spec"]
    c = container(pod, "collector")
    assert txnwatch_cli.build_parser().parse_args(c["args"]).func.__name__ == "cmd_collect"
    settings = settings_from_env(env_map(c), monkeypatch)
    assert settings.kafka.bootstrap_servers == "kafka-0.kafka:9092,kafka-1.kafka:9092"
    assert settings.cluster == "prod-eu"
    assert settings.collector.metrics_addr == "0.0.0.0"
    assert settings.collector.metrics_port == c["ports"][0]["containerPort"] == 9464
    assert pod["automountServiceAccountToken"] is False
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    assert "/tmp" in mounts


def stream_settings_checked(
    args: list[str], env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> Settings:
    parsed = txnwatch_cli.build_parser().parse_args(args)
    assert parsed.func.__name__ == "run_stream"
    assert ("spark.sql.shuffle.partitions", parsed.conf[0][1]) == parsed.conf[0]
    return settings_from_env(env, monkeypatch)


def test_spark_application_streams_from_the_image_with_restart_always(
    renders: dict[str, Rendered], monkeypatch: pytest.MonkeyPatch
) -> None:
    r = renders["spark-application-values.yaml"]
    spec = r.one("SparkApplication")["spec"]
    assert r.one("SparkApplication")["apiVersion"] == "sparkoperator.k8s.io/v1beta2"
    assert spec["restartPolicy"]["type"] == "Always"
    assert (spec["type"], spec["mode"]) == ("Python", "cluster")
    assert spec["mainApplicationFile"] == "local:///opt/txnwatch/txnwatch_cli.py"
    settings = stream_settings_checked(spec["arguments"], spec["driver"]["envVars"], monkeypatch)
    # The session's builder sets the master itself: it must be the cluster's, not local[*].
    assert settings.stream.master.startswith("k8s://")
    assert settings.stream.checkpoint_location == "s3a://txnwatch-checkpoints/prod-eu"
    assert (settings.stream.state_buckets, settings.stream.coordinator_max_offsets_per_trigger) == (
        64,
        100_000,
    )
    assert "spark.sql.shuffle.partitions=100" in spec["arguments"]
    assert (settings.stream.metrics_host, settings.stream.metrics_port) == ("0.0.0.0", 9465)
    assert spec["executor"]["instances"] == 3
    # Each JVM's heap is fixed at its cap, so the pods' memory is one level (docs/deploy.md, Memory).
    for role in ("driver", "executor"):
        assert spec[role]["javaOptions"] == f"-Xms{spec[role]['memory']} -XX:+AlwaysPreTouch"
    # spark-submit starts the driver's JVM before txnwatch can set them; executors get them from the session's conf
    assert {k: spec["driver"]["envVars"].get(k) for k in MALLOC_ENV} == MALLOC_ENV
    assert spec["driver"]["labels"]["app.kubernetes.io/component"] == "stream"
    # The driver's Service selects the driver pod only.
    svc = r.one("Service", "-stream")
    assert svc["spec"]["selector"]["spark-role"] == "driver"


@pytest.mark.jars
def test_connector_jars_are_the_ones_the_pom_resolves(renders: dict[str, Rendered]) -> None:
    # The image resolves dev/jvm/spark/pom.xml as `make jars` does; the SparkApplication names those files.
    spec = renders["spark-application-values.yaml"].one("SparkApplication")["spec"]
    named = sorted(Path(j.removeprefix("local://")).name for j in spec["deps"]["jars"])
    resolved = sorted(p.name for p in SPARK_JARS.glob("*.jar"))
    assert resolved, f"no jars in {SPARK_JARS}: run `make jars`"
    assert named == resolved
    assert all(j.startswith("local:///opt/txnwatch/jars/spark/") for j in spec["deps"]["jars"])


def test_spark_application_with_a_claim_mounts_it_on_driver_and_executors(
    renders: dict[str, Rendered],
) -> None:
    r = renders["spark-application-pvc-values.yaml"]
    spec = r.one("SparkApplication")["spec"]
    pvc = r.one("PersistentVolumeClaim")
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    assert pvc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    (vol,) = [v for v in spec["volumes"] if "persistentVolumeClaim" in v]
    assert vol["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
    for role in ("driver", "executor"):
        mounts = {m["name"]: m["mountPath"] for m in spec[role]["volumeMounts"]}
        assert mounts[vol["name"]] == "/var/lib/txnwatch/checkpoints", role
    assert (
        spec["driver"]["envVars"]["TXNWATCH_STREAM__CHECKPOINT_LOCATION"] == "/var/lib/txnwatch/checkpoints"
    )


def test_local_driver_deployment(renders: dict[str, Rendered], monkeypatch: pytest.MonkeyPatch) -> None:
    r = renders["deployment-local-values.yaml"]
    dep = r.one("Deployment", "-stream")
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"] == {"type": "Recreate"}
    pod = dep["spec"]["template"]["spec"]
    c = container(pod, "stream")
    settings = stream_settings_checked(c["args"], env_map(c), monkeypatch)
    assert settings.stream.master == "local[*]"
    assert settings.stream.checkpoint_location == "/var/lib/txnwatch/checkpoints"
    assert settings.stream.restart_queries_every_s == 6 * 3600  # planned restarts reach the job
    # malloc's bounds for the driver's Python from its start, the same as txnwatch sets (docs/deploy.md, Memory)
    assert {k: env_map(c).get(k) for k in MALLOC_ENV} == MALLOC_ENV
    assert pod["automountServiceAccountToken"] is False  # no executors: no API access
    (claim,) = [v for v in pod["volumes"] if "persistentVolumeClaim" in v]
    assert claim["persistentVolumeClaim"]["claimName"] == "txnwatch-checkpoints"
    svc = r.one("Service", "-stream")
    assert svc["spec"]["clusterIP"] == "None"
    assert [p["name"] for p in svc["spec"]["ports"]] == ["metrics"]


def test_client_mode_driver_deployment(renders: dict[str, Rendered], monkeypatch: pytest.MonkeyPatch) -> None:
    r = renders["deployment-k8s-values.yaml"]
    dep = r.one("Deployment", "-stream")
    pod = dep["spec"]["template"]["spec"]
    c = container(pod, "stream")
    settings = stream_settings_checked(c["args"], env_map(c), monkeypatch)
    assert settings.stream.master == "k8s://https://kubernetes.default.svc"
    conf = dict(txnwatch_cli.build_parser().parse_args(c["args"]).conf)
    svc = r.one("Service", "-stream")
    assert conf["spark.driver.host"] == f"{svc['metadata']['name']}.monitoring.svc"
    assert conf["spark.sql.shuffle.partitions"] == "8"
    assert (
        conf["spark.executor.instances"],
        conf["spark.executor.cores"],
        conf["spark.executor.memory"],
    ) == (
        "2",
        "2",
        "3g",
    )
    assert conf["spark.executor.extraJavaOptions"] == "-Xms3g -XX:+AlwaysPreTouch"
    assert conf["spark.kubernetes.driver.pod.name"] == "$(POD_NAME)"
    assert conf["spark.kubernetes.container.image.pullSecrets"] == "registry-credentials"
    assert pod["imagePullSecrets"] == [{"name": "registry-credentials"}]
    assert {p["port"] for p in svc["spec"]["ports"]} == {9465, 7078, 7079}
    assert pod["automountServiceAccountToken"] is True
    binding = r.one("RoleBinding")
    assert binding["subjects"][0]["name"] == pod["serviceAccountName"]
    template = r.one("ConfigMap", "-executor-pod-template")
    assert conf["spark.kubernetes.executor.podTemplateFile"].endswith(next(iter(template["data"])))


def test_sasl_comes_from_existing_secrets_only(renders: dict[str, Rendered]) -> None:
    r = renders["sasl-values.yaml"]
    assert not r.all("Secret")
    assert "password" not in r.text.lower() and "jaas" not in r.text.lower()
    collector = container(r.one("Deployment", "-collector")["spec"]["template"]["spec"], "collector")
    args = txnwatch_cli.build_parser().parse_args(collector["args"])
    assert str(args.command_config) == "/etc/txnwatch/kafka/client.properties"
    mounts = {m["mountPath"]: m for m in collector["volumeMounts"]}
    assert mounts["/etc/txnwatch/kafka"]["readOnly"] and mounts["/etc/txnwatch/tls"]["readOnly"]
    volumes = {v["name"]: v for v in r.one("Deployment", "-collector")["spec"]["template"]["spec"]["volumes"]}
    assert {v["secret"]["secretName"] for v in volumes.values() if "secret" in v} == {
        "kafka-client",
        "kafka-ca",
    }
    spec = r.one("SparkApplication")["spec"]
    stream_args = txnwatch_cli.build_parser().parse_args(spec["arguments"])
    assert str(stream_args.command_config) == "/etc/txnwatch/kafka/client.properties"
    assert {(s["name"], s["path"]) for s in spec["driver"]["secrets"]} == {
        ("kafka-client", "/etc/txnwatch/kafka"),
        ("kafka-ca", "/etc/txnwatch/tls"),
    }
    # Executors read the brokers too (Spark's Kafka source): they need the CA, not the client.properties.
    assert [(s["name"], s["path"]) for s in spec["executor"]["secrets"]] == [
        ("kafka-ca", "/etc/txnwatch/tls")
    ]


def test_monitoring_matches_the_alert_rules(renders: dict[str, Rendered]) -> None:
    r = renders["spark-application-values.yaml"]
    sm = r.one("ServiceMonitor")
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    (endpoint,) = sm["spec"]["endpoints"]
    assert endpoint["honorLabels"] is True
    assert {"action": "replace", "targetLabel": "cluster", "replacement": "prod-eu"} in endpoint[
        "relabelings"
    ]
    # The rules find each app by job name; the ServiceMonitor names jobs by the Services' jobLabel.
    patterns = set(re.findall(r'up\{job=~"([^"]+)"\}', RULES.read_text()))
    assert patterns, f"no up{{job=~...}} rule in {RULES}"
    jobs = [s["metadata"]["labels"][sm["spec"]["jobLabel"]] for s in r.all("Service")]
    assert sorted(jobs) == ["txnwatch-collector", "txnwatch-stream"]
    for job in jobs:
        assert any(re.fullmatch(p, job) for p in patterns), (job, patterns)
    for s in r.all("Service"):
        assert all(s["metadata"]["labels"][k] == v for k, v in sm["spec"]["selector"]["matchLabels"].items())
        assert "metrics" in [p["name"] for p in s["spec"]["ports"]]

    rule = r.one("PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert rule["spec"] == yaml.safe_load(RULES.read_text())
    dash = r.one("ConfigMap", "-dashboard")
    assert dash["metadata"]["labels"]["grafana_dashboard"] == "1"
    (text,) = dash["data"].values()
    assert text == DASHBOARD.read_text().rstrip("\n")
    assert json.loads(text) == json.loads(DASHBOARD.read_text())


BAD_VALUES = [
    pytest.param(
        {"kafka.bootstrapServers": "kafka:9092"},
        "job.checkpoint: the streaming job needs durable checkpoint storage",
        id="no-checkpoint",
    ),
    pytest.param(
        {
            "kafka.bootstrapServers": "kafka:9092",
            "job.checkpoint.uri": "s3a://b/c",
            "job.checkpoint.persistentVolumeClaim.claimName": "ck",
        },
        "set either uri or persistentVolumeClaim",
        id="two-checkpoints",
    ),
    pytest.param(
        {"job.checkpoint.uri": "s3a://b/c"}, "kafka.bootstrapServers is required", id="no-bootstrap"
    ),
    pytest.param(
        {
            "kafka.bootstrapServers": "kafka:9092",
            "job.checkpoint.persistentVolumeClaim.create": "true",
        },
        "needs accessModes [ReadWriteMany]",
        id="rwo-claim-for-executors",
    ),
    pytest.param(
        {"kafka.bootstrapServers": "kafka:9092", "job.checkpoint.uri": "s3a://b/c", "job.mode": "yarn"},
        "at '/job/mode'",
        id="unknown-mode",
    ),
    pytest.param(
        {"kafka.bootstrapServers": "kafka:9092", "job.checkpoint.uri": "/not/a/uri"},
        "at '/job/checkpoint/uri'",
        id="checkpoint-uri-without-scheme",
    ),
]


@pytest.mark.parametrize(("values", "message"), BAD_VALUES)
def test_bad_values_fail_the_render_with_a_clear_message(
    h: Helm, values: dict[str, str], message: str
) -> None:
    bools = {k: v for k, v in values.items() if v in ("true", "false")}
    strings = {k: v for k, v in values.items() if k not in bools}
    args = ["template", "txnwatch", str(CHART), "--kube-version", "1.35.0"]
    for k, v in strings.items():
        args += ["--set-string", f"{k}={v}"]
    for k, v in bools.items():
        args += ["--set", f"{k}={v}"]
    done = h.run(*args)
    assert done.returncode != 0, done.stdout[:2000]
    assert message in done.stderr, done.stderr


def test_whole_numbers_stay_integers(h: Helm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Helm reads numbers in values files as floats: 2000000 would print as 2e+06.
    values = tmp_path / "big.yaml"
    values.write_text(
        "kafka: {bootstrapServers: 'kafka:9092'}\n"
        "job:\n"
        "  checkpoint: {uri: 's3a://b/c'}\n"
        "  maxOffsetsPerTrigger: 2000000\n"
        "  sparkConf: {spark.sql.streaming.stateStore.rocksdb.blockCacheSizeMB: 1000000, spark.x: 0.75}\n"
        "  sparkApplication: {sparkConf: {spark.kubernetes.executor.request.cores: 2000000}}\n"
    )
    spec = rendered(h.template(values)).one("SparkApplication")["spec"]
    settings = stream_settings_checked(spec["arguments"], spec["driver"]["envVars"], monkeypatch)
    assert settings.stream.max_offsets_per_trigger == 2_000_000
    assert "spark.sql.streaming.stateStore.rocksdb.blockCacheSizeMB=1000000" in spec["arguments"]
    assert "spark.x=0.75" in spec["arguments"]
    assert spec["sparkConf"]["spark.kubernetes.executor.request.cores"] == "2000000"


@pytest.mark.parametrize("values", ["spark-application-values.yaml", "deployment-local-values.yaml"])
def test_notes_say_how_to_check_it_works(
    h: Helm, renders: dict[str, Rendered], values: str, tmp_path: Path
) -> None:
    text = notes(h, CI_VALUES / values, tmp_path)
    r = renders[values]
    names = {o["metadata"]["name"] for o in r.objects}
    for svc in ("txnwatch-collector", "txnwatch-stream"):
        assert f"svc/{svc}" in text and svc in names
    assert "deploy/txnwatch-collector" in text
    if values.startswith("spark-application"):
        assert "get sparkapplication txnwatch-stream" in text
        assert "logs txnwatch-stream-driver" in text  # the operator names the driver pod <app>-driver
        assert "Checkpoint: s3a://txnwatch-checkpoints/prod-eu" in text
    else:
        assert "deploy/txnwatch-stream" in text
    assert "coordinator view current: HANGING verdicts can be proven" in text
    assert "txnwatch proposals list" in text


# ------------------------------------------------------------------- custom resources only where their CRDs are

CUSTOM_KINDS = {"ServiceMonitor", "PrometheusRule", "SparkApplication"}


@pytest.mark.parametrize("values", sorted(MODES))
def test_without_the_crds_the_rest_renders_valid_and_the_notes_say_what_is_missing(
    h: Helm, values: str, tmp_path: Path
) -> None:
    r = rendered(h.template(CI_VALUES / values, api_versions=()))
    expected = sorted(k for k in MODES[values] if k not in CUSTOM_KINDS)
    assert r.kinds() == expected
    manifest = tmp_path / "rendered.yaml"
    manifest.write_text(r.text)
    report = kubeconform(manifest)
    assert report["returncode"] == 0, json.dumps(report["resources"], indent=1) + report["stderr"]
    assert report["summary"]["valid"] == len(r.objects), report["summary"]
    text = notes(h, CI_VALUES / values, tmp_path, api_versions=())
    assert "NOT INSTALLED: the ServiceMonitor" in text
    assert "NOT INSTALLED: the PrometheusRule" in text
    assert ("NOT INSTALLED: the streaming job" in text) == ("SparkApplication" in MODES[values])
    # and with them, nothing is said missing
    assert "NOT INSTALLED" not in notes(h, CI_VALUES / values, tmp_path / "with")


def test_each_crd_gates_only_its_own_kind(h: Helm) -> None:
    for crd in CRD_API_VERSIONS:
        kind = crd.rsplit("/", 1)[1]
        r = rendered(h.template(CI_VALUES / "spark-application-values.yaml", api_versions=(crd,)))
        assert CUSTOM_KINDS & set(r.kinds()) == {kind}, crd


# ------------------------------------------------------------------------------------ probes tied to progress


def component_containers(r: Rendered) -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(name, container, the pod's containers' ports by name) of every container running a component."""
    for d in r.all("Deployment"):
        for c in d["spec"]["template"]["spec"]["containers"]:
            yield d["metadata"]["name"], c, {p["name"]: p for p in c.get("ports", [])}
    for app in r.all("SparkApplication"):
        (c,) = app["spec"]["driver"]["template"]["spec"]["containers"]
        assert c["name"] == "spark-kubernetes-driver"  # the container spark-operator v2 names to spark-submit
        yield f"{app['metadata']['name']}/driver", c, {p["name"]: p for p in c.get("ports", [])}


@pytest.mark.parametrize("values", sorted(MODES))
def test_every_component_has_startup_liveness_and_readiness_probes_on_its_health_paths(
    renders: dict[str, Rendered], values: str
) -> None:
    seen = []
    for name, c, ports in component_containers(renders[values]):
        seen.append(name)
        assert "metrics" in ports, name
        for probe, path in (
            ("startupProbe", "/healthz"),
            ("livenessProbe", "/healthz"),
            ("readinessProbe", "/readyz"),
        ):
            assert c[probe]["httpGet"] == {"path": path, "port": "metrics"}, (name, probe)
        # a slow start (Spark's JVM) is held off liveness by a startup window longer than liveness's own
        startup = c["startupProbe"]["periodSeconds"] * c["startupProbe"]["failureThreshold"]
        live = c["livenessProbe"]["periodSeconds"] * c["livenessProbe"]["failureThreshold"]
        assert startup > live, name
    # the collector and the job (a Deployment or the SparkApplication's driver)
    assert len(seen) == 2, seen


def test_the_spark_application_pod_templates_are_valid_pods(
    renders: dict[str, Rendered], tmp_path: Path
) -> None:
    # spark-operator's CRD keeps `driver.template` / `executor.template` unchecked
    # (x-kubernetes-preserve-unknown-fields), so the probes and security contexts in them are validated here as
    # the Pods Spark builds from them.
    app = renders["spark-application-values.yaml"].one("SparkApplication")
    pods = [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"template-{role}"},
            "spec": app["spec"][role]["template"]["spec"],
        }
        for role in ("driver", "executor")
    ]
    manifest = tmp_path / "templates.yaml"
    manifest.write_text(yaml.safe_dump_all(pods))
    report = kubeconform(manifest)
    assert report["returncode"] == 0, json.dumps(report["resources"], indent=1) + report["stderr"]
    assert report["summary"]["valid"] == 2, report["summary"]


def test_the_drivers_startup_window_allows_a_slow_spark_start(renders: dict[str, Rendered]) -> None:
    for values in ("spark-application-values.yaml", "deployment-local-values.yaml"):
        windows = {
            name: c["startupProbe"]["periodSeconds"] * c["startupProbe"]["failureThreshold"]
            for name, c, _ in component_containers(renders[values])
        }
        (driver,) = [s for n, s in windows.items() if n.endswith(("-stream", "/driver"))]
        assert driver >= 300, windows  # minutes, not seconds: a JVM, a session and the queries start first


# ------------------------------------------------------------------------------------ alerting values


def test_runbook_base_url_and_extra_labels_reach_every_alert_and_the_dashboard(h: Helm) -> None:
    base = "https://wiki.example.org/kafka/txnwatch-runbook"
    r = rendered(
        h.template(
            CI_VALUES / "spark-application-values.yaml",
            set_values={
                "alerting.runbookBaseUrl": base + "/",
                "alerting.extraLabels.team": "kafka-platform",
                "alerting.extraLabels.severity": "info",  # a rule's own severity wins
            },
        )
    )
    source = {
        rule["alert"]: rule
        for group in yaml.safe_load(RULES.read_text())["groups"]
        for rule in group["rules"]
        if "alert" in rule
    }
    rendered_alerts = {
        rule["alert"]: rule for group in r.one("PrometheusRule")["spec"]["groups"] for rule in group["rules"]
    }
    assert set(rendered_alerts) == set(source)
    for name, rule in rendered_alerts.items():
        anchor = source[name]["annotations"]["runbook_url"].split("#")[1]
        assert rule["annotations"]["runbook_url"] == f"{base}#{anchor}", name
        assert rule["labels"] == {**source[name]["labels"], "team": "kafka-platform"}, name
        assert rule["expr"] == source[name]["expr"]
    (text,) = r.one("ConfigMap", "-dashboard")["data"].values()
    assert "github.com/txnwatch" not in text
    links = [link["url"] for panel in json.loads(text)["panels"] for link in panel.get("links", [])]
    assert links and all(url.startswith(base + "#") for url in links), links


def test_monitoring_labels_default_to_what_kube_prometheus_stack_selects(h: Helm) -> None:
    # deployment-local-values.yaml leaves metrics.* at the chart's defaults
    r = rendered(h.template(CI_VALUES / "deployment-local-values.yaml"))
    for kind in ("ServiceMonitor", "PrometheusRule"):
        assert r.one(kind)["metadata"]["labels"]["release"] == "kube-prometheus-stack", kind


# ------------------------------------------------------------------------------------ helm test


class _Ready(http.server.BaseHTTPRequestHandler):
    """/readyz: 503 for the first `not_ready` requests, then 200."""

    not_ready = 1
    asked = 0

    def do_GET(self) -> None:
        type(self).asked += 1
        ok = self.path == "/readyz" and type(self).asked > type(self).not_ready
        body = b"ready: last sweep published 1.0s ago\n" if ok else b"not ready: no sweep published yet\n"
        self.send_response(200 if ok else 503)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_helm_test_pod_asks_each_components_readyz_and_waits_for_it(renders: dict[str, Rendered]) -> None:
    r = renders["spark-application-values.yaml"]
    pod = r.one("Pod", "-test-ready")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    (c,) = pod["spec"]["containers"]
    assert c["command"] == ["python3", "-c"]
    script, *urls = c["args"]
    services = {s["metadata"]["name"]: s["spec"]["ports"][0]["port"] for s in r.all("Service")}
    assert urls == [f"http://{name}:{port}/readyz" for name, port in sorted(services.items())]

    # The script itself, against a real HTTP server: it waits through a 503, then passes on the 200 ...
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Ready)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/readyz"
        done = subprocess.run([sys.executable, "-c", script, url], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "waiting: HTTP 503: not ready: no sweep" in done.stdout and "ready: last sweep" in done.stdout
        # ... and fails, naming the reason, when it stays unready past its timeout
        _Ready.asked, _Ready.not_ready = 0, 10**6
        quick = script.replace("time.monotonic() + 240", "time.monotonic() + 1")
        assert quick != script
        done = subprocess.run([sys.executable, "-c", quick, url], capture_output=True, text=True, timeout=60)
        assert done.returncode == 1
        assert "/readyz: not ready: HTTP 503: not ready: no sweep published yet" in done.stderr
    finally:
        server.shutdown()
