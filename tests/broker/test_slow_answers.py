"""A slow DescribeProducers answer on a real broker (issue 30, item 3): the leader answers with a transaction open,
the answer is held back on its way to the collector, and the transaction commits meanwhile.

Between the collector and the broker runs a TCP proxy written here, on loopback: the test bed's only broker
advertises the proxy's port, so every client (the collector, the test's producer and consumer, the broker's own
marker and verification requests) goes through it. The proxy reads the Kafka frames (size, then api key and
correlation id of each request; correlation id of each response) and, once armed, holds the first DescribeProducers
response it sees for 8 s, longer than the grace (4 s) plus the clock skew (2 s). The collector then reports a state
the leader had before the commit: the question is what time it stamps on it.

The rules run on the collector's real snapshot and the coordinator's real CompleteCommit record, read from
`__transaction_state` to its end after the sweep (so the view is current as of a moment after the answer arrived).
Stamped at receipt (before the fix), the snapshot looked taken 8 s after a completion that in truth followed the
leader's answer: HANGING coordinator-completed, an abort candidate for a committed transaction.
"""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import NewTopic
from kafka_frames import close, frames, send
from workloads import transaction_log_records

from admin.collect.collector import Collector
from admin.wire.kafka_wire import KafkaWire
from admin.wire.types import SweepResult, wall_clock_ms
from common.settings import CollectorSettings
from detectors.models import CoordinatorRecord, CoordinatorState, DetectionLimits, VerdictKind
from detectors.rules import classify
from dev.kafka import Cluster, TestBedConfig, start_cluster, stop_cluster

pytestmark = pytest.mark.broker

DESCRIBE_PRODUCERS = 61  # api key
HOLD_MS = 8_000
LIMITS = DetectionLimits()
SETTINGS = CollectorSettings(retry_backoff_ms=100, request_timeout_ms=30_000)


# ------------------------------------------------------------------------------------------ the proxy


class DelayingProxy:
    """A TCP proxy on 127.0.0.1 that can hold back one DescribeProducers response.

    `upstream()` names the broker's address when a connection is accepted (the broker's port is chosen when the
    test bed starts, after the proxy). `arm()`; the next DescribeProducers response from the broker is then held:
    `held` is set, `held_at_ms` is the wall clock when it reached the proxy (the leader had answered by then), and
    it goes on to its client at `release()`.
    """

    def __init__(self, upstream: Callable[[], tuple[str, int]]) -> None:
        self._upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._armed = threading.Event()
        self.held = threading.Event()
        self._released = threading.Event()
        self.held_at_ms: int | None = None
        self._closing = False
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self) -> None:
        self.held.clear()
        self._released.clear()
        self._armed.set()

    def release(self) -> None:
        self._released.set()

    def close(self) -> None:
        self._closing = True
        self._released.set()
        for s in [self._listener, *self._sockets]:
            with contextlib.suppress(OSError):
                s.close()

    def _accept(self) -> None:
        while not self._closing:
            try:
                client, _ = self._listener.accept()
                server = socket.create_connection(self._upstream())
            except OSError:
                continue
            self._sockets += [client, server]
            asked: set[int] = set()  # correlation ids of this connection's DescribeProducers requests
            threading.Thread(target=self._requests, args=(client, server, asked), daemon=True).start()
            threading.Thread(target=self._responses, args=(server, client, asked), daemon=True).start()

    def _requests(self, src: socket.socket, dst: socket.socket, asked: set[int]) -> None:
        # Request header: api key (int16), api version (int16), correlation id (int32).
        for frame in frames(src):
            api_key, _, correlation = struct.unpack(">hhi", frame[4:12])
            if api_key == DESCRIBE_PRODUCERS:
                asked.add(correlation)
            if not send(dst, frame):
                break
        close(src, dst)

    def _responses(self, src: socket.socket, dst: socket.socket, asked: set[int]) -> None:
        # Response header: correlation id (int32). Responses on a connection stay in order: holding one holds
        # those behind it, as a full request queue would.
        for frame in frames(src):
            (correlation,) = struct.unpack(">i", frame[4:8])
            if correlation in asked and self._armed.is_set():
                self._armed.clear()
                self.held_at_ms = wall_clock_ms()
                self.held.set()
                self._released.wait()
            if not send(dst, frame):
                break
        close(src, dst)


# ------------------------------------------------------------------------------------------ the bed


@pytest.fixture(scope="module")
def proxied(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, DelayingProxy]]:
    """A one-node test bed whose broker advertises the proxy's port: every client reaches it through the proxy."""
    state_dir: Path = tmp_path_factory.mktemp("slow-answers")

    def broker_address() -> tuple[str, int]:
        # start_cluster writes the ports it chose before it waits for the broker (which needs the proxy).
        nodes = json.loads((state_dir / "state.json").read_text())["nodes"]
        return "127.0.0.1", int(nodes[0]["broker_port"])

    proxy = DelayingProxy(broker_address)
    config = TestBedConfig(nodes=1, extra={"advertised.listeners": f"PLAINTEXT://127.0.0.1:{proxy.port}"})
    try:
        cluster = start_cluster(config, state_dir)
        try:
            yield cluster, proxy
        finally:
            stop_cluster(state_dir)
    finally:
        proxy.close()


def last_record(bootstrap: str, transactional_id: str) -> CoordinatorRecord | None:
    """The id's last record in `__transaction_state`, read to the end offsets asked now."""
    records = transaction_log_records(bootstrap, transactional_id)
    return records[-1] if records else None


def snapshot_of(result: SweepResult, topic: str) -> Any:
    (snap,) = [s for s in result.snapshots if s.topic == topic]
    return snap


# ------------------------------------------------------------------------------------------ the test


def test_a_transaction_committed_while_the_leaders_answer_was_delayed_is_not_hanging(
    proxied: tuple[Cluster, DelayingProxy], unique: str
) -> None:
    """A real transaction is open; the collector sweeps (the job's first sighting). Next sweep, the leader answers
    with it open, the answer is held 8 s, and the transaction commits right after the leader answered: its
    CompleteCommit is in `__transaction_state` well before the answer reaches the collector.

    The snapshot must not claim a moment after the leader answered (`observed_at_ms` is when the request was
    sent), and the rules, run on it with the real CompleteCommit and a view read to the end after the sweep, must
    not call the committed transaction HANGING. Before the fix: stamped at receipt, `coordinator-completed`."""
    cluster, proxy = proxied
    bootstrap = cluster.bootstrap_servers
    topic, tid = f"{unique}orders", f"{unique}tx"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(topic, 1, 1)])
    producer = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=tid, acks="all")
    wire = KafkaWire(admin, request_timeout_ms=SETTINGS.request_timeout_ms)
    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send(topic, b"x").get(timeout=30)
        collector = Collector(wire, cluster="test", settings=SETTINGS, open_partitions=set())
        first = snapshot_of(collector.sweep(), topic)
        (seen,) = first.open_transactions

        proxy.arm()
        swept: list[SweepResult] = []
        sweep = threading.Thread(target=lambda: swept.append(collector.sweep()), daemon=True)
        sweep.start()
        assert proxy.held.wait(30), "no DescribeProducers answer came through the proxy"
        answered_by_ms = proxy.held_at_ms
        assert answered_by_ms is not None
        producer.commit_transaction()  # right after the leader answered; the answer is still on its way
        deadline = time.monotonic() + 30
        while (
            record := last_record(bootstrap, tid)
        ) is None or record.state is not CoordinatorState.COMPLETE_COMMIT:
            assert time.monotonic() < deadline, f"no CompleteCommit for {tid}: {record}"
            time.sleep(0.2)
        completed = record.last_update_timestamp_ms
        # Held at least 8 s, and until a snapshot stamped at receipt would postdate the completion by more than
        # the grace and skew (with 2 s to spare): then only the stamp decides.
        hold_until_ms = max(
            answered_by_ms + HOLD_MS, completed + LIMITS.grace_ms + LIMITS.clock_skew_ms + 2_000
        )
        time.sleep(max(0.0, (hold_until_ms - wall_clock_ms()) / 1000))
        proxy.release()
        sweep.join(60)
        (result,) = swept
        snap = snapshot_of(result, topic)
        (txn,) = snap.open_transactions  # the leader's answer is from before the commit
        assert (txn.producer_id, txn.start_offset) == (seen.producer_id, seen.start_offset)
        assert completed >= answered_by_ms - LIMITS.clock_skew_ms  # the completion followed the answer

        # The view, read to the end after the sweep, is current as of a moment after the answer arrived.
        view_current_ms = wall_clock_ms()
        view = last_record(bootstrap, tid)
        assert view is not None and view.state is CoordinatorState.COMPLETE_COMMIT
        now = wall_clock_ms()
        verdict = classify(
            txn,
            snap,
            view,
            now_ms=now,
            limits=LIMITS,
            view_current_ms=view_current_ms,
            first_seen_ms=first.observed_at_ms,
        )

        assert verdict.kind is not VerdictKind.HANGING, f"{verdict.reason}: {verdict.explanation}"
        assert verdict.kind is VerdictKind.OPEN
        assert snap.observed_at_ms <= answered_by_ms, (
            f"snapshot stamped {snap.observed_at_ms - answered_by_ms} ms after the leader answered"
        )
    finally:
        proxy.release()
        with contextlib.suppress(Exception):
            producer.close(timeout=5)
        admin.close()
