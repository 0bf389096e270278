"""When a ListTransactions answer counts for a `__transaction_state` partition: only from the broker that led it,
at the same leader epoch, before the request and after the answer, without an error; anything else is a gap, and
"not listed" proves nothing there. Why (a broker lists from a cache it keeps past losing a partition):
docs/collector.md, "When a listing answer counts".
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Literal, NamedTuple

from detectors.contract import TRANSACTION_LOG_TOPIC
from detectors.currency import coordinator_partition


class LogLeader(NamedTuple):
    """A `__transaction_state` partition's leader in one Metadata answer: the broker (-1: none) and its leader
    epoch (None: the answer did not carry it)."""

    broker: int
    epoch: int | None = None


GapKind = Literal[
    "no-leader",  # no leader before or after: nobody lists its ids, nobody reports an error
    "moved",  # another leader after the answer than before the request
    "epoch-unknown",  # Metadata without the leader epoch: the same leadership cannot be shown
    "epoch-changed",  # the same broker, another leader epoch: it lost the partition and took it back meanwhile
    "not-answered",  # its leader did not answer without an error (failed, loading, or not asked)
]
# The gaps the two Metadata reads show, whoever answered.
METADATA_GAPS: frozenset[GapKind] = frozenset({"no-leader", "moved", "epoch-unknown", "epoch-changed"})


class ListingGap(NamedTuple):
    """A partition whose ids the answers did not show, why (`kind`), the broker concerned (its leader after the
    answer, or before when it has none after; -1 when neither), and the reason in a user's words."""

    partition: int
    kind: GapKind
    broker: int
    detail: str


class ListingCheck(NamedTuple):
    """Which partitions' answers count (partition -> the broker whose answer counts) and the gaps, by partition."""

    partitions: int
    counted: Mapping[int, int]
    gaps: tuple[ListingGap, ...]

    @property
    def complete(self) -> bool:
        """Every partition's answer counts: an id listed by nobody is one no coordinator holds."""
        return self.partitions > 0 and not self.gaps

    def partition_of(self, transactional_id: str) -> int:
        return coordinator_partition(transactional_id, self.partitions)

    def counts(self, transactional_id: str, broker: int) -> bool:
        """Whether `broker`'s answer about `transactional_id` (a listing, or a description) counts: it led the
        id's partition at one leader epoch across the answer, and answered."""
        return self.partitions > 0 and self.counted.get(self.partition_of(transactional_id)) == broker

    def gap_of(self, partition: int) -> ListingGap | None:
        return next((g for g in self.gaps if g.partition == partition), None)

    def first(self, kinds: Iterable[GapKind]) -> ListingGap | None:
        """The first gap (by partition) of one of `kinds`."""
        wanted = frozenset(kinds)
        return next((g for g in self.gaps if g.kind in wanted), None)


def check_listing(
    before: Mapping[int, LogLeader], after: Mapping[int, LogLeader], answered: Collection[int]
) -> ListingCheck:
    """Which `__transaction_state` partitions a listing's answers show.

    Args:
        before: each partition's leader and leader epoch, from Metadata read before the request was sent.
        after: the same, from Metadata read after the answers arrived.
        answered: the brokers that answered without an error.
    """
    counted: dict[int, int] = {}
    gaps: list[ListingGap] = []
    partitions = sorted(set(before) | set(after))
    for p in partitions:
        first, now = before.get(p, LogLeader(-1)), after.get(p, LogLeader(-1))
        where = f"{TRANSACTION_LOG_TOPIC} partition {p}"
        if first.broker < 0 or now.broker < 0:
            broker = now.broker if now.broker >= 0 else first.broker
            gaps.append(ListingGap(p, "no-leader", broker, f"{where} has no leader"))
        elif first.broker != now.broker:
            gaps.append(
                ListingGap(
                    p,
                    "moved",
                    now.broker,
                    f"{where} moved from broker {first.broker} to broker {now.broker} during the listing",
                )
            )
        elif first.epoch is None or now.epoch is None:
            gaps.append(
                ListingGap(
                    p,
                    "epoch-unknown",
                    now.broker,
                    f"Metadata gave no leader epoch for {where} (broker {now.broker}): that it kept the "
                    "partition across the listing cannot be shown",
                )
            )
        elif first.epoch != now.epoch:
            gaps.append(
                ListingGap(
                    p,
                    "epoch-changed",
                    now.broker,
                    f"{where}'s leader, broker {now.broker}, went from leader epoch {first.epoch} to "
                    f"{now.epoch} during the listing: it lost the partition and took it back, and may have "
                    "answered while it did not lead it",
                )
            )
        elif now.broker not in answered:
            gaps.append(
                ListingGap(
                    p,
                    "not-answered",
                    now.broker,
                    f"broker {now.broker}, the leader of {where}, did not answer ListTransactions",
                )
            )
        else:
            counted[p] = now.broker
    return ListingCheck(len(partitions), counted, tuple(gaps))
