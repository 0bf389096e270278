"""`txnwatch inspect partition` ages open transactions as detectors does: a non-positive timestamp is unknown
(Kafka's NO_TIMESTAMP is -1), and an unknown start shows as an unknown age, never as decades since the epoch."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import pytest
from collector_fakes import T0, FakeCluster, FakeCoordinators, producer, start_batch

from admin.inspect.report import inspect_partition, render_partition
from admin.wire.types import FetchFailure, Offsets

pytestmark = pytest.mark.unit

NOW = T0 + 120_000
NO_BATCH = FetchFailure("NO_BATCH_AT_OFFSET", permanent=True)


@dataclass
class FakeBoth(FakeCluster, FakeCoordinators):
    pass


def test_inspect_partition_shows_an_unknown_start_as_an_unknown_age() -> None:
    tp = ("orders", 0)
    fake = FakeBoth(
        leaders={tp: 1},
        producers={
            tp: [
                # no start batch and LastTimestamp -1: nothing says when it started
                producer(producer_id=1, current_txn_start_offset=100, last_timestamp_ms=-1),
                # a start batch with timestamp 0 is unknown too; LastTimestamp stands in
                producer(producer_id=2, current_txn_start_offset=110, last_timestamp_ms=T0 + 60_000),
                # start batch timestamp -1 (NO_TIMESTAMP) and LastTimestamp 0: unknown
                producer(producer_id=3, current_txn_start_offset=120, last_timestamp_ms=0),
            ]
        },
        starts={
            (tp, 100): NO_BATCH,
            (tp, 110): start_batch(base_offset=110, producer_id=2, start_timestamp_ms=0),
            (tp, 120): start_batch(base_offset=120, producer_id=3, start_timestamp_ms=-1),
        },
        offsets={tp: Offsets(100, 150)},
    )
    report = inspect_partition(fake, "orders", 0, clock_ms=lambda: NOW)

    t1, t2, t3 = report.transactions
    assert (t1.age_ms, t2.age_ms, t3.age_ms) == (None, 60_000, None)
    out = report.as_json()["open_transactions"]
    assert [t["age_ms"] for t in out] == [None, 60_000, None]
    assert [t["open_since_basis"] for t in out] == ["unknown", "last-timestamp", "unknown"]
    json.dumps(out)  # still plain JSON

    text = render_partition(report)
    rows = {line.split()[0]: line for line in text.splitlines()[2:]}
    assert "unknown" in rows["1"].split() and "unknown" in rows["3"].split()
    assert "1m00s" in rows["2"] and "(last write used)" in rows["2"]
    # neither the epoch (1970) nor an age counted from it (hundreds of thousands of hours)
    assert "1970" not in text and not re.search(r"\b\d{3,}h\d\dm\d\ds\b", text)
