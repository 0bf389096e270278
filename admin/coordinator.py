"""Coordinator fallback: ListTransactions + DescribeTransactions → `CoordinatorRecord`s, for clusters where
`__transaction_state` cannot be read (no Read ACL on it).

Each poll lists every transactional id on every broker (the broker that lists an id coordinates it), describes
the ids that are new or changed state, plus every active transaction (only those running longer than the
DurationFilter, where ListTransactions v1 exists), and returns the records whose content changed. An id that
disappears from the listing gets a tombstone record only once its current coordinator shows it expired (the
leader of its `__transaction_state` partition listed, and answers TRANSACTIONAL_ID_NOT_FOUND for it): a
partition that moves, loads or has no leader is listed by nobody, which proves nothing. Once a poll's records are
acknowledged, `log_position` measures how far `<prefix>.coordinator-state` has reached, as of the moment before
the poll's ListTransactions: the `CoordinatorLogPosition` the streaming job needs to know its view is current.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from typing import NamedTuple, Protocol

from kafka.errors import KafkaError
from pydantic import ValidationError

from admin.client import explain
from admin.position import measure_log_position
from admin.seams import (
    ClusterView,
    ClusterWire,
    CoordinatorWire,
    ListingResult,
    TransactionDescription,
    TransactionListing,
)
from detectors.contract import OWNING_STATES, TRANSACTION_LOG_TOPIC
from detectors.currency import coordinator_partition
from detectors.models import CoordinatorLogPosition, CoordinatorRecord, CoordinatorState, TopicPartition

log = logging.getLogger(__name__)

# ListTransactions' state filter for transactions still running (the coordinator owns their partitions).
ACTIVE_STATES = tuple(sorted(state.value for state in OWNING_STATES))
# Per-id errors after which the id should be asked again next poll (coordinator moving or loading).
_TRANSIENT = frozenset({"NOT_COORDINATOR", "COORDINATOR_LOAD_IN_PROGRESS", "COORDINATOR_NOT_AVAILABLE"})


class CoordinatorPoll(NamedTuple):
    """One poll: the records whose content changed, and the clock read before its ListTransactions was sent."""

    poll_id: str
    as_of_ms: int
    records: list[CoordinatorRecord]


def record_from_description(d: TransactionDescription, *, seen_at_ms: int) -> CoordinatorRecord:
    """A `CoordinatorRecord` (origin describe-transactions) from one DescribeTransactions row.

    `last_update_timestamp_ms` is `seen_at_ms`, the first time the collector saw this content: the API does not
    say when the coordinator last changed the state. The previous/next producer ids and the client's
    transaction version are not in the API (defaults -1, -1, 0).

    Raises:
        ValueError: unknown state name, or fields out of range.
    """
    return CoordinatorRecord(
        transactional_id=d.transactional_id,
        producer_id=d.producer_id,
        producer_epoch=d.producer_epoch,
        transaction_timeout_ms=d.timeout_ms,
        state=CoordinatorState(d.state),
        partitions=tuple(TopicPartition(topic=t, partition=p) for t, p in sorted(d.partitions)),
        last_update_timestamp_ms=seen_at_ms,
        start_timestamp_ms=d.start_time_ms,
        origin="describe-transactions",
    )


def tombstone(transactional_id: str, *, seen_at_ms: int) -> CoordinatorRecord:
    """The record for an expired transactional id (its coordinator no longer lists it)."""
    return CoordinatorRecord.tombstone_of(transactional_id).model_copy(
        update={"origin": "describe-transactions", "last_update_timestamp_ms": seen_at_ms}
    )


def _content(record: CoordinatorRecord) -> CoordinatorRecord:
    return record.model_copy(update={"last_update_timestamp_ms": 0})


class FallbackWire(CoordinatorWire, Protocol):
    """The coordinator seam plus Metadata (to find each transactional id's current coordinator)."""

    def metadata(self, topics: Sequence[str] | None = None) -> ClusterView: ...


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
        self._noted: set[str] = set()
        # Ids gone from the listing whose expiry could not be shown (`_expired`), counted per poll that met them.
        self.withheld_expiries = 0
        self._warned_filter = False
        self._run_id = uuid.uuid4().hex[:8]
        self._seq = 0
        # (poll id, what was known before it): undone if the poll's records could not be published.
        self._before: tuple[str, dict[str, TransactionListing], dict[str, CoordinatorRecord]] | None = None

    def _note(self, message: str) -> None:
        if message not in self._noted:
            self._noted.add(message)
            log.warning("%s", message)

    def poll(self) -> list[CoordinatorRecord]:
        """List, describe what may have changed, and return the changed records (tombstones included)."""
        return self.poll_as_of().records

    def poll_as_of(self) -> CoordinatorPoll:
        """`poll()`, with the poll's id and `as_of_ms`: the clock read before ListTransactions was sent. Every
        record it returns (and every unchanged one published before) reflects coordinator state seen at or
        after `as_of_ms`."""
        self._seq += 1
        poll_id = f"{self._run_id}-poll-{self._seq}"
        as_of_ms = self._clock_ms()
        self._before = (poll_id, dict(self._listed), dict(self._records))
        return CoordinatorPoll(poll_id, as_of_ms, self._poll())

    def unpublished(self, poll: CoordinatorPoll) -> None:
        """The poll's records did not reach Kafka: forget what it learnt, so the next poll derives and sends
        them again (else a later position would vouch for records the topic never got). Only the latest poll
        can be undone."""
        if self._before is not None and self._before[0] == poll.poll_id:
            _, self._listed, self._records = self._before
            self._before = None

    def log_position(
        self, wire: ClusterWire, topic: str, poll: CoordinatorPoll, *, cluster: str
    ) -> CoordinatorLogPosition | None:
        """How far `topic` (<prefix>.coordinator-state) has reached, as of `poll.as_of_ms`.

        Call only once the poll's records are acknowledged: then every record derived from coordinator state
        seen at or after `as_of_ms` lies below the end offsets measured here, and a job that has applied
        everything below them holds the coordinators' state as of `as_of_ms`. None if the topic does not exist
        or none of its partitions answered (the reason is logged once).
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

    def _expired(self, gone: Sequence[str], listing: ListingResult) -> set[str]:
        """The ids among `gone` (listed before, by nobody now) shown to have expired.

        Absence counts only where the id's *current* coordinator says so: the leader of its `__transaction_state`
        partition (Metadata) answered this poll's listing, and answers TRANSACTIONAL_ID_NOT_FOUND when asked for
        the id (DescribeTransactions). While the partition moves or loads (its old coordinator no longer lists
        the id, the new one answers COORDINATOR_LOAD_IN_PROGRESS or NOT_COORDINATOR), or has no leader, or
        Metadata fails, the id is withheld: its last record stands and it is asked about again next poll.
        """
        if not gone:
            return set()
        try:
            leaders = {
                p: b
                for (t, p), b in self._wire.metadata([TRANSACTION_LOG_TOPIC]).leaders.items()
                if t == TRANSACTION_LOG_TOPIC
            }
        except KafkaError as exc:
            self._withhold(gone, f"Metadata for {TRANSACTION_LOG_TOPIC} failed ({exc})")
            return set()
        if not leaders:
            self._withhold(
                gone, f"{TRANSACTION_LOG_TOPIC} is not visible (Describe on topic {TRANSACTION_LOG_TOPIC}?)"
            )
            return set()
        ask: dict[int, list[str]] = {}
        for tid in gone:
            p = coordinator_partition(tid, len(leaders))
            leader = leaders.get(p, -1)
            if leader < 0:
                self._withhold([tid], f"{TRANSACTION_LOG_TOPIC} partition {p} has no leader")
            elif leader not in listing.answered:
                why = listing.failed.get(leader, "not asked")
                self._withhold(
                    [tid],
                    f"broker {leader}, leader of {TRANSACTION_LOG_TOPIC} partition {p}, did not list ({why})",
                )
            else:
                ask.setdefault(leader, []).append(tid)
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
        self._note(f"transactional ids gone from ListTransactions are kept, not tombstoned, while {why}")

    def _poll(self) -> list[CoordinatorRecord]:
        listing = self._wire.list_transactions()
        now = self._clock_ms()
        for broker, error in listing.failed.items():
            self._note(explain("ListTransactions", error, f"broker {broker}"))
        current = {t.transactional_id: t for t in listing.listings}
        wanted = {
            tid
            for tid, t in current.items()
            if (old := self._listed.get(tid)) is None
            or (old.producer_id, old.state) != (t.producer_id, t.state)
        }
        if self._duration_filter_ms > 0 and self._wire.supports_duration_filter():
            long_running = self._wire.list_transactions(
                states=ACTIVE_STATES, duration_filter_ms=self._duration_filter_ms
            )
            wanted |= {t.transactional_id for t in long_running.listings if t.transactional_id in current}
        else:
            if self._duration_filter_ms > 0 and not self._warned_filter:
                self._warned_filter = True
                log.warning(
                    "ListTransactions' DurationFilter needs Kafka 3.8+ (KIP-994); describing every active "
                    "transaction each poll instead"
                )
            wanted |= {tid for tid, t in current.items() if t.state in ACTIVE_STATES}

        by_coordinator: dict[int, list[str]] = {}
        for tid in sorted(wanted):
            by_coordinator.setdefault(current[tid].coordinator, []).append(tid)
        changed: list[CoordinatorRecord] = []
        retry: set[str] = set()
        for d in self._wire.describe_transactions(by_coordinator) if by_coordinator else []:
            if d.error == "TRANSACTIONAL_ID_NOT_FOUND":
                current.pop(d.transactional_id, None)  # expired between listing and describing
                continue
            if d.error is not None:
                retry.add(d.transactional_id)
                if d.error not in _TRANSIENT:
                    self._note(explain("DescribeTransactions", d.error, d.transactional_id))
                continue
            try:
                record = record_from_description(d, seen_at_ms=now)
            except (ValidationError, ValueError) as exc:
                self._note(f"DescribeTransactions {d.transactional_id}: unusable answer: {exc}")
                continue
            previous = self._records.get(d.transactional_id)
            if previous is None or _content(previous) != _content(record):
                self._records[d.transactional_id] = record
                changed.append(record)

        gone = [tid for tid in self._listed if tid not in current]
        for tid in sorted(self._expired(gone, listing)):
            del self._listed[tid]
            if self._records.pop(tid, None) is not None:
                changed.append(tombstone(tid, seen_at_ms=now))
        for tid, t in current.items():
            if (
                tid not in retry
            ):  # a failed describe keeps the old listing, so it is described again next poll
                self._listed[tid] = t
        return changed
