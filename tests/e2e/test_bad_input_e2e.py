"""Bad input on the real topics, end to end: fuzzed `__transaction_state`-shaped records and fuzzed snapshot JSON
are produced while the streaming job runs (its three queries, the real connector, a real collector); each one
lands on the dead-letter topic with its raw bytes and reason, the dead-letter counter and the topic hold exactly as
many as were injected, and the queries stay up and keep making progress.

`__transaction_state` cannot be written by clients: the job's transaction-log source is pointed at a copy of it
(`--transaction-log-topic`, as tests/e2e/test_stream_e2e.py does), which holds every real record of the log and
then the fuzzed ones. The snapshots go to the real `<prefix>.producer-state` topic, beside the collector's.

The fuzz corpus is drawn by hypothesis (derandomized, so a run is repeatable): random bytes, and real records cut
short, with bytes flipped, with bytes appended, or with another value version. A mutation that still decodes is
left out (it would be a real coordinator record); the codec decides, so the count is exact. Snapshot mutations
are built to break the PartitionSnapshot contract in the ways the job checks (not JSON, not an object, no or
another schema_version, a required field missing or null, a number that is not one).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import NewTopic
from pyspark.sql import SparkSession
from test_stream_e2e import Console, first_batch_done, read_topic, scrape, wait_for
from workloads import run_workload

from common.settings import KafkaSettings, Settings, StreamSettings
from common.topics import TopicSettings
from detectors.codec import DecodeError, TxnLogKey, decode_value, encode_key
from detectors.contract import SNAPSHOT_TYPE, TYPE_HEADER
from detectors.models import SCHEMA_VERSION, OpenTransaction, PartitionSnapshot
from streaming import job
from streaming.sources import _decode_fields

pytestmark = pytest.mark.e2e

LOG_CASES = 150
SNAPSHOT_CASES = 150
FUTURE_VERSION = 2  # TransactionLogValue's highest version is 1 (Kafka 4.x)


def corpus(strategy: st.SearchStrategy[Any], n: int) -> list[Any]:
    """`n` examples of `strategy`, the same on every run (hypothesis outside a test: no shrinking, no database)."""
    out: list[Any] = []

    @settings(
        max_examples=n,
        derandomize=True,
        database=None,
        phases=[Phase.generate],
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def collect(example: Any) -> None:
        out.append(example)

    collect()
    return out


def undecodable(key: bytes | None, value: bytes | None) -> str | None:
    """The codec's reason a record cannot be read, or None if it can (what the job decides, on the executors)."""
    try:
        _decode_fields(key, value, 0)
    except (DecodeError, ValueError) as exc:
        return str(exc)
    return None


def log_records(
    real: list[tuple[bytes, bytes | None]],
) -> st.SearchStrategy[tuple[bytes | None, bytes | None]]:
    """Real records cut short, with a byte flipped, with bytes appended or another value version; random bytes."""

    @st.composite
    def mutated(draw: st.DrawFn) -> tuple[bytes | None, bytes | None]:
        key, value = draw(st.sampled_from(real))
        in_value = value is not None and draw(st.booleans())
        target = bytearray(value if in_value and value is not None else key)
        how = draw(st.sampled_from(["cut", "flip", "append", "version"]))
        if how == "cut":
            del target[draw(st.integers(0, len(target) - 1)) :]
        elif how == "flip":
            target[draw(st.integers(0, len(target) - 1))] ^= draw(st.integers(1, 255))
        elif how == "append":
            target += draw(st.binary(min_size=1, max_size=8))
        else:
            version = draw(st.integers(-(2**15), 2**15 - 1).filter(lambda v: v not in (0, 1)))
            target[:2] = version.to_bytes(2, "big", signed=True)
        return (key, bytes(target)) if in_value else (bytes(target), value)

    random_bytes = st.tuples(st.none() | st.binary(max_size=40), st.none() | st.binary(max_size=120)).filter(
        lambda kv: kv != (None, None)  # a Kafka record has a key or a value
    )
    return mutated() | random_bytes


def good_snapshot() -> dict[str, Any]:
    txn = OpenTransaction(
        producer_id=7, producer_epoch=1, start_offset=10, start_timestamp_ms=1, last_timestamp_ms=2
    )
    snap = PartitionSnapshot(
        cluster="e2e",
        sweep_id="fuzz",
        observed_at_ms=int(time.time() * 1000),
        leader=1,
        topic="fuzz-topic",
        partition=0,
        open_transactions=(txn,),
    )
    return json.loads(snap.model_dump_json())


REQUIRED = ("cluster", "topic", "partition", "leader", "observed_at_ms", "open_transactions")
NUMERIC = ("partition", "leader", "observed_at_ms", "schema_version")
TXN_REQUIRED = ("producer_id", "producer_epoch", "start_offset")
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)


def snapshot_texts() -> st.SearchStrategy[bytes]:
    base = good_snapshot()

    def without(field: str) -> bytes:
        return json.dumps({k: v for k, v in base.items() if k != field}).encode()

    def nulled(field: str) -> bytes:
        return json.dumps({**base, field: None}).encode()

    def not_a_number(field: str, text: str) -> bytes:
        return json.dumps({**base, field: text}).encode()

    def txn_without(field: str) -> bytes:
        txn = {k: v for k, v in base["open_transactions"][0].items() if k != field}
        return json.dumps({**base, "open_transactions": [txn]}).encode()

    def other_version(v: int) -> bytes:
        return json.dumps({**base, "schema_version": v}).encode()

    def truncated(i: int) -> bytes:
        whole = json.dumps(base).encode()
        return whole[: i % len(whole)]

    def not_json(b: bytes) -> bytes:
        return b if b.strip()[:1] not in (b"{", b"[") else b"#" + b

    return st.one_of(
        st.sampled_from(REQUIRED).map(without),
        st.sampled_from(REQUIRED).map(nulled),
        st.builds(
            not_a_number, st.sampled_from(NUMERIC), st.text(alphabet="abcxyz-", min_size=1, max_size=6)
        ),
        st.sampled_from(TXN_REQUIRED).map(txn_without),
        st.integers().filter(lambda v: v != SCHEMA_VERSION).map(other_version),
        st.integers(0, 10_000).map(truncated),
        st.binary(max_size=80).map(not_json),
        JSON_VALUES.filter(lambda v: not isinstance(v, dict) or "schema_version" not in v).map(
            lambda v: json.dumps(v).encode()
        ),
    )


def breaks_contract(text: bytes) -> bool:
    """Not a PartitionSnapshot the job takes: another schema_version, a required field (the job's list: the model
    has defaults for some) missing or null, or anything the model rejects."""
    try:
        doc = json.loads(text)
    except ValueError:
        return True
    if not isinstance(doc, dict) or doc.get("schema_version") != SCHEMA_VERSION:
        return True
    if any(doc.get(field) is None for field in REQUIRED):
        return True
    try:
        PartitionSnapshot.model_validate(doc)
    except ValueError:
        return True
    return False


class Job:
    """This module's job: all three queries on its own checkpoint, the log copy as its transaction log."""

    def __init__(self, spark: SparkSession, bootstrap: str, prefix: str, log_copy: str, ck: Path) -> None:
        settings_ = Settings(
            cluster="e2e",
            kafka=KafkaSettings(bootstrap_servers=bootstrap),
            topics=TopicSettings(prefix=prefix),
            stream=StreamSettings(
                checkpoint_location=str(ck),
                trigger="3 seconds",
                starting_offsets="earliest",
                transaction_log_topic=log_copy,
                expire_after_ms=20_000,
                metrics_port=0,
            ),
        )
        self.settings = settings_
        self.opts = job.StreamOptions(
            settings=settings_, kafka_options={"bootstrap.servers": bootstrap}, secondary_trigger="5 seconds"
        )
        job.ensure_topics(self.opts, settings_.kafka.client_kwargs())
        self.console = Console()
        self.running = job.start(spark, self.opts, out=self.console)
        wait_for(lambda: first_batch_done(self.running, "txnwatch-reconcile"), 240, "the job's first batch")

    def query(self, name: str) -> Any:
        return next(q for q in self.running.queries if q.name == f"txnwatch-{name}")


@pytest.fixture(scope="module")
def bed(
    bootstrap: str, spark: SparkSession, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    prefix = f"bad{uuid.uuid4().hex[:8]}"
    # Something in the transaction log whatever ran before, then all of it copied (one partition keeps each
    # transactional id's records in their order, as the real log does).
    run_workload(bootstrap, "--scenario", "steady", "--topic-prefix", f"{prefix}-seed-", "--seconds", "1")
    real = [(r.key, r.value) for r in read_topic(bootstrap, "__transaction_state")]
    assert real, "the transaction log has records after the steady workload"
    log_copy = f"{prefix}-txnlog-copy"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(log_copy, 1, 1)])
    admin.close()
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    for key, value in real:
        producer.send(log_copy, key=key, value=value)
    producer.flush()
    log = (tmp_path_factory.mktemp("collector") / "collector.log").open("w")
    collector = subprocess.Popen(
        [
            *(sys.executable, "-m", "txnwatch_cli", "collect", "--bootstrap-server", bootstrap),
            *("--interval-ms", "5000", "--topic-prefix", prefix, "--cluster", "e2e", "--metrics-port", "0"),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )
    running: Job | None = None
    try:
        running = Job(spark, bootstrap, prefix, log_copy, tmp_path_factory.mktemp("checkpoints"))
        yield {
            "bootstrap": bootstrap,
            "prefix": prefix,
            "log_copy": log_copy,
            "real": [(k, v) for k, v in real if k is not None],
            "job": running,
            "producer": producer,
        }
    finally:
        if running is not None:
            running.running.stop()
        producer.close()
        collector.terminate()
        collector.wait(timeout=30)
        log.close()


def dead_letters(bed: dict[str, Any]) -> list[Any]:
    return read_topic(bed["bootstrap"], bed["job"].settings.topics.dead_letter)


def header(record: Any, name: str) -> str:
    return dict(record.headers)[name].decode()


def test_fuzzed_input_goes_to_dead_letter_exactly_and_the_queries_stay_up(bed: dict[str, Any]) -> None:
    running: Job = bed["job"]
    producer: KafkaProducer = bed["producer"]
    wait_for(lambda: first_batch_done(running.running, "txnwatch-dead-letter"), 240, "the dead-letter query")
    assert dead_letters(bed) == [], "the real log copy and the collector's snapshots are all good"

    # Coordinator-log records: what the codec cannot read is what must come out; a mutation it reads is left out.
    drawn = corpus(log_records(bed["real"]), LOG_CASES)
    bad_log = [(k, v, why) for k, v in drawn if (why := undecodable(k, v)) is not None]
    assert len(bad_log) >= LOG_CASES * 3 // 4, f"only {len(bad_log)} of {LOG_CASES} fuzzed records are bad"
    # An unknown future TransactionLogValue version: a real record but for its version field.
    key, value = next((k, v) for k, v in bed["real"] if v is not None and decode_value(v) is not None)
    future = (key, FUTURE_VERSION.to_bytes(2, "big") + value[2:])
    assert undecodable(*future) == f"unsupported value version {FUTURE_VERSION}"
    bad_log.append((*future, "future"))
    # An odd record of the same shape beside them: a tombstone of a transactional id nobody had.
    tombstone = (encode_key(TxnLogKey(f"{bed['prefix']}-never-seen")), None)
    assert undecodable(*tombstone) is None

    snapshots = corpus(snapshot_texts(), SNAPSHOT_CASES)
    assert all(breaks_contract(text) for text in snapshots)

    sent_log: dict[int, tuple[bytes | None, bytes | None]] = {}
    for k, v, _ in bad_log:
        md = producer.send(bed["log_copy"], key=k, value=v).get(timeout=30)
        sent_log[md.offset] = (k, v)
    producer.send(bed["log_copy"], key=tombstone[0], value=None).get(timeout=30)
    future_offset = max(sent_log)
    sent_snap: dict[tuple[int, int], bytes] = {}
    for i, text in enumerate(snapshots):
        headers = [(TYPE_HEADER, SNAPSHOT_TYPE.encode())] if i % 2 == 0 else []  # the header is optional
        md = producer.send(
            running.settings.topics.producer_state, key=f"fuzz-{i}".encode(), value=text, headers=headers
        ).get(timeout=30)
        sent_snap[(md.partition, md.offset)] = text
    injected = len(sent_log) + len(sent_snap)
    injected_at = time.monotonic()
    print(f"\ninjected {len(sent_log)} coordinator-log and {len(sent_snap)} snapshot records")

    records = wait_for(
        lambda: (r := dead_letters(bed)) and len(r) >= injected and r, 300, f"{injected} dead letters"
    )
    print(f"all dead letters out {time.monotonic() - injected_at:.0f}s after the injection")
    # Every query keeps going: two more batches of each after the last dead letter, nothing more comes out.
    marks = {
        n: (running.query(n).lastProgress or {}).get("batchId", -1)
        for n in ("reconcile", "windows", "dead-letter")
    }

    def two_more_batches_each() -> bool:
        assert running.running.failed() is None, running.running.failed()
        return all(
            (running.query(n).lastProgress or {}).get("batchId", -1) >= b + 2 for n, b in marks.items()
        )

    wait_for(two_more_batches_each, 180, "two more batches of every query")
    records = dead_letters(bed)
    assert len(records) == injected
    assert all(q.isActive for q in running.running.queries), running.running.failed()
    reconcile_rows = [
        p["numInputRows"]
        for p in running.query("reconcile").recentProgress
        if p["batchId"] > marks["reconcile"]
    ]
    assert sum(reconcile_rows) > 0, "the reconcile query still reads input (the collector's snapshots)"

    by_source: dict[str, list[Any]] = {}
    for r in records:
        by_source.setdefault(header(r, "txnwatch.source"), []).append(r)
    assert {s: len(v) for s, v in by_source.items()} == {
        "transaction-log": len(sent_log),
        "producer-state": len(sent_snap),
    }
    # Nothing lost, nothing changed: each dead letter is one injected record, raw bytes and origin kept.
    for r in by_source["transaction-log"]:
        assert header(r, "txnwatch.source-topic") == bed["log_copy"]
        offset = int(header(r, "txnwatch.source-offset"))
        assert (r.key, r.value) == sent_log.pop(offset)
        assert header(r, "txnwatch.error").startswith("undecodable __transaction_state record: ")
        if offset == future_offset:
            assert header(r, "txnwatch.error").endswith(f"unsupported value version {FUTURE_VERSION}")
    assert sent_log == {}
    for r in by_source["producer-state"]:
        where = (int(header(r, "txnwatch.source-partition")), int(header(r, "txnwatch.source-offset")))
        assert r.value == sent_snap.pop(where)
        assert header(r, "txnwatch.error").startswith("malformed PartitionSnapshot: ")
    assert sent_snap == {}

    m = scrape(running.running.metrics_port)
    counts = {lb["source"]: v for lb, v in m["txnwatch_dead_letter_records_total"]}
    assert counts == {
        "transaction-log": len(by_source["transaction-log"]),
        "producer-state": len(by_source["producer-state"]),
    }


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--trigger", "every now and then"), ("--window", "a while")],
    ids=["trigger", "window"],
)
def test_a_duration_spark_cannot_read_is_one_line(
    bootstrap: str, flag: str, value: str, tmp_path: Path
) -> None:
    # Spark reads these when it plans the queries, after the JVM started: the stream command's last check.
    done = subprocess.run(
        [
            *(sys.executable, "-m", "txnwatch_cli", "stream", "--bootstrap-server", bootstrap),
            *("--topic-prefix", f"bad{uuid.uuid4().hex[:8]}", "--checkpoint-location", str(tmp_path / "ck")),
            *("--metrics-port", "0", "--seconds", "30", flag, value),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 2, done.stderr
    ours = [ln for ln in done.stderr.splitlines() if ln.startswith("txnwatch stream:")]
    assert len(ours) == 1 and "Spark refused the query" in ours[0], done.stderr
    assert value in ours[0] or "interval" in ours[0].lower(), ours[0]
