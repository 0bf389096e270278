"""The domain models: frozen, strict, JSON round trips, invariants, and the codec -> CoordinatorRecord glue."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import pytest
from builders import PID, SECOND, T0, coord, open_txn, snapshot, tombstone, tps
from pydantic import BaseModel, ValidationError

from detectors.abort import plan_abort
from detectors.models import (
    SCHEMA_VERSION,
    AbortCandidate,
    BrokerSweepSummary,
    CoordinatorLogPosition,
    CoordinatorRecord,
    CoordinatorState,
    DetectionLimits,
    HangingReason,
    OpenTransaction,
    PartitionSnapshot,
    TopicPartition,
    Verdict,
    VerdictKind,
    WithheldReason,
    WriteTxnMarkersSpec,
    candidate_id,
)
from detectors.rules import classify

pytestmark = pytest.mark.unit


def a_candidate() -> AbortCandidate:
    txn = open_txn(coordinator_epoch=-1)
    snap = snapshot(txn)
    v = classify(
        txn,
        snap,
        None,
        now_ms=snap.observed_at_ms,
        limits=DetectionLimits(),
        view_current_ms=snap.observed_at_ms,
    )
    return plan_abort(snap, txn, v, bootstrap="k:9092", first_detected_ms=snap.observed_at_ms)


def a_summary() -> BrokerSweepSummary:
    return BrokerSweepSummary(
        cluster="prod",
        sweep_id="sweep-1",
        observed_at_ms=T0,
        broker=2,
        partitions_covered=120,
        errors={"NOT_LEADER_OR_FOLLOWER": 1},
    )


# ------------------------------------------------------------------------------------------ JSON records


@pytest.mark.parametrize(
    "record",
    [
        pytest.param(snapshot(), id="partition-snapshot"),
        pytest.param(snapshot(open_transactions=()), id="snapshot-with-explicitly-no-open-transactions"),
        pytest.param(a_summary(), id="broker-sweep-summary"),
        pytest.param(coord(), id="coordinator-record"),
        pytest.param(tombstone(), id="coordinator-tombstone"),
        pytest.param(a_candidate(), id="abort-candidate"),
    ],
)
def test_json_records_round_trip_with_a_schema_version(record: BaseModel) -> None:
    text = record.model_dump_json()
    assert json.loads(text)["schema_version"] == SCHEMA_VERSION == 1
    assert type(record).model_validate_json(text) == record


def test_enums_travel_as_kafka_names() -> None:
    data = json.loads(coord(state=CoordinatorState.PREPARE_COMMIT).model_dump_json())
    assert data["state"] == "PrepareCommit"
    cand = json.loads(a_candidate().model_dump_json())
    assert (cand["reason"], cand["status"]) == ("no-coordinator-state", "OPENED")


def test_models_are_frozen_and_hashable() -> None:
    txn = open_txn()
    with pytest.raises(ValidationError):
        txn.producer_epoch = 6  # type: ignore[misc]
    assert len({open_txn(), open_txn(), open_txn(start_offset=1)}) == 2
    assert hash(snapshot()) == hash(snapshot())


@pytest.mark.parametrize(
    ("model", "fields"),
    [
        pytest.param(
            OpenTransaction, {"producer_id": 1, "producer_epoch": 0, "start_offset": 0, "typo": 1}, id="txn"
        ),
        pytest.param(TopicPartition, {"topic": "t", "partition": 0, "leader": 1}, id="topic-partition"),
    ],
)
def test_unknown_fields_are_rejected(model: type[BaseModel], fields: dict[str, Any]) -> None:
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        model(**fields)


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param({"producer_epoch": 32768}, id="epoch-is-an-int16"),
        pytest.param({"producer_id": -1}, id="open-transaction-has-a-real-producer-id"),
        pytest.param({"coordinator_epoch": -2}, id="coordinator-epoch-is-minus-one-at-worst"),
        pytest.param({"start_offset": -1}, id="open-transaction-has-a-start-offset"),
    ],
)
def test_open_transaction_bounds(overrides: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        open_txn(**overrides)


def test_a_leader_has_one_open_transaction_per_producer() -> None:
    with pytest.raises(ValidationError, match="duplicate producer ids"):
        snapshot(open_txn(), open_txn(start_offset=200))


def test_open_since_and_first_batch_epoch_fall_back() -> None:
    txn = open_txn(start_timestamp_ms=None, start_batch_producer_epoch=None, producer_epoch=7)
    assert (txn.open_since_ms, txn.first_batch_epoch) == (T0 + SECOND, 7)
    assert (open_txn().open_since_ms, open_txn().first_batch_epoch) == (T0, 5)


# ------------------------------------------------------------------------------------- coordinator side


def test_state_names_and_status_bytes_follow_kafka() -> None:
    names = ["Empty", "Ongoing", "PrepareCommit", "PrepareAbort", "CompleteCommit", "CompleteAbort", "Dead"]
    names.append("PrepareEpochFence")
    assert [CoordinatorState.from_status(i).value for i in range(8)] == names
    assert CoordinatorState.from_status("CompleteAbort") is CoordinatorState.COMPLETE_ABORT
    with pytest.raises(ValueError, match="unknown TransactionStatus 8"):
        CoordinatorState.from_status(8)


def test_tombstone_has_no_state_and_only_a_tombstone() -> None:
    t = tombstone(at_ms=T0)
    assert (t.tombstone, t.state, t.producer_id, t.source_timestamp_ms) == (True, None, -1, T0)
    with pytest.raises(ValidationError, match="tombstone"):
        coord(state=None)
    with pytest.raises(ValidationError, match="tombstone"):
        coord(tombstone=True)


@dataclass(frozen=True)
class FakeLogValue:
    """A codec-shaped value (the attributes of detectors.codec.TxnLogValue)."""

    producer_id: int = PID
    producer_epoch: int = 5
    transaction_timeout_ms: int = 60_000
    status: int = 1
    partitions: tuple[tuple[str, tuple[int, ...]], ...] | None = (("payments", (3, 1)), ("orders", (0,)))
    last_update_timestamp_ms: int = T0
    start_timestamp_ms: int = T0 - 10
    previous_producer_id: int = -1
    next_producer_id: int = -1
    client_transaction_version: int = 2


def test_from_log_value_flattens_and_sorts_partitions() -> None:
    r = CoordinatorRecord.from_log_value(
        "tx-1", FakeLogValue(), source_partition=7, source_offset=4242, source_timestamp_ms=T0
    )
    assert r.state is CoordinatorState.ONGOING and not r.tombstone
    assert r.partitions == tps("orders-0", "payments-1", "payments-3")
    assert (r.source_partition, r.source_offset, r.source_timestamp_ms) == (7, 4242, T0)
    assert r.lists("payments", 3) and not r.lists("payments", 2)


def test_from_log_value_null_partitions_of_empty_are_no_partitions() -> None:
    r = CoordinatorRecord.from_log_value(
        "tx-1",
        FakeLogValue(status=0, partitions=None),
        source_partition=0,
        source_offset=1,
        source_timestamp_ms=T0,
    )
    assert (r.state, r.partitions) == (CoordinatorState.EMPTY, ())


def test_from_log_value_none_is_a_tombstone() -> None:
    r = CoordinatorRecord.from_log_value(
        "tx-1", None, source_partition=0, source_offset=9, source_timestamp_ms=T0
    )
    assert (r.tombstone, r.state, r.source_offset) == (True, None, 9)


def test_from_log_value_takes_the_real_codec_value() -> None:
    # The glue the lead writes: decode_value(bytes) -> CoordinatorRecord.from_log_value(key.transactional_id, ...)
    from detectors.codec import TxnLogValue, TxnStatus

    value = TxnLogValue(
        version=1,
        producer_id=85,
        producer_epoch=0,
        transaction_timeout_ms=-1,
        status=TxnStatus.COMPLETE_COMMIT,
        partitions=None,
        last_update_timestamp_ms=T0,
        start_timestamp_ms=T0 - 5,
        previous_producer_id=73,
        client_transaction_version=2,
    )
    r = CoordinatorRecord.from_log_value(
        "tx-2pc", value, source_partition=1, source_offset=2, source_timestamp_ms=T0
    )
    assert (r.state, r.producer_id, r.previous_producer_id, r.next_producer_id) == (
        CoordinatorState.COMPLETE_COMMIT,
        85,
        73,
        -1,
    )
    assert (r.transaction_timeout_ms, r.client_transaction_version) == (-1, 2)


# ------------------------------------------------------------------------------------ verdicts, candidates


def test_only_hanging_and_unconfirmed_have_a_reason() -> None:
    evidence = a_candidate().evidence
    with pytest.raises(ValidationError, match="need a reason"):
        Verdict(kind=VerdictKind.HANGING, evidence=evidence, explanation="x")
    with pytest.raises(ValidationError, match="only they have one"):
        Verdict(
            kind=VerdictKind.LATE,
            reason=HangingReason.NO_COORDINATOR_STATE,
            evidence=evidence,
            explanation="x",
        )
    with pytest.raises(ValidationError, match="says why it was withheld"):
        Verdict(
            kind=VerdictKind.UNCONFIRMED,
            reason=HangingReason.NO_COORDINATOR_STATE,
            evidence=evidence,
            explanation="x",
        )
    with pytest.raises(ValidationError, match="says why it was withheld"):
        Verdict(
            kind=VerdictKind.HANGING,
            reason=HangingReason.NO_COORDINATOR_STATE,
            withheld=WithheldReason.COORDINATOR_VIEW_BEHIND,
            evidence=evidence,
            explanation="x",
        )
    ok = Verdict(
        kind=VerdictKind.UNCONFIRMED,
        reason=HangingReason.NO_COORDINATOR_STATE,
        withheld=WithheldReason.COORDINATOR_VIEW_BEHIND,
        evidence=evidence,
        explanation="x",
    )
    assert ok.withheld is WithheldReason.COORDINATOR_VIEW_BEHIND


def test_coordinator_log_position_checks_its_partitions() -> None:
    p = CoordinatorLogPosition(
        cluster="c", sweep_id="s", topic="__transaction_state", partitions=3, as_of_ms=1, end_offsets={0: 5}
    )
    assert CoordinatorLogPosition.model_validate_json(p.model_dump_json()) == p
    with pytest.raises(ValidationError, match=r"outside 0\.\.2"):
        CoordinatorLogPosition(
            cluster="c", sweep_id="s", topic="t", partitions=3, as_of_ms=1, end_offsets={3: 1}
        )
    with pytest.raises(ValidationError, match="negative end offset"):
        CoordinatorLogPosition(
            cluster="c", sweep_id="s", topic="t", partitions=3, as_of_ms=1, end_offsets={0: -1}
        )


def test_candidate_id_is_the_documented_sha256_prefix() -> None:
    payload = '["prod","orders",0,1000,5,100]'
    assert (
        candidate_id("prod", "orders", 0, 1000, 5, 100) == hashlib.sha256(payload.encode()).hexdigest()[:32]
    )


@pytest.mark.parametrize(
    "other",
    [
        pytest.param(("dev", "orders", 0, 1000, 5, 100), id="cluster"),
        pytest.param(("prod", "orders2", 0, 1000, 5, 100), id="topic"),
        pytest.param(("prod", "orders", 1, 1000, 5, 100), id="partition"),
        pytest.param(("prod", "orders", 0, 1001, 5, 100), id="producer-id"),
        pytest.param(("prod", "orders", 0, 1000, 6, 100), id="producer-epoch"),
        pytest.param(("prod", "orders", 0, 1000, 5, 101), id="start-offset"),
        pytest.param(("prod,orders", "0", 0, 1000, 5, 100), id="separators-cannot-collide"),
    ],
)
def test_candidate_id_changes_with_every_field(other: tuple[Any, ...]) -> None:
    assert candidate_id(*other) != candidate_id("prod", "orders", 0, 1000, 5, 100)


def test_candidate_rejects_an_id_that_does_not_match_its_fields() -> None:
    data = a_candidate().model_dump()
    data["candidate_id"] = "0" * 32
    with pytest.raises(ValidationError, match="does not match"):
        AbortCandidate.model_validate(data)


def test_candidate_resolution_is_consistent() -> None:
    data = a_candidate().model_dump()
    data["status"] = "RESOLVED"
    with pytest.raises(ValidationError, match="resolved_at_ms"):
        AbortCandidate.model_validate(data)


def test_marker_spec_never_carries_minus_one() -> None:
    with pytest.raises(ValidationError):
        WriteTxnMarkersSpec(topic="t", partition=0, producer_id=1, producer_epoch=0, coordinator_epoch=-1)
    assert a_candidate().spec.coordinator_epoch == 0


def test_snapshot_topic_partition() -> None:
    assert snapshot().topic_partition == TopicPartition(topic="orders", partition=0)
    assert isinstance(snapshot(), PartitionSnapshot)
