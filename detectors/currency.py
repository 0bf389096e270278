"""How current the coordinator view is, measured from offsets, never assumed: `ViewCurrency` (pure, plain-data
state) keeps, per `__transaction_state` partition, how far the job has read and as of when that makes it current,
which reports' ends it covers, and the undecodable records that keep a verdict from being proof. The argument:
docs/detection.md, section 4 ("Currency", "Ordered by offsets", "Records that do not decode").
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from detectors.placement import coordinator_partition_for

# Positions not yet covered are kept oldest first; beyond this many (an hour of 5 s sweeps) every other one of
# the older half is dropped. Safe: a dropped position only removes a moment we could have claimed currency at.
MAX_PENDING_POSITIONS = 720


def coordinator_partition(transactional_id: str, partitions: int) -> int:
    """The `__transaction_state` partition of a transactional id (`detectors.placement`). Checked against records
    captured from a real broker in the tests."""
    return coordinator_partition_for(transactional_id, partitions)


def sweep_number(sweep_id: str) -> tuple[str, int] | None:
    """(run, number) of a collector's sweep id `<run>-<number>`; None for any other form."""
    run, dash, number = sweep_id.rpartition("-")
    if not dash or not run or not number.isdigit():
        return None
    return run, int(number)


class Position(NamedTuple):
    """One `CoordinatorLogPosition`, as plain data."""

    as_of_ms: int
    topic: str
    partitions: int
    end_offsets: tuple[tuple[int, int], ...]  # (partition, high watermark), sorted


# Where a partition's records were read with some missing (cleaned away by compaction), per (topic, partition): the
# first offset that may have lost a record and the newest time a gap was read (the reader's clock, after the
# fetch). A position measured no later than that (within the clock skew) may have an end offset below a record that
# superseded a cleaned one, so it cannot vouch for the partition beyond the gap. `gaps` and `rewound` are absent in
# checkpoints of v0.1.0 (they load empty).
GapState = dict[tuple[str, int], tuple[int, int]]
# Partitions whose records were read again at offsets below what had been applied (the log was truncated and
# rewritten: an unclean leader election): the view holds records the log no longer has, so nothing that depends on
# the partition is proven until the job reads the log again on a new checkpoint. (topic, partition) -> the offset.
RewoundState = dict[tuple[str, int], int]
# The log end offsets of the transaction log's positions: (as_of_ms, ((partition, log end offset), ...)), oldest
# first. Absent in checkpoints of earlier releases (nothing is checked).
LogEndState = list[tuple[int, tuple[tuple[int, int], ...]]]
# Log ends are dropped oldest first only, once older than this before the newest or beyond MAX_LOG_END_POSITIONS;
# the newest dropped `as_of_ms` is kept, and a moment at or before it is answered "maybe after" (`appended_after`).
LOG_END_HORIZON_MS = 15 * 60_000
MAX_LOG_END_POSITIONS = 720
# What releases that kept only the newest 16 log ends stored: a full list of them may have dropped older ones.
LEGACY_LOG_END_POSITIONS = 16
# The transaction log's end offsets of the newest positions of each collector run, by the sweep's number in that
# run (a sweep id is `<run>-<number>`; a run is one collector process, whose sweeps run one after another): what
# orders a coordinator record before a report of a later sweep of the same run without a clock
# (`ends_before_report`), and shows the view current as of a report without one (`current_for_report`).
# run -> [(number, as_of_ms, ((partition, end offset), ...)), ...], oldest first.
ReportEndsState = dict[str, list[tuple[int, int, tuple[tuple[int, int], ...]]]]
# Kept per run: a batch may bring several sweeps' positions with their reports (a re-describe a second).
REPORT_ENDS_PER_RUN = 8
# Runs kept: collectors restart, and two may run at once during a rollout; the runs least recently heard from go.
MAX_REPORT_END_RUNS = 4
# Records read but not decoded, not yet superseded: (topic, transactional id) -> read offset of the newest;
# (topic, partition) -> read offset of the newest whose key did not decode either; how many were read in all.
UndecodableState = tuple[dict[tuple[str, str], int], dict[tuple[str, int], int], int]
# applied ends, currency per partition, pending positions, newest position per topic, first position's time,
# undecodable records (absent in checkpoints of v0.1.0: the first five only), gaps and rewound partitions, log ends,
# the newest log end dropped (absent before it was kept)
CurrencyState = tuple[
    dict[tuple[str, int], int],
    dict[tuple[str, int], int],
    list[Position],
    dict[str, Position],
    int | None,
    UndecodableState,
    GapState,
    RewoundState,
    LogEndState,
    int | None,
    ReportEndsState,
    set[int],
]
LegacyCurrencyState = tuple[
    dict[tuple[str, int], int], dict[tuple[str, int], int], list[Position], dict[str, Position], int | None
]


class ViewLag(NamedTuple):
    """How far the view is behind the newest position the collector published (for metrics and the console)."""

    measured: bool  # a position has been received for every coordinator topic
    current: bool  # every partition has been applied up to the newest position
    lag_ms: int  # newest position's as_of minus the oldest partition currency (0 when current)
    records_behind: int  # records below the newest positions not applied yet
    current_as_of_ms: int | None  # the whole view (all partitions of every topic) is current as of this
    undecodable_pending: int = 0  # undecodable records not superseded yet (ids and keyless partitions)
    undecodable_records: int = 0  # undecodable coordinator records read, in all


class ViewCurrency:
    """Per coordinator topic and partition: how far the view has applied records, and as of when it is current.

    Args:
        transaction_log: the topic read as `__transaction_state` (its partition of a transactional id is
            `coordinator_partition`), or None.
        other_topics: coordinator topics without that layout (the describe fallback's topic): a transaction
            needs all of their partitions current.
        state: what `state()` returned earlier (restores the bookkeeping).
        clock_skew_ms: how far the reader's clock (when it read a gap) and the collector's (a position's
            `as_of_ms`) may disagree.
    """

    def __init__(
        self,
        transaction_log: str | None,
        other_topics: Iterable[str] = (),
        # CurrencyState, or a shorter tuple stored by an earlier version (LegacyCurrencyState: v0.1.0)
        state: tuple[Any, ...] | None = None,
        *,
        clock_skew_ms: int = 0,
    ) -> None:
        self.transaction_log = transaction_log
        self.clock_skew_ms = clock_skew_ms
        self.topics = tuple(([transaction_log] if transaction_log else []) + list(other_topics))
        applied, current, pending, newest, first = (state or ({}, {}, [], {}, None))[:5]
        undecodable_ids, undecodable_partitions, undecodable_records = (
            state[5] if state is not None and len(state) > 5 else ({}, {}, 0)
        )
        self.undecodable_ids: dict[tuple[str, str], int] = dict(undecodable_ids)
        self.undecodable_partitions: dict[tuple[str, int], int] = dict(undecodable_partitions)
        self.undecodable_records: int = undecodable_records
        self.gaps: GapState = dict(state[6]) if state is not None and len(state) > 6 else {}
        self.rewound: RewoundState = dict(state[7]) if state is not None and len(state) > 7 else {}
        self.log_ends: LogEndState = list(state[8]) if state is not None and len(state) > 8 else []
        # the `as_of_ms` of the newest log end dropped: the first position after a moment up to it may be gone
        self.log_ends_dropped_ms: int | None = state[9] if state is not None and len(state) > 9 else None
        if state is not None and len(state) == 9 and len(self.log_ends) >= LEGACY_LOG_END_POSITIONS:
            self.log_ends_dropped_ms = self.log_ends[0][0]  # a release that dropped beyond 16 said not which
        # absent in checkpoints of releases that ordered nothing by offsets: every proof waits for the clocks
        self.report_ends: ReportEndsState = (
            {run: list(ends) for run, ends in state[10].items()}
            if state is not None and len(state) > 10
            else {}
        )
        # Transaction log partitions whose end offset went down between two positions of one run (the log was
        # truncated: an offset below an end measured earlier may now hold a later record): nothing is ordered by
        # their offsets any more in this checkpoint.
        self.ordering_off: set[int] = set(state[11]) if state is not None and len(state) > 11 else set()
        self.applied_end: dict[tuple[str, int], int] = dict(applied)
        self._current: dict[tuple[str, int], int] = dict(current)
        self._pending: list[Position] = list(pending)
        self.newest: dict[str, Position] = dict(newest)
        self.first_as_of_ms: int | None = first
        # Covering pending positions walks all of them: done once, when a question is asked, not per input row
        # (a batch brings one progress row per stage-1 bucket and partition; under lag hundreds are pending).
        self._dirty = bool(self._pending)

    @property
    def current(self) -> dict[tuple[str, int], int]:
        """Per (topic, partition): the latest `as_of_ms` whose end offset has been applied."""
        self._settle()
        return self._current

    @property
    def pending(self) -> list[Position]:
        """Positions not yet covered on every partition, oldest first."""
        self._settle()
        return self._pending

    def state(self) -> CurrencyState:
        """Plain data for a state store (pickled; restored by the constructor)."""
        self._settle()
        undecodable = (self.undecodable_ids, self.undecodable_partitions, self.undecodable_records)
        return (
            self.applied_end,
            self._current,
            self._pending,
            self.newest,
            self.first_as_of_ms,
            undecodable,
            self.gaps,
            self.rewound,
            self.log_ends,
            self.log_ends_dropped_ms,
            self.report_ends,
            self.ordering_off,
        )

    # -- input

    def applied(self, topic: str, partition: int, next_offset: int) -> bool:
        """Every record of `topic`-`partition` below `next_offset` has been applied to the view.

        Returns:
            Whether anything changed.
        """
        key = (topic, partition)
        if next_offset <= self.applied_end.get(key, 0):
            return False
        self.applied_end[key] = next_offset
        self._dirty = True
        return True

    def read(self, topic: str, partition: int, breaks: Iterable[tuple[int, int]], read_at_ms: int) -> bool:
        """Where one batch's reading of `topic`-`partition` did not run on from the record before: `breaks` are
        (offset read before, offset read) pairs, -1 before for the batch's first row (the reader knows no record
        before it); `read_at_ms` is the reader's clock after it fetched them. Call it before the batch's `applied`.

        A gap left by compaction stops positions measured up to `read_at_ms` (plus the skew) from vouching for the
        partition past it (`_vouches`); a first offset below what was applied marks the partition rewound. Why:
        docs/detection.md, section 4, "Compaction below a position" and "A rewound coordinator log".

        Returns:
            Whether anything changed.
        """
        pairs = sorted(set(breaks), key=lambda b: b[1])
        if not pairs:
            return False
        key = (topic, partition)
        end = self.applied_end.get(key, 0)
        firsts = [offset for before, offset in pairs if before < 0]
        if firsts and min(firsts) < end:
            if key in self.rewound:
                return False
            self.rewound[key] = min(firsts)
            self._dirty = True
            return True
        starts = [end for offset in firsts if offset > end] + [
            before + 1 for before, _ in pairs if before >= 0
        ]
        if not starts:
            return False
        gap_from = min(starts)
        old = self.gaps.get(key)
        self.gaps[key] = (min(gap_from, old[0]), max(read_at_ms, old[1])) if old else (gap_from, read_at_ms)
        self._dirty = True
        return True

    def undecodable(
        self,
        topic: str,
        records: int,
        tainted: Iterable[tuple[str, int]],
        cleared: Iterable[tuple[str, int]],
        keyless: Iterable[tuple[int, int]],
    ) -> bool:
        """Records of `topic` that were read but did not decode, and the ids a decodable record freed again.

        Args:
            records: how many undecodable records were read (the counter).
            tainted: (transactional id, read offset): the id's newest record did not decode.
            cleared: (transactional id, read offset): a decodable record of the id at that offset; it supersedes
                a taint at a lower offset only.
            keyless: (partition, read offset): a record whose key did not decode either (any id of the
                partition).

        Returns:
            Whether anything changed.
        """
        changed = records > 0
        self.undecodable_records += records
        for transactional_id, offset in tainted:
            key = (topic, transactional_id)
            if offset > self.undecodable_ids.get(key, -1):
                self.undecodable_ids[key] = offset
                changed = True
        for transactional_id, offset in cleared:
            key = (topic, transactional_id)
            if key in self.undecodable_ids and offset > self.undecodable_ids[key]:
                del self.undecodable_ids[key]
                changed = True
        for partition, offset in keyless:
            where = (topic, partition)
            if offset > self.undecodable_partitions.get(where, -1):
                self.undecodable_partitions[where] = offset
                changed = True
        return changed

    def add_position(
        self,
        topic: str,
        partitions: int,
        as_of_ms: int,
        end_offsets: Mapping[int, int],
        log_end_offsets: Mapping[int, int] | None = None,
        sweep_id: str | None = None,
    ) -> bool:
        """A position the collector published. Positions of topics the view is not built from are ignored.

        Returns:
            Whether anything changed.
        """
        if topic not in self.topics:
            return False
        if topic == self.transaction_log and log_end_offsets:
            self._add_log_end(as_of_ms, tuple(sorted(log_end_offsets.items())))
        if topic == self.transaction_log and sweep_id is not None and end_offsets:
            self._add_report_ends(sweep_id, as_of_ms, tuple(sorted(end_offsets.items())))
        position = Position(as_of_ms, topic, partitions, tuple(sorted(end_offsets.items())))
        newest = self.newest.get(topic)
        if newest is None or as_of_ms >= newest.as_of_ms:
            self.newest[topic] = position
        if self.first_as_of_ms is None or as_of_ms < self.first_as_of_ms:
            self.first_as_of_ms = as_of_ms
        bisect.insort(self._pending, position)
        if len(self._pending) > MAX_PENDING_POSITIONS:
            half = len(self._pending) // 2
            self._pending = self._pending[:half:2] + self._pending[half:]
        self._dirty = True
        return True

    def _add_report_ends(self, sweep_id: str, as_of_ms: int, ends: tuple[tuple[int, int], ...]) -> None:
        """Keep the newest positions of the sweep's run by number (`ends_before_report`); an end lower than one
        an earlier sweep of the run measured turns ordering off for its partition (`ordering_off`)."""
        parsed = sweep_number(sweep_id)
        if parsed is None:
            return
        run, number = parsed
        kept = self.report_ends.pop(run, [])  # re-inserted last: the run heard from most recently
        new = dict(ends)
        for n, _, other in kept:
            for partition, end in other:
                here = new.get(partition)
                if here is not None and ((n < number and here < end) or (n > number and here > end)):
                    self.ordering_off.add(partition)
        if all(n != number for n, _, _ in kept):
            bisect.insort(kept, (number, as_of_ms, ends))
        self.report_ends[run] = kept[-REPORT_ENDS_PER_RUN:]
        while len(self.report_ends) > MAX_REPORT_END_RUNS:
            del self.report_ends[next(iter(self.report_ends))]

    def _add_log_end(self, as_of_ms: int, ends: tuple[tuple[int, int], ...]) -> None:
        """Keep a position's log ends; drop the oldest ones past the horizon or the count, remembering how far."""
        dropped = self.log_ends_dropped_ms
        if dropped is not None and as_of_ms <= dropped:
            return  # it could only answer moments that are answered "maybe after" anyway
        if self.log_ends and self.log_ends[-1][0] <= as_of_ms and self.log_ends[-1][1] == ends:
            # the same ends, measured later, answer every moment the earlier ones did
            self.log_ends[-1] = (as_of_ms, ends)
        else:
            bisect.insort(self.log_ends, (as_of_ms, ends))
        horizon = self.log_ends[-1][0] - LOG_END_HORIZON_MS
        cut = max(0, len(self.log_ends) - MAX_LOG_END_POSITIONS)
        while cut < len(self.log_ends) and self.log_ends[cut][0] < horizon:
            cut += 1
        if cut:
            newest_dropped = self.log_ends[cut - 1][0]
            self.log_ends_dropped_ms = newest_dropped if dropped is None else max(dropped, newest_dropped)
            del self.log_ends[:cut]

    def _settle(self) -> None:
        """Claim currency for every partition a pending position now covers; drop fully covered positions."""
        if not self._dirty:
            return
        self._dirty = False
        still: list[Position] = []
        for p in self._pending:
            covered = True
            for partition, end in p.end_offsets:
                key = (p.topic, partition)
                if self.applied_end.get(key, 0) >= end:
                    if self._current.get(key, -1) < p.as_of_ms and self._vouches(p, key, end):
                        self._current[key] = p.as_of_ms
                else:
                    covered = False
            if not covered:
                still.append(p)
        self._pending = still

    def _vouches(self, p: Position, key: tuple[str, int], end: int) -> bool:
        """A covered position proves the partition current unless it was measured no later than a gap was read
        (within the skew) and its end lies past the gap: then a record below its end may have been cleaned away
        for a later one above it (`read`)."""
        gap = self.gaps.get(key)
        return gap is None or end <= gap[0] or p.as_of_ms > gap[1] + self.clock_skew_ms

    # -- questions

    def appended_after(self, partition: int, offset: int, moment_ms: int) -> bool:
        """Whether the transaction log's record at `offset` of `partition` was appended after `moment_ms` (the
        collector's clock): it lies at or above the log end offset of a position measured at or after that
        moment (any one known that has the partition; the log end is asked for after `as_of_ms` is read).
        False when no such position is known: not shown, which is not the same as shown before. True when that
        first position may have been dropped (the moment is at or before `log_ends_dropped_ms`): a later one's
        log end could put the record wrongly before the moment, so the proof that weighs it is withheld. What it
        is for: docs/detection.md, "Clocks".
        """
        if self.log_ends_dropped_ms is not None and moment_ms <= self.log_ends_dropped_ms:
            return True
        start = bisect.bisect_left(self.log_ends, (moment_ms,))
        # Any of them, not only the first: positions can arrive out of order (two collectors, a restart), and
        # each one that puts the record at or above its log end shows it appended after that position.
        for _, ends in self.log_ends[start:]:
            end = dict(ends).get(partition)
            if end is not None and offset >= end:
                return True
        return False

    def ends_before_report(self, sweep_id: str) -> Mapping[int, int] | None:
        """The transaction log's end offsets (high watermarks) of the newest position the collector measured
        before it sent the requests of sweep `sweep_id`: a position of an earlier sweep of the same run. A run's
        sweeps run one after another, and a sweep measures its position after its DescribeProducers answers, so
        that position was measured before the later sweep asked anything; a record below its end was committed
        before (`detectors.rules.logged_before_report`). The sweep numbers order them, not a clock. None: no
        such position is known (another run's positions are never used: their order is only a clock's)."""
        parsed = sweep_number(sweep_id)
        if parsed is None:
            return None
        run, number = parsed
        earlier = [ends for n, _, ends in self.report_ends.get(run, ()) if n < number]
        if not earlier:
            return None
        return {p: end for p, end in earlier[-1] if p not in self.ordering_off}

    def current_for_report(self, sweep_id: str, partition: int) -> bool:
        """Whether the view of transaction log partition `partition` is shown current as of the report of sweep
        `sweep_id` without a clock: it has applied every record below that partition's end in a position of the
        same run measured at or after that sweep (after its DescribeProducers answers). A proof ordered by
        offsets needs this besides the clocks' currency (`current_as_of`), which another run's positions, or a
        collector clock that stepped back, can satisfy while the view lags. Compaction gaps count as they do for
        `current_as_of` (`_vouches`); a rewound partition, or one whose ends went down, never is."""
        parsed = sweep_number(sweep_id)
        key = (self.transaction_log or "", partition)
        if parsed is None or key in self.rewound or partition in self.ordering_off:
            return False
        run, number = parsed
        applied = self.applied_end.get(key)
        if applied is None:
            return False
        for n, as_of_ms, ends in self.report_ends.get(run, ()):
            end = dict(ends).get(partition)
            if (
                n >= number
                and end is not None
                and applied >= end
                and self._vouches(Position(as_of_ms, key[0], 0, ends), key, end)
            ):
                return True
        return False

    def current_as_of(self, transactional_id: str | None) -> int | None:
        """The time the view of everything that could own a transaction is current as of, or None if unknown.

        With the transactional id (from the coordinator record judged against), only its partition of the
        transaction log matters; without one (a producer id no record names), every partition. Topics without
        the log's layout always need every partition.
        """
        result: int | None = None
        for topic in self.topics:
            newest = self.newest.get(topic)
            if newest is None:
                return None
            if transactional_id is not None and topic == self.transaction_log:
                wanted: Iterable[int] = (coordinator_partition(transactional_id, newest.partitions),)
            else:
                wanted = range(newest.partitions)
            for partition in wanted:
                at = self.current.get((topic, partition))
                if at is None or (topic, partition) in self.rewound:
                    return None
                result = at if result is None else min(result, at)
        return result

    def undecodable_about(self, transactional_id: str | None) -> bool:
        """A record that did not decode could be about the owner of a transaction judged against
        `transactional_id`'s record (None: no record names the producer id, so any record anywhere could).

        With an id: a taint of that id, or a keyless one in a partition that could hold it (the log's partition
        of the id; any partition of the other topics). Producer ids are never handed from one transactional id
        to another, so a taint of another id cannot change this one's record.
        """
        if transactional_id is None:
            return bool(self.undecodable_ids or self.undecodable_partitions)
        if any(tid == transactional_id for _, tid in self.undecodable_ids):
            return True
        return any(self._could_hold(where, transactional_id) for where in self.undecodable_partitions)

    def rewound_about(self, transactional_id: str | None) -> bool:
        """A partition that could hold the owner's records was truncated and rewritten under the view (`read`):
        with an id, its partition of the log (or any partition of the other topics); without one, any."""
        if transactional_id is None:
            return bool(self.rewound)
        return any(self._could_hold(where, transactional_id) for where in self.rewound)

    def _could_hold(self, where: tuple[str, int], transactional_id: str) -> bool:
        """Partition `where` may hold the records of `transactional_id`: its partition of the transaction log, or
        any partition of another coordinator topic (or of the log while its partition count is unknown)."""
        topic, partition = where
        newest = self.newest.get(topic)
        if topic != self.transaction_log or newest is None:
            return True
        return partition == coordinator_partition(transactional_id, newest.partitions)

    def lag(self) -> ViewLag:
        """How far behind the newest positions the view is."""
        measured = bool(self.topics) and all(t in self.newest for t in self.topics)
        behind = 0
        newest_as_of: int | None = None
        for topic, p in self.newest.items():
            newest_as_of = p.as_of_ms if newest_as_of is None else max(newest_as_of, p.as_of_ms)
            for partition, end in p.end_offsets:
                behind += max(0, end - self.applied_end.get((topic, partition), 0))
        whole = self.current_as_of(None) if measured else None
        pending = len(self.undecodable_ids) + len(self.undecodable_partitions)
        if newest_as_of is None:
            return ViewLag(False, False, 0, 0, None, pending, self.undecodable_records)
        oldest = whole if whole is not None else self.first_as_of_ms
        lag_ms = max(0, newest_as_of - oldest) if oldest is not None else 0
        return ViewLag(
            measured,
            measured and behind == 0,
            lag_ms,
            behind,
            whole,
            pending,
            self.undecodable_records,
        )
