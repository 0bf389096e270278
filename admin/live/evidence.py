"""Reading the cluster live: what a partition's leader and the coordinators say now, for `inspect partition`
(admin/inspect/report.py), `proposals show` (admin/proposals/show.py) and the verified abort and commit (admin/proposals/verified_marker.py).

Nothing here decides or prints: the leader's producers (`ask_leader`; with its leader epoch, `ask_leader_at`
and `offsets_at`), the transactional id that owns a producer id and its description (`ask_coordinators`,
`describe_by_id`), whether a listing can have left an owner out (`listing_incomplete`), and a candidate's
evidence read now (`observe`). The rules that weigh it are detectors/; how it is shown is the commands'
modules.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from admin.wire.errors import AdminError, WireError, error_name, explain
from admin.wire.types import (
    TP,
    ClusterWire,
    CoordinatorWire,
    Offsets,
    PartitionProducers,
    StartBatch,
    TransactionDescription,
    TransactionListing,
    record_from_description,
    wall_clock_ms,
)
from detectors.contract import TRANSACTION_LOG_TOPIC
from detectors.currency import coordinator_partition
from detectors.listing import ListingCheck, LogLeader, check_listing
from detectors.models import AbortCandidate, CoordinatorRecord, LeaderProducer, LiveCoordinator, LiveEvidence

# DescribeProducers answers that mean the leader moved: metadata is read again, up to this many times in all.
LEADER_ATTEMPTS = 3
_LEADER_MOVED = frozenset({"NOT_LEADER_OR_FOLLOWER", "LEADER_NOT_AVAILABLE"})


class LiveWire(ClusterWire, CoordinatorWire, Protocol):
    """Both seams: partition side and coordinator side."""


@dataclass(frozen=True)
class CoordinatorView:
    """What the coordinator says about one producer id (ListTransactions by producer id + DescribeTransactions)."""

    transactional_id: str | None
    state: str | None = None
    producer_epoch: int | None = None
    transaction_timeout_ms: int | None = None
    transaction_start_ms: int | None = None
    partition_listed: bool | None = None
    error: str | None = None


def log_leaders_or_none(wire: ClusterWire) -> dict[int, LogLeader] | None:
    # Read before the listing; None (a failure) is a reason `listing_incomplete` gives.
    try:
        return transaction_log_leaders(wire)
    except WireError:
        return None


def ask_leader(
    wire: ClusterWire, topic: str, partition: int, sleep: Callable[[float], None]
) -> tuple[int, int, PartitionProducers]:
    """(leader, arrival of its answer, the partition's producers), asking a moved leader's successor.

    Raises:
        AdminError: unknown partition, no leader, or DescribeProducers failed.
    """
    answer = ask_leader_at(wire, topic, partition, sleep)
    return answer.leader, answer.received_at_ms, answer.producers


class LeaderAnswer(NamedTuple):
    """The partition's leader, the leader epoch the metadata that routed the request gave it (None: Metadata
    without epochs), when its DescribeProducers answer arrived, and that answer."""

    leader: int
    leader_epoch: int | None
    received_at_ms: int
    producers: PartitionProducers


def ask_leader_at(
    wire: ClusterWire, topic: str, partition: int, sleep: Callable[[float], None]
) -> LeaderAnswer:
    """`ask_leader`, with the leader epoch of the metadata that routed the answer (unconfirmed: a caller confirms
    it with a leader-only request at that epoch, `offsets_at`).

    Raises:
        AdminError: unknown partition, no leader, or DescribeProducers failed.
    """
    tp = (topic, partition)
    attempt = 1
    while True:
        view = wire.metadata()
        if tp not in view.leaders:
            raise AdminError(f"{topic}-{partition} does not exist (or Describe on topic {topic} is missing)")
        leader = view.leaders[tp]
        if leader < 0:
            raise AdminError(f"{topic}-{partition} has no leader right now")
        batches = wire.describe_producers({leader: [[tp]]})
        if len(batches) != 1:
            raise AdminError(
                f"DescribeProducers for {topic}-{partition}: {len(batches)} answers to one request"
            )
        batch = batches[0]
        if batch.error is not None:
            raise AdminError(explain("DescribeProducers", batch.error, f"broker {leader}", batch.message))
        result = batch.results.get(tp, PartitionProducers("MISSING_FROM_RESPONSE"))
        if result.error not in _LEADER_MOVED or attempt >= LEADER_ATTEMPTS:
            break
        attempt += 1
        sleep(0.3)
    if result.error is not None:
        raise AdminError(explain("DescribeProducers", result.error, topic, result.message))
    return LeaderAnswer(leader, view.leader_epochs.get(tp), batch.received_at_ms, result)


def offsets_at(wire: ClusterWire, answer: LeaderAnswer, tp: TP) -> tuple[Offsets | None, int | None]:
    """The partition's LSO and high watermark (ListOffsets) from the leader that answered, at the leader epoch
    it was asked at, and that epoch once the leader's answer confirmed it (None: unknown, or the broker is not
    the leader at it: FENCED_LEADER_EPOCH, UNKNOWN_LEADER_EPOCH, NOT_LEADER_OR_FOLLOWER)."""
    epoch = answer.leader_epoch
    offsets = wire.list_offsets({answer.leader: [tp]}, {tp: epoch} if epoch is not None else None).get(tp)
    confirmed = epoch if offsets is not None and offsets.error is None else None
    return offsets, confirmed


@dataclass(frozen=True)
class CoordinatorAnswers:
    """What the coordinators said about some producer ids: the transactional id that currently owns each
    (ListTransactions by producer id), its description, and the brokers whose listing failed."""

    owners: dict[int, TransactionListing]
    described: dict[str, TransactionDescription]
    listing_failed: dict[int, str]
    listing_answered: frozenset[int] = frozenset()

    def records(self, *, seen_at_ms: int) -> tuple[dict[str, CoordinatorRecord], dict[str, str]]:
        """The usable descriptions as coordinator records (origin describe-transactions) by transactional id,
        and why each other described id is unusable.

        The API does not say when a coordinator last changed a transaction, so `last_update_timestamp_ms` is
        `seen_at_ms` (read after the answers arrived): no rule may date a change earlier than it was seen.
        """
        records: dict[str, CoordinatorRecord] = {}
        unusable: dict[str, str] = {}
        for tid, d in self.described.items():
            if d.error is not None:
                continue
            try:
                records[tid] = record_from_description(d, seen_at_ms=seen_at_ms)
            except ValueError as exc:  # pydantic's ValidationError included
                unusable[tid] = f"DescribeTransactions {tid}: unusable answer: {exc}"
        return records, unusable

    def view(
        self, producer_id: int, topic: str, partition: int, unusable: Mapping[str, str]
    ) -> CoordinatorView:
        """What is shown of the owner of `producer_id`, or why it is unknown (`error`)."""
        owner = self.owners.get(producer_id)
        if owner is None:
            failed = ", ".join(f"broker {b}: {e}" for b, e in sorted(self.listing_failed.items()))
            return CoordinatorView(None, error=f"ListTransactions failed on {failed}" if failed else None)
        d = self.described.get(owner.transactional_id)
        if d is None or d.error is not None:
            error = d.error if d is not None and d.error is not None else "NOT_DESCRIBED"
            return CoordinatorView(
                owner.transactional_id,
                state=owner.state,
                error=explain("DescribeTransactions", error, owner.transactional_id),
            )
        if d.transactional_id in unusable:
            return CoordinatorView(owner.transactional_id, state=d.state, error=unusable[d.transactional_id])
        return CoordinatorView(
            owner.transactional_id,
            state=d.state,
            producer_epoch=d.producer_epoch,
            transaction_timeout_ms=d.timeout_ms,
            transaction_start_ms=d.start_time_ms,
            partition_listed=(topic, partition) in d.partitions,
        )


def ask_coordinators(
    wire: CoordinatorWire, producer_ids: Sequence[int], before: Mapping[int, LogLeader] | None = None
) -> CoordinatorAnswers:
    """The transactional id that currently owns each producer id, and its DescribeTransactions answer (asked of
    the broker that listed it). With `before` (the `__transaction_state` leaders read before the listing), a row
    listed by the leader of its id's partition is preferred to one another broker listed (a broker that lost the
    partition answers from its old cache until it unloads it); whether it counts is `owner_uncounted`'s."""
    if not producer_ids:
        return CoordinatorAnswers({}, {}, {})
    wanted = set(producer_ids)
    listing = wire.list_transactions(producer_ids=producer_ids)

    def by_leader(t: TransactionListing) -> bool:
        if not before:
            return False
        return before.get(coordinator_partition(t.transactional_id, len(before)), LogLeader(-1)).broker == (
            t.coordinator
        )

    owners: dict[int, TransactionListing] = {}
    for t in sorted(listing.listings, key=by_leader):  # a leader's row last: it wins
        if t.producer_id in wanted:
            owners[t.producer_id] = t
    by_coordinator: dict[int, list[str]] = {}
    for t in owners.values():
        by_coordinator.setdefault(t.coordinator, []).append(t.transactional_id)
    described = {
        d.transactional_id: d for d in (wire.describe_transactions(by_coordinator) if by_coordinator else [])
    }
    return CoordinatorAnswers(owners, described, dict(listing.failed), listing.answered)


def describe_by_id(wire: LiveWire, transactional_ids: Sequence[str]) -> dict[str, TransactionDescription]:
    """DescribeTransactions for some ids, each sent to its coordinator: the leader of its `__transaction_state`
    partition (`Utils.abs(javaHash(id)) % partitions`, as Kafka places it).

    Raises:
        AdminError: `__transaction_state` is unknown to this principal, or a partition has no leader.
    """
    view = wire.metadata([TRANSACTION_LOG_TOPIC])
    leaders = {p: b for (t, p), b in view.leaders.items() if t == TRANSACTION_LOG_TOPIC}
    if not leaders:
        raise AdminError(
            f"{TRANSACTION_LOG_TOPIC} is not visible (Describe on topic {TRANSACTION_LOG_TOPIC}?)"
        )
    by_coordinator: dict[int, list[str]] = {}
    for tid in transactional_ids:
        leader = leaders.get(coordinator_partition(tid, len(leaders)), -1)
        if leader < 0:
            raise AdminError(f"the coordinator of transactional id {tid} has no leader right now")
        by_coordinator.setdefault(leader, []).append(tid)
    return {d.transactional_id: d for d in wire.describe_transactions(by_coordinator)}


LISTING_INCOMPLETE = "coordinator-listing-incomplete"


def transaction_log_leaders(wire: ClusterWire) -> dict[int, LogLeader]:
    """Each `__transaction_state` partition's leader (-1: none) and its leader epoch (None: Metadata did not
    say); empty when the topic is not visible.

    Raises:
        admin.wire.errors.WireError: no broker answered Metadata.
    """
    view = wire.metadata([TRANSACTION_LOG_TOPIC])
    return {
        p: LogLeader(b, view.leader_epochs.get((t, p)))
        for (t, p), b in view.leaders.items()
        if t == TRANSACTION_LOG_TOPIC
    }


def probe_ids(partitions: int) -> dict[int, str]:
    """One transactional id nobody uses per `__transaction_state` partition (partition -> id)."""
    run = uuid.uuid4().hex
    out: dict[int, str] = {}
    i = 0
    while len(out) < partitions:
        tid = f"txnwatch-describe-probe-{run}-{i}"
        out.setdefault(coordinator_partition(tid, partitions), tid)
        i += 1
    return out


def listing_check(
    wire: ClusterWire, before: Mapping[int, LogLeader] | None, answered: Collection[int]
) -> ListingCheck | str:
    """Which `__transaction_state` partitions a ListTransactions answer showed (`detectors.listing`): Metadata
    is read again here, after the answers; or why none can be shown (a reason starting with
    `coordinator-listing-incomplete: `)."""
    if before is None:
        return f"{LISTING_INCOMPLETE}: Metadata for {TRANSACTION_LOG_TOPIC} failed before the listing"
    if not before:
        return (
            f"{LISTING_INCOMPLETE}: {TRANSACTION_LOG_TOPIC} is not visible (Describe on topic "
            f"{TRANSACTION_LOG_TOPIC}?)"
        )
    try:
        after = transaction_log_leaders(wire)
    except WireError as exc:
        return f"{LISTING_INCOMPLETE}: Metadata for {TRANSACTION_LOG_TOPIC}: {exc}"
    return check_listing(before, after, answered)


def listing_incomplete(
    wire: LiveWire, before: Mapping[int, LogLeader] | None, answered: Collection[int]
) -> str | None:
    """Why a ListTransactions answer may have left owners out, or None when it cannot have.

    A coordinator lists the transactional ids of the `__transaction_state` partitions it has loaded, from its
    cache, whether it still leads them or not (`TransactionStateManager.listTransactionStates`; a broker that lost
    a partition keeps it until it unloads it); a partition without a leader is listed by nobody, silently. So
    "no owner listed" is evidence only when, for every `__transaction_state` partition:
    - it had the same leader, at the same leader epoch, before the listing (`before`) and after it (read here),
      and that leader answered the listing without an error (`answered`): a loading coordinator answers
      COORDINATOR_LOAD_IN_PROGRESS (`detectors.listing.check_listing`);
    - its leader serves it now: DescribeTransactions for an id nobody uses, on that leader, answers
      TRANSACTIONAL_ID_NOT_FOUND (NOT_COORDINATOR or COORDINATOR_LOAD_IN_PROGRESS: moving or loading). The same
      answer shows that the principal may Describe every id: ListTransactions silently leaves out the ids it
      may not (TRANSACTIONAL_ID_AUTHORIZATION_FAILED names the ACL to grant).

    Returns:
        None, or a reason starting with `coordinator-listing-incomplete: `.
    """
    check = listing_check(wire, before, answered)
    if isinstance(check, str):
        return check
    if check.gaps:
        return f"{LISTING_INCOMPLETE}: {check.gaps[0].detail}"
    probes = probe_ids(check.partitions)
    by_leader: dict[int, list[str]] = {}
    for p, tid in sorted(probes.items()):
        by_leader.setdefault(check.counted[p], []).append(tid)
    try:
        answers = {d.transactional_id: d for d in wire.describe_transactions(by_leader)}
    except WireError as exc:
        return f"{LISTING_INCOMPLETE}: DescribeTransactions: {exc}"
    for p, tid in sorted(probes.items()):
        d = answers.get(tid)
        error = "NOT_DESCRIBED" if d is None else d.error or "FOUND"
        if error == "TRANSACTIONAL_ID_NOT_FOUND":
            continue
        if error == "TRANSACTIONAL_ID_AUTHORIZATION_FAILED":
            return (
                f"{LISTING_INCOMPLETE}: ListTransactions lists only the ids this principal may Describe; grant "
                "the ACL Describe on TransactionalId '*' to txnwatch's principal"
            )
        return (
            f"{LISTING_INCOMPLETE}: broker {check.counted[p]} does not serve {TRANSACTION_LOG_TOPIC} partition "
            f"{p} ({explain('DescribeTransactions', error)}): moving or loading"
        )
    return None


def owner_uncounted(
    wire: ClusterWire,
    before: Mapping[int, LogLeader] | None,
    answered: Collection[int],
    owner: TransactionListing,
) -> str | None:
    """Why the listing (and description) of `owner` does not count, or None when it does: it must come from the
    leader of the id's `__transaction_state` partition, at one leader epoch before the listing and after the
    answers (`detectors.listing`). A broker that lost the partition lists and describes the id from its old
    cache until it unloads it.

    Returns:
        None, or a reason starting with `coordinator-listing-incomplete: `.
    """
    check = listing_check(wire, before, answered)
    if isinstance(check, str):
        return check
    tid = owner.transactional_id
    if check.counts(tid, owner.coordinator):
        return None
    p = check.partition_of(tid)
    gap = check.gap_of(p)
    why = (
        gap.detail
        if gap is not None and gap.kind != "not-answered"
        else f"broker {check.counted.get(p, gap.broker if gap else -1)} leads {TRANSACTION_LOG_TOPIC} partition {p}"
    )
    return (
        f"{LISTING_INCOMPLETE}: transactional id {tid} was listed by broker {owner.coordinator}, whose answer "
        f"does not count for {TRANSACTION_LOG_TOPIC} partition {p}: {why}"
    )


# -------------------------------------------------------------------------------- a candidate, now


def observe(
    wire: LiveWire,
    candidate: AbortCandidate,
    *,
    clock_ms: Callable[[], int] = wall_clock_ms,
    sleep: Callable[[float], None] = time.sleep,
) -> LiveEvidence:
    """The candidate's partition and coordinator, read now: the leader's row for the producer id, the other open
    transactions, LSO and high watermark, the leader epoch (the metadata's, confirmed by the leader's ListOffsets
    at it: `offsets_at`), and the transactional id that owns the producer id.

    Raises:
        AdminError: unknown partition, no leader, or the leader's DescribeProducers failed.
    """
    tp = (candidate.topic, candidate.partition)
    pid = candidate.spec.producer_id
    answer = ask_leader_at(wire, candidate.topic, candidate.partition, sleep)
    leader, observed, result = answer.leader, answer.received_at_ms, answer.producers
    mine = [p for p in result.producers if p.producer_id == pid]
    producer = (
        LeaderProducer(
            producer_id=mine[0].producer_id,
            producer_epoch=mine[0].producer_epoch,
            coordinator_epoch=max(-1, mine[0].coordinator_epoch),
            current_txn_start_offset=max(-1, mine[0].current_txn_start_offset),
            last_timestamp_ms=mine[0].last_timestamp_ms,
            last_sequence=max(-1, mine[0].last_sequence),
        )
        if mine
        else None
    )
    others = tuple(
        sorted(
            (p.producer_id, p.current_txn_start_offset)
            for p in result.producers
            if p.producer_id != pid and p.current_txn_start_offset >= 0
        )
    )
    offsets, leader_epoch = offsets_at(wire, answer, tp)
    start_epoch = (
        start_batch_leader_epoch(wire, leader, tp, candidate.start_offset, leader_epoch)
        if producer is not None and producer.current_txn_start_offset == candidate.start_offset
        else None
    )
    coordinator, coordinator_error = _ask_coordinator(wire, candidate)
    return LiveEvidence(
        observed_at_ms=observed,
        leader=leader,
        producer=producer,
        other_open=others,
        last_stable_offset=offsets.last_stable_offset if offsets else None,
        high_watermark=offsets.high_watermark if offsets else None,
        coordinator=coordinator,
        coordinator_error=coordinator_error,
        leader_epoch=leader_epoch,
        start_batch_leader_epoch=start_epoch,
    )


def start_batch_leader_epoch(
    wire: ClusterWire, leader: int, tp: tuple[str, int], start_offset: int, leader_epoch: int | None
) -> int | None:
    """The leader epoch the batch at `start_offset` was appended in, read now from the leader (fenced at
    `leader_epoch` when known); None when it cannot be read. A candidate planned before snapshots carried it
    (or whose start batch the collector could not read) is judged on this."""
    try:
        got = wire.fetch_start_batches(
            {leader: [(tp, start_offset)]}, {tp: leader_epoch} if leader_epoch is not None else None
        ).get((tp, start_offset))
    except WireError:
        return None
    return got.leader_epoch if isinstance(got, StartBatch) else None


def _ask_coordinator(wire: LiveWire, candidate: AbortCandidate) -> tuple[LiveCoordinator | None, str | None]:
    """The transactional id that owns the candidate's producer id now, or None when no id owns it; or why the
    coordinator side cannot be shown (the second element).

    An owner counts only as listed (and described) by the leader of its `__transaction_state` partition, at one
    leader epoch before the listing and after it (`owner_uncounted`). "No owner listed" is evidence only when the
    listing was complete: every `__transaction_state` partition has a leader, at one leader epoch across the
    listing, that served it loaded and answered, and the principal may Describe every id
    (`listing_incomplete`, whose `coordinator-listing-incomplete: ...` reason refuses the abort
    otherwise). The id the candidate's evidence names (the
    producer id's last known owner) is described too, so its current state is read even if it was not listed.
    """
    pid = candidate.spec.producer_id
    try:
        before = transaction_log_leaders(wire)  # `listing_check` compares them with those after
        answers = ask_coordinators(wire, [pid], before)
    except WireError as exc:
        return None, explain("ListTransactions", error_name(exc))
    owner = answers.owners.get(pid)
    if owner is None and answers.listing_failed:
        failed = "; ".join(
            explain("ListTransactions", e, f"broker {b}") for b, e in sorted(answers.listing_failed.items())
        )
        return None, failed
    if owner is not None:
        uncounted = owner_uncounted(wire, before, answers.listing_answered, owner)
        if uncounted is not None:
            return None, f"cannot show which transactional id owns producer {pid}: {uncounted}"
        d = answers.described.get(owner.transactional_id)
        if d is None or d.error is not None:
            error = d.error if d is not None and d.error is not None else "NOT_DESCRIBED"
            return None, explain("DescribeTransactions", error, owner.transactional_id)
        return _live_coordinator(candidate, d), None
    named = candidate.evidence.coordinator.transactional_id if candidate.evidence.coordinator else None
    problem = listing_incomplete(wire, before, answers.listing_answered)
    if problem is not None:
        return None, f"cannot show that no transactional id owns producer {pid}: {problem}"
    if named:
        try:
            described = describe_by_id(wire, [named])
        except (WireError, AdminError) as exc:
            return None, f"DescribeTransactions {named}: {exc}"
        d = described.get(named)
        if d is not None and d.error is None and d.producer_id == pid:
            # Listed by nobody, yet it names the producer id: the listing was incomplete after all.
            return _live_coordinator(candidate, d), None
        if d is not None and d.error not in (None, "TRANSACTIONAL_ID_NOT_FOUND"):
            return None, explain("DescribeTransactions", d.error or "", named)
    return None, None


def _live_coordinator(candidate: AbortCandidate, d: TransactionDescription) -> LiveCoordinator:
    return LiveCoordinator(
        transactional_id=d.transactional_id,
        state=d.state,
        producer_id=d.producer_id,
        producer_epoch=d.producer_epoch,
        partition_listed=(candidate.topic, candidate.partition) in d.partitions,
        coordinator=d.coordinator,
        transaction_start_ms=d.start_time_ms,
        transaction_timeout_ms=d.timeout_ms,
    )
