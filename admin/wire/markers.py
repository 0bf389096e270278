"""WriteTxnMarkers: one ABORT (or COMMIT) marker for one partition, as Kafka's `Admin.abortTransaction` sends it."""

from __future__ import annotations

from typing import Any, Literal

from kafka.protocol.producer.transaction import WriteTxnMarkersRequest

from admin.wire.errors import code_name
from admin.wire.types import TP
from admin.wire.versions import ADMIN_MARKER_TRANSACTION_VERSION


def write_txn_marker_request(
    *,
    topic: str,
    partition: int,
    producer_id: int,
    producer_epoch: int,
    coordinator_epoch: int,
    transaction_result: Literal["ABORT", "COMMIT"],
) -> Any:
    """One marker for one partition (the coordinator epoch is the caller's to check: never -1)."""
    marker = WriteTxnMarkersRequest.WritableTxnMarker
    return WriteTxnMarkersRequest(
        markers=[
            marker(
                producer_id=producer_id,
                producer_epoch=producer_epoch,
                transaction_result=transaction_result == "COMMIT",  # false: ABORT, true: COMMIT
                topics=[marker.WritableTxnMarkerTopic(name=topic, partition_indexes=[partition])],
                coordinator_epoch=coordinator_epoch,
                # Sent (v2, Kafka 4.2+) as Kafka's `Admin.abortTransaction` sends it: see
                # `admin.wire.versions.ADMIN_MARKER_TRANSACTION_VERSION`. Left out of v1 (older brokers).
                transaction_version=ADMIN_MARKER_TRANSACTION_VERSION,
            )
        ]
    )


def parse_marker_answer(response: Any, tp: TP) -> str | None:
    """None when the marker was written on `tp`, else the error's name (MISSING_FROM_RESPONSE if not answered)."""
    for result in response.markers:
        for topic in result.topics:
            for p in topic.partitions:
                if (topic.name, p.partition_index) == tp:
                    return code_name(p.error_code)
    return "MISSING_FROM_RESPONSE"
