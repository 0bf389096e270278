"""Reading a transaction's start batch from Fetch bytes (built with kafka-python's own record builder)."""

from __future__ import annotations

import struct

import pytest
from kafka.protocol.consumer import FetchRequest
from kafka.record.memory_records import MemoryRecordsBuilder

from admin.wire.fetch import FETCH_MAX_VERSION, READ_UNCOMMITTED, fetch_request, parse_start_batch
from admin.wire.types import StartBatch

pytestmark = pytest.mark.unit

T0 = 1_750_000_000_000


def batch(
    base_offset: int,
    timestamps: list[int],
    *,
    producer_id: int = 1000,
    producer_epoch: int = 5,
    transactional: bool = True,
    compression: int = 0,
    leader_epoch: int = 3,
) -> bytes:
    builder = MemoryRecordsBuilder(
        magic=2,
        compression_type=compression,
        batch_size=1 << 20,
        transactional=transactional,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=0,
    )
    for ts in timestamps:
        builder.append(ts, None, b"v")
    builder.close()
    data = bytearray(builder.buffer())
    # The broker assigns the base offset and the partitionLeaderEpoch (the epoch of the leader that appends it);
    # both are outside the CRC, so set them as the log would.
    struct.pack_into(">q", data, 0, base_offset)
    struct.pack_into(">i", data, 12, leader_epoch)
    return bytes(data)


def test_single_batch_at_the_start_offset() -> None:
    got = parse_start_batch(batch(100, [T0, T0 + 7]), 100)
    assert got == StartBatch(
        base_offset=100,
        producer_id=1000,
        producer_epoch=5,
        start_timestamp_ms=T0,
        max_timestamp_ms=T0 + 7,
        transactional=True,
        leader_epoch=3,
    )


def test_the_start_batchs_leader_epoch_is_the_one_it_was_appended_at() -> None:
    """The batch header's partitionLeaderEpoch: the leader epoch the batch was appended in (the batch holding the
    offset, not its neighbours'); -1 (a header that says none) is unknown."""
    data = batch(90, [T0 - 10], producer_id=1, leader_epoch=4) + batch(100, [T0, T0 + 1], leader_epoch=6)
    got = parse_start_batch(data, 101)
    assert got is not None and (got.base_offset, got.leader_epoch) == (100, 6)
    earlier = parse_start_batch(data, 90)
    assert earlier is not None and earlier.leader_epoch == 4
    unknown = parse_start_batch(batch(100, [T0], leader_epoch=-1), 100)
    assert unknown is not None and unknown.leader_epoch is None


def test_the_batch_containing_the_offset_among_several() -> None:
    data = batch(90, [T0 - 10, T0 - 9], producer_id=1) + batch(100, [T0], producer_epoch=6)
    got = parse_start_batch(data, 100)
    assert got is not None and (got.base_offset, got.producer_epoch, got.start_timestamp_ms) == (100, 6, T0)


def test_offset_inside_a_batch_uses_that_records_timestamp() -> None:
    got = parse_start_batch(batch(100, [T0, T0 + 3, T0 + 8]), 101)
    assert got is not None and (got.base_offset, got.start_timestamp_ms) == (100, T0 + 3)


def test_compressed_batch() -> None:
    got = parse_start_batch(batch(100, [T0 + 1, T0 + 2], compression=1), 100)  # gzip
    assert got is not None and got.start_timestamp_ms == T0 + 1


@pytest.mark.parametrize(
    ("data", "offset"),
    [
        pytest.param(b"", 100, id="empty-response"),
        pytest.param(None, 100, id="null-records"),
        pytest.param(batch(110, [T0]), 100, id="offset-gone-compacted"),
        pytest.param(batch(90, [T0]), 100, id="only-earlier-batches"),
        pytest.param(batch(100, [T0])[:40], 100, id="partial-batch-ignored"),
    ],
)
def test_no_batch(data: bytes | None, offset: int) -> None:
    assert parse_start_batch(data, offset) is None


def test_partial_trailing_batch_does_not_hide_a_complete_first_one() -> None:
    data = batch(100, [T0]) + batch(101, [T0 + 1])[:30]
    got = parse_start_batch(data, 100)
    assert got is not None and got.start_timestamp_ms == T0


def test_non_transactional_batch_is_reported_as_such() -> None:
    got = parse_start_batch(batch(100, [T0], transactional=False), 100)
    assert got is not None and not got.transactional


def test_fetch_request_fields() -> None:
    request = fetch_request(
        [("orders", 0, 100), ("orders", 3, 7), ("__consumer_offsets", 1, 5)],
        partition_max_bytes=1024,
        max_bytes=4096,
    )
    assert isinstance(request, FetchRequest)
    assert request.isolation_level == READ_UNCOMMITTED
    assert (request.max_wait_ms, request.min_bytes, request.max_bytes) == (0, 0, 4096)
    assert request.session_epoch == -1  # no fetch session
    assert request._max_version == FETCH_MAX_VERSION  # v13+ needs topic ids
    assert {
        t.topic: [(p.partition, p.fetch_offset, p.partition_max_bytes) for p in t.partitions]
        for t in request.topics
    } == {
        "orders": [(0, 100, 1024), (3, 7, 1024)],
        "__consumer_offsets": [(1, 5, 1024)],
    }


def test_fetch_request_is_fenced_at_the_leader_epochs_given() -> None:
    # current_leader_epoch (Fetch v9+, KIP-320): a broker that is not the leader at that epoch refuses
    # (FENCED_LEADER_EPOCH / UNKNOWN_LEADER_EPOCH) instead of answering from its own, possibly stale, log.
    request = fetch_request(
        [("orders", 0, 100), ("orders", 3, 7)],
        partition_max_bytes=1024,
        max_bytes=4096,
        leader_epochs={("orders", 0): 12},
    )
    assert {(p.partition, p.current_leader_epoch) for t in request.topics for p in t.partitions} == {
        (0, 12),
        (3, -1),  # unknown: not fenced
    }
    assert request._min_version == 9  # never sent in a version that would drop the epoch
    unfenced = fetch_request([("orders", 0, 100)], partition_max_bytes=1024, max_bytes=4096)
    assert [p.current_leader_epoch for t in unfenced.topics for p in t.partitions] == [-1]
    assert unfenced._min_version == 4
