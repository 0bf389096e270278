"""KIP-664 metric arithmetic: MaxActiveTransactionDuration and PartitionsWithLateTransactionsCount."""

from __future__ import annotations

from typing import Any

import pytest
from builders import LIMITS, MINUTE, T0, coord, limits, open_txn, snapshot
from hypothesis import given
from hypothesis import strategies as st

from detectors.lateness import LATE_TRANSACTION_BUFFER_MS, LateDefinition
from detectors.metrics import (
    BrokerLateCount,
    max_active_transaction_duration,
    partition_has_late_transaction,
    partitions_with_late_transactions,
)
from detectors.models import DetectionLimits, PartitionSnapshot, VerdictKind
from detectors.rules import classify

pytestmark = pytest.mark.unit

MAX_TIMEOUT = 600_000  # the broker's transaction.max.timeout.ms in these cases


def snap(*txns: Any, **overrides: Any) -> PartitionSnapshot:
    overrides.setdefault("max_transaction_timeout_ms", MAX_TIMEOUT)
    return snapshot(*txns, **overrides) if txns else snapshot(open_transactions=(), **overrides)


# ------------------------------------------------------------------------------ MaxActiveTransactionDuration


def test_duration_is_from_the_oldest_exact_start() -> None:
    s = snap(
        open_txn(producer_id=1, start_offset=100, start_timestamp_ms=T0),
        open_txn(producer_id=2, start_offset=90, start_timestamp_ms=T0 + MINUTE),
    )
    [d] = max_active_transaction_duration([s], now_ms=T0 + 5 * MINUTE)
    assert (d.duration_ms, d.basis, d.producer_id, d.start_offset) == (5 * MINUTE, "start-timestamp", 1, 100)


def test_duration_falls_back_to_last_timestamp_and_says_so() -> None:
    s = snap(
        open_txn(start_timestamp_ms=None, start_batch_producer_epoch=None, last_timestamp_ms=T0 + MINUTE)
    )
    [d] = max_active_transaction_duration([s], now_ms=T0 + 5 * MINUTE)
    assert (d.duration_ms, d.basis) == (4 * MINUTE, "last-timestamp")


def test_duration_leaves_out_partitions_without_open_transactions() -> None:
    busy = snap(open_txn(), partition=1)
    idle = snap(partition=2)
    assert [d.partition for d in max_active_transaction_duration([busy, idle], now_ms=T0 + MINUTE)] == [1]


def test_duration_uses_the_newest_snapshot_of_a_partition() -> None:
    old = snap(open_txn(), observed_at_ms=T0 + MINUTE, sweep_id="s1")
    closed = snap(observed_at_ms=T0 + 2 * MINUTE, sweep_id="s2")
    assert max_active_transaction_duration([closed, old], now_ms=T0 + 3 * MINUTE) == []


def test_duration_without_any_timestamp_is_zero_and_says_unknown() -> None:
    s = snap(open_txn(start_timestamp_ms=None, start_batch_producer_epoch=None, last_timestamp_ms=-1))
    [d] = max_active_transaction_duration([s], now_ms=T0)
    assert (d.duration_ms, d.basis) == (0, "unknown")
    assert not partition_has_late_transaction(s, now_ms=T0, limits=LIMITS, definition="txnwatch")


def test_duration_is_never_negative() -> None:
    s = snap(open_txn(start_timestamp_ms=T0 + MINUTE))
    [d] = max_active_transaction_duration([s], now_ms=T0)
    assert d.duration_ms == 0


# -------------------------------------------------------------------------- late: both definitions pinned

# Each case: txns on one partition, now, definition, late?
LATE_CASES = [
    pytest.param(
        [open_txn(start_timestamp_ms=T0)],
        T0 + MAX_TIMEOUT,
        "txnwatch",
        False,
        id="txnwatch-exactly-max-timeout-from-start-is-not-late",
    ),
    pytest.param(
        [open_txn(start_timestamp_ms=T0)],
        T0 + MAX_TIMEOUT + 1,
        "txnwatch",
        True,
        id="txnwatch-one-ms-past-max-timeout-is-late",
    ),
    pytest.param(
        [open_txn(start_timestamp_ms=T0, last_timestamp_ms=T0 + MAX_TIMEOUT)],
        T0 + MAX_TIMEOUT + 1,
        "broker",
        False,
        id="broker-counts-from-last-timestamp-so-a-busy-old-txn-is-not-late",
    ),
    pytest.param(
        [open_txn(last_timestamp_ms=T0)],
        T0 + MAX_TIMEOUT + LATE_TRANSACTION_BUFFER_MS,
        "broker",
        False,
        id="broker-exactly-max-timeout-plus-5-min-is-not-late",
    ),
    pytest.param(
        [open_txn(last_timestamp_ms=T0)],
        T0 + MAX_TIMEOUT + LATE_TRANSACTION_BUFFER_MS + 1,
        "broker",
        True,
        id="broker-one-ms-past-max-timeout-plus-5-min-is-late",
    ),
    pytest.param(
        [open_txn(last_timestamp_ms=T0)],
        T0 + MAX_TIMEOUT + 1,
        "broker",
        False,
        id="broker-adds-its-fixed-5-min-buffer",
    ),
    pytest.param(
        [open_txn(last_timestamp_ms=0)],
        T0,
        "broker",
        False,
        id="broker-ignores-a-non-positive-last-timestamp",
    ),
    pytest.param(
        [
            open_txn(
                producer_id=1,
                start_offset=100,
                start_timestamp_ms=T0 + 9 * MINUTE,
                last_timestamp_ms=T0 + 15 * MINUTE,
            ),
            open_txn(producer_id=2, start_offset=200, start_timestamp_ms=T0, last_timestamp_ms=T0),
        ],
        T0 + 20 * MINUTE,
        "broker",
        False,
        id="broker-looks-only-at-the-lowest-start-offset-producer",
    ),
    pytest.param(
        [
            open_txn(
                producer_id=1,
                start_offset=100,
                start_timestamp_ms=T0 + 9 * MINUTE,
                last_timestamp_ms=T0 + 15 * MINUTE,
            ),
            open_txn(producer_id=2, start_offset=200, start_timestamp_ms=T0, last_timestamp_ms=T0),
        ],
        T0 + 20 * MINUTE,
        "txnwatch",
        True,
        id="txnwatch-counts-any-late-transaction-on-the-partition",
    ),
]


@pytest.mark.parametrize(("txns", "now", "definition", "late"), LATE_CASES)
def test_partition_lateness(txns: list[Any], now: int, definition: LateDefinition, late: bool) -> None:
    s = snap(*txns)
    assert partition_has_late_transaction(s, now_ms=now, limits=LIMITS, definition=definition) is late


def test_late_buffer_applies_to_txnwatch_only() -> None:
    s = snap(open_txn(start_timestamp_ms=T0, last_timestamp_ms=T0))
    lim = limits(late_buffer_ms=MINUTE)
    now = T0 + MAX_TIMEOUT + MINUTE
    assert not partition_has_late_transaction(s, now_ms=now, limits=lim, definition="txnwatch")
    assert partition_has_late_transaction(s, now_ms=now + 1, limits=lim, definition="txnwatch")
    assert not partition_has_late_transaction(s, now_ms=now + 1, limits=lim, definition="broker")


def test_unknown_broker_max_timeout_uses_the_default() -> None:
    s = snap(open_txn(start_timestamp_ms=T0), max_transaction_timeout_ms=None)
    assert not partition_has_late_transaction(s, now_ms=T0 + 900_000, limits=LIMITS)
    assert partition_has_late_transaction(s, now_ms=T0 + 900_001, limits=LIMITS)


# ------------------------------------------------------------------------------- per broker, per cluster


def test_counts_per_broker_and_cluster_keep_zero_brokers() -> None:
    late_txn = open_txn(start_timestamp_ms=T0, last_timestamp_ms=T0)
    snapshots = [
        snap(late_txn, partition=0, leader=1),
        snap(late_txn, partition=1, leader=1),
        snap(late_txn, partition=2, leader=2),
        snap(partition=3, leader=3),  # nothing open: broker 3 reports 0
        snap(late_txn, partition=0, leader=9, cluster="dr"),
    ]
    counts = partitions_with_late_transactions(snapshots, now_ms=T0 + 20 * MINUTE, limits=LIMITS)
    assert counts.brokers == (
        BrokerLateCount(cluster="dr", broker=9, count=1),
        BrokerLateCount(cluster="prod", broker=1, count=2),
        BrokerLateCount(cluster="prod", broker=2, count=1),
        BrokerLateCount(cluster="prod", broker=3, count=0),
    )
    assert counts.clusters == {"prod": 3, "dr": 1}
    assert counts.definition == "txnwatch"


def test_counts_follow_the_newest_snapshot_after_a_leader_move() -> None:
    late_txn = open_txn(start_timestamp_ms=T0)
    before = snap(late_txn, leader=1, observed_at_ms=T0 + MINUTE, sweep_id="s1")
    after = snap(late_txn, leader=2, observed_at_ms=T0 + 2 * MINUTE, sweep_id="s2")
    counts = partitions_with_late_transactions([before, after], now_ms=T0 + 20 * MINUTE, limits=LIMITS)
    assert [(b.broker, b.count) for b in counts.brokers] == [(2, 1)]


def test_broker_definition_is_slower_than_ours() -> None:
    s = [snap(open_txn(start_timestamp_ms=T0, last_timestamp_ms=T0))]
    now = T0 + MAX_TIMEOUT + MINUTE
    ours = partitions_with_late_transactions(s, now_ms=now, limits=LIMITS, definition="txnwatch")
    kafka = partitions_with_late_transactions(s, now_ms=now, limits=LIMITS, definition="broker")
    assert (ours.clusters, kafka.clusters) == ({"prod": 1}, {"prod": 0})


# ------------------------------------------------------------------- the LATE verdict and the metric agree


@given(
    age=st.integers(min_value=0, max_value=2 * MAX_TIMEOUT),
    buffer=st.integers(min_value=0, max_value=MINUTE),
    known_start=st.booleans(),
)
def test_late_verdict_agrees_with_the_txnwatch_metric(age: int, buffer: int, known_start: bool) -> None:
    lim = DetectionLimits(late_buffer_ms=buffer)
    txn = open_txn(
        start_timestamp_ms=T0 if known_start else None,
        start_batch_producer_epoch=5 if known_start else None,
        last_timestamp_ms=T0,
    )
    s = snap(txn, observed_at_ms=T0 + age)
    # A coordinator record that owns the partition with no timeout: nothing but lateness can apply.
    v = classify(
        txn,
        s,
        coord(transaction_timeout_ms=-1),
        now_ms=T0 + age,
        limits=lim,
        view_current_ms=s.observed_at_ms,
    )
    metric = partition_has_late_transaction(s, now_ms=T0 + age, limits=lim)
    assert (v.kind is VerdictKind.LATE) is metric
