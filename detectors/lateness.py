"""Lateness arithmetic shared by the rules and the metrics: ages, skew-reduced elapsed times, thresholds.

Two definitions of "late": txnwatch's (age from the transaction's exact start) and the broker's
PartitionsWithLateTransactionsCount (age from the LastTimestamp of the oldest open transaction's producer,
plus a fixed 5 minutes). Both compare strictly: exactly at the threshold is not late.
"""

from __future__ import annotations

from typing import Literal

# ProducerStateManager.LATE_TRANSACTION_BUFFER_MS: the broker metric's fixed padding.
LATE_TRANSACTION_BUFFER_MS = 5 * 60 * 1000

LateDefinition = Literal["txnwatch", "broker"]


def known(timestamp_ms: int) -> bool:
    """A usable timestamp: positive (Kafka's NO_TIMESTAMP is -1; the broker's lateness check wants > 0)."""
    return timestamp_ms > 0


def age_ms(now_ms: int, since_ms: int) -> int:
    """now - since, never negative (a producer clock ahead of ours gives 0); 0 when `since` is unknown."""
    return now_ms - since_ms if now_ms > since_ms and since_ms > 0 else 0


def elapsed_beyond_skew_ms(later_ms: int, earlier_ms: int, clock_skew_ms: int) -> int:
    """Time between two instants read from different clocks, reduced by the skew tolerance, never negative."""
    d = later_ms - earlier_ms - clock_skew_ms
    return d if d > 0 else 0


def max_timeout_ms(broker_max_transaction_timeout_ms: int | None, default_ms: int) -> int:
    """The broker's transaction.max.timeout.ms, or the configured default when the broker's is unknown."""
    return broker_max_transaction_timeout_ms if broker_max_transaction_timeout_ms is not None else default_ms


def late_threshold_ms(max_transaction_timeout_ms: int, late_buffer_ms: int) -> int:
    """txnwatch's threshold: transaction.max.timeout.ms + the configured buffer (default 0)."""
    return max_transaction_timeout_ms + late_buffer_ms


def is_late(now_ms: int, since_ms: int, threshold_ms: int) -> bool:
    """txnwatch's definition: open for strictly longer than the threshold, measured from `since_ms`
    (never late when `since_ms` is unknown)."""
    return since_ms > 0 and now_ms - since_ms > threshold_ms


def is_late_by_broker_definition(
    now_ms: int, oldest_txn_last_timestamp_ms: int, max_transaction_timeout_ms: int
) -> bool:
    """Kafka's ProducerStateManager.hasLateTransaction, verbatim.

    `lastTimestamp > 0 && (now - lastTimestamp) > maxTransactionTimeoutMs + LATE_TRANSACTION_BUFFER_MS`, where
    lastTimestamp is the LastTimestamp of the producer owning the oldest (lowest start offset) open
    transaction.
    """
    return (
        oldest_txn_last_timestamp_ms > 0
        and now_ms - oldest_txn_last_timestamp_ms > max_transaction_timeout_ms + LATE_TRANSACTION_BUFFER_MS
    )
