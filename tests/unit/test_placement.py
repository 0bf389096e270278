"""detectors/placement.py: Java's String.hashCode and Kafka's coordinator placement, one definition for the
transaction log (detectors/currency.py) and the offsets topic (detectors/groups.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from detectors.placement import coordinator_partition_for, java_string_hash


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", 0),
        ("a", 97),
        ("hello", 99162322),  # Java: "hello".hashCode()
        ("polygenelubricants", -(1 << 31)),  # Java: Integer.MIN_VALUE
        ("\U0001f600", 0xD83D * 31 + 0xDE00),  # outside the BMP: two UTF-16 code units
        ("\ud800", 0xD800),  # a lone surrogate: its one code unit, as a Java String has it
    ],
)
def test_java_string_hash(text: str, expected: int) -> None:
    assert java_string_hash(text) == expected


def test_placement_is_kafkas_abs_modulo() -> None:
    assert coordinator_partition_for("hello", 50) == 99162322 % 50
    assert coordinator_partition_for("polygenelubricants", 50) == 0  # Utils.abs(Integer.MIN_VALUE) is 0
    negative = next(g for g in (f"consumer-group-{i}" for i in range(1000)) if java_string_hash(g) < 0)
    assert coordinator_partition_for(negative, 7) == abs(java_string_hash(negative)) % 7
    with pytest.raises(ValueError, match="at least one partition"):
        coordinator_partition_for("g", 0)


@given(st.text(), st.integers(min_value=1, max_value=1000))
def test_every_key_lands_on_a_partition(key: str, partitions: int) -> None:
    assert 0 <= coordinator_partition_for(key, partitions) < partitions
