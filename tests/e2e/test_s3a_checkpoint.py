"""End to end on an object-store checkpoint: `txnwatch stream --checkpoint-location s3a://...` against a real S3
API, stopped and restarted on the same checkpoint, keeps its state.

The S3 server is moto's server mode (a real HTTP S3 API, started here on a free 127.0.0.1 port and stopped at the
end) through s3_server.py, which answers `Expect: 100-continue` once, as S3 does: moto's own launcher answers twice,
and the SDK client that uploads RocksDB's SST files fails on the second (s3_server.py says how). The job is the real
CLI as a process with the s3a connector `make jars` resolves (hadoop-aws and the AWS SDK modules of
dev/jvm/spark/pom.xml), configured as a user would: `--conf spark.hadoop.fs.s3a.*` for the endpoint,
credentials in the environment. A real orphan gets one OPENED candidate; the job is stopped (SIGTERM), its
checkpoint is read back from the bucket, and the restarted job, on the same checkpoint, does not open it again.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml
from test_faults_e2e import read_topic
from test_stream_e2e import wait_for
from workloads import ROOT, batches_committed, produce_plain, run_workload

from detectors.models import AbortCandidate

# Two job starts; each is a minute or two on a quiet machine, several on a loaded one.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

CLUSTER = "e2e-s3a"
BUCKET = "txnwatch-checkpoints"
# moto accepts any key pair; they reach the job the way a pod gets them from a Secret: the environment.
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "txnwatch-test", "AWS_SECRET_ACCESS_KEY": "txnwatch-test-secret"}
DETECTION_TIMEOUT_S = 240.0
START_TIMEOUT_S = 300.0
# Batches the restarted job must commit before the test counts OPENED records. The first already holds every
# snapshot the collector (2 s sweeps) published while the job was down, the orphan's among them: enough for a
# job without its state to open the candidate again (checked by pointing the restart at a fresh location).
BATCHES_AFTER_RESTART = 3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def interim_responses(port: int) -> list[bytes]:
    """The status lines a PUT with `Expect: 100-continue` gets back, as the SDK sends it: headers, then the body
    once the first 100 is in."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(
            b"PUT /no-such-bucket/key HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 2\r\n"
            b"Expect: 100-continue\r\nConnection: close\r\n\r\n"
        )
        answer = s.recv(65536)
        s.sendall(b"{}")
        while chunk := s.recv(65536):
            answer += chunk
    return [line for line in answer.split(b"\r\n") if line.startswith(b"HTTP/1.1 ")]


@contextlib.contextmanager
def s3_server(directory: Path) -> Iterator[str]:
    """moto's S3 server on 127.0.0.1 (s3_server.py); yields its endpoint URL."""
    port = free_port()
    log = (directory / "moto.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("s3_server.py")), "127.0.0.1", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:

        def listening() -> bool:
            assert proc.poll() is None, (directory / "moto.log").read_text()
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
            return False

        wait_for(listening, 30, "moto's S3 server", 0.2)
        # One interim 100, then the final answer: with two, every SST upload fails (S3 status 100); with none, the
        # SDK would wait for it before sending the body.
        statuses = interim_responses(port)
        assert [line[9:12] for line in statuses] == [b"100", b"404"], statuses
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


class Proc:
    """A txnwatch process in its own session (SIGTERM reaches Spark's JVM and Python workers too), output in
    files numbered per run."""

    def __init__(self, name: str, args: list[str], directory: Path, env: dict[str, str]) -> None:
        self.name, self.args, self.directory, self.env = name, args, directory, env
        self.popen: subprocess.Popen[bytes] | None = None
        self.runs = 0

    @property
    def log(self) -> Path:
        return self.directory / f"{self.name}-{self.runs}.log"

    def start(self, args: list[str] | None = None) -> None:
        self.runs += 1
        with self.log.open("wb") as out:
            self.popen = subprocess.Popen(
                args or self.args, stdout=out, stderr=out, cwd=ROOT, start_new_session=True, env=self.env
            )

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def stop(self) -> int | None:
        if self.popen is None or self.popen.poll() is not None:
            return None if self.popen is None else self.popen.returncode
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGTERM)
        try:
            return self.popen.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.popen.pid, signal.SIGKILL)
            return self.popen.wait(timeout=30)

    def text(self) -> str:
        return self.log.read_text(errors="replace")


@dataclass
class Rig:
    bootstrap: str
    prefix: str
    s3: Any
    job: Proc
    checkpoint: str  # the s3a:// URI
    server_log: Path  # moto's access log: one line per request

    def sst_puts(self) -> Counter[str]:
        """How many times each RocksDB SST file was PUT: an upload the client took for failed is sent again, while
        moto has stored it at the first (it answered 200 after reading the body)."""
        return Counter(re.findall(r'"PUT (/\S+\.sst) HTTP', self.server_log.read_text(errors="replace")))

    def keys(self, under: str = "") -> list[str]:
        pages = self.s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=f"{self.root}{under}")
        return [o["Key"] for page in pages for o in page.get("Contents", [])]

    @property
    def root(self) -> str:
        return self.checkpoint.removeprefix(f"s3a://{BUCKET}/").rstrip("/") + "/"

    def batches_done(self) -> int:
        """Micro-batches the reconcile query committed, read from the bucket (`<query>/commits/<batch id>`)."""
        return batches_committed(self.keys("txnwatch-reconcile/commits/"))

    def wait_batches(self, more_than: int, what: str) -> int:
        def done() -> int:
            assert self.job.alive(), self.job.text()[-4000:]
            return self.batches_done() if self.batches_done() > more_than else 0

        return int(wait_for(done, START_TIMEOUT_S, what, 2))

    def opened(self, topic: str) -> list[AbortCandidate]:
        records = read_topic(self.bootstrap, f"{self.prefix}.abort-candidates")
        candidates = [AbortCandidate.model_validate_json(r.value) for r in records if r.value is not None]
        return [c for c in candidates if c.topic == topic and c.status.value == "OPENED"]


@pytest.fixture(scope="module")
def rig(bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    directory = tmp_path_factory.mktemp("s3a")
    prefix = f"e2es3{uuid.uuid4().hex[:8]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TXNWATCH_", "AWS_"))}
    env |= {"PYSPARK_PYTHON": sys.executable, **CREDENTIALS}
    common = ["--bootstrap-server", bootstrap, "--topic-prefix", prefix, "--cluster", CLUSTER]
    with s3_server(directory) as endpoint:
        s3 = boto3.client(
            "s3",
            endpoint_url=endpoint,
            region_name="us-east-1",
            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        )
        s3.create_bucket(Bucket=BUCKET)
        checkpoint = f"s3a://{BUCKET}/{prefix}/checkpoints"
        collector = Proc(
            "collector",
            [
                sys.executable,
                "-m",
                "txnwatch_cli",
                "collect",
                *common,
                "--interval-ms",
                "2000",
                "--metrics-port",
                "0",
            ],
            directory,
            env,
        )
        job = Proc(
            "stream",
            [
                *(sys.executable, "-m", "txnwatch_cli", "stream", *common),
                *("--checkpoint-location", checkpoint, "--trigger", "2 seconds", "--master", "local[2]"),
                *("--starting-offsets", "earliest", "--expire-after-ms", "20000", "--metrics-port", "0"),
                *("--output", "json"),
                # What docs/deploy.md tells a user to pass for an S3-compatible store (moto answers any region).
                *("--conf", f"spark.hadoop.fs.s3a.endpoint={endpoint}"),
                *("--conf", "spark.hadoop.fs.s3a.endpoint.region=us-east-1"),
                *("--conf", "spark.hadoop.fs.s3a.path.style.access=true"),
                # RocksDB's snapshots (its SST files, uploaded with copyFromLocalFile: the path that failed against
                # moto's launcher) are made every 10 batches and uploaded by the maintenance task every 60 s by
                # default; a job stopped sooner would have only changelogs in the bucket. Every batch and every 5 s
                # here, so each run uploads SST files before the restart and restores from them after it.
                *("--conf", "spark.sql.streaming.stateStore.minDeltasForSnapshot=1"),
                *("--conf", "spark.sql.streaming.stateStore.maintenanceInterval=5s"),
            ],
            directory,
            env,
        )
        try:
            collector.start()
            job.start()
            yield Rig(bootstrap, prefix, s3, job, checkpoint, directory / "moto.log")
        finally:
            job.stop()
            collector.stop()
            print(f"\ns3a rig logs in {directory}")


@pytest.mark.long  # about 2-4 minutes: `make long` and `make test-s3a`; the chart's jar list below stays in make test
def test_restart_on_an_s3a_checkpoint_keeps_state(rig: Rig) -> None:
    started = time.monotonic()
    first = rig.wait_batches(0, "the job's first batch committed to the bucket")
    print(f"\nfirst batch on s3a after {time.monotonic() - started:.0f}s")

    truth = run_workload(rig.bootstrap, "--scenario", "hanging", "--topic-prefix", f"{rig.prefix}-hang-")
    (h,) = [t for t in truth["transactions"] if t["kind"] == "hanging"]
    produce_plain(rig.bootstrap, h["topic"], h["partition"], b"after-the-orphan")
    (candidate,) = wait_for(lambda: rig.opened(h["topic"]), DETECTION_TIMEOUT_S, "the orphan's OPENED", 2)
    assert (candidate.partition, candidate.start_offset) == (h["partition"], h["start_offset"])

    code = rig.job.stop()
    assert code is not None, "the job did not end on SIGTERM"
    # The checkpoint is really in the bucket: both queries' offsets and commits, and the stateful stages' state.
    keys = rig.keys()
    for query in ("txnwatch-reconcile", "txnwatch-windows"):
        assert any(k.startswith(f"{rig.root}{query}/offsets/") for k in keys), (query, keys[:20])
        assert any(k.startswith(f"{rig.root}{query}/commits/") for k in keys), (query, keys[:20])
    assert any("/state/" in k for k in keys), keys[:20]
    assert any("/state/" in k and k.endswith(".sst") for k in keys), (
        "no RocksDB snapshot (SST files) uploaded"
    )
    # Against a server answering `Expect: 100-continue` twice every SST upload fails and is retried (the bucket
    # still gets the file): at least one must have gone through at its first PUT.
    puts = rig.sst_puts()
    assert 1 in puts.values(), f"every SST upload was retried: {puts}"
    assert not (ROOT / "s3a:").exists(), "the checkpoint went to a local folder named s3a:"
    stopped_at = rig.batches_done()
    assert stopped_at > first

    restarted = time.monotonic()
    rig.job.start()
    rig.wait_batches(stopped_at + BATCHES_AFTER_RESTART, "batches committed after the restart")
    print(
        f"restarted on the s3a checkpoint: {BATCHES_AFTER_RESTART} batches in {time.monotonic() - restarted:.0f}s"
    )
    # Still hanging (nobody aborted it), re-read after the restart, and not opened again: the restored state
    # remembers the candidate.
    opened = rig.opened(h["topic"])
    assert [c.candidate_id for c in opened] == [candidate.candidate_id], opened


def test_the_chart_puts_every_resolved_jar_on_the_driver_class_path() -> None:
    """Under the SparkApplication the driver's class path is the chart's `classPath` (jars added later reach only
    the executors), and the driver writes the checkpoint's offsets and commits: it must cover every jar `make jars`
    (and the image) resolves, the s3a ones included. It is the image's jars folder as a Java wildcard, which takes
    every jar there (tests/ops/test_helm_image.py runs a driver on it)."""
    resolved = sorted(p.name for p in (ROOT / ".cache" / "jars" / "spark").glob("*.jar"))
    assert resolved, "no jars in .cache/jars/spark: run `make jars`"
    values = yaml.safe_load((ROOT / "helm" / "txnwatch" / "values.yaml").read_text())
    assert "/opt/txnwatch/jars/spark/*" in values["job"]["sparkApplication"]["classPath"].split(":")
