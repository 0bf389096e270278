"""When an owner's transactions began, as marks (start time, log offset) that survive the fold of its records: the
decoder keeps one per half second (`begin_marks`), stage 1 merges them (`merged_marks`), and stage 2 orders an
owner-moved-on proof by the first that began after the orphan was seen open (docs/detection.md, section 4)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

# One mark per this much start time: how much later than its first transaction a busy owner's proof may be
# ordered, against the rows it costs (a Kafka Streams thread commits every 100 ms).
MARK_SPACING_MS = 500
# The newest this many marks per record: a catch-up folds hours of an owner's records, and only transactions
# begun after a recent sighting order anything.
MAX_MARKS = 16

Mark = tuple[int, int]  # (start_timestamp_ms of the transaction, log offset of one of its records)

# Spark's to_json writes no spaces, Python's json.dumps does: a record without marks has null there.
_MARKS_KEYS = ('"began_since":[', '"began_since": [')


def thinned(marks: Iterable[Mark]) -> list[Mark]:
    """`marks` in log order, one per MARK_SPACING_MS of start time at most, the newest MAX_MARKS. A later record of
    a transaction stands for its start too: an offset at or after the transaction's first record is the safe side
    of every comparison stage 2 makes with it."""
    out: list[Mark] = []
    for start, offset in marks:
        if start > 0 and (not out or start >= out[-1][0] + MARK_SPACING_MS):
            out.append((start, offset))
    return out[-MAX_MARKS:]


def begin_marks(
    transactional_ids: Sequence[Any],
    producer_ids: Sequence[Any],
    starts: Sequence[Any],
    offsets: Sequence[Any],
    keep: Sequence[bool],
) -> list[list[Mark] | None]:
    """For each kept record (in log order), the marks of its run's records (one transactional id, one producer
    id) since the run's kept record before it, itself included; None where that is one transaction or fewer."""
    out: list[list[Mark] | None] = [None] * len(keep)
    since: dict[str, tuple[Any, list[Mark]]] = {}
    for i, tid in enumerate(transactional_ids):
        if tid is None:
            continue
        run = since.get(tid)
        if run is None or run[0] != producer_ids[i]:
            run = (producer_ids[i], [])
            since[tid] = run
        start = starts[i]
        if start is not None and start > 0:
            run[1].append((start, offsets[i]))
        if keep[i]:
            marks = thinned(run[1])
            out[i] = marks if len(marks) > 1 else None
            run[1].clear()
    return out


def carried_marks(record_json: str) -> list[Mark]:
    """The marks a record's JSON carries (none: most records)."""
    if not _has_marks(record_json):
        return []
    return [(m["start_timestamp_ms"], m["offset"]) for m in json.loads(record_json)["began_since"]]


def merged_marks(record_json: str, marks: Sequence[Mark]) -> str:
    """The record with `marks` (stage 1's, of the records it folded into this one) as its `began_since`."""
    d = json.loads(record_json)
    d["began_since"] = [{"start_timestamp_ms": s, "offset": o} for s, o in marks]
    return json.dumps(d)


def without_marks(record_json: str) -> tuple[str, list[Mark]]:
    """The record without its marks (a view keeps no history), and the marks."""
    if not _has_marks(record_json):
        return record_json, []
    d = json.loads(record_json)
    marks = [(m["start_timestamp_ms"], m["offset"]) for m in d.pop("began_since")]
    d["began_since"] = None
    return json.dumps(d), marks


def _has_marks(record_json: str) -> bool:
    return _MARKS_KEYS[0] in record_json or _MARKS_KEYS[1] in record_json


def first_began_after(marks: Iterable[Mark], after_ms: int) -> Mark | None:
    """The first mark (in log order) of a transaction that began after `after_ms`."""
    for mark in sorted(marks, key=lambda m: m[1]):
        if mark[0] > after_ms:
            return mark
    return None
