"""streaming/'s adapters around detectors/tracking.py, without a JVM: the state round trip through a ValueState,
the Spark schemas against tracking's column orders, and the hot-path decoders held equal to the models.

The tracking rules themselves are tested in test_tracking.py (no pyspark there)."""

from __future__ import annotations

import dataclasses
import json
import pickle
from typing import Any

import pandas as pd
import pytest
from builders import LIMITS, MINUTE, PID, T0, coord, open_txn, snapshot, tombstone, tps
from hypothesis import given
from hypothesis import strategies as st
from test_tracking import fact_row, open_row, position_row, seen_at

from detectors.codec import TxnLogKey, TxnLogValue, TxnStatus, encode_key, encode_value
from detectors.models import MAX_PRODUCER_EPOCH, CoordinatorRecord, CoordinatorState
from detectors.rules import coord_facts
from detectors.tracking import (
    EVENT_COLUMNS,
    FACT_COLUMNS,
    STAGE1_INPUT_COLUMNS,
    STAGE2_INPUT_COLUMNS,
    OpenRow,
    Owner,
    ReconcileConfig,
    View,
    coord_facts_from_json,
    open_entry,
    stored_open_entry,
)
from dev.fake_state import Clock, FakeHandle, FakeValueState, Timer
from streaming import reconcile
from streaming.reconcile import (
    EVENT_SCHEMA,
    FACT_SCHEMA,
    OWNER_SCHEMA,
    VIEW_SCHEMA,
    ProducerIdFacts,
    TransactionReconciler,
    _load,
    _save,
    owner_of,
    owner_row,
)
from streaming.rows import _PROVENANCE
from streaming.sinks import EventRow
from streaming.sources import _DECODED_FIELDS, _decode_fields

pytestmark = pytest.mark.unit


def test_the_state_survives_the_round_trip_through_a_value_state() -> None:
    views = {PID: View(coord().model_dump_json(), None, T0, T0 + MINUTE), PID + 1: View(None, T0, T0, T0)}
    row = OpenRow(PID, "orders", 0, "{}", T0 + MINUTE, 1, 100, 5, 5, T0, T0, None, None, 900_000, 150)
    opens = {(PID, "orders", 0): open_entry(row, T0 + MINUTE, None, ("LATE", None))}
    views_state, opens_state, owners_state = FakeValueState(), FakeValueState(), FakeValueState()
    _save(views_state, views)
    _save(opens_state, opens)
    _save(owners_state, {"tx-1": Owner(PID, 7)})
    assert isinstance(views_state.value[0], bytes)  # type: ignore[index]  # one binary column
    assert _load(views_state, View) == views and _load(opens_state, stored_open_entry) == opens
    (entry,) = _load(opens_state, stored_open_entry).values()
    assert entry.facts.first_seen_ms == T0 + MINUTE  # attribute access works again after loading
    assert _load(owners_state, Owner) == {"tx-1": Owner(PID, 7)}
    _save(views_state, {})
    assert not views_state.exists()


def test_the_spark_schemas_and_the_drivers_rows_follow_trackings_columns() -> None:
    assert tuple(f.name for f in FACT_SCHEMA.fields) == FACT_COLUMNS
    assert tuple(f.name for f in EVENT_SCHEMA.fields) == EVENT_COLUMNS
    assert EventRow._fields == EVENT_COLUMNS


@pytest.mark.parametrize(
    "record",
    [
        coord(),
        coord(state=CoordinatorState.COMPLETE_ABORT, partitions=(), next_producer_id=PID + 1),
        coord(state=CoordinatorState.PREPARE_COMMIT, partitions=tps("a-0", "a-1", "b-3")),
        coord(state=CoordinatorState.EMPTY, partitions=(), transaction_timeout_ms=-1),
        CoordinatorRecord.tombstone_of("tx-9", source_partition=1, source_offset=2, source_timestamp_ms=T0),
    ],
)
def test_the_record_json_stage_1_gets_reads_as_the_model(record: CoordinatorRecord) -> None:
    # As stage 1 gets it from Spark (rows.coordinator_rows): without where the record was read from.
    lean = json.dumps({k: v for k, v in record.model_dump(mode="json").items() if k not in _PROVENANCE})
    assert coord_facts_from_json(lean) == coord_facts(record)
    assert CoordinatorRecord.model_validate_json(lean).model_dump(exclude=_PROVENANCE) == record.model_dump(
        exclude=_PROVENANCE
    )


# ------------------------------------------------------------- the decoder's fast path vs. the model's

INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)
PRODUCER_ID = st.just(-1) | st.integers(0, 2**63 - 1)
TOPIC = st.text(st.characters(codec="utf-8"), min_size=1, max_size=8)
# Kafka lists each topic once (TransactionLogValue groups the partitions by topic), in no particular order.
PARTITIONS = st.lists(
    st.tuples(TOPIC, st.lists(st.integers(0, 2**31 - 1), max_size=4).map(tuple)),
    max_size=4,
    unique_by=lambda group: group[0],
).map(tuple)


@st.composite
def txn_log_values(draw: st.DrawFn) -> TxnLogValue:
    """Values `CoordinatorRecord` accepts (its field bounds), of both value versions."""
    flexible = draw(st.booleans())
    return TxnLogValue(
        version=1 if flexible else 0,
        producer_id=draw(PRODUCER_ID),
        producer_epoch=draw(st.integers(-1, MAX_PRODUCER_EPOCH)),
        transaction_timeout_ms=draw(INT32),
        status=draw(st.sampled_from(TxnStatus)),
        partitions=draw(st.none() | PARTITIONS),
        last_update_timestamp_ms=draw(INT64),
        start_timestamp_ms=draw(INT64),
        previous_producer_id=draw(PRODUCER_ID) if flexible else -1,
        next_producer_id=draw(PRODUCER_ID) if flexible else -1,
        client_transaction_version=draw(st.integers(0, 2**15 - 1)) if flexible else 0,
    )


def _model_fields(record: CoordinatorRecord) -> dict[str, Any]:
    return record.model_dump(mode="json", include=set(_DECODED_FIELDS))


@given(st.text(st.characters(codec="utf-8"), max_size=20), st.none() | txn_log_values(), INT64)
def test_decoding_a_record_gives_the_fields_of_the_model(
    transactional_id: str, value: TxnLogValue | None, ts_ms: int
) -> None:
    """One way to read `__transaction_state`: the decoder's fast path (`sources._decode_fields`, no pydantic)
    gives the fields `CoordinatorRecord.from_log_value` gives."""
    key = encode_key(TxnLogKey(transactional_id))
    data = None if value is None else encode_value(value)
    fast = dict(zip(_DECODED_FIELDS, _decode_fields(key, data, ts_ms), strict=True))
    model = CoordinatorRecord.from_log_value(
        transactional_id, value, source_partition=0, source_offset=0, source_timestamp_ms=ts_ms
    )
    assert fast == _model_fields(model)


# ------------------------------------------------- the processors' per-id state, through fake state variables


STAGE2_CONFIG = ReconcileConfig(limits=LIMITS, expire_after_ms=30_000, view_ttl_ms=3_600_000)


def stage2(clock: Clock) -> tuple[TransactionReconciler, FakeHandle]:
    processor, handle = TransactionReconciler(STAGE2_CONFIG), FakeHandle(clock)
    processor.init(handle)  # type: ignore[arg-type]
    return processor, handle


def run_stage2(processor: TransactionReconciler, clock: Clock, *rows: list[Any]) -> list[dict[str, Any]]:
    rows = (*rows, position_row(clock.now_ms))
    df = pd.DataFrame([[1, *r] for r in rows], columns=list(STAGE2_INPUT_COLUMNS), dtype=object)
    # bucket 1: bucket 0 also reports the view's lag
    out = list(processor.handleInputRows((1,), iter([df]), Timer(clock)))  # type: ignore[arg-type]
    return [dict(zip(EVENT_COLUMNS, e, strict=True)) for f in out for e in f.itertuples(index=False)]


DONE = coord(state=CoordinatorState.COMPLETE_COMMIT, partitions=(), last_update_timestamp_ms=T0 - 1)


def test_stage_2_keeps_a_view_per_producer_id_and_only_finished_ones_expire() -> None:
    clock = Clock(T0)
    processor, handle = stage2(clock)
    ongoing = coord(producer_id=PID + 1, transactional_id="tx-2")
    run_stage2(
        processor, clock, fact_row(DONE, log_offset=1), fact_row(ongoing, producer_id=PID + 1, log_offset=2)
    )
    kept, expiring = handle.maps["views_kept"], handle.maps["views_expiring"]
    assert kept.keys_now() == {PID + 1} and expiring.keys_now() == {PID}
    assert pickle.loads(handle.values["views_kept_ids"].value[0]) == {PID + 1}  # type: ignore[index]
    assert expiring.ttl_ms == STAGE2_CONFIG.view_ttl_ms and kept.ttl_ms is None
    clock.now_ms = T0 + STAGE2_CONFIG.view_ttl_ms
    assert expiring.keys_now() == set() and kept.keys_now() == {PID + 1}
    # The transaction in progress is still judged against its view: owned, never no-coordinator-state.
    events = run_stage2(processor, clock, open_row(seen_at(clock.now_ms, producer_id=PID + 1)))
    assert [(e["event"], e["reason"]) for e in events] == [("VERDICT", None)]


def test_a_batch_reads_and_writes_only_the_producer_ids_it_touches() -> None:
    clock = Clock(T0)
    processor, handle = stage2(clock)
    many = [
        fact_row(DONE.model_copy(update={"producer_id": PID + i}), producer_id=PID + i) for i in range(50)
    ]
    run_stage2(processor, clock, *many)
    expiring = handle.maps["views_expiring"]
    assert len(expiring.keys_now()) == 50
    expiring.calls = 0
    clock.now_ms += 5_000
    run_stage2(processor, clock, fact_row(DONE.model_copy(update={"producer_epoch": 6}), log_offset=9))
    assert expiring.calls == 2  # one read, one write: not the 50 views the bucket remembers


def test_the_view_of_an_open_transaction_moves_to_the_kept_views_and_back() -> None:
    """A finished view whose producer id has an open transaction tracked outlives the TTL (a lost commit
    marker must be judged against the commit); once the open transaction is forgotten it expires again."""
    clock = Clock(T0)
    processor, handle = stage2(clock)
    run_stage2(processor, clock, fact_row(DONE, log_offset=1))
    kept, expiring = handle.maps["views_kept"], handle.maps["views_expiring"]
    assert expiring.keys_now() == {PID}
    clock.now_ms += 1_000
    run_stage2(processor, clock, open_row(seen_at(clock.now_ms)))
    assert kept.keys_now() == {PID} and expiring.keys_now() == set()
    # Sweeps go on without it: it is forgotten once no snapshot confirmed it for `expire_after_ms`.
    gone = []
    while not gone:
        clock.now_ms += 10_000
        gone = [e for e in run_stage2(processor, clock) if e["event"] == "GONE"]
    assert clock.now_ms <= T0 + 1_000 + STAGE2_CONFIG.expire_after_ms + 10_000
    assert kept.keys_now() == set() and expiring.keys_now() == {PID}
    assert not handle.values["views_kept_ids"].exists()


def test_a_bucket_stored_as_one_dict_by_an_earlier_release_is_migrated_once() -> None:
    """Earlier releases kept a bucket's views as one pickled dict (v0.1.0's as 4-tuples): the first batch
    moves each into its map (in progress or in use: kept), and the dict is cleared."""
    clock = Clock(T0)
    processor, handle = stage2(clock)
    ongoing = coord(producer_id=PID + 1, transactional_id="tx-2")
    _save(
        handle.values["views"],
        {
            PID: (DONE.model_dump_json(), None, T0 - 1, T0),
            PID + 1: (ongoing.model_dump_json(), None, T0 - 1, T0),
            PID + 2: (None, T0 - 5, T0 - 5, T0),
        },
    )
    run_stage2(processor, clock)
    assert not handle.values["views"].exists()
    assert handle.maps["views_kept"].keys_now() == {PID + 1}
    assert handle.maps["views_expiring"].keys_now() == {PID, PID + 2}
    assert View(*handle.maps["views_kept"].getValue((PID + 1,)) or ()).in_progress is True  # type: ignore[misc]


def verdicts(events: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [(e["producer_id"], e["kind"], e["reason"]) for e in events if e["event"] == "VERDICT"]


def test_the_same_snapshot_twice_gives_one_verdict_and_a_changed_kind_a_second() -> None:
    """Stage 2 tells the driver a verdict when it changes, not every batch a snapshot shows the transaction."""
    clock = Clock(T0 + MINUTE)
    processor, _ = stage2(clock)
    shown = open_row(seen_at(clock.now_ms))
    assert verdicts(run_stage2(processor, clock, fact_row(DONE, log_offset=1), shown)) == [
        (PID, "OPEN", None)
    ]
    clock.now_ms += 5_000
    assert run_stage2(processor, clock, shown) == []  # the same snapshot again
    clock.now_ms += 5_000
    assert run_stage2(processor, clock, open_row(seen_at(clock.now_ms))) == []  # a later one, unchanged
    clock.now_ms += 10_000  # past the grace since the first sighting: proven
    events = run_stage2(processor, clock, open_row(seen_at(clock.now_ms)))
    assert [e["event"] for e in events] == ["OPENED", "VERDICT"]
    assert verdicts(events) == [(PID, "HANGING", "coordinator-completed")]


def test_a_new_run_of_the_job_tells_every_open_transaction_tracked_again_once() -> None:
    """A job started again from its checkpoint has a driver that knows no verdict: at the first batch of the run
    (every bucket gets the collector's position rows), each bucket emits a VERDICT for every open transaction
    it tracks, changed or not, once; a bucket of a checkpoint written before the run ids has none, and tells."""
    clock = Clock(T0 + MINUTE)
    handle = FakeHandle(clock)
    first = TransactionReconciler(dataclasses.replace(STAGE2_CONFIG, run_id="run-1"))
    first.init(handle)  # type: ignore[arg-type]
    other = snapshot(open_txn(producer_id=PID + 2), observed_at_ms=clock.now_ms, partition=4)
    told = verdicts(run_stage2(first, clock, open_row(seen_at(clock.now_ms)), open_row(other)))
    assert sorted(told) == [(PID, "OPEN", None), (PID + 2, "OPEN", None)]
    clock.now_ms += 5_000
    assert run_stage2(first, clock) == []  # positions only: nothing changed
    # The job restarts: a new processor, a new run id, the same state.
    again = TransactionReconciler(dataclasses.replace(STAGE2_CONFIG, run_id="run-2"))
    again.init(handle)  # type: ignore[arg-type]
    clock.now_ms += 5_000
    assert sorted(verdicts(run_stage2(again, clock))) == sorted(told)
    assert handle.values["announced"].value == ("run-2",)
    clock.now_ms += 5_000
    assert run_stage2(again, clock) == []  # once per run


def stage1_row(record: CoordinatorRecord, read_offset: int) -> list[Any]:
    values = {
        "transactional_id": record.transactional_id,
        "producer_id": record.producer_id,
        "previous_producer_id": record.previous_producer_id,
        "next_producer_id": record.next_producer_id,
        "tombstone": record.tombstone,
        "last_update_timestamp_ms": record.last_update_timestamp_ms,
        "source_offset": record.source_offset,
        "record_json": record.model_dump_json(),
        "state": record.state.value if record.state is not None else None,
        "read_topic": "__transaction_state",
        "read_partition": 0,
        "read_offset": read_offset,
        "read_after": None,
    }
    return [0, *[values[c] for c in STAGE1_INPUT_COLUMNS[1:]]]


def run_stage1(processor: ProducerIdFacts, *rows: list[Any]) -> list[tuple[Any, ...]]:
    df = pd.DataFrame(list(rows), columns=list(STAGE1_INPUT_COLUMNS), dtype=object)
    out = list(processor.handleInputRows((0,), iter([df]), None))  # type: ignore[arg-type]
    return [tuple(r) for f in out for r in f.itertuples(index=False)]


@pytest.mark.parametrize("bulk", [False, True], ids=["per-id", "whole-map"])
def test_stage_1_keeps_an_owner_per_transactional_id(bulk: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if bulk:
        monkeypatch.setattr(reconcile, "BULK_READ_IDS", 1)
    clock = Clock(T0)
    processor, handle = ProducerIdFacts(), FakeHandle(clock)
    processor.init(handle)  # type: ignore[arg-type]
    _save(handle.values["owners"], {"tx-old": Owner(PID + 9, 3)})  # an earlier release's dict
    run_stage1(
        processor,
        stage1_row(coord(source_offset=10), 10),
        stage1_row(coord(transactional_id="tx-2", producer_id=PID + 1, source_offset=11), 11),
    )
    owners = handle.maps["owner"]
    assert owners.keys_now() == {"tx-old", "tx-1", "tx-2"} and not handle.values["owners"].exists()
    assert owner_of(owners.getValue(("tx-1",)) or ()) == Owner(PID, 10)
    # A new producer id for tx-1: the old one is retired, the owner rewritten; a tombstone removes tx-2.
    facts = run_stage1(
        processor,
        stage1_row(coord(producer_id=PID + 5, source_offset=12), 12),
        stage1_row(tombstone(transactional_id="tx-2").model_copy(update={"source_offset": 13}), 13),
    )
    assert {(f[0], f[1]) for f in facts if f[1] in ("view", "retired")} == {
        (PID, "retired"),
        (PID + 5, "view"),
        (PID + 1, "retired"),
    }
    assert owners.keys_now() == {"tx-old", "tx-1"}
    assert owner_of(owners.getValue(("tx-1",)) or ()) == Owner(PID + 5, 12)


def test_an_owners_rare_fields_survive_the_map_row() -> None:
    owner = Owner(PID, 7, (("__transaction_state", 40),), (PID, 5, '[{"topic": "orders", "partition": 0}]'))
    assert owner_of(owner_row(owner)) == owner
    assert owner_of(owner_row(Owner(-1, -1))) == Owner(-1, -1)


def test_the_view_map_schema_follows_the_view() -> None:
    assert [c.split()[0] for c in VIEW_SCHEMA.split(", ")] == list(View._fields)
    assert [c.split()[0] for c in OWNER_SCHEMA.split(", ")] == list(Owner._fields)
