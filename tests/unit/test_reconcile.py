"""streaming/'s adapters around detectors/tracking.py, without a JVM: the state round trip through a ValueState,
the Spark schemas against tracking's column orders, and the hot-path decoders held equal to the models.

The tracking rules themselves are tested in test_tracking.py (no pyspark there)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from builders import MINUTE, PID, T0, coord, tps
from hypothesis import given
from hypothesis import strategies as st

from detectors.codec import TxnLogKey, TxnLogValue, TxnStatus, encode_key, encode_value
from detectors.models import MAX_PRODUCER_EPOCH, CoordinatorRecord, CoordinatorState
from detectors.rules import coord_facts
from detectors.tracking import (
    EVENT_COLUMNS,
    FACT_COLUMNS,
    OpenRow,
    Owner,
    View,
    coord_facts_from_json,
    open_entry,
    stored_open_entry,
)
from streaming.reconcile import EVENT_SCHEMA, FACT_SCHEMA, _load, _save
from streaming.rows import _PROVENANCE
from streaming.sinks import EventRow
from streaming.sources import _DECODED_FIELDS, _decode_fields

pytestmark = pytest.mark.unit


class FakeValueState:
    """A ValueState's surface (what _save and _load use), in memory."""

    def __init__(self) -> None:
        self.value: tuple[Any, ...] | None = None

    def exists(self) -> bool:
        return self.value is not None

    def get(self) -> tuple[Any, ...] | None:
        return self.value

    def update(self, newValue: tuple[Any, ...]) -> None:
        self.value = newValue

    def clear(self) -> None:
        self.value = None


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
