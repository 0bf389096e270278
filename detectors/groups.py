"""Whom a hanging transaction on `__consumer_offsets` blocks: the consumer group of its pending offset commit,
read from the `OffsetCommitKey` (versions 0 and 1) of the batch at its start offset. Pure: bytes in, names out.
Why that group stalls and its neighbours do not: docs/detection.md, section 5, and docs/runbook.md.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from detectors.placement import coordinator_partition_for

CONSUMER_OFFSETS_TOPIC = "__consumer_offsets"

# `__consumer_offsets` record key versions (GroupCoordinatorRecordSerde): 0 and 1 are OffsetCommitKey; 2 is
# GroupMetadataKey; higher ones belong to the consumer-group protocol's records (KIP-848), never to a commit.
OFFSET_COMMIT_KEY_VERSIONS = (0, 1)


class OffsetCommitKey(NamedTuple):
    group: str
    topic: str
    partition: int


def offsets_partition_for(group_id: str, partitions: int) -> int:
    """The `__consumer_offsets` partition of a group (`detectors.placement`).

    Raises:
        ValueError: fewer than one partition.
    """
    return coordinator_partition_for(group_id, partitions)


def decode_offset_commit_key(key: bytes | None) -> OffsetCommitKey | None:
    """The (group, topic, partition) of an `__consumer_offsets` offset-commit record key; None for any other key.

    Layout (non-flexible): int16 version, string group, string topic, int32 partition; a string is an int16
    length and UTF-8 bytes.
    """
    if key is None or len(key) < 2:
        return None
    try:
        (version,) = struct.unpack_from(">h", key, 0)
        if version not in OFFSET_COMMIT_KEY_VERSIONS:
            return None
        group, at = _string(key, 2)
        topic, at = _string(key, at)
        (partition,) = struct.unpack_from(">i", key, at)
        if at + 4 != len(key):
            return None
        return OffsetCommitKey(group, topic, partition)
    except (struct.error, UnicodeDecodeError, ValueError):
        return None


def _string(buf: bytes, at: int) -> tuple[str, int]:
    (n,) = struct.unpack_from(">h", buf, at)
    if n < 0 or at + 2 + n > len(buf):
        raise ValueError("string out of bounds")
    return buf[at + 2 : at + 2 + n].decode("utf-8"), at + 2 + n


def pending_commit(keys: list[bytes | None]) -> tuple[str, tuple[tuple[str, int], ...]] | None:
    """The group of the offset commit a batch holds and the partitions it commits: one TxnOffsetCommit writes one
    group's records, so the first offset-commit key names the group. None when no key is an offset commit."""
    decoded = [k for k in map(decode_offset_commit_key, keys) if k is not None]
    if not decoded:
        return None
    group = decoded[0].group
    return group, tuple(dict.fromkeys((k.topic, k.partition) for k in decoded if k.group == group))


def blocked_groups_note(topic: str, partition: int, group: str | None) -> str:
    """The explanation's words for a transaction open on `__consumer_offsets`; empty for any other topic."""
    if topic != CONSUMER_OFFSETS_TOPIC:
        return ""
    who = f"consumer group {group!r}" if group else f"a consumer group placed on partition {partition}"
    return (
        f"; it holds a pending offset commit of {who}: that group's OffsetFetch with require_stable "
        f"(read_committed consumers, Kafka Streams exactly-once) answers UNSTABLE_OFFSET_COMMIT until it ends"
        + ("" if group else " (`txnwatch proposals show` names the group)")
    )
