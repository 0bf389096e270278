"""Golden fixtures for detectors/codec.py: real `__transaction_state` records from a test-bed broker.

`python -m dev.capture_txnlog --bootstrap-server B --transaction-version 0|2` runs kafka-python transactional
producers (commit, abort, fenced, two in a row), reads the topic raw and writes tests/unit/resources/*.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic

from dev.oracle import run_tool

TXN_TOPIC = "__transaction_state"
RESOURCES = Path(__file__).resolve().parent.parent / "tests" / "unit" / "resources"
TIMEOUT_S = 60.0


def _log(msg: str) -> None:
    print(f"[capture] {msg}", file=sys.stderr, flush=True)


def _producer(bootstrap: str, transactional_id: str) -> KafkaProducer:
    return KafkaProducer(
        bootstrap_servers=bootstrap,
        transactional_id=transactional_id,
        transaction_timeout_ms=30_000,
        acks="all",
    )


def _send(producer: KafkaProducer, targets: Sequence[tuple[str, int]]) -> None:
    for topic, partition in targets:
        producer.send(topic, value=b"codec-golden", partition=partition)
    producer.flush(timeout=TIMEOUT_S)


def run_scenarios(bootstrap: str, prefix: str, topic_a: str, topic_b: str) -> dict[str, dict[str, Any]]:
    """Run the transactions whose coordinator records the fixtures hold; returns id -> what was done."""
    done: dict[str, dict[str, Any]] = {}

    tid = f"{prefix}-commit"  # Empty -> Ongoing -> PrepareCommit -> CompleteCommit
    p = _producer(bootstrap, tid)
    p.init_transactions()
    p.begin_transaction()
    _send(p, [(topic_a, 0), (topic_a, 2)])
    p.commit_transaction()
    p.close(timeout=10)
    done[tid] = {"scenario": "commit", "partitions": {topic_a: [0, 2]}}

    tid = f"{prefix}-abort"  # two topics, then PrepareAbort -> CompleteAbort
    p = _producer(bootstrap, tid)
    p.init_transactions()
    p.begin_transaction()
    _send(p, [(topic_a, 1), (topic_b, 0), (topic_b, 1)])
    p.abort_transaction()
    p.close(timeout=10)
    done[tid] = {"scenario": "abort", "partitions": {topic_a: [1], topic_b: [0, 1]}}

    tid = f"{prefix}-two"  # two committed transactions in a row from one producer
    p = _producer(bootstrap, tid)
    p.init_transactions()
    for partition in (0, 1):
        p.begin_transaction()
        _send(p, [(topic_b, partition)])
        p.commit_transaction()
    p.close(timeout=10)
    done[tid] = {"scenario": "two-commits", "partitions": {topic_b: [0, 1]}}

    tid = f"{prefix}-fenced"  # a second producer's init aborts the first one's open transaction
    first = _producer(bootstrap, tid)
    first.init_transactions()
    first.begin_transaction()
    _send(first, [(topic_a, 0)])
    second = _producer(bootstrap, tid)
    second.init_transactions()
    second.close(timeout=10)
    first.close(timeout=1)
    done[tid] = {"scenario": "fenced", "partitions": {topic_a: [0]}}
    return done


def _ensure_topics(bootstrap: str, topics: dict[str, int]) -> None:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(t, n, 1) for t, n in topics.items()])
        deadline = time.monotonic() + TIMEOUT_S
        while set(topics) - set(admin.list_topics()):
            if time.monotonic() > deadline:
                raise TimeoutError(f"topics {sorted(topics)} not created")
            time.sleep(0.2)
    finally:
        admin.close()


def read_raw(bootstrap: str, key_marker: bytes) -> list[dict[str, Any]]:
    """Every `__transaction_state` record whose key contains `key_marker`, as raw hex, in log order."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    try:
        partitions = sorted(consumer.partitions_for_topic(TXN_TOPIC) or ())
        if not partitions:
            raise RuntimeError(f"{TXN_TOPIC} has no partitions: was any transactional producer initialised?")
        tps = [TopicPartition(TXN_TOPIC, p) for p in partitions]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        end = consumer.end_offsets(tps)
        records: list[dict[str, Any]] = []
        deadline = time.monotonic() + TIMEOUT_S
        while any(consumer.position(tp) < end[tp] for tp in tps):
            if time.monotonic() > deadline:
                raise TimeoutError(f"could not read {TXN_TOPIC} up to {end}")
            for batch in consumer.poll(timeout_ms=500).values():
                records += [
                    {
                        "partition": r.partition,
                        "offset": r.offset,
                        "timestamp_ms": r.timestamp,
                        "key": r.key.hex(),
                        "value": None if r.value is None else r.value.hex(),
                    }
                    for r in batch
                    if r.key is not None and key_marker in r.key
                ]
        return sorted(records, key=lambda r: (r["partition"], r["offset"]))
    finally:
        consumer.close()


def kafka_formatted(bootstrap: str, first: int, last: int, partition: int) -> dict[int, Any]:
    """Kafka's own reading (TransactionLogMessageFormatter) of one partition's offsets first..last."""
    done = run_tool(
        "org.apache.kafka.tools.consumer.ConsoleConsumer",
        [
            "--bootstrap-server",
            bootstrap,
            "--topic",
            TXN_TOPIC,
            "--partition",
            str(partition),
            "--offset",
            str(first),
            "--max-messages",
            str(last - first + 1),
            "--timeout-ms",
            "20000",
            "--formatter",
            "org.apache.kafka.tools.consumer.TransactionLogMessageFormatter",
        ],
    )
    objects = _json_objects(done.stdout)
    if len(objects) != last - first + 1:  # a compacted gap would break the offset mapping; keep none then
        _log(f"partition {partition}: formatter gave {len(objects)} records for offsets {first}..{last}")
        return {}
    return {first + i: obj for i, obj in enumerate(objects)}


def _json_objects(text: str) -> list[Any]:
    # The formatter prints the records' JSON objects back to back, without separators.
    decoder, objects, pos = json.JSONDecoder(), [], text.find("{")
    while pos != -1:
        obj, end = decoder.raw_decode(text, pos)
        objects.append(obj)
        pos = text.find("{", end)
    return objects


def wait_for_tombstone(bootstrap: str, key_marker: bytes, wait_s: float) -> list[dict[str, Any]]:
    """Re-read until a tombstone (expired transactional id) shows up, or `wait_s` passes."""
    deadline = time.monotonic() + wait_s
    records = read_raw(bootstrap, key_marker)
    while not any(r["value"] is None for r in records) and time.monotonic() < deadline:
        time.sleep(2)
        records = read_raw(bootstrap, key_marker)
    return records


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dev.capture_txnlog", description=__doc__)
    parser.add_argument("--bootstrap-server", required=True)
    parser.add_argument(
        "--transaction-version",
        type=int,
        choices=(0, 1, 2),
        required=True,
        help="the test bed's transaction.version (names the output file; not checked)",
    )
    parser.add_argument("--out", type=Path, help="default: tests/unit/resources/txnlog_tv<N>.json")
    parser.add_argument(
        "--tombstone-wait-s",
        type=float,
        default=45.0,
        help="how long to wait for an expiry tombstone (start the broker with a short "
        "expiry: --override transactional.id.expiration.ms=8000)",
    )
    args = parser.parse_args(argv)

    run = uuid.uuid4().hex[:8]
    prefix = f"codec-{run}"
    topic_a, topic_b = f"{prefix}-a", f"{prefix}-b"
    _ensure_topics(args.bootstrap_server, {topic_a: 3, topic_b: 2})
    scenarios = run_scenarios(args.bootstrap_server, prefix, topic_a, topic_b)
    _log(f"ran {len(scenarios)} scenarios; waiting up to {args.tombstone_wait_s:.0f}s for a tombstone")
    records = wait_for_tombstone(args.bootstrap_server, prefix.encode(), args.tombstone_wait_s)
    for partition in sorted({r["partition"] for r in records}):
        offsets = [r["offset"] for r in records if r["partition"] == partition]
        by_offset = kafka_formatted(args.bootstrap_server, min(offsets), max(offsets), partition)
        for r in records:
            if r["partition"] == partition and r["offset"] in by_offset:
                r["kafka_formatter"] = by_offset[r["offset"]]
    fixture = {
        "about": "Raw __transaction_state records from a real broker (dev/capture_txnlog.py); "
        "kafka_formatter is Kafka's own TransactionLogMessageFormatter output for the same record.",
        "transaction_version": args.transaction_version,
        "client": "kafka-python",
        "topics": {topic_a: 3, topic_b: 2},
        "transactional_ids": scenarios,
        "records": records,
    }
    out = args.out or RESOURCES / f"txnlog_tv{args.transaction_version}.json"
    out.write_text(json.dumps(fixture, indent=1) + "\n")
    _log(f"wrote {len(records)} records ({sum(r['value'] is None for r in records)} tombstones) to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
