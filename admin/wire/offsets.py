"""ListOffsets (latest): a partition's last stable offset (read_committed), high watermark (read_uncommitted) or
log end offset (as a debugging tool), each asked at the leader epoch of record where known."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kafka.protocol.consumer import ListOffsetsRequest

from admin.wire.errors import code_name
from admin.wire.requests import RequestLog
from admin.wire.types import TP, EndOffset

LATEST_TIMESTAMP = -1
READ_UNCOMMITTED, READ_COMMITTED = 0, 1
# ListOffsets' replica ids: a client (the leader's high watermark or LSO), or a debugging tool (its log end offset).
CONSUMER_REPLICA_ID = -1
DEBUGGING_REPLICA_ID = -2


def list_offsets_request(
    tps: Sequence[TP],
    isolation: int,
    leader_epochs: Mapping[TP, int],
    replica_id: int = CONSUMER_REPLICA_ID,
) -> Any:
    """ListOffsets (latest) for `tps`, each with the leader epoch of record where known (-1 otherwise).

    With an epoch, a broker that is not the leader at exactly that epoch answers FENCED_LEADER_EPOCH (it knows a
    newer one), UNKNOWN_LEADER_EPOCH (an older one) or NOT_LEADER_OR_FOLLOWER (`Partition.localLogWithEpochOrThrow`;
    replica id -1 asks the leader only): a deposed leader's high watermark or LSO is refused, not returned.

    `replica_id` -2 (`ListOffsetsRequest.DEBUGGING_REPLICA_ID`) asks for the log end offset: the broker then applies
    no isolation level (`ReplicaManager.fetchOffset`: only replica id -1 is a client request) and answers its local
    log's end (`Partition.fetchOffsetForTimestamp`), under the same Describe-on-topic check and epoch fencing.
    """
    topic = ListOffsetsRequest.ListOffsetsTopic
    by_topic: dict[str, list[Any]] = {}
    for name, partition in tps:
        by_topic.setdefault(name, []).append(
            topic.ListOffsetsPartition(
                partition_index=partition,
                current_leader_epoch=leader_epochs.get((name, partition), -1),
                timestamp=LATEST_TIMESTAMP,
            )
        )
    # v2 is the first with an isolation level (Kafka 4.0 removed v0), v4 the first with a current leader epoch:
    # never let an epoch be dropped by an older version.
    return ListOffsetsRequest(
        replica_id=replica_id,
        isolation_level=isolation,
        topics=[topic(name=name, partitions=parts) for name, parts in by_topic.items()],
        min_version=4 if any(leader_epochs.get(tp, -1) >= 0 for tp in tps) else 2,
    )


def parse_offsets(response: Any, requests: RequestLog, errors: dict[TP, str]) -> dict[TP, int]:
    """The offsets answered; each partition's first error goes into `errors` (counted in `requests`)."""
    found: dict[TP, int] = {}
    for topic in response.topics:
        for p in topic.partitions:
            tp = (topic.name, p.partition_index)
            if p.error_code == 0 and p.offset >= 0:
                found[tp] = p.offset
            elif p.error_code != 0:
                error = code_name(p.error_code) or "?"
                requests.record_partition_error("ListOffsets", error)
                errors.setdefault(tp, error)
    return found


def parse_end_offsets(response: Any, tps: Sequence[TP], requests: RequestLog) -> dict[TP, EndOffset]:
    """Each of `tps`' offset or error (MISSING_FROM_RESPONSE when the answer left it out)."""
    found: dict[TP, EndOffset] = {}
    for topic in response.topics:
        for p in topic.partitions:
            error = code_name(p.error_code)
            if error is not None:
                requests.record_partition_error("ListOffsets", error)
            found[(topic.name, p.partition_index)] = EndOffset(p.offset if error is None else None, error)
    return {tp: found.get(tp, EndOffset(None, "MISSING_FROM_RESPONSE")) for tp in tps}
