"""Version-aware behaviour of txnwatch's admin side on the real 4.3.1 test bed (issue 31, item 2).

- What a broker's ApiVersions tell (`admin.wire.versions`, read per broker by `KafkaWire.broker_apis`): 4.3.1 offers
  ListTransactions v1 (the DurationFilter, and Alter authorizing WriteTxnMarkers: both Kafka 3.8) and WriteTxnMarkers
  v2 (KIP-1228, 4.2); a broker that is not in the cluster has none.
- A describe-mode poll with a DurationFilter lists per broker, and the real broker answers the filtered listing:
  the poll is complete.
- On a real Kafka 3.7.2 broker: no ListTransactions v1 (a filtered listing fails UNSUPPORTED_VERSION in the client),
  and a poll with a DurationFilter lists it without the filter, complete.
- The abort's WriteTxnMarkers as Kafka's own `Admin.abortTransaction` sends it. Between every client and the
  broker runs a TCP proxy written here (the broker advertises the proxy's port, as in test_slow_answers.py) that
  keeps every WriteTxnMarkers request frame. Two identical real orphans are aborted, one by `txnwatch proposals
  abort --execute`, one by `kafka-transactions.sh abort`: both requests must be the same version (v2 on 4.3.1) with
  the same TransactionVersion (0: AbortTransactionHandler never sets it), and both aborts must land.
"""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaAdminClient, KafkaProducer
from kafka.protocol.producer.transaction import WriteTxnMarkersRequest
from kafka_frames import close, frames, send
from workloads import Proposals, lso, plan_by_hand, run_workload

from admin.collect.coordinator import ACTIVE_STATES, CoordinatorPoller
from admin.wire.kafka_wire import KafkaWire
from admin.wire.types import ListingResult
from admin.wire.versions import (
    ADMIN_MARKER_TRANSACTION_VERSION,
    WRITE_TXN_MARKERS,
    alter_authorizes_markers,
    max_version,
    takes_duration_filter,
)
from dev.kafka import Cluster, TestBedConfig, start_cluster, stop_cluster
from dev.oracle import transactions_command

pytestmark = pytest.mark.broker


# ------------------------------------------------------------------------------- the session broker (4.3.1)


def test_the_test_beds_api_versions_say_kafka_4_2_or_newer(wire: KafkaWire) -> None:
    (broker,) = wire.metadata().brokers
    apis = wire.broker_apis([broker, 99])
    assert takes_duration_filter(apis[broker]) and alter_authorizes_markers(apis[broker])
    assert max_version(apis[broker], WRITE_TXN_MARKERS) == 2
    assert apis[99] == {}  # not in the cluster: unknown, so no filter and ClusterAction named


class Listings(KafkaWire):
    """The real wire, keeping what each ListTransactions asked and what it got."""

    calls: list[tuple[dict[str, Any], ListingResult]]

    def list_transactions(self, **kwargs: Any) -> ListingResult:
        result = super().list_transactions(**kwargs)
        self.calls.append((kwargs, result))
        return result


def test_a_duration_filter_poll_lists_per_broker_on_a_real_broker(bootstrap: str, unique: str) -> None:
    run_workload(bootstrap, "--scenario", "hanging", "--topic-prefix", unique)  # a transactional id to list
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        wire = Listings(admin)
        wire.calls = []
        poller = CoordinatorPoller(wire, duration_filter_ms=1, clock_ms=lambda: int(time.time() * 1000))
        poll = poller.poll_as_of()
        (broker,) = wire.metadata().brokers
        filtered = [(kw, r) for kw, r in wire.calls if kw.get("duration_filter_ms") is not None]
        assert [kw["brokers"] for kw, _ in filtered] == [[broker]]
        assert filtered[0][1].failed == {} and filtered[0][1].answered == {broker}
        assert not [kw for kw, _ in wire.calls if kw.get("brokers") and kw.get("duration_filter_ms") is None]
        assert poll.incomplete is None, poll.incomplete
    finally:
        admin.close()


# ---------------------------------------------------------------------------------- a Kafka 3.7.2 broker


@pytest.fixture(scope="module")
def kafka_3_7(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A one-node Kafka 3.7.2 bed (KRaft; jars from Maven Central): no ListTransactions v1, WriteTxnMarkers v1."""
    state_dir: Path = tmp_path_factory.mktemp("kafka-3.7.2")
    cluster = start_cluster(TestBedConfig(nodes=1, kafka_version="3.7.2"), state_dir)
    try:
        yield cluster.bootstrap_servers
    finally:
        stop_cluster(state_dir)


@pytest.mark.compat  # another release's bed: `make compat`
def test_on_kafka_3_7_the_filter_fails_and_the_poll_lists_without_it(kafka_3_7: str, unique: str) -> None:
    """What the unit tests' fakes assume, on a real 3.7.2 broker: its ApiVersions offer no ListTransactions v1,
    a DurationFilter listing sent to it anyway fails UNSUPPORTED_VERSION (kafka-python finds no common version),
    and a poll with a DurationFilter lists it without the filter and is complete."""
    producer = KafkaProducer(bootstrap_servers=kafka_3_7, transactional_id=f"{unique}tx")
    try:
        producer.init_transactions()  # __transaction_state exists, one id to list
    finally:
        producer.close()
    admin = KafkaAdminClient(bootstrap_servers=kafka_3_7)
    try:
        wire = Listings(admin)
        wire.calls = []
        (broker,) = wire.metadata().brokers
        apis = wire.broker_apis([broker])[broker]
        assert not takes_duration_filter(apis) and not alter_authorizes_markers(apis)
        assert max_version(apis, WRITE_TXN_MARKERS) == 1
        forced = wire.list_transactions(states=ACTIVE_STATES, duration_filter_ms=5_000, brokers=[broker])
        assert forced.failed == {broker: "UNSUPPORTED_VERSION"} and not forced.answered
        wire.calls = []
        poll = CoordinatorPoller(
            wire, duration_filter_ms=5_000, clock_ms=lambda: int(time.time() * 1000)
        ).poll_as_of()
        asked = [(kw.get("brokers"), kw.get("duration_filter_ms")) for kw, _ in wire.calls]
        assert asked == [(None, None), ([broker], None)]
        assert poll.incomplete is None, poll.incomplete
    finally:
        admin.close()


# ------------------------------------------------------------------------------------------ the proxy


class RecordingProxy:
    """A TCP proxy on 127.0.0.1 that keeps every WriteTxnMarkers request passing through it (decoded with
    kafka-python at the version its header names). `upstream()` names the broker's address when a connection is
    accepted (its port is chosen when the test bed starts, after the proxy)."""

    def __init__(self, upstream: Callable[[], tuple[str, int]]) -> None:
        self._upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self.markers: list[tuple[int, Any]] = []  # (request version, decoded request with its header)
        self._lock = threading.Lock()
        self._closing = False
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._closing = True
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
            threading.Thread(target=self._requests, args=(client, server), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client), daemon=True).start()

    def _requests(self, src: socket.socket, dst: socket.socket) -> None:
        # Request header: api key (int16), api version (int16), correlation id (int32), client id, ...
        for frame in frames(src):
            api_key, version = struct.unpack(">hh", frame[4:8])
            if api_key == WRITE_TXN_MARKERS:
                decoded = WriteTxnMarkersRequest.decode(frame, version=version, header=True, framed=True)
                with self._lock:
                    self.markers.append((version, decoded))
            if not send(dst, frame):
                break
        close(src, dst)

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        for frame in frames(src):
            if not send(dst, frame):
                break
        close(src, dst)

    def markers_for(self, producer_id: int) -> list[tuple[int, Any]]:
        """The ABORT markers sent for `producer_id` (the coordinator's own are COMMITs of other transactions)."""
        with self._lock:
            return [
                (v, m)
                for v, request in self.markers
                for m in request.markers
                if m.producer_id == producer_id and not m.transaction_result
            ]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, RecordingProxy]]:
    """A one-node 4.3.1 bed (partition verification off, for the hanging scenario) reached through the proxy."""
    state_dir: Path = tmp_path_factory.mktemp("recorded-markers")

    def broker_address() -> tuple[str, int]:
        nodes = json.loads((state_dir / "state.json").read_text())["nodes"]
        return "127.0.0.1", int(nodes[0]["broker_port"])

    proxy = RecordingProxy(broker_address)
    config = TestBedConfig(
        nodes=1,
        partition_verification=False,
        extra={"advertised.listeners": f"PLAINTEXT://127.0.0.1:{proxy.port}"},
    )
    try:
        cluster = start_cluster(config, state_dir)
        try:
            yield cluster, proxy
        finally:
            stop_cluster(state_dir)
    finally:
        proxy.close()


def wait_for(found: Callable[[], list[Any]], what: str, timeout_s: float = 15) -> list[Any]:
    deadline = time.monotonic() + timeout_s
    while not (out := found()):
        assert time.monotonic() < deadline, f"no {what}"
        time.sleep(0.2)
    return out


def test_the_abort_sends_write_txn_markers_as_kafkas_admin_does(
    recorded: tuple[Cluster, RecordingProxy],
) -> None:
    cluster, proxy = recorded
    bootstrap = cluster.bootstrap_servers
    unique = f"t{uuid.uuid4().hex[:8]}-"
    orphans = {}
    for name in ("txnwatch", "kafka"):
        truth = run_workload(bootstrap, "--scenario", "hanging", "--topic-prefix", f"{unique}{name}-")
        (orphans[name],) = [t for t in truth["transactions"] if t["kind"] == "hanging"]
    ours, theirs = orphans["txnwatch"], orphans["kafka"]

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        wire = KafkaWire(admin)
        proposals = Proposals(bootstrap, f"{unique}tw")
        candidate = plan_by_hand(wire, ours["topic"], ours["partition"], ours["producer_id"])
        proposals.publish(candidate)
        done = proposals.run("abort", candidate.candidate_id, "--execute", "--actor", "versions")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["outcome"] == "ABORTED"
        transactions_command(
            bootstrap,
            "abort",
            "--topic",
            theirs["topic"],
            "--partition",
            str(theirs["partition"]),
            "--start-offset",
            str(theirs["start_offset"]),
        )
        for h in (ours, theirs):
            wait_for(
                lambda h=h: [1] if (lso(wire, h["topic"], h["partition"]) or 0) > h["start_offset"] else [],
                f"LSO past {h['topic']}-{h['partition']}@{h['start_offset']}",
            )
    finally:
        admin.close()

    sent: dict[str, dict[str, Any]] = {}
    for name, h in (("txnwatch", ours), ("kafka-transactions.sh", theirs)):
        ((version, marker),) = wait_for(lambda h=h: proxy.markers_for(h["producer_id"]), f"marker of {name}")
        ((topic,),) = [marker.topics]
        assert (topic.name, list(topic.partition_indexes)) == (h["topic"], [h["partition"]])
        assert marker.producer_epoch == h["producer_epoch"]
        sent[name] = {
            "version": version,
            "transaction_version": marker.transaction_version,
            "coordinator_epoch": marker.coordinator_epoch,
        }
    print(f"\nWriteTxnMarkers sent: {sent}")
    assert sent["txnwatch"] == sent["kafka-transactions.sh"]
    assert sent["txnwatch"] == {
        "version": 2,  # 4.3.1 offers v2 (KIP-1228): both clients negotiate it
        "transaction_version": ADMIN_MARKER_TRANSACTION_VERSION,
        "coordinator_epoch": 0,  # the leader reported -1: nobody wrote a marker on the partition before
    }
