"""Coordinator fallback: ListTransactions + DescribeTransactions → `CoordinatorRecord`s, for clusters where
`__transaction_state` cannot be read (no Read ACL on it).

Each poll lists every transactional id on every broker (the broker that lists an id coordinates it), describes
the ids that are new or changed state, plus every active transaction (only those running longer than the
DurationFilter, asked per broker: `_long_running`), plus every id whose producer id the sweeps since the last poll
saw with an open transaction (`saw_open`), and returns the records whose content changed. An id that
disappears from the listing gets a tombstone record only once its current coordinator shows it expired (the
leader of its `__transaction_state` partition listed, and answers TRANSACTIONAL_ID_NOT_FOUND for it): a
partition that moves, loads or has no leader is listed by nobody, which proves nothing. Once a poll's records are
acknowledged, `log_position` measures how far `<prefix>.coordinator-state` has reached, as of the moment before
the poll's ListTransactions: the `CoordinatorLogPosition` the streaming job needs to know its view is current.

That position vouches for every transactional id, so it is measured only for a poll that refreshed every id
whose state may have changed (`CoordinatorPoll.incomplete` is None): every `__transaction_state` partition kept
one leader, at one leader epoch, across the poll (a broker that lost a partition answers from its old cache until
it unloads it: `detectors.listing`), that leader served it loaded before the listing and answered the listing (and the
DurationFilter listing) without an error, and every DescribeTransactions the poll needed answered. A broker
answers ListTransactions with COORDINATOR_LOAD_IN_PROGRESS for all its partitions while any of them loads, and a
partition without a leader is listed by nobody, with no error (`TransactionStateManager.listTransactionStates`).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Literal, NamedTuple, Protocol, get_args

from pydantic import ValidationError

from admin.collect.position import measure_log_position
from admin.wire.errors import WireError, explain
from admin.wire.types import (
    ClusterView,
    ClusterWire,
    CoordinatorWire,
    ListingResult,
    SweepResult,
    TransactionDescription,
    TransactionListing,
    record_from_description,
)
from admin.wire.versions import takes_duration_filter
from detectors.contract import OWNING_STATES, TRANSACTION_LOG_TOPIC
from detectors.currency import coordinator_partition
from detectors.listing import METADATA_GAPS, ListingCheck, LogLeader, check_listing
from detectors.models import CoordinatorLogPosition, CoordinatorRecord

log = logging.getLogger(__name__)

# ListTransactions' state filter for transactions still running (the coordinator owns their partitions).
ACTIVE_STATES = tuple(sorted(state.value for state in OWNING_STATES))
# Per-id errors after which the id should be asked again next poll (coordinator moving or loading).
_TRANSIENT = frozenset({"NOT_COORDINATOR", "COORDINATOR_LOAD_IN_PROGRESS", "COORDINATOR_NOT_AVAILABLE"})


# Why a poll's position is withheld: the label of txnwatch_collector_coordinator_positions_withheld_total (a fixed
# set; the detail, with partitions and brokers, goes to the log).
IncompleteReason = Literal[
    "metadata-failed",  # Metadata for __transaction_state failed
    "transaction-log-not-visible",  # no __transaction_state in Metadata: no ACL Describe on it, or never created
    "partition-without-leader",  # listed by nobody, and nobody says so
    "leader-moved",  # the leader after the listing is not the one before it
    "leader-not-serving",  # the leader does not serve its partition loaded (moving, loading, unreachable)
    "transactional-ids-hidden",  # ListTransactions leaves out the ids the principal may not Describe
    "listing-failed",  # a broker's ListTransactions failed, or a leader was not asked
    "duration-listing-failed",  # the same for the DurationFilter listing of long-running transactions
    "describe-failed",  # a transactional id the poll had to describe was not described
]
INCOMPLETE_REASONS: tuple[IncompleteReason, ...] = get_args(IncompleteReason)


class Incomplete(NamedTuple):
    """Why a poll may have left a transactional id's changed state unseen: no position may vouch for it."""

    reason: IncompleteReason
    detail: str


class CoordinatorPoll(NamedTuple):
    """One poll: the records whose content changed, the clock read before its first request, and why no
    position may vouch for it (None: every id whose state may have changed was listed and described)."""

    poll_id: str
    as_of_ms: int
    records: list[CoordinatorRecord]
    incomplete: Incomplete | None = None


def tombstone(transactional_id: str, *, seen_at_ms: int) -> CoordinatorRecord:
    """The record for an expired transactional id (its coordinator no longer lists it)."""
    return CoordinatorRecord.tombstone_of(transactional_id).model_copy(
        update={"origin": "describe-transactions", "last_update_timestamp_ms": seen_at_ms}
    )


def open_producer_ids(sweep: SweepResult) -> set[int]:
    """The producer ids the sweep saw with an open transaction, on any partition."""
    return {t.producer_id for s in sweep.snapshots for t in s.open_transactions}


def active_on(current: Mapping[str, TransactionListing], brokers: set[int]) -> set[str]:
    """The transactional ids listed active (Ongoing, Prepare*) by one of `brokers`, their coordinators."""
    return {tid for tid, t in current.items() if t.state in ACTIVE_STATES and t.coordinator in brokers}


def _content(record: CoordinatorRecord) -> CoordinatorRecord:
    return record.model_copy(update={"last_update_timestamp_ms": 0})


class FallbackWire(CoordinatorWire, Protocol):
    """The coordinator seam plus Metadata (to find each transactional id's current coordinator)."""

    def metadata(self, topics: Sequence[str] | None = None) -> ClusterView: ...


# ------------------------------------------------------------------------- when a poll's listing is complete


def moved_or_leaderless(check: ListingCheck) -> Incomplete | None:
    """A `__transaction_state` partition without a leader (nobody lists its ids, nobody reports an error), or
    whose leader, or its leader epoch, differs between the Metadata read before the listing and the one after
    the poll's answers (the old leader may have answered from its old cache or without it, the new one before it
    took it over; `detectors.listing`)."""
    gap = check.first(METADATA_GAPS)
    if gap is None:
        return None
    return Incomplete("partition-without-leader" if gap.kind == "no-leader" else "leader-moved", gap.detail)


def unserved_partition(
    leaders: Mapping[int, int], probes: Mapping[int, str], answers: Mapping[str, TransactionDescription]
) -> Incomplete | None:
    """A leader that did not answer TRANSACTIONAL_ID_NOT_FOUND for an id nobody uses of its partition.

    That answer shows the leader serves the partition loaded (else NOT_COORDINATOR: Metadata names it before
    it takes over; COORDINATOR_LOAD_IN_PROGRESS: loading), and that the principal may Describe every id:
    ListTransactions silently leaves out the ids it may not."""
    for p, tid in sorted(probes.items()):
        answer = answers.get(tid)
        error = "NOT_DESCRIBED" if answer is None else answer.error or "FOUND"
        if error == "TRANSACTIONAL_ID_NOT_FOUND":
            continue
        if error == "TRANSACTIONAL_ID_AUTHORIZATION_FAILED":
            return Incomplete(
                "transactional-ids-hidden",
                "ListTransactions lists only the ids this principal may Describe; grant the ACL Describe on "
                "TransactionalId '*' to txnwatch's principal",
            )
        return Incomplete(
            "leader-not-serving",
            f"broker {leaders[p]} does not serve {TRANSACTION_LOG_TOPIC} partition {p} "
            f"({explain('DescribeTransactions', error)})",
        )
    return None


def unanswered_listing(
    check: ListingCheck, listing: ListingResult, reason: IncompleteReason, what: str
) -> Incomplete | None:
    """A `__transaction_state` leader that did not answer `listing` without an error (`check`, made from that
    listing's answers: a loading broker answers COORDINATOR_LOAD_IN_PROGRESS for all its partitions), or any
    broker whose listing failed."""
    gap = check.first(["not-answered"])
    if gap is not None:
        why = listing.failed.get(gap.broker, "not asked")
        return Incomplete(
            reason,
            f"broker {gap.broker}, leader of {TRANSACTION_LOG_TOPIC} partition {gap.partition}, did not answer "
            f"{what} ({why})",
        )
    if listing.failed:
        # A broker that leads nothing here lists nothing, but Metadata may be behind the broker's own view.
        broker, error = min(listing.failed.items())
        return Incomplete(reason, f"{what} failed on broker {broker} ({error})")
    return None


def undescribed(errors: set[str]) -> Incomplete | None:
    """Ids the poll had to describe (new or changed, active, or not refreshed before) that it could not."""
    if not errors:
        return None
    return Incomplete(
        "describe-failed",
        f"DescribeTransactions left transactional ids undescribed ({', '.join(sorted(errors))})",
    )


def first_gap(*gaps: Incomplete | None) -> Incomplete | None:
    """The first reason given, in the order of the checks (one label per withheld position)."""
    return next((g for g in gaps if g is not None), None)


# ------------------------------------------------------------------------------------------------ the poller


class CoordinatorPoller:
    """Keeps the last published record per transactional id; `poll()` returns what changed.

    Args:
        wire: the coordinator seam.
        duration_filter_ms: re-describe active transactions running longer than this (0: all active ones).
        clock_ms: wall clock; the time a record's content was first seen.
    """

    def __init__(
        self,
        wire: FallbackWire,
        *,
        duration_filter_ms: int = 0,
        clock_ms: Callable[[], int],
    ) -> None:
        self._wire = wire
        self._duration_filter_ms = duration_filter_ms
        self._clock_ms = clock_ms
        self._listed: dict[str, TransactionListing] = {}
        self._records: dict[str, CoordinatorRecord] = {}
        # Ids whose record may be stale: their describe failed, or they were gone from a listing without being
        # shown expired. Their listing may look unchanged when they are listed again (a whole transaction can
        # run and complete meanwhile), so they are described whenever listed, until a describe answers.
        self._unrefreshed: set[str] = set()
        # Producer ids the sweeps since the last poll saw with an open transaction (`saw_open`).
        self._seen_open: set[int] = set()
        self._noted: set[str] = set()
        # Ids gone from the listing whose expiry could not be shown (`_expired`), counted per poll that met them.
        self.withheld_expiries = 0
        self._run_id = uuid.uuid4().hex[:8]
        self._seq = 0
        self._probes: dict[int, str] = {}
        # (poll id, what was known before it): undone if the poll's records could not be published.
        self._before: (
            tuple[str, dict[str, TransactionListing], dict[str, CoordinatorRecord], set[str], set[int]] | None
        ) = None

    def _note(self, message: str) -> None:
        if message not in self._noted:
            self._noted.add(message)
            log.warning("%s", message)

    def saw_open(self, producer_ids: Iterable[int]) -> None:
        """The producer ids a sweep saw with an open transaction (`open_producer_ids`; call after each sweep):
        the next poll describes every listed id they belong to, even if its listing looks unchanged.

        A listing shows producer id and state only, and both can be the same at two polls between which a whole
        transaction ran (CompleteCommit both times). Had a sweep reported it open, the id's record would keep the
        earlier transaction's content and stamp under the next position, and the job could prove HANGING
        `coordinator-completed` from that earlier completion. Described, its content differs (its start time;
        under TV2 its epoch too), so it is published again, stamped after the listing, itself after every report
        of the sweep. The same content (a completed id whose producer id has an orphan open) keeps its record and
        stamp. Cost: at most one described id per producer id with an open transaction, per poll."""
        self._seen_open.update(producer_ids)

    def poll(self) -> list[CoordinatorRecord]:
        """List, describe what may have changed, and return the changed records (tombstones included)."""
        return self.poll_as_of().records

    def poll_as_of(self) -> CoordinatorPoll:
        """`poll()`, with the poll's id and `as_of_ms`: the clock read before its first request. Every record
        it returns (and every unchanged one published before) reflects coordinator state seen at or after
        `as_of_ms`, unless `incomplete` says why some id may not have been refreshed."""
        self._seq += 1
        poll_id = f"{self._run_id}-poll-{self._seq}"
        as_of_ms = self._clock_ms()
        self._before = (
            poll_id,
            dict(self._listed),
            dict(self._records),
            set(self._unrefreshed),
            set(self._seen_open),
        )
        try:
            records, incomplete = self._poll()
        except BaseException:
            # Nothing of it was published: a record it described but never returned would otherwise count as
            # published, and the next poll, describing the same content, would not send it.
            self._undo(poll_id)
            raise
        self._seen_open = set()
        if incomplete is not None:
            self._note(
                f"no coordinator-state position for this poll ({incomplete.reason}): {incomplete.detail}; the "
                "streaming job proves no HANGING on it"
            )
        return CoordinatorPoll(poll_id, as_of_ms, records, incomplete)

    def unpublished(self, poll: CoordinatorPoll) -> None:
        """The poll's records did not reach Kafka: forget what it learnt, so the next poll derives and sends
        them again (else a later position would vouch for records the topic never got). Only the latest poll
        can be undone."""
        self._undo(poll.poll_id)

    def _undo(self, poll_id: str) -> None:
        if self._before is not None and self._before[0] == poll_id:
            _, self._listed, self._records, self._unrefreshed, self._seen_open = self._before
            self._before = None

    def log_position(
        self, wire: ClusterWire, topic: str, poll: CoordinatorPoll, *, cluster: str
    ) -> CoordinatorLogPosition | None:
        """How far `topic` (<prefix>.coordinator-state) has reached, as of `poll.as_of_ms`.

        Call only once the poll's records are acknowledged, and only for a complete poll (`poll.incomplete` is
        None): then every record derived from coordinator state seen at or after `as_of_ms` lies below the end
        offsets measured here, and a job that has applied everything below them holds the coordinators' state
        as of `as_of_ms`. None if the topic does not exist or none of its partitions answered (the reason is
        logged once).
        """
        view = wire.metadata([topic])
        # With a DurationFilter, an Ongoing transaction younger than the filter is not described again when it
        # adds a partition (its listing does not change): its record may lack partitions added in the last
        # `duration_filter_ms`. Vouching only for the state as of that much earlier keeps such a record from
        # proving "the partition is not in the transaction" (every HANGING rule compares the report with the
        # record's start, which then lies after the moment vouched for).
        as_of_ms = poll.as_of_ms - max(self._duration_filter_ms, 0)
        position, problems = measure_log_position(
            wire, view, topic, cluster=cluster, sweep_id=poll.poll_id, as_of_ms=as_of_ms
        )
        for message in problems:
            self._note(message)
        return position

    def _log_leaders(self) -> dict[int, LogLeader] | Incomplete:
        """Each `__transaction_state` partition's leader (-1: none) and leader epoch, or why they are unknown."""
        try:
            view = self._wire.metadata([TRANSACTION_LOG_TOPIC])
        except WireError as exc:
            return Incomplete("metadata-failed", f"Metadata for {TRANSACTION_LOG_TOPIC} failed ({exc})")
        leaders = {
            p: LogLeader(b, view.leader_epochs.get((t, p)))
            for (t, p), b in view.leaders.items()
            if t == TRANSACTION_LOG_TOPIC
        }
        if not leaders:
            return Incomplete(
                "transaction-log-not-visible",
                f"{TRANSACTION_LOG_TOPIC} is not visible: grant the ACL Describe on topic {TRANSACTION_LOG_TOPIC} "
                "to txnwatch's principal (or no transaction ever ran on this cluster)",
            )
        return leaders

    def _probe_ids(self, partitions: int) -> dict[int, str]:
        """One transactional id nobody uses per `__transaction_state` partition (partition -> id)."""
        if len(self._probes) != partitions:
            self._probes = {}
            i = 0
            while len(self._probes) < partitions:
                tid = f"txnwatch-describe-probe-{self._run_id}-{i}"
                self._probes.setdefault(coordinator_partition(tid, partitions), tid)
                i += 1
        return self._probes

    def _unserved(self, log_leaders: dict[int, LogLeader] | Incomplete) -> Incomplete | None:
        """Asked before the listing: does every leader serve its partition loaded (`unserved_partition`)?"""
        if isinstance(log_leaders, Incomplete) or any(x.broker < 0 for x in log_leaders.values()):
            return None  # `_incomplete` names the reason (Metadata, or the partition without a leader)
        leaders = {p: x.broker for p, x in log_leaders.items()}
        probes = self._probe_ids(len(leaders))
        by_leader: dict[int, list[str]] = {}
        for p, tid in sorted(probes.items()):
            by_leader.setdefault(leaders[p], []).append(tid)
        answers = {d.transactional_id: d for d in self._wire.describe_transactions(by_leader)}
        return unserved_partition(leaders, probes, answers)

    def _expired(
        self, gone: Sequence[str], listing: ListingResult, check: ListingCheck | Incomplete
    ) -> set[str]:
        """The ids among `gone` (listed before, by nobody whose answer counts now) shown to have expired.

        Absence counts only where the id's *current* coordinator says so: the leader of its `__transaction_state`
        partition, at one leader epoch in the Metadata before the listing and after the poll's answers, answered
        this poll's listing (`check`, `detectors.listing`), and answers TRANSACTIONAL_ID_NOT_FOUND when asked for
        the id (DescribeTransactions). While the partition moves or loads (its old coordinator no longer lists the
        id, or lists it from its old cache; the new one answers COORDINATOR_LOAD_IN_PROGRESS or NOT_COORDINATOR),
        or has no leader, or Metadata fails, the id is withheld: its last record stands and it is asked about
        again next poll.
        """
        if not gone:
            return set()
        if isinstance(check, Incomplete):
            self._withhold(gone, check.detail)
            return set()
        ask: dict[int, list[str]] = {}
        for tid in gone:
            p = check.partition_of(tid)
            gap = check.gap_of(p)
            if gap is None:
                ask.setdefault(check.counted[p], []).append(tid)
            elif gap.kind == "not-answered":
                why = listing.failed.get(gap.broker, "not asked")
                self._withhold(
                    [tid],
                    f"broker {gap.broker}, leader of {TRANSACTION_LOG_TOPIC} partition {p}, did not list ({why})",
                )
            else:
                self._withhold([tid], gap.detail)
        expired: set[str] = set()
        for d in self._wire.describe_transactions(ask) if ask else []:
            if d.error == "TRANSACTIONAL_ID_NOT_FOUND":
                expired.add(d.transactional_id)
            else:
                self._withhold(
                    [d.transactional_id],
                    f"its coordinator broker {d.coordinator} answered {d.error or 'it exists'}",
                )
        return expired

    def _withhold(self, tids: Sequence[str], why: str) -> None:
        self.withheld_expiries += len(tids)
        # Not shown expired, maybe not unchanged either: described when next listed, whatever its listing says.
        self._unrefreshed.update(tids)
        self._note(f"transactional ids gone from ListTransactions are kept, not tombstoned, while {why}")

    def _poll(self) -> tuple[list[CoordinatorRecord], Incomplete | None]:
        before = self._log_leaders()
        unserved = self._unserved(before)
        listing = self._wire.list_transactions()
        now = self._clock_ms()
        for broker, error in listing.failed.items():
            self._note(explain("ListTransactions", error, f"broker {broker}"))
        current = self._from_leaders(listing.listings, before)
        wanted = {
            tid
            for tid, t in current.items()
            if (old := self._listed.get(tid)) is None
            or (old.producer_id, old.state) != (t.producer_id, t.state)
            or tid in self._unrefreshed
            # A sweep saw it open: its listing may look unchanged after a whole transaction (`saw_open`).
            or t.producer_id in self._seen_open
        }
        long_running: ListingResult | None = None
        if self._duration_filter_ms > 0:
            long_running = self._long_running(listing)
            wanted |= {t.transactional_id for t in long_running.listings if t.transactional_id in current}
            # A broker that listed its long-running transactions neither with the filter nor without it: every
            # active transaction it listed a moment ago is described instead (the position stays withheld:
            # `_incomplete`, duration-listing-failed).
            wanted |= active_on(current, set(long_running.failed))
        else:
            wanted |= {tid for tid, t in current.items() if t.state in ACTIVE_STATES}

        changed, failed = self._describe(wanted, current, now)
        after = self._log_leaders()
        check = self._check(before, after, listing)
        gone = [tid for tid in self._listed if tid not in current]
        for tid in sorted(self._expired(gone, listing, check)):
            del self._listed[tid]
            self._unrefreshed.discard(tid)
            if self._records.pop(tid, None) is not None:
                changed.append(tombstone(tid, seen_at_ms=now))
        self._listed.update(current)
        return changed, self._incomplete(before, after, check, unserved, listing, long_running, failed)

    @staticmethod
    def _from_leaders(
        listings: Sequence[TransactionListing], before: dict[int, LogLeader] | Incomplete
    ) -> dict[str, TransactionListing]:
        """The listing by transactional id. An id two brokers list is taken as the leader of its
        `__transaction_state` partition (Metadata before the listing) listed it, and described there: the other
        answers from a cache it has not unloaded yet (`detectors.listing`)."""
        if isinstance(before, Incomplete):
            return {t.transactional_id: t for t in listings}
        partitions = len(before)

        def by_leader(t: TransactionListing) -> bool:
            p = coordinator_partition(t.transactional_id, partitions)
            return before.get(p, LogLeader(-1)).broker == t.coordinator

        return {
            t.transactional_id: t for t in sorted(listings, key=by_leader)
        }  # a leader's row last: it wins

    @staticmethod
    def _check(
        before: dict[int, LogLeader] | Incomplete,
        after: dict[int, LogLeader] | Incomplete,
        listing: ListingResult,
    ) -> ListingCheck | Incomplete:
        """Which partitions' answers count (`detectors.listing.check_listing`), or why none can."""
        if isinstance(before, Incomplete):
            return before
        if isinstance(after, Incomplete):
            return after
        return check_listing(before, after, listing.answered)

    def _long_running(self, listing: ListingResult) -> ListingResult:
        """The active transactions running longer than the DurationFilter, asked per broker (every broker the
        poll's listing asked): a broker whose ApiVersions offer ListTransactions v1 (Kafka 3.8+, KIP-994) with the
        filter; any other broker, and one whose filtered listing failed (UNSUPPORTED_VERSION, or any error), again
        without it, so it lists every active transaction it coordinates. A cluster mid-upgrade mixes both.
        `failed`: the brokers that answered neither."""
        asked = sorted(listing.answered | set(listing.failed))
        apis = self._wire.broker_apis(asked)
        filtering = [b for b in asked if takes_duration_filter(apis.get(b, {}))]
        filtered = ListingResult([], {}, frozenset())
        if filtering:
            filtered = self._wire.list_transactions(
                states=ACTIVE_STATES, duration_filter_ms=self._duration_filter_ms, brokers=filtering
            )
        for broker, error in sorted(filtered.failed.items()):
            self._note(
                f"ListTransactions with a DurationFilter failed on broker {broker} ({error}); asked again "
                "without the filter"
            )
        without = sorted((set(asked) - set(filtering)) | set(filtered.failed))
        if not without:
            return filtered
        self._note(
            f"{'brokers' if len(without) > 1 else 'broker'} {', '.join(map(str, without))} listed without ListTransactions' DurationFilter (it needs Kafka "
            "3.8+, KIP-994): every active transaction they coordinate is described each poll"
        )
        unfiltered = self._wire.list_transactions(states=ACTIVE_STATES, brokers=without)
        for broker, error in sorted(unfiltered.failed.items()):
            self._note(explain("ListTransactions", error, f"broker {broker}"))
        return ListingResult(
            filtered.listings + unfiltered.listings,
            dict(unfiltered.failed),
            filtered.answered | unfiltered.answered,
        )

    def _describe(
        self, wanted: set[str], current: dict[str, TransactionListing], now: int
    ) -> tuple[list[CoordinatorRecord], set[str]]:
        """Describe `wanted` at their coordinators: the records whose content changed, and the errors of the ids
        that could not be described (kept in `_unrefreshed`, described again next poll). An id found expired
        between listing and describing leaves `current`."""
        by_coordinator: dict[int, list[str]] = {}
        for tid in sorted(wanted):
            by_coordinator.setdefault(current[tid].coordinator, []).append(tid)
        answers = self._wire.describe_transactions(by_coordinator) if by_coordinator else []
        changed: list[CoordinatorRecord] = []
        errors: set[str] = set()
        for tid in wanted - {d.transactional_id for d in answers}:
            self._unrefreshed.add(tid)
            errors.add("MISSING_FROM_RESPONSE")
        for d in answers:
            if d.error == "TRANSACTIONAL_ID_NOT_FOUND":
                current.pop(d.transactional_id, None)  # expired between listing and describing
                continue
            if d.error is not None:
                self._unrefreshed.add(d.transactional_id)
                errors.add(d.error)
                if d.error not in _TRANSIENT:
                    self._note(explain("DescribeTransactions", d.error, d.transactional_id))
                continue
            try:
                record = record_from_description(d, seen_at_ms=now)
            except (ValidationError, ValueError) as exc:
                self._unrefreshed.add(d.transactional_id)
                errors.add("UNUSABLE_ANSWER")
                self._note(f"DescribeTransactions {d.transactional_id}: unusable answer: {exc}")
                continue
            # A record not refreshed for a while is published again even if its content looks the same: a whole
            # transaction may have run meanwhile, and its completion must not keep the old, earlier stamp.
            stale = d.transactional_id in self._unrefreshed
            self._unrefreshed.discard(d.transactional_id)
            previous = self._records.get(d.transactional_id)
            if stale or previous is None or _content(previous) != _content(record):
                self._records[d.transactional_id] = record
                changed.append(record)
        return changed, errors

    def _incomplete(
        self,
        before: dict[int, LogLeader] | Incomplete,
        after: dict[int, LogLeader] | Incomplete,
        check: ListingCheck | Incomplete,
        unserved: Incomplete | None,
        listing: ListingResult,
        long_running: ListingResult | None,
        describe_errors: set[str],
    ) -> Incomplete | None:
        """Why this poll may have missed a changed state (the first reason found), or None."""
        if isinstance(before, Incomplete):
            return before
        if isinstance(after, Incomplete):
            return after
        if isinstance(check, Incomplete):
            return check
        return first_gap(
            moved_or_leaderless(check),
            unserved,
            unanswered_listing(check, listing, "listing-failed", "ListTransactions"),
            None
            if long_running is None
            else unanswered_listing(
                check_listing(before, after, long_running.answered),
                long_running,
                "duration-listing-failed",
                "ListTransactions with a DurationFilter",
            ),
            undescribed(describe_errors),
        )
