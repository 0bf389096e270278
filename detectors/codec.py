"""Codec for `__transaction_state` keys/values (v0, flexible v1) and transaction marker control records.

Pure and stdlib-only; layouts follow Kafka's TransactionLogKey/Value.json and EndTransactionMarker.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Literal, cast


class DecodeError(ValueError):
    """Bytes that are not a valid record; the message names the field and the byte offset."""


class TxnStatus(IntEnum):
    """Coordinator-side transaction state, as the int8 `TransactionStatus` byte."""

    EMPTY = 0
    ONGOING = 1
    PREPARE_COMMIT = 2
    PREPARE_ABORT = 3
    COMPLETE_COMMIT = 4
    COMPLETE_ABORT = 5
    DEAD = 6
    PREPARE_EPOCH_FENCE = 7

    @property
    def kafka_name(self) -> str:
        """Kafka's own name for the state (`TransactionState`), e.g. "PrepareCommit"."""
        return _KAFKA_NAMES[self.value]


_KAFKA_NAMES = (
    "Empty",
    "Ongoing",
    "PrepareCommit",
    "PrepareAbort",
    "CompleteCommit",
    "CompleteAbort",
    "Dead",
    "PrepareEpochFence",
)
# Indexed by the status byte: a tuple lookup is cheaper than calling the enum on the hot path.
_STATUSES = tuple(TxnStatus)

Partitions = tuple[tuple[str, tuple[int, ...]], ...]
# What the decoders read: `bytes`, or the `bytearray` PySpark hands to Python for binary columns.
RawBytes = bytes | bytearray


@dataclass(frozen=True, slots=True)
class TxnLogKey:
    """Key of a `__transaction_state` record."""

    transactional_id: str
    version: int = 0


@dataclass(frozen=True, slots=True)
class TxnLogValue:
    """Value of a `__transaction_state` record (TransactionLogValue v0 or v1).

    `partitions` is None for a null array (what the coordinator writes for Empty). The three tagged fields
    exist only in v1; `unknown_tags` keeps top-level tags this codec does not know, so re-encoding is
    byte-exact: Kafka 4.3's NextProducerEpoch (tag 3, int16) lands there. Tags inside PartitionsSchema
    entries, which Kafka does not define, are skipped.
    """

    version: int
    producer_id: int
    producer_epoch: int
    transaction_timeout_ms: int
    status: TxnStatus
    partitions: Partitions | None
    last_update_timestamp_ms: int
    start_timestamp_ms: int
    previous_producer_id: int = -1
    next_producer_id: int = -1
    client_transaction_version: int = 0
    unknown_tags: tuple[tuple[int, bytes], ...] = ()


@dataclass(frozen=True, slots=True)
class ControlMarker:
    """A COMMIT or ABORT control record that ends a transaction on a data partition."""

    kind: Literal["ABORT", "COMMIT"]
    coordinator_epoch: int


# Precompiled layouts. Both value versions share the 17-byte head: version, pid, epoch, timeout, status.
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_HEAD = struct.Struct(">hqhib")
_TIMES = struct.Struct(">qq")
_MARKER_KEY = struct.Struct(">hh")
_MARKER_VALUE = struct.Struct(">hi")
_HEAD_SIZE = _HEAD.size
# (start offset, field) of the head, last first: used to name the field a short record cuts off.
_HEAD_FIELDS = (
    (16, "TransactionStatus"),
    (12, "TransactionTimeoutMs"),
    (10, "ProducerEpoch"),
    (2, "ProducerId"),
)
# Partition id arrays are short (a few partitions per topic), so cache their Structs by length.
_INT32_ARRAYS = tuple(struct.Struct(f">{i}i") for i in range(64))

_MAX_STRING = 0x7FFF  # Kafka rejects longer strings (int16 length, also enforced for compact strings)
_MAX_UVARINT = 0xFFFFFFFF
_TAG_PREVIOUS_PRODUCER_ID = 0
_TAG_NEXT_PRODUCER_ID = 1
_TAG_CLIENT_TRANSACTION_VERSION = 2
_KNOWN_TAG_SIZES = (8, 8, 2)
_KNOWN_TAG_NAMES = ("PreviousProducerId", "NextProducerId", "ClientTransactionVersion")
_MARKER_KINDS: tuple[Literal["ABORT", "COMMIT"], ...] = ("ABORT", "COMMIT")


# ------------------------------------------------------------------------------------ decoding helpers


def _truncated(field: str, pos: int, n: int) -> DecodeError:
    return DecodeError(f"truncated {field} at byte offset {pos} (record is {n} bytes)")


def _uvarint(data: RawBytes, pos: int, field: str) -> tuple[int, int]:
    """Slow path for a multi-byte unsigned LEB128 varint; callers inline the single-byte case."""
    value = 0
    for i in range(5):
        if pos + i >= len(data):
            raise _truncated(f"{field} (uvarint)", pos, len(data))
        b = data[pos + i]
        value |= (b & 0x7F) << (7 * i)
        if not b & 0x80:
            if value > _MAX_UVARINT:
                raise DecodeError(f"uvarint for {field} at byte offset {pos} overflows 32 bits")
            return value, pos + i + 1
    raise DecodeError(f"uvarint for {field} at byte offset {pos} is longer than 5 bytes")


def _utf8(data: RawBytes, pos: int, end: int, field: str) -> str:
    try:
        return data[pos:end].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DecodeError(f"invalid UTF-8 in {field} at byte offset {pos + exc.start}") from None


def _skip_struct_tags(data: RawBytes, pos: int, field: str) -> int:
    """Skip a PartitionsSchema tagged section: Kafka defines no tags there, so any present are unknown."""
    n = len(data)
    num, pos = _uvarint(data, pos, field)
    prev = -1
    for _ in range(num):
        tag, pos = _uvarint(data, pos, field)
        if tag <= prev:
            raise DecodeError(f"tag {tag} after tag {prev} in {field} at byte offset {pos}: not ascending")
        prev = tag
        size, pos = _uvarint(data, pos, field)
        if pos + size > n:
            raise _truncated(f"{field} (tag {tag})", pos, n)
        pos += size
    return pos


def _head_error(data: RawBytes) -> DecodeError:
    """The error for a value whose 17-byte head the fast path refused: short, unknown version or status."""
    n = len(data)
    if n < 2:
        return _truncated("version", 0, n)
    version = _I16.unpack_from(data, 0)[0]
    if version not in (0, 1):
        return DecodeError(f"unsupported value version {version}")
    if n < _HEAD_SIZE:
        pos, field = next((p, f) for p, f in _HEAD_FIELDS if p <= n)
        return _truncated(field, pos, n)
    return DecodeError(f"unknown TransactionStatus {_HEAD.unpack_from(data, 0)[4]} at byte offset 16")


# -------------------------------------------------------------------------------------------- decoding


def decode_key(data: RawBytes) -> TxnLogKey:
    """Decode a `__transaction_state` record key.

    Args:
        data: raw key bytes: int16 version (0; newer brokers write the same bytes as a record-type prefix),
            then an int16-length UTF-8 transactional id.

    Returns:
        The decoded key.

    Raises:
        DecodeError: on any malformed input (wrong version, null or truncated id, trailing bytes, bad UTF-8).
    """
    n = len(data)
    if n < 2:
        raise _truncated("key version", 0, n)
    version = _I16.unpack_from(data, 0)[0]
    if version != 0:
        raise DecodeError(f"unsupported key version {version}")
    if n < 4:
        raise _truncated("TransactionalId length", 2, n)
    length = _I16.unpack_from(data, 2)[0]
    if length < 0:
        raise DecodeError(
            f"{'null' if length == -1 else 'negative'} TransactionalId length {length} at byte offset 2"
        )
    end = 4 + length
    if end > n:
        raise _truncated("TransactionalId", 4, n)
    if end < n:
        raise DecodeError(f"{n - end} trailing bytes after the key at byte offset {end}")
    return TxnLogKey(_utf8(data, 4, end, "TransactionalId"))


def decode_value(data: RawBytes | None) -> TxnLogValue | None:
    """Decode a `__transaction_state` record value (TransactionLogValue v0 or v1).

    Args:
        data: raw value bytes, or None for a tombstone (the coordinator expired the transactional id).

    Returns:
        The decoded value, or None for a tombstone.

    Raises:
        DecodeError: on any malformed input; the message names the field and byte offset.
    """
    if data is None:
        return None
    n = len(data)
    if n >= _HEAD_SIZE:
        version, pid, epoch, timeout, status = _HEAD.unpack_from(data, 0)
        if 0 <= status <= 7:
            if version == 1:
                return _decode_v1(data, n, pid, epoch, timeout, status)
            if version == 0:
                return _decode_v0(data, n, pid, epoch, timeout, status)
    raise _head_error(data)


class _ValueShell:
    """TxnLogValue's slot layout without the frozen `__setattr__`, for the hot paths.

    A frozen dataclass's `__init__` sets each field through `object.__setattr__` (about 3 us for 12 fields);
    filling this shell and then assigning `__class__` (allowed: identical slots) costs about a third of that.
    `__init__` must set every field; the wire-vector and pickle tests fail if a new field is forgotten.
    """

    __slots__ = TxnLogValue.__slots__

    def __init__(
        self,
        version: int,
        pid: int,
        epoch: int,
        timeout: int,
        status: TxnStatus,
        partitions: Partitions | None,
        last_update: int,
        start: int,
        previous_producer_id: int,
        next_producer_id: int,
        client_transaction_version: int,
    ) -> None:
        self.version = version
        self.producer_id = pid
        self.producer_epoch = epoch
        self.transaction_timeout_ms = timeout
        self.status = status
        self.partitions = partitions
        self.last_update_timestamp_ms = last_update
        self.start_timestamp_ms = start
        self.previous_producer_id = previous_producer_id
        self.next_producer_id = next_producer_id
        self.client_transaction_version = client_transaction_version
        self.unknown_tags: tuple[tuple[int, bytes], ...] = ()


def _decode_v1(data: RawBytes, n: int, pid: int, epoch: int, timeout: int, status_id: int) -> TxnLogValue:
    # The streaming job's per-record path: one function, single-byte uvarints inlined. Truncation surfaces as
    # IndexError/struct.error and is translated once, using `field` and `pos` at the failing read.
    status = _STATUSES[status_id]
    pos = _HEAD_SIZE
    field = "TransactionPartitions count"
    partitions: Partitions | None
    try:
        b = data[pos]
        if b < 0x80:
            pos += 1
        else:
            b, pos = _uvarint(data, pos, field)
        if b == 0:
            partitions = None
        else:
            count = b - 1
            # Each entry takes at least 3 bytes (topic length, ids count, tag count).
            if count * 3 > n - pos:
                raise DecodeError(
                    f"TransactionPartitions count {count} exceeds the record at byte offset {pos}"
                )
            parts = []
            for _ in range(count):
                field = "Topic length"
                b = data[pos]
                if b < 0x80:
                    pos += 1
                else:
                    b, pos = _uvarint(data, pos, field)
                if b == 0:
                    raise DecodeError(f"null Topic at byte offset {pos - 1}")
                end = pos + b - 1
                if end > n:
                    raise _truncated("Topic", pos, n)
                if b > _MAX_STRING + 1:
                    raise DecodeError(f"Topic length {b - 1} exceeds {_MAX_STRING} at byte offset {pos}")
                try:
                    topic = data[pos:end].decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise DecodeError(f"invalid UTF-8 in Topic at byte offset {pos + exc.start}") from None
                pos = end
                field = "PartitionIds count"
                b = data[pos]
                if b < 0x80:
                    pos += 1
                else:
                    b, pos = _uvarint(data, pos, field)
                if b == 0:
                    raise DecodeError(f"null PartitionIds at byte offset {pos - 1}")
                b -= 1
                if b * 4 > n - pos:
                    raise _truncated("PartitionIds", pos, n)
                ids: tuple[int, ...] = (_INT32_ARRAYS[b] if b < 64 else struct.Struct(f">{b}i")).unpack_from(
                    data, pos
                )
                pos += 4 * b
                field = "PartitionsSchema tagged fields"
                if data[pos] == 0:
                    pos += 1
                else:
                    pos = _skip_struct_tags(data, pos, field)
                parts.append((topic, ids))
            partitions = tuple(parts)
        field = "TransactionLastUpdateTimestampMs"
        last_update, start = _TIMES.unpack_from(data, pos)
        pos += 16
    except (IndexError, struct.error):
        if field == "TransactionLastUpdateTimestampMs" and n - pos >= 8:
            field, pos = "TransactionStartTimestampMs", pos + 8
        raise _truncated(field, pos, n) from None
    # Tagged fields. The loop takes what brokers write (tags 0-2 with one-byte headers, ascending, right sizes)
    # without raising; anything else, malformed sections included, goes to the checked decoder.
    tags_at = pos
    previous_pid = next_pid = -1
    ctv = 0
    if pos < n and data[pos] < 0x80:
        last = -1
        pos += 1
        for _ in range(data[tags_at]):
            if pos + 4 > n:
                break
            tag = data[pos]
            if (
                tag > 2
                or tag <= last
                or data[pos + 1] != _KNOWN_TAG_SIZES[tag]
                or pos + 2 + data[pos + 1] > n
            ):
                break
            if tag == _TAG_CLIENT_TRANSACTION_VERSION:
                ctv = _I16.unpack_from(data, pos + 2)[0]
                pos += 4
            elif tag == _TAG_PREVIOUS_PRODUCER_ID:
                previous_pid = _I64.unpack_from(data, pos + 2)[0]
                pos += 10
            else:
                next_pid = _I64.unpack_from(data, pos + 2)[0]
                pos += 10
            last = tag
        else:
            if pos == n:
                shell = _ValueShell(
                    1,
                    pid,
                    epoch,
                    timeout,
                    status,
                    partitions,
                    last_update,
                    start,
                    previous_pid,
                    next_pid,
                    ctv,
                )
                shell.__class__ = TxnLogValue  # type: ignore[assignment]
                return cast(TxnLogValue, shell)
    return _decode_v1_tags(data, tags_at, (1, pid, epoch, timeout, status, partitions, last_update, start))


def _decode_v1_tags(
    data: RawBytes, pos: int, fixed: tuple[int, int, int, int, TxnStatus, Partitions | None, int, int]
) -> TxnLogValue:
    """Decode any top-level tagged section (tags 0-2 known, others kept) and build the value."""
    n = len(data)
    num, pos = _uvarint(data, pos, "tagged fields count")
    if num * 2 > n - pos:
        raise DecodeError(f"tagged field count {num} exceeds the record at byte offset {pos}")
    known = [-1, -1, 0]
    unknown: list[tuple[int, bytes]] = []
    prev = -1
    for _ in range(num):
        tag_pos = pos
        tag, pos = _uvarint(data, pos, "tag number")
        if tag <= prev:
            raise DecodeError(f"tag {tag} after tag {prev} at byte offset {tag_pos}: tags must be ascending")
        prev = tag
        size, pos = _uvarint(data, pos, f"tag {tag} size")
        end = pos + size
        if end > n:
            raise _truncated(f"tag {tag}", pos, n)
        if tag < 3:
            if size != _KNOWN_TAG_SIZES[tag]:
                raise DecodeError(
                    f"tag {tag} ({_KNOWN_TAG_NAMES[tag]}) has size {size}, expected {_KNOWN_TAG_SIZES[tag]}"
                    f" at byte offset {pos}"
                )
            known[tag] = (_I16 if tag == _TAG_CLIENT_TRANSACTION_VERSION else _I64).unpack_from(data, pos)[0]
        else:
            unknown.append((tag, bytes(data[pos:end])))
        pos = end
    if pos != n:
        raise DecodeError(f"{n - pos} trailing bytes after the value at byte offset {pos}")
    return TxnLogValue(*fixed, known[0], known[1], known[2], tuple(unknown))


def _decode_v0(data: RawBytes, n: int, pid: int, epoch: int, timeout: int, status_id: int) -> TxnLogValue:
    status = _STATUSES[status_id]
    pos = _HEAD_SIZE
    field = "TransactionPartitions count"
    partitions: Partitions | None
    try:
        count = _I32.unpack_from(data, pos)[0]
        pos += 4
        if count == -1:
            partitions = None
        else:
            # Each entry takes at least 6 bytes (int16 topic length, int32 ids count).
            if count < 0 or count * 6 > n - pos:
                raise DecodeError(f"invalid TransactionPartitions count {count} at byte offset {pos - 4}")
            parts = []
            for _ in range(count):
                field = "Topic length"
                length = _I16.unpack_from(data, pos)[0]
                if length < 0:
                    raise DecodeError(
                        f"{'null' if length == -1 else 'negative'} Topic length at byte offset {pos}"
                    )
                pos += 2
                end = pos + length
                if end > n:
                    raise _truncated("Topic", pos, n)
                try:
                    topic = data[pos:end].decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise DecodeError(f"invalid UTF-8 in Topic at byte offset {pos + exc.start}") from None
                pos = end
                field = "PartitionIds count"
                c = _I32.unpack_from(data, pos)[0]
                if c < 0:
                    raise DecodeError(f"invalid PartitionIds count {c} at byte offset {pos} (not nullable)")
                pos += 4
                if c * 4 > n - pos:
                    raise _truncated("PartitionIds", pos, n)
                ids: tuple[int, ...] = (_INT32_ARRAYS[c] if c < 64 else struct.Struct(f">{c}i")).unpack_from(
                    data, pos
                )
                pos += 4 * c
                parts.append((topic, ids))
            partitions = tuple(parts)
        field = "TransactionLastUpdateTimestampMs"
        last_update, start = _TIMES.unpack_from(data, pos)
        pos += 16
    except struct.error:
        if field == "TransactionLastUpdateTimestampMs" and n - pos >= 8:
            field, pos = "TransactionStartTimestampMs", pos + 8
        raise _truncated(field, pos, n) from None
    if pos != n:
        raise DecodeError(f"{n - pos} trailing bytes after the value at byte offset {pos}")
    shell = _ValueShell(0, pid, epoch, timeout, status, partitions, last_update, start, -1, -1, 0)
    shell.__class__ = TxnLogValue  # type: ignore[assignment]
    return cast(TxnLogValue, shell)


def decode_values(
    values: Sequence[RawBytes | None],
) -> tuple[list[TxnLogValue | None], list[tuple[int, str]]]:
    """Decode a batch of values without letting one bad row fail the others.

    Args:
        values: raw value bytes; None entries are tombstones.

    Returns:
        `(decoded, errors)`: `decoded` is aligned with `values` (None for a tombstone or a failed row) and
        `errors` lists `(index, message)` for each row that failed, for the dead-letter topic.
    """
    decoded: list[TxnLogValue | None] = []
    errors: list[tuple[int, str]] = []
    append = decoded.append
    decode = decode_value
    for i, data in enumerate(values):
        try:
            append(decode(data))
        except DecodeError as exc:
            append(None)
            errors.append((i, str(exc)))
    return decoded, errors


def decode_control_marker(key: RawBytes, value: RawBytes) -> ControlMarker:
    """Decode a data-partition transaction marker (COMMIT/ABORT control record).

    Mirrors Kafka's `EndTransactionMarker`: versions above 0 are read as their v0 prefix, as the broker does.

    Args:
        key: control record key: int16 version, int16 type (0 = ABORT, 1 = COMMIT).
        value: marker value: int16 version, int32 coordinator epoch.

    Returns:
        The marker.

    Raises:
        DecodeError: short input, negative version, or a control type that is not a transaction marker.
    """
    if len(key) < _MARKER_KEY.size:
        raise _truncated("control record key", len(key), len(key))
    key_version, kind = _MARKER_KEY.unpack_from(key, 0)
    if key_version < 0:
        raise DecodeError(f"negative control record key version {key_version} at byte offset 0")
    if kind not in (0, 1):
        raise DecodeError(f"control record type {kind} at byte offset 2 is not a transaction marker")
    if len(value) < _MARKER_VALUE.size:
        raise _truncated("transaction marker value", len(value), len(value))
    value_version, coordinator_epoch = _MARKER_VALUE.unpack_from(value, 0)
    if value_version < 0:
        raise DecodeError(f"negative transaction marker value version {value_version} at byte offset 0")
    return ControlMarker(_MARKER_KINDS[kind], coordinator_epoch)


# -------------------------------------------------------------------------------------------- encoding


def _pack(layout: struct.Struct, what: str, *values: int) -> bytes:
    try:
        return layout.pack(*values)
    except struct.error as exc:
        raise ValueError(f"{what} out of range: {exc}") from None


def _encode_uvarint(value: int) -> bytes:
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _encode_string(text: str, field: str, compact: bool) -> bytes:
    raw = text.encode("utf-8")
    if len(raw) > _MAX_STRING:
        raise ValueError(f"{field} is {len(raw)} bytes long; Kafka allows {_MAX_STRING}")
    return (_encode_uvarint(len(raw) + 1) if compact else _I16.pack(len(raw))) + raw


def _encode_ids(ids: tuple[int, ...]) -> bytes:
    return _pack(struct.Struct(f">{len(ids)}i"), "PartitionIds", *ids)


def encode_key(key: TxnLogKey) -> bytes:
    """Encode a `__transaction_state` key.

    Raises:
        ValueError: version other than 0 or a transactional id longer than 32767 UTF-8 bytes.
    """
    if key.version != 0:
        raise ValueError(f"unsupported key version {key.version}")
    return _I16.pack(0) + _encode_string(key.transactional_id, "TransactionalId", compact=False)


def encode_value(value: TxnLogValue) -> bytes:
    """Encode a `__transaction_state` value the way the coordinator does.

    v1 writes a tagged field only when it differs from its default, in ascending tag order, with unknown tags
    merged in; v0 has no tagged section at all.

    Raises:
        ValueError: unknown version, out-of-range integers, tags on a v0 value, or malformed unknown tags.
    """
    if value.version not in (0, 1):
        raise ValueError(f"unsupported value version {value.version}")
    if value.status not in range(8):
        raise ValueError(f"unknown TransactionStatus {value.status}")
    head = (
        value.version,
        value.producer_id,
        value.producer_epoch,
        value.transaction_timeout_ms,
        value.status,
    )
    out = [_pack(_HEAD, "value header field", *head)]
    compact = value.version == 1
    if value.partitions is None:
        out.append(b"\x00" if compact else _I32.pack(-1))
    else:
        out.append(
            _encode_uvarint(len(value.partitions) + 1) if compact else _I32.pack(len(value.partitions))
        )
        for topic, ids in value.partitions:
            out.append(_encode_string(topic, "Topic", compact))
            out.append(_encode_uvarint(len(ids) + 1) if compact else _I32.pack(len(ids)))
            out.append(_encode_ids(ids))
            if compact:
                out.append(b"\x00")  # PartitionsSchema has no tagged fields
    out.append(_pack(_TIMES, "timestamp", value.last_update_timestamp_ms, value.start_timestamp_ms))
    tags = _encode_tags(value)
    if compact:
        out.append(tags)
    elif tags != b"\x00":
        raise ValueError("a v0 value cannot carry tagged fields (PreviousProducerId, NextProducerId, ...)")
    return b"".join(out)


def _encode_tags(value: TxnLogValue) -> bytes:
    tags: list[tuple[int, bytes]] = []
    if value.previous_producer_id != -1:
        tags.append(
            (_TAG_PREVIOUS_PRODUCER_ID, _pack(_I64, "PreviousProducerId", value.previous_producer_id))
        )
    if value.next_producer_id != -1:
        tags.append((_TAG_NEXT_PRODUCER_ID, _pack(_I64, "NextProducerId", value.next_producer_id)))
    if value.client_transaction_version != 0:
        ctv = _pack(_I16, "ClientTransactionVersion", value.client_transaction_version)
        tags.append((_TAG_CLIENT_TRANSACTION_VERSION, ctv))
    prev = _TAG_CLIENT_TRANSACTION_VERSION
    for tag, payload in value.unknown_tags:
        # Known tags are < 3, so ascending unknown tags > 2 keep the whole section in ascending order.
        if not prev < tag <= _MAX_UVARINT:
            raise ValueError(f"unknown tag {tag} must be > 2, ascending and fit in 32 bits")
        prev = tag
        tags.append((tag, bytes(payload)))
    out = [_encode_uvarint(len(tags))]
    for tag, payload in tags:
        out += (_encode_uvarint(tag), _encode_uvarint(len(payload)), payload)
    return b"".join(out)


def encode_control_marker(marker: ControlMarker) -> tuple[bytes, bytes]:
    """Encode a transaction marker as the `(key, value)` of its control record (both version 0).

    Raises:
        ValueError: unknown kind or a coordinator epoch outside int32.
    """
    if marker.kind not in _MARKER_KINDS:
        raise ValueError(f"unknown transaction marker kind {marker.kind!r}")
    key = _MARKER_KEY.pack(0, _MARKER_KINDS.index(marker.kind))
    return key, _pack(_MARKER_VALUE, "coordinator_epoch", 0, marker.coordinator_epoch)
