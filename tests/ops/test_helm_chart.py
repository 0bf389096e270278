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
        "PrometheusRule",
        "Role",
        "RoleBinding",
        "Service",
        "Service",
        "ServiceAccount",
        "ServiceMonitor",
        "SparkApplication",
    ],
    # The optional values set: budgets on, extraEnv from a Secret, the monitoring objects' namespaces.
    "overrides-values.yaml": [
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


def test_every_ci_values_file_is_rendered_here() -> None:
    assert sorted(p.name for p in CI_VALUES.glob("*.yaml")) == sorted(MODES)


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


def test_spark_application_runs_the_jars_of_its_image_through_a_class_path_wildcard(
    renders: dict[str, Rendered],
) -> None:
    # Both JVMs get the image's jars folder as a Java class path wildcard: no jar file is named, so values can no
    # longer pin the jars of an older image (tests/ops/test_helm_image.py runs the form through spark-submit).
    spec = renders["spark-application-values.yaml"].one("SparkApplication")["spec"]
    assert "deps" not in spec
    conf = spec["sparkConf"]
    assert (
        conf["spark.driver.extraClassPath"]
        == conf["spark.executor.extraClassPath"]
        == "/opt/txnwatch/jars/spark/*"
    )
    assert conf["spark.jars.ivy"] == "/tmp/.ivy2"


@pytest.mark.parametrize("values", sorted(MODES))
def test_no_render_names_a_versioned_jar(renders: dict[str, Rendered], values: str) -> None:
    # A jar named with its version (spark-sql-kafka-0-10_2.13-4.2.0.jar) pins one Spark build in values while
    # sparkVersion and the image say another.
    assert not re.findall(r"[\w.-]+-[0-9][\w.]*\.jar\b", renders[values].text)


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


@pytest.mark.parametrize("values", ["spark-application-values.yaml", "overrides-values.yaml"])
def test_the_spark_application_pod_templates_are_valid_pods(
    renders: dict[str, Rendered], tmp_path: Path, values: str
) -> None:
    # spark-operator's CRD keeps `driver.template` / `executor.template` unchecked
    # (x-kubernetes-preserve-unknown-fields), so the probes and security contexts in them are validated here as
    # the Pods Spark builds from them.
    # (overrides-values.yaml: the driver's template carries extraEnv's valueFrom entries)
    app = renders[values].one("SparkApplication")
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


# ------------------------------------------------------------------------------------ values of the chart's own


def render_with(
    h: Helm, tmp_path: Path, values: dict[str, Any], base: str = "spark-application-values.yaml"
) -> Rendered:
    """The render of a ci/ values file with `values` on top (a file, so dotted keys and lists stay as written)."""
    extra = tmp_path / "extra-values.yaml"
    extra.write_text(yaml.safe_dump(values))
    return rendered(h.template(CI_VALUES / base, extra))


def render_error(
    h: Helm, tmp_path: Path, values: dict[str, Any], base: str = "spark-application-values.yaml"
) -> str:
    extra = tmp_path / "bad-values.yaml"
    extra.write_text(yaml.safe_dump(values))
    done = h.template(CI_VALUES / base, extra)
    assert done.returncode != 0, done.stdout[:2000]
    return done.stderr


def test_a_users_spark_conf_wins_over_the_charts_as_one_key(h: Helm, tmp_path: Path) -> None:
    cp = "/opt/txnwatch/jars/spark/*:/opt/extra/*"
    r = render_with(
        h, tmp_path, {"job": {"sparkApplication": {"sparkConf": {"spark.executor.extraClassPath": cp}}}}
    )
    conf = r.one("SparkApplication")["spec"]["sparkConf"]
    assert conf["spark.executor.extraClassPath"] == cp
    assert conf["spark.driver.extraClassPath"] == "/opt/txnwatch/jars/spark/*"
    assert r.text.count("spark.executor.extraClassPath:") == 1


def test_the_collector_runs_the_small_collector_image_and_the_job_the_stream_image(
    renders: dict[str, Rendered],
) -> None:
    for values, r in renders.items():
        collector = r.one("Deployment", "-collector")["spec"]["template"]["spec"]
        assert container(collector, "collector")["image"] == "txnwatch-collector:0.2.0", values
        (test,) = r.one("Pod", "-test-ready")["spec"]["containers"]
        assert test["image"] == "txnwatch-collector:0.2.0", values  # it runs Python's urllib only
        for d in r.all("Deployment"):
            if d["metadata"]["name"].endswith("-stream"):
                assert container(d["spec"]["template"]["spec"], "stream")["image"] == "txnwatch:0.2.0", values
        for app in r.all("SparkApplication"):
            assert app["spec"]["image"] == "txnwatch:0.2.0", values


@pytest.mark.parametrize(
    ("interval_s", "explicit_ms", "expected_ms"),
    [(10, None, 30_000), (30, None, 90_000), (2.5, None, 7_500), (30, 600_000, 600_000)],
)
def test_expire_after_follows_the_collector_interval(
    h: Helm,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    interval_s: float,
    explicit_ms: int | None,
    expected_ms: int,
) -> None:
    # The job forgets an open transaction no sweep confirmed for expire_after_ms: at a fixed 30 s, a 30 s sweep
    # interval made every open candidate RESOLVED between two sweeps and OPENED again at the next.
    values: dict[str, Any] = {
        "collector": {"intervalSeconds": interval_s},
        "job": {"expireAfterMs": explicit_ms},
    }
    for base in ("spark-application-values.yaml", "deployment-local-values.yaml"):
        r = render_with(h, tmp_path, values, base)
        collector = container(r.one("Deployment", "-collector")["spec"]["template"]["spec"], "collector")
        assert float(env_map(collector)["TXNWATCH_COLLECTOR__INTERVAL_S"]) == interval_s
        if base.startswith("spark"):
            env = r.one("SparkApplication")["spec"]["driver"]["envVars"]
        else:
            env = env_map(container(r.one("Deployment", "-stream")["spec"]["template"]["spec"], "stream"))
        settings = settings_from_env(env, monkeypatch)
        assert settings.stream.expire_after_ms == expected_ms, base
        assert settings.stream.expire_after_ms >= 2 * interval_s * 1000


def test_the_default_expiry_is_the_jobs_own_default(renders: dict[str, Rendered]) -> None:
    env = renders["spark-application-values.yaml"].one("SparkApplication")["spec"]["driver"]["envVars"]
    assert int(env["TXNWATCH_STREAM__EXPIRE_AFTER_MS"]) == Settings().stream.expire_after_ms


def test_extra_env_from_a_secret_reaches_the_driver_in_both_modes(
    h: Helm, renders: dict[str, Rendered], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = {"secretKeyRef": {"name": "kafka-oauth", "key": "client-secret"}}
    name = "TXNWATCH_KAFKA__SASL_OAUTH_CLIENT_SECRET"
    # SparkApplication: plain values as spark.kubernetes.driverEnv.*, valueFrom in the driver's pod template
    # container (whose env Spark keeps when it builds the driver container).
    spec = renders["overrides-values.yaml"].one("SparkApplication")["spec"]
    (driver,) = spec["driver"]["template"]["spec"]["containers"]
    assert driver["env"] == [{"name": name, "valueFrom": secret}]
    assert name not in spec["driver"]["envVars"]
    assert settings_from_env(spec["driver"]["envVars"], monkeypatch).detection.grace_ms == 10_000
    collector = container(
        renders["overrides-values.yaml"].one("Deployment", "-collector")["spec"]["template"]["spec"],
        "collector",
    )
    assert {"name": name, "valueFrom": secret} in collector["env"]
    # A Deployment driver: as the collector, in its container's env.
    extra = [{"name": name, "valueFrom": secret}, {"name": "TXNWATCH_DETECTION__GRACE_MS", "value": "9000"}]
    r = render_with(
        h, tmp_path, {"extraEnv": extra[:1], "job": {"extraEnv": extra[1:]}}, "deployment-local-values.yaml"
    )
    stream = container(r.one("Deployment", "-stream")["spec"]["template"]["spec"], "stream")
    assert {"name": name, "valueFrom": secret} in stream["env"]
    assert env_map(stream)["TXNWATCH_DETECTION__GRACE_MS"] == "9000"
    # the same name from a Secret replaces the chart's plain value, in a SparkApplication too
    r = render_with(h, tmp_path, {"job": {"extraEnv": [{"name": "TXNWATCH_CLUSTER", "valueFrom": secret}]}})
    spec = r.one("SparkApplication")["spec"]
    assert "TXNWATCH_CLUSTER" not in spec["driver"]["envVars"]
    assert spec["driver"]["template"]["spec"]["containers"][0]["env"] == [
        {"name": "TXNWATCH_CLUSTER", "valueFrom": secret}
    ]


def test_budgets_are_off_by_default_and_hold_evictions_when_on(renders: dict[str, Rendered]) -> None:
    # One replica each: maxUnavailable 1 would allow every eviction (a budget meaning nothing), so an enabled one
    # allows none of a ready pod.
    assert not renders["spark-application-values.yaml"].all("PodDisruptionBudget")
    r = renders["overrides-values.yaml"]
    budgets = {b["metadata"]["name"]: b["spec"] for b in r.all("PodDisruptionBudget")}
    assert sorted(budgets) == ["txnwatch-collector", "txnwatch-stream"]
    for name, spec in budgets.items():
        assert spec["maxUnavailable"] == 0 and spec["unhealthyPodEvictionPolicy"] == "AlwaysAllow", name
    # each selects exactly its component's one pod: the collector Deployment's, the driver's
    collector = r.one("Deployment", "-collector")["spec"]["template"]["metadata"]["labels"]
    assert budgets["txnwatch-collector"]["selector"]["matchLabels"].items() <= collector.items()
    driver = r.one("SparkApplication")["spec"]["driver"]["labels"]
    executor = r.one("SparkApplication")["spec"]["executor"]["labels"]
    assert budgets["txnwatch-stream"]["selector"]["matchLabels"].items() <= driver.items()
    assert not budgets["txnwatch-stream"]["selector"]["matchLabels"].items() <= executor.items()


def test_service_monitor_and_dashboard_options(renders: dict[str, Rendered]) -> None:
    default = renders["spark-application-values.yaml"]
    (endpoint,) = default.one("ServiceMonitor")["spec"]["endpoints"]
    assert (endpoint["interval"], endpoint["scrapeTimeout"]) == ("30s", "10s")
    assert "metricRelabelings" not in endpoint
    assert default.one("ServiceMonitor")["metadata"]["namespace"] == "monitoring"
    assert "annotations" not in default.one("ConfigMap", "-dashboard")["metadata"]

    r = renders["overrides-values.yaml"]
    sm = r.one("ServiceMonitor")
    assert sm["metadata"]["namespace"] == "monitoring-system"
    assert sm["spec"]["namespaceSelector"] == {
        "matchNames": ["monitoring"]
    }  # the Services stay where they are
    (endpoint,) = sm["spec"]["endpoints"]
    assert (endpoint["interval"], endpoint["scrapeTimeout"]) == ("1m", "20s")
    assert endpoint["relabelings"] == [
        {"action": "replace", "targetLabel": "cluster", "replacement": "prod-us"},
        {"action": "replace", "targetLabel": "team", "replacement": "kafka-platform"},
    ]
    assert endpoint["metricRelabelings"] == [{"action": "labeldrop", "regex": "pod"}]
    dash = r.one("ConfigMap", "-dashboard")["metadata"]
    assert dash["namespace"] == "grafana"
    assert dash["annotations"] == {"k8s-sidecar-target-directory": "Kafka"}
    assert dash["labels"]["grafana_dashboard"] == "1"


def test_the_test_pod_takes_its_resources_from_values(renders: dict[str, Rendered]) -> None:
    (c,) = renders["overrides-values.yaml"].one("Pod", "-test-ready")["spec"]["containers"]
    assert c["resources"] == {"requests": {"cpu": "20m", "memory": "48Mi"}, "limits": {"memory": "96Mi"}}
    (c,) = renders["spark-application-values.yaml"].one("Pod", "-test-ready")["spec"]["containers"]
    assert c["resources"]["limits"]["memory"] == "64Mi"


def test_chart_metadata_says_where_it_comes_from_and_what_it_needs(h: Helm) -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["home"].startswith("https://") and chart["sources"] and chart["kubeVersion"]
    done = h.run(
        "template",
        "txnwatch",
        str(CHART),
        "-f",
        str(CI_VALUES / "deployment-local-values.yaml"),
        "--kube-version",
        "1.26.0",
    )
    assert done.returncode != 0 and "incompatible with Kubernetes v1.26.0" in done.stderr, done.stderr


# ------------------------------------------------------------------------------------ per-alert overrides


def source_rules() -> list[tuple[str, dict[str, Any]]]:
    """(group name, alerting rule) of the rules file, in order."""
    return [
        (group["name"], rule)
        for group in yaml.safe_load(RULES.read_text())["groups"]
        for rule in group["rules"]
        if "alert" in rule
    ]


THRESHOLD_AT_END = re.compile(r"^(.*?)\s*(>=|<=|>|<)\s*[-+]?[0-9][0-9.]*(?:[eE][-+]?[0-9]+)?\s*$", re.S)


def test_alerts_are_disabled_and_overridden_by_name(h: Helm, tmp_path: Path) -> None:
    """Picked from the rules file as it is (another change adds alerts and severities): an alert of one rule with a
    threshold, an alert of several rules (one per severity) with a threshold, and one to disable."""
    rules = source_rules()
    names = [r["alert"] for _, r in rules]
    single = next(
        n for _, r in rules if names.count(n := r["alert"]) == 1 and THRESHOLD_AT_END.match(r["expr"])
    )
    several = next(
        (n for _, r in rules if names.count(n := r["alert"]) > 1 and THRESHOLD_AT_END.match(r["expr"])), None
    )
    disabled = next(n for n in names if n not in (single, several))
    overrides: dict[str, Any] = {
        single: {"for": "17m", "severity": "info", "threshold": 1234567},
        disabled: {"enabled": False},
    }
    if several is not None:
        own = [r["labels"]["severity"] for _, r in rules if r["alert"] == several]
        overrides[several] = {
            "threshold": 42.5,
            "bySeverity": {own[-1]: {"for": "3h"}, own[0]: {"enabled": False}},
        }
    r = render_with(
        h,
        tmp_path,
        {
            "alerting": {
                "rules": overrides,
                "additionalLabels": {"team": "kafka"},
                "extraLabels": {"team": "old", "tier": "2"},
            }
        },
    )
    out = [(g["name"], rule) for g in r.one("PrometheusRule")["spec"]["groups"] for rule in g["rules"]]

    expected = []
    for group, rule in rules:
        o = dict(overrides.get(rule["alert"], {}))
        o.update(o.pop("bySeverity", {}).get(rule["labels"]["severity"], {}))
        if o.get("enabled") is False:
            continue
        want = json.loads(json.dumps(rule))
        want["labels"] = {"team": "kafka", "tier": "2", **rule["labels"]}  # additionalLabels over extraLabels
        if "severity" in o:
            want["labels"]["severity"] = o["severity"]
        if "for" in o:
            want["for"] = o["for"]
        if "threshold" in o:
            m = THRESHOLD_AT_END.match(rule["expr"])
            assert m
            want["expr"] = f"{m.group(1)} {m.group(2)} {o['threshold']}"
        expected.append((group, want))
    assert out == expected
    assert disabled not in {rule["alert"] for _, rule in out}
    # the new threshold is what Prometheus compares against
    (single_rule,) = [rule for _, rule in out if rule["alert"] == single]
    assert single_rule["expr"].endswith(" 1234567") and (
        single_rule["for"],
        single_rule["labels"]["severity"],
    ) == ("17m", "info")


def test_a_group_whose_alerts_are_all_disabled_is_left_out(h: Helm, tmp_path: Path) -> None:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    first = groups[0]
    off = {rule["alert"]: {"enabled": False} for rule in first["rules"] if "alert" in rule}
    r = render_with(h, tmp_path, {"alerting": {"rules": off}})
    assert [g["name"] for g in r.one("PrometheusRule")["spec"]["groups"]] == [g["name"] for g in groups[1:]]


def test_alert_overrides_that_cannot_apply_fail_the_render_naming_why(h: Helm, tmp_path: Path) -> None:
    rules = source_rules()
    names = [r["alert"] for _, r in rules]
    err = render_error(h, tmp_path, {"alerting": {"rules": {"TxnwatchNoSuchAlert": {"enabled": False}}}})
    assert (
        "alerting.rules.TxnwatchNoSuchAlert: no alert of that name in deploy/prometheus/txnwatch-rules.yaml"
        in err
    )
    assert names[0] in err  # it lists the alerts there are
    no_threshold = next(r["alert"] for _, r in rules if not THRESHOLD_AT_END.match(r["expr"]))
    err = render_error(h, tmp_path, {"alerting": {"rules": {no_threshold: {"threshold": 5}}}})
    assert f"alerting.rules.{no_threshold}.threshold: its expression does not end in a comparison" in err
    err = render_error(
        h, tmp_path, {"alerting": {"rules": {names[0]: {"bySeverity": {"nosuch": {"for": "1m"}}}}}}
    )
    assert f"alerting.rules.{names[0]}.bySeverity.nosuch: that alert has no nosuch rule" in err
    several = next((n for n in names if names.count(n) > 1), None)
    if several is not None:
        err = render_error(h, tmp_path, {"alerting": {"rules": {several: {"for": "1m"}}}})
        assert f"alerting.rules.{several}: it is {names.count(several)} rules, one per severity" in err
    err = render_error(h, tmp_path, {"alerting": {"rules": {names[0]: {"for": "soon"}}}})
    assert f"at '/alerting/rules/{names[0]}/for'" in err


def test_other_bad_values_fail_the_render_naming_why(h: Helm, tmp_path: Path) -> None:
    err = render_error(
        h, tmp_path, {"metrics": {"serviceMonitor": {"interval": "15s", "scrapeTimeout": "20s"}}}
    )
    assert "metrics.serviceMonitor.scrapeTimeout (20s) is longer than its interval (15s)" in err
    err = render_error(h, tmp_path, {"collector": {"intervalSeconds": 30}, "job": {"expireAfterMs": 45000}})
    assert (
        "job.expireAfterMs: 45000 ms is shorter than two collector intervals (collector.intervalSeconds 30)"
        in err
    )
    err = render_error(h, tmp_path, {"job": {"sparkApplication": {"connectorJars": ["local:///x.jar"]}}})
    assert "additional properties 'connectorJars' not allowed" in err
    err = render_error(
        h,
        tmp_path,
        {"extraEnv": [{"name": "A", "value": "1", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]},
    )
    assert "at '/extraEnv/0'" in err
