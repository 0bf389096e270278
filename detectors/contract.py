"""The wire contract between txnwatch's rooms, defined once: the topic names Kafka gives us, the record-type header
and its values, record keys, the dead-letter headers and the coordinator state sets. admin/ and streaming/ never
import each other; both import these names, so a producer and its consumer cannot drift apart.
"""

from __future__ import annotations

from detectors.models import CoordinatorState

# Kafka's transaction log (clients cannot write it; the job reads it with the consumer-based offset reader).
TRANSACTION_LOG_TOPIC = "__transaction_state"

# Every record txnwatch writes to its snapshot topic says what it is in this header.
TYPE_HEADER = "txnwatch.type"
SNAPSHOT_TYPE = "partition-snapshot"  # PartitionSnapshot
SUMMARY_TYPE = "broker-sweep-summary"  # BrokerSweepSummary
COORDINATOR_LOG_POSITION_TYPE = "coordinator-log-position"  # CoordinatorLogPosition
COORDINATOR_RECORD_TYPE = "coordinator-record"  # CoordinatorRecord (describe fallback topic)

# Dead-letter records keep the raw key and value; where they came from and why travel in these headers.
DEAD_LETTER_HEADERS = (
    "txnwatch.source",
    "txnwatch.source-topic",
    "txnwatch.source-partition",
    "txnwatch.source-offset",
    "txnwatch.error",
)


def snapshot_key(topic: str, partition: int) -> bytes:
    """Key of a PartitionSnapshot: the partition it describes (the newest per partition is what counts)."""
    return f"{topic}-{partition}".encode()


def summary_key(broker: int) -> bytes:
    return f"__sweep__-broker-{broker}".encode()


def position_key(topic: str) -> bytes:
    return f"__position__-{topic}".encode()


# Coordinator states. The coordinator still owns the partitions it lists in these: it will write their markers.
# PrepareEpochFence is the in-memory step before PrepareAbort (a fenced producer), so it counts as preparing.
PREPARING_STATES = frozenset(
    {CoordinatorState.PREPARE_COMMIT, CoordinatorState.PREPARE_ABORT, CoordinatorState.PREPARE_EPOCH_FENCE}
)
OWNING_STATES = PREPARING_STATES | {CoordinatorState.ONGOING}
# The transaction is over: every marker was acknowledged before these were written.
COMPLETED_STATES = frozenset(
    {CoordinatorState.EMPTY, CoordinatorState.COMPLETE_COMMIT, CoordinatorState.COMPLETE_ABORT}
)
# The completions that wrote markers: to the partitions of the Prepare record before them.
COMPLETE_WITH_MARKERS = frozenset({CoordinatorState.COMPLETE_COMMIT, CoordinatorState.COMPLETE_ABORT})
