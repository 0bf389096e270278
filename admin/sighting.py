"""When the collector saw each open transaction: the bounds of its opening on the collector's own clock.

A transaction's records carry client time (CreateTime): Kafka Streams stamps its output with its input's event
time, MirrorMaker 2 and Flink keep the source's, and brokers accept any past timestamp by default
(`log.message.timestamp.before.max.ms`). So a transaction that opened 100 ms ago can carry records stamped two
hours ago, or ahead of every clock. What the collector saw bounds it instead: the partition's previous report
did not have it open (it opened after that report), and the first report that had it open did (it opened before
that). Both travel on `OpenTransaction` (`opened_after_ms`, `seen_open_ms`); `detectors.models.open_since_ms`
holds the records' time between them.
"""

from __future__ import annotations

from collections.abc import Iterable

TP = tuple[str, int]
# A transaction on its partition: producer id and start offset (a start offset is never reused).
_Txn = tuple[int, int]


class Sightings:
    """Per partition, when it was last reported and, per open transaction, its (opened after, seen open) bounds.

    Memory: one timestamp per partition reported and one pair per open transaction; a transaction is forgotten
    once a report of its partition no longer has it open.
    """

    def __init__(self) -> None:
        self._reported_at: dict[TP, int] = {}
        self._bounds: dict[TP, dict[_Txn, tuple[int | None, int]]] = {}

    def bounds(
        self, tp: TP, producer_id: int, start_offset: int, at_ms: int, seen_before_ms: int | None = None
    ) -> tuple[int | None, int]:
        """(opened after, seen open) of a transaction reported open at `at_ms`: fixed at its first report.

        Opened after is the partition's previous report (which did not have it open: it would be known
        otherwise), None when the collector had not reported the partition before (its first sweep, a partition
        new to it, or a restart: the records' time is all there is then). `seen_before_ms`: an earlier moment
        it was known open (the probe's, admin/redescribe.py)."""
        per_partition = self._bounds.setdefault(tp, {})
        known = per_partition.get((producer_id, start_offset))
        if known is None:
            seen = at_ms if seen_before_ms is None else min(at_ms, seen_before_ms)
            known = (self._reported_at.get(tp), seen)
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

    def knows(self, tp: TP, start_offset: int) -> bool:
        """A report had a transaction open from `start_offset` on `tp`, still open at the partition's last report."""
        return any(start == start_offset for _, start in self._bounds.get(tp, {}))

    def __len__(self) -> int:
        return sum(len(v) for v in self._bounds.values())
