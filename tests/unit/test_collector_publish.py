"""What goes on the wire: keys, headers and values of the contract; reading the snapshot topic back."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, NamedTuple

import kafka.errors as Errors
import pytest
from collector_fakes import FakeCluster, producer, start_batch
from kafka.structs import TopicPartition as KafkaTP
from prometheus_client import generate_latest

from admin.collect.collector import Collector
from admin.collect.coordinator import tombstone
from admin.collect.metrics import CollectorMetrics
from admin.collect.publish import (
    KafkaSink,
    OutRecord,
    Publisher,
    coordinator_record,
    restore_open_partitions,
    sweep_records,
)
from admin.wire.errors import AdminError
from admin.wire.types import SweepResult
from common.settings import CollectorSettings
from common.topics import OutputTopicSettings
from detectors.contract import COORDINATOR_LOG_POSITION_TYPE
from detectors.models import (
    BrokerSweepSummary,
    CoordinatorLogPosition,
    PartitionSnapshot,
)

pytestmark = pytest.mark.unit

TOPIC = "txnwatch.producer-state"


def a_sweep(*, transaction_log: bool = False) -> SweepResult:
    cluster = FakeCluster(
        leaders={("orders", 0): 1, ("orders", 1): 2},
        producers={("orders", 0): [producer()]},
        starts={(("orders", 0), 100): start_batch()},
    )
    if transaction_log:
        cluster.leaders |= {("__transaction_state", 0): 1, ("__transaction_state", 1): 2}
        cluster.high_watermarks = {("__transaction_state", 0): 7, ("__transaction_state", 1): 9}
    collector = Collector(
        cluster, cluster="prod", settings=CollectorSettings(), open_partitions={("orders", 1)}
    )
    return collector.sweep()


class ListSink:
    def __init__(self) -> None:
        self.sent: list[OutRecord] = []
        self.closed = False

    def send_all(self, records: Sequence[OutRecord]) -> None:
        self.sent.extend(records)

    def close(self) -> None:
        self.closed = True


def test_sweep_records_follow_the_contract() -> None:
    records = sweep_records(TOPIC, a_sweep())
    by_key = {r.key: r for r in records}
    snap = by_key[b"orders-0"]
    assert snap.topic == TOPIC and snap.headers == [("txnwatch.type", b"partition-snapshot")]
    assert PartitionSnapshot.model_validate_json(snap.value).open_transactions[0].producer_id == 1000
    empty = by_key[b"orders-1"]  # restored as open, now empty: the explicit empty snapshot
    assert empty.headers == [("txnwatch.type", b"partition-snapshot")]
    assert PartitionSnapshot.model_validate_json(empty.value).open_transactions == ()
    for broker in (1, 2, 3):
        summary = by_key[f"__sweep__-broker-{broker}".encode()]
        assert summary.headers == [("txnwatch.type", b"broker-sweep-summary")]
        assert BrokerSweepSummary.model_validate_json(summary.value).broker == broker
    # Snapshots first, summaries last: a consumer sees the coverage after the partitions it covers.
    assert [r.key for r in records][-3:] == [
        b"__sweep__-broker-1",
        b"__sweep__-broker-2",
        b"__sweep__-broker-3",
    ]


def test_position_is_published_after_the_sweeps_other_records_with_its_header() -> None:
    result = a_sweep(transaction_log=True)
    records = sweep_records(TOPIC, result)
    *others, last = records
    assert last.topic == TOPIC and last.key == b"__position__-__transaction_state"
    assert last.headers == [("txnwatch.type", COORDINATOR_LOG_POSITION_TYPE.encode())]
    assert COORDINATOR_LOG_POSITION_TYPE == "coordinator-log-position"
    assert last.value == result.positions[0].model_dump_json().encode()
    position = CoordinatorLogPosition.model_validate_json(last.value)
    assert (position.topic, position.partitions, position.end_offsets) == (
        "__transaction_state",
        2,
        {0: 7, 1: 9},
    )
    assert position.sweep_id == result.sweep_id
    kinds = [dict(r.headers)["txnwatch.type"] for r in others]
    # snapshots (open, then empty), then the summaries; the position comes after all of them
    assert kinds == [b"partition-snapshot"] * 2 + [b"broker-sweep-summary"] * 3


def test_publisher_sends_positions_to_the_snapshot_topic_and_counts_them() -> None:
    sink = ListSink()
    metrics = CollectorMetrics()
    publisher = Publisher(sink, snapshot_topic=TOPIC, coordinator_topic="c", metrics=metrics)
    assert publisher.publish_sweep(a_sweep(transaction_log=True)) == 6
    position = CoordinatorLogPosition(
        cluster="prod", sweep_id="p-1", topic="c", partitions=1, as_of_ms=5, end_offsets={0: 3}
    )
    assert publisher.publish_positions([]) == 0
    assert publisher.publish_positions([position]) == 1
    assert (sink.sent[-1].topic, sink.sent[-1].key) == (TOPIC, b"__position__-c")
    text = generate_latest(metrics.registry).decode()
    assert 'txnwatch_collector_records_published_total{type="coordinator-log-position"} 2.0' in text


def test_value_is_exactly_model_dump_json() -> None:
    result = a_sweep()
    (snap,) = [r for r in sweep_records(TOPIC, result) if r.key == b"orders-0"]
    assert snap.value == result.snapshots[0].model_dump_json().encode()


def test_coordinator_record_key_is_the_transactional_id() -> None:
    r = coordinator_record("txnwatch.coordinator-state", tombstone("tx-ü", seen_at_ms=1))
    assert r.key == "tx-ü".encode() and r.headers == [("txnwatch.type", b"coordinator-record")]
    assert json.loads(r.value)["tombstone"] is True


def test_publisher_counts_what_it_sends() -> None:
    sink = ListSink()
    metrics = CollectorMetrics()
    publisher = Publisher(sink, snapshot_topic=TOPIC, coordinator_topic="c", metrics=metrics)
    assert publisher.publish_sweep(a_sweep()) == 5
    assert publisher.publish_coordinator([]) == 0
    assert publisher.publish_coordinator([tombstone("t", seen_at_ms=1)]) == 1
    publisher.close()
    assert sink.closed and sink.sent[-1].topic == "c"
    text = generate_latest(metrics.registry).decode()
    assert 'txnwatch_collector_records_published_total{type="partition-snapshot"} 1.0' in text
    assert 'txnwatch_collector_records_published_total{type="empty-snapshot"} 1.0' in text
    assert 'txnwatch_collector_records_published_total{type="broker-sweep-summary"} 3.0' in text


class FailingFuture:
    def get(self, timeout: float) -> None:
        raise Errors.TopicAuthorizationFailedError()


class FakeProducer:
    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def send(self, topic: str, **kw: Any) -> FailingFuture:
        self.sent.append((topic, kw))
        return FailingFuture()

    def flush(self, timeout: float) -> None:
        pass


def test_kafka_sink_names_the_missing_write_acl() -> None:
    fake = FakeProducer()
    with pytest.raises(AdminError, match=r"Write on topic txnwatch\.producer-state"):
        KafkaSink(fake).send_all([OutRecord(TOPIC, b"k", b"v", [("txnwatch.type", b"x")])])  # type: ignore[arg-type]
    assert fake.sent == [(TOPIC, {"key": b"k", "value": b"v", "headers": [("txnwatch.type", b"x")]})]


def test_output_topic_configs() -> None:
    assert OutputTopicSettings().topic_configs() == {"cleanup.policy": "compact,delete"}
    assert OutputTopicSettings(cleanup_policy="compact", retention_ms=5).topic_configs() == {
        "cleanup.policy": "compact",
        "retention.ms": "5",
    }


# ------------------------------------------------------------------------------------------ restore


class Rec(NamedTuple):
    partition: int
    offset: int
    headers: list[tuple[str, bytes]]
    value: bytes | None


def snapshot_value(topic: str, partition: int, open_: bool) -> bytes:
    txns = [{"producer_id": 1, "producer_epoch": 0, "start_offset": 0}] if open_ else []
    return json.dumps({"topic": topic, "partition": partition, "open_transactions": txns}).encode()


class FakeConsumer:
    """Serves scripted records for one topic partition by partition."""

    def __init__(self, records: dict[int, list[Rec]] | None, *, stuck: bool = False) -> None:
        self.records = records
        self.stuck = stuck
        self.pos: dict[KafkaTP, int] = {}

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        return None if self.records is None else set(self.records)

    def assign(self, tps: list[KafkaTP]) -> None:
        self.tps = tps

    def seek_to_beginning(self, *tps: KafkaTP) -> None:
        self.pos = dict.fromkeys(tps, 0)

    def end_offsets(self, tps: list[KafkaTP]) -> dict[KafkaTP, int]:
        assert self.records is not None
        return {tp: len(self.records[tp.partition]) + (5 if self.stuck else 0) for tp in tps}

    def poll(self, timeout_ms: int) -> dict[KafkaTP, list[Rec]]:
        assert self.records is not None
        out = {}
        for tp in self.tps:
            recs = self.records[tp.partition][self.pos[tp] :]
            if recs:
                out[tp] = recs
                self.pos[tp] += len(recs)
        return out

    def position(self, tp: KafkaTP) -> int:
        return self.pos[tp]


SNAP = [("txnwatch.type", b"partition-snapshot")]
SUMMARY = [("txnwatch.type", b"broker-sweep-summary")]
POSITION = [("txnwatch.type", b"coordinator-log-position")]


def test_restore_keeps_partitions_whose_latest_snapshot_is_open() -> None:
    consumer = FakeConsumer(
        {
            0: [
                Rec(0, 0, SNAP, snapshot_value("orders", 0, True)),
                Rec(0, 1, SNAP, snapshot_value("orders", 1, True)),
                Rec(0, 2, SNAP, snapshot_value("orders", 1, False)),
                Rec(0, 3, SUMMARY, b'{"broker": 1}'),
                Rec(0, 4, POSITION, b'{"topic": "__transaction_state", "partition": 3}'),
            ],
            1: [
                Rec(1, 0, [], snapshot_value("__consumer_offsets", 7, True)),  # no header: a snapshot too
                Rec(1, 1, SNAP, b"not json"),
                Rec(1, 2, SNAP, None),
            ],
        }
    )
    assert restore_open_partitions(consumer, TOPIC, timeout_s=5) == {  # type: ignore[arg-type]
        ("orders", 0),
        ("__consumer_offsets", 7),
    }


def test_restore_of_a_missing_topic_is_empty_and_of_an_unfinished_read_unknown() -> None:
    assert restore_open_partitions(FakeConsumer(None), TOPIC, timeout_s=1) == set()  # type: ignore[arg-type]
    stuck = FakeConsumer({0: [Rec(0, 0, SNAP, snapshot_value("orders", 0, True))]}, stuck=True)
    assert restore_open_partitions(stuck, TOPIC, timeout_s=0.2) is None  # type: ignore[arg-type]


def test_restore_failure_is_unknown_not_fatal(caplog: pytest.LogCaptureFixture) -> None:
    class Denied(FakeConsumer):
        def partitions_for_topic(self, topic: str) -> set[int] | None:
            raise Errors.TopicAuthorizationFailedError()

    assert restore_open_partitions(Denied({}), TOPIC, timeout_s=1) is None  # type: ignore[arg-type]
    assert "Read on topic txnwatch.producer-state" in caplog.text
