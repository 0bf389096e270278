"""Real transactional workloads for the test bed, with their ground truth.

`python -m dev.workload --bootstrap-server B --scenario steady|late|hanging|hanging-offsets|hanging-after-abort|
hanging-multi [--json]` runs real kafka-python transactional producers. `hanging` makes a real orphan the way a
buggy or delayed client does (KIP-890's motivating case): with partition verification off, a transactional batch is
written with Produce v9 to a partition the coordinator never added, then the transaction commits; the coordinator
writes markers only to the partitions it knows, so the orphan pins the last stable offset until someone aborts it.
`hanging-after-abort` is the late produce: the write arrives after the transaction aborted. `hanging-multi` leaves
orphans on `--orphan-partitions` partitions of one producer.

Every hanging scenario then ends as a real application does after a restart: once the orphan is made, a new
producer with the same transactional id calls `init_transactions()` (InitProducerId: the coordinator moves the id
to Empty at the next epoch) and closes. The orphan's producer id is then owned at a later epoch than the orphan's,
so an ABORT marker at the orphan's epoch cannot catch a batch of the owner (a batch of it there would raise the
leader's epoch and the leader would fence the marker: `ProducerAppendInfo.checkProducerEpoch`), and `txnwatch
proposals abort` needs no `--allow-live-owner`. The truth reports that epoch (`owner_epoch`). `--owner-stays-live`
skips the restart: the kafka-python producer exits, but its coordinator record stays at the orphan's epoch (not
Dead), which `proposals abort` refuses by name (`live-owner-same-epoch`); for tests of that refusal.
`--owner-busy-ms N` (every `hanging*` scenario) makes the owner live on first, as in the field: the same
producer commits a one-record transaction on another topic every N ms for `--owner-busy-for-s`, then ends as
above.

`--owner-client java` (`hanging`) makes the owner a Kafka 4.x Java producer (`dev/jvm/owner/BusyOwner.java`,
compiled on first use against the client jars `make jars` put in .cache/jars/kafka) instead of kafka-python, which
runs transaction version 0/1. On a cluster that finalized transaction.version=2 (the bed's default) the Java client
runs TV2 (KIP-890 part 2): every EndTxn moves its producer epoch by one. The workload learns the open transaction's
producer id and epoch from the leader (DescribeProducers), writes the orphan at that epoch, then lets the owner
commit: the commit already leaves the orphan's epoch behind, so there is no restart (nor `--owner-stays-live`), and
with `--owner-busy-ms` the owner's later transactions never run at the orphan's epoch: an ABORT marker at it cannot
catch one of them, and `txnwatch proposals abort` may execute while the owner still commits.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import random
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import IO, Any

from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import ConfigResource, ConfigResourceType, NewTopic
from kafka.errors import KafkaError, TopicAlreadyExistsError
from kafka.protocol.producer import ProduceRequest
from kafka.protocol.producer.transaction import TxnOffsetCommitRequest
from kafka.record.memory_records import MemoryRecordsBuilder
from kafka.structs import TopicPartition

from common.jars import CHECKOUT, jars_dir
from dev.kafka import java_binary
from dev.kafka_versions import describe_brokers

SCENARIOS = ("steady", "late", "hanging", "hanging-offsets", "hanging-after-abort", "hanging-multi")
OWNER_CLIENTS = ("kafka-python", "java")

# `--owner-client java`: dev/jvm/owner/BusyOwner.java, compiled with javac against the Kafka 4.3.1 client jars `make
# jars` put in .cache/jars/kafka, on first use (again only when its source is newer), into .cache/owner-classes.
OWNER_SOURCE = CHECKOUT / "dev" / "jvm" / "owner" / "BusyOwner.java"
OWNER_LOG_CONFIG = CHECKOUT / "dev" / "jvm" / "owner" / "BusyOwner.log4j2.properties"
OWNER_CLASSES = CHECKOUT / ".cache" / "owner-classes"
# What the client needs of .cache/jars/kafka (the broker's own jars are there too): kafka-clients, its compression
# codecs, SLF4J and Log4j2 as its logging backend.
OWNER_JAR_PREFIXES = (
    "kafka-clients-",
    "lz4-java-",
    "snappy-java-",
    "zstd-jni-",
    "slf4j-api-",
    "log4j-api-",
    "log4j-core-",
    "log4j-slf4j2-impl-",
)


@dataclass(frozen=True)
class TruthRecord:
    """One transaction on one partition, as the workload made it."""

    kind: str  # committed | aborted | late | hanging
    topic: str
    partition: int
    producer_id: int
    producer_epoch: int
    start_offset: int
    transactional_id: str
    start_timestamp_ms: int
    # The hanging scenarios: the epoch the transactional id's coordinator record holds once the scenario ended (the
    # restart's, `producer_epoch + 1`; `producer_epoch` with --owner-stays-live; with --owner-client java, what
    # DescribeTransactions says once the owner closed: the orphan's epoch plus one per transaction it ended, as
    # transaction version 2 moves it at every EndTxn). None: not measured, as in the truth a busy Java owner's
    # scenario prints at its orphan: its epoch is then moving by one every transaction (past the orphan's already).
    owner_epoch: int | None = None


class WorkloadError(RuntimeError):
    """The cluster cannot run the scenario; the message says what to change."""


def _log(msg: str) -> None:
    print(f"[workload] {msg}", file=sys.stderr, flush=True)


def ensure_topics(admin: KafkaAdminClient, topics: Sequence[str], partitions: int) -> None:
    brokers = len(describe_brokers(admin))
    new = [NewTopic(t, partitions, min(3, brokers)) for t in topics]
    with contextlib.suppress(TopicAlreadyExistsError):
        admin.create_topics(new)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # leaders are elected asynchronously after CreateTopics
        described = admin.describe_topics(list(topics))
        # A topic the broker's metadata does not know yet comes back with no partitions (and an error): not ready.
        known = len(described) == len(topics) and all(t["partitions"] for t in described)
        if known and all(p["leader_id"] >= 0 for t in described for p in t["partitions"]):
            return
        time.sleep(0.2)
    raise WorkloadError(f"topics {topics} have no leaders after 30s")


# Where transactional ids must live (`--coordinator-partition P/N`): None, or (P, N).
_COORDINATOR_PARTITION: tuple[int, int] | None = None


def new_transactional_id(base: str) -> str:
    """`base` plus a random suffix; with `--coordinator-partition P/N`, one whose coordinator partition is P of N
    (`__transaction_state` partition `abs(javaHash(id)) % N`), so a test can put every transaction it makes on
    one coordinator partition (e.g. the one a busy workload keeps the job behind on)."""
    from detectors.currency import coordinator_partition

    while True:
        candidate = f"{base}{uuid.uuid4().hex[:8]}"
        if _COORDINATOR_PARTITION is None:
            return candidate
        wanted, partitions = _COORDINATOR_PARTITION
        if coordinator_partition(candidate, partitions) == wanted:
            return candidate


def _producer(bootstrap: str, transactional_id: str, **extra: Any) -> KafkaProducer:
    producer = KafkaProducer(
        bootstrap_servers=bootstrap,
        transactional_id=transactional_id,
        client_id=f"txnwatch-workload-{transactional_id}",
        linger_ms=0,
        **extra,
    )
    producer.init_transactions()
    return producer


def _pid_epoch(producer: KafkaProducer) -> tuple[int, int]:
    # kafka-python keeps the producer id/epoch InitProducerId returned in its transaction manager.
    pe = producer._transaction_manager.producer_id_and_epoch
    return int(pe.producer_id), int(pe.epoch)


def restart_owner(bootstrap: str, transactional_id: str, **extra: Any) -> int:
    """What an application's restart does to its transactional id: a new producer's InitProducerId (the coordinator
    moves the id to Empty at the next epoch, ending nothing: its last transaction is complete), then close. Returns
    the id's epoch now."""
    producer = _producer(bootstrap, transactional_id, **extra)
    try:
        return _pid_epoch(producer)[1]
    finally:
        producer.close(timeout=10)


def owner_lives_on(
    admin: KafkaAdminClient,
    producer: KafkaProducer,
    args: argparse.Namespace,
    truth: list[TruthRecord],
    emit: Callable[[list[TruthRecord]], None] | None,
) -> None:
    """`--owner-busy-ms N`: the owner carries on after its orphan, as a Kafka Streams thread or an application
    after a late write does: a one-record transaction on another topic every N ms, for `--owner-busy-for-s`
    seconds, with the same producer (the orphan's epoch under transaction version 0/1). The truth is printed
    first (`--json`), so a test watches detection while the owner is still committing."""
    busy_topic = f"{args.topic_prefix}owner-busy"
    ensure_topics(admin, [busy_topic], 1)
    if emit is not None:
        emit([replace(t, owner_epoch=t.producer_epoch) for t in truth])
    deadline = time.monotonic() + args.owner_busy_for_s
    commits = 0
    while time.monotonic() < deadline:
        producer.begin_transaction()
        producer.send(busy_topic, value=b"busy", partition=0)
        producer.commit_transaction()
        commits += 1
        time.sleep(args.owner_busy_ms / 1000)
    _log(f"the owner committed {commits} transactions on {busy_topic} after its orphan, then stops")


def owner_carries_on(
    admin: KafkaAdminClient,
    producer: KafkaProducer,
    args: argparse.Namespace,
    truth: list[TruthRecord],
    emit: Callable[[list[TruthRecord]], None] | None,
) -> None:
    """Once the orphan is made: with `--owner-busy-ms`, the owner lives on first (`owner_lives_on`); then its
    producer closes."""
    try:
        if args.owner_busy_ms:
            owner_lives_on(admin, producer, args, truth, emit)
    finally:
        producer.close(timeout=10)


def owner_ends(
    bootstrap: str, args: argparse.Namespace, truth: list[TruthRecord], transactional_id: str
) -> list[TruthRecord]:
    """The end of a hanging scenario, after its orphan: the owner restarts (`restart_owner`), unless
    `--owner-stays-live`; the truth's records carry the owner's epoch then."""
    if args.owner_stays_live:
        owner = truth[-1].producer_epoch
        _log(f"{transactional_id} stays live at epoch {owner}, the orphan's (--owner-stays-live)")
    else:
        owner = restart_owner(bootstrap, transactional_id)
        _log(f"{transactional_id} restarted: InitProducerId moved it to epoch {owner}")
    return [replace(t, owner_epoch=owner) for t in truth]


def build_busy_owner() -> tuple[Path, list[Path]]:
    """BusyOwner compiled against the Kafka client jars (`make jars`), again only when its source is newer; returns
    the class directory and the jars it runs with."""
    kafka_jars = jars_dir() / "kafka"
    jars = sorted(j for j in kafka_jars.glob("*.jar") if j.name.startswith(OWNER_JAR_PREFIXES))
    if not any(j.name.startswith("kafka-clients-") for j in jars):
        raise WorkloadError(
            f"no kafka-clients jar in {kafka_jars}: run `make jars` (--owner-client java needs it)"
        )
    built = OWNER_CLASSES / "BusyOwner.class"
    if built.exists() and built.stat().st_mtime >= OWNER_SOURCE.stat().st_mtime:
        return OWNER_CLASSES, jars
    OWNER_CLASSES.parent.mkdir(parents=True, exist_ok=True)
    # Compiled aside and renamed into place, so two callers never see half a class directory.
    staging = Path(tempfile.mkdtemp(dir=OWNER_CLASSES.parent, prefix="owner-classes."))
    javac = str(Path(java_binary()).with_name("javac")) if os.environ.get("JAVA_HOME") else "javac"
    done = subprocess.run(
        [javac, "-cp", os.pathsep.join(map(str, jars)), "-d", str(staging), str(OWNER_SOURCE)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        subprocess.run(["rm", "-rf", str(staging)], check=False)
        raise WorkloadError(f"javac {OWNER_SOURCE.name} failed:\n{done.stderr}")
    if OWNER_CLASSES.exists():
        old = OWNER_CLASSES.with_name(f"{OWNER_CLASSES.name}.old.{uuid.uuid4().hex[:6]}")
        OWNER_CLASSES.rename(old)
        subprocess.run(["rm", "-rf", str(old)], check=False)
    staging.rename(OWNER_CLASSES)
    return OWNER_CLASSES, jars


class JavaOwner:
    """A running BusyOwner (dev/jvm/owner/BusyOwner.java), spoken to by lines: it says READY with its transaction
    open on `topic`-`partition`, commits it on our COMMIT (says COMMITTED), commits a one-record transaction on
    `busy_topic` every `busy_ms` ms for `busy_for_s` s, says BUSY <commits>, closes and exits 0. Its stderr (Log4j2
    warnings) goes to a file, quoted when it fails."""

    def __init__(
        self,
        bootstrap: str,
        transactional_id: str,
        topic: str,
        partition: int,
        busy_topic: str,
        busy_ms: int,
        busy_for_s: float,
    ) -> None:
        classes, jars = build_busy_owner()
        self._err: IO[str] = tempfile.NamedTemporaryFile(  # noqa: SIM115 (closed in close())
            "w+", prefix="busy-owner-", suffix=".err", delete=False
        )
        self.proc = subprocess.Popen(
            [
                java_binary(),
                "-Xmx128m",
                "-XX:+UseSerialGC",  # two cores shared with the broker and Spark: no parallel GC threads
                "-XX:TieredStopAtLevel=1",  # starts sooner; it sends a few records a second
                f"-Dlog4j2.configurationFile={OWNER_LOG_CONFIG}",
                "-cp",
                os.pathsep.join([str(classes), *map(str, jars)]),
                "BusyOwner",
                bootstrap,
                transactional_id,
                topic,
                str(partition),
                busy_topic,
                str(busy_ms),
                str(busy_for_s),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._err,
            text=True,
            cwd=CHECKOUT,
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line.strip())
        self._lines.put(None)

    def expect(self, word: str, timeout_s: float) -> list[str]:
        """The next line, which must start with `word`; its words after it."""
        try:
            line = self._lines.get(timeout=timeout_s)
        except queue.Empty:
            raise WorkloadError(
                f"the Java owner said no {word} within {timeout_s:.0f}s{self._stderr()}"
            ) from None
        if line is None or line.split()[:1] != [word]:
            said = "exited" if line is None else f"said {line!r}"
            raise WorkloadError(f"the Java owner {said} instead of {word}{self._stderr()}")
        return line.split()[1:]

    def say(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def _stderr(self) -> str:
        with contextlib.suppress(OSError):
            self._err.flush()
            tail = Path(self._err.name).read_text(errors="replace")[-3000:]
            return f"; its stderr ({self._err.name}):\n{tail}" if tail else ""
        return ""

    def close(self) -> None:
        """Closes its stdin (which ends its busy period: nobody waits for it any more) and waits for it."""
        with contextlib.suppress(OSError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)
        self._err.close()
        if self.proc.returncode == 0:
            Path(self._err.name).unlink(missing_ok=True)
        else:
            _log(f"the Java owner exited {self.proc.returncode}; its stderr: {self._err.name}")


def open_transaction_at(admin: KafkaAdminClient, topic: str, partition: int, offset: int) -> tuple[int, int]:
    """(producer id, epoch) of the transaction the leader of `topic`-`partition` has open from `offset`, by
    DescribeProducers: how the workload learns a client's producer id and epoch when it cannot ask the client."""
    tp = TopicPartition(topic, partition)
    for prod in admin.describe_producers([tp])[tp].active_producers:
        if prod.current_transaction_start_offset == offset:
            return int(prod.producer_id), int(prod.producer_epoch)
    raise WorkloadError(f"the leader of {topic}-{partition} has no transaction open from offset {offset}")


def coordinator_epoch(admin: KafkaAdminClient, transactional_id: str) -> int:
    """The epoch the transactional id's coordinator holds now (DescribeTransactions)."""
    return int(admin.describe_transactions([transactional_id])[transactional_id].producer_epoch)


def hanging_java_owner(
    bootstrap: str,
    admin: KafkaAdminClient,
    args: argparse.Namespace,
    emit: Callable[[list[TruthRecord]], None] | None,
    *,
    topic: str,
    orphan_topic: str,
    orphan_partition: int,
    txn_id: str,
) -> list[TruthRecord]:
    """`hanging --owner-client java`: the orphan of a Kafka 4.x Java producer (BusyOwner), which runs transaction
    version 2 on a cluster that finalized it: its transaction writes `topic`-0 (the leader adds the partition: Produce
    v12+), the workload reads its producer id and epoch there (DescribeProducers) and writes the orphan at that epoch
    to `orphan_topic`-`orphan_partition` (Produce v9, never added), then the owner commits. The commit moves the
    owner's epoch past the orphan's (EndTxn v5: the markers and every later transaction of it are at the next
    epoch), so no restart is needed for an ABORT at the orphan's epoch to be safe: the owner just lives on
    (`--owner-busy-ms`), then closes."""
    if args.owner_stays_live:
        raise WorkloadError(
            "--owner-stays-live keeps a kafka-python owner at its orphan's epoch; a Java owner under transaction "
            "version 2 moves past it at its first commit, so there is no such owner to keep: drop the flag"
        )
    busy_topic = f"{args.topic_prefix}owner-busy"
    busy_for_s = args.owner_busy_for_s if args.owner_busy_ms else 0.0
    if busy_for_s:
        ensure_topics(admin, [busy_topic], 1)
    owner = JavaOwner(bootstrap, txn_id, topic, 0, busy_topic, max(args.owner_busy_ms, 1), busy_for_s)
    try:
        offset_word, timestamp_word = owner.expect("READY", 120)  # a JVM's start on a busy machine
        committed_offset, committed_ts = int(offset_word), int(timestamp_word)
        pid, epoch = open_transaction_at(admin, topic, 0, committed_offset)
        offset, ts = write_orphan(admin, args, orphan_topic, orphan_partition, txn_id, pid, epoch)
        owner.say("COMMIT")
        owner.expect("COMMITTED", 60)
        moved = coordinator_epoch(admin, txn_id)
        if moved <= epoch:
            raise WorkloadError(
                f"the Java owner's epoch stayed at {moved} after its commit (orphan at {epoch}): the cluster runs "
                "transaction version 0/1 for it; finalize transaction.version=2 (`python -m dev.kafka up "
                "--transaction-version 2`, the default) or use --owner-client kafka-python"
            )
        _log(
            f"hanging: {txn_id} (Java owner, producer id {pid}, epoch {epoch}) committed on {topic}-0 and moved to "
            f"epoch {moved}; orphan open on {orphan_topic}-{orphan_partition} at offset {offset}"
        )
        truth = [
            TruthRecord("committed", topic, 0, pid, epoch, committed_offset, txn_id, committed_ts),
            TruthRecord("hanging", orphan_topic, orphan_partition, pid, epoch, offset, txn_id, ts),
        ]
        if emit is not None and args.owner_busy_ms:
            emit(truth)  # owner_epoch None: it moves by one every transaction from here on
        (commits,) = owner.expect("BUSY", busy_for_s + 120)
        if args.owner_busy_ms:
            _log(f"the owner committed {commits} transactions on {busy_topic} after its orphan, then stops")
    finally:
        owner.close()
    if owner.proc.returncode != 0:
        raise WorkloadError(f"the Java owner exited {owner.proc.returncode}")
    final = coordinator_epoch(admin, txn_id)
    _log(f"{txn_id} closed at epoch {final} (transaction version 2: one more per transaction it ended)")
    return [replace(t, owner_epoch=final) for t in truth]


def _verification_enabled(admin: KafkaAdminClient) -> bool:
    broker_id = str(describe_brokers(admin)[0]["broker_id"])
    configs = admin.describe_configs(
        [ConfigResource(ConfigResourceType.BROKER, broker_id)], config_filter="all"
    )
    # A broker without the setting predates it (3.5 and older: KIP-890 part 1 came in 3.6) and verifies nothing.
    entry = configs["broker"][broker_id].get("transaction.partition.verification.enable", {"value": "false"})
    return str(entry["value"]).lower() != "false"


def write_orphan(
    admin: KafkaAdminClient,
    args: argparse.Namespace,
    topic: str,
    partition: int,
    txn_id: str,
    pid: int,
    epoch: int,
    value: bytes = b"orphan",
) -> tuple[int, int]:
    """The orphan: one transactional batch of producer `pid` at `epoch` on a partition its coordinator never
    added (`raw_transactional_produce`), stamped `--backdate-ms` in the past; its offset and timestamp."""
    ts = int(time.time() * 1000) - args.backdate_ms
    offset = raw_transactional_produce(
        admin,
        topic=topic,
        partition=partition,
        transactional_id=txn_id,
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=0,
        timestamp_ms=ts,
        value=value,
    )
    return offset, ts


def raw_transactional_produce(
    admin: KafkaAdminClient,
    *,
    topic: str,
    partition: int,
    transactional_id: str,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
    timestamp_ms: int,
    value: bytes,
) -> int:
    """Write one transactional batch with Produce v3..v9 and no AddPartitionsToTxn; returns its offset.

    With `transaction.partition.verification.enable=false`, brokers append it (a new producer entry on the
    partition accepts any epoch and sequence) and start an open transaction the coordinator never heard of.
    """
    builder = MemoryRecordsBuilder(
        magic=2,
        compression_type=0,
        batch_size=1 << 16,
        transactional=True,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
    )
    builder.append(timestamp_ms, None, value)
    builder.close()
    topic_data = ProduceRequest.TopicProduceData
    request = ProduceRequest(
        transactional_id=transactional_id,
        acks=-1,
        timeout_ms=10_000,
        topic_data=[
            topic_data(
                name=topic,
                partition_data=[topic_data.PartitionProduceData(index=partition, records=builder.buffer())],
            )
        ],
        min_version=3,
        max_version=9,  # v12+ is always verified or implicitly added (KIP-890)
    )
    leader = admin.describe_topics([topic])[0]["partitions"][partition]["leader_id"]

    async def send() -> Any:
        # The admin client's connection manager already knows the brokers; it is the plainest way to send one
        # hand-built request with kafka-python.
        return await admin._manager.send(request, node_id=leader)

    response = admin._manager.run(send)
    result = response.responses[0].partition_responses[0]
    if result.error_code != 0:
        raise WorkloadError(
            f"raw produce to {topic}-{partition} failed with error code {result.error_code} "
            f"({result.error_message}); is transaction.partition.verification.enable=false?"
        )
    return int(result.base_offset)


def steady(bootstrap: str, admin: KafkaAdminClient, args: argparse.Namespace) -> list[TruthRecord]:
    """Committed and aborted transactions over several topics, at `--rate` transactions/s for `--seconds`."""
    topics = [f"{args.topic_prefix}steady-{i}" for i in range(args.topics)]
    ensure_topics(admin, topics, args.partitions)
    rng = random.Random(args.seed)
    producers = [
        _producer(bootstrap, new_transactional_id(f"{args.topic_prefix}steady-{i}-"))
        for i in range(args.producers)
    ]
    truth: list[TruthRecord] = []
    deadline = time.monotonic() + args.seconds
    n = 0
    try:
        while time.monotonic() < deadline:
            producer = producers[n % len(producers)]
            pid, epoch = _pid_epoch(producer)
            producer.begin_transaction()
            futures = []
            for _ in range(rng.randint(1, 4)):
                topic = rng.choice(topics)
                futures.append(
                    producer.send(
                        topic, value=f"steady-{n}".encode(), partition=rng.randrange(args.partitions)
                    )
                )
            first: dict[tuple[str, int], Any] = {}
            for f in futures:
                md = f.get(timeout=30)
                first.setdefault((md.topic, md.partition), md)
            commit = rng.random() >= args.abort_ratio
            if commit:
                producer.commit_transaction()
            else:
                producer.abort_transaction()
            txn_id = producer._transaction_manager.transactional_id
            truth.extend(
                TruthRecord(
                    "committed" if commit else "aborted",
                    md.topic,
                    md.partition,
                    pid,
                    epoch,
                    md.offset,
                    txn_id,
                    md.timestamp,
                )
                for md in first.values()
            )
            n += 1
            time.sleep(max(0.0, 1.0 / args.rate))
    finally:
        for p in producers:
            p.close(timeout=10)
    _log(f"steady: {n} transactions ({sum(t.kind == 'aborted' for t in truth)} partition-aborts) on {topics}")
    return truth


def late(
    bootstrap: str,
    admin: KafkaAdminClient,
    args: argparse.Namespace,
    emit: Callable[[list[TruthRecord]], None],
) -> list[TruthRecord]:
    """One transaction held open for `--hold-ms`, then aborted (the coordinator aborts it on its own timeout)."""
    topic = f"{args.topic_prefix}late"
    ensure_topics(admin, [topic], args.partitions)
    txn_id = new_transactional_id(f"{args.topic_prefix}late-")
    producer = _producer(bootstrap, txn_id, transaction_timeout_ms=args.transaction_timeout_ms)
    pid, epoch = _pid_epoch(producer)
    producer.begin_transaction()
    # --backdate-ms stands for a producer whose clock runs behind: the transaction looks older than it is.
    ts = int(time.time() * 1000) - args.backdate_ms
    md = producer.send(topic, value=b"late", partition=0, timestamp_ms=ts).get(timeout=30)
    truth = [TruthRecord("late", topic, 0, pid, epoch, md.offset, txn_id, md.timestamp)]
    emit(truth)  # scripts learn the truth while the transaction is still open
    _log(f"late: transaction {txn_id} open on {topic}-0 at offset {md.offset}; holding {args.hold_ms} ms")
    time.sleep(args.hold_ms / 1000)
    try:
        producer.abort_transaction()
    except KafkaError as exc:  # the coordinator may have aborted it on timeout already; that is the point
        _log(f"late: abort after hold: {exc!r}")
    producer.close(timeout=10)
    return truth


def hanging(
    bootstrap: str,
    admin: KafkaAdminClient,
    args: argparse.Namespace,
    emit: Callable[[list[TruthRecord]], None] | None = None,
) -> list[TruthRecord]:
    """A real orphan: an unverified write to a partition the coordinator never added, then a commit; with
    `--owner-busy-ms`, the owner then carries on (`owner_lives_on`) before it ends. `--owner-client java`: the owner
    is a Kafka 4.x Java producer under transaction version 2 (`hanging_java_owner`)."""
    if _verification_enabled(admin):
        raise WorkloadError(
            "transaction.partition.verification.enable is true on this cluster, so brokers reject writes to "
            "partitions a transaction never added (KIP-890). Start the test bed with "
            "`python -m dev.kafka up --no-verification`, or set it to false as a cluster-wide dynamic config."
        )
    topic = f"{args.topic_prefix}hanging"
    ensure_topics(admin, [topic], args.partitions)
    # --transactional-id: run again as an existing transactional id (InitProducerId gives it the next epoch), so
    # the orphan partition's producer entry moves to a newer epoch while an older orphan of it is still open.
    txn_id = args.transactional_id or new_transactional_id(f"{args.topic_prefix}hanging-")
    orphan_partition = args.partitions - 1 if args.partitions > 1 else 0
    orphan_topic = topic if orphan_partition != 0 else f"{topic}-orphan"
    if orphan_topic != topic:
        ensure_topics(admin, [orphan_topic], 1)
    if args.owner_client == "java":
        return hanging_java_owner(
            bootstrap,
            admin,
            args,
            emit,
            topic=topic,
            orphan_topic=orphan_topic,
            orphan_partition=orphan_partition,
            txn_id=txn_id,
        )
    producer = _producer(bootstrap, txn_id)
    pid, epoch = _pid_epoch(producer)
    producer.begin_transaction()
    # A well-behaved write first: partition 0 is added to the transaction and gets its commit marker.
    md = producer.send(topic, value=b"committed", partition=0).get(timeout=30)
    offset, ts = write_orphan(admin, args, orphan_topic, orphan_partition, txn_id, pid, epoch)
    producer.commit_transaction()
    _log(
        f"hanging: {txn_id} (producer id {pid}, epoch {epoch}) committed on {topic}-0; "
        f"orphan open on {orphan_topic}-{orphan_partition} at offset {offset}"
    )
    truth = [
        TruthRecord("committed", topic, 0, pid, epoch, md.offset, txn_id, md.timestamp),
        TruthRecord("hanging", orphan_topic, orphan_partition, pid, epoch, offset, txn_id, ts),
    ]
    owner_carries_on(admin, producer, args, truth, emit)
    return owner_ends(bootstrap, args, truth, txn_id)


def hanging_offsets(
    bootstrap: str,
    admin: KafkaAdminClient,
    args: argparse.Namespace,
    emit: Callable[[list[TruthRecord]], None] | None = None,
) -> list[TruthRecord]:
    """A real orphan on `__consumer_offsets`: TxnOffsetCommit without AddOffsetsToTxn, then a commit.

    This is the hanging case Kafka Streams users meet ("partitions still have unstable offsets ...
    __consumer_offsets-NN"): the group coordinator appends the transactional offset commit, the transaction
    coordinator never learns of the group, so the commit writes no marker there.
    """
    if _verification_enabled(admin):
        raise WorkloadError(
            "transaction.partition.verification.enable is true on this cluster; start the test bed "
            "with `python -m dev.kafka up --no-verification`"
        )
    topic = f"{args.topic_prefix}hanging-offsets"
    ensure_topics(admin, [topic], 1)
    txn_id = new_transactional_id(f"{args.topic_prefix}hanging-offsets-")
    group = f"{txn_id}-group"
    producer = _producer(bootstrap, txn_id)
    pid, epoch = _pid_epoch(producer)
    producer.begin_transaction()
    md = producer.send(topic, value=b"committed", partition=0).get(timeout=30)
    request_topic = TxnOffsetCommitRequest.TxnOffsetCommitRequestTopic
    request = TxnOffsetCommitRequest(
        transactional_id=txn_id,
        group_id=group,
        producer_id=pid,
        producer_epoch=epoch,
        generation_id=-1,
        member_id="",
        group_instance_id=None,
        topics=[
            request_topic(
                name=topic,
                partitions=[
                    request_topic.TxnOffsetCommitRequestPartition(
                        partition_index=0,
                        committed_offset=md.offset + 1,
                        committed_leader_epoch=-1,
                        committed_metadata="",
                    )
                ],
            )
        ],
        max_version=3,  # v5+ is TV2: implicitly added, so never an orphan
    )

    async def find_coordinator() -> Any:
        return await admin._find_coordinator_id(group)

    async def send(node: int) -> Any:
        return await admin._manager.send(request, node_id=node)

    deadline = time.monotonic() + 30
    while True:  # the first FindCoordinator creates __consumer_offsets; retry until it is there
        try:
            node = admin._manager.run(find_coordinator)
            break
        except KafkaError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)
    deadline = time.monotonic() + 30
    while True:  # a fresh __consumer_offsets is still loading: COORDINATOR_LOAD_IN_PROGRESS (14) for a moment
        response = admin._manager.run(send, node)
        code = response.topics[0].partitions[0].error_code
        if code not in (14, 15, 16) or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    if code != 0:
        raise WorkloadError(f"TxnOffsetCommit failed with error code {code}")
    producer.commit_transaction()
    offsets_partitions = [
        TopicPartition("__consumer_offsets", p["partition_index"])
        for p in admin.describe_topics(["__consumer_offsets"])[0]["partitions"]
    ]
    for tp, state in admin.describe_producers(offsets_partitions).items():
        for prod in state.active_producers:
            if prod.producer_id == pid and prod.current_transaction_start_offset >= 0:
                _log(
                    f"hanging-offsets: {txn_id} (producer id {pid}) committed on {topic}-0; orphan offset "
                    f"commit open on {tp.topic}-{tp.partition} at offset {prod.current_transaction_start_offset}"
                )
                truth = [
                    TruthRecord("committed", topic, 0, pid, epoch, md.offset, txn_id, md.timestamp),
                    TruthRecord(
                        "hanging",
                        tp.topic,
                        tp.partition,
                        pid,
                        epoch,
                        prod.current_transaction_start_offset,
                        txn_id,
                        prod.last_timestamp,
                    ),
                ]
                owner_carries_on(admin, producer, args, truth, emit)
                return owner_ends(bootstrap, args, truth, txn_id)
    producer.close(timeout=10)
    raise WorkloadError(
        "the group coordinator accepted the offset commit but no open transaction was found on "
        "__consumer_offsets"
    )


def hanging_after_abort(
    bootstrap: str,
    admin: KafkaAdminClient,
    args: argparse.Namespace,
    emit: Callable[[list[TruthRecord]], None] | None = None,
) -> list[TruthRecord]:
    """A real orphan from a late produce: the transaction aborts, then a write of it arrives at a partition it never
    added (a delayed Produce request of the aborted transaction, with the epoch it had), so no marker ever comes."""
    if _verification_enabled(admin):
        raise WorkloadError(
            "transaction.partition.verification.enable is true on this cluster; start the test bed "
            "with `python -m dev.kafka up --no-verification`"
        )
    partitions = max(2, args.partitions)
    topic = f"{args.topic_prefix}hanging-after-abort"
    ensure_topics(admin, [topic], partitions)
    txn_id = new_transactional_id(f"{args.topic_prefix}hanging-after-abort-")
    producer = _producer(bootstrap, txn_id)
    pid, epoch = _pid_epoch(producer)
    producer.begin_transaction()
    md = producer.send(topic, value=b"aborted", partition=0).get(timeout=30)
    producer.abort_transaction()
    orphan_partition = partitions - 1
    offset, ts = write_orphan(admin, args, topic, orphan_partition, txn_id, pid, epoch, b"late-after-abort")
    _log(
        f"hanging-after-abort: {txn_id} (producer id {pid}, epoch {epoch}) aborted on {topic}-0; late write open "
        f"on {topic}-{orphan_partition} at offset {offset}"
    )
    truth = [
        TruthRecord("aborted", topic, 0, pid, epoch, md.offset, txn_id, md.timestamp),
        TruthRecord("hanging", topic, orphan_partition, pid, epoch, offset, txn_id, ts),
    ]
    owner_carries_on(admin, producer, args, truth, emit)
    return owner_ends(bootstrap, args, truth, txn_id)


def hanging_multi(
    bootstrap: str,
    admin: KafkaAdminClient,
    args: argparse.Namespace,
    emit: Callable[[list[TruthRecord]], None] | None = None,
) -> list[TruthRecord]:
    """Several orphans of one producer: unverified writes to `--orphan-partitions` partitions the coordinator never
    added, then a commit (markers reach partition 0 only)."""
    if _verification_enabled(admin):
        raise WorkloadError(
            "transaction.partition.verification.enable is true on this cluster; start the test bed "
            "with `python -m dev.kafka up --no-verification`"
        )
    orphans = max(1, args.orphan_partitions)
    partitions = max(args.partitions, orphans + 1)
    topic = f"{args.topic_prefix}hanging-multi"
    ensure_topics(admin, [topic], partitions)
    txn_id = new_transactional_id(f"{args.topic_prefix}hanging-multi-")
    producer = _producer(bootstrap, txn_id)
    pid, epoch = _pid_epoch(producer)
    producer.begin_transaction()
    md = producer.send(topic, value=b"committed", partition=0).get(timeout=30)
    truth = [TruthRecord("committed", topic, 0, pid, epoch, md.offset, txn_id, md.timestamp)]
    for partition in range(partitions - orphans, partitions):
        offset, ts = write_orphan(admin, args, topic, partition, txn_id, pid, epoch)
        truth.append(TruthRecord("hanging", topic, partition, pid, epoch, offset, txn_id, ts))
    producer.commit_transaction()
    _log(
        f"hanging-multi: {txn_id} (producer id {pid}, epoch {epoch}) committed on {topic}-0; orphans open on "
        f"partitions {[t.partition for t in truth[1:]]}"
    )
    owner_carries_on(admin, producer, args, truth, emit)
    return owner_ends(bootstrap, args, truth, txn_id)


def run(args: argparse.Namespace, emit: Callable[[list[TruthRecord]], None]) -> list[TruthRecord]:
    if args.owner_client != "kafka-python" and args.scenario != "hanging":
        raise WorkloadError(f"--owner-client {args.owner_client} is for --scenario hanging only")
    admin = KafkaAdminClient(bootstrap_servers=args.bootstrap_server, client_id="txnwatch-workload")
    try:
        if args.scenario == "steady":
            return steady(args.bootstrap_server, admin, args)
        if args.scenario == "late":
            return late(args.bootstrap_server, admin, args, emit)
        if args.scenario == "hanging":
            return hanging(args.bootstrap_server, admin, args, emit)
        if args.scenario == "hanging-after-abort":
            return hanging_after_abort(args.bootstrap_server, admin, args, emit)
        if args.scenario == "hanging-multi":
            return hanging_multi(args.bootstrap_server, admin, args, emit)
        return hanging_offsets(args.bootstrap_server, admin, args, emit)
    finally:
        admin.close()


def truth_json(scenario: str, truth: list[TruthRecord]) -> str:
    return json.dumps({"scenario": scenario, "transactions": [asdict(t) for t in truth]})


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m dev.workload",
        description="Run real Kafka transactions against a cluster and print what was made (the ground truth).",
        epilog="hanging needs transaction.partition.verification.enable=false "
        "(python -m dev.kafka up --no-verification). Test clusters only: it writes an orphan on purpose.",
    )
    p.add_argument("--bootstrap-server", required=True, help="host:port[,host:port...]")
    p.add_argument("--scenario", required=True, choices=SCENARIOS)
    p.add_argument(
        "--json",
        action="store_true",
        help='print {"scenario":..., "transactions":[...]} on stdout as one JSON object',
    )
    p.add_argument("--topic-prefix", default="wl-", help="prefix of the topics and transactional ids made")
    p.add_argument(
        "--partitions", type=int, default=3, help="partitions per topic made (default %(default)s)"
    )
    p.add_argument("--topics", type=int, default=3, help="steady: number of topics")
    p.add_argument("--producers", type=int, default=2, help="steady: transactional producers")
    p.add_argument("--seconds", type=float, default=5.0, help="steady: how long to run")
    p.add_argument("--rate", type=float, default=20.0, help="steady: transactions per second (upper bound)")
    p.add_argument("--abort-ratio", type=float, default=0.2, help="steady: share of transactions aborted")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--coordinator-partition",
        metavar="P/N",
        help="make every transactional id live in __transaction_state partition P of N (N: the topic's partition "
        "count, transaction.state.log.num.partitions)",
    )
    p.add_argument(
        "--transactional-id",
        help="hanging: use this transactional id (e.g. one an earlier run made) instead of a fresh one; its "
        "orphan then lands on the same partition with the producer's next epoch, and the truth's start offset is "
        "this run's orphan batch (an older open orphan of the producer id still starts the transaction)",
    )
    p.add_argument(
        "--owner-stays-live",
        action="store_true",
        help="hanging scenarios: skip the owner's restart at the end (by default a new producer with the orphan's "
        "transactional id initialises, moving it to the next epoch, and closes); the id then stays live at the "
        "orphan's epoch, which `txnwatch proposals abort` refuses (live-owner-same-epoch) without "
        "--allow-live-owner",
    )
    p.add_argument(
        "--owner-busy-ms",
        type=int,
        default=0,
        help="every hanging scenario: after the orphan, the owner lives on: the same producer commits a one-record transaction "
        "on <prefix>owner-busy every N ms (as a Kafka Streams thread commits every 100 ms) for --owner-busy-for-s, "
        "then ends as without it (restart, or --owner-stays-live; a java owner just closes); with --json the truth "
        "is printed at the orphan, before the busy period (0, the default: no busy period)",
    )
    p.add_argument(
        "--owner-client",
        choices=OWNER_CLIENTS,
        default="kafka-python",
        help="hanging: the client that owns the orphan's transactional id. kafka-python (the default) runs "
        "transaction version 0/1: one producer epoch for all its transactions, so while it lives on it stays at its "
        "orphan's epoch and `proposals abort` refuses (live-owner-same-epoch) until it restarts. java: a Kafka 4.x "
        "Java producer (dev/jvm/owner/BusyOwner.java, compiled on first use against .cache/jars/kafka: `make jars`), "
        "transaction version 2 on a cluster that finalized it (the bed's default): every commit moves its epoch by "
        "one, so its first commit already leaves the orphan behind, no restart follows, and the orphan may be "
        "aborted while it keeps committing (with --owner-busy-ms); not with --owner-stays-live",
    )
    p.add_argument(
        "--owner-busy-for-s",
        type=float,
        default=120.0,
        help="hanging with --owner-busy-ms: how long the owner keeps committing (default %(default)s)",
    )
    p.add_argument(
        "--orphan-partitions",
        type=int,
        default=3,
        help="hanging-multi: partitions of one producer left with an orphan (default %(default)s)",
    )
    p.add_argument("--hold-ms", type=int, default=30_000, help="late: how long the transaction stays open")
    p.add_argument(
        "--transaction-timeout-ms",
        type=int,
        default=60_000,
        help="late: the producer's transaction.timeout.ms (<= the brokers' transaction.max.timeout.ms)",
    )
    p.add_argument(
        "--backdate-ms",
        type=int,
        default=0,
        help="hanging, late: make the first record's CreateTime this much older than now, so time-based tools "
        "(find-hanging, the broker's PartitionsWithLateTransactionsCount) see it as old at once",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    global _COORDINATOR_PARTITION
    if args.coordinator_partition:
        wanted, _, partitions = args.coordinator_partition.partition("/")
        _COORDINATOR_PARTITION = (int(wanted), int(partitions))
    printed = False

    def emit(truth: list[TruthRecord]) -> None:
        nonlocal printed
        if args.json:
            print(truth_json(args.scenario, truth), flush=True)
            printed = True

    try:
        truth = run(args, emit)
    except WorkloadError as exc:
        print(f"dev.workload: {exc}", file=sys.stderr)
        return 2
    if args.json and not printed:
        print(truth_json(args.scenario, truth), flush=True)
    elif not args.json:
        for t in truth:
            owner = "" if t.owner_epoch is None else f", now at epoch {t.owner_epoch}"
            print(
                f"{t.kind:9} {t.topic}-{t.partition} producer {t.producer_id}/{t.producer_epoch} "
                f"start offset {t.start_offset} ({t.transactional_id}{owner})"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
