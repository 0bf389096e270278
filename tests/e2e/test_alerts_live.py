"""Live alerting: a real Prometheus 3.16 (dev/gotools.py) on 127.0.0.1 scrapes the real `txnwatch collect` and the
real streaming job while dev/workload.py makes a real hanging transaction (and a late one, and steady traffic);
the hanging alert of deploy/prometheus/txnwatch-rules.yaml must be seen firing through /api/v1/alerts, naming the
partition, the reason and the candidate.

The rules Prometheus loads are the real file's, with every `for:` shortened to 10 s (a test-only override; the
expressions are untouched). On the way, both /metrics bodies are checked against the documented contract and by
`promtool check metrics`, and the dashboard (deploy/grafana/txnwatch.json itself) is drawn from this Prometheus by
deploy/grafana/render.py, every panel of the JSON: into the test's tmp dir, and into docs/dashboard.png when
TXNWATCH_UPDATE_DASHBOARD_PNG=1. Then the runbook's end: `txnwatch proposals abort ID --execute`, and the alert
resolves. Last, the scrape targets vanish (each job's target list is emptied and Prometheus reloads its config,
as service discovery drops the target of a deleted pod: Prometheus ends its series with a staleness marker):
TxnwatchCollectorAbsent fires naming the cluster while the stream is still scraped, then TxnwatchStreamAbsent once
neither is, and the `up == 0` alerts stay quiet (there is no `up` series for them). The rules' own 5 minutes of `for` are promtool's to test
(deploy/prometheus/txnwatch-rules.test.yaml); here they are 10 s like every other.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from pyspark.sql import SparkSession
from test_stream_e2e import Console, first_batch_done, read_topic, wait_for
from workloads import ROOT, run_workload, start_workload

from common.settings import KafkaSettings, Settings, StreamSettings
from common.topics import TopicSettings
from detectors.models import AbortCandidate
from dev.gotools import ensure
from streaming import job

pytestmark = pytest.mark.e2e

RULES = ROOT / "deploy" / "prometheus" / "txnwatch-rules.yaml"
EXAMPLE_CONFIG = ROOT / "deploy" / "prometheus" / "prometheus.yml"
CLUSTER = "live"
SCRAPE_S = 2
FOR_OVERRIDE = "10s"
ALERT_TIMEOUT_S = 240.0


def load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"txnwatch_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


contract = load(ROOT / "tests" / "ops" / "metric_contract.py")
renderer = load(ROOT / "deploy" / "grafana" / "render.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


def api(base: str, path: str) -> Any:
    body = json.loads(get(f"{base}{path}"))
    assert body["status"] == "success", body
    return body["data"]


def rules_with_short_for(tmp: Path) -> Path:
    """The real rules, `for:` shortened; expressions, labels and annotations as they are. A critical twin of a
    warning (the same alert when it lasts) keeps its `for`: here txnwatch's own health must warn, not page."""
    doc = yaml.safe_load(RULES.read_text())
    warned = {
        r["alert"]
        for g in doc["groups"]
        for r in g["rules"]
        if r.get("labels", {}).get("severity") == "warning"
    }
    for group in doc["groups"]:
        group["interval"] = f"{SCRAPE_S}s"
        for rule in group["rules"]:
            twin = rule.get("alert") in warned and rule["labels"]["severity"] == "critical"
            if "for" in rule and not twin:
                rule["for"] = FOR_OVERRIDE
    out = tmp / "txnwatch-rules.live.yaml"
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    return out


class Prometheus:
    def __init__(self, tmp: Path, collector_port: int, stream_port: int) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        # deploy/prometheus/prometheus.yml with this test's targets, scrape interval and rules
        config = yaml.safe_load(EXAMPLE_CONFIG.read_text())
        config["global"] = {"scrape_interval": f"{SCRAPE_S}s", "evaluation_interval": f"{SCRAPE_S}s"}
        config["rule_files"] = [str(rules_with_short_for(tmp))]
        ports = {"txnwatch-collector": collector_port, "txnwatch-stream": stream_port}
        for job_config in config["scrape_configs"]:
            (target,) = job_config["static_configs"]
            target["targets"] = [f"127.0.0.1:{ports[job_config['job_name']]}"]
            target["labels"]["cluster"] = CLUSTER
        self.config_path = tmp / "prometheus.yml"
        self.config = config
        self.config_path.write_text(yaml.safe_dump(config))
        self.log = (tmp / "prometheus.log").open("w")
        self.proc = subprocess.Popen(
            [
                str(ensure("prometheus")),
                f"--config.file={tmp / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            cwd=tmp,
        )

    def ready(self) -> bool:
        assert self.proc.poll() is None, f"prometheus exited {self.proc.returncode}"
        try:
            return "Ready" in get(f"{self.base}/-/ready")
        except OSError:
            return False

    def stop_scraping(self, job_name: str) -> None:
        """Empty a scrape job's targets and reload the config (SIGHUP): its target vanishes, with a staleness
        marker on its series. (Removing the whole job instead stops its scrape pool without one: `up` then stays
        for Prometheus's 5-minute lookback, and the absent alerts fire that much later.)"""
        (job_config,) = [j for j in self.config["scrape_configs"] if j["job_name"] == job_name]
        (target,) = job_config["static_configs"]
        target["targets"] = []
        self.config_path.write_text(yaml.safe_dump(self.config))
        self.proc.send_signal(signal.SIGHUP)

    def firing(self) -> dict[str, list[dict[str, str]]]:
        """Firing alerts: name -> the label sets (with severity, without alertname)."""
        out: dict[str, list[dict[str, str]]] = {}
        for a in api(self.base, "/api/v1/alerts")["alerts"]:
            if a["state"] == "firing":
                labels = {k: v for k, v in a["labels"].items() if k != "alertname"}
                out.setdefault(a["labels"]["alertname"], []).append(labels)
        return out

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.log.close()


@pytest.fixture
def collector(bootstrap: str, tmp_path: Path) -> Iterator[tuple[str, int]]:
    prefix = f"alert{uuid.uuid4().hex[:8]}"
    port = free_port()
    log = (tmp_path / "collector.log").open("w")
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "txnwatch_cli", "collect", "--bootstrap-server", bootstrap),
            *(
                "--interval-ms",
                "2000",
                "--topic-prefix",
                prefix,
                "--cluster",
                CLUSTER,
                "--metrics-port",
                str(port),
            ),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
        env={**os.environ, "TXNWATCH_COLLECTOR__METRICS_ADDR": "127.0.0.1"},
    )
    try:
        yield prefix, port
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def hanging_alerts(prom: Prometheus) -> list[dict[str, Any]]:
    return [
        a
        for a in api(prom.base, "/api/v1/alerts")["alerts"]
        if a["labels"]["alertname"] == "TxnwatchHangingTransaction"
    ]


def test_hanging_alert_fires_in_a_real_prometheus(
    spark: SparkSession, bootstrap: str, collector: tuple[str, int], tmp_path: Path
) -> None:
    started = time.monotonic()
    prefix, collector_port = collector
    settings = Settings(
        cluster=CLUSTER,
        kafka=KafkaSettings(bootstrap_servers=bootstrap),
        topics=TopicSettings(prefix=prefix),
        stream=StreamSettings(
            checkpoint_location=str(tmp_path / "checkpoints"),
            trigger="3 seconds",
            starting_offsets="earliest",
            expire_after_ms=20_000,
            metrics_port=0,
        ),
    )
    opts = job.StreamOptions(settings=settings, kafka_options={"bootstrap.servers": bootstrap})
    job.ensure_topics(opts, settings.kafka.client_kwargs())
    running = job.start(spark, opts, out=Console())
    prom: Prometheus | None = None
    late_proc: subprocess.Popen[str] | None = None
    try:
        prom = Prometheus(tmp_path, collector_port, running.metrics_port)
        wait_for(prom.ready, 60, "prometheus ready")
        window_start = time.time()
        # The workloads start while the job starts up (it reads every source from the earliest offset).
        # A late transaction (held 70 s, backdated 2 min) and steady traffic beside the hanging one: the
        # dashboard shows what an SRE would see, and the alert must name only the hanging partition
        late_proc, late_truth = start_workload(
            bootstrap,
            *("--scenario", "late", "--topic-prefix", f"{prefix}-late-"),
            *("--hold-ms", "70000", "--backdate-ms", "120000"),
        )
        late = late_truth["transactions"][0]
        truth = run_workload(bootstrap, "--scenario", "hanging", "--topic-prefix", f"{prefix}-hang-")
        (h,) = [t for t in truth["transactions"] if t["kind"] == "hanging"]
        made_at = time.monotonic()
        run_workload(
            bootstrap, "--scenario", "steady", "--topic-prefix", f"{prefix}-steady-", "--seconds", "3"
        )
        wait_for(lambda: first_batch_done(running, "txnwatch-reconcile"), 240, "the job's first batch")

        # The metric contract on real scrapes, while the hanging transaction is there.
        def hanging_exported() -> str | None:
            body = get(f"http://127.0.0.1:{running.metrics_port}/metrics")
            return body if f'topic="{h["topic"]}"' in body and "open_since_timestamp" in body else None

        stream_body = wait_for(hanging_exported, ALERT_TIMEOUT_S, "the hanging transaction on /metrics")
        collector_body = get(f"http://127.0.0.1:{collector_port}/metrics")
        assert contract.contract_violations(stream_body, "txnwatch_", but="txnwatch_collector_") == []
        # each source's dead letters counted from its start (0 before the first), so a first one is an increase
        for source in ("producer-state", "transaction-log"):
            assert f'txnwatch_dead_letter_records_total{{source="{source}"}}' in stream_body, source
        assert contract.contract_violations(collector_body, "txnwatch_collector_") == []
        promtool = ensure("promtool")
        assert contract.promtool_check_metrics(promtool, stream_body) == ""
        assert contract.promtool_check_metrics(promtool, collector_body) == ""
        seen = contract.families(stream_body)
        for name, labels in contract.architecture().items():
            assert name in seen, f"{name} (ARCHITECTURE.md) not exposed"
            if seen[name][2]:
                assert seen[name][1] == labels, name

        # The alert, through Prometheus.
        # (orphans of other tests on a shared broker are still open, and hanging: each has its own alert)
        def firing() -> list[dict[str, Any]]:
            return [
                a
                for a in hanging_alerts(prom)
                if a["state"] == "firing" and a["labels"]["topic"] == h["topic"]
            ]

        (alert,) = wait_for(firing, ALERT_TIMEOUT_S, "TxnwatchHangingTransaction firing", poll_s=2)
        print(
            f"\nhanging alert firing {time.monotonic() - made_at:.1f}s after the hanging transaction was made"
        )

        def candidates() -> list[AbortCandidate]:
            records = read_topic(bootstrap, settings.topics.abort_candidates)
            return [
                c
                for c in (AbortCandidate.model_validate_json(r.value) for r in records)
                if c.topic == h["topic"]
            ]

        # the sink updates /metrics and writes the candidate in the same batch, in that order
        (candidate,) = wait_for(candidates, 60, "the hanging transaction's candidate on its topic")
        assert alert["labels"] == {
            "alertname": "TxnwatchHangingTransaction",
            "severity": "critical",
            "cluster": CLUSTER,
            "topic": h["topic"],
            "partition": str(h["partition"]),
            "transactional_id": h["transactional_id"],
            "producer_id": str(h["producer_id"]),
            "reason": "coordinator-completed",
            "candidate_id": candidate.candidate_id,
        }
        # what a pager shows: the partition, the cluster and how long it has been open
        summary = alert["annotations"]["summary"]
        assert summary.startswith(
            f"Hanging transaction on {h['topic']}-{h['partition']} of cluster {CLUSTER} "
        )
        assert "open for " in summary
        text = alert["annotations"]["description"]
        assert f"{h['topic']}-{h['partition']}" in text
        assert f"`txnwatch proposals show {candidate.candidate_id}`" in text
        opened = float(alert["value"])
        assert abs(opened * 1000 - candidate.evidence.first_seen_ms) < 120_000
        assert all(a["labels"]["topic"] != late["topic"] for a in hanging_alerts(prom))
        # The pipeline itself is healthy: none of its alerts fires. (The transaction alerts, and the view's while
        # the job catches up on a transaction log other tests filled, depend on what ran before on the broker.)
        broken = {
            "TxnwatchCollectorDown",
            "TxnwatchCollectorAbsent",
            "TxnwatchCollectorStale",
            "TxnwatchStreamDown",
            "TxnwatchStreamAbsent",
            "TxnwatchStreamStalled",
            "TxnwatchDeadLettersGrowing",
        }
        firing_now = {
            a["labels"]["alertname"]
            for a in api(prom.base, "/api/v1/alerts")["alerts"]
            if a["state"] == "firing"
        }
        assert not firing_now & broken, firing_now

        # The dashboard from this Prometheus.
        time.sleep(2 * SCRAPE_S)
        out = tmp_path / "dashboard.png"
        drawn = renderer.render_file(
            renderer.JSON_PATH,
            prom.base,
            out,
            start=window_start,
            end=time.time(),
            step=SCRAPE_S,
            rate_interval=f"{4 * SCRAPE_S}s",
        )
        print("\n".join(f"{d.title} [{d.type}]: {d.shows}" for d in drawn))
        (hanging_table,) = [d for d in drawn if d.title.startswith("Hanging transactions now")]
        (row,) = [r for r in hanging_table.rows if r["topic"] == h["topic"]]
        assert row["partition"] == str(h["partition"]) and row["reason"] == "coordinator-completed", row
        assert row["txnwatch proposals show"] == candidate.candidate_id and row["LSO lag (records)"], row
        assert out.stat().st_size > 50_000
        if os.environ.get("TXNWATCH_UPDATE_DASHBOARD_PNG") == "1":
            shutil.copyfile(out, ROOT / "docs" / "dashboard.png")

        # The runbook's last steps: the verified abort (the on-call command line), then the alert resolves.
        aborted = subprocess.run(
            [
                *(
                    sys.executable,
                    "-m",
                    "txnwatch_cli",
                    "proposals",
                    "abort",
                    candidate.candidate_id,
                    "--execute",
                ),
                *("--bootstrap-server", bootstrap, "--topic-prefix", prefix, "--cluster", CLUSTER),
                *("--actor", "test_alerts_live", "--output", "json"),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
        )
        assert aborted.returncode == 0, aborted.stdout + aborted.stderr
        aborted_at = time.monotonic()
        wait_for(lambda: not firing(), 120, "the hanging alert to resolve after the abort", poll_s=2)
        print(f"hanging alert resolved {time.monotonic() - aborted_at:.1f}s after the abort")

        # The targets vanish. First the collector's: the cluster's stream is still scraped, so the alert names it.
        prom.stop_scraping("txnwatch-collector")
        gone_at = time.monotonic()

        def collector_absent() -> dict[str, list[dict[str, str]]] | None:
            now = prom.firing()
            return now if "TxnwatchCollectorAbsent" in now else None

        now = wait_for(collector_absent, 90, "TxnwatchCollectorAbsent firing", poll_s=2)
        print(f"collector absent alert firing {time.monotonic() - gone_at:.1f}s after its target vanished")
        # txnwatch's own health warns first (its critical twin pages only when it lasts: promtool's to test)
        assert now["TxnwatchCollectorAbsent"] == [{"cluster": CLUSTER, "severity": "warning"}]
        assert "TxnwatchCollectorDown" not in now and "TxnwatchStreamAbsent" not in now, now
        # Then the stream's: nothing is scraped any more, and the stream's alert fires without labels.
        prom.stop_scraping("txnwatch-stream")
        gone_at = time.monotonic()

        def stream_absent() -> dict[str, list[dict[str, str]]] | None:
            now = prom.firing()
            return now if "TxnwatchStreamAbsent" in now else None

        now = wait_for(stream_absent, 90, "TxnwatchStreamAbsent firing", poll_s=2)
        print(f"stream absent alert firing {time.monotonic() - gone_at:.1f}s after its target vanished")
        assert now["TxnwatchStreamAbsent"] == [{"severity": "warning"}]
        assert "TxnwatchStreamDown" not in now and "TxnwatchCollectorDown" not in now, now
        print(f"live alert test: {time.monotonic() - started:.0f}s")
    finally:
        if prom is not None:
            prom.stop()
        running.stop()
        if late_proc is not None:
            late_proc.kill()
            late_proc.wait(timeout=30)
