"""On-call inspection: one partition's open transactions, each explained by `detectors.rules.classify` against
what the coordinators say about its producer id, and the decoded `__transaction_state` log, live
(`kafka-dump-log --transaction-log-decoder` without the files).

`inspect partition` asks the coordinators (ListTransactions by producer id, then DescribeTransactions); it does
not read `__transaction_state` to end offsets measured after the leader answered, so its coordinator view is
never shown current (docs/detection.md, section 4). A HANGING rule that holds is therefore reported UNCONFIRMED
(`coordinator-view-behind`): the streaming job proves it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from admin.live.evidence import (
    CoordinatorView,
    LiveWire,
    ask_coordinators,
    ask_leader_at,
    listing_incomplete,
    log_leaders_or_none,
    offsets_at,
)
from admin.wire.connect import Consumer
from admin.wire.errors import AdminError, WireError, explain
from admin.wire.records import follow, topic_partitions
from admin.wire.types import FetchFailure, StartBatch, open_transaction, wall_clock_ms
from common.text import duration, format_table, iso
from detectors import lateness
from detectors.codec import DecodeError, decode_key, decode_value
from detectors.contract import TRANSACTION_LOG_TOPIC
from detectors.currency import coordinator_partition
from detectors.models import CoordinatorRecord, DetectionLimits, OpenTransaction, Verdict
from detectors.rules import classify, select_coordinator_view

DEFAULT_LIMITS = DetectionLimits()
VIEW_NOTE = (
    "verdicts: detectors.rules.classify on the coordinators' DescribeTransactions answers, not on "
    "__transaction_state read to its end: the view is not shown current, so a HANGING rule that holds shows "
    "as UNCONFIRMED, and rules that need the time of the coordinator's last change cannot hold "
    "(`txnwatch stream` proves them)"
)


# --------------------------------------------------------------------------------------- partition


@dataclass(frozen=True)
class InspectedTransaction:
    txn: OpenTransaction
    age_ms: int | None  # None: neither the start batch nor LastTimestamp gave a usable (positive) timestamp
    coordinator: CoordinatorView
    note: str  # the verdict's explanation, or why there is no verdict
    start_batch_error: str | None = None
    verdict: Verdict | None = None  # None: the coordinator view is unavailable


@dataclass
class PartitionReport:
    """One partition as its leader describes it; also the partition context `rules.classify` reads."""

    topic: str
    partition: int
    leader: int
    observed_at_ms: int
    last_stable_offset: int | None
    high_watermark: int | None
    max_transaction_timeout_ms: int | None
    transactions: list[InspectedTransaction] = field(default_factory=list)
    # The leader epoch the leader answered at (the metadata's, confirmed by its ListOffsets at it), if known.
    leader_epoch: int | None = None

    @property
    def lso_lag(self) -> int | None:
        if self.last_stable_offset is None or self.high_watermark is None:
            return None
        return self.high_watermark - self.last_stable_offset

    def as_json(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "partition": self.partition,
            "leader": self.leader,
            "observed_at_ms": self.observed_at_ms,
            "last_stable_offset": self.last_stable_offset,
            "high_watermark": self.high_watermark,
            "lso_lag": self.lso_lag,
            "max_transaction_timeout_ms": self.max_transaction_timeout_ms,
            "leader_epoch": self.leader_epoch,
            "open_transactions": [
                {
                    **t.txn.model_dump(mode="json"),
                    "open_since_ms": t.txn.open_since_ms,
                    "open_since_basis": t.txn.open_since_basis,
                    "age_ms": t.age_ms,
                    "start_batch_error": t.start_batch_error,
                    "coordinator": t.coordinator.__dict__,
                    "verdict": t.verdict.model_dump(mode="json") if t.verdict is not None else None,
                    "note": t.note,
                }
                for t in self.transactions
            ],
        }


def transaction_age_ms(txn: OpenTransaction, now_ms: int) -> int | None:
    """The transaction's age as detectors measures it, None when its start is unknown.

    Non-positive timestamps are unknown (Kafka's NO_TIMESTAMP is -1): `now - open_since_ms` would then be the
    time since 1970, decades of "age" that an operator would read as a hanging transaction.

    Args:
        txn: the open transaction (start batch timestamp, else LastTimestamp: `open_since_ms`).
        now_ms: the inspection's clock.

    Returns:
        `detectors.lateness.age_ms` (never negative), or None when neither timestamp is positive.
    """
    since = txn.open_since_ms
    return lateness.age_ms(now_ms, since) if lateness.known(since) else None


def inspect_partition(
    wire: LiveWire,
    topic: str,
    partition: int,
    *,
    limits: DetectionLimits = DEFAULT_LIMITS,
    clock_ms: Callable[[], int] = wall_clock_ms,
    sleep: Callable[[float], None] = time.sleep,
) -> PartitionReport:
    """Describe one partition's open transactions, their start batches, LSO lag and coordinator view, and
    classify each with `detectors.rules.classify`.

    The coordinator view (DescribeTransactions) is not shown current, so `view_current_ms` is None: a HANGING
    rule that holds comes out UNCONFIRMED. A transaction whose coordinator view could not be read gets no
    verdict; its note says why.

    Args:
        wire: both seams (`admin.wire.kafka_wire.KafkaWire`).
        topic, partition: the partition to inspect.
        limits: the rules' thresholds (`Settings().detection`).
        clock_ms: the inspection's clock (ages, `now_ms` of the verdicts).
        sleep: the pause before asking a partition's new leader.

    Raises:
        AdminError: unknown partition, no leader, or the leader's DescribeProducers failed.
    """
    tp = (topic, partition)
    answer = ask_leader_at(wire, topic, partition, sleep)
    leader, observed, result = answer.leader, answer.received_at_ms, answer.producers
    producers = [p for p in result.producers if p.current_txn_start_offset >= 0]
    starts: dict[tuple[Any, int], StartBatch | FetchFailure] = {}
    offsets, leader_epoch = offsets_at(wire, answer, tp)
    timeout = wire.max_transaction_timeouts([leader]).get(leader)
    if producers:
        starts = wire.fetch_start_batches(
            {leader: [(tp, p.current_txn_start_offset) for p in producers]},
            {tp: answer.leader_epoch} if answer.leader_epoch is not None else None,
        )
    # "No owner listed" proves nothing unless the listing was complete: every __transaction_state partition
    # led, by the same leader before and after, which answered (`listing_incomplete`).
    before = log_leaders_or_none(wire) if producers else {}
    answers = ask_coordinators(wire, [p.producer_id for p in producers])
    unlisted = any(p.producer_id not in answers.owners for p in producers)
    incomplete = (
        listing_incomplete(wire, before, answers.listing_answered)
        if unlisted and not answers.listing_failed
        else None
    )
    now = clock_ms()
    records, unusable = answers.records(seen_at_ms=now)
    report = PartitionReport(
        topic=topic,
        partition=partition,
        leader=leader,
        observed_at_ms=observed,
        last_stable_offset=offsets.last_stable_offset if offsets else None,
        high_watermark=offsets.high_watermark if offsets else None,
        max_transaction_timeout_ms=timeout.value_ms if timeout else None,
        leader_epoch=leader_epoch,
    )
    for p in sorted(producers, key=lambda p: p.current_txn_start_offset):
        outcome = starts.get((tp, p.current_txn_start_offset))
        start = outcome if isinstance(outcome, StartBatch) and outcome.producer_id == p.producer_id else None
        txn = open_transaction(p, start)
        coordinator = answers.view(p.producer_id, topic, partition, unusable)
        unavailable = "coordinator view unavailable"
        if incomplete is not None and coordinator.transactional_id is None and coordinator.error is None:
            # Nobody listed an owner, but the listing was not complete: no verdict can rest on that absence.
            unavailable = "unconfirmed"
            coordinator = CoordinatorView(
                None,
                error=f"cannot show that no transactional id owns producer {p.producer_id}: {incomplete}",
            )
        verdict = None
        if coordinator.error is None:
            # Not shown current (see the module docstring): a HANGING rule that holds is withheld.
            view = select_coordinator_view(p.producer_id, records.values())
            verdict = classify(txn, report, view, now_ms=now, limits=limits, view_current_ms=None)
        report.transactions.append(
            InspectedTransaction(
                txn=txn,
                age_ms=transaction_age_ms(txn, now),
                coordinator=coordinator,
                note=verdict.explanation if verdict is not None else f"{unavailable}: {coordinator.error}",
                start_batch_error=outcome.error if isinstance(outcome, FetchFailure) else None,
                verdict=verdict,
            )
        )
    return report


def _start_time(txn: OpenTransaction) -> str:
    """StartTime cell: the start batch's timestamp, or why there is none (the age then comes from elsewhere)."""
    basis = txn.open_since_basis
    if basis == "start-timestamp":
        return iso(txn.start_timestamp_ms)
    return "? (last write used)" if basis == "last-timestamp" else "?"


def _verdict_cell(verdict: Verdict | None) -> str:
    if verdict is None:
        return "-"
    return f"{verdict.kind.value} ({verdict.reason.value})" if verdict.reason else verdict.kind.value


def render_partition(report: PartitionReport) -> str:
    lag = report.lso_lag
    head = (
        f"{report.topic}-{report.partition}  leader {report.leader}  LSO {report.last_stable_offset}  "
        f"HW {report.high_watermark}  LSO lag {lag if lag is not None else '-'}  "
        f"transaction.max.timeout.ms {report.max_transaction_timeout_ms or '-'}  observed {iso(report.observed_at_ms)}"
    )
    if not report.transactions:
        return head + "\nno open transactions"
    rows = [
        [
            "ProducerId",
            "Epoch",
            "StartOffset",
            "StartTime",
            "Age",
            "LastTimestamp",
            "CoordEpoch",
            "TransactionalId",
            "CoordState",
            "Listed",
            "Verdict",
            "Note",
        ]
    ]
    for t in report.transactions:
        c = t.coordinator
        rows.append(
            [
                str(t.txn.producer_id),
                str(t.txn.producer_epoch),
                str(t.txn.start_offset),
                _start_time(t.txn),
                duration(t.age_ms) if t.age_ms is not None else "unknown",
                iso(t.txn.last_timestamp_ms),
                str(t.txn.coordinator_epoch),
                c.transactional_id or "-",
                c.state or "-",
                "-" if c.partition_listed is None else ("yes" if c.partition_listed else "no"),
                _verdict_cell(t.verdict),
                t.note,
            ]
        )
    return head + "\n" + format_table(rows) + "\n" + VIEW_NOTE


# --------------------------------------------------------------------------------- coordinator log


@dataclass(frozen=True)
class LogEntry:
    """One decoded `__transaction_state` record, or why it could not be decoded."""

    partition: int
    offset: int
    timestamp_ms: int
    record: CoordinatorRecord | None
    error: str | None = None
    raw_key: bytes | None = None


def read_coordinator_log(
    consumer: Consumer,
    *,
    transactional_id: str | None = None,
    from_beginning: bool = False,
    max_records: int | None = None,
    idle_timeout_ms: int | None = None,
    stop: threading.Event | None = None,
) -> Iterator[LogEntry]:
    """Follow `__transaction_state`, decoding each record; stops on `stop`, `max_records` or `idle_timeout_ms`.

    Raises:
        AdminError: the topic does not exist or cannot be read (names the ACL).
    """
    partitions = topic_partitions(consumer, TRANSACTION_LOG_TOPIC)
    if not partitions:
        raise AdminError(
            f"topic {TRANSACTION_LOG_TOPIC} not found: no transaction ever ran on this cluster, or "
            f"{explain('Consume', 'TOPIC_AUTHORIZATION_FAILED', TRANSACTION_LOG_TOPIC).split(': ', 1)[1]}"
            " (without it, use `txnwatch collect --coordinator-source describe`)"
        )
    if transactional_id is not None:
        chosen = [coordinator_partition(transactional_id, len(partitions))]
    else:
        chosen = partitions
    polls = follow(
        consumer,
        TRANSACTION_LOG_TOPIC,
        chosen,
        start="beginning" if from_beginning else "end",
        poll_ms=300,
        stop=stop,
    )
    seen = 0
    last_record = time.monotonic()
    while True:
        try:
            batch = next(polls, None)
        except WireError as exc:
            if exc.name != "TOPIC_AUTHORIZATION_FAILED":
                raise
            raise AdminError(explain("Consume", "TOPIC_AUTHORIZATION_FAILED", TRANSACTION_LOG_TOPIC)) from exc
        if batch is None:  # stopped
            return
        if batch:
            last_record = time.monotonic()
        for r in batch:
            entry = decode_entry(r.partition, r.offset, r.timestamp, r.key, r.value)
            if (
                transactional_id is not None
                and entry.record is not None
                and entry.record.transactional_id != transactional_id
            ):
                continue
            yield entry
            seen += 1
            if max_records is not None and seen >= max_records:
                return
        if idle_timeout_ms is not None and (time.monotonic() - last_record) * 1000 >= idle_timeout_ms:
            return


def decode_entry(
    partition: int, offset: int, timestamp_ms: int, key: bytes | None, value: bytes | None
) -> LogEntry:
    """Decode one `__transaction_state` record with the detectors' codec; errors are reported, not raised."""
    if key is None:
        return LogEntry(partition, offset, timestamp_ms, None, "record without a key")
    try:
        k = decode_key(key)
        v = decode_value(value)
        record = CoordinatorRecord.from_log_value(
            k.transactional_id,
            v,
            source_partition=partition,
            source_offset=offset,
            source_timestamp_ms=timestamp_ms,
        )
    except (DecodeError, ValueError) as exc:
        return LogEntry(partition, offset, timestamp_ms, None, str(exc), key)
    return LogEntry(partition, offset, timestamp_ms, record)


LOG_HEADER = [
    "Partition",
    "Offset",
    "Timestamp",
    "TransactionalId",
    "State",
    "ProducerId",
    "Epoch",
    "TimeoutMs",
    "Partitions",
    "StartTime",
    "LastUpdate",
]


def render_log_entry(e: LogEntry) -> list[str]:
    if e.record is None:
        return [
            str(e.partition),
            str(e.offset),
            iso(e.timestamp_ms),
            "?",
            f"undecodable: {e.error}",
            "",
            "",
            "",
            "",
            "",
            "",
        ]
    r = e.record
    if r.tombstone:
        return [
            str(e.partition),
            str(e.offset),
            iso(e.timestamp_ms),
            r.transactional_id,
            "<DELETE>",
            "",
            "",
            "",
            "",
            "",
            "",
        ]
    parts = ",".join(f"{tp.topic}-{tp.partition}" for tp in r.partitions) or "-"
    return [
        str(e.partition),
        str(e.offset),
        iso(e.timestamp_ms),
        r.transactional_id,
        r.state.value if r.state is not None else "-",
        str(r.producer_id),
        str(r.producer_epoch),
        str(r.transaction_timeout_ms),
        parts,
        iso(r.start_timestamp_ms),
        iso(r.last_update_timestamp_ms),
    ]


def entry_json(e: LogEntry) -> dict[str, Any]:
    if e.record is None:
        return {
            "partition": e.partition,
            "offset": e.offset,
            "timestamp_ms": e.timestamp_ms,
            "error": e.error,
            "key_hex": e.raw_key.hex() if e.raw_key else None,
        }
    return e.record.model_dump(mode="json")
