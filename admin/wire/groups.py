"""kafka-python under `admin.collect.blocked`'s seam: the consumer groups (ListGroups) and their committed offsets on a few
partitions (OffsetFetch), every error named and none raised.

kafka-python's `list_group_offsets` raises on the first group- or partition-level error, and its admin never
forgets a group's coordinator: one group that moved (NOT_COORDINATOR) would blank every group's answer for good.
So the OffsetFetch requests are built here, one per group coordinator (v8, KIP-709: many groups in one request,
Kafka 3.0+; older brokers get one request per group), each group's error counted by name, and the coordinator of a
group that answers a coordinator error is forgotten so the next sweep finds it again.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import kafka.errors as Errors
from kafka import KafkaAdminClient
from kafka.protocol.consumer.group import OffsetFetchRequest

from admin.wire.errors import code_name, error_name, kafka_errors_translated
from admin.wire.requests import RequestLog
from admin.wire.types import TP

log = logging.getLogger(__name__)

# A group's answer that means "ask its coordinator again": kafka-python's admin would keep asking the old one.
COORDINATOR_ERRORS = frozenset(
    {"NOT_COORDINATOR", "COORDINATOR_NOT_AVAILABLE", "COORDINATOR_LOAD_IN_PROGRESS"}
)
# v10 names topics by id, which this reader does not resolve; v8 is the first with many groups per request.
OFFSET_FETCH_MANY_GROUPS = 8
GROUP_COORDINATOR = 0  # FindCoordinator key type
# v7 is the first with `require_stable` (KIP-447).
REQUIRE_STABLE_VERSION = 7
# OffsetFetch's answer while a group's committed offsets are pending in an open transaction (require_stable).
UNSTABLE_OFFSET_COMMIT = 88


class GroupIds(NamedTuple):
    """The consumer groups ListGroups named (every broker asked), or the error that kept the list unknown."""

    groups: tuple[str, ...]
    error: str | None = None


class CommittedOffsets(NamedTuple):
    """Committed offsets by (group, partition) (groups without a commit there left out), and how many groups (or
    group-partitions) answered each error instead."""

    offsets: Mapping[tuple[str, TP], int]
    errors: Mapping[str, int]


class KafkaGroupOffsets:
    """`admin.collect.blocked.GroupsWire` with kafka-python, on the collector's admin connection.

    Args:
        admin: the collector's bootstrapped KafkaAdminClient.
        requests: counts each request and error by API (the collector's `requests_total`, `errors_total`).
    """

    def __init__(self, admin: KafkaAdminClient, *, requests: RequestLog | None = None) -> None:
        self._admin = admin
        self.requests = requests if requests is not None else RequestLog()

    @property
    def _manager(self) -> Any:
        # Read when a lookup runs, not at construction: `collect` builds this before its first sweep, also where
        # the lookup is off (`--blocked-groups-after-ms 0`) and with admins that are not kafka-python's (tests).
        return self._admin._manager

    def list_group_ids(self) -> GroupIds:
        """Every group this principal may Describe (ListGroups filters the rest out, no error), except share
        groups, which commit no offsets."""
        try:
            listed = self._admin.list_groups()
        except Errors.KafkaError as exc:
            error = error_name(exc)
            self.requests.record("ListGroups", -1, error)
            return GroupIds((), error)
        self.requests.record("ListGroups", -1)
        return GroupIds(
            tuple(
                sorted({g["group_id"] for g in listed if str(g.get("group_type") or "").lower() != "share"})
            )
        )

    def committed_offsets(self, groups: Sequence[str], partitions: Sequence[TP]) -> CommittedOffsets:
        """Each group's committed offset on each of `partitions`: one OffsetFetch per group coordinator."""
        if not groups or not partitions:
            return CommittedOffsets({}, {})
        with kafka_errors_translated():
            return self._manager.run(self._fetch, list(groups), list(partitions))  # type: ignore[no-any-return]

    async def _fetch(self, groups: list[str], partitions: list[TP]) -> CommittedOffsets:
        offsets: dict[tuple[str, TP], int] = {}
        errors: Counter[str] = Counter()
        try:
            coordinators = await self._admin._find_coordinator_ids(groups)
        except Errors.KafkaError as exc:
            # One group without a coordinator fails the batched lookup: none is asked this sweep.
            lookup_error = error_name(exc)
            self.requests.record("FindCoordinator", -1, lookup_error)
            return CommittedOffsets({}, {lookup_error: len(groups)})
        by_coordinator: dict[int, list[str]] = {}
        for group in groups:
            by_coordinator.setdefault(coordinators[group], []).append(group)
        many = self._manager.broker_version_data.api_version(OffsetFetchRequest) >= OFFSET_FETCH_MANY_GROUPS
        for coordinator, its_groups in sorted(by_coordinator.items()):
            for request_groups in [its_groups] if many else [[g] for g in its_groups]:
                try:
                    response = await self._send(
                        coordinator, offset_fetch_request(request_groups, partitions, many=many)
                    )
                except Errors.KafkaError as exc:
                    errors[error_name(exc)] += len(request_groups)
                    self._forget_coordinators(request_groups)
                    continue
                for group, error, answered in _answers(response, request_groups, many=many):
                    if error is not None:
                        errors[error] += 1
                        self.requests.record_partition_error("OffsetFetch", error)
                        if error in COORDINATOR_ERRORS:
                            self._forget_coordinators([group])
                        continue
                    for tp, (offset, partition_error) in answered.items():
                        if partition_error is not None:
                            errors[partition_error] += 1
                            self.requests.record_partition_error("OffsetFetch", partition_error)
                        elif offset >= 0:  # -1: no commit there
                            offsets[(group, tp)] = offset
        return CommittedOffsets(offsets, dict(errors))

    async def _send(self, broker: int, request: Any) -> Any:
        try:
            response = await self._manager.send(request, node_id=broker)
        except Errors.KafkaError as exc:
            self.requests.record("OffsetFetch", broker, error_name(exc))
            raise
        self.requests.record("OffsetFetch", broker)
        return response

    def _forget_coordinators(self, groups: Sequence[str]) -> None:
        # kafka-python caches each group's coordinator for the admin's life; the next lookup asks FindCoordinator.
        cached: dict[Any, Any] = self._manager.cluster._coordinators
        for group in groups:
            for key in [k for k in cached if k[1] == group]:
                del cached[key]


def offset_fetch_request(
    groups: Sequence[str], partitions: Sequence[TP], *, many: bool, require_stable: bool = False
) -> Any:
    """OffsetFetch of `groups`' committed offsets on `partitions`: v8 for many groups in one request, else one
    group at v7 or older; `require_stable` (one group, v7 exactly) makes pending offsets answer
    UNSTABLE_OFFSET_COMMIT, as every read_committed consumer asks."""
    by_topic: dict[str, list[int]] = {}
    for topic, partition in partitions:
        by_topic.setdefault(topic, []).append(partition)
    if many:
        group = OffsetFetchRequest.OffsetFetchRequestGroup
        topic = group.OffsetFetchRequestTopics
        return OffsetFetchRequest(
            groups=[
                group(group_id=g, topics=[topic(name=t, partition_indexes=ps) for t, ps in by_topic.items()])
                for g in groups
            ],
            require_stable=require_stable,
            min_version=OFFSET_FETCH_MANY_GROUPS,
            max_version=OFFSET_FETCH_MANY_GROUPS,
        )
    (only,) = groups
    topic_ = OffsetFetchRequest.OffsetFetchRequestTopic
    stable: dict[str, Any] = (
        {"require_stable": True, "min_version": REQUIRE_STABLE_VERSION} if require_stable else {}
    )
    return OffsetFetchRequest(
        group_id=only,
        topics=[topic_(name=t, partition_indexes=ps) for t, ps in by_topic.items()],
        max_version=OFFSET_FETCH_MANY_GROUPS - 1,
        **stable,
    )


def has_unstable_offsets(response: Any) -> bool:
    """The OffsetFetch answer says UNSTABLE_OFFSET_COMMIT, for the group or any partition."""
    codes = {response.error_code} | {p.error_code for t in response.topics for p in t.partitions}
    return UNSTABLE_OFFSET_COMMIT in codes


def _answers(
    response: Any, groups: Sequence[str], *, many: bool
) -> list[tuple[str, str | None, dict[TP, tuple[int, str | None]]]]:
    """(group, its error, {partition: (committed offset, partition error)}) for each group of one response."""
    if many:
        answered = [(g.group_id, g.error_code, g.topics) for g in response.groups]
    else:
        answered = [(groups[0], getattr(response, "error_code", 0), response.topics)]
    out: list[tuple[str, str | None, dict[TP, tuple[int, str | None]]]] = []
    for group, error_code, topics in answered:
        by_tp: dict[TP, tuple[int, str | None]] = {
            (t.name, p.partition_index): (p.committed_offset, code_name(p.error_code))
            for t in topics
            for p in t.partitions
        }
        out.append((group, code_name(error_code), by_tp))
    return out


def offsets_by_partition(answer: CommittedOffsets) -> dict[TP, dict[str, int]]:
    """The committed offsets regrouped: partition -> {group: offset}."""
    out: dict[TP, dict[str, int]] = {}
    for (group, tp), offset in answer.offsets.items():
        out.setdefault(tp, {})[group] = offset
    return out
