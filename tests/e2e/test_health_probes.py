"""The probes tied to progress, as Kubernetes sees them: the real `txnwatch collect` and `txnwatch stream` run as
processes against a dedicated one-node test bed, whose broker is then paused (SIGSTOP: it keeps its sockets
and answers nothing, like a wedged broker).

Both components must stay live (their loops keep turning: requests time out and are retried, so a restart would
change nothing) and turn not ready within their windows (no sweep published, no batch finished). The job goes on
to its outage path (a query fails, it stops the queries and waits for Kafka) with its endpoint still answering,
or, when the pause caught the driver fetching offsets, waits not ready until Kafka answers; when the broker
resumes (SIGCONT) both are ready again. The bed is this module's own: pausing the session broker would stall
every other test.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from dev.kafka import Cluster, TestBedConfig, start_cluster, stop_cluster

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
# The windows, small so the test takes seconds: the collector sweeps every second and is ready while a sweep was
# published within 2 intervals + one 2 s request timeout (4 s); the job's reconcile query (2 s trigger) while it
# finished a batch within 3 triggers + 8 s (14 s), its 15 s-trigger queries within 53 s.
COLLECTOR_ENV = {"TXNWATCH_COLLECTOR__READY_INTERVALS": "2"}
STREAM_ENV = {"TXNWATCH_STREAM__READY_INTERVALS": "3", "TXNWATCH_STREAM__READY_SLACK_S": "8"}
# Spark's Kafka clients give up on a paused broker after 20 s (consumers: 60 s by default; the sink's producer:
# 120 s, when the pause catches a batch writing), so the job's outage path runs within the test: its queries
# fail, it stops them and waits for Kafka. The consumers ignore the producer's keys and the producer theirs.
STREAM_PROPERTIES = (
    "request.timeout.ms=10000\ndefault.api.timeout.ms=20000\ndelivery.timeout.ms=20000\nmax.block.ms=20000\n"
)
# A task's Kafka consumer polls for up to spark.network.timeout (120 s) before its position times out: measured,
# the pause then took 146 s (and once over 190 s) to fail a query. 40 s here (and the heartbeat check's interval,
# which Spark wants no longer).
STREAM_SPARK_CONF = ("--conf", "spark.network.timeout=40s", "--conf", "spark.network.timeoutInterval=20s")
# How long a query may take to fail once the job turned unready (poll 40 s + position 20 s + the batch's other
# reads, with room for a loaded machine), when one does fail (see the test).
QUERY_FAILS_WITHIN_S = 150
FIRST_BATCH_S = 300.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def probe(port: int, path: str) -> tuple[int, str]:
    """Status and body of a probe; 0 when nothing answers (not up yet, or gone)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read().decode().strip()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode().strip()
    except OSError as exc:
        return 0, str(exc)


@dataclass
class Component:
    name: str
    port: int
    popen: subprocess.Popen[bytes]
    log: Path

    def probe(self, path: str) -> tuple[int, str]:
        return probe(self.port, path)

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(timeout=30)


def launch(name: str, args: list[str], env: dict[str, str], directory: Path, port: int) -> Component:
    log = directory / f"{name}.log"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TXNWATCH_")}
    with log.open("wb") as out:
        popen = subprocess.Popen(
            [sys.executable, "-m", "txnwatch_cli", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env=clean | {"PYSPARK_PYTHON": sys.executable} | env,
            start_new_session=True,  # its own group: Spark's JVM and Python workers stop with it
        )
    return Component(name, port, popen, log)


def wait_until(what: str, timeout_s: float, check: Callable[[], bool], *alive: Component) -> float:
    """Seconds until `check()` holds; fails when it does not within `timeout_s` or a component exits."""
    began = time.monotonic()
    while not check():
        for c in alive:
            assert c.popen.poll() is None, f"{c.name} exited while waiting for {what}:\n{c.output()}"
        assert time.monotonic() - began < timeout_s, f"timed out after {timeout_s:.0f}s waiting for {what}"
        time.sleep(0.5)
    return time.monotonic() - began


@dataclass
class Bed:
    cluster: Cluster
    collector: Component
    stream: Component

    @property
    def broker_pid(self) -> int:
        (node,) = self.cluster.nodes
        return node.pid


@pytest.fixture(scope="module")
def bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bed]:
    directory = tmp_path_factory.mktemp("probes")
    cluster = start_cluster(TestBedConfig(nodes=1), directory / "bed")
    started: list[Component] = []
    try:
        prefix = f"prb{uuid.uuid4().hex[:6]}"
        common = [
            "--bootstrap-server",
            cluster.bootstrap_servers,
            "--topic-prefix",
            prefix,
            "--cluster",
            "probes",
        ]
        collector_port, stream_port = free_port(), free_port()
        collector = launch(
            "collector",
            ["collect", *common, "--interval", "1", "--request-timeout-ms", "2000"],
            COLLECTOR_ENV | {"TXNWATCH_COLLECTOR__METRICS_PORT": str(collector_port)},
            directory,
            collector_port,
        )
        started.append(collector)
        properties = directory / "stream.properties"
        properties.write_text(STREAM_PROPERTIES)
        stream = launch(
            "stream",
            [
                "stream",
                *common,
                *("--checkpoint-location", str(directory / "checkpoints"), "--master", "local[2]"),
                *("--trigger", "2 seconds", "--metrics-port", str(stream_port)),
                *("--command-config", str(properties)),
                *STREAM_SPARK_CONF,
            ],
            STREAM_ENV,
            directory,
            stream_port,
        )
        started.append(stream)
        yield Bed(cluster, collector, stream)
    finally:
        # Never leave the broker paused, whatever happened: it could not even be stopped then.
        with contextlib.suppress(ProcessLookupError):
            os.kill(cluster.nodes[0].pid, signal.SIGCONT)
        for c in started:
            c.stop()
        stop_cluster(directory / "bed")
        print(f"\nprobe test logs in {directory}")


def test_a_paused_broker_makes_both_unready_but_not_dead_and_they_recover(bed: Bed) -> None:
    collector, stream = bed.collector, bed.stream
    took = wait_until(
        "the collector to be ready", 120, lambda: collector.probe("/readyz")[0] == 200, collector, stream
    )
    print(f"\ncollector ready {took:.1f}s after launch")
    assert collector.probe("/healthz")[0] == 200
    metrics = collector.probe("/metrics")[1]
    assert (
        "txnwatch_build_info{" in metrics and "txnwatch_collector_last_success_timestamp_seconds" in metrics
    )
    # Every query of the job has run a batch (its first takes a minute or two on two cores).
    took = wait_until("the job to be ready", FIRST_BATCH_S, lambda: stream.probe("/readyz")[0] == 200, stream)
    print(f"job ready {took:.1f}s later")
    assert stream.probe("/healthz")[0] == 200
    assert "txnwatch_build_info{" in stream.probe("/metrics")[1]

    live: dict[str, list[int]] = {"collector": [], "stream": []}  # every /healthz answer while paused

    def readiness(c: Component) -> tuple[int, str]:
        live[c.name].append(c.probe("/healthz")[0])
        return c.probe("/readyz")

    os.kill(bed.broker_pid, signal.SIGSTOP)
    try:
        paused_at = time.monotonic()
        took = wait_until(
            "the collector to turn unready", 30, lambda: readiness(collector)[0] == 503, collector
        )
        status, why = collector.probe("/readyz")
        print(f"collector unready {took:.1f}s after the pause: {why}")
        assert status == 503 and why.startswith("not ready: last sweep published")
        took = wait_until("the job to turn unready", 60, lambda: readiness(stream)[0] == 503, stream)
        status, why = stream.probe("/readyz")
        print(f"job unready {took:.1f}s after the pause: {why}")
        assert status == 503 and why.startswith("not ready: last txnwatch-reconcile batch")
        # Where the pause catches a task, Spark's Kafka client gives up (a 40 s poll, then 20 s for its position:
        # STREAM_SPARK_CONF and STREAM_PROPERTIES) and a query fails; the job stops its queries and waits for
        # Kafka, its endpoint up and saying so. Where it catches the driver fetching offsets, no query fails:
        # Spark's consumer-based offset reader (the one that sees __transaction_state) timed out its first
        # attempt and then waited in its retry for as long as the broker was paused (175 s once), and the job
        # stays not ready, having said once that Kafka does not answer. Either way the loop that waits is live.
        stopped = "not ready: the queries are stopped: Kafka does not answer"
        began = time.monotonic()
        while readiness(stream)[1] != stopped and time.monotonic() - began < QUERY_FAILS_WITHIN_S:
            assert stream.popen.poll() is None, stream.output()
            time.sleep(1)
        status, why = stream.probe("/readyz")
        if why == stopped:
            print(f"job stopped its queries {time.monotonic() - paused_at:.1f}s after the pause")
            # /metrics goes on serving what the stopped queries last knew, marked stale below (not 503: that
            # would drop the hanging series and resolve their pages).
        else:
            print(
                f"job still waiting on its queries {time.monotonic() - paused_at:.1f}s after the pause: {why}"
            )
            assert status == 503 and why.startswith("not ready: last txnwatch-"), why
            assert "txnwatch stream: Kafka does not answer" in stream.log.read_text(errors="replace")
        # Not ready either way, so /metrics says its values are stale (the same decision as /readyz).
        status, body = stream.probe("/metrics")
        stale = [line for line in body.splitlines() if line.startswith("txnwatch_stream_state_stale{")]
        assert status == 200 and len(stale) == 1 and stale[0].endswith(" 1.0"), body
        for _ in range(3):  # and the collector still retries
            readiness(collector)
        # Both loops kept turning (requests time out and are retried): live throughout, no restart wanted.
        assert set(live["collector"]) == {200} and set(live["stream"]) == {200}, live
        print(
            f"paused for {time.monotonic() - paused_at:.1f}s; /healthz asked {sum(map(len, live.values()))} times"
        )
    finally:
        os.kill(bed.broker_pid, signal.SIGCONT)

    took = wait_until(
        "the collector to be ready again", 60, lambda: collector.probe("/readyz")[0] == 200, collector
    )
    print(f"collector ready again {took:.1f}s after the broker resumed")
    took = wait_until(
        "the job to be ready again", FIRST_BATCH_S, lambda: stream.probe("/readyz")[0] == 200, stream
    )
    print(f"job ready again {took:.1f}s after the broker resumed")
    assert collector.probe("/healthz")[0] == 200 and stream.probe("/healthz")[0] == 200
    assert stream.probe("/metrics")[0] == 200
