"""Where Kafka places a key among a topic's partitions for its coordinators: `Utils.abs(key.hashCode()) %
partitions`, with Java's `String.hashCode()`. The transaction coordinator places a transactional id in
`__transaction_state` this way (`TransactionStateManager.partitionFor`), the group coordinator a group id in
`__consumer_offsets` (`GroupCoordinatorService.partitionFor`). Pure."""

from __future__ import annotations

_INT32 = 1 << 32
_INT32_MIN = -(1 << 31)


def java_string_hash(s: str) -> int:
    """Java's `String.hashCode()`: `s[0]*31^(n-1) + ... + s[n-1]` over UTF-16 code units, as a signed int32. A lone
    surrogate (a Python str can hold one; a Java String too) counts as its one code unit, as in Java."""
    h = 0
    data = s.encode("utf-16-be", "surrogatepass")
    for i in range(0, len(data), 2):
        h = (31 * h + (data[i] << 8 | data[i + 1])) % _INT32
    return h - _INT32 if h >= 1 << 31 else h


def coordinator_partition_for(key: str, partitions: int) -> int:
    """The partition of `key`: `Utils.abs(key.hashCode()) % partitions` (`Utils.abs(Integer.MIN_VALUE)` is 0,
    where Math.abs would leave it negative).

    Raises:
        ValueError: fewer than one partition.
    """
    if partitions < 1:
        raise ValueError(f"a coordinator topic has at least one partition, got {partitions}")
    h = java_string_hash(key)
    return (0 if h == _INT32_MIN else abs(h)) % partitions
