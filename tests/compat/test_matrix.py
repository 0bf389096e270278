"""The compatibility matrix (issue 31): the whole product against each Apache Kafka release, one cell per release.

Per cell, on its own one-node test bed of that release (dev/kafka.py, jars from Maven Central): real orphans of every
kind dev/workload.py makes (`hanging`, `hanging-after-abort`, `hanging-multi`, `hanging-offsets`); that release's own
`kafka-transactions.sh find-hanging` as the oracle; the collector in describe mode (`collect --once
--coordinator-source describe`) and in primary mode (a running `collect`) feeding the streaming job until every
orphan is HANGING with its reason; `inspect partition` and `inspect coordinator-log`; `proposals abort` as a dry run
and with `--execute` for every candidate, then the oracle again (nothing hangs); and every `__transaction_state`
record the broker wrote decoded with detectors.codec (no failure).

Each cell's steps, timings and the first failure are written to benchmarks/results/compat.json (docs/compatibility.md's
table). `make compat` runs every cell; `make test` runs the two that differ most from 4.3 (3.9 ZooKeeper, 4.0 at
transaction version 0): the others carry the `compat` marker, which `make test` leaves out.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaConsumer
from kafka.structs import TopicPartition
from pyspark.sql import SparkSession
from workloads import produce_plain, read_committed_values, run_workload

from common.settings import KafkaSettings, Settings, StreamSettings
from common.topics import TopicSettings
from detectors.codec import DecodeError, decode_key, decode_value
from detectors.models import AbortCandidate, HangingReason
from dev import oracle
from dev.kafka import Cluster, TestBedConfig, start_cluster, stop_cluster
from streaming import job

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "compat.json"
HOUR_MS = 3_600_000
DETECTION_TIMEOUT_S = 300.0
# Every orphan the workload makes; dev/workload.py's scenarios of kind "hanging".
ORPHAN_SCENARIOS = ("hanging", "hanging-after-abort", "hanging-multi", "hanging-offsets")


@dataclass(frozen=True)
class Cell:
    version: str
    metadata: str  # "kraft" | "zookeeper"
    transaction_version: int  # what the cell formats (4.0+); before 4.0 every transaction is version 0

    @property
    def name(self) -> str:
        return f"{self.version}-{self.metadata}-tv{self.transaction_version}"


# The newest patch of each minor on Maven Central (dev/kafka_versions.LATEST_PATCHES).
CELLS = (
    Cell("3.5.2", "kraft", 0),
    Cell("3.6.2", "kraft", 0),
    Cell("3.7.2", "zookeeper", 0),
    Cell("3.8.1", "kraft", 0),
    Cell("3.9.2", "kraft", 0),
    Cell("3.9.2", "zookeeper", 0),
    Cell("4.0.2", "kraft", 0),
    Cell("4.0.2", "kraft", 2),
    Cell("4.1.2", "kraft", 2),
    Cell("4.2.2", "kraft", 2),
    Cell("4.3.1", "kraft", 2),
    Cell("4.4.0", "kraft", 2),
)
# In `make test`: the two cells that differ most from 4.3 (a ZooKeeper 3.x broker; 4.0 writing v0 records).
IN_MAKE_TEST = {"3.9.2-zookeeper-tv0", "4.0.2-kraft-tv0"}


def _params() -> list[Any]:
    return [
        pytest.param(c, id=c.name, marks=() if c.name in IN_MAKE_TEST else (pytest.mark.compat,))
        for c in CELLS
    ]


@dataclass
class Record:
    """One cell's result, as written to compat.json."""

    cell: Cell
    steps: dict[str, dict[str, Any]] = field(default_factory=dict)
    failure: str | None = None
    # What failed but has a workaround an operator can apply, which the cell then applied to measure the rest.
    findings: list[str] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)

    def step(self, name: str, action: Callable[[], Any]) -> Any:
        """Run one step, timed; a failure is recorded with its message and ends the cell (later steps need it)."""
        began = time.monotonic()
        try:
            detail = action()
        except BaseException as exc:
            self.steps[name] = {"ok": False, "seconds": round(time.monotonic() - began, 1)}
            self.failure = (
                f"{name}: {type(exc).__name__}: {str(exc)[-1500:]}"  # a log tail ends with the error
            )
            raise
        self.steps[name] = {"ok": True, "seconds": round(time.monotonic() - began, 1)}
        if isinstance(detail, dict):
            self.steps[name].update(detail)
        return detail

    def as_json(self) -> dict[str, Any]:
        return {
            "cell": self.cell.name,
            "version": self.cell.version,
            "metadata": self.cell.metadata,
            "transaction_version": self.cell.transaction_version,
            "passed": self.failure is None,
            "failure": self.failure,
            "findings": self.findings,
            "seconds": round(time.monotonic() - self.started, 1),
            "measured_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "steps": self.steps,
        }


def write_result(record: Record) -> None:
    """Merge this cell into compat.json (one entry per cell, the latest run of it)."""
    try:
        cells = json.loads(RESULTS.read_text())["cells"]
    except (OSError, ValueError, KeyError):
        cells = {}
    cells[record.cell.name] = record.as_json()
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"cells": dict(sorted(cells.items()))}, indent=2) + "\n")


def wait_for(predicate: Callable[[], Any], timeout_s: float, what: str, poll_s: float = 2.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")


def txnwatch(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """The real console script, as an operator runs it (no TXNWATCH_ settings leak in from the test run)."""
    return subprocess.run(
        [sys.executable, "-m", "txnwatch_cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if not k.startswith("TXNWATCH_")},
    )


def read_topic(bootstrap: str, topic: str) -> list[Any]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, consumer_timeout_ms=3000)
    try:
        parts = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or []]
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        return list(consumer)
    finally:
        consumer.close()


def orphan_key(t: dict[str, Any]) -> tuple[str, int, int, int]:
    return (str(t["topic"]), int(t["partition"]), int(t["producer_id"]), int(t["start_offset"]))


def oracle_hanging(cluster: Cluster, version: str) -> set[tuple[str, int, int, int]]:
    """That release's own find-hanging, on the one broker, with no threshold (hanging-offsets is not backdated)."""
    rows = oracle.find_hanging(
        cluster.bootstrap_servers, broker_id=1, max_transaction_timeout_min=0, kafka_version=version
    )
    return {(r["Topic"], int(r["Partition"]), int(r["ProducerId"]), int(r["StartOffset"])) for r in rows}


def decode_transaction_log(bootstrap: str) -> dict[str, Any]:
    """Every `__transaction_state` record the broker wrote, decoded with the job's codec: failures must be 0."""
    records = read_topic(bootstrap, "__transaction_state")
    failures: list[str] = []
    versions: dict[str, int] = {}
    for r in records:
        try:
            decode_key(r.key)
            value = decode_value(r.value)
        except DecodeError as exc:
            failures.append(f"{r.partition}@{r.offset}: {exc}")
            continue
        label = "tombstone" if value is None else f"v{value.version}"
        versions[label] = versions.get(label, 0) + 1
    assert records, "no __transaction_state record to decode"
    assert failures == [], failures[:5]
    return {"records": len(records), "value_versions": versions, "failures": 0}


@pytest.fixture
def cell_cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Cluster]:
    cell: Cell = request.param
    cfg = TestBedConfig(
        nodes=1,
        partition_verification=False,  # the workload's orphans need it off (KIP-890)
        transaction_version=cell.transaction_version,
        kafka_version=cell.version,
        metadata="zookeeper" if cell.metadata == "zookeeper" else "kraft",
    )
    cluster = start_cluster(cfg, tmp_path / "testbed")
    try:
        yield cluster
    finally:
        stop_cluster(tmp_path / "testbed")


@pytest.mark.timeout(900)
@pytest.mark.parametrize("cell_cluster", _params(), indirect=True)
def test_cell(
    cell_cluster: Cluster, spark: SparkSession, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    cell: Cell = request.node.callspec.params["cell_cluster"]
    cluster = cell_cluster
    bootstrap = cluster.bootstrap_servers
    record = Record(cell)
    record.steps["broker_start"] = {"ok": True, "seconds": round(cluster.started_in_s, 1)}
    prefix = f"cm{uuid.uuid4().hex[:8]}"
    collector: subprocess.Popen[str] | None = None
    running: job.RunningJob | None = None
    try:
        truths: dict[str, list[dict[str, Any]]] = {}

        def make_orphans() -> dict[str, Any]:
            for scenario in ORPHAN_SCENARIOS:
                truth = run_workload(
                    bootstrap,
                    "--scenario",
                    scenario,
                    "--topic-prefix",
                    f"{prefix}-{scenario}-",
                    "--backdate-ms",
                    str(HOUR_MS),
                )
                truths[scenario] = [t for t in truth["transactions"] if t["kind"] == "hanging"]
                assert truths[scenario], f"{scenario} made no orphan"
            (h,) = truths["hanging"]
            # Held back from read_committed readers until the orphan is aborted (checked after --execute).
            produce_plain(bootstrap, h["topic"], h["partition"], b"after-the-orphan")
            return {"orphans": sum(len(v) for v in truths.values())}

        record.step("orphans", make_orphans)
        orphans = {orphan_key(t) for ts in truths.values() for t in ts}

        def oracle_before() -> dict[str, Any]:
            seen = wait_for(lambda: orphans <= oracle_hanging(cluster, cell.version), 60, "find-hanging")
            return {"found": len(orphans), "agrees": bool(seen)}

        record.step("oracle_find_hanging", oracle_before)

        def describe_mode() -> dict[str, Any]:
            done = txnwatch(
                "collect",
                "--bootstrap-server",
                bootstrap,
                "--once",
                "--coordinator-source",
                "describe",
                "--output",
                "json",
                "--topic-prefix",
                prefix,
            )
            assert done.returncode == 0, done.stderr[-2000:]
            missing = [t for t in {o[0] for o in orphans} if t not in done.stdout]
            assert missing == [], f"the describe-mode sweep names none of {missing}"
            return {}

        record.step("collect_describe_once", describe_mode)

        settings = Settings(
            cluster="compat",
            kafka=KafkaSettings(bootstrap_servers=bootstrap),
            topics=TopicSettings(prefix=prefix),
            stream=StreamSettings(
                checkpoint_location=str(tmp_path / "checkpoints"),
                trigger="5 seconds",
                starting_offsets="earliest",
                expire_after_ms=20_000,
                metrics_port=0,
            ),
        )
        log = (tmp_path / "collector.log").open("w")

        def start_collector() -> dict[str, Any]:
            nonlocal collector
            collector = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "txnwatch_cli",
                    "collect",
                    "--bootstrap-server",
                    bootstrap,
                    "--interval",
                    "5",
                    "--topic-prefix",
                    prefix,
                    "--cluster",
                    "compat",
                    "--metrics-port",
                    "0",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                text=True,
                cwd=ROOT,
                env={k: v for k, v in os.environ.items() if not k.startswith("TXNWATCH_")},
            )
            time.sleep(3)
            assert collector.poll() is None, (tmp_path / "collector.log").read_text()[-2000:]
            return {}

        record.step("collect_primary", start_collector)

        def start_job() -> dict[str, Any]:
            nonlocal running
            opts = job.StreamOptions(settings=settings, kafka_options={"bootstrap.servers": bootstrap})
            job.ensure_topics(opts, settings.kafka.client_kwargs())
            running = job.start(spark, opts)
            return {}

        record.step("stream_start", start_job)

        def candidates() -> list[AbortCandidate]:
            return [
                AbortCandidate.model_validate_json(r.value)
                for r in read_topic(bootstrap, settings.topics.abort_candidates)
                if r.value is not None
            ]

        def all_hanging() -> dict[str, Any]:
            def opened() -> list[AbortCandidate] | None:
                if collector is not None and collector.poll() is not None:
                    raise AssertionError(
                        f"the collector exited: {(tmp_path / 'collector.log').read_text()[-2000:]}"
                    )
                found = [c for c in candidates() if c.status.value == "OPENED"]
                keys = {(c.topic, c.partition, c.spec.producer_id, c.start_offset) for c in found}
                return found if orphans <= keys else None

            found = wait_for(opened, DETECTION_TIMEOUT_S, "an OPENED candidate for every orphan")
            reasons = sorted({str(c.reason) for c in found})
            # The workload's orphans are all left behind by a transaction its coordinator completed.
            assert all(c.reason is HangingReason.COORDINATOR_COMPLETED for c in found), reasons
            return {"candidates": len(found), "reasons": reasons}

        record.step("stream_hanging", all_hanging)
        opened = [c for c in candidates() if c.status.value == "OPENED"]

        def inspect() -> dict[str, Any]:
            (h,) = truths["hanging"]
            part = txnwatch(
                "inspect",
                "partition",
                "--bootstrap-server",
                bootstrap,
                "--topic",
                h["topic"],
                "--partition",
                str(h["partition"]),
                "--output",
                "json",
            )
            assert part.returncode == 0, part.stderr[-2000:]
            assert str(h["producer_id"]) in part.stdout, part.stdout[-2000:]
            log_dump = txnwatch(
                "inspect",
                "coordinator-log",
                "--bootstrap-server",
                bootstrap,
                "--from-beginning",
                "--timeout-ms",
                "3000",
                "--output",
                "json",
            )
            assert log_dump.returncode == 0, log_dump.stderr[-2000:]
            assert h["transactional_id"] in log_dump.stdout
            return {}

        record.step("inspect", inspect)

        def proposals(*args: str) -> subprocess.CompletedProcess[str]:
            return txnwatch(
                "proposals",
                *args,
                "--bootstrap-server",
                bootstrap,
                "--cluster",
                "compat",
                "--topic-prefix",
                prefix,
                "--output",
                "json",
            )

        def abort_dry_run() -> dict[str, Any]:
            for c in opened:
                done = proposals("abort", c.candidate_id)
                assert done.returncode == 0, (
                    f"{c.topic}-{c.partition}: {done.stdout[-1500:]} {done.stderr[-1500:]}"
                )
            return {"candidates": len(opened)}

        record.step("abort_dry_run", abort_dry_run)

        def abort_execute() -> dict[str, Any]:
            outcomes = []
            for c in opened:
                done = proposals("abort", c.candidate_id, "--execute", "--actor", "compat")
                assert done.returncode == 0, (
                    f"{c.topic}-{c.partition}: {done.stdout[-1500:]} {done.stderr[-1500:]}"
                )
                outcomes.append(json.loads(done.stdout)["outcome"])
            assert set(outcomes) == {"ABORTED"}, outcomes
            (h,) = truths["hanging"]
            assert b"after-the-orphan" in read_committed_values(
                bootstrap, h["topic"], h["partition"], h["start_offset"]
            )
            return {"aborted": len(outcomes)}

        record.step("abort_execute", abort_execute)

        def oracle_after() -> dict[str, Any]:
            left = oracle_hanging(cluster, cell.version) & orphans
            assert left == set(), f"find-hanging still reports {sorted(left)}"
            return {}

        record.step("oracle_after_abort", oracle_after)
        record.step("decode_transaction_log", lambda: decode_transaction_log(bootstrap))
    finally:
        if running is not None:
            running.stop()
        if collector is not None:
            collector.terminate()
            collector.wait(timeout=30)
        write_result(record)
