"""detectors/began.py: when an owner's folded transactions began (the marks an owner-moved-on proof is ordered by)."""

from __future__ import annotations

import itertools
import random

import pytest
from builders import PID, T0, coord

from detectors.began import (
    MARK_SPACING_MS,
    MAX_MARKS,
    begin_marks,
    carried_marks,
    first_began_after,
    merged_marks,
    thinned,
    without_marks,
)
from detectors.models import BeganMark, CoordinatorRecord
from detectors.tracking import CoordinatorRow, advance_owners, run_ends

pytestmark = pytest.mark.unit


def test_thinned_keeps_one_mark_per_half_second_of_start_and_the_newest() -> None:
    marks = [(T0 + 100 * k, 10 + k) for k in range(12)]
    assert thinned(marks) == [(T0, 10), (T0 + 500, 15), (T0 + 1000, 20)]
    assert thinned([(-1, 3), (0, 4), (T0, 5)]) == [(T0, 5)]  # no start: no mark
    many = [(T0 + MARK_SPACING_MS * k, k) for k in range(40)]
    assert thinned(many) == many[-MAX_MARKS:]


def test_begin_marks_go_to_the_next_kept_record_of_the_run() -> None:
    """Each kept record carries its run's marks since the run's kept record before it, itself included; a run of
    one transaction (every record one start) carries none, and a new producer id starts a new run."""
    tids = ["a"] * 6 + ["b"] * 3 + ["a"] * 2
    pids = [1] * 6 + [2] * 3 + [7] * 2
    starts = [T0, T0 + 200, T0 + 600, T0 + 900, T0 + 1300, T0 + 1900] + [T0] * 3 + [T0 + 5000, T0 + 6000]
    offsets = list(range(100, 111))
    keep = [True, False, False, True, False, True, True, False, True, True, True]
    marks = begin_marks(tids, pids, starts, offsets, keep)
    assert marks[0] is None  # the run's first record: itself only
    assert marks[3] == [(T0 + 200, 101), (T0 + 900, 103)]
    assert marks[5] == [(T0 + 1300, 104), (T0 + 1900, 105)]
    assert marks[6] is None and marks[8] is None  # one transaction
    assert marks[9] is None and marks[10] is None  # producer id 7: a run of its own, one record each time
    assert [m for m, k in zip(marks, keep, strict=True) if not k] == [None] * keep.count(False)


def test_marks_survive_json_both_ways() -> None:
    record = coord().model_dump_json()
    assert carried_marks(record) == []
    assert without_marks(record) == (record, [])
    with_marks = merged_marks(record, [(T0, 5), (T0 + 600, 9)])
    assert CoordinatorRecord.model_validate_json(with_marks).began_since == (
        BeganMark(start_timestamp_ms=T0, offset=5),
        BeganMark(start_timestamp_ms=T0 + 600, offset=9),
    )
    assert carried_marks(with_marks) == [(T0, 5), (T0 + 600, 9)]
    stripped, marks = without_marks(with_marks)
    assert marks == [(T0, 5), (T0 + 600, 9)] and carried_marks(stripped) == []
    assert CoordinatorRecord.model_validate_json(stripped) == CoordinatorRecord.model_validate_json(record)
    assert first_began_after([(T0 + 600, 9), (T0, 5)], T0) == (T0 + 600, 9)
    assert first_began_after([(T0, 5)], T0) is None


def test_every_mark_stage_1_hands_on_is_a_record_of_the_producer_id_it_folded() -> None:
    """Through the decoder's fold (run_ends, begin_marks) and stage 1 (advance_owners): a fact's marks are, in log
    order and at least the spacing apart, (start, offset) pairs of records of its own producer id at or before
    the fact's record and after the id's previous fact; never a time a record of it does not carry."""
    rng = random.Random(40)
    checked = 0
    for _ in range(300):
        owners: dict[str, tuple[int, int]] = {}  # the facts so far: transactional id -> (producer id, offset)
        state: dict[str, object] = {}
        offset = 0
        for _batch in range(3):
            tids: list[str] = []
            records: list[CoordinatorRecord] = []
            for _ in range(rng.randint(1, 60)):
                tid = rng.choice(("tx-1", "tx-2"))
                pid = PID + (1 if rng.random() < 0.05 else 0) + (100 if tid == "tx-2" else 0)
                start = T0 + offset * rng.choice((50, 100, 300))
                records.append(coord(transactional_id=tid, producer_id=pid, start_timestamp_ms=start,
                                     last_update_timestamp_ms=start, source_offset=offset))  # fmt: skip
                tids.append(tid)
                offset += 1
            pids = [r.producer_id for r in records]
            keep = run_ends(tids, pids, [False] * len(records))
            marks = begin_marks(
                tids, pids, [r.start_timestamp_ms for r in records], [r.source_offset for r in records], keep
            )
            rows = [
                CoordinatorRow(*_row(r if m is None else r.model_copy(update={"began_since": tuple(
                    BeganMark(start_timestamp_ms=s, offset=o) for s, o in m)})))
                for r, k, m in zip(records, keep, marks, strict=True)
                if k
            ]  # fmt: skip
            real = {(r.producer_id, r.start_timestamp_ms, r.source_offset) for r in records}
            for pid, kind, tid, record_json, _, fact_offset in advance_owners(state, rows):  # type: ignore[arg-type]
                if kind != "view" or record_json is None:
                    continue
                fact_marks = carried_marks(record_json)
                before = owners.get(tid, (None, -1))[1]
                assert all((pid, s, o) in real and before < o <= fact_offset for s, o in fact_marks)
                assert [o for _, o in fact_marks] == sorted(o for _, o in fact_marks)
                starts = [s for s, _ in fact_marks]
                assert all(b - a >= MARK_SPACING_MS for a, b in itertools.pairwise(starts))
                assert len(fact_marks) <= MAX_MARKS
                owners[tid] = (pid, fact_offset)
                checked += len(fact_marks)
    assert checked > 500  # the scenarios do fold busy owners


def _row(r: CoordinatorRecord) -> tuple[object, ...]:
    return (
        r.transactional_id,
        r.producer_id,
        r.previous_producer_id,
        r.next_producer_id,
        r.tombstone,
        r.last_update_timestamp_ms,
        r.source_offset,
        r.model_dump_json(),
    )


def test_the_decoder_hands_the_marks_of_the_records_it_folds_to_the_record_it_keeps() -> None:
    """The job's decoder (`streaming.sources.decode_batches`, compacted): a busy owner's run of one-record
    transactions 200 ms apart keeps its first and last record, and the last carries a mark per half second."""
    import pyarrow as pa

    from detectors.codec import TxnLogKey, TxnLogValue, TxnStatus, encode_key, encode_value
    from streaming.sources import decode_batches

    def value(k: int) -> bytes:
        return encode_value(
            TxnLogValue(version=1, producer_id=PID, producer_epoch=5, transaction_timeout_ms=60_000,
                        status=TxnStatus.ONGOING, partitions=(("other", (0,)),),
                        last_update_timestamp_ms=T0 + 200 * k, start_timestamp_ms=T0 + 200 * k)
        )  # fmt: skip

    n = 12
    raw = pa.RecordBatch.from_pydict(
        {
            "key": pa.array([encode_key(TxnLogKey("tx-1"))] * n, pa.binary()),
            "value": pa.array([value(k) for k in range(n)], pa.binary()),
            "topic": pa.array(["__transaction_state"] * n, pa.string()),
            "partition": pa.array([0] * n, pa.int32()),
            "offset": pa.array(range(10, 10 + n), pa.int64()),
            "ts_ms": pa.array([T0] * n, pa.int64()),
        }
    )
    (out,) = decode_batches(iter([raw]), compact=True)
    rows = out.to_pylist()
    assert [r["kafka_offset"] for r in rows] == [10, 21]
    assert rows[0]["began_since"] is None
    assert [(m["start_timestamp_ms"], m["offset"]) for m in rows[1]["began_since"]] == [
        (T0 + 200, 11), (T0 + 800, 14), (T0 + 1400, 17), (T0 + 2000, 20)
    ]  # fmt: skip
    (whole,) = decode_batches(iter([raw]), compact=False)
    assert whole.column("began_since").null_count == n  # nothing folded, nothing to mark
