"""On-call inspection: one partition's open transactions with what the coordinator says about each producer,
and the decoded `__transaction_state` log, live (`kafka-dump-log --transaction-log-decoder` without the files).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

import kafka.errors as Errors
from kafka import KafkaConsumer
from kafka.structs import TopicPartition as KafkaTopicPartition

from admin.client import AdminError, explain
from admin.collector import (
    ClusterWire,
    FetchFailure,
    PartitionProducers,
    open_transaction,
    wall_clock_ms,
)
from admin.coordinator import CoordinatorWire, TransactionDescription
from admin.fetch import StartBatch
from detectors import lateness
from detectors.codec import DecodeError, decode_key, decode_value
from detectors.models import CoordinatorRecord, OpenTransaction

TRANSACTION_STATE_TOPIC = "__transaction_state"
OWNING_STATES = frozenset({"Ongoing", "PrepareCommit", "PrepareAbort", "PrepareEpochFence"})


class InspectWire(ClusterWire, CoordinatorWire, Protocol):
    """Both seams: partition side and coordinator side."""


# --------------------------------------------------------------------------------------- partition


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


@dataclass(frozen=True)
class InspectedTransaction:
    txn: OpenTransaction
    age_ms: int | None  # None: neither the start batch nor LastTimestamp gave a usable (positive) timestamp
    coordinator: CoordinatorView
    note: str
    start_batch_error: str | None = None


@dataclass
class PartitionReport:
    topic: str
    partition: int
    leader: int
    observed_at_ms: int
    last_stable_offset: int | None
    high_watermark: int | None
    max_transaction_timeout_ms: int | None
    transactions: list[InspectedTransaction] = field(default_factory=list)

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
            "open_transactions": [
                {
                    **t.txn.model_dump(mode="json"),
                    "open_since_ms": t.txn.open_since_ms,
                    "open_since_basis": t.txn.open_since_basis,
                    "age_ms": t.age_ms,
                    "start_batch_error": t.start_batch_error,
                    "coordinator": t.coordinator.__dict__,
                    "note": t.note,
                }
                for t in self.transactions
            ],
        }


def _note(txn: OpenTransaction, view: CoordinatorView, topic: str, partition: int) -> str:
    # Facts in Kafka's terms; the verdict with grace periods and evidence is the streaming job's business.
    if view.error is not None:
        return f"coordinator view unavailable: {view.error}"
    if view.transactional_id is None:
        return "no transactional id owns this producer id: no coordinator will write its marker (find-hanging: hanging)"
    if view.state in OWNING_STATES:
        if view.partition_listed:
            return f"the coordinator's {view.state} transaction includes {topic}-{partition}: its marker will come"
        return (
            f"the coordinator's {view.state} transaction does not include {topic}-{partition}: its markers go "
            "elsewhere (find-hanging: hanging)"
        )
    return (
        f"the coordinator is {view.state}: it finished this producer's transactions; an open transaction seen "
        "after that will get no marker"
    )


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
    wire: InspectWire, topic: str, partition: int, *, clock_ms: Callable[[], int] = wall_clock_ms
) -> PartitionReport:
    """Describe one partition's open transactions, their start batches, LSO lag and coordinator view.

    Raises:
        AdminError: unknown partition, no leader, or the leader's DescribeProducers failed.
    """
    tp = (topic, partition)
    result: PartitionProducers | None = None
    leader = -1
    observed = 0
    for _attempt in range(3):
        view = wire.metadata()
        if tp not in view.leaders:
            raise AdminError(f"{topic}-{partition} does not exist (or Describe on topic {topic} is missing)")
        leader = view.leaders[tp]
        if leader < 0:
            raise AdminError(f"{topic}-{partition} has no leader right now")
        (batch,) = wire.describe_producers({leader: [[tp]]})
        if batch.error is not None:
            raise AdminError(explain("DescribeProducers", batch.error, f"broker {leader}", batch.message))
        result = batch.results.get(tp, PartitionProducers("MISSING_FROM_RESPONSE"))
        observed = batch.received_at_ms
        if result.error not in ("NOT_LEADER_OR_FOLLOWER", "LEADER_NOT_AVAILABLE"):
            break
        time.sleep(0.3)
    assert result is not None
    if result.error is not None:
        raise AdminError(explain("DescribeProducers", result.error, topic, result.message))
    producers = [p for p in result.producers if p.current_txn_start_offset >= 0]
    starts: dict[tuple[Any, int], StartBatch | FetchFailure] = {}
    offsets = wire.list_offsets({leader: [tp]}).get(tp)
    timeout = wire.max_transaction_timeouts([leader]).get(leader)
    if producers:
        starts = wire.fetch_start_batches({leader: [(tp, p.current_txn_start_offset) for p in producers]})
    views = coordinator_views([p.producer_id for p in producers], wire, topic, partition)
    now = clock_ms()
    report = PartitionReport(
        topic=topic,
        partition=partition,
        leader=leader,
        observed_at_ms=observed,
        last_stable_offset=offsets.last_stable_offset if offsets else None,
        high_watermark=offsets.high_watermark if offsets else None,
        max_transaction_timeout_ms=timeout.value_ms if timeout else None,
    )
    for p in sorted(producers, key=lambda p: p.current_txn_start_offset):
        outcome = starts.get((tp, p.current_txn_start_offset))
        start = outcome if isinstance(outcome, StartBatch) and outcome.producer_id == p.producer_id else None
        txn = open_transaction(p, start)
        coordinator = views.get(p.producer_id, CoordinatorView(None))
        report.transactions.append(
            InspectedTransaction(
                txn=txn,
                age_ms=transaction_age_ms(txn, now),
                coordinator=coordinator,
                note=_note(txn, coordinator, topic, partition),
                start_batch_error=outcome.error if isinstance(outcome, FetchFailure) else None,
            )
        )
    return report


def coordinator_views(
    producer_ids: list[int], wire: CoordinatorWire, topic: str, partition: int
) -> dict[int, CoordinatorView]:
    """The coordinator's view of each producer id: the transactional id that currently owns it, and its state."""
    if not producer_ids:
        return {}
    listing = wire.list_transactions(producer_ids=producer_ids)
    owners = {t.producer_id: t for t in listing.listings if t.producer_id in set(producer_ids)}
    by_coordinator: dict[int, list[str]] = {}
    for t in owners.values():
        by_coordinator.setdefault(t.coordinator, []).append(t.transactional_id)
    described: dict[str, TransactionDescription] = {
        d.transactional_id: d for d in (wire.describe_transactions(by_coordinator) if by_coordinator else [])
    }
    failed = ", ".join(f"broker {b}: {e}" for b, e in sorted(listing.failed.items()))
    out: dict[int, CoordinatorView] = {}
    for pid in producer_ids:
        owner = owners.get(pid)
        if owner is None:
            out[pid] = CoordinatorView(None, error=f"ListTransactions failed on {failed}" if failed else None)
            continue
        d = described.get(owner.transactional_id)
        if d is None or d.error is not None:
            error = d.error if d is not None and d.error is not None else "NOT_DESCRIBED"
            out[pid] = CoordinatorView(
                owner.transactional_id,
                state=owner.state,
                error=explain("DescribeTransactions", error, owner.transactional_id),
            )
            continue
        out[pid] = CoordinatorView(
            owner.transactional_id,
            state=d.state,
            producer_epoch=d.producer_epoch,
            transaction_timeout_ms=d.timeout_ms,
            transaction_start_ms=d.start_time_ms,
            partition_listed=(topic, partition) in d.partitions,
        )
    return out


def iso(ms: int | None) -> str:
    # Non-positive timestamps are unknown (detectors.lateness.known), not instants in 1970.
    if ms is None or not lateness.known(ms):
        return "-"
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def duration(ms: int) -> str:
    seconds = max(ms, 0) // 1000
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"


def format_table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )


def _start_time(txn: OpenTransaction) -> str:
    """StartTime cell: the start batch's timestamp, or why there is none (the age then comes from elsewhere)."""
    basis = txn.open_since_basis
    if basis == "start-timestamp":
        return iso(txn.start_timestamp_ms)
    return "? (last write used)" if basis == "last-timestamp" else "?"


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
                t.note,
            ]
        )
    return head + "\n" + format_table(rows)


# --------------------------------------------------------------------------------- coordinator log


def java_string_hash(text: str) -> int:
    """Java's `String.hashCode()` (over UTF-16 code units, 32-bit wrap-around)."""
    h = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def transaction_log_partition(transactional_id: str, partitions: int) -> int:
    """The `__transaction_state` partition of a transactional id: `Utils.abs(hashCode) % partitions`."""
    h = java_string_hash(transactional_id)
    return (0 if h == -(1 << 31) else abs(h)) % partitions


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
    consumer: KafkaConsumer,
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
    partitions = consumer.partitions_for_topic(TRANSACTION_STATE_TOPIC)
    if not partitions:
        raise AdminError(
            f"topic {TRANSACTION_STATE_TOPIC} not found: no transaction ever ran on this cluster, or "
            f"{explain('Consume', 'TOPIC_AUTHORIZATION_FAILED', TRANSACTION_STATE_TOPIC).split(': ', 1)[1]}"
            " (without it, use `txnwatch collect --coordinator-source describe`)"
        )
    if transactional_id is not None:
        chosen = [transaction_log_partition(transactional_id, len(partitions))]
    else:
        chosen = sorted(partitions)
    tps = [KafkaTopicPartition(TRANSACTION_STATE_TOPIC, p) for p in chosen]
    consumer.assign(tps)
    if from_beginning:
        consumer.seek_to_beginning(*tps)
    else:
        consumer.seek_to_end(*tps)
    seen = 0
    last_record = time.monotonic()
    while stop is None or not stop.is_set():
        try:
            batch = consumer.poll(timeout_ms=300)
        except Errors.TopicAuthorizationFailedError as exc:
            raise AdminError(
                explain("Consume", "TOPIC_AUTHORIZATION_FAILED", TRANSACTION_STATE_TOPIC)
            ) from exc
        if batch:
            last_record = time.monotonic()
        for records in batch.values():
            for r in records:
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
