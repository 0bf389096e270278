"""The local KRaft test bed: real Apache Kafka brokers from the Maven Central jars in .cache/jars/kafka.

`python -m dev.kafka up [--nodes 1|3] [--sasl] [--json]` formats storage, starts combined broker+controller JVMs on
free 127.0.0.1 ports and waits until every broker is registered; `down` stops only the processes `up` started (by
pid); `status` says what runs. pytest uses the same code through `start_cluster()` (tests/conftest.py).
`stop_node`/`start_node` stop one node (SIGTERM or SIGKILL) and start it again on the same ports, config and data
(the fault tests: tests/e2e/test_faults_e2e.py, tests/broker/test_abort_races.py).

`--sasl` (`TestBedConfig(security="sasl-scram")`) starts the brokers with SASL_PLAINTEXT SCRAM-SHA-256 clients, the
StandardAuthorizer and `allow.everyone.if.no.acl.found=false`: one SCRAM user per txnwatch component (random
passwords), and a `client.properties` for each in `<state dir>/clients/` (docs/security.md says which ACLs each needs;
only `admin` is a super user). `--security ssl|mtls|sasl-ssl-scram|sasl-oauthbearer` puts TLS on the client
listener instead, with certificates made at `up` (dev/tls.py says what each mode authenticates and authorizes).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Literal

from common.jars import jars_dir
from dev import kafka_versions, tls
from dev.kafka_versions import DEFAULT_VERSION

ROOT = Path(__file__).resolve().parent.parent
JARS_DIR = jars_dir()  # TXNWATCH_JARS_DIR, else the checkout's .cache/jars (common/jars.py)
DEFAULT_STATE_DIR = Path(os.environ.get("TXNWATCH_TESTBED_DIR", ROOT / ".cache" / "testbed"))
READY_TIMEOUT_S = 90.0

LOG4J2_PROPERTIES = """\
status = warn
appender.file.type = File
appender.file.name = FILE
appender.file.fileName = {log_file}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = FILE
logger.kafka.name = kafka
logger.kafka.level = INFO
logger.apache.name = org.apache.kafka
logger.apache.level = INFO
logger.raft.name = org.apache.kafka.raft
logger.raft.level = WARN
logger.controller.name = kafka.controller
logger.controller.level = WARN
logger.request.name = kafka.request.logger
logger.request.level = WARN
"""

# Kafka 3.x logs through log4j 1 (reload4j): the same levels in its format.
LOG4J1_PROPERTIES = """\
log4j.rootLogger=INFO, file
log4j.appender.file=org.apache.log4j.FileAppender
log4j.appender.file.File={log_file}
log4j.appender.file.layout=org.apache.log4j.PatternLayout
log4j.appender.file.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.kafka=INFO
log4j.logger.org.apache.kafka=INFO
log4j.logger.org.apache.kafka.raft=WARN
log4j.logger.kafka.controller=WARN
log4j.logger.kafka.request.logger=WARN
log4j.logger.org.apache.zookeeper=WARN
"""


@dataclass(frozen=True)
class TestBedConfig:
    """What `up` starts. The transaction settings are small so tests see expiry and cleanup in seconds."""

    __test__ = False  # not a pytest test class, despite its name

    nodes: int = 1
    transaction_version: int = 2
    partition_verification: bool = True
    transaction_max_timeout_ms: int = 60_000
    abort_cleanup_interval_ms: int = 500
    transactional_id_expiration_ms: int = 600_000
    heap: str = "512m"
    extra: dict[str, str] = field(default_factory=dict)
    # "sasl-scram": SASL_PLAINTEXT SCRAM-SHA-256 on the client listener, the StandardAuthorizer, no ACL = denied.
    # "ssl", "mtls", "sasl-ssl-scram", "sasl-oauthbearer": TLS on the client listener (dev/tls.py: certificates
    # made at `up`, what each mode authenticates and authorizes).
    security: Literal["plaintext", "sasl-scram", "ssl", "mtls", "sasl-ssl-scram", "sasl-oauthbearer"] = (
        "plaintext"
    )
    # SCRAM users made at format time (besides `admin`, the super user the brokers use among themselves).
    scram_users: tuple[str, ...] = field(default_factory=lambda: SCRAM_USERS)
    # Any Apache Kafka release from Maven Central (dev/kafka_versions.py); 3.5+ for KRaft.
    kafka_version: str = DEFAULT_VERSION
    # "zookeeper" (Kafka 3.x only): one ZooKeeper server and brokers with zookeeper.connect, PLAINTEXT only.
    metadata: Literal["kraft", "zookeeper"] = "kraft"


# One principal per txnwatch component (docs/security.md), and one for the test workloads.
SCRAM_USERS = ("txnwatch-collector", "txnwatch-stream", "txnwatch-admin", "txnwatch-abort", "workload")
SUPER_USER = "admin"
SCRAM_MECHANISM = "SCRAM-SHA-256"


@dataclass
class Node:
    node_id: int
    broker_port: int
    controller_port: int
    jmx_port: int
    pid: int
    directory: str
    log_file: str


@dataclass
class Cluster:
    bootstrap_servers: str
    cluster_id: str
    nodes: list[Node]
    config: dict[str, object]
    state_dir: str
    started_in_s: float = 0.0
    # SASL test beds: user → path of its client.properties (the passwords are in those files only).
    client_configs: dict[str, str] = field(default_factory=dict)
    # ZooKeeper test beds: the ZooKeeper server `up` started (0: none, a KRaft bed).
    zookeeper_pid: int = 0
    zookeeper_port: int = 0

    def as_json(self) -> dict[str, object]:
        return {
            "bootstrap_servers": self.bootstrap_servers,
            "cluster_id": self.cluster_id,
            "nodes": [asdict(n) for n in self.nodes],
            "config": self.config,
            "state_dir": self.state_dir,
            "started_in_s": round(self.started_in_s, 2),
            "client_configs": self.client_configs,
            "zookeeper_pid": self.zookeeper_pid,
            "zookeeper_port": self.zookeeper_port,
        }

    def client_properties(self, user: str) -> Path:
        """The `--command-config` file of a SCRAM user (SASL test beds only)."""
        if user not in self.client_configs:
            raise KeyError(
                f"no client.properties for {user!r}: the test bed has {sorted(self.client_configs)}"
            )
        return Path(self.client_configs[user])

    def client_kwargs(self, user: str | None = None) -> dict[str, object]:
        """kafka-python connection kwargs: bootstrap only on PLAINTEXT, SCRAM credentials of `user` (default the
        super user) on SASL test beds."""
        kwargs: dict[str, object] = {"bootstrap_servers": self.bootstrap_servers}
        if self.client_configs:
            kwargs.update(_scram_kwargs(self.client_properties(user or SUPER_USER)))
        return kwargs

    @property
    def jmx_urls(self) -> dict[int, str]:
        return {n.node_id: f"service:jmx:rmi:///jndi/rmi://127.0.0.1:{n.jmx_port}/jmxrmi" for n in self.nodes}

    def stop(self) -> None:
        stop_cluster(Path(self.state_dir))


def kafka_classpath(version: str = DEFAULT_VERSION) -> str:
    """The class path of one Apache Kafka release: `make jars`' .cache/jars/kafka for the default, a per-version
    folder resolved from Maven Central on first use for any other (dev/kafka_versions.py)."""
    directory = JARS_DIR / "kafka" if version == DEFAULT_VERSION else kafka_versions.ensure_jars(version)
    jars = sorted(directory.glob("*.jar"))
    if not jars:
        raise SystemExit(
            f"no Kafka jars in {directory}: run `make jars` (Maven resolves them from Maven Central)"
        )
    return os.pathsep.join(str(j) for j in jars)


def java_binary() -> str:
    java_home = os.environ.get("JAVA_HOME")
    return str(Path(java_home) / "bin" / "java") if java_home else "java"


def _free_ports(count: int) -> list[int]:
    # Bind them all at once so the kernel hands out distinct ports, then release them for the JVMs.
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _random_cluster_id() -> str:
    # Kafka's Uuid.toString(): URL-safe base64 of 16 random bytes, no padding.
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def _jaas(user: str, password: str) -> str:
    return f'org.apache.kafka.common.security.scram.ScramLoginModule required username="{user}" password="{password}";'


def _client_properties_text(bootstrap: str, user: str, password: str) -> str:
    return (
        f"# {user} on the txnwatch SASL test bed (dev/kafka.py); its ACLs: docs/security.md\n"
        f"bootstrap.servers={bootstrap}\n"
        "security.protocol=SASL_PLAINTEXT\n"
        f"sasl.mechanism={SCRAM_MECHANISM}\n"
        f"sasl.jaas.config={_jaas(user, password)}\n"
    )


def _scram_kwargs(path: Path) -> dict[str, object]:
    """kafka-python kwargs of a client.properties file (any security mode: an OAUTHBEARER file gets its token
    provider)."""
    from common.client_properties import parse_client_properties
    from common.oauth import with_token_provider

    return with_token_provider(parse_client_properties(path.read_text()).kwargs)


def _write_secret(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def _security_properties(
    cfg: TestBedConfig,
    broker_port: int,
    controller_port: int,
    admin_password: str,
    tls_files: tls.TlsFiles | None = None,
) -> dict[str, str]:
    if cfg.security in tls.TLS_MODES and tls_files is not None:
        return tls.broker_properties(
            cfg.security,
            tls_files,
            broker_port,
            controller_port,
            super_user=SUPER_USER,
            scram_jaas=_jaas(SUPER_USER, admin_password),
            scram_mechanism=SCRAM_MECHANISM,
        )
    if cfg.security == "plaintext":
        return {
            "listeners": f"PLAINTEXT://127.0.0.1:{broker_port},CONTROLLER://127.0.0.1:{controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{broker_port}",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        }
    return {
        "listeners": f"SASL_PLAINTEXT://127.0.0.1:{broker_port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"SASL_PLAINTEXT://127.0.0.1:{broker_port}",
        "inter.broker.listener.name": "SASL_PLAINTEXT",
        # SCRAM credentials live in the metadata log, which the controller listener must serve before any is
        # loaded, so the controller listener stays PLAINTEXT (on loopback) and its principal is ANONYMOUS.
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT",
        "sasl.enabled.mechanisms": SCRAM_MECHANISM,
        "sasl.mechanism.inter.broker.protocol": SCRAM_MECHANISM,
        f"listener.name.sasl_plaintext.{SCRAM_MECHANISM.lower()}.sasl.jaas.config": _jaas(
            SUPER_USER, admin_password
        ),
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "allow.everyone.if.no.acl.found": "false",
        # ANONYMOUS: brokers and controllers talking over the PLAINTEXT controller listener (registration,
        # heartbeats need ClusterAction); without it no broker registers (tests/broker/test_security_acls.py).
        "super.users": f"User:{SUPER_USER};User:ANONYMOUS",
    }


def _server_properties(
    cfg: TestBedConfig,
    node_id: int,
    ports: dict[int, tuple[int, int]],
    log_dir: Path,
    admin_password: str = "",
    zookeeper_port: int = 0,
    tls_files: tls.TlsFiles | None = None,
) -> str:
    voters = ",".join(f"{n}@127.0.0.1:{ports[n][1]}" for n in sorted(ports))
    rf = min(cfg.nodes, 3)
    min_isr = 1 if cfg.nodes < 3 else 2
    broker_port, controller_port = ports[node_id]
    props = {
        "process.roles": "broker,controller",
        "node.id": str(node_id),
        "controller.quorum.voters": voters,
        **_security_properties(cfg, broker_port, controller_port, admin_password, tls_files),
        "controller.listener.names": "CONTROLLER",
        "log.dirs": str(log_dir),
        "num.partitions": "1",
        "default.replication.factor": str(rf),
        "offsets.topic.replication.factor": str(rf),
        "offsets.topic.num.partitions": "3",
        "transaction.state.log.replication.factor": str(rf),
        "transaction.state.log.min.isr": str(min_isr),
        "transaction.state.log.num.partitions": "3",
        "share.coordinator.state.topic.replication.factor": str(rf),
        "share.coordinator.state.topic.min.isr": str(min_isr),
        "group.initial.rebalance.delay.ms": "0",
        "transaction.max.timeout.ms": str(cfg.transaction_max_timeout_ms),
        "transaction.abort.timed.out.transaction.cleanup.interval.ms": str(cfg.abort_cleanup_interval_ms),
        "transaction.remove.expired.transaction.cleanup.interval.ms": "1000",
        "transactional.id.expiration.ms": str(cfg.transactional_id_expiration_ms),
        "producer.id.expiration.check.interval.ms": "1000",
        "transaction.partition.verification.enable": str(cfg.partition_verification).lower(),
        "auto.create.topics.enable": "false",
        "log.flush.interval.messages": "9223372036854775807",
    }
    if cfg.metadata == "zookeeper":
        props = _zookeeper_broker_properties(props, node_id, broker_port, zookeeper_port)
    if not kafka_versions.has_partition_verification(cfg.kafka_version):
        # 3.5 has no verification (KIP-890 part 1 came in 3.6): the setting would only be logged as unknown.
        del props["transaction.partition.verification.enable"]
    props.update(cfg.extra)
    return "".join(f"{k}={v}\n" for k, v in props.items())


# What only a KRaft node has; a ZooKeeper-mode broker is told where ZooKeeper is instead.
KRAFT_ONLY_PROPERTIES = ("process.roles", "node.id", "controller.quorum.voters", "controller.listener.names")


def _zookeeper_broker_properties(
    kraft: dict[str, str], node_id: int, broker_port: int, zookeeper_port: int
) -> dict[str, str]:
    """A KRaft node's properties turned into a ZooKeeper-mode broker's (Kafka 3.x): no controller listener, no
    quorum, `broker.id` and `zookeeper.connect`. PLAINTEXT only (start_cluster refuses other security there)."""
    props = {k: v for k, v in kraft.items() if k not in KRAFT_ONLY_PROPERTIES}
    props.update(
        {
            "broker.id": str(node_id),
            "zookeeper.connect": f"127.0.0.1:{zookeeper_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{broker_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{broker_port}",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT",
        }
    )
    return props


def _logging_config(node_dir: Path, log_file: Path, version: str) -> str:
    """Write the node's logging config in its release's format; returns the JVM flag that points at it."""
    if kafka_versions.logs_through_log4j1(version):
        path = node_dir / "log4j.properties"
        path.write_text(LOG4J1_PROPERTIES.format(log_file=log_file))
        return f"-Dlog4j.configuration=file:{path}"
    path = node_dir / "log4j2.properties"
    path.write_text(LOG4J2_PROPERTIES.format(log_file=log_file))
    return f"-Dlog4j2.configurationFile=file:{path}"


def _logging_flag(node_dir: Path, version: str) -> str:
    """The JVM flag of a node's existing logging config (start_node)."""
    if kafka_versions.logs_through_log4j1(version):
        return f"-Dlog4j.configuration=file:{node_dir / 'log4j.properties'}"
    return f"-Dlog4j2.configurationFile=file:{node_dir / 'log4j2.properties'}"


def effective_config(cfg: TestBedConfig) -> TestBedConfig:
    """`cfg` as its release can run it: before 4.0 there is no transaction.version feature (every transaction is
    what 4.x calls version 0), before 3.6 no partition verification; ZooKeeper mode only before 4.0, PLAINTEXT."""
    version = cfg.kafka_version
    if cfg.metadata == "zookeeper" and not kafka_versions.has_zookeeper_mode(version):
        raise ValueError(f"Kafka {version} has no ZooKeeper mode (removed in 4.0, KIP-833)")
    if cfg.metadata == "zookeeper" and cfg.security != "plaintext":
        raise ValueError("the ZooKeeper test bed is PLAINTEXT only (its SCRAM users would live in ZooKeeper)")
    if cfg.metadata == "kraft" and not kafka_versions.at_least(version, "3.5.0"):
        raise ValueError(f"the KRaft test bed starts Kafka 3.5 and later, not {version}")
    changes: dict[str, object] = {}
    if not kafka_versions.has_transaction_version_feature(version):
        changes["transaction_version"] = 0
    if not kafka_versions.has_partition_verification(version):
        changes["partition_verification"] = False
    return replace(cfg, **changes)  # type: ignore[arg-type]


def _start_zookeeper(state_dir: Path, port: int, java_opts: Sequence[str], classpath: str) -> int:
    """One ZooKeeper server (kafka_2.13 3.x's own zookeeper jar, as bin/zookeeper-server-start.sh runs it) on
    127.0.0.1:`port`; returns its pid once it accepts connections."""
    zk_dir = state_dir / "zookeeper"
    shutil.rmtree(zk_dir, ignore_errors=True)
    (zk_dir / "data").mkdir(parents=True)
    cfg_file = zk_dir / "zoo.cfg"
    cfg_file.write_text(
        f"dataDir={zk_dir / 'data'}\nclientPort={port}\nclientPortAddress=127.0.0.1\n"
        "tickTime=2000\nmaxClientCnxns=0\n"
        # The AdminServer would take port 8080, which other test beds on this machine may hold.
        "admin.enableServer=false\n"
    )
    flag = _logging_config(zk_dir, zk_dir / "zookeeper.log", "3.0.0")
    with open(zk_dir / "stdout.log", "ab") as out:
        proc = subprocess.Popen(
            [
                java_binary(),
                flag,
                "-Xms64m",
                "-Xmx128m",
                *java_opts,
                "-cp",
                classpath,
                "org.apache.zookeeper.server.ZooKeeperServerMain",
                str(cfg_file),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"ZooKeeper exited during start-up with code {proc.returncode}: {zk_dir}/stdout.log"
            )
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return proc.pid
        time.sleep(0.2)
    proc.kill()
    raise TimeoutError(f"ZooKeeper on 127.0.0.1:{port} not accepting connections after 60s")


def _pid_alive(pid: int, state_dir: Path) -> bool:
    """True if `pid` is still a JVM we started: the state dir in its command line guards against pid reuse."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False
    return str(state_dir) in cmdline


def _wait_ready(
    bootstrap: str,
    nodes: int,
    deadline: float,
    procs: Sequence[subprocess.Popen[bytes]],
    client: dict[str, object] | None = None,
) -> None:
    from kafka import KafkaAdminClient  # imported late: `down`/`status` need no Kafka client

    last_error: Exception | None = None
    while time.monotonic() < deadline:
        for p in procs:
            if p.poll() is not None:
                raise RuntimeError(f"a broker JVM exited during start-up with code {p.returncode}")
        try:
            admin = KafkaAdminClient(
                **{"bootstrap_servers": bootstrap, **(client or {})},
                request_timeout_ms=5000,
                client_id="testbed",
            )
            try:
                brokers = kafka_versions.describe_brokers(admin)
                # DescribeCluster lists fenced brokers too; a registered but still fenced broker gets no new
                # partitions, so wait until every broker is unfenced.
                if sum(1 for b in brokers if not b.get("is_fenced")) >= nodes:
                    return
            finally:
                admin.close()
        except Exception as exc:  # not up yet: connection refused, no controller elected, ...
            last_error = exc
        time.sleep(0.3)
    raise TimeoutError(f"brokers at {bootstrap} not ready after {READY_TIMEOUT_S:.0f}s: {last_error}")


def start_cluster(cfg: TestBedConfig, state_dir: Path = DEFAULT_STATE_DIR) -> Cluster:
    """Format and start `cfg.nodes` combined KRaft nodes (or, with `metadata="zookeeper"`, one ZooKeeper server and
    `cfg.nodes` brokers) of release `cfg.kafka_version`; returns once every broker is registered."""
    started = time.monotonic()
    cfg = effective_config(cfg)
    zookeeper = cfg.metadata == "zookeeper"
    state_dir = state_dir.resolve()
    if (state_dir / "state.json").exists():
        existing = status(state_dir)
        if existing is not None:
            raise RuntimeError(
                f"a test bed already runs from {state_dir} ({existing.bootstrap_servers}); "
                "`python -m dev.kafka down` first"
            )
        stop_cluster(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    classpath = kafka_classpath(cfg.kafka_version)
    cluster_id = _random_cluster_id()
    free = _free_ports(3 * cfg.nodes + 1)
    zookeeper_port = free[-1] if zookeeper else 0
    ports = {n: (free[3 * (n - 1)], free[3 * (n - 1) + 1]) for n in range(1, cfg.nodes + 1)}
    jmx = {n: free[3 * (n - 1) + 2] for n in ports}
    bootstrap = ",".join(f"127.0.0.1:{ports[n][0]}" for n in ports)
    sasl = cfg.security in ("sasl-scram", "sasl-ssl-scram")
    # Random per `up`: a test can look for them in everything txnwatch prints (they must never appear).
    passwords = {u: secrets.token_urlsafe(18) for u in (SUPER_USER, *cfg.scram_users)} if sasl else {}
    tls_files = (
        tls.make_tls_files(state_dir / "tls", SUPER_USER, (SUPER_USER, *cfg.scram_users))
        if cfg.security in tls.TLS_MODES
        else None
    )
    client_configs: dict[str, str] = {}
    for user in (SUPER_USER, *cfg.scram_users) if sasl or tls_files else ():
        path = state_dir / "clients" / f"{user}.properties"
        if tls_files is None:
            text = _client_properties_text(bootstrap, user, passwords[user])
        else:
            text = tls.client_properties_text(
                cfg.security,  # type: ignore[arg-type]  # a TLS mode: tls_files exist
                bootstrap,
                tls_files,
                user,
                scram_jaas=_jaas(user, passwords.get(user, "")),
                scram_mechanism=SCRAM_MECHANISM,
            )
        _write_secret(path, text)
        client_configs[user] = str(path)

    procs: list[subprocess.Popen[bytes]] = []
    nodes: list[Node] = []
    zookeeper_pid = 0
    try:
        if zookeeper:
            zookeeper_pid = _start_zookeeper(
                state_dir, zookeeper_port, [f"-Dtxnwatch.testbed={state_dir}"], classpath
            )
        for node_id in ports:
            node_dir = state_dir / f"node-{node_id}"
            data_dir = node_dir / "data"
            shutil.rmtree(data_dir, ignore_errors=True)  # every `up` is a new cluster with a new id
            node_dir.mkdir(parents=True, exist_ok=True)
            props = node_dir / "server.properties"
            _write_secret(
                props,
                _server_properties(
                    cfg, node_id, ports, data_dir, passwords.get(SUPER_USER, ""), zookeeper_port, tls_files
                ),
            )
            log_file = node_dir / "server.log"
            common = [java_binary(), _logging_config(node_dir, log_file, cfg.kafka_version), "-cp", classpath]
            # A ZooKeeper-mode broker has no storage to format: it registers in ZooKeeper.
            if not zookeeper:
                subprocess.run(
                    [
                        *common,
                        "kafka.tools.StorageTool",
                        "format",
                        # One argument: a random id may start with "-", which the option parser would take for a flag.
                        f"--cluster-id={cluster_id}",
                        "--config",
                        str(props),
                        # The transaction.version feature exists from 4.0 on (effective_config: version 0 before).
                        *(
                            ("--feature", f"transaction.version={cfg.transaction_version}")
                            if kafka_versions.has_transaction_version_feature(cfg.kafka_version)
                            else ()
                        ),
                        *(
                            arg
                            for user, password in passwords.items()
                            for arg in ("--add-scram", f"{SCRAM_MECHANISM}=[name={user},password={password}]")
                        ),
                    ],
                    check=True,
                    capture_output=True,
                    timeout=120,
                )
            jmx_opts = [
                "-Dcom.sun.management.jmxremote",
                "-Dcom.sun.management.jmxremote.authenticate=false",
                "-Dcom.sun.management.jmxremote.ssl=false",
                f"-Dcom.sun.management.jmxremote.port={jmx[node_id]}",
                f"-Dcom.sun.management.jmxremote.rmi.port={jmx[node_id]}",
                "-Dcom.sun.management.jmxremote.host=127.0.0.1",
                "-Djava.rmi.server.hostname=127.0.0.1",
            ]
            with open(node_dir / "stdout.log", "ab") as out:
                proc = subprocess.Popen(
                    [
                        *common[:2],
                        f"-Xms{cfg.heap}",
                        f"-Xmx{cfg.heap}",
                        *jmx_opts,
                        f"-Dtxnwatch.testbed={state_dir}",
                        "-cp",
                        classpath,
                        "kafka.Kafka",
                        str(props),
                    ],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,  # outlives `up`; `down` stops it by pid
                )
            procs.append(proc)
            nodes.append(
                Node(
                    node_id,
                    ports[node_id][0],
                    ports[node_id][1],
                    jmx[node_id],
                    proc.pid,
                    str(node_dir),
                    str(log_file),
                )
            )
        cluster = Cluster(
            bootstrap,
            cluster_id,
            nodes,
            asdict(cfg),
            str(state_dir),
            client_configs=client_configs,
            zookeeper_pid=zookeeper_pid,
            zookeeper_port=zookeeper_port,
        )
        (state_dir / "state.json").write_text(json.dumps(cluster.as_json(), indent=2))
        _wait_ready(
            bootstrap,
            cfg.nodes,
            time.monotonic() + READY_TIMEOUT_S,
            procs,
            _scram_kwargs(Path(client_configs[SUPER_USER])) if client_configs else None,
        )
    except BaseException as exc:
        for p in procs:
            p.kill()
        if zookeeper_pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(zookeeper_pid, signal.SIGKILL)
        if isinstance(exc, subprocess.CalledProcessError):
            raise RuntimeError(
                f"formatting storage failed: {exc.stderr.decode(errors='replace')[-2000:]}"
            ) from exc
        raise
    cluster.started_in_s = time.monotonic() - started
    (state_dir / "state.json").write_text(json.dumps(cluster.as_json(), indent=2))
    return cluster


def _load(state_dir: Path) -> Cluster | None:
    try:
        raw = json.loads((state_dir / "state.json").read_text())
    except (OSError, ValueError):
        return None
    return Cluster(
        raw["bootstrap_servers"],
        raw["cluster_id"],
        [Node(**n) for n in raw["nodes"]],
        raw["config"],
        raw["state_dir"],
        raw.get("started_in_s", 0.0),
        raw.get("client_configs", {}),
        raw.get("zookeeper_pid", 0),
        raw.get("zookeeper_port", 0),
    )


def status(state_dir: Path = DEFAULT_STATE_DIR) -> Cluster | None:
    """The running test bed started from `state_dir`, or None if none of its JVMs is alive."""
    cluster = _load(state_dir.resolve())
    if cluster is None or not any(_pid_alive(n.pid, Path(cluster.state_dir)) for n in cluster.nodes):
        return None
    return cluster


def stop_cluster(state_dir: Path = DEFAULT_STATE_DIR, timeout_s: float = 30.0) -> list[int]:
    """Stop the JVMs recorded in state.json (SIGTERM, then SIGKILL after `timeout_s`); returns the pids stopped."""
    state_dir = state_dir.resolve()
    cluster = _load(state_dir)
    if cluster is None:
        return []
    alive = [n.pid for n in cluster.nodes if _pid_alive(n.pid, state_dir)]
    for pid in alive:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(_pid_alive(p, state_dir) for p in alive):
        time.sleep(0.2)
    for pid in alive:
        if _pid_alive(pid, state_dir):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    # ZooKeeper last: a ZooKeeper-mode broker's controlled shutdown goes through it.
    if cluster.zookeeper_pid and _pid_alive(cluster.zookeeper_pid, state_dir):
        with contextlib.suppress(ProcessLookupError):
            os.kill(cluster.zookeeper_pid, signal.SIGKILL)
        alive.append(cluster.zookeeper_pid)
    (state_dir / "state.json").unlink(missing_ok=True)
    return alive


def node_running(pid: int) -> bool:
    """True while the JVM `pid` runs (a stopped JVM that was our child stays a zombie until reaped: not running)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def stop_node(cluster: Cluster, node_id: int, *, kill: bool = False, timeout_s: float = 60.0) -> float:
    """Stop one node of a running test bed: SIGTERM (controlled shutdown), or SIGKILL with `kill`; waits until its
    JVM is gone and returns how long that took. Its ports, config and data dir stay for `start_node`."""
    (node,) = [n for n in cluster.nodes if n.node_id == node_id]
    began = time.monotonic()
    with contextlib.suppress(ProcessLookupError):
        os.kill(node.pid, signal.SIGKILL if kill else signal.SIGTERM)
    deadline = began + timeout_s
    while node_running(node.pid):
        if time.monotonic() > deadline:
            os.kill(node.pid, signal.SIGKILL)
            deadline = time.monotonic() + 10
        time.sleep(0.1)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(node.pid, os.WNOHANG)  # reap it if it was our child
    return time.monotonic() - began


def start_node(cluster: Cluster, node_id: int, *, wait: bool = True) -> Node:
    """Start a stopped node again on the same ports, config and data dir (no format: the same cluster). With
    `wait`, returns once every node of the bed is registered and unfenced. Updates `cluster` and its state.json."""
    (node,) = [n for n in cluster.nodes if n.node_id == node_id]
    if node_running(node.pid):
        raise RuntimeError(f"node {node_id} still runs (pid {node.pid})")
    node_dir = Path(node.directory)
    state_dir = Path(cluster.state_dir)
    heap = str(cluster.config.get("heap", "512m"))
    version = str(cluster.config.get("kafka_version", DEFAULT_VERSION))
    with open(node_dir / "stdout.log", "ab") as out:
        proc = subprocess.Popen(
            [
                java_binary(),
                _logging_flag(node_dir, version),
                f"-Xms{heap}",
                f"-Xmx{heap}",
                "-Dcom.sun.management.jmxremote",
                "-Dcom.sun.management.jmxremote.authenticate=false",
                "-Dcom.sun.management.jmxremote.ssl=false",
                f"-Dcom.sun.management.jmxremote.port={node.jmx_port}",
                f"-Dcom.sun.management.jmxremote.rmi.port={node.jmx_port}",
                "-Dcom.sun.management.jmxremote.host=127.0.0.1",
                "-Djava.rmi.server.hostname=127.0.0.1",
                f"-Dtxnwatch.testbed={state_dir}",
                "-cp",
                kafka_classpath(version),
                "kafka.Kafka",
                str(node_dir / "server.properties"),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    node.pid = proc.pid
    (state_dir / "state.json").write_text(json.dumps(cluster.as_json(), indent=2))
    if wait:
        wait_for_nodes(cluster)
    return node


def wait_for_nodes(cluster: Cluster) -> None:
    """Wait until every running node of the bed is registered and unfenced (after `start_node(wait=False)` of
    several: a KRaft quorum of three needs two of them up before any answers)."""
    alive = [n for n in cluster.nodes if node_running(n.pid)]
    client = _scram_kwargs(cluster.client_properties(SUPER_USER)) if cluster.client_configs else None
    _wait_ready(cluster.bootstrap_servers, len(alive), time.monotonic() + READY_TIMEOUT_S, [], client)


@contextlib.contextmanager
def running_cluster(cfg: TestBedConfig, state_dir: Path) -> Iterator[Cluster]:
    cluster = start_cluster(cfg, state_dir)
    try:
        yield cluster
    finally:
        stop_cluster(state_dir)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dev.kafka",
        description="Start, inspect and stop a local Apache Kafka KRaft test bed on 127.0.0.1 "
        "(jars from Maven Central via `make jars`).",
    )
    parser.add_argument(
        "--dir",
        type=Path,
        default=DEFAULT_STATE_DIR,
        help="state directory: configs, data, logs and state.json (default: %(default)s)",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="format storage and start the brokers; returns when all are ready")
    up.add_argument("--nodes", type=int, choices=(1, 3), default=1, help="combined broker+controller nodes")
    up.add_argument(
        "--transaction-version",
        type=int,
        choices=(0, 1, 2),
        default=2,
        help="transaction.version feature level at format time (0: v0 __transaction_state values, "
        "no epoch bump per transaction; 2: KIP-890 TV2)",
    )
    up.add_argument(
        "--no-verification",
        action="store_true",
        help="transaction.partition.verification.enable=false: needed to create a real hanging "
        "transaction (see dev/workload.py)",
    )
    up.add_argument("--max-timeout-ms", type=int, default=60_000, help="transaction.max.timeout.ms")
    up.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra broker property (repeatable)",
    )
    up.add_argument(
        "--sasl",
        action="store_true",
        help="SASL_PLAINTEXT SCRAM-SHA-256 clients, the StandardAuthorizer, no ACL = denied; one user per txnwatch "
        "component, client.properties for each in <dir>/clients/ (grant their ACLs: docs/security.md)",
    )
    up.add_argument(
        "--security",
        choices=("plaintext", "sasl-scram", *tls.TLS_MODES),
        help="the client listener's security (--sasl is sasl-scram); the TLS modes make a CA and certificates "
        "in <dir>/tls/ and a client.properties per principal in <dir>/clients/ (dev/tls.py)",
    )
    up.add_argument(
        "--version",
        default=DEFAULT_VERSION,
        metavar="X.Y.Z",
        help="Apache Kafka release (3.5.0 and later; jars resolved from Maven Central into "
        ".cache/jars/kafka-X.Y.Z on first use; default %(default)s)",
    )
    up.add_argument(
        "--zookeeper",
        action="store_true",
        help="ZooKeeper mode (Kafka 3.x only): one ZooKeeper server and brokers with zookeeper.connect, PLAINTEXT",
    )
    up.add_argument("--json", action="store_true", help="print the cluster as one JSON object")
    sub.add_parser("down", help="stop the brokers `up` started (only those pids)")
    st = sub.add_parser("status", help="print the running test bed, exit 1 if none")
    st.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    if args.command == "up":
        extra = dict(kv.split("=", 1) for kv in args.override)
        cfg = TestBedConfig(
            nodes=args.nodes,
            transaction_version=args.transaction_version,
            partition_verification=not args.no_verification,
            transaction_max_timeout_ms=args.max_timeout_ms,
            extra=extra,
            security=args.security or ("sasl-scram" if args.sasl else "plaintext"),
            kafka_version=args.version,
            metadata="zookeeper" if args.zookeeper else "kraft",
        )
        try:
            cluster = start_cluster(cfg, args.dir)
        except (RuntimeError, TimeoutError, ValueError) as exc:
            print(f"dev.kafka: {exc}", file=sys.stderr)
            return 1
        if args.json:
            print(json.dumps(cluster.as_json()))
        else:
            print(
                f"Kafka test bed up in {cluster.started_in_s:.1f}s: bootstrap {cluster.bootstrap_servers}, "
                f"{len(cluster.nodes)} node(s), Kafka {cfg.kafka_version} ({cfg.metadata}), "
                f"logs in {cluster.state_dir}"
            )
            if cluster.client_configs:
                print(f"{cfg.security}: client.properties per user in {Path(cluster.state_dir) / 'clients'}")
        return 0
    if args.command == "down":
        stopped = stop_cluster(args.dir)
        print(f"stopped pids {stopped}" if stopped else "no test bed was running")
        return 0
    running = status(args.dir)
    if running is None:
        print("no test bed is running", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(running.as_json()))
    else:
        alive = [n.node_id for n in running.nodes if _pid_alive(n.pid, Path(running.state_dir))]
        print(f"bootstrap {running.bootstrap_servers}; nodes alive {alive} of {len(running.nodes)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
