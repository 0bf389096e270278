"""Our own topics' records through kafka-python: the acknowledged sink the collector publishes with, one
acknowledged record (the audit log), and group-less reads (to the end offsets measured first, or following).

Every kafka-python error leaves as `WireError` (admin/wire/errors.py); the callers say what it means for them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Generator, Iterator, Sequence
from typing import Literal

import kafka.errors as Errors
from kafka.structs import TopicPartition as KafkaTopicPartition

from admin.wire.connect import Consumer, Producer
from admin.wire.errors import AdminError, error_name, explain, kafka_errors_translated, translating
from admin.wire.types import ConsumedRecord, OutRecord


class KafkaSink:
    """An idempotent (acks=all) KafkaProducer; `send_all` flushes and checks every record's result.

    `timeout_s` bounds a whole `send_all`: the flush and every record's result share one deadline (the collector
    passes its request timeout). A publish that waited a minute for a cluster that went away kept the sweep, the
    probes and /healthz waiting with it, and when the cluster came back within that minute the outage was never
    said. What is still buffered when the deadline passes is delivered later by the producer, in order."""

    def __init__(self, producer: Producer, *, timeout_s: float = 60.0) -> None:
        self._producer = producer
        self._timeout_s = timeout_s

    @translating
    def send_all(self, records: Sequence[OutRecord]) -> None:
        deadline = time.monotonic() + self._timeout_s
        futures = [
            (r.topic, self._producer.send(r.topic, key=r.key, value=r.value, headers=r.headers))
            for r in records
        ]
        try:
            self._producer.flush(timeout=max(0.0, deadline - time.monotonic()))
        except Errors.KafkaTimeoutError as exc:
            raise AdminError(
                f"Produce: {len(futures)} records not acknowledged within {self._timeout_s:.0f}s ({exc})"
            ) from exc
        for topic, future in futures:
            try:
                future.get(timeout=max(0.0, deadline - time.monotonic()))
            except Errors.KafkaError as exc:
                raise AdminError(explain("Produce", error_name(exc), topic, str(exc))) from exc

    @translating
    def close(self) -> None:
        self._producer.close(timeout=10)


@translating
def send_one(producer: Producer, topic: str, key: bytes, value: bytes, *, timeout_s: float) -> None:
    """Send one record and wait for its acknowledgement."""
    producer.send(topic, key=key, value=value).get(timeout=timeout_s)


@translating
def topic_partitions(consumer: Consumer, topic: str) -> list[int]:
    """The partitions of `topic`, in order; empty when it does not exist."""
    return sorted(consumer.partitions_for_topic(topic) or ())


def reads_committed(consumer: Consumer) -> bool:
    """The consumer reads with isolation level read_committed (aborted records left out)."""
    return bool(consumer.config.get("isolation_level") == "read_committed")


class TopicRead:
    """Every record of `topic` from the beginning (or the last `last` of each partition) up to the end offsets
    read as it starts, for at most `timeout_s`; iterate once. Then `missing`: the topic does not exist;
    `complete`: every partition was read to those end offsets."""

    def __init__(self, consumer: Consumer, topic: str, *, timeout_s: float, last: int | None = None) -> None:
        self._consumer = consumer
        self.topic = topic
        self._timeout_s = timeout_s
        self._last = last
        self.missing = False
        self.complete = False

    def __iter__(self) -> Iterator[ConsumedRecord]:
        with kafka_errors_translated():
            yield from self._read()

    def _read(self) -> Iterator[ConsumedRecord]:
        consumer = self._consumer
        partitions = consumer.partitions_for_topic(self.topic)
        if not partitions:
            self.missing = self.complete = True
            return
        tps = [KafkaTopicPartition(self.topic, p) for p in sorted(partitions)]
        consumer.assign(tps)
        if self._last is None:
            consumer.seek_to_beginning(*tps)
            end = consumer.end_offsets(tps)
            remaining = {tp for tp in tps if end[tp] > 0}
        else:
            begin, end = consumer.beginning_offsets(tps), consumer.end_offsets(tps)
            for tp in tps:
                consumer.seek(tp, max(begin[tp], end[tp] - self._last))
            remaining = {tp for tp in tps if consumer.position(tp) < end[tp]}
        deadline = time.monotonic() + self._timeout_s
        while remaining and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                yield from records
            remaining = {tp for tp in remaining if consumer.position(tp) < end[tp]}
        self.complete = not remaining


def follow(
    consumer: Consumer,
    topic: str,
    partitions: Sequence[int],
    *,
    start: Literal["beginning", "end"] | int,
    poll_ms: int,
    stop: threading.Event | None = None,
) -> Generator[list[ConsumedRecord], None, None]:
    """The records of `partitions` of `topic` from `start` (an offset, or either end) on, one list per poll
    (possibly empty), until `stop` is set or the caller stops asking."""
    with kafka_errors_translated():
        tps = [KafkaTopicPartition(topic, p) for p in partitions]
        consumer.assign(tps)
        if start == "beginning":
            consumer.seek_to_beginning(*tps)
        elif start == "end":
            consumer.seek_to_end(*tps)
        else:
            for tp in tps:
                consumer.seek(tp, start)
        while stop is None or not stop.is_set():
            batch = consumer.poll(timeout_ms=poll_ms)
            yield [r for records in batch.values() for r in records]
