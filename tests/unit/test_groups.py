"""detectors/groups.py: Kafka's group placement and the `__consumer_offsets` key, and the explanation's words."""

from __future__ import annotations

import struct

import pytest

from detectors.groups import (
    blocked_groups_note,
    decode_offset_commit_key,
    offsets_partition_for,
    pending_commit,
)

pytestmark = pytest.mark.unit


def key(version: int, group: str, topic: str, partition: int) -> bytes:
    g, t = group.encode(), topic.encode()
    return struct.pack(f">hh{len(g)}sh{len(t)}si", version, len(g), g, len(t), t, partition)


def test_placement_is_kafkas_abs_modulo() -> None:
    assert offsets_partition_for("hello", 50) == 99162322 % 50
    assert offsets_partition_for("polygenelubricants", 50) == 0  # Utils.abs(Integer.MIN_VALUE) is 0
    with pytest.raises(ValueError):
        offsets_partition_for("g", 0)


def test_offset_commit_keys_decode_and_other_keys_do_not() -> None:
    assert decode_offset_commit_key(key(1, "orders-app", "orders", 3)) == ("orders-app", "orders", 3)
    assert decode_offset_commit_key(key(0, "g", "t", 0)) == ("g", "t", 0)
    assert decode_offset_commit_key(key(2, "g", "t", 0)) is None  # GroupMetadataKey's version
    assert decode_offset_commit_key(key(1, "g", "t", 0) + b"x") is None  # trailing bytes: not this layout
    assert decode_offset_commit_key(key(1, "g", "t", 0)[:-1]) is None
    assert decode_offset_commit_key(None) is None
    assert decode_offset_commit_key(b"\x00") is None


def test_pending_commit_names_the_first_group_and_its_partitions() -> None:
    keys = [None, key(2, "other", "", 0)[:4], key(1, "app", "orders", 1), key(1, "app", "orders", 0)]
    assert pending_commit(keys) == ("app", (("orders", 1), ("orders", 0)))
    assert pending_commit([None, b"junk"]) is None


def test_the_note_names_the_group_only_on_consumer_offsets() -> None:
    assert blocked_groups_note("orders", 0, "app") == ""
    named = blocked_groups_note("__consumer_offsets", 7, "app")
    assert "consumer group 'app'" in named and "UNSTABLE_OFFSET_COMMIT" in named
    unknown = blocked_groups_note("__consumer_offsets", 7, None)
    assert "placed on partition 7" in unknown and "txnwatch proposals show" in unknown


def test_a_verdict_on_consumer_offsets_names_the_blocked_group() -> None:
    from detectors.models import DetectionLimits, OpenTransaction, PartitionSnapshot
    from detectors.rules import classify

    now = 1_800_000_000_000
    txn = OpenTransaction(
        producer_id=7,
        producer_epoch=0,
        start_offset=12,
        last_timestamp_ms=now - 60_000,
        offset_commit_group="app",
    )
    snapshot = PartitionSnapshot(
        cluster="c",
        sweep_id="s",
        observed_at_ms=now,
        leader=1,
        topic="__consumer_offsets",
        partition=7,
        open_transactions=(txn,),
    )
    limits = DetectionLimits(grace_ms=0, clock_skew_ms=0)
    verdict = classify(txn, snapshot, None, now_ms=now, limits=limits, view_current_ms=now)
    assert verdict.evidence.offset_commit_group == "app"
    assert "pending offset commit of consumer group 'app'" in verdict.explanation
    # The snapshot JSON the collector writes carries it to the job (and old snapshots without it still load).
    again = PartitionSnapshot.model_validate_json(snapshot.model_dump_json())
    assert again.open_transactions[0].offset_commit_group == "app"
    old = snapshot.model_dump(mode="json")
    del old["open_transactions"][0]["offset_commit_group"]
    assert PartitionSnapshot.model_validate(old).open_transactions[0].offset_commit_group is None
