"""The field's transactional clients on the test bed, under their own faults (docs/testbed.md).

txnwatch's own workload (dev/workload.py) writes its transactions with kafka-python. The SREs it is for run
Kafka Streams and librdkafka; this module runs both, for real, and hurts them the way the field does:

- **Kafka Streams exactly_once_v2** (`dev/jvm/streams/FieldStreams.java`, compiled here with javac against the
  kafka-streams 4.3.1 jars `make jars` resolves into `.cache/jars/streams`): a consume-transform-produce with a
  repartition and a state store, so every transaction (one per 100 ms per thread) spans the repartition topic, the
  store's changelog, the output topic and a TxnOffsetCommit. Two instances (the second joins: a rebalance), one
  paused (SIGSTOP) past its transaction timeout (10 s, Streams' EOS default: its coordinator aborts it, and on
  SIGCONT the instance is fenced and recovers), one SIGKILLed inside a transaction and restarted at once (same
  state directory, so the same process id and transactional id; static membership, so it takes its place in the
  group at once: its InitProducerId, or the timeout, whichever comes first, aborts the transaction).
- **librdkafka** (confluent-kafka from PyPI, `python -m dev.field_clients rdkafka-ctp`): consume-transform-produce
  with `send_offsets_to_transaction`; one paused inside a transaction past its timeout (10 s here) and resumed
  (its commit fails, it aborts or starts a new producer, rewinds and goes on), one SIGKILLed inside one and
  restarted only once its coordinator has aborted the transaction on the timeout.

A fault is made *inside* a transaction: the process is paused, the coordinator asked (DescribeTransactions) whether
its transactional id has one Ongoing, and if not it is resumed and paused again a moment later. The input records
carry event time hours old (`EVENT_AGE_MS`); both clients give their outputs the input's timestamp (Streams
propagates it, the librdkafka worker copies it), so the transactions' batches are stamped in the past.

`FieldScenario` (used by tests/field/) starts the clients, makes the faults and returns their truth
(`FaultRecord`: the transaction each fault caught and when its coordinator aborted it); `python -m
dev.field_clients scenario --bootstrap-server B` runs the same scenario on a running test bed and prints it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from kafka import KafkaAdminClient, KafkaProducer

from common.jars import CHECKOUT, jars_dir
from dev.kafka import java_binary
from dev.workload import ensure_topics

STREAMS_SOURCE = CHECKOUT / "dev" / "jvm" / "streams" / "FieldStreams.java"
STREAMS_LOG_CONFIG = CHECKOUT / "dev" / "jvm" / "streams" / "FieldStreams.log4j2.properties"
STREAMS_CLASSES = CHECKOUT / ".cache" / "streams-classes"

# Input records are stamped this far in the past (event time); the outputs carry it on.
EVENT_AGE_MS = 3 * 3600 * 1000
# Kafka Streams' transaction.timeout.ms under exactly_once_v2 (StreamsConfig's producer default for EOS).
STREAMS_TRANSACTION_TIMEOUT_MS = 10_000
# The librdkafka workers' transaction.timeout.ms: short, so a stall outlives it in seconds.
RDKAFKA_TRANSACTION_TIMEOUT_MS = 10_000
# How long a paused client stays paused past its transaction timeout: the coordinator's timeout sweep runs every
# `transaction.abort.timed.out.transaction.cleanup.interval.ms` (500 ms on the bed, 10 s by default).
PAUSE_PAST_TIMEOUT_MS = 12_000
# The librdkafka worker's work between producing and committing, inside the transaction (its "transform"); it
# also makes a pause land inside a transaction most of the time.
RDKAFKA_DWELL_MS = 400

INPUT_PARTITIONS = 2


def _log(msg: str) -> None:
    print(f"[field] {msg}", file=sys.stderr, flush=True)


def now_ms() -> int:
    return int(time.time() * 1000)


# ------------------------------------------------------------------------------------------------ processes


class Client:
    """One client process in its own session (its JVM or Python and their threads are paused and killed as one),
    stdout kept line by line (the clients say READY / STATE / COMMITTED there), stderr in a file."""

    def __init__(self, name: str, args: Sequence[str], log_dir: Path) -> None:
        self.name, self.args, self.log_dir = name, list(args), log_dir
        self.popen: subprocess.Popen[str] | None = None
        self.lines: list[tuple[int, str]] = []  # (when read, line), over every run
        self.runs = 0
        self._lock = threading.Lock()

    @property
    def stderr_path(self) -> Path:
        return self.log_dir / f"{self.name}-{self.runs}.err"

    def start(self) -> None:
        self.runs += 1
        with self.stderr_path.open("w") as err:
            self.popen = subprocess.Popen(
                self.args,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                cwd=CHECKOUT,
                start_new_session=True,
            )
        threading.Thread(target=self._read, args=(self.popen,), daemon=True).start()
        _log(f"{self.name} started (pid {self.popen.pid})")

    def _read(self, popen: subprocess.Popen[str]) -> None:
        assert popen.stdout is not None
        with (self.log_dir / f"{self.name}-{self.runs}.out").open("w") as copy:
            for line in popen.stdout:
                with self._lock:
                    self.lines.append((now_ms(), line.rstrip("\n")))
                copy.write(line)
                copy.flush()

    def seen_since(self, since_ms: int, prefix: str) -> list[str]:
        with self._lock:
            return [line for at, line in self.lines if at >= since_ms and line.startswith(prefix)]

    def wait_line(self, since_ms: int, prefix: str, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = self.seen_since(since_ms, prefix)
            if found:
                return found[-1]
            if not self.alive():
                raise RuntimeError(f"{self.name} exited ({self.returncode()}): {self.stderr_tail()}")
            time.sleep(0.2)
        raise TimeoutError(f"{self.name}: no line {prefix!r} within {timeout_s:.0f}s: {self.stderr_tail()}")

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def returncode(self) -> int | None:
        return None if self.popen is None else self.popen.poll()

    def stderr_tail(self, chars: int = 3000) -> str:
        return self.stderr_path.read_text(errors="replace")[-chars:]

    def stderr_text(self) -> str:
        return "\n".join(
            (self.log_dir / f"{self.name}-{run}.err").read_text(errors="replace")
            for run in range(1, self.runs + 1)
        )

    def signal(self, sig: signal.Signals) -> None:
        assert self.popen is not None
        os.killpg(self.popen.pid, sig)

    def pause(self) -> None:
        self.signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.signal(signal.SIGCONT)

    def kill9(self) -> None:
        assert self.popen is not None
        self.signal(signal.SIGKILL)
        self.popen.wait(timeout=30)

    def stop(self, timeout_s: float = 30) -> None:
        """SIGTERM (a paused one is resumed first: it could not act on it), then SIGKILL after `timeout_s`."""
        if self.popen is None or self.popen.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                self.signal(signal.SIGKILL)
            self.popen.wait(timeout=30)


# ------------------------------------------------------------------------------------------------ Kafka Streams


def build_streams_app() -> Path:
    """FieldStreams compiled against the kafka-streams jars (`make jars`); again only when its source is newer."""
    jars = jars_dir() / "streams"
    if not list(jars.glob("kafka-streams-*.jar")):
        raise SystemExit(f"no kafka-streams jar in {jars}: run `make jars`")
    built = STREAMS_CLASSES / "FieldStreams.class"
    if built.exists() and built.stat().st_mtime >= STREAMS_SOURCE.stat().st_mtime:
        return STREAMS_CLASSES
    STREAMS_CLASSES.parent.mkdir(parents=True, exist_ok=True)
    # Compiled aside and renamed into place, so two callers never see half a class directory.
    staging = Path(tempfile.mkdtemp(dir=STREAMS_CLASSES.parent, prefix="streams-classes."))
    javac = str(Path(java_binary()).with_name("javac")) if os.environ.get("JAVA_HOME") else "javac"
    subprocess.run(
        [javac, "-cp", str(jars / "*"), "-d", str(staging), str(STREAMS_SOURCE)],
        check=True,
        capture_output=True,
        text=True,
    )
    if STREAMS_CLASSES.exists():
        old = STREAMS_CLASSES.with_name(f"{STREAMS_CLASSES.name}.old.{uuid.uuid4().hex[:6]}")
        STREAMS_CLASSES.rename(old)
        subprocess.run(["rm", "-rf", str(old)], check=False)
    staging.rename(STREAMS_CLASSES)
    return STREAMS_CLASSES


def streams_instance(
    name: str, bootstrap: str, application_id: str, topics: tuple[str, str], state_dir: Path, log_dir: Path
) -> Client:
    classes = build_streams_app()
    classpath = os.pathsep.join([str(jars_dir() / "streams" / "*"), str(classes)])
    state_dir.mkdir(parents=True, exist_ok=True)
    return Client(
        name,
        [
            java_binary(),
            "-Xmx192m",
            "-XX:+UseSerialGC",  # two cores shared by many JVMs: no parallel GC threads
            f"-Dlog4j2.configurationFile={STREAMS_LOG_CONFIG}",
            "-cp",
            classpath,
            "FieldStreams",
            bootstrap,
            application_id,
            topics[0],
            topics[1],
            str(state_dir),
            name,  # group.instance.id
        ],
        log_dir,
    )


def streams_transactional_id(client: Client, application_id: str) -> str:
    """The transactional id of an instance's one stream thread under exactly_once_v2:
    `<application.id>-<process id>-1` (StreamsProducer), the process id read from the thread's name
    `<application.id>-<process id>-StreamThread-1` that FieldStreams prints once running."""
    line = client.wait_line(0, "THREAD ", 5)
    thread = line.removeprefix("THREAD ")
    process_id = thread.removeprefix(f"{application_id}-").removesuffix("-StreamThread-1")
    return f"{application_id}-{process_id}-1"


# ------------------------------------------------------------------------------------------------ librdkafka


def rdkafka_worker(
    name: str, bootstrap: str, transactional_id: str, group: str, topics: tuple[str, str], log_dir: Path
) -> Client:
    return Client(
        name,
        [
            sys.executable,
            "-m",
            "dev.field_clients",
            "rdkafka-ctp",
            "--bootstrap-server",
            bootstrap,
            "--transactional-id",
            transactional_id,
            "--group",
            group,
            "--input",
            topics[0],
            "--output",
            topics[1],
        ],
        log_dir,
    )


def rdkafka_ctp(args: argparse.Namespace) -> None:
    """The librdkafka consume-transform-produce loop: read_committed input, one transaction per poll with the
    consumed offsets sent to it (`send_offsets_to_transaction`), outputs stamped with their input's timestamp.
    On a failed transaction: abort it when librdkafka says it can be aborted, else (fenced: a coordinator aborted
    it past its timeout and bumped the epoch) start a new producer, as an application's error handler does; then
    rewind to the committed offsets. Prints READY, COMMITTED n, FAILED <error> and RECOVERED."""
    from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

    def new_producer() -> Any:
        producer = Producer(
            {
                "bootstrap.servers": args.bootstrap_server,
                "transactional.id": args.transactional_id,
                "transaction.timeout.ms": RDKAFKA_TRANSACTION_TIMEOUT_MS,
                "linger.ms": 5,
            }
        )
        producer.init_transactions(30)
        return producer

    def abort_or_renew(producer: Any, error: Any) -> Any:
        # After a pause past the timeout librdkafka first says the transaction can be aborted (its messages timed
        # out), then the abort itself finds the producer fenced (the coordinator bumped the epoch): fatal.
        if error.txn_requires_abort():
            try:
                producer.abort_transaction(30)
                return producer
            except KafkaException as again:
                print(f"FAILED {again.args[0].name()} fatal={again.args[0].fatal()} (abort)", flush=True)
        return new_producer()

    def rewind(consumer: Any) -> None:
        for tp in consumer.committed(consumer.assignment(), timeout=30):
            consumer.seek(TopicPartition(tp.topic, tp.partition, tp.offset if tp.offset >= 0 else -2))

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    consumer = Consumer(
        {
            "bootstrap.servers": args.bootstrap_server,
            "group.id": args.group,
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            # Static membership: a restarted worker takes its place in the group at once, instead of waiting
            # session.timeout.ms (45 s) for the killed member to go.
            "group.instance.id": args.transactional_id,
        }
    )
    consumer.subscribe([args.input])
    producer = new_producer()
    print("READY", flush=True)
    committed = 0
    failed = False
    while not stop.is_set():
        records = [r for r in consumer.consume(num_messages=200, timeout=0.5) if r.error() is None]
        if not records:
            continue
        try:
            producer.begin_transaction()
            for r in records:
                producer.produce(
                    args.output, key=r.key(), value=(r.value() or b"").upper(), timestamp=r.timestamp()[1]
                )
            producer.flush(30)
            time.sleep(RDKAFKA_DWELL_MS / 1000)
            producer.send_offsets_to_transaction(
                consumer.position(consumer.assignment()), consumer.consumer_group_metadata(), 30
            )
            producer.commit_transaction(30)
        except KafkaException as exc:
            error = exc.args[0]
            print(
                f"FAILED {error.name()} fatal={error.fatal()} abortable={error.txn_requires_abort()}",
                flush=True,
            )
            producer = abort_or_renew(producer, error)
            rewind(consumer)
            failed = True
            continue
        committed += 1
        print(f"COMMITTED {committed}", flush=True)
        if failed:
            print("RECOVERED", flush=True)
            failed = False
    consumer.close()
    producer.flush(10)


# ------------------------------------------------------------------------------------------------ input


class Feeder:
    """Plain (non-transactional) input for the clients, `rate` records a second per topic, stamped
    `EVENT_AGE_MS` in the past: "<word> <n>" values over a few words (the Streams app keys and counts by word)."""

    WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot")

    def __init__(self, bootstrap: str, topics: Sequence[str], rate: float = 20.0) -> None:
        self.bootstrap, self.topics, self.rate = bootstrap, list(topics), rate
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        producer = KafkaProducer(bootstrap_servers=self.bootstrap, linger_ms=20)
        try:
            while not self._stop.is_set():
                for topic in self.topics:
                    word = self.WORDS[self.sent % len(self.WORDS)]
                    producer.send(
                        topic, value=f"{word} {self.sent}".encode(), timestamp_ms=now_ms() - EVENT_AGE_MS
                    )
                self.sent += 1
                time.sleep(1 / self.rate)
        finally:
            producer.close(timeout=10)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


# ------------------------------------------------------------------------------------------------ coordinator


class Coordinator:
    """DescribeTransactions on a transactional id's coordinator (txnwatch's own wire, admin.wire.kafka_wire.KafkaWire)."""

    def __init__(self, bootstrap: str) -> None:
        from admin.wire.kafka_wire import KafkaWire

        self.admin = KafkaAdminClient(bootstrap_servers=bootstrap)
        self.wire = KafkaWire(self.admin, request_timeout_ms=10_000)

    def describe(self, transactional_id: str) -> Any:
        """The id's TransactionDescription (state, producer id and epoch, start time, partitions)."""
        listed = self.wire.list_transactions().listings
        coordinators = {t.coordinator for t in listed if t.transactional_id == transactional_id}
        for broker in coordinators or {b.nodeId for b in self.admin._manager.cluster.brokers()}:
            for d in self.wire.describe_transactions({broker: [transactional_id]}):
                if d.error is None:
                    return d
        raise RuntimeError(f"no coordinator describes {transactional_id}")

    def close(self) -> None:
        self.admin.close()


@dataclass(frozen=True)
class FaultRecord:
    """One fault and the transaction it caught, as the coordinator described it then."""

    client: str
    kind: str  # paused | killed
    transactional_id: str
    producer_id: int
    producer_epoch: int
    partitions: tuple[tuple[str, int], ...]
    transaction_started_ms: int  # the coordinator's transaction start time
    fault_ms: int  # paused at (a killed one is paused first, while its transaction is checked)
    aborted_ms: int | None = None  # first seen no longer Ongoing at its coordinator (None: never seen)
    aborted_state: str | None = None  # the id's state then (CompleteAbort, or a later transaction's)
    aborted_epoch: int | None = None  # the id's epoch then (TV2 bumps it with every end)
    recovered_ms: int | None = None  # the client wrote again (a commit, or Streams back to RUNNING)


def catch_inside_transaction(
    client: Client, transactional_id: str, coordinator: Coordinator
) -> tuple[Any, int]:
    """Pause `client` at a moment its transactional id has an Ongoing transaction: paused, asked, resumed and
    paused again a moment later until it has. Returns the description and when the client was paused (it stays
    paused)."""
    for attempt in range(200):
        client.pause()
        paused_ms = now_ms()
        d = coordinator.describe(transactional_id)
        if d.state == "Ongoing" and d.partitions:
            # Asked again a moment later: an EndTxn the client sent just before the pause may still be on its
            # way (the first answer said Ongoing, and the transaction then commits). Only the timeout ends one
            # still Ongoing now.
            time.sleep(0.5)
            again = coordinator.describe(transactional_id)
            if again.state == "Ongoing" and again.start_time_ms == d.start_time_ms:
                return again, paused_ms
        client.resume()
        time.sleep(0.05 + (attempt % 7) * 0.03)
    raise RuntimeError(f"{client.name} was never caught inside a transaction")


def wait_aborted(coordinator: Coordinator, caught: Any, timeout_s: float) -> Any:
    """Wait until the caught transaction is no longer Ongoing at its coordinator; returns the id's description
    then. Its state may be a later transaction's (a restarted client can have begun and ended others between
    two questions): how the caught one ended is in its partitions' markers."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        d = coordinator.describe(caught.transactional_id)
        if d.state != "Ongoing" or d.start_time_ms != caught.start_time_ms:
            return d
        time.sleep(0.2)
    raise TimeoutError(f"{caught.transactional_id}: still Ongoing after {timeout_s:.0f}s")


def record(client: Client, kind: str, caught: Any, fault_ms: int) -> FaultRecord:
    return FaultRecord(
        client=client.name,
        kind=kind,
        transactional_id=caught.transactional_id,
        producer_id=caught.producer_id,
        producer_epoch=caught.producer_epoch,
        partitions=tuple(caught.partitions),
        transaction_started_ms=caught.start_time_ms,
        fault_ms=fault_ms,
    )


def aborted(fault: FaultRecord, d: Any) -> FaultRecord:
    return replace(fault, aborted_ms=now_ms(), aborted_state=d.state, aborted_epoch=d.producer_epoch)


def recovered(fault: FaultRecord, at_ms: int) -> FaultRecord:
    return replace(fault, recovered_ms=at_ms)


# ------------------------------------------------------------------------------------------------ the scenario


@dataclass
class FieldTopics:
    streams_input: str
    streams_output: str
    rdkafka_input: str
    rdkafka_output: str
    application_id: str
    rdkafka_group: str

    @classmethod
    def with_prefix(cls, prefix: str) -> FieldTopics:
        return cls(
            f"{prefix}streams-in",
            f"{prefix}streams-out",
            f"{prefix}rdk-in",
            f"{prefix}rdk-out",
            f"{prefix}streams-app",
            f"{prefix}rdk-group",
        )


@dataclass
class FieldScenario:
    """The clients and their faults on one test bed: `start()`, then `run_faults()` (the truth), then `stop()`."""

    bootstrap: str
    prefix: str
    work_dir: Path
    topics: FieldTopics = field(init=False)
    clients: dict[str, Client] = field(default_factory=dict)
    faults: list[FaultRecord] = field(default_factory=list)
    phases: list[tuple[int, str]] = field(default_factory=list)  # (when, what): the scenario's timeline
    feeder: Feeder | None = None
    stopped: bool = False
    # After the rebalance, before the faults: how long the clients run undisturbed (their short transactions only).
    steady_s: float = 0.0

    def __post_init__(self) -> None:
        self.topics = FieldTopics.with_prefix(self.prefix)
        self.log_dir = self.work_dir / "logs"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.coordinator = Coordinator(self.bootstrap)
        self.rdkafka_ids = {
            name: f"{self.prefix}{name}-{uuid.uuid4().hex[:6]}" for name in ("rdk-1", "rdk-2")
        }

    def phase(self, what: str) -> None:
        self.phases.append((now_ms(), what))
        _log(what)

    def _streams(self, name: str) -> Client:
        t = self.topics
        return streams_instance(
            name,
            self.bootstrap,
            t.application_id,
            (t.streams_input, t.streams_output),
            self.work_dir / "state" / name,
            self.log_dir,
        )

    def _rdkafka(self, name: str) -> Client:
        t = self.topics
        return rdkafka_worker(
            name,
            self.bootstrap,
            self.rdkafka_ids[name],
            t.rdkafka_group,
            (t.rdkafka_input, t.rdkafka_output),
            self.log_dir,
        )

    def start(self) -> None:
        """Topics, the input feeder, Streams instance A and both librdkafka workers, each running."""
        t = self.topics
        admin = KafkaAdminClient(bootstrap_servers=self.bootstrap)
        try:
            ensure_topics(admin, [t.streams_input, t.streams_output, t.rdkafka_input, t.rdkafka_output], 2)
        finally:
            admin.close()
        self.feeder = Feeder(self.bootstrap, [t.streams_input, t.rdkafka_input])
        self.feeder.start()
        self.clients = {
            "streams-a": self._streams("streams-a"),
            "streams-b": self._streams("streams-b"),
            "rdk-1": self._rdkafka("rdk-1"),
            "rdk-2": self._rdkafka("rdk-2"),
        }
        began = now_ms()
        for name in ("streams-a", "rdk-1", "rdk-2"):
            self.clients[name].start()
        self.clients["streams-a"].wait_line(began, "STATE RUNNING", 120)
        for name in ("rdk-1", "rdk-2"):
            self.clients[name].wait_line(began, "COMMITTED", 60)
        self.phase("started: streams-a running, rdk-1 and rdk-2 committing")

    def streams_id(self, name: str) -> str:
        return streams_transactional_id(self.clients[name], self.topics.application_id)

    def run_faults(self) -> list[FaultRecord]:
        """The faults, one after the other; returns their truth (also in `self.faults`)."""
        a, b = self.clients["streams-a"], self.clients["streams-b"]
        rdk1, rdk2 = self.clients["rdk-1"], self.clients["rdk-2"]

        # A second instance joins: a rebalance moves tasks (and their transactions) from A to B.
        joined = now_ms()
        b.start()
        b.wait_line(joined, "STATE RUNNING", 120)
        a.wait_line(joined, "STATE RUNNING", 120)  # A went through REBALANCING
        self.phase("rebalanced: streams-b joined")
        if self.steady_s:
            time.sleep(self.steady_s)
            self.phase(f"steady for {self.steady_s:.0f}s")

        # A and rdk-1 paused inside a transaction past its timeout: the coordinator aborts it.
        caught = {
            c.name: catch_inside_transaction(c, i, self.coordinator)
            for c, i in ((a, self.streams_id("streams-a")), (rdk1, self.rdkafka_ids["rdk-1"]))
        }
        paused_at = min(at for _, at in caught.values())
        self.phase(f"paused inside a transaction: {sorted(caught)}")
        paused = {name: record(self.clients[name], "paused", d, at) for name, (d, at) in caught.items()}
        for name, (d, _) in caught.items():
            paused[name] = aborted(paused[name], wait_aborted(self.coordinator, d, 60))
        timeout_ms = max(STREAMS_TRANSACTION_TIMEOUT_MS, RDKAFKA_TRANSACTION_TIMEOUT_MS)
        time.sleep(max(0.0, (paused_at + timeout_ms + PAUSE_PAST_TIMEOUT_MS - now_ms()) / 1000))
        resumed_at = now_ms()
        a.resume()
        rdk1.resume()
        self.phase("resumed streams-a and rdk-1")
        # On waking, A's producer is fenced (its epoch was bumped by the abort): Streams rejoins and runs again.
        a.wait_line(resumed_at, "STATE REBALANCING", 120)
        a.wait_line(resumed_at + 1, "STATE RUNNING", 120)
        paused["streams-a"] = recovered(paused["streams-a"], now_ms())
        rdk1.wait_line(resumed_at, "RECOVERED", 120)
        paused["rdk-1"] = recovered(paused["rdk-1"], now_ms())
        self.faults += paused.values()
        self.phase("streams-a running again after waking (fenced, or its thread replaced); rdk-1 recovered")

        # B and rdk-2 SIGKILLed inside a transaction. B restarts at once (same state directory and group.instance.id:
        # the same transactional id, and its place in the group); rdk-2 only once its coordinator aborted the
        # transaction on the timeout.
        caught = {
            c.name: catch_inside_transaction(c, i, self.coordinator)
            for c, i in ((b, self.streams_id("streams-b")), (rdk2, self.rdkafka_ids["rdk-2"]))
        }
        b.kill9()
        rdk2.kill9()
        self.phase("killed inside a transaction: streams-b, rdk-2")
        killed = {name: record(self.clients[name], "killed", d, at) for name, (d, at) in caught.items()}
        restarted = now_ms()
        b.start()
        killed["rdk-2"] = aborted(killed["rdk-2"], wait_aborted(self.coordinator, caught["rdk-2"][0], 60))
        rdk2.start()
        killed["streams-b"] = aborted(
            killed["streams-b"], wait_aborted(self.coordinator, caught["streams-b"][0], 60)
        )
        b.wait_line(restarted, "STATE RUNNING", 120)
        killed["streams-b"] = recovered(killed["streams-b"], now_ms())
        rdk2.wait_line(restarted, "COMMITTED", 60)
        killed["rdk-2"] = recovered(killed["rdk-2"], now_ms())
        self.faults += killed.values()
        self.phase("streams-b and rdk-2 restarted and writing")
        return self.faults

    def stop(self) -> None:
        """Every client stopped (SIGTERM: Streams closes, committing or aborting; the workers end between
        transactions), then the feeder. A second call does nothing."""
        if self.stopped:
            return
        self.stopped = True
        for client in self.clients.values():
            client.stop()
        if self.feeder is not None:
            self.feeder.stop()
        self.coordinator.close()
        self.phase("stopped")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dev.field_clients", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    ctp = sub.add_parser(
        "rdkafka-ctp", help="one librdkafka consume-transform-produce worker (until SIGTERM)"
    )
    ctp.add_argument("--bootstrap-server", required=True)
    ctp.add_argument("--transactional-id", required=True)
    ctp.add_argument("--group", required=True)
    ctp.add_argument("--input", required=True)
    ctp.add_argument("--output", required=True)
    scenario = sub.add_parser("scenario", help="the field clients and their faults on a running test bed")
    scenario.add_argument("--bootstrap-server", required=True)
    scenario.add_argument("--topic-prefix", default=f"field{uuid.uuid4().hex[:6]}-")
    scenario.add_argument("--dir", type=Path, default=CHECKOUT / ".cache" / "field")
    args = p.parse_args(argv)
    if args.command == "rdkafka-ctp":
        rdkafka_ctp(args)
        return 0
    run = FieldScenario(args.bootstrap_server, args.topic_prefix, args.dir)
    try:
        run.start()
        faults = run.run_faults()
    finally:
        run.stop()
    print(json.dumps({"topics": asdict(run.topics), "faults": [asdict(f) for f in faults]}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
