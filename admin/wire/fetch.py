"""The batch at an open transaction's start offset: a raw read_uncommitted Fetch, parsed with kafka-python's records.

DescribeProducers gives the start offset but only the producer's *last* timestamp; the batch at the start offset
gives the exact start time (its first record's timestamp) and the epoch the transaction began with.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kafka.protocol.consumer import FetchRequest
from kafka.record.default_records import DefaultRecordBatch
from kafka.record.memory_records import MemoryRecords

from admin.wire.errors import code_name
from admin.wire.requests import RequestLog
from admin.wire.types import TP, FetchFailure, StartBatch
from detectors.groups import CONSUMER_OFFSETS_TOPIC, pending_commit

# Fetch v4 is the first with isolation levels; v13+ addresses topics by id, which we do not track, and kafka-python's
# own consumer also stops at v12. Kafka 4.x serves v4..v17.
FETCH_MIN_VERSION = 4
FETCH_MAX_VERSION = 12
# Fetch v9 is the first with a current leader epoch (KIP-320).
FETCH_LEADER_EPOCH_MIN_VERSION = 9
READ_UNCOMMITTED = 0
# Fetch errors after which the same start offset will never yield its batch.
PERMANENT_FETCH_ERRORS = frozenset({"OFFSET_OUT_OF_RANGE", "NO_BATCH_AT_OFFSET"})


def fetch_request(
    wanted: Sequence[tuple[str, int, int]],
    *,
    partition_max_bytes: int,
    max_bytes: int,
    leader_epochs: Mapping[tuple[str, int], int] | None = None,
) -> Any:
    """A read_uncommitted FetchRequest (v4..v12, no session) for (topic, partition, offset) triples.

    The broker returns a complete first batch for the first partition whatever the limits (KIP-74); for the
    others a batch larger than what is left of the budget comes back empty, and the caller asks again.
    `leader_epochs` (the leader epoch of record per partition, where known) go out as `current_leader_epoch`:
    a broker that is not the leader at that epoch answers FENCED_LEADER_EPOCH or UNKNOWN_LEADER_EPOCH instead
    of a batch from its own, possibly stale, log.
    """
    epochs = leader_epochs or {}
    topic = FetchRequest.FetchTopic
    by_topic: dict[str, list[Any]] = {}
    for name, partition, offset in wanted:
        by_topic.setdefault(name, []).append(
            topic.FetchPartition(
                partition=partition,
                current_leader_epoch=epochs.get((name, partition), -1),
                fetch_offset=offset,
                last_fetched_epoch=-1,
                log_start_offset=-1,
                partition_max_bytes=partition_max_bytes,
            )
        )
    return FetchRequest(
        replica_id=-1,
        max_wait_ms=0,
        min_bytes=0,
        max_bytes=max_bytes,
        isolation_level=READ_UNCOMMITTED,
        session_id=0,
        session_epoch=-1,  # no fetch session: a one-off read
        topics=[topic(topic=name, partitions=parts) for name, parts in by_topic.items()],
        forgotten_topics_data=[],
        rack_id="",
        # An epoch must not be dropped by an older version.
        min_version=FETCH_LEADER_EPOCH_MIN_VERSION
        if any(epochs.get((name, partition), -1) >= 0 for name, partition, _ in wanted)
        else FETCH_MIN_VERSION,
        max_version=FETCH_MAX_VERSION,
    )


def parse_fetch_round(
    response: Any,
    asked: Sequence[tuple[TP, int]],
    out: dict[tuple[TP, int], StartBatch | FetchFailure],
    requests: RequestLog,
) -> list[tuple[TP, int]]:
    """Each asked (partition, start offset)'s batch or failure into `out` (errors counted in `requests`); returns
    those whose batch did not fit this response, to ask first next round."""
    data = {(t.topic, p.partition_index): p for t in response.responses for p in t.partitions}
    retry: list[tuple[TP, int]] = []
    for tp, offset in asked:
        p = data.get(tp)
        if p is None:
            out[(tp, offset)] = FetchFailure("MISSING_FROM_RESPONSE", permanent=False)
            continue
        error = code_name(p.error_code)
        if error is not None:
            requests.record_partition_error("Fetch", error)
            out[(tp, offset)] = FetchFailure(error, permanent=error in PERMANENT_FETCH_ERRORS)
            continue
        batch = parse_start_batch(p.records, offset, tp[0])
        if batch is not None:
            out[(tp, offset)] = batch
        elif not p.records and p.high_watermark > offset:
            retry.append((tp, offset))  # did not fit this response; first in line next round
        elif p.records:
            out[(tp, offset)] = FetchFailure("NO_BATCH_AT_OFFSET", permanent=True)
        else:
            out[(tp, offset)] = FetchFailure("OFFSET_NOT_YET_REPLICATED", permanent=False)
    return retry


def parse_start_batch(
    records: bytes | bytearray | memoryview | None, start_offset: int, topic: str = ""
) -> StartBatch | None:
    """The complete magic-v2 batch that contains `start_offset`, or None if the bytes hold no such batch.

    Args:
        records: the partition's `records` bytes from a FetchResponse (a trailing partial batch is ignored).
        start_offset: DescribeProducers' CurrentTxnStartOffset.
        topic: the partition's topic; on `__consumer_offsets` the batch's record keys name the committing group.

    Returns:
        The batch's header facts (its partitionLeaderEpoch too: the leader epoch it was appended at) and the
        timestamp of the record at `start_offset`.
    """
    if not records:
        return None
    for batch in MemoryRecords(bytes(records)):
        if not isinstance(batch, DefaultRecordBatch):
            continue  # message format v0/v1 has no producer ids, so no transactions
        if batch.last_offset < start_offset:
            continue
        if batch.base_offset > start_offset:
            return None  # the offset is gone (compacted or truncated)
        # A batch's records can be iterated once (kafka-python decodes them as it goes): read them here.
        try:
            rows: list[Any] | None = list(batch)
        except Exception:  # undecodable payload (e.g. a codec we lack): the header is still right
            rows = None
        return StartBatch(
            base_offset=batch.base_offset,
            producer_id=batch.producer_id,
            producer_epoch=batch.producer_epoch,
            start_timestamp_ms=_timestamp_at(batch, rows, start_offset),
            max_timestamp_ms=batch.max_timestamp,
            transactional=batch.is_transactional,
            leader_epoch=batch.leader_epoch if batch.leader_epoch >= 0 else None,
            **(_offset_commit(rows) if topic == CONSUMER_OFFSETS_TOPIC else {}),
        )
    return None


def _offset_commit(rows: list[Any] | None) -> dict[str, Any]:
    # A transactional offset commit on `__consumer_offsets` keys its records by (group, topic, partition): the
    # group is whom the open transaction blocks (detectors/groups.py).
    found = None if rows is None else pending_commit([None if r.key is None else bytes(r.key) for r in rows])
    if found is None:
        return {}
    return {"offset_commit_group": found[0], "offset_commit_partitions": found[1]}


def _timestamp_at(batch: DefaultRecordBatch, rows: list[Any] | None, offset: int) -> int:
    # A transaction starts at a batch's base offset, whose record has timestamp delta 0 in every Java and
    # kafka-python producer; read the record anyway so a client that writes otherwise is still exact.
    for record in rows or ():
        if record.offset == offset:
            return int(record.timestamp)
    if batch.timestamp_type == DefaultRecordBatch.LOG_APPEND_TIME:
        return int(batch.max_timestamp)
    return int(batch.first_timestamp)
