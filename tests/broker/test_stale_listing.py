"""A ListTransactions answer from a broker that did not lead the `__transaction_state` partition when it answered,
on a real three-node test bed (issue 39, item 6; KAFKA-21181, KAFKA-21481).

A broker lists the transactional ids of every `__transaction_state` partition in its coordinator cache, with no
check that it still leads them (`TransactionStateManager.listTransactionStates`), until it unloads a partition it
lost (`TransactionCoordinator.onResignation`, when it applies the metadata that made it a follower). So an answer
counts for a partition only if the broker that gave it led the partition at one leader epoch in the Metadata read
before the request and in the Metadata read after the answer (`detectors.listing`).

What is real here: the brokers, the open transaction of transactional id T, its producer, the leader moves of
T's `__transaction_state` partition (preferred-leader elections), every answer. What the test arranges is the
timing, at the wire seam (`BouncingWire`), because a race of milliseconds cannot be hit reliably: the one
ListTransactions the code sends to every broker is split in two. T's partition moves from its leader A to broker
B; A is asked while B leads it (A, the former leader, answers without T once it has unloaded the partition; the
test waits for that answer); the partition moves back to A; the other brokers are asked (B has unloaded it, C
never had it). Metadata read before the listing and after it names A both times, at different leader epochs: the
leader alone (what txnwatch checked before) looks unchanged, and nobody's answer showed T's partition.

- the describe fallback must not vouch for that poll: no coordinator-state position (`leader-moved`, the epochs
  named), and no tombstone for T;
- `proposals abort` on T's own open transaction (a live owner: Ongoing, the partition in it) must refuse,
  `coordinator-listing-incomplete`, instead of reading "no transactional id owns the producer id" and saying SAFE
  (which would abort a live transaction).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import NewTopic
from workloads import move_leader, partition_replicas, plan_by_hand

from admin.collect.coordinator import CoordinatorPoller
from admin.proposals.verified_marker import abort
from admin.wire.kafka_wire import KafkaWire
from admin.wire.types import ListingResult, wall_clock_ms
from detectors.contract import TRANSACTION_LOG_TOPIC
from detectors.currency import coordinator_partition
from detectors.models import AuditRecord, CoordinatorState
from dev.kafka import Cluster, TestBedConfig, start_cluster, stop_cluster

pytestmark = pytest.mark.broker

LOG_PARTITIONS = 3
BED = TestBedConfig(
    nodes=3,
    partition_verification=False,
    transaction_max_timeout_ms=600_000,  # T's transaction outlives the four leader moves
    extra={"transaction.state.log.num.partitions": str(LOG_PARTITIONS)},
)


@pytest.fixture(scope="module")
def bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    state_dir: Path = tmp_path_factory.mktemp("stale-listing")
    cluster = start_cluster(BED, state_dir)
    try:
        yield cluster
    finally:
        stop_cluster(state_dir)


def listed_on(wire: KafkaWire, broker: int, transactional_id: str) -> bool | None:
    """Whether `broker` lists the id now (None: its listing failed, e.g. COORDINATOR_LOAD_IN_PROGRESS)."""
    got = wire.list_transactions(brokers=[broker])
    if got.failed:
        return None
    return any(t.transactional_id == transactional_id for t in got.listings)


def wait_until(what: str, check: object, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


class BouncingWire(KafkaWire):
    """txnwatch's kafka-python wire, with the next ListTransactions (once `armed`) split around two real leader
    moves of T's `__transaction_state` partition: A, its leader, is asked while B leads the partition (once A
    answers without T: it unloaded it), then the partition goes back to A and the other brokers are asked (once B
    no longer lists T). Every answer is a real broker's."""

    def __init__(self, admin: KafkaAdminClient, tid: str, a: int, b: int) -> None:
        super().__init__(admin)
        self._admin_client, self._tid, self._a, self._b = admin, tid, a, b
        self._partition = coordinator_partition(tid, LOG_PARTITIONS)
        self.armed = False
        self.bounced: list[str] = []

    def list_transactions(
        self,
        *,
        producer_ids: Sequence[int] = (),
        states: Sequence[str] = (),
        duration_filter_ms: int | None = None,
        brokers: Sequence[int] | None = None,
    ) -> ListingResult:
        ask = {"producer_ids": producer_ids, "states": states, "duration_filter_ms": duration_filter_ms}
        if not self.armed:
            return super().list_transactions(brokers=brokers, **ask)  # type: ignore[arg-type]
        self.armed = False
        everyone = list(brokers) if brokers is not None else sorted(self.brokers_now())
        a, b, p = self._a, self._b, self._partition
        move_leader(self._admin_client, TRANSACTION_LOG_TOPIC, p, b)
        wait_until(f"broker {b} never served partition {p}", lambda: listed_on(self, b, self._tid) is True)
        wait_until(f"broker {a} kept partition {p} loaded", lambda: listed_on(self, a, self._tid) is False)
        former = super().list_transactions(brokers=[a], **ask)  # type: ignore[arg-type]
        move_leader(self._admin_client, TRANSACTION_LOG_TOPIC, p, a)
        wait_until(
            f"broker {a} never served partition {p} again", lambda: listed_on(self, a, self._tid) is True
        )
        wait_until(f"broker {b} kept partition {p} loaded", lambda: listed_on(self, b, self._tid) is False)
        rest = super().list_transactions(brokers=[x for x in everyone if x != a], **ask)  # type: ignore[arg-type]
        self.bounced.append(f"broker {a} answered while broker {b} led {TRANSACTION_LOG_TOPIC}-{p}")
        return ListingResult(
            former.listings + rest.listings, {**former.failed, **rest.failed}, former.answered | rest.answered
        )

    def brokers_now(self) -> set[int]:
        return {b.node_id for b in self._manager.cluster.brokers()}


class MemoryAuditLog:
    def __init__(self) -> None:
        self.records: list[AuditRecord] = []

    def history(self, candidate_id: str) -> list[AuditRecord]:
        return [r for r in self.records if r.candidate_id == candidate_id]

    def append(self, record: AuditRecord) -> None:
        self.records.append(record)


def test_an_answer_from_a_broker_that_left_and_retook_the_partition_proves_nothing(bed: Cluster) -> None:
    """T has an open (Ongoing) transaction; its `__transaction_state` partition leaves its leader A and comes
    back during one listing, A answering while B led it (see the module's docstring). The describe fallback
    publishes no position for that poll and no tombstone for T; `proposals abort` (a dry run) on T's open
    transaction refuses with `coordinator-listing-incomplete` naming the leader epochs, not SAFE."""
    bootstrap = bed.bootstrap_servers
    unique = f"s{uuid.uuid4().hex[:8]}-"
    tid, topic = f"{unique}tx", f"{unique}orders"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    producer = KafkaProducer(
        bootstrap_servers=bootstrap, transactional_id=tid, transaction_timeout_ms=600_000, acks="all"
    )
    try:
        admin.create_topics([NewTopic(topic, 1, -1)])
        producer.init_transactions()
        producer.begin_transaction()
        producer.send(topic, b"open", partition=0).get(timeout=30)
        producer.flush()
        p = coordinator_partition(tid, LOG_PARTITIONS)
        a, replicas = partition_replicas(admin, TRANSACTION_LOG_TOPIC, p)
        b = next(r for r in replicas if r != a)
        wire = BouncingWire(admin, tid, a, b)

        # The describe fallback: one ordinary poll lists T, the bounced one must not vouch.
        poller = CoordinatorPoller(wire, clock_ms=wall_clock_ms)
        first = poller.poll_as_of()
        assert first.incomplete is None, first.incomplete
        assert [r.state for r in first.records if r.transactional_id == tid] == [CoordinatorState.ONGOING]
        wire.armed = True
        bounced = poller.poll_as_of()
        print(f"\n{wire.bounced}: the describe fallback says {bounced.incomplete}")
        assert wire.bounced, "the listing was not split"
        assert bounced.incomplete is not None, "a position would vouch for a poll nobody's answer showed T in"
        assert bounced.incomplete.reason == "leader-moved"
        assert f"{TRANSACTION_LOG_TOPIC} partition {p}'s leader, broker {a}, went from leader epoch" in (
            bounced.incomplete.detail
        )
        assert not [r for r in bounced.records if r.tombstone and r.transactional_id == tid]

        # `proposals abort`, a dry run, on T's own open transaction.
        (owner,) = [t for t in wire.list_transactions().listings if t.transactional_id == tid]
        candidate = plan_by_hand(wire, topic, 0, owner.producer_id)
        wire.armed = True
        attempt = abort(wire, candidate, execute=False, actor="stale-listing", audit_log=MemoryAuditLog())
        record = attempt.audit
        print(f"{wire.bounced[-1]}: proposals abort says {record.outcome.value}: {record.message}")
        assert len(wire.bounced) == 2, "the abort's listing was not split"
        assert attempt.exit_code == 3, record.message
        assert record.outcome.value == "REFUSED" and record.marker_written is False
        assert "coordinator-listing-incomplete" in record.message
        assert "went from leader epoch" in record.message
    finally:
        producer.close(timeout=5)
        admin.close()
