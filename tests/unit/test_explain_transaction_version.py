"""A verdict says which transaction version its coordinator evidence came from (issue 31, item 2): in the
explanation on-call reads and in the evidence's JSON (`coordinator.transaction_version`).

The version decides what the epochs mean (KIP-890: a TV2 client's epoch moves at the end of every transaction; under
TV0/TV1 one epoch runs from InitProducerId to the next), and which clusters write it: every 3.x broker, and a 4.x
cluster at transaction.version 0, writes values without a ClientTransactionVersion; the describe fallback's records
(DescribeTransactions) cannot tell.
"""

from __future__ import annotations

import json

import pytest
from builders import HOUR, LIMITS, MINUTE, T0, coord, open_txn, snapshot

from detectors.models import CoordinatorRecord, HangingReason, Verdict, VerdictKind
from detectors.rules import classify

pytestmark = pytest.mark.unit

OBSERVED = T0 + HOUR


def judged(record: CoordinatorRecord | None) -> Verdict:
    txn = open_txn()
    snap = snapshot(txn, observed_at_ms=OBSERVED)
    return classify(txn, snap, record, now_ms=OBSERVED, limits=LIMITS, view_current_ms=OBSERVED)


def completed(**overrides: object) -> CoordinatorRecord:
    """The producer id's own transaction completed a minute after the open one began: HANGING
    coordinator-completed, whatever the version."""
    return coord(state="CompleteCommit", partitions=(), last_update_timestamp_ms=T0 + MINUTE, **overrides)


@pytest.mark.parametrize(
    ("record", "version", "said"),
    [
        pytest.param(
            completed(client_transaction_version=2),
            2,
            "evidence of transaction version 2 (the coordinator record's ClientTransactionVersion: the epoch "
            "moves at the end of every transaction, KIP-890)",
            id="tv2-log-record",
        ),
        pytest.param(
            completed(client_transaction_version=0),
            0,
            "evidence of transaction version 0 (the coordinator record's ClientTransactionVersion, 0 where it "
            "has none, as on every 3.x broker",
            id="tv0-log-record",
        ),
        pytest.param(
            completed(client_transaction_version=0, origin="describe-transactions"),
            None,
            "evidence of transaction version unknown (the coordinator record came from DescribeTransactions",
            id="describe-fallback",
        ),
    ],
)
def test_the_explanation_and_json_name_the_evidences_transaction_version(
    record: CoordinatorRecord, version: int | None, said: str
) -> None:
    v = judged(record)
    assert (v.kind, v.reason) == (VerdictKind.HANGING, HangingReason.COORDINATOR_COMPLETED)
    assert said in v.explanation
    assert v.evidence.coordinator is not None
    assert json.loads(v.model_dump_json())["evidence"]["coordinator"]["transaction_version"] == version


def test_no_coordinator_record_names_no_version() -> None:
    v = judged(None)
    assert v.evidence.coordinator is None and "transaction version" not in v.explanation
