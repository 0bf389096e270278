"""DescribeProducers (KIP-664): the request for a batch of partitions and its answer as `PartitionProducers` rows.

`KafkaAdminClient.describe_producers` raises for any per-partition error and sends one broker at a time, so the
request is built here and pipelined by `admin.wire.kafka_wire.KafkaWire`, a few in flight per broker.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kafka.protocol.admin.transactions import DescribeProducersRequest

from admin.wire.errors import code_name
from admin.wire.requests import RequestLog
from admin.wire.types import TP, ActiveProducer, PartitionProducers


def describe_producers_request(batch: Sequence[TP]) -> Any:
    """One DescribeProducers request for `batch`'s partitions, grouped by topic."""
    topic = DescribeProducersRequest.TopicRequest
    by_topic: dict[str, list[int]] = {}
    for name, partition in batch:
        by_topic.setdefault(name, []).append(partition)
    return DescribeProducersRequest(
        topics=[topic(name=name, partition_indexes=parts) for name, parts in by_topic.items()]
    )


def parse_describe_producers(response: Any, requests: RequestLog) -> dict[TP, PartitionProducers]:
    """Each answered partition's producers, or its error (counted in `requests`)."""
    results: dict[TP, PartitionProducers] = {}
    for topic in response.topics:
        for p in topic.partitions:
            error = code_name(p.error_code)
            if error is not None:
                requests.record_partition_error("DescribeProducers", error)
                results[(topic.name, p.partition_index)] = PartitionProducers(error, (), p.error_message)
                continue
            results[(topic.name, p.partition_index)] = PartitionProducers(
                None,
                tuple(
                    ActiveProducer(
                        a.producer_id,
                        a.producer_epoch,
                        a.last_sequence,
                        a.last_timestamp,
                        a.coordinator_epoch,
                        a.current_txn_start_offset,
                    )
                    for a in p.active_producers
                ),
            )
    return results
