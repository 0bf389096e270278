"""Security on the real broker: SASL_PLAINTEXT SCRAM-SHA-256, the StandardAuthorizer and no ACL = denied.

One SASL test bed for the module (dev/kafka.py `security="sasl-scram"`). Every txnwatch component runs as its own
SCRAM user through `--command-config`, with exactly the ACLs docs/security.md lists: its `kafka-acls.sh` lines are
parsed from the page and granted (our own prefix stands for `txnwatch.`, the workload's topic prefix for `'*'`).
Then: the collector sweeps, inspection explains, the real streaming job (Spark, a subprocess) proves a real orphan
and proposes it, `proposals abort --execute` aborts it as the abort principal; one documented ACL removed per
component gives one line naming it and no traceback; the random SCRAM passwords never appear in anything printed,
scraped, published or in `--help`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaAdminClient, KafkaConsumer
from kafka.admin import (
    ACL,
    ACLFilter,
    ACLOperation,
    ACLPermissionType,
    ACLResourcePatternType,
    ResourcePattern,
    ResourcePatternFilter,
    ResourceType,
)
from kafka.structs import TopicPartition

import dev.kafka as testbed
from common.client_properties import parse_client_properties
from detectors.contract import TRANSACTION_LOG_TOPIC
from detectors.models import AbortCandidate, AuditRecord
from dev import workload

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "security.md"
CLUSTER = "secure"
DETECTION_TIMEOUT_S = 300.0

_OPERATIONS = {
    "Read": ACLOperation.READ,
    "Write": ACLOperation.WRITE,
    "Create": ACLOperation.CREATE,
    "Describe": ACLOperation.DESCRIBE,
    "DescribeConfigs": ACLOperation.DESCRIBE_CONFIGS,
    "Alter": ACLOperation.ALTER,
}


# ------------------------------------------------------------------------------------- the documented ACLs


def documented_lines() -> list[list[str]]:
    """The `kafka-acls.sh` command lines of docs/security.md, split like a shell would."""
    block = DOCS.read_text().split("<!-- acl-lines:begin -->")[1].split("<!-- acl-lines:end -->")[0]
    lines = block.replace("\\\n", " ").splitlines()
    return [shlex.split(line) for line in lines if line.strip().startswith("kafka-acls.sh")]


def parse_acl_line(argv: list[str], *, prefix: str, watched: str) -> list[ACL]:
    """One `kafka-acls.sh --add` line → the ACLs it creates; `txnwatch.` topics get `prefix`, topic `*` becomes
    the topics under `watched` (PREFIXED). Unknown options fail: the page must say only what this understands."""
    assert argv[0] == "kafka-acls.sh", argv
    principal: str | None = None
    operations: list[ACLOperation] = []
    resources: list[tuple[ResourceType, str]] = []
    pattern = ACLResourcePatternType.LITERAL
    i = 1
    while i < len(argv):
        option = argv[i]
        if option in ("--bootstrap-server", "--command-config"):
            i += 2
        elif option == "--add":
            i += 1
        elif option == "--allow-principal":
            principal = argv[i + 1]
            i += 2
        elif option == "--operation":
            operations.append(_OPERATIONS[argv[i + 1]])
            i += 2
        elif option == "--topic":
            resources.append((ResourceType.TOPIC, argv[i + 1]))
            i += 2
        elif option == "--group":
            resources.append((ResourceType.GROUP, argv[i + 1]))
            i += 2
        elif option == "--transactional-id":
            resources.append((ResourceType.TRANSACTIONAL_ID, argv[i + 1]))
            i += 2
        elif option == "--cluster":
            resources.append((ResourceType.CLUSTER, "kafka-cluster"))
            i += 1
        elif option == "--resource-pattern-type":
            pattern = ACLResourcePatternType[argv[i + 1].upper()]
            i += 2
        else:
            raise AssertionError(f"docs/security.md: unexpected kafka-acls.sh option {option}")
    assert principal and operations and resources, argv
    acls = []
    for rtype, name in resources:
        rpattern = pattern
        if rtype is ResourceType.TOPIC and name == "*":
            name, rpattern = watched, ACLResourcePatternType.PREFIXED
        elif rtype is ResourceType.TOPIC and name.startswith("txnwatch."):
            name = f"{prefix}.{name.removeprefix('txnwatch.')}"
        for op in operations:
            acls.append(
                ACL(principal, "*", op, ACLPermissionType.ALLOW, ResourcePattern(rtype, name, rpattern))
            )
    return acls


def _key(acl: ACL) -> tuple[str, str, str, str, str]:
    r = acl.resource_pattern
    return (acl.principal, r.resource_type.name, r.resource_name, r.pattern_type.name, acl.operation.name)


# ---------------------------------------------------------------------------------------------- the bed


@dataclass
class Secure:
    cluster: testbed.Cluster
    prefix: str  # txnwatch's topics
    watched: str  # the workload's topics (what `'*'` stands for)
    documented: list[ACL]
    admin: KafkaAdminClient  # the super user
    secrets: list[str]  # every SCRAM password of the test bed
    work: Path
    printed: list[str] = field(default_factory=list)  # everything a txnwatch process printed

    def config(self, user: str) -> Path:
        return self.cluster.client_properties(user)

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TXNWATCH_")}
        env["TXNWATCH_COLLECTOR__METRICS_ADDR"] = "127.0.0.1"
        return env

    def args(self, user: str) -> list[str]:
        return [
            "--bootstrap-server",
            self.cluster.bootstrap_servers,
            "--command-config",
            str(self.config(user)),
            "--cluster",
            CLUSTER,
            "--topic-prefix",
            self.prefix,
        ]

    def txnwatch(self, user: str, *command: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Run `txnwatch COMMAND...` as `user`; what it prints is checked for secrets and kept."""
        done = subprocess.run(
            [sys.executable, "-m", "txnwatch_cli", *command, *self.args(user)],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            cwd=ROOT,
            env=self.env(),
        )
        self.saw(done.stdout + done.stderr)
        return done

    def saw(self, text: str) -> None:
        self.printed.append(text)
        leaked = [s for s in self.secrets if s in text]
        assert not leaked, "a SCRAM password was printed"

    def acls(self, principal: str, rtype: ResourceType, name: str, op: ACLOperation) -> list[ACL]:
        return [
            a
            for a in self.documented
            if a.principal == f"User:{principal}"
            and a.resource_pattern.resource_type is rtype
            and a.resource_pattern.resource_name == name
            and a.operation is op
        ]

    @contextlib.contextmanager
    def without(self, principal: str, rtype: ResourceType, name: str, op: ACLOperation) -> Iterator[None]:
        """One documented ACL removed for the duration."""
        (acl,) = self.acls(principal, rtype, name, op)
        r = acl.resource_pattern
        flt = ACLFilter(
            acl.principal,
            "*",
            op,
            ACLPermissionType.ALLOW,
            ResourcePatternFilter(r.resource_type, r.resource_name, r.pattern_type),
        )
        self.admin.delete_acls([flt])
        wait_acls(self.admin, lambda present: _key(acl) not in present)
        try:
            yield
        finally:
            grant(self.admin, [acl])


def present_acls(admin: KafkaAdminClient) -> set[tuple[str, str, str, str, str]]:
    flt = ACLFilter(
        None,
        None,
        ACLOperation.ANY,
        ACLPermissionType.ANY,
        ResourcePatternFilter(ResourceType.ANY, None, ACLResourcePatternType.ANY),
    )
    acls, _ = admin.describe_acls(flt)
    return {_key(a) for a in acls}


def wait_acls(admin: KafkaAdminClient, ok: Any, timeout_s: float = 15) -> None:
    # ACLs are metadata records: a single broker applies them at once, but wait for what DescribeAcls says.
    deadline = time.monotonic() + timeout_s
    while not ok(present_acls(admin)):
        assert time.monotonic() < deadline, "ACL change not visible"
        time.sleep(0.2)
    time.sleep(0.5)


def grant(admin: KafkaAdminClient, acls: list[ACL]) -> None:
    result = admin.create_acls(acls)
    assert not result["failed"], result["failed"]
    wanted = {_key(a) for a in acls}
    wait_acls(admin, lambda present: wanted <= present)


def secrets_of(cluster: testbed.Cluster) -> list[str]:
    out = []
    for user in cluster.client_configs:
        kwargs = parse_client_properties(cluster.client_properties(user).read_text()).kwargs
        out.append(str(kwargs["sasl_plain_password"]))
    return out


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secure]:
    state = tmp_path_factory.mktemp("sasl-testbed")
    cluster = testbed.start_cluster(
        testbed.TestBedConfig(security="sasl-scram", partition_verification=False), state
    )
    admin: KafkaAdminClient | None = None
    try:
        tag = uuid.uuid4().hex[:8]
        prefix, watched = f"sec{tag}", f"wl{tag}-"
        documented = [
            a for line in documented_lines() for a in parse_acl_line(line, prefix=prefix, watched=watched)
        ]
        admin = KafkaAdminClient(**cluster.client_kwargs())
        workload_acls = [
            ACL(
                "User:workload",
                "*",
                op,
                ACLPermissionType.ALLOW,
                ResourcePattern(rtype, watched, ACLResourcePatternType.PREFIXED),
            )
            for rtype, ops in (
                (ResourceType.TOPIC, (ACLOperation.CREATE, ACLOperation.WRITE, ACLOperation.DESCRIBE)),
                (ResourceType.TRANSACTIONAL_ID, (ACLOperation.WRITE, ACLOperation.DESCRIBE)),
            )
            for op in ops
        ]
        grant(admin, documented + workload_acls)
        yield Secure(
            cluster, prefix, watched, documented, admin, secrets_of(cluster), tmp_path_factory.mktemp("sec")
        )
    finally:
        if admin is not None:
            admin.close()
        testbed.stop_cluster(state)


# ---------------------------------------------------------------------------------------------- an orphan


@dataclass(frozen=True)
class Orphan:
    topic: str
    partition: int
    producer_id: int
    producer_epoch: int
    start_offset: int
    transactional_id: str


def make_orphan(secure: Secure, name: str) -> Orphan:
    """dev/workload.py's `hanging` scenario as the SCRAM user `workload`: a committed transaction that also wrote,
    unverified (Produce v9), to a partition its coordinator never added; then its producer restarts
    (`workload.restart_owner`: InitProducerId moves the id to the next epoch), so the abort needs no
    --allow-live-owner."""
    kwargs = secure.cluster.client_kwargs("workload")
    security = {k: v for k, v in kwargs.items() if k != "bootstrap_servers"}
    admin = KafkaAdminClient(**kwargs)
    try:
        topic, orphan_topic = f"{secure.watched}{name}", f"{secure.watched}{name}-orphan"
        workload.ensure_topics(admin, [topic, orphan_topic], 1)
        txn_id = f"{secure.watched}{name}-{uuid.uuid4().hex[:6]}"
        producer = workload._producer(secure.cluster.bootstrap_servers, txn_id, **security)
        pid, epoch = workload._pid_epoch(producer)
        producer.begin_transaction()
        producer.send(topic, value=b"committed", partition=0).get(timeout=30)
        offset = workload.raw_transactional_produce(
            admin,
            topic=orphan_topic,
            partition=0,
            transactional_id=txn_id,
            producer_id=pid,
            producer_epoch=epoch,
            base_sequence=0,
            timestamp_ms=int(time.time() * 1000),
            value=b"orphan",
        )
        producer.commit_transaction()
        producer.close(timeout=10)
        assert workload.restart_owner(secure.cluster.bootstrap_servers, txn_id, **security) == epoch + 1
    finally:
        admin.close()
    return Orphan(orphan_topic, 0, pid, epoch, offset, txn_id)


@pytest.fixture(scope="module")
def orphan(secure: Secure) -> Orphan:
    return make_orphan(secure, "hang")


def read_all(secure: Secure, topic: str) -> list[Any]:
    consumer = KafkaConsumer(
        **secure.cluster.client_kwargs(), enable_auto_commit=False, consumer_timeout_ms=3000
    )
    try:
        parts = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or []]
        if not parts:
            return []  # not created yet
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        return list(consumer)
    finally:
        consumer.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()


def one_clear_line(stderr: str, needle: str) -> None:
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if needle in line]
    assert len(lines) == 1, stderr
    print(f"\nmissing-ACL line: {lines[0]}")


# ------------------------------------------------------------------------------------------------ collector


def test_collector_sweeps_with_its_documented_acls(secure: Secure, orphan: Orphan) -> None:
    done = secure.txnwatch("txnwatch-collector", "collect", "--once", "--publish", "--output", "json")
    assert done.returncode == 0, done.stderr
    sweep = json.loads(done.stdout)
    assert sweep["problems"] == []
    (snap,) = [s for s in sweep["snapshots"] if s["topic"] == orphan.topic]
    (txn,) = snap["open_transactions"]
    assert (txn["producer_id"], txn["start_offset"]) == (orphan.producer_id, orphan.start_offset)
    assert txn["start_timestamp_ms"] is not None  # the start batch was fetched
    assert snap["max_transaction_timeout_ms"] == 60_000  # DescribeConfigs
    (position,) = sweep["coordinator_log_positions"]
    assert position["topic"] == TRANSACTION_LOG_TOPIC and position["end_offsets"]
    assert "WARNING" not in done.stderr and "ERROR" not in done.stderr, done.stderr


def test_collector_names_missing_describe_on_the_transaction_log(secure: Secure, orphan: Orphan) -> None:
    with secure.without("txnwatch-collector", ResourceType.TOPIC, TRANSACTION_LOG_TOPIC, ACLOperation.READ):
        done = secure.txnwatch("txnwatch-collector", "collect", "--once", "--output", "json")
    assert done.returncode == 0, done.stderr  # it keeps sweeping what it may
    assert json.loads(done.stdout)["coordinator_log_positions"] == []
    one_clear_line(done.stderr, "grant the ACL Describe on topic __transaction_state")


# -------------------------------------------------------------------------------------------------- inspect


def test_inspect_works_with_its_documented_acls(secure: Secure, orphan: Orphan) -> None:
    done = secure.txnwatch(
        "txnwatch-admin",
        "inspect",
        "partition",
        "--topic",
        orphan.topic,
        "--partition",
        "0",
        "--output",
        "json",
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["max_transaction_timeout_ms"] == 60_000
    (txn,) = report["open_transactions"]
    # The coordinator side was read (Describe on transactional ids): the id that owns the producer, restarted
    # after its completed transaction (Empty at the next epoch).
    assert txn["coordinator"]["transactional_id"] == orphan.transactional_id
    assert txn["coordinator"]["state"] == "Empty" and txn["coordinator"]["error"] is None
    assert txn["coordinator"]["producer_epoch"] == orphan.producer_epoch + 1
    log = secure.txnwatch(
        "txnwatch-admin",
        "inspect",
        "coordinator-log",
        "--transactional-id",
        orphan.transactional_id,
        "--from-beginning",
        "--timeout-ms",
        "3000",
        "--output",
        "json",
    )
    assert log.returncode == 0, log.stderr
    states = [json.loads(line)["state"] for line in log.stdout.splitlines()]
    assert "CompleteCommit" in states


def test_inspect_names_missing_read_on_the_transaction_log(secure: Secure, orphan: Orphan) -> None:
    with secure.without("txnwatch-admin", ResourceType.TOPIC, TRANSACTION_LOG_TOPIC, ACLOperation.READ):
        done = secure.txnwatch(
            "txnwatch-admin", "inspect", "coordinator-log", "--from-beginning", "--timeout-ms", "2000"
        )
    assert done.returncode == 1
    one_clear_line(done.stderr, "grant the ACL Read on topic __transaction_state")


# --------------------------------------------------------------------------------------------------- stream


def stream_command(secure: Secure, metrics_port: int, checkpoint: Path, seconds: float) -> list[str]:
    return [
        sys.executable,
        "-m",
        "txnwatch_cli",
        "stream",
        *secure.args("txnwatch-stream"),
        "--master",
        "local[2]",
        "--checkpoint-location",
        str(checkpoint),
        "--trigger",
        "3 seconds",
        "--starting-offsets",
        "earliest",
        "--metrics-host",
        "127.0.0.1",
        "--metrics-port",
        str(metrics_port),
        "--conf",
        "spark.ui.enabled=false",
        "--conf",
        "spark.ui.showConsoleProgress=false",
        "--output",
        "table",
        "--seconds",
        str(seconds),
    ]


def test_stream_names_missing_read_on_the_transaction_log(secure: Secure, tmp_path: Path) -> None:
    with secure.without("txnwatch-stream", ResourceType.TOPIC, TRANSACTION_LOG_TOPIC, ACLOperation.READ):
        done = subprocess.run(
            stream_command(secure, free_port(), tmp_path / "ck", 30),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            cwd=ROOT,
            env=secure.env(),
        )
    secure.saw(done.stdout + done.stderr)
    assert done.returncode == 1
    one_clear_line(done.stderr, "grant the ACL Read on topic __transaction_state")


def test_stream_names_missing_read_on_its_consumer_groups(secure: Secure, tmp_path: Path) -> None:
    with secure.without("txnwatch-stream", ResourceType.GROUP, "spark-kafka-source-", ACLOperation.READ):
        done = subprocess.run(
            stream_command(secure, free_port(), tmp_path / "ck", 30),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            cwd=ROOT,
            env=secure.env(),
        )
    secure.saw(done.stdout + done.stderr)
    assert done.returncode == 1
    one_clear_line(
        done.stderr, "grant the ACL Read on group spark-kafka-source- (--resource-pattern-type prefixed)"
    )


def test_stream_names_missing_create_on_an_output_topic_at_debug_level(
    secure: Secure, tmp_path: Path
) -> None:
    """Also at --log-level DEBUG, where kafka-python logs its whole configuration (password included)."""
    dead_letter = f"{secure.prefix}.dead-letter"
    if dead_letter in secure.admin.list_topics():
        secure.admin.delete_topics([dead_letter])  # no job runs now (the module's job stops before its tests)
        wait_for_topic_gone(secure, dead_letter)
    with secure.without("txnwatch-stream", ResourceType.TOPIC, dead_letter, ACLOperation.CREATE):
        done = subprocess.run(
            [*stream_command(secure, free_port(), tmp_path / "ck", 30), "--log-level", "DEBUG"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            cwd=ROOT,
            env=secure.env(),
        )
    secure.saw(done.stdout + done.stderr)
    assert done.returncode == 1
    assert (
        "Starting KafkaAdminClient with configuration" in done.stderr
    )  # the DEBUG line that held the password
    one_clear_line(
        done.stderr, f"{dead_letter} was denied (TOPIC_AUTHORIZATION_FAILED): grant the ACL Create"
    )


def wait_for_topic_gone(secure: Secure, topic: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while topic in secure.admin.list_topics():
        assert time.monotonic() < deadline, f"{topic} not deleted"
        time.sleep(0.3)


@dataclass
class StreamRun:
    candidate: AbortCandidate
    console: str  # the job's stdout and stderr while it ran
    whole_console: str  # ... and until it stopped (stopping interrupts a batch, which Spark logs at length)
    collector_log: str
    scrapes: list[str]  # /metrics of the collector and of the job
    groups: list[str]  # consumer groups on the cluster afterwards


def _stop(proc: subprocess.Popen[bytes], sig: int, timeout_s: float) -> None:
    """`sig` to the process alone (as `kill` would; the job stops its queries and Spark), then anything left of
    the process group we started (its Spark JVM) is killed."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=timeout_s)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


@pytest.fixture(scope="module")
def stream_run(secure: Secure, orphan: Orphan) -> Iterator[StreamRun]:
    """The collector and the real streaming job, each as its own principal, until the job proposes the orphan."""
    collector_port, job_port = free_port(), free_port()
    collector_out = secure.work / "collector.log"
    job_out = secure.work / "stream.log"
    with collector_out.open("wb") as cout, job_out.open("wb") as jout:
        collector = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "txnwatch_cli",
                "collect",
                *secure.args("txnwatch-collector"),
                "--interval-ms",
                "2000",
                "--metrics-port",
                str(collector_port),
            ],
            stdout=cout,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env=secure.env(),
            start_new_session=True,
        )
        stream = subprocess.Popen(
            stream_command(secure, job_port, secure.work / "checkpoints", DETECTION_TIMEOUT_S + 60),
            stdout=jout,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env=secure.env(),
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + DETECTION_TIMEOUT_S
            found: list[AbortCandidate] = []
            while not found:
                assert stream.poll() is None, job_out.read_text()[-3000:]
                assert collector.poll() is None, collector_out.read_text()[-3000:]
                assert time.monotonic() < deadline, job_out.read_text()[-3000:]
                time.sleep(3)
                found = [
                    c
                    for c in (
                        AbortCandidate.model_validate_json(r.value)
                        for r in read_all(secure, f"{secure.prefix}.abort-candidates")
                    )
                    if c.topic == orphan.topic and c.status.value == "OPENED"
                ]
            # Stop it as a person would once it runs: after every query started (then the console says where the
            # metrics are), one more trigger later.
            while "metrics on http://" not in job_out.read_text():
                assert time.monotonic() < deadline + 120, job_out.read_text()[-3000:]
                time.sleep(2)
            time.sleep(4)
            scrapes = [scrape(collector_port), scrape(job_port)]
            running_console = job_out.read_text()
            groups = sorted({g["group_id"] for g in secure.admin.list_groups()})
        finally:
            _stop(stream, signal.SIGINT, 60)
            _stop(collector, signal.SIGTERM, 30)
    run = StreamRun(
        found[0], running_console, job_out.read_text(), collector_out.read_text(), scrapes, groups
    )
    for text in (run.whole_console, run.collector_log, *run.scrapes):
        secure.saw(text)
    yield run


def test_collector_and_stream_propose_the_orphan_with_their_documented_acls(
    stream_run: StreamRun, orphan: Orphan
) -> None:
    c = stream_run.candidate
    assert (c.spec.producer_id, c.spec.producer_epoch, c.start_offset) == (
        orphan.producer_id,
        orphan.producer_epoch,
        orphan.start_offset,
    )
    assert c.reason.value == "coordinator-completed"
    assert "HANGING" in stream_run.console and c.candidate_id in stream_run.console
    at = stream_run.console.find("Traceback")
    assert at < 0, stream_run.console[at - 500 : at + 4000]
    assert "Traceback" not in stream_run.collector_log, stream_run.collector_log[-3000:]
    # The consumer-based offset reader's driver consumer joined a group (JoinGroup needs Read on it): why the job
    # needs the prefixed group ACL.
    assert any(g.startswith("spark-kafka-source-") and "driver" in g for g in stream_run.groups), (
        stream_run.groups
    )
    collector_metrics, job_metrics = stream_run.scrapes
    assert "txnwatch_collector_last_success_timestamp_seconds" in collector_metrics
    assert 'txnwatch_abort_candidates{cluster="secure"} 1.0' in job_metrics


# ---------------------------------------------------------------------------------------------- proposals


def test_proposals_list_and_show_as_the_read_only_admin(secure: Secure, stream_run: StreamRun) -> None:
    cid = stream_run.candidate.candidate_id
    listed = secure.txnwatch("txnwatch-admin", "proposals", "list", "--output", "json")
    assert listed.returncode == 0, listed.stderr
    assert cid in [row["candidate_id"] for row in json.loads(listed.stdout)]
    shown = secure.txnwatch("txnwatch-admin", "proposals", "show", cid, "--output", "json")
    assert shown.returncode == 0, shown.stderr
    assert '"SAFE"' in shown.stdout, shown.stdout
    assert str(secure.config("txnwatch-admin")) in shown.stdout  # the ready-made command names the file only


def test_abort_uses_its_own_principal_and_needs_alter_on_the_cluster(
    secure: Secure, stream_run: StreamRun, orphan: Orphan
) -> None:
    cid = stream_run.candidate.candidate_id
    with secure.without("txnwatch-abort", ResourceType.CLUSTER, "kafka-cluster", ACLOperation.ALTER):
        denied = secure.txnwatch(
            "txnwatch-abort", "proposals", "abort", cid, "--execute", "--actor", "on-call"
        )
    assert denied.returncode == 1, denied.stdout + denied.stderr
    one_clear_line(
        denied.stderr,
        "WriteTxnMarkers was denied (CLUSTER_AUTHORIZATION_FAILED): grant the ACL Alter on the cluster",
    )
    done = secure.txnwatch(
        "txnwatch-abort", "proposals", "abort", cid, "--execute", "--actor", "on-call", "--output", "json"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["outcome"] == "ABORTED", done.stdout
    # The partition is free: the LSO moved past the orphan.
    report = secure.txnwatch(
        "txnwatch-admin",
        "inspect",
        "partition",
        "--topic",
        orphan.topic,
        "--partition",
        "0",
        "--output",
        "json",
    )
    assert json.loads(report.stdout)["open_transactions"] == []
    audits = [
        AuditRecord.model_validate_json(r.value)
        for r in read_all(secure, f"{secure.prefix}.audit")
        if r.value
    ]
    outcomes = [a.outcome.value for a in audits if a.candidate_id == cid]
    assert "DENIED" in outcomes and "ABORTED" in outcomes, outcomes


# ------------------------------------------------------------------------------------------------- secrets

HELP = [
    ["--help"],
    ["collect", "--help"],
    ["stream", "--help"],
    ["inspect", "partition", "--help"],
    ["inspect", "coordinator-log", "--help"],
    ["proposals", "list", "--help"],
    ["proposals", "show", "--help"],
    ["proposals", "abort", "--help"],
]


def test_secrets_never_shown(secure: Secure, stream_run: StreamRun) -> None:
    # --help, with the SASL settings in the environment as a deployment would set them.
    env = secure.env()
    env.update(
        TXNWATCH_KAFKA__SECURITY_PROTOCOL="SASL_PLAINTEXT",
        TXNWATCH_KAFKA__SASL_MECHANISM="SCRAM-SHA-256",
        TXNWATCH_KAFKA__SASL_PLAIN_USERNAME="txnwatch-collector",
        TXNWATCH_KAFKA__SASL_PLAIN_PASSWORD=secure.secrets[0],
    )
    for command in HELP:
        done = subprocess.run(
            [sys.executable, "-m", "txnwatch_cli", *command],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            cwd=ROOT,
            env=env,
        )
        assert done.returncode == 0, done.stderr
        secure.saw(done.stdout + done.stderr)
    # Everything at DEBUG, kafka-python's connection and SASL handshake logs included.
    debug = secure.txnwatch("txnwatch-collector", "collect", "--once", "--log-level", "DEBUG")
    assert debug.returncode == 0 and "Authenticated as txnwatch-collector" in debug.stderr, debug.stderr[
        -2000:
    ]
    # What txnwatch published: candidates, audit records, snapshots, dead letters.
    for suffix in ("abort-candidates", "audit", "producer-state", "dead-letter"):
        for r in read_all(secure, f"{secure.prefix}.{suffix}"):
            secure.saw((r.value or b"").decode(errors="replace") + str(r.headers))
    # Everything every process of this module printed, and both /metrics scrapes (checked as they came, again here).
    assert len(secure.printed) > 10
    for text in secure.printed:
        assert not [s for s in secure.secrets if s in text]


# ------------------------------------------------------------------------------------------- the test bed


def test_controller_listener_principal_must_be_a_super_user(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SASL test bed's PLAINTEXT controller listener authenticates brokers and controllers as ANONYMOUS; with
    only `User:admin` in super.users, registration is denied ClusterAction and no broker ever becomes ready."""
    monkeypatch.setattr(testbed, "READY_TIMEOUT_S", 20.0)
    cfg = testbed.TestBedConfig(security="sasl-scram", extra={"super.users": "User:admin"})
    try:
        with pytest.raises(TimeoutError):
            testbed.start_cluster(cfg, tmp_path / "bed")
    finally:
        testbed.stop_cluster(tmp_path / "bed")
    log = (tmp_path / "bed" / "node-1" / "server.log").read_text()
    assert "Principal = User:ANONYMOUS is Denied operation = CLUSTER_ACTION" in log
    assert "Registration" in log
