"""When the collector saw each open transaction: the bounds of its opening on the collector's own clock.

A transaction's records carry client time (CreateTime): Kafka Streams stamps its output with its input's event
time, MirrorMaker 2 and Flink keep the source's, and brokers accept any past timestamp by default
(`log.message.timestamp.before.max.ms`). So a transaction that opened 100 ms ago can carry records stamped two
hours ago, or ahead of every clock. What the collector saw bounds it instead: the partition's previous report
did not have it open (it opened after that report), and the first report that had it open did (it opened before
that). Both travel on `OpenTransaction` (`opened_after_ms`, `seen_open_ms`); `detectors.models.open_since_ms`
holds the records' time between them.

Every snapshot the collector publishes carries them, so a restarted collector starts from the snapshot topic's
recent tail (`Sightings.from_snapshots`, read by admin/collect/restore.py) instead of seeing every open transaction anew.
"""

from __future__ import annotations

from collections.abc import Iterable

from detectors.models import PartitionSnapshot

TP = tuple[str, int]
# A transaction on its partition: producer id and start offset (a start offset is never reused).
_Txn = tuple[int, int]
# (opened after, seen open) of one transaction.
_Bounds = tuple[int | None, int]


def _earliest(a: _Bounds, b: _Bounds) -> _Bounds:
    """Two sightings of one transaction: the earliest wins. A bound that is not before the sighting came from a
    report that should have had it open (a stale answer): it is dropped, as the job does
    (`detectors.tracking.earliest_sightings`)."""
    seen = min(a[1], b[1])
    after = min((t for t in (a[0], b[0]) if t is not None), default=None)
    return (after if after is not None and after < seen else None, seen)


class Sightings:
    """Per partition, when it was last reported and, per open transaction, its (opened after, seen open) bounds.

    Memory: one timestamp per partition reported and one pair per open transaction; a transaction is forgotten
    once a report of its partition no longer has it open.
    """

    def __init__(self) -> None:
        self._reported_at: dict[TP, int] = {}
        self._bounds: dict[TP, dict[_Txn, _Bounds]] = {}

    @classmethod
    def from_snapshots(cls, snapshots: Iterable[PartitionSnapshot], cluster: str) -> Sightings:
        """The sightings `cluster`'s snapshots left, read in the order they were published (a restart's start).

        Per partition: each transaction its newest snapshot has open, with the earliest bounds any snapshot gave
        it, and that snapshot's time as the partition's last report (a transaction it did not have open opened
        after it). Snapshots of other clusters are ignored."""
        newest: dict[TP, PartitionSnapshot] = {}
        earliest: dict[tuple[TP, _Txn], _Bounds] = {}
        for snap in snapshots:
            if snap.cluster != cluster:
                continue  # another cluster's collector may publish to the same topic
            tp = (snap.topic, snap.partition)
            newest[tp] = snap
            for t in snap.open_transactions:
                if t.seen_open_ms is None:
                    continue  # published before sightings were
                key, seen = (tp, (t.producer_id, t.start_offset)), (t.opened_after_ms, t.seen_open_ms)
                earliest[key] = seen if key not in earliest else _earliest(earliest[key], seen)
        sightings = cls()
        for tp, snap in newest.items():
            open_then = [(t.producer_id, t.start_offset) for t in snap.open_transactions]
            known = {txn: earliest[(tp, txn)] for txn in open_then if (tp, txn) in earliest}
            if known:
                sightings._bounds[tp] = known
            # A transaction open at that report but not restored would take the report's time as "opened after".
            if len(known) == len(open_then):
                sightings._reported_at[tp] = snap.observed_at_ms
        return sightings

    def bounds(
        self, tp: TP, producer_id: int, start_offset: int, at_ms: int, seen_before_ms: int | None = None
    ) -> _Bounds:
        """(opened after, seen open) of a transaction reported open at `at_ms`: fixed at its first report (or
        restored), only ever made earlier.

        Opened after is the partition's previous report (which did not have it open: it would be known
        otherwise), None when the collector had not reported the partition before (its first sweep, a partition
        new to it, or a restart the snapshot topic did not cover: the records' time is all there is then).
        `seen_before_ms`: an earlier moment it was known open (the probe's, admin/collect/redescribe.py)."""
        per_partition = self._bounds.setdefault(tp, {})
        known = per_partition.get((producer_id, start_offset))
        if known is None:
            known = (self._reported_at.get(tp), at_ms)
        if seen_before_ms is not None:
            known = _earliest(known, (None, seen_before_ms))
        per_partition[(producer_id, start_offset)] = known
        return known

    def reported(self, tp: TP, at_ms: int, open_now: Iterable[_Txn]) -> None:
        """Partition `tp` was reported at `at_ms` with these (producer id, start offset) open: later
        transactions opened after it, and transactions no longer open are forgotten."""
        self._reported_at[tp] = max(at_ms, self._reported_at.get(tp, at_ms))
        per_partition = self._bounds.get(tp)
        if per_partition:
            live = set(open_now)
            kept = {txn: b for txn, b in per_partition.items() if txn in live}
            if kept:
                self._bounds[tp] = kept
            else:
                del self._bounds[tp]

    def holds_open(self, tp: TP) -> bool:
        """A transaction on `tp` that the partition's last report still had open."""
        return bool(self._bounds.get(tp))

    def knows(self, tp: TP, start_offset: int) -> bool:
        """A report had a transaction open from `start_offset` on `tp`, still open at the partition's last report."""
        return any(start == start_offset for _, start in self._bounds.get(tp, {}))

    def __len__(self) -> int:
        return sum(len(v) for v in self._bounds.values())
