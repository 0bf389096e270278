"""Which consumer groups a long-open transaction holds up, for the collector's /metrics (the dashboard's "blocked
groups"); no verdict, no proof: what `txnwatch proposals show` reads live, kept current for a few partitions.

After each published sweep, the partitions whose oldest open transaction has been open at least `after_ms`
(`--blocked-groups-after-ms`) are looked at, oldest first, at most `MAX_PARTITIONS_ASKED`:

- on a partition of `__consumer_offsets` the blocked group is the one whose offset commit the transaction holds
  (the start batch's record keys, detectors/groups.py): its read_committed members cannot fetch their offsets;
- elsewhere the groups are those whose committed offset on the partition is at or past its last stable offset: a
  read_committed member gets nothing beyond the LSO, so it waits there (as `proposals show`'s "stuck" says; a
  read_uncommitted group reads on past it and is named too, its offset tells).

Cost, bounded: ListGroups (one request per broker) only when some partition qualifies, its list kept for
`GROUP_LIST_SWEEPS` sweeps; then one OffsetFetch per group coordinator for all those partitions at once
(admin/wire/groups.py). Every error is named and counted, none fails the sweep. At most `MAX_SERIES` series are
exported; what the caps and the errors left out is counted by reason.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple, Protocol, TypeVar

from admin.wire.errors import explain
from admin.wire.groups import CommittedOffsets, GroupIds, offsets_by_partition
from admin.wire.types import TP
from detectors.groups import CONSUMER_OFFSETS_TOPIC
from detectors.models import PartitionSnapshot

log = logging.getLogger(__name__)

T = TypeVar("T")

MAX_PARTITIONS_ASKED = 20
MAX_SERIES = 100
GROUP_LIST_SWEEPS = 6  # a minute at the default 10 s interval: a new group is named within it

# Why a group is blocked (the series' `reason`).
COMMITTED_AT_LSO = "committed-at-lso"
PENDING_OFFSET_COMMIT = "pending-offset-commit"
# What the lookup left out (the left-out gauge's `reason`, beside Kafka's error names).
PARTITION_CAP = "partition-cap"
SERIES_CAP = "series-cap"
# ListGroups named no group: there is none, or the principal may Describe none (Kafka filters them out silently).
NO_GROUP_LISTED = "no-group-listed"


class GroupsWire(Protocol):
    """The seam `admin.wire.groups.KafkaGroupOffsets` offers."""

    def list_group_ids(self) -> GroupIds: ...

    def committed_offsets(self, groups: Sequence[str], partitions: Sequence[TP]) -> CommittedOffsets: ...


class LongOpen(NamedTuple):
    """A partition whose oldest open transaction has been open long enough to look for whom it holds up."""

    tp: TP
    open_since_ms: int
    last_stable_offset: int | None
    commit_groups: tuple[str, ...]  # on __consumer_offsets: the groups of the pending offset commits


class BlockedGroup(NamedTuple):
    topic: str
    partition: int
    group: str
    reason: str


class BlockedReport(NamedTuple):
    """One sweep's lookup: the series to export and what was left out, by reason."""

    blocked: tuple[BlockedGroup, ...]
    left_out: Mapping[str, int]


# ------------------------------------------------------------------------------------------ pure selection


def open_longer_than(snapshots: Sequence[PartitionSnapshot], after_ms: int) -> list[LongOpen]:
    """The partitions whose oldest open transaction has been open at least `after_ms` when its leader answered,
    oldest first. A transaction of unknown age (no record time, not bounded by a sighting) is not counted old."""
    out: list[LongOpen] = []
    for snap in snapshots:
        known = [t.open_since_ms for t in snap.open_transactions if t.open_since_ms > 0]
        if not known or snap.observed_at_ms - min(known) < after_ms:
            continue
        groups = tuple(
            sorted({t.offset_commit_group for t in snap.open_transactions if t.offset_commit_group})
        )
        out.append(LongOpen((snap.topic, snap.partition), min(known), snap.last_stable_offset, groups))
    return sorted(out, key=lambda p: (p.open_since_ms, p.tp))


def at_or_past_lso(last_stable_offset: int | None, committed: Mapping[str, int]) -> list[str]:
    """The groups whose committed offset is at or past the LSO, where read_committed members wait."""
    if last_stable_offset is None:
        return []
    return sorted(g for g, offset in committed.items() if offset >= last_stable_offset)


def needs_offsets(p: LongOpen) -> bool:
    """Whether committed offsets say anything here: nobody consumes `__consumer_offsets` through a group (its
    transaction blocks the group of its pending commit instead), and without an LSO there is nothing to compare."""
    return p.tp[0] != CONSUMER_OFFSETS_TOPIC and p.last_stable_offset is not None


def blocked_groups(
    asked: Sequence[LongOpen], committed: Mapping[TP, Mapping[str, int]]
) -> list[BlockedGroup]:
    """Every (partition, group) held up, in the order the partitions were asked (oldest first)."""
    out: list[BlockedGroup] = []
    for p in asked:
        topic, partition = p.tp
        if topic == CONSUMER_OFFSETS_TOPIC:
            out += [BlockedGroup(topic, partition, g, PENDING_OFFSET_COMMIT) for g in p.commit_groups]
        else:
            waiting = at_or_past_lso(p.last_stable_offset, committed.get(p.tp, {}))
            out += [BlockedGroup(topic, partition, g, COMMITTED_AT_LSO) for g in waiting]
    return out


def first(items: Sequence[T], limit: int) -> tuple[list[T], int]:
    """The first `limit` items and how many were left out."""
    return list(items[:limit]), max(0, len(items) - limit)


# ------------------------------------------------------------------------------------------ the lookup


class BlockedGroups:
    """Runs the lookup after each published sweep and exports it (`CollectorMetrics.observe_blocked_groups`).

    Args:
        wire: ListGroups and OffsetFetch.
        after_ms: how long a partition's oldest transaction has been open before its groups are looked up.
        report: where each sweep's report goes (the metrics), None to only return it.
    """

    def __init__(
        self,
        wire: GroupsWire,
        *,
        after_ms: int,
        report: Callable[[BlockedReport], object] | None = None,
        max_partitions: int = MAX_PARTITIONS_ASKED,
        max_series: int = MAX_SERIES,
        group_list_sweeps: int = GROUP_LIST_SWEEPS,
    ) -> None:
        self._wire = wire
        self._after_ms = after_ms
        self._report = report
        self._max_partitions = max_partitions
        self._max_series = max_series
        self._group_list_sweeps = group_list_sweeps
        self._groups: tuple[str, ...] | None = None
        self._listed_at = 0  # the lookup (counted in `_lookups`) that listed the groups
        self._lookups = 0
        self._noted: set[str] = set()

    def after_sweep(self, snapshots: Sequence[PartitionSnapshot]) -> BlockedReport:
        """The groups the sweep's long-open partitions hold up. Never raises: an unexpected failure exports
        nothing and is counted (CLIENT_ERROR), the sweep stands."""
        try:
            report = self._look_up(snapshots)
        except Exception as exc:  # the sweep was published; a lookup must not make it count as failed
            self._note(f"blocked consumer groups not read: {exc!r}")
            report = BlockedReport((), {"CLIENT_ERROR": 1})
        if self._report is not None:
            self._report(report)
        return report

    def _look_up(self, snapshots: Sequence[PartitionSnapshot]) -> BlockedReport:
        left_out: Counter[str] = Counter()
        asked, not_asked = first(open_longer_than(snapshots, self._after_ms), self._max_partitions)
        if not_asked:
            left_out[PARTITION_CAP] = not_asked
        wanted = [p.tp for p in asked if needs_offsets(p)]
        committed: dict[TP, dict[str, int]] = {}
        if wanted:
            self._lookups += 1
            groups = self._group_list(left_out)
            if not groups:
                left_out[NO_GROUP_LISTED] = len(wanted)
            answer = self._wire.committed_offsets(groups, wanted)
            for error, n in answer.errors.items():
                left_out[error] += n
                self._note(explain("OffsetFetch", error, "consumer groups"))
            committed = offsets_by_partition(answer)
        kept, beyond = first(blocked_groups(asked, committed), self._max_series)
        if beyond:
            left_out[SERIES_CAP] = beyond
        return BlockedReport(tuple(kept), dict(left_out))

    def _group_list(self, left_out: Counter[str]) -> tuple[str, ...]:
        # Listed again every `group_list_sweeps` lookups, and after a failed listing; a failed listing keeps
        # the last list (the groups rarely change), counted by its error.
        due = self._groups is None or self._lookups - self._listed_at >= self._group_list_sweeps
        if due:
            listed = self._wire.list_group_ids()
            if listed.error is None:
                self._groups, self._listed_at = listed.groups, self._lookups
            else:
                left_out[listed.error] += 1
                self._note(explain("ListGroups", listed.error, "consumer groups"))
        return self._groups or ()

    def _note(self, message: str) -> None:
        # Each distinct problem is logged once; the left-out gauge counts it every sweep.
        if message not in self._noted:
            self._noted.add(message)
            log.warning("%s", message)
