"""Coordinator records that were read but did not decode (issue 20, item 6): they move the view's progress, but
their content is lost, so they are never counted as applied. Stage 1 (`advance_undecodable`) marks the id their
key names (or, with no key, their partition); `ViewCurrency` keeps the mark until a decodable record of the id
supersedes it; stage 2 withholds every verdict that depends on it (UNCONFIRMED, `coordinator-record-undecodable`).
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pytest
from builders import PID, SECOND, T0, coord
from test_tracking import CONFIG, LOG, batch, fact_row, open_row, seen_at, told

from detectors.codec import TxnLogKey, TxnLogValue, TxnStatus, encode_key, encode_value
from detectors.currency import ViewCurrency, coordinator_partition
from detectors.models import AbortCandidate, CandidateStatus, CoordinatorState
from detectors.tracking import (
    STAGE2_INPUT_COLUMNS,
    BucketState,
    Owner,
    advance_owners,
    advance_undecodable,
)
from streaming.sources import decode_batches

pytestmark = pytest.mark.unit


# ------------------------------------------------------------------------------------------ the decoder

VALUE = TxnLogValue(
    version=1,
    producer_id=PID,
    producer_epoch=5,
    transaction_timeout_ms=60_000,
    status=TxnStatus.COMPLETE_ABORT,
    partitions=None,
    last_update_timestamp_ms=T0,
    start_timestamp_ms=T0 - 100,
)


def future_version(value: bytes) -> bytes:
    """The same value, as a broker writing TransactionLogValue version 2 would label it (KIP-915: not
    backward compatible, so txnwatch must not read it as version 1)."""
    return (2).to_bytes(2, "big") + value[2:]


def raw_batch(rows: list[tuple[bytes | None, bytes | None]]) -> pa.RecordBatch:
    n = len(rows)
    return pa.RecordBatch.from_pydict(
        {
            "key": pa.array([k for k, _ in rows], pa.binary()),
            "value": pa.array([v for _, v in rows], pa.binary()),
            "topic": pa.array([LOG] * n, pa.string()),
            "partition": pa.array([0] * n, pa.int32()),
            "offset": pa.array(range(10, 10 + n), pa.int64()),
            "ts_ms": pa.array([T0] * n, pa.int64()),
        }
    )


@pytest.mark.parametrize("compact", [False, True], ids=["whole", "compacted"])
def test_a_row_that_did_not_decode_keeps_the_id_its_key_names(compact: bool) -> None:
    good = encode_value(VALUE)
    rows = [
        (encode_key(TxnLogKey("tx-1")), good),
        (encode_key(TxnLogKey("tx-1")), future_version(good)),  # the value does not decode, the key does
        (b"\x00\x07garbage", good),  # neither does the key: the id is unknown
        (encode_key(TxnLogKey("tx-1")), good),
        (encode_key(TxnLogKey("tx-1")), good),
    ]
    (out,) = decode_batches(iter([raw_batch(rows)]), compact=compact)
    got = out.to_pydict()
    by_offset = {o: i for i, o in enumerate(got["kafka_offset"])}
    assert got["error"][by_offset[11]].endswith("unsupported value version 2")
    assert (got["transactional_id"][by_offset[11]], got["producer_id"][by_offset[11]]) == ("tx-1", None)
    assert got["value"][by_offset[11]] == future_version(good)  # raw bytes for the dead-letter topic
    assert (got["transactional_id"][by_offset[12]], got["producer_id"][by_offset[12]]) == (None, None)
    assert got["transactional_id"][by_offset[14]] == "tx-1" and got["error"][by_offset[14]] is None
    # compaction keeps every row that did not decode, and the id's newest record (a run's last), which
    # supersedes it
    assert {11, 12, 14} <= set(by_offset)


# -------------------------------------------------------------------------------------------- stage 1


def read(tid: str | None, offset: int, *, decoded: bool = True, partition: int = 0) -> tuple[Any, ...]:
    """A stage-1 row as the processor passes it to `advance_undecodable`: id, producer id (None: did not
    decode), where it was read."""
    return (tid, PID if decoded else None, LOG, partition, offset)


def undecodable_facts(owners: dict[str, Owner], *rows: tuple[Any, ...]) -> list[dict[str, Any]]:
    columns = [list(c) for c in zip(*rows, strict=True)] if rows else [[] for _ in range(5)]
    facts = advance_undecodable(owners, *columns)
    assert all(f[:3] == (-1, "undecodable", LOG) for f in facts)
    return [json.loads(f[3]) for f in facts]


def test_stage_1_marks_an_id_until_a_later_decodable_record_of_it() -> None:
    owners = {"tx-1": Owner(PID, 9)}
    assert undecodable_facts(owners, read("tx-1", 10, decoded=False)) == [
        {"records": 1, "tainted": [["tx-1", 10]], "keyless": []}
    ]
    assert owners["tx-1"] == Owner(PID, 9, ((LOG, 10),))
    # a decodable record of another id changes nothing; nothing to say
    assert undecodable_facts(owners, read("tx-2", 11)) == []
    # the id's next decodable record supersedes it
    assert undecodable_facts(owners, read("tx-1", 12)) == [
        {"records": 0, "cleared": [["tx-1", 12]], "keyless": []}
    ]
    assert owners["tx-1"] == Owner(PID, 9)


def test_stage_1_within_one_batch_the_newest_record_of_an_id_decides() -> None:
    owners: dict[str, Owner] = {}
    # superseded in the same batch: counted, but nothing is pending
    assert undecodable_facts(owners, read("tx-1", 10, decoded=False), read("tx-1", 11)) == [
        {"records": 1, "keyless": []}
    ]
    assert owners == {}
    # the bad record is the newest: pending, kept for an id that owns no producer id yet
    assert undecodable_facts(owners, read("tx-1", 13, decoded=False), read("tx-1", 12)) == [
        {"records": 1, "tainted": [["tx-1", 13]], "keyless": []}
    ]
    assert owners == {"tx-1": Owner(-1, -1, ((LOG, 13),))}
    # a record at or below the bad one's offset (a replay) does not supersede it
    assert undecodable_facts(owners, read("tx-1", 13)) == []
    assert undecodable_facts(owners, read("tx-1", 14)) == [
        {"records": 0, "cleared": [["tx-1", 14]], "keyless": []}
    ]
    assert owners == {}


def test_stage_1_a_key_that_does_not_decode_marks_its_partition() -> None:
    owners: dict[str, Owner] = {}
    assert undecodable_facts(owners, read(None, 7, decoded=False, partition=3)) == [
        {"records": 1, "keyless": [[3, 7]]}
    ]
    assert owners == {}


def test_an_id_marked_undecodable_keeps_the_mark_through_advance_owners() -> None:
    owners = {"tx-1": Owner(-1, -1, ((LOG, 13),))}  # marked, owns nothing
    record = coord(state=CoordinatorState.EMPTY, partitions=())
    row = ("tx-1", PID, -1, -1, False, T0, 12, record.model_dump_json())  # an earlier record, read late
    facts = advance_owners(owners, [row])
    assert [f[:2] for f in facts] == [(PID, "view")]
    assert owners == {"tx-1": Owner(PID, 12, ((LOG, 13),))}


def test_owners_stored_by_v0_1_0_load_without_a_mark() -> None:
    assert Owner(*(PID, 3)) == Owner(PID, 3, ())


# ------------------------------------------------------------------------------------------- currency


def test_the_view_is_not_complete_for_a_marked_id_until_a_later_record_supersedes_it() -> None:
    v = ViewCurrency(LOG)
    v.add_position(LOG, 3, T0, {0: 0, 1: 0, 2: 0})
    assert not v.undecodable_about("tx-1") and not v.undecodable_about(None)
    assert v.undecodable(LOG, 1, [("tx-1", 10)], [], [])
    assert v.undecodable_about("tx-1")
    assert not v.undecodable_about("tx-2")  # producer ids never move between transactional ids
    assert v.undecodable_about(None)  # a producer id no record names could be the lost record's
    assert not v.undecodable(LOG, 0, [], [("tx-1", 10)], [])  # not later: the same record again
    assert v.undecodable_about("tx-1")
    assert v.undecodable(LOG, 0, [], [("tx-1", 11)], [])
    assert not v.undecodable_about("tx-1") and not v.undecodable_about(None)
    lag = v.lag()
    assert (lag.undecodable_pending, lag.undecodable_records) == (0, 1)


def test_a_keyless_record_marks_only_the_ids_of_its_partition() -> None:
    v = ViewCurrency(LOG)
    v.add_position(LOG, 3, T0, {0: 0, 1: 0, 2: 0})
    here, there = (
        "tx-1",
        next(t for t in (f"tx-{i}" for i in range(2, 99)) if coordinator_partition(t, 3) != 0),
    )
    v.undecodable(LOG, 1, [], [], [(coordinator_partition(here, 3), 5)])
    assert v.undecodable_about(here) and v.undecodable_about(None)
    assert coordinator_partition(there, 3) != coordinator_partition(here, 3)
    assert not v.undecodable_about(there)
    assert v.lag().undecodable_pending == 1


def test_currency_state_round_trips_and_v0_1_0_state_loads() -> None:
    v = ViewCurrency(LOG)
    v.add_position(LOG, 1, T0, {0: 3})
    v.applied(LOG, 0, 3)
    v.undecodable(LOG, 2, [("tx-1", 2)], [], [(0, 1)])
    again = ViewCurrency(LOG, state=v.state())
    assert again.state() == v.state() and again.undecodable_about("tx-9")
    legacy = v.state()[:5]  # what a v0.1.0 checkpoint holds
    old = ViewCurrency(LOG, state=legacy)
    assert old.current_as_of("tx-1") == T0 and not old.undecodable_about(None)
    assert old.state()[5] == ({}, {}, 0)


# -------------------------------------------------------------------------------------------- stage 2


def undecodable_row(body: dict[str, Any]) -> list[Any]:
    """Stage 1's "undecodable" fact as a stage-2 row (sent to every bucket)."""
    values = {
        "producer_id": -1,
        "fact": "undecodable",
        "transactional_id": LOG,
        "record_json": json.dumps(body),
        "fact_time_ms": 0,
        "log_offset": -1,
    }
    return [values.get(c) for c in STAGE2_INPUT_COLUMNS[1:]]


def test_a_verdict_resting_on_a_marked_id_is_withheld_until_a_decodable_record_supersedes_it() -> None:
    # The last record read of tx-1 says CompleteAbort: the open transaction would be HANGING
    # (coordinator-completed). Then a record of tx-1 did not decode; its content (an Ongoing transaction that
    # lists the partition, say) is lost.
    aborted = coord(
        state=CoordinatorState.COMPLETE_ABORT, partitions=(), last_update_timestamp_ms=T0 - SECOND
    )
    b = BucketState(CONFIG, {}, {})
    t1 = T0 + SECOND
    batch(b, t1, fact_row(aborted, log_offset=10), open_row(seen_at(t1)))
    t2 = t1 + 15 * SECOND
    lost = undecodable_row({"records": 1, "tainted": [["tx-1", 11]], "keyless": []})
    (verdict,) = batch(b, t2, lost, open_row(seen_at(t2)))
    assert (verdict["event"], verdict["kind"], verdict["reason"], verdict["withheld"]) == (
        "VERDICT",
        "UNCONFIRMED",
        "coordinator-completed",
        "coordinator-record-undecodable",
    )
    assert "did not decode" in verdict["explanation"]
    t3 = t2 + 5 * SECOND
    assert batch(b, t3, open_row(seen_at(t3))) == []  # still withheld: nothing new for the driver
    assert told(b).withheld == "coordinator-record-undecodable"
    # A decodable record of tx-1 supersedes it: the verdict follows that record (it lists the partition).
    ongoing = coord(state=CoordinatorState.ONGOING, last_update_timestamp_ms=t3)
    cleared = undecodable_row({"records": 0, "cleared": [["tx-1", 12]], "keyless": []})
    t4 = t3 + SECOND
    events = batch(b, t4, cleared, fact_row(ongoing, log_offset=12), open_row(seen_at(t4)))
    assert [(e["event"], e["kind"], e["withheld"]) for e in events] == [("VERDICT", "OPEN", None)]


def test_a_proven_hanging_verdict_is_judged_again_when_a_record_of_its_owner_is_lost() -> None:
    aborted = coord(
        state=CoordinatorState.COMPLETE_ABORT, partitions=(), last_update_timestamp_ms=T0 - SECOND
    )
    b = BucketState(CONFIG, {}, {})
    t1 = T0 + SECOND
    batch(b, t1, fact_row(aborted, log_offset=10), open_row(seen_at(t1)))
    t2 = t1 + 15 * SECOND
    assert [e["event"] for e in batch(b, t2, open_row(seen_at(t2)))] == ["OPENED", "VERDICT"]
    # no snapshot in this batch: the mark alone makes it judged again, and the candidate is withdrawn
    withdrawn, verdict = batch(
        b, t2 + SECOND, undecodable_row({"records": 1, "tainted": [["tx-1", 11]], "keyless": []})
    )
    assert (verdict["kind"], verdict["withheld"]) == ("UNCONFIRMED", "coordinator-record-undecodable")
    assert verdict["candidate_id"] is None
    assert withdrawn["event"] == "WITHDRAWN" and "did not decode" in withdrawn["explanation"]
    candidate = AbortCandidate.model_validate_json(withdrawn["payload"])
    assert (
        candidate.status is CandidateStatus.WITHDRAWN
        and candidate.withdrawn_reason == withdrawn["explanation"]
    )


def test_a_producer_id_no_record_names_is_withheld_while_any_record_is_lost() -> None:
    b = BucketState(CONFIG, {}, {})
    t1 = T0 + SECOND
    batch(b, t1, open_row(seen_at(t1)))
    keyless = undecodable_row({"records": 1, "keyless": [[2, 40]]})
    t2 = t1 + 15 * SECOND
    (verdict,) = batch(b, t2, keyless, open_row(seen_at(t2)))
    assert (verdict["kind"], verdict["reason"], verdict["withheld"]) == (
        "UNCONFIRMED",
        "no-coordinator-state",
        "coordinator-record-undecodable",
    )
