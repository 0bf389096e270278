"""KIP-664 metric arithmetic (detectors/kip664.py): MaxActiveTransactionDuration and
PartitionsWithLateTransactionsCount, both definitions of "late" pinned at their boundaries."""

from __future__ import annotations

from typing import Any

import pytest
from builders import LIMITS, MINUTE, T0, coord, limits, open_txn, snapshot
from hypothesis import given
from hypothesis import strategies as st

from detectors.kip664 import (
    LateCounts,
    LatePartition,
    count_late_partitions,
    oldest_open_transaction,
    partition_duration_ms,
    partition_has_late_transaction,
)
from detectors.lateness import LATE_TRANSACTION_BUFFER_MS, LateDefinition
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
    assert partition_duration_ms(s, now_ms=T0 + 5 * MINUTE) == 5 * MINUTE
    oldest = oldest_open_transaction(s, now_ms=T0 + 5 * MINUTE)
    assert oldest is not None and (oldest.producer_id, oldest.start_offset) == (1, 100)
    assert oldest.open_since_basis == "start-timestamp"


def test_duration_falls_back_to_last_timestamp_and_says_so() -> None:
    s = snap(
        open_txn(start_timestamp_ms=None, start_batch_producer_epoch=None, last_timestamp_ms=T0 + MINUTE)
    )
    oldest = oldest_open_transaction(s, now_ms=T0 + 5 * MINUTE)
    assert partition_duration_ms(s, now_ms=T0 + 5 * MINUTE) == 4 * MINUTE
    assert oldest is not None and oldest.open_since_basis == "last-timestamp"


def test_a_partition_without_open_transactions_has_no_duration() -> None:
    assert partition_duration_ms(snap(partition=2), now_ms=T0 + MINUTE) is None
    assert oldest_open_transaction(snap(partition=2), now_ms=T0 + MINUTE) is None


def test_duration_ties_go_to_the_lowest_start_offset() -> None:
    s = snap(
        open_txn(producer_id=1, start_offset=200, start_timestamp_ms=T0),
        open_txn(producer_id=2, start_offset=100, start_timestamp_ms=T0),
    )
    oldest = oldest_open_transaction(s, now_ms=T0 + MINUTE)
    assert oldest is not None and oldest.producer_id == 2


def test_duration_without_any_timestamp_is_zero_and_says_unknown() -> None:
    s = snap(open_txn(start_timestamp_ms=None, start_batch_producer_epoch=None, last_timestamp_ms=-1))
    oldest = oldest_open_transaction(s, now_ms=T0)
    assert partition_duration_ms(s, now_ms=T0) == 0
    assert oldest is not None and oldest.open_since_basis == "unknown"
    assert not partition_has_late_transaction(s, now_ms=T0, limits=LIMITS, definition="txnwatch")


def test_duration_is_never_negative() -> None:
    s = snap(open_txn(start_timestamp_ms=T0 + MINUTE))
    assert partition_duration_ms(s, now_ms=T0) == 0


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
    counts = count_late_partitions(
        [
            LatePartition(leader=2, late=True),
            LatePartition(leader=1, late=True),
            LatePartition(leader=1, late=True, two_phase_commit=True),
            LatePartition(leader=3, late=False),  # nothing late: broker 3 reports 0
            LatePartition(leader=3, late=False, two_phase_commit=True),  # 2PC but not late: not counted
        ]
    )
    assert counts == LateCounts(
        per_broker={1: 2, 2: 1, 3: 0}, two_phase_commit_per_broker={1: 1, 2: 0, 3: 0}, cluster=3
    )
    assert list(counts.per_broker) == [1, 2, 3]  # sorted: the exporter's series come out in broker order


def test_no_partitions_no_brokers() -> None:
    assert count_late_partitions([]) == LateCounts({}, {}, 0)


def test_broker_definition_is_slower_than_ours() -> None:
    s = snap(open_txn(start_timestamp_ms=T0, last_timestamp_ms=T0))
    now = T0 + MAX_TIMEOUT + MINUTE
    assert partition_has_late_transaction(s, now_ms=now, limits=LIMITS, definition="txnwatch")
    assert not partition_has_late_transaction(s, now_ms=now, limits=LIMITS, definition="broker")


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
