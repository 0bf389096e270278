"""ListTransactions and DescribeTransactions (KIP-664): what each coordinator lists, and how it describes an id."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kafka.protocol.admin.transactions import DescribeTransactionsRequest, ListTransactionsRequest

from admin.wire.errors import code_name
from admin.wire.requests import RequestLog
from admin.wire.types import TransactionDescription, TransactionListing

DESCRIBE_TRANSACTIONS_BATCH = 100


def list_transactions_request(
    producer_ids: Sequence[int], states: Sequence[str], duration_filter_ms: int | None
) -> Any:
    """ListTransactions filtered by producer ids and states; v1 (Kafka 3.8+) when a DurationFilter is given."""
    kwargs: dict[str, Any] = {
        "state_filters": list(states),
        "producer_id_filters": list(producer_ids),
        "min_version": 0,
    }
    if duration_filter_ms is not None:
        kwargs.update(duration_filter=duration_filter_ms, min_version=1)
    return ListTransactionsRequest(**kwargs)


def parse_listing(
    response: Any, broker: int, requests: RequestLog
) -> tuple[list[TransactionListing], str | None]:
    """The transactions `broker` listed, or its error (counted in `requests`)."""
    error = code_name(response.error_code)
    if error is not None:
        requests.record_partition_error("ListTransactions", error)
        return [], error
    return [
        TransactionListing(t.transactional_id, t.producer_id, t.transaction_state, broker)
        for t in response.transaction_states
    ], None


def describe_transactions_request(ids: Sequence[str]) -> Any:
    return DescribeTransactionsRequest(transactional_ids=list(ids))


def parse_descriptions(response: Any, broker: int, requests: RequestLog) -> list[TransactionDescription]:
    """Each id's description as `broker` gave it, errors included (and counted in `requests`)."""
    out: list[TransactionDescription] = []
    for t in response.transaction_states:
        error = code_name(t.error_code)
        if error is not None:
            requests.record_partition_error("DescribeTransactions", error)
        partitions = tuple(sorted((topic.topic, p) for topic in t.topics for p in topic.partitions))
        out.append(
            TransactionDescription(
                t.transactional_id,
                error,
                t.transaction_state,
                t.transaction_timeout_ms,
                t.transaction_start_time_ms,
                t.producer_id,
                t.producer_epoch,
                partitions,
                broker,
            )
        )
    return out


def undescribed(ids: Sequence[str], error: str, broker: int) -> list[TransactionDescription]:
    """`ids` with the error of a request that got no answer."""
    return [TransactionDescription(i, error, "", -1, -1, -1, -1, (), broker) for i in ids]
