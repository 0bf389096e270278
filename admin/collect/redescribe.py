"""Proving re-describes: describe a partition again when a report of it can prove what the last one could not.

A HANGING proof needs a report taken once the transaction has been open for longer than the grace period, by its
records' time (skew-reduced) and since the collector first saw it open (`detectors.rules.settled`). A transaction
first seen young is proven by the next report after that moment; with full sweeps only, that is a whole sweep
interval later. So the collector keeps, per partition, when a report would settle its youngest open
transaction (`detectors.rules.settles_at_ms`), and describes just that partition then.

New transactions are seen sooner too, between sweeps, by a probe: ListOffsets (read_committed and
read_uncommitted) of every partition, one cheap request pair per broker. A last stable offset L below the high
watermark at leader epoch E means the transaction whose first batch is at L was written by then: if a later
report at the same epoch has a transaction open from L, it was open at the probe (a transaction is open from its
first batch to its marker; within one leader epoch an offset below the high watermark holds one batch). The probe's
time is then that transaction's first sighting (`seen_open_ms`), and its partition is described once a report
can settle it. After that report come two follow-ups, 1 s and 3 s later (`FOLLOW_UPS_MS`): settling is the rules'
first condition, and some proofs also wait for coordinator events a moment after the write (the orphan's owner
commits, or restarts). The probe also tells when a scheduled partition's transactions have all ended (its last
stable offset moved past them): that partition is not described again. So a busy cluster's short transactions
cost probes, not describes; a transaction that lives past grace and skew costs three describes more.

A transaction that opens behind an older open one does not move its partition's last stable offset, so the
probe does not schedule a describe for it: the next full sweep shows it. On such a pinned partition the probe
keeps the high watermark instead: the transaction's first batch lies below the high watermark of every probe
after it was written (same argument, same epoch), so the first such probe is its first sighting, and the full
sweep's report of it can settle it at once.

Reports ordered by offsets come first. Where the job reads `__transaction_state`, a proof may rest on the
transaction log's offsets instead of the clocks (`detectors.rules.logged_before_report`): a coordinator record
below the end offset a sweep measured is ordered before every report of a later sweep. An orphan's owner usually
completes (commits, aborts, or restarts) a moment after the orphan's write, so a young transaction the probe
sees is described 1 s after the sighting (short transactions have ended by then, and the probe then drops them),
and again 1 s after each of its first four reports while none settles it (`ORDERED_FOLLOW_UPS_MS`): each measures
a position past the owner's records so far, and the next is ordered after them. An owner that restarts completes
within a second or two; one that lives on shows it moved on by a transaction begun the skew tolerance (2 s) after
the sighting, which the fourth report is ordered after. The report that settles it by the clocks follows as before.

None of this decides anything: the reports are ordered snapshots, judged by the same rules.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from admin.wire.types import TP, Offsets
from detectors.models import DetectionLimits, PartitionSnapshot
from detectors.rules import settles_at_ms

# After the moment a report settles, so that the report's send time (its `observed_at_ms`) is past it.
MARGIN_MS = 100
# After the report that settles a transaction, its partition is described again this long after each report
# (while the transaction stays at its last stable offset). Settling is the rules' first condition; others wait
# for coordinator events: an orphan's owner usually commits (the `coordinator-completed` proof needs the report
# to postdate the completion by grace and skew) and often restarts (InitProducerId) a moment after the orphan's
# write, which the collector cannot see. Without them the proof waits for the next full sweep.
FOLLOW_UPS_MS = (1_000, 2_000)
# A report this close (plus the skew tolerance) after the moment it settles is the proving one (a re-describe's)
# and gets the follow-ups; one much later (a full sweep's of an old transaction) does not.
FOLLOW_UP_WINDOW_MS = 1_000
# Where proofs can be ordered by the transaction log's offsets (`ordered=True`): a new sighting is described this
# long after the probe saw it (a transaction still open then is no short one; the next probe drops the rest), and
# a report of a transaction not settled yet is followed by another this long after it, at most this many times.
ORDERED_FIRST_REPORT_MS = 1_000
ORDERED_FOLLOW_UPS_MS = (1_000, 1_000, 1_000, 1_000)
# High-watermark marks kept per pinned partition between its reports (one a probe, when the mark moved).
MAX_MARKS = 16


@dataclass(frozen=True, slots=True)
class ProbeSighting:
    """The probe saw a transaction open from `start_offset` (the last stable offset) at `seen_at_ms`, at the
    leader epoch it asked with."""

    start_offset: int
    leader_epoch: int
    seen_at_ms: int


@dataclass(frozen=True, slots=True)
class Due:
    """Describe the partition at `at_ms`, unless every transaction it waits for (start offsets up to
    `last_start_offset`) has ended by then."""

    at_ms: int
    last_start_offset: int


class Redescribes:
    """Which partitions to describe when, between full sweeps. Memory: one entry per partition with a young open
    transaction (a probe sighting and a due time)."""

    def __init__(self, limits: DetectionLimits, *, margin_ms: int = MARGIN_MS, ordered: bool = False) -> None:
        """`ordered`: the job can order proofs by the transaction log's offsets (it reads `__transaction_state`):
        young transactions are described early and again (`ORDERED_FOLLOW_UPS_MS`), not only once settled."""
        self._limits = limits
        self._margin_ms = margin_ms
        self._ordered = ordered
        # Ordered follow-ups done per young transaction (partition, start offset), while it is reported open.
        self._ordered_done: dict[tuple[TP, int], int] = {}
        self._probed: dict[TP, ProbeSighting] = {}
        self._due: dict[TP, Due] = {}
        # Follow-ups done per settled transaction (partition, start offset), while it is reported open.
        self._followed: dict[tuple[TP, int], int] = {}
        # Per partition whose last stable offset a reported transaction pins: (high watermark, leader epoch,
        # seen at) at each probe since its last report, the high watermark rising. A transaction that opens
        # behind the pinning one does not move the last stable offset, so the probe cannot see it; but its first
        # batch lies below the high watermark of every probe after it was written, which bounds its opening for
        # the report that first shows it (`seen_open_ms`).
        self._marks: dict[TP, list[tuple[int, int, int]]] = {}

    def probed(self, tp: TP, offsets: Offsets, leader_epoch: int | None, at_ms: int, *, known: bool) -> None:
        """One partition's probe answer, received by `at_ms`. `known`: the collector already saw the transaction
        at the last stable offset open (its reports carry that sighting)."""
        lso, hw = offsets.last_stable_offset, offsets.high_watermark
        if offsets.error is not None or lso is None or hw is None:
            return
        due = self._due.get(tp)
        if due is not None and (lso >= hw or lso > due.last_start_offset):
            del self._due[tp]  # every transaction it waited for has ended: nothing left to prove there
        if lso >= hw or leader_epoch is None:
            # Without an epoch the probe cannot tell this batch from one written at the same offset after a
            # truncation, so it proves no sighting.
            return
        if known:
            self._mark(tp, hw, leader_epoch, at_ms)
            return
        seen = self._probed.get(tp)
        if seen is not None and seen.start_offset == lso and seen.leader_epoch == leader_epoch:
            return  # the same transaction, first seen earlier
        self._probed[tp] = ProbeSighting(lso, leader_epoch, at_ms)
        # Its records' time is unknown until a report fetches its first batch, but a report holds it to the
        # sighting at the latest (`detectors.models.open_since_ms`): so this moment settles it whatever it is.
        settles = settles_at_ms(at_ms, at_ms, self._limits) or at_ms
        self._schedule(tp, min(settles, at_ms + ORDERED_FIRST_REPORT_MS) if self._ordered else settles, lso)

    def seen_open_ms(self, tp: TP, start_offset: int, leader_epoch: int | None) -> int | None:
        """The earliest probe by which the batch at `start_offset` of `tp` was written, if a report at
        `leader_epoch` has a transaction open from there (the same epoch: the same batch at that offset): the
        probe that saw it at the last stable offset, or the first whose high watermark was past it."""
        if leader_epoch is None:
            return None
        times: list[int] = []
        seen = self._probed.get(tp)
        if seen is not None and seen.start_offset == start_offset and seen.leader_epoch == leader_epoch:
            times.append(seen.seen_at_ms)
        for hw, epoch, at_ms in self._marks.get(tp, ()):
            if epoch == leader_epoch and hw > start_offset:
                times.append(at_ms)
                break  # the marks rise: the first is the earliest
        return min(times, default=None)

    def _mark(self, tp: TP, hw: int, leader_epoch: int, at_ms: int) -> None:
        marks = self._marks.setdefault(tp, [])
        if marks and marks[-1][0] >= hw and marks[-1][1] == leader_epoch:
            return
        if len(marks) >= MAX_MARKS:
            marks.pop()  # the later marks are the coarser: the earliest stay
        marks.append((hw, leader_epoch, at_ms))

    def reported(self, asked: Iterable[TP], snapshots: Sequence[PartitionSnapshot]) -> None:
        """A sweep asked about `asked` and published `snapshots`: each asked partition's probe sighting is spent
        (its reports carry it) and its due time dropped (one not described waits for the next full sweep); a
        partition whose report has a transaction no report has settled yet is due when one can."""
        for tp in asked:
            self._probed.pop(tp, None)
            self._marks.pop(tp, None)
            self._due.pop(tp, None)
        reported: set[TP] = set(asked)
        open_now: set[tuple[TP, int]] = set()
        for snap in snapshots:
            tp = (snap.topic, snap.partition)
            reported.add(tp)
            self._probed.pop(tp, None)
            self._marks.pop(tp, None)
            self._due.pop(tp, None)
            for t in snap.open_transactions:
                open_now.add((tp, t.start_offset))
                at = settles_at_ms(t.open_since_ms, t.seen_open_ms, self._limits)
                if at is None:
                    continue
                if at > snap.observed_at_ms:
                    self._schedule(tp, at, t.start_offset)
                    self._ordered_follow_up(tp, t.start_offset, snap.observed_at_ms)
                else:
                    self._follow_up(tp, t.start_offset, at, snap.observed_at_ms)
        for done in (self._followed, self._ordered_done):
            for key in [k for k in done if k[0] in reported and k not in open_now]:
                del done[key]  # ended, or its partition's report no longer has it

    def taken(self, tps: Iterable[TP]) -> None:
        """A re-describe of `tps` begins: not due again unless its report says so (`reported`), even if it fails."""
        for tp in tps:
            self._due.pop(tp, None)

    def due(self, now_ms: int) -> list[TP]:
        """The partitions to describe now."""
        return sorted(tp for tp, d in self._due.items() if d.at_ms <= now_ms)

    def due_at_ms(self, tp: TP) -> int | None:
        """When `tp` is due, None if it is not scheduled."""
        due = self._due.get(tp)
        return None if due is None else due.at_ms

    def next_due_ms(self) -> int | None:
        return min((d.at_ms for d in self._due.values()), default=None)

    def _follow_up(self, tp: TP, start_offset: int, settled_at_ms: int, observed_at_ms: int) -> None:
        done = self._followed.get((tp, start_offset))
        # A probe's re-describe comes up to the skew tolerance after the settling moment (it cannot know the
        # records' time beforehand).
        window_ms = FOLLOW_UP_WINDOW_MS + self._limits.clock_skew_ms + self._margin_ms
        if done is None and observed_at_ms - settled_at_ms > window_ms:
            return  # settled long before this report: not the proving one
        done = done or 0
        if done >= len(FOLLOW_UPS_MS):
            return
        self._followed[(tp, start_offset)] = done + 1
        self._schedule(tp, observed_at_ms + FOLLOW_UPS_MS[done] - self._margin_ms, start_offset)

    def _ordered_follow_up(self, tp: TP, start_offset: int, observed_at_ms: int) -> None:
        # A young transaction's next report, ordered after this one's position (module docstring).
        done = self._ordered_done.get((tp, start_offset), 0)
        if not self._ordered or done >= len(ORDERED_FOLLOW_UPS_MS):
            return
        self._ordered_done[(tp, start_offset)] = done + 1
        self._schedule(tp, observed_at_ms + ORDERED_FOLLOW_UPS_MS[done] - self._margin_ms, start_offset)

    def _schedule(self, tp: TP, settles_at_ms: int, start_offset: int) -> None:
        at = settles_at_ms + self._margin_ms
        known = self._due.get(tp)
        if known is None:
            self._due[tp] = Due(at, start_offset)
        else:
            # The earliest moment one of them can be proven; keep watching the latest start offset.
            self._due[tp] = Due(min(known.at_ms, at), max(known.last_start_offset, start_offset))
