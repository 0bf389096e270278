"""detectors/codec.py against hand-written wire bytes, properties, Kafka's schema (generic engine) and real records."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import importlib.util
import json
import pickle
import re
import struct
import sys
import tempfile
import warnings
import zipfile
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from detectors.codec import (
    ControlMarker,
    DecodeError,
    TxnLogKey,
    TxnLogValue,
    TxnStatus,
    decode_control_marker,
    decode_key,
    decode_value,
    decode_values,
    encode_control_marker,
    encode_key,
    encode_value,
)

pytestmark = pytest.mark.unit

RESOURCES = Path(__file__).resolve().parent / "resources"
ROOT = Path(__file__).resolve().parents[2]
T_START = 1_732_000_000_000
T_UPDATE = 1_732_000_005_000


def txn_value(**overrides: Any) -> TxnLogValue:
    fields: dict[str, Any] = {
        "version": 1,
        "producer_id": 12345,
        "producer_epoch": 7,
        "transaction_timeout_ms": 60_000,
        "status": TxnStatus.ONGOING,
        "partitions": (("orders", (0, 3)), ("payments", (11,))),
        "last_update_timestamp_ms": T_UPDATE,
        "start_timestamp_ms": T_START,
    }
    fields.update(overrides)
    return TxnLogValue(**fields)


def hexbytes(*parts: str) -> bytes:
    return bytes.fromhex("".join(parts))


# ------------------------------------------------------------------------------------ the wire format, by hand
# Every vector is written field by field, so these tests state the format independently of the encoder.

HEAD_V0 = "0000000000000000303900070000ea60"  # version 0, ProducerId 12345, epoch 7, timeout 60000
HEAD_V1 = "0001000000000000303900070000ea60"  # the same head as version 1
TIMES = "00000193433ebb8800000193433ea800"  # LastUpdateTimestampMs T_UPDATE, StartTimestampMs T_START
NO_START = "00000193433ea800ffffffffffffffff"  # LastUpdate T_START, Start -1 (what Empty carries)

VECTORS = [
    pytest.param(
        hexbytes(HEAD_V0, "00", "ffffffff", NO_START),  # Empty; TransactionPartitions null: int32 -1
        txn_value(version=0, status=TxnStatus.EMPTY, partitions=None, last_update_timestamp_ms=T_START,
                  start_timestamp_ms=-1),
        id="v0-empty-null-partitions",
    ),
    pytest.param(
        hexbytes(
            HEAD_V0, "01",  # Ongoing
            "00000002",  # int32 count: 2 topics
            "0006", "6f7264657273", "00000002", "00000000", "00000003",  # int16-length "orders", [0, 3]
            "0008", "7061796d656e7473", "00000001", "0000000b",  # "payments", [11]
            TIMES,
        ),
        txn_value(version=0),
        id="v0-ongoing-two-topics",
    ),
    pytest.param(
        hexbytes(HEAD_V0, "02", "00000001", "0005", "636166c3a9", "00000001", "00000002", TIMES),
        txn_value(version=0, status=TxnStatus.PREPARE_COMMIT, partitions=(("café", (2,)),)),
        id="v0-prepare-commit-utf8-topic",
    ),
    pytest.param(
        hexbytes(HEAD_V0, "04", "00000000", TIMES),  # CompleteCommit keeps an empty (not null) array
        txn_value(version=0, status=TxnStatus.COMPLETE_COMMIT, partitions=()),
        id="v0-complete-commit-empty-partitions",
    ),
    pytest.param(
        hexbytes(HEAD_V1, "00", "00", NO_START, "00"),  # compact null array is uvarint 0; no tagged fields
        txn_value(status=TxnStatus.EMPTY, partitions=None, last_update_timestamp_ms=T_START, start_timestamp_ms=-1),
        id="v1-empty-null-partitions",
    ),
    pytest.param(
        hexbytes(
            HEAD_V1, "01",
            "03",  # compact array: uvarint(2 + 1)
            "07", "6f7264657273", "03", "00000000", "00000003", "00",  # compact "orders", [0, 3], no entry tags
            "09", "7061796d656e7473", "02", "0000000b", "00",  # "payments", [11], no entry tags
            TIMES,
            "01", "02", "02", "0002",  # 1 tag: tag 2 (ClientTransactionVersion), size 2, value 2
        ),
        txn_value(client_transaction_version=2),
        id="v1-ongoing-two-topics-tv2",
    ),
    pytest.param(
        hexbytes(
            HEAD_V1, "02", "02", "07", "6f7264657273", "02", "00000001", "00", TIMES,
            "03",  # 3 tags, ascending
            "00", "08", "0000000000003038",  # PreviousProducerId 12344
            "01", "08", "000000000000303a",  # NextProducerId 12346
            "02", "02", "0002",  # ClientTransactionVersion 2
        ),
        txn_value(status=TxnStatus.PREPARE_COMMIT, partitions=(("orders", (1,)),), previous_producer_id=12344,
                  next_producer_id=12346, client_transaction_version=2),
        id="v1-prepare-commit-tags-0-1-2",
    ),
    pytest.param(
        hexbytes(
            HEAD_V1, "04", "01", TIMES,  # CompleteCommit, empty array: uvarint(0 + 1)
            "02", "02", "02", "0002",  # ClientTransactionVersion 2
            "09", "03", "78797a",  # tag 9, unknown to the codec: 3 bytes "xyz", kept
        ),
        txn_value(status=TxnStatus.COMPLETE_COMMIT, partitions=(), client_transaction_version=2,
                  unknown_tags=((9, b"xyz"),)),
        id="v1-complete-commit-unknown-tag-9",
    ),
    pytest.param(
        hexbytes(
            HEAD_V1, "01", "02", "02", "61",
            "8301", "".join(f"{i:08x}" for i in range(130)),  # 130 partitions: uvarint 131 takes 2 bytes
            "00", TIMES, "00",
        ),
        txn_value(partitions=(("a", tuple(range(130))),)),
        id="v1-multibyte-uvarint-count",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("data", "expected"), VECTORS)
def test_decode_value_reads_the_wire_format(data: bytes, expected: TxnLogValue) -> None:
    assert decode_value(data) == expected


@pytest.mark.parametrize(("data", "expected"), VECTORS)
def test_encode_value_writes_the_wire_format(data: bytes, expected: TxnLogValue) -> None:
    assert encode_value(expected) == data


def test_tombstone_is_none() -> None:
    assert decode_value(None) is None


def test_decoded_fields_have_the_documented_types() -> None:
    value = decode_value(hexbytes(HEAD_V1, "01", "02", "02", "61", "02", "00000004", "00", TIMES, "00"))
    assert value is not None
    assert type(value) is TxnLogValue
    assert value.status is TxnStatus.ONGOING
    assert value.partitions == (("a", (4,)),)
    assert isinstance(value.partitions[0][1], tuple)
    with pytest.raises(AttributeError):
        value.producer_id = 1  # type: ignore[misc]
    assert hash(value) == hash(txn_value(partitions=(("a", (4,)),)))


@pytest.mark.parametrize(("data", "expected"), VECTORS)
def test_decoded_values_pickle_copy_and_replace_like_any_instance(data: bytes, expected: TxnLogValue) -> None:
    # The hot path builds values without the dataclass __init__; they must be indistinguishable from built ones.
    value = decode_value(data)
    assert value is not None
    assert pickle.loads(pickle.dumps(value)) == expected
    assert copy.deepcopy(value) == expected
    assert dataclasses.replace(value, producer_epoch=99) == dataclasses.replace(expected, producer_epoch=99)
    assert repr(value) == repr(expected)


def test_bytearray_input_as_spark_gives_binary_columns() -> None:
    data = encode_value(txn_value(client_transaction_version=2))
    assert decode_value(bytearray(data)) == txn_value(client_transaction_version=2)
    assert decode_value(bytearray(encode_value(txn_value(version=0)))) == txn_value(version=0)
    assert decode_key(bytearray(encode_key(TxnLogKey("tx")))) == TxnLogKey("tx")
    assert decode_values([bytearray(data)]) == ([txn_value(client_transaction_version=2)], [])
    assert decode_control_marker(bytearray(b"\0\0\0\1"), bytearray(b"\0\0\0\0\0\7")) == ControlMarker(
        "COMMIT", 7
    )


@pytest.mark.parametrize(
    ("status", "name"),
    [
        (TxnStatus.EMPTY, "Empty"),
        (TxnStatus.ONGOING, "Ongoing"),
        (TxnStatus.PREPARE_COMMIT, "PrepareCommit"),
        (TxnStatus.PREPARE_ABORT, "PrepareAbort"),
        (TxnStatus.COMPLETE_COMMIT, "CompleteCommit"),
        (TxnStatus.COMPLETE_ABORT, "CompleteAbort"),
        (TxnStatus.DEAD, "Dead"),
        (TxnStatus.PREPARE_EPOCH_FENCE, "PrepareEpochFence"),
    ],
)
def test_status_codes_and_kafka_names(status: TxnStatus, name: str) -> None:
    assert status.kafka_name == name
    assert list(TxnStatus).index(status) == status.value  # codes 0..7 in Kafka's order


@pytest.mark.parametrize(
    ("data", "message"),
    [
        pytest.param(b"", r"truncated version at byte offset 0", id="empty"),
        pytest.param(hexbytes("0002", "00" * 15), r"unsupported value version 2", id="future-version"),
        pytest.param(hexbytes("ffff"), r"unsupported value version -1", id="negative-version"),
        pytest.param(hexbytes("0001", "00" * 8), r"truncated ProducerEpoch at byte offset 10", id="short-head"),
        pytest.param(hexbytes(HEAD_V1), r"truncated TransactionStatus at byte offset 16", id="no-status"),
        pytest.param(hexbytes(HEAD_V1, "08", "00", TIMES, "00"), r"unknown TransactionStatus 8 at byte offset 16",
                     id="status-8"),
        pytest.param(hexbytes(HEAD_V1, "ff", "00", TIMES, "00"), r"unknown TransactionStatus -1", id="status-neg"),
        pytest.param(hexbytes(HEAD_V1, "00", "00", TIMES, "00", "00"), r"1 trailing bytes .* byte offset 35",
                     id="v1-trailing-byte"),
        pytest.param(hexbytes(HEAD_V0, "00", "ffffffff", TIMES, "00"), r"1 trailing bytes .* byte offset 37",
                     id="v0-trailing-byte"),
        pytest.param(hexbytes(HEAD_V1, "00", "00", TIMES[:24]), r"truncated TransactionStartTimestampMs at byte "
                     r"offset 26", id="v1-short-timestamps"),
        pytest.param(hexbytes(HEAD_V1, "00", "00", TIMES), r"truncated tagged fields count \(uvarint\) at byte offset 34",
                     id="v1-missing-tag-section"),
        pytest.param(hexbytes(HEAD_V1, "00", "00", TIMES, "01", "02", "03", "000200"),
                     r"tag 2 \(ClientTransactionVersion\) has size 3, expected 2", id="tag-2-wrong-size"),
        pytest.param(hexbytes(HEAD_V1, "00", "00", TIMES, "01", "00", "04", "00000001"),
                     r"tag 0 \(PreviousProducerId\) has size 4, expected 8", id="tag-0-wrong-size"),
        pytest.param(hexbytes(HEAD_V1, "00", "00", TIMES, "02", "02", "02", "0002", "01", "08", "00" * 8),
                     r"tag 1 after tag 2 .*must be ascending", id="tags-descending"),
        pytest.param(hexbytes(HEAD_V1, "00", "00", TIMES, "02", "09", "00", "09", "00"),
                     r"tag 9 after tag 9", id="tag-repeated"),
        pytest.param(hexbytes(HEAD_V1, "00", "00", TIMES, "01", "09", "05", "0102"),
                     r"truncated tag 9 at byte offset 37", id="tag-payload-short"),
        pytest.param(hexbytes(HEAD_V1, "00", "00", TIMES, "05", "0000"), r"tagged field count 5 exceeds",
                     id="tag-count-too-big"),
        pytest.param(hexbytes(HEAD_V1, "00", "8080808080", "00"), r"longer than 5 bytes", id="uvarint-6-bytes"),
        pytest.param(hexbytes(HEAD_V1, "00", "ffffffff1f"), r"overflows 32 bits", id="uvarint-over-32-bits"),
        pytest.param(hexbytes(HEAD_V1, "00", "80"), r"truncated TransactionPartitions count \(uvarint\)",
                     id="uvarint-cut"),
        pytest.param(hexbytes(HEAD_V1, "00", "7f", "00" * 20), r"TransactionPartitions count 126 exceeds",
                     id="v1-count-beyond-buffer"),
        pytest.param(hexbytes(HEAD_V1, "01", "02", "00", "01", "00", TIMES, "00"), r"null Topic at byte offset 18",
                     id="v1-null-topic"),
        pytest.param(hexbytes(HEAD_V1, "01", "02", "02", "61", "00", "00", TIMES, "00"),
                     r"null PartitionIds at byte offset 20", id="v1-null-partition-ids"),
        pytest.param(hexbytes(HEAD_V1, "01", "02", "40", "61", "01", "00", TIMES, "00"),
                     r"truncated Topic at byte offset 19", id="v1-topic-beyond-buffer"),
        pytest.param(hexbytes(HEAD_V1, "01", "02", "02", "ff", "01", "00", TIMES, "00"),
                     r"invalid UTF-8 in Topic at byte offset 19", id="v1-bad-utf8"),
        pytest.param(hexbytes(HEAD_V1, "01", "02", "02", "61", "10", "00000001", "00", TIMES, "00"),
                     r"truncated PartitionIds", id="v1-ids-beyond-buffer"),
        pytest.param(hexbytes(HEAD_V1, "01", "02", "02", "61", "01", "01", "09", "40", "00", TIMES, "00"),
                     r"truncated PartitionsSchema tagged fields \(tag 9\)", id="v1-entry-tag-beyond-buffer"),
        pytest.param(hexbytes(HEAD_V0, "00", "fffffffe", TIMES), r"invalid TransactionPartitions count -2 at byte "
                     r"offset 17", id="v0-negative-count"),
        pytest.param(hexbytes(HEAD_V0, "01", "00000001", "ffff", "00000000", TIMES),
                     r"null Topic length at byte offset 21", id="v0-null-topic"),
        pytest.param(hexbytes(HEAD_V0, "01", "00000001", "0001", "61", "ffffffff", TIMES),
                     r"invalid PartitionIds count -1 at byte offset 24", id="v0-null-partition-ids"),
        pytest.param(hexbytes(HEAD_V0, "01", "00000001", "0001", "c3", "00000000", TIMES),
                     r"invalid UTF-8 in Topic at byte offset 23", id="v0-bad-utf8"),
        pytest.param(hexbytes(HEAD_V0, "01", "00000001", "0001", "61", "00000001"),
                     r"truncated PartitionIds at byte offset 28", id="v0-ids-cut"),
        pytest.param(hexbytes(HEAD_V0, "01", "7fffffff", TIMES), r"invalid TransactionPartitions count 2147483647",
                     id="v0-count-beyond-buffer"),
    ],
)  # fmt: skip
def test_decode_value_rejects_malformed_input(data: bytes, message: str) -> None:
    with pytest.raises(DecodeError, match=message):
        decode_value(data)


def test_decode_error_is_a_value_error() -> None:
    assert issubclass(DecodeError, ValueError)


def test_entry_tags_inside_partitions_are_skipped() -> None:
    # PartitionsSchema defines no tags; an unknown one inside an entry is skipped (not kept: nowhere to keep it).
    data = hexbytes(HEAD_V1, "01", "02", "02", "61", "02", "00000004", "01", "05", "02", "abcd", TIMES, "00")
    assert decode_value(data) == txn_value(partitions=(("a", (4,)),))


# ------------------------------------------------------------------------------------------------------ keys


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (hexbytes("0000", "0009", "74786e2d6170702d31"), TxnLogKey("txn-app-1")),
        (hexbytes("0000", "0005", "636166c3a9"), TxnLogKey("café")),
        (hexbytes("0000", "0000"), TxnLogKey("")),
    ],
)
def test_key_wire_format(data: bytes, expected: TxnLogKey) -> None:
    assert decode_key(data) == expected
    assert encode_key(expected) == data


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", r"truncated key version at byte offset 0"),
        (hexbytes("0001", "0001", "61"), r"unsupported key version 1"),
        (hexbytes("0003", "0001", "61"), r"unsupported key version 3"),
        (hexbytes("0000"), r"truncated TransactionalId length at byte offset 2"),
        (hexbytes("0000", "ffff"), r"null TransactionalId length -1 at byte offset 2"),
        (hexbytes("0000", "fffe"), r"negative TransactionalId length -2"),
        (hexbytes("0000", "0003", "6162"), r"truncated TransactionalId at byte offset 4"),
        (hexbytes("0000", "0001", "61", "62"), r"1 trailing bytes after the key at byte offset 5"),
        (hexbytes("0000", "0002", "61ff"), r"invalid UTF-8 in TransactionalId at byte offset 5"),
    ],
)
def test_decode_key_rejects_malformed_input(data: bytes, message: str) -> None:
    with pytest.raises(DecodeError, match=message):
        decode_key(data)


# ------------------------------------------------------------------------------------------ control markers


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        (hexbytes("0000", "0001"), hexbytes("0000", "00000005"), ControlMarker("COMMIT", 5)),
        (hexbytes("0000", "0000"), hexbytes("0000", "ffffffff"), ControlMarker("ABORT", -1)),
    ],
)
def test_control_marker_wire_format(key: bytes, value: bytes, expected: ControlMarker) -> None:
    assert decode_control_marker(key, value) == expected
    assert encode_control_marker(expected) == (key, value)


def test_control_marker_newer_version_reads_as_v0_like_kafka() -> None:
    # EndTransactionMarker.deserializeValue: versions above 0 are logged and parsed as their v0 prefix.
    assert decode_control_marker(
        hexbytes("0001", "0001"), hexbytes("0001", "00000009", "ffff")
    ) == ControlMarker("COMMIT", 9)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        (hexbytes("0000", "0002"), hexbytes("0000", "00000000"), r"control record type 2 .* not a transaction marker"),
        (hexbytes("0000"), hexbytes("0000", "00000000"), r"truncated control record key"),
        (hexbytes("ffff", "0001"), hexbytes("0000", "00000000"), r"negative control record key version -1"),
        (hexbytes("0000", "0001"), hexbytes("0000", "0000"), r"truncated transaction marker value"),
        (hexbytes("0000", "0001"), hexbytes("8000", "00000000"), r"negative transaction marker value version"),
    ],
)  # fmt: skip
def test_control_marker_rejects_malformed_input(key: bytes, value: bytes, message: str) -> None:
    with pytest.raises(DecodeError, match=message):
        decode_control_marker(key, value)


# ------------------------------------------------------------------------------------------ encoder contract


@pytest.mark.parametrize(
    ("value", "message"),
    [
        pytest.param(txn_value(version=0, previous_producer_id=5), r"v0 value cannot carry tagged", id="v0-tag"),
        pytest.param(txn_value(version=0, client_transaction_version=2), r"v0 value cannot", id="v0-ctv"),
        pytest.param(txn_value(version=0, unknown_tags=((9, b"x"),)), r"v0 value cannot", id="v0-unknown-tag"),
        pytest.param(txn_value(version=2), r"unsupported value version 2", id="version-2"),
        pytest.param(txn_value(unknown_tags=((2, b"\x00\x01"),)), r"unknown tag 2 must be > 2", id="known-number"),
        pytest.param(txn_value(unknown_tags=((9, b""), (4, b""))), r"unknown tag 4 must be > 2, ascending",
                     id="unknown-descending"),
        pytest.param(txn_value(unknown_tags=((2**32, b""),)), r"fit in 32 bits", id="tag-too-big"),
        pytest.param(txn_value(producer_id=2**63), r"out of range", id="pid-int64-overflow"),
        pytest.param(txn_value(partitions=(("t", (2**31,)),)), r"PartitionIds out of range", id="id-overflow"),
        pytest.param(txn_value(partitions=(("x" * 32768, ()),)), r"Topic is 32768 bytes long", id="long-topic"),
        pytest.param(txn_value(status=8), r"unknown TransactionStatus 8", id="status-8"),
    ],
)  # fmt: skip
def test_encode_value_rejects_what_kafka_cannot_carry(value: TxnLogValue, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        encode_value(value)


def test_encoders_reject_bad_keys_and_markers() -> None:
    with pytest.raises(ValueError, match="unsupported key version 1"):
        encode_key(TxnLogKey("a", version=1))
    with pytest.raises(ValueError, match="coordinator_epoch out of range"):
        encode_control_marker(ControlMarker("ABORT", 2**31))
    with pytest.raises(ValueError, match="unknown transaction marker kind"):
        encode_control_marker(ControlMarker("PAUSE", 0))  # type: ignore[arg-type]


def test_decode_values_keeps_good_rows_and_reports_bad_ones() -> None:
    good = encode_value(txn_value())
    decoded, errors = decode_values([good, None, b"\x00\x05", good[:-1], good])
    assert decoded == [txn_value(), None, None, None, txn_value()]
    assert [i for i, _ in errors] == [2, 3]
    assert "unsupported value version 5" in errors[0][1]
    assert re.search(r"truncated .* at byte offset \d+", errors[1][1])


# ------------------------------------------------------------------------------------------------ properties

# Timing limits flake on a loaded CI host; the truncation test alone decodes thousands of prefixes.
NO_DEADLINE = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
INT16 = st.integers(-(2**15), 2**15 - 1)
INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)
# Any string Kafka can carry (no lone surrogates: they have no UTF-8 form); the codec doesn't police topic names.
UTF8_CHARS = st.characters(codec="utf-8")
TEXT = st.text(UTF8_CHARS, max_size=12) | st.text("xy", min_size=126, max_size=140)
PARTITIONS = st.lists(
    st.tuples(
        TEXT, st.lists(INT32, max_size=5).map(tuple) | st.lists(INT32, min_size=120, max_size=140).map(tuple)
    ),
    max_size=4,
).map(tuple)


SMALL_BINARY = st.binary(max_size=10)


def unknown_tags(payloads: st.SearchStrategy[bytes] = SMALL_BINARY) -> st.SearchStrategy[Any]:
    return st.dictionaries(st.integers(3, 2**32 - 1) | st.integers(3, 200), payloads, max_size=3).map(
        lambda tags: tuple(sorted(tags.items()))
    )


@st.composite
def txn_values(draw: st.DrawFn, versions: tuple[int, ...] = (0, 1), tags: Any = None) -> TxnLogValue:
    version = draw(st.sampled_from(versions))
    flexible = version == 1
    return TxnLogValue(
        version=version,
        producer_id=draw(INT64),
        producer_epoch=draw(INT16),
        transaction_timeout_ms=draw(INT32),
        status=draw(st.sampled_from(TxnStatus)),
        partitions=draw(st.none() | PARTITIONS),
        last_update_timestamp_ms=draw(INT64),
        start_timestamp_ms=draw(INT64),
        previous_producer_id=draw(st.just(-1) | INT64) if flexible else -1,
        next_producer_id=draw(st.just(-1) | INT64) if flexible else -1,
        client_transaction_version=draw(st.just(0) | INT16) if flexible else 0,
        unknown_tags=draw(tags if tags is not None else unknown_tags()) if flexible else (),
    )


@NO_DEADLINE
@given(txn_values())
def test_round_trip(value: TxnLogValue) -> None:
    data = encode_value(value)
    assert decode_value(data) == value
    assert decode_values([data]) == ([value], [])


@NO_DEADLINE
@given(st.text(UTF8_CHARS, max_size=300))
def test_key_round_trip(transactional_id: str) -> None:
    assert decode_key(encode_key(TxnLogKey(transactional_id))) == TxnLogKey(transactional_id)


@NO_DEADLINE
@given(st.sampled_from(["ABORT", "COMMIT"]), INT32)
def test_control_marker_round_trip(kind: Any, epoch: int) -> None:
    marker = ControlMarker(kind, epoch)
    assert decode_control_marker(*encode_control_marker(marker)) == marker


def _decode_only_raises_decode_error(data: bytes) -> None:
    try:
        value = decode_value(data)
    except DecodeError:
        return
    assert value is not None
    assert decode_value(encode_value(value)) == value  # whatever decodes is something the encoder can write


@NO_DEADLINE
@given(st.binary(max_size=120))
def test_arbitrary_bytes_raise_only_decode_error(data: bytes) -> None:
    _decode_only_raises_decode_error(data)


@NO_DEADLINE
@given(st.sampled_from([b"\x00\x00", b"\x00\x01"]), st.binary(min_size=15, max_size=120))
def test_arbitrary_bodies_raise_only_decode_error(version: bytes, body: bytes) -> None:
    _decode_only_raises_decode_error(version + body)


@NO_DEADLINE
@given(txn_values(), st.data())
def test_mutated_values_raise_only_decode_error(value: TxnLogValue, data: st.DataObject) -> None:
    raw = bytearray(encode_value(value))
    for _ in range(data.draw(st.integers(1, 3))):
        pos = data.draw(st.integers(0, len(raw)))
        action = data.draw(st.sampled_from(["set", "insert", "delete"]))
        if action == "insert":
            raw[pos:pos] = data.draw(st.binary(min_size=1, max_size=3))
        elif pos < len(raw):
            if action == "set":
                raw[pos] = data.draw(st.integers(0, 255))
            else:
                del raw[pos]
    _decode_only_raises_decode_error(bytes(raw))


@settings(NO_DEADLINE, max_examples=50)
@given(txn_values())
def test_every_truncation_raises_decode_error(value: TxnLogValue) -> None:
    data = encode_value(value)
    for cut in range(len(data)):
        with pytest.raises(DecodeError):
            decode_value(data[:cut])


@NO_DEADLINE
@given(st.binary(max_size=40))
def test_arbitrary_keys_raise_only_decode_error(data: bytes) -> None:
    try:
        key = decode_key(data)
    except DecodeError:
        return
    assert encode_key(key) == data  # a key has one encoding: accepted bytes re-encode exactly


@NO_DEADLINE
@given(st.binary(max_size=8), st.binary(max_size=8))
def test_arbitrary_markers_raise_only_decode_error(key: bytes, value: bytes) -> None:
    with contextlib.suppress(DecodeError):
        decode_control_marker(key, value)


# ------------------------------------------------------- oracle: kafka-python's generic engine + Kafka's schema


def _patch_schema(cls: type, schema: dict[str, Any]) -> dict[str, Any]:
    # The engine only builds "data" types and wants `versions` beside `taggedVersions` (notes section 8).
    schema["type"] = "data"
    for field in schema["fields"]:
        if "taggedVersions" in field and "versions" not in field:
            field["versions"] = field["taggedVersions"]
    return schema


def _schemas_from_kafka_jar() -> Path:
    """Kafka's own TransactionLog{Key,Value}.json, read from the broker jar the test bed runs (make jars)."""
    jars = sorted((ROOT / ".cache" / "jars" / "kafka").glob("kafka-transaction-coordinator-*.jar"))
    assert jars, "no kafka-transaction-coordinator jar: run `make jars`"
    package = Path(tempfile.mkdtemp(prefix="txnwatch-codec-schemas-"))
    with zipfile.ZipFile(jars[-1]) as jar:
        for name in ("TransactionLogKey.json", "TransactionLogValue.json"):
            (package / name).write_bytes(jar.read(f"common/message/{name}"))
    (package / "__init__.py").write_text("")
    return package


@cache
def oracle() -> tuple[Any, Any]:
    """ApiData classes for TransactionLog{Key,Value} from Kafka 4.3.1's own JSON (in its jar)."""
    with warnings.catch_warnings():
        # kafka-python's load_json uses importlib.resources.read_text, deprecated since Python 3.11.
        warnings.simplefilter("ignore", DeprecationWarning)
        from kafka.protocol.api_data import ApiData

        schemas = _schemas_from_kafka_jar()
        name = "txnwatch_codec_schemas"  # load_json reads via importlib.resources, so the folder must be a package
        spec = importlib.util.spec_from_file_location(
            name, schemas / "__init__.py", submodule_search_locations=[str(schemas)]
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)

        class TransactionLogValue(ApiData, load_json=name):  # type: ignore[misc, call-arg]
            json_patch: Any = classmethod(_patch_schema)

        class TransactionLogKey(ApiData, load_json=name):  # type: ignore[misc, call-arg]
            json_patch: Any = classmethod(_patch_schema)

    return TransactionLogKey, TransactionLogValue


def from_oracle(decoded: Any) -> TxnLogValue:
    """The engine's decode as our model; Kafka 4.3.1 names tag 3 (NextProducerEpoch), we keep it as unknown."""
    flexible = decoded.version == 1
    tags = [(int(name[1:]), payload) for name, payload in (decoded.unknown_tags or {}).items()]
    if flexible and decoded.next_producer_epoch != -1:
        tags.append((3, struct.pack(">h", decoded.next_producer_epoch)))
    parts = decoded.transaction_partitions
    return TxnLogValue(
        version=decoded.version,
        producer_id=decoded.producer_id,
        producer_epoch=decoded.producer_epoch,
        transaction_timeout_ms=decoded.transaction_timeout_ms,
        status=TxnStatus(decoded.transaction_status),
        partitions=None if parts is None else tuple((p.topic, tuple(p.partition_ids)) for p in parts),
        last_update_timestamp_ms=decoded.transaction_last_update_timestamp_ms,
        start_timestamp_ms=decoded.transaction_start_timestamp_ms,
        previous_producer_id=decoded.previous_producer_id if flexible else -1,
        next_producer_id=decoded.next_producer_id if flexible else -1,
        client_transaction_version=decoded.client_transaction_version if flexible else 0,
        unknown_tags=tuple(sorted(tags)),
    )


def to_oracle(value: TxnLogValue) -> Any:
    """Our model as an engine object (only tag 3 among unknown tags: the engine re-encodes no unknown tags)."""
    extra = dict(value.unknown_tags)
    return oracle()[1](
        version=value.version,
        producer_id=value.producer_id,
        previous_producer_id=value.previous_producer_id,
        next_producer_id=value.next_producer_id,
        producer_epoch=value.producer_epoch,
        next_producer_epoch=struct.unpack(">h", extra[3])[0] if 3 in extra else -1,
        transaction_timeout_ms=value.transaction_timeout_ms,
        transaction_status=int(value.status),
        transaction_partitions=None
        if value.partitions is None
        else [(t, list(ids)) for t, ids in value.partitions],
        transaction_last_update_timestamp_ms=value.last_update_timestamp_ms,
        transaction_start_timestamp_ms=value.start_timestamp_ms,
        client_transaction_version=value.client_transaction_version,
    )


# Tag 3 is NextProducerEpoch (int16) in Kafka 4.3.1, so for the engine it must be 2 bytes and not the default -1.
ORACLE_TAGS = unknown_tags(st.binary(max_size=6)).map(
    lambda tags: tuple(t for t in tags if t[0] != 3)
) | st.builds(
    lambda epoch, rest: ((3, struct.pack(">h", epoch)), *(t for t in rest if t[0] > 3)),
    INT16.filter(lambda e: e != -1),
    unknown_tags(),
)
ORACLE_SETTINGS = NO_DEADLINE
# The oracle reads Kafka's own schemas from the broker jar: `make test` runs it, `make test-unit` (no jars) leaves
# it out by this mark.
JARS = pytest.mark.jars


@JARS
@ORACLE_SETTINGS
@given(txn_values(tags=ORACLE_TAGS))
def test_oracle_decodes_our_encoding_the_same(value: TxnLogValue) -> None:
    assert from_oracle(oracle()[1].decode(encode_value(value))) == value


@JARS
@ORACLE_SETTINGS
@given(txn_values(tags=ORACLE_TAGS.map(lambda tags: tuple(t for t in tags if t[0] == 3))))
def test_oracle_encodes_the_same_bytes(value: TxnLogValue) -> None:
    # The engine writes tags in schema order (NextProducerEpoch, tag 3, before tag 2); Kafka's generated
    # TransactionLogValue.write() writes them ascending (checked with javap on the 4.3.1 jar), as we do.
    assume(value.client_transaction_version == 0 or not value.unknown_tags)
    encoded = to_oracle(value).encode()
    assert encoded == encode_value(value)
    assert decode_value(encoded) == value


@JARS
@ORACLE_SETTINGS
@given(txn_values(tags=ORACLE_TAGS), st.data())
def test_oracle_agrees_whenever_we_accept_mutated_bytes(value: TxnLogValue, data: st.DataObject) -> None:
    raw = bytearray(encode_value(value))
    pos = data.draw(st.integers(0, len(raw) - 1))
    raw[pos] = data.draw(st.integers(0, 255))
    try:
        ours = decode_value(bytes(raw))
    except DecodeError:
        return
    theirs = oracle()[1].decode(bytes(raw))
    assert ours is not None
    if not any(
        t == 3 and len(p) != 2 for t, p in ours.unknown_tags
    ):  # the engine reads tag 3 by type, not size
        assert from_oracle(theirs) == ours


@JARS
@ORACLE_SETTINGS
@given(st.text(UTF8_CHARS, max_size=50))
def test_oracle_key(transactional_id: str) -> None:
    key_class = oracle()[0]
    assert key_class(version=0, transactional_id=transactional_id).encode() == encode_key(
        TxnLogKey(transactional_id)
    )
    assert key_class.decode(encode_key(TxnLogKey(transactional_id))).transactional_id == transactional_id


# ------------------------------------------------------------------------ golden records from a real broker

GOLDEN = sorted(RESOURCES.glob("txnlog_tv*.json"))
EXPECTED_STATES = {  # consecutive repeats (one Ongoing record per AddPartitionsToTxn) collapsed
    "commit": ["Empty", "Ongoing", "PrepareCommit", "CompleteCommit"],
    "abort": ["Empty", "Ongoing", "PrepareAbort", "CompleteAbort"],
    "two-commits": ["Empty", "Ongoing", "PrepareCommit", "CompleteCommit", "Ongoing", "PrepareCommit",
                    "CompleteCommit"],
    "fenced": ["Empty", "Ongoing", "PrepareAbort", "CompleteAbort", "Empty"],
}  # fmt: skip


def load_golden(
    path: Path,
) -> tuple[dict[str, Any], list[tuple[dict[str, Any], TxnLogKey, TxnLogValue | None]]]:
    fixture = json.loads(path.read_text())
    rows = []
    for record in fixture["records"]:
        raw_value = None if record["value"] is None else bytes.fromhex(record["value"])
        rows.append((record, decode_key(bytes.fromhex(record["key"])), decode_value(raw_value)))
    return fixture, rows


def test_golden_fixtures_exist() -> None:
    assert {"txnlog_tv0.json", "txnlog_tv2.json"} <= {p.name for p in GOLDEN}


@pytest.mark.parametrize("path", GOLDEN, ids=lambda p: p.stem)
def test_golden_records_decode_and_reencode_exactly(path: Path) -> None:
    fixture, rows = load_golden(path)
    expected_version = 0 if fixture["transaction_version"] == 0 else 1
    for record, key, value in rows:
        assert encode_key(key).hex() == record["key"]
        if value is None:
            assert record["value"] is None
            continue
        assert value.version == expected_version
        assert encode_value(value).hex() == record["value"]


@pytest.mark.parametrize("path", GOLDEN, ids=lambda p: p.stem)
def test_golden_records_tell_each_scenario(path: Path) -> None:
    fixture, rows = load_golden(path)
    for tid, scenario in fixture["transactional_ids"].items():
        values = [v for _, k, v in rows if k.transactional_id == tid]
        live = [v for v in values if v is not None]
        states = [v.status.kafka_name for v in live]
        collapsed = [s for i, s in enumerate(states) if i == 0 or s != states[i - 1]]
        assert collapsed == EXPECTED_STATES[scenario["scenario"]], tid
        assert None not in values or values[-1] is None, "a tombstone is the id's last record"
        assert len({v.producer_id for v in live}) == 1
        for value in live:
            if value.status is TxnStatus.EMPTY:
                assert value.partitions is None and value.start_timestamp_ms == -1
            elif value.status in (TxnStatus.COMPLETE_COMMIT, TxnStatus.COMPLETE_ABORT):
                assert value.partitions == ()
            else:
                assert value.partitions and value.start_timestamp_ms <= value.last_update_timestamp_ms
        prepared = [v for v in live if v.status in (TxnStatus.PREPARE_COMMIT, TxnStatus.PREPARE_ABORT)]
        touched = {(t, p) for v in prepared for t, ids in v.partitions or () for p in ids}
        assert touched == {(t, p) for t, ids in scenario["partitions"].items() for p in ids}, tid
        if (
            scenario["scenario"] == "fenced"
        ):  # the second producer's init bumps the epoch past the aborted one
            assert [v.producer_epoch for v in live] == [0, 0, 1, 1, 2]
    assert any(v is None for _, _, v in rows), "the capture waited for expiry, so tombstones are expected"


@pytest.mark.parametrize("path", GOLDEN, ids=lambda p: p.stem)
def test_golden_records_match_kafkas_own_formatter(path: Path) -> None:
    _, rows = load_golden(path)
    checked = 0
    for record, key, value in rows:
        if "kafka_formatter" not in record:
            continue
        kafka = record["kafka_formatter"]
        assert kafka["key"]["data"]["transactionalId"] == key.transactional_id
        if value is None:
            assert kafka["value"] is None
            continue
        data = kafka["value"]["data"]
        assert kafka["value"]["version"] == value.version
        parts = data["transactionPartitions"]
        assert (
            data["producerId"],
            data["producerEpoch"],
            data["transactionTimeoutMs"],
            data["transactionStatus"],
            None if parts is None else tuple((p["topic"], tuple(p["partitionIds"])) for p in parts),
            data["transactionLastUpdateTimestampMs"],
            data["transactionStartTimestampMs"],
            data.get("previousProducerId", -1),
            data.get("nextProducerId", -1),
            data.get("clientTransactionVersion", 0),
        ) == (
            value.producer_id,
            value.producer_epoch,
            value.transaction_timeout_ms,
            value.status.value,
            value.partitions,
            value.last_update_timestamp_ms,
            value.start_timestamp_ms,
            value.previous_producer_id,
            value.next_producer_id,
            value.client_transaction_version,
        )
        checked += 1
    assert checked >= 10
