"""End to end on a real Spark cluster: a standalone master and one worker on 127.0.0.1 (from the installed
pyspark distribution), `txnwatch stream --master spark://...` as its own process, the real collector and broker.

The executors run in the worker's JVM, not the driver's: the Kafka connector jars, the `__transaction_state`
codec and the rules must reach them. The hanging scenario must yield its candidate there too. The time from the
hanging transaction to its candidate (and the job's start-up) is printed, not asserted.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyspark
import pytest
from test_stream_e2e import read_topic, wait_for
from workloads import ROOT, run_workload

from detectors.models import AbortCandidate, HangingReason

# A master and a worker of their own, and the job on them (1.5 minutes and more): `make long`.
pytestmark = [pytest.mark.e2e, pytest.mark.long]

SPARK_HOME = Path(pyspark.__file__).resolve().parent
START_TIMEOUT_S = 90.0  # master up, worker registered
JOB_START_TIMEOUT_S = 360.0  # executors, Python workers, the first batches (one core)
DETECTION_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 30.0
MASTER = "org.apache.spark.deploy.master.Master"
WORKER = "org.apache.spark.deploy.worker.Worker"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spark_env() -> dict[str, str]:
    # SPARK_LOCAL_IP keeps every Spark socket (RPC, web UIs, block managers) on loopback.
    return {**os.environ, "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": "127.0.0.1"}


def stop(proc: subprocess.Popen[Any], sig: int = signal.SIGTERM) -> None:
    """Stop a process we started (and its children: each was started in its own session) by its pid."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, sig)
        proc.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=STOP_TIMEOUT_S)
    except ProcessLookupError:
        pass


def start(stack: ExitStack, cmd: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    out = stack.enter_context(log.open("wb"))
    proc = subprocess.Popen(
        cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True
    )
    stack.callback(stop, proc)
    return proc


def master_state(webui_port: int) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{webui_port}/json/", timeout=5) as r:
            return json.load(r)  # type: ignore[no-any-return]
    except OSError:
        return {}


@dataclass
class Cluster:
    master_url: str
    webui_port: int
    work_dir: Path
    logs: Path


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A Spark standalone master and one 1-core worker, stopped by pid at the end (even on failure)."""
    logs = tmp_path_factory.mktemp("spark-standalone")
    port, webui, worker_webui = free_port(), free_port(), free_port()
    spark_class = str(SPARK_HOME / "bin" / "spark-class")
    with ExitStack() as stack:
        began = time.monotonic()
        master = start(
            stack,
            [spark_class, MASTER, "--host", "127.0.0.1", "--port", str(port), "--webui-port", str(webui)],
            logs / "master.log",
            spark_env(),
        )
        wait_for(lambda: master.poll() is None and master_state(webui), START_TIMEOUT_S, "the Spark master")
        master_url = f"spark://127.0.0.1:{port}"
        worker = start(
            stack,
            [
                *(spark_class, WORKER, master_url, "--host", "127.0.0.1", "--cores", "1", "--memory", "1g"),
                *("--webui-port", str(worker_webui), "--work-dir", str(logs / "work")),
            ],
            logs / "worker.log",
            spark_env(),
        )

        def worker_alive() -> bool:
            assert worker.poll() is None, (logs / "worker.log").read_text()[-3000:]
            return any(w.get("state") == "ALIVE" for w in master_state(webui).get("workers", []))

        wait_for(worker_alive, START_TIMEOUT_S, "the worker to register with the master")
        print(f"\nstandalone master and worker up in {time.monotonic() - began:.1f}s")
        yield Cluster(master_url, webui, logs / "work", logs)


def candidates(bootstrap: str, topic: str) -> list[AbortCandidate]:
    return [AbortCandidate.model_validate_json(r.value) for r in read_topic(bootstrap, topic)]


# Its own bounds (start, first batches, detection, stops) add up to less than this; pytest's default is 600 s.
@pytest.mark.timeout(900)
def test_hanging_candidate_on_a_standalone_cluster(
    bootstrap: str, standalone: Cluster, tmp_path: Path
) -> None:
    prefix = f"sa{uuid.uuid4().hex[:8]}"
    metrics_port = free_port()
    common = ["--bootstrap-server", bootstrap, "--topic-prefix", prefix, "--cluster", "standalone"]
    with ExitStack() as stack:
        collector = start(
            stack,
            [
                sys.executable,
                "-m",
                "txnwatch_cli",
                "collect",
                *common,
                "--interval-ms",
                "5000",
                "--metrics-port",
                "0",
            ],
            tmp_path / "collector.log",
            dict(os.environ),
        )
        stream_log = tmp_path / "stream.log"
        began = time.monotonic()
        stream = start(
            stack,
            [
                *(sys.executable, "-m", "txnwatch_cli", "stream", *common, "--output", "json"),
                *("--master", standalone.master_url, "--checkpoint-location", str(tmp_path / "checkpoints")),
                *("--starting-offsets", "earliest", "--metrics-port", str(metrics_port)),
                *("--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.driver.bindAddress=127.0.0.1"),
                *("--conf", "spark.ui.enabled=false", "--conf", "spark.executor.memory=768m"),
            ],
            stream_log,
            {**spark_env(), "TXNWATCH_STREAM__EXPIRE_AFTER_MS": "20000"},
        )
        # SIGINT first: the job stops its queries (KeyboardInterrupt) before the group is terminated.
        stack.callback(stop, stream, signal.SIGINT)

        def job_started() -> bool:
            assert stream.poll() is None, stream_log.read_text()[-4000:]
            assert collector.poll() is None, (tmp_path / "collector.log").read_text()[-4000:]
            return "metrics on http://" in stream_log.read_text()

        wait_for(job_started, JOB_START_TIMEOUT_S, "the job's first batches on the cluster", poll_s=2)
        started_s = time.monotonic() - began

        # The work runs in an executor the worker launched, not in the driver.
        apps = master_state(standalone.webui_port).get("activeapps", [])
        assert [a["name"] for a in apps] == ["txnwatch-stream"], apps
        assert apps[0]["cores"] >= 1, apps
        executor_logs = list(standalone.work_dir.glob(f"{apps[0]['id']}/*/stderr"))
        assert executor_logs, f"no executor directory under {standalone.work_dir}"

        truth = run_workload(bootstrap, "--scenario", "hanging", "--topic-prefix", f"{prefix}-hang-")
        made_at = time.monotonic()
        (h,) = [t for t in truth["transactions"] if t["kind"] == "hanging"]

        def opened() -> list[AbortCandidate]:
            assert stream.poll() is None, stream_log.read_text()[-4000:]
            found = candidates(bootstrap, f"{prefix}.abort-candidates")
            return [c for c in found if c.topic == h["topic"] and c.status.value == "OPENED"]

        (c,) = wait_for(opened, DETECTION_TIMEOUT_S, "the hanging transaction's candidate", poll_s=2)
        detected_s = time.monotonic() - made_at
        print(f"job started on the cluster in {started_s:.1f}s; hanging -> candidate in {detected_s:.1f}s")
        assert c.reason is HangingReason.COORDINATOR_COMPLETED
        assert (c.spec.topic, c.spec.partition, c.spec.producer_id, c.spec.producer_epoch) == (
            h["topic"],
            h["partition"],
            h["producer_id"],
            h["producer_epoch"],
        )
        assert c.start_offset == h["start_offset"]
        # The executor ran Python tasks (the codec and the rules) in its own Python workers.
        ran = "\n".join(p.read_text(errors="replace") for p in executor_logs)
        assert "Finished task" in ran or "Running task" in ran, ran[-3000:]
