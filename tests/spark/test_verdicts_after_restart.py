"""The driver's hanging series after the job restarts from its checkpoint, on real Spark and the real broker.

Stage 2 emits a VERDICT only when the verdict changes, and a restarted driver starts with no verdict at all: each
bucket tells the new run every verdict it holds again at its first batch (a run id per start of the job), so a
hanging transaction's series, and its page, are back as soon as the collector publishes, with nothing changed.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from pyspark.sql import SparkSession
from test_coordinator_view_order import Bed, _now, _wait_for

from common import metric_descriptors as metrics
from detectors.codec import TxnLogValue, TxnStatus
from streaming import job

pytestmark = pytest.mark.spark

PID = 9_200_001


@pytest.fixture
def bed(spark: SparkSession, bootstrap: str, tmp_path: Path) -> Iterator[Bed]:
    b = Bed(spark, bootstrap, tmp_path / "ck")
    try:
        yield b
    finally:
        b.stop()


def series(bed: Bed, family: str) -> dict[tuple[tuple[str, str], ...], float]:
    """The /metrics samples of `family` about the bed's topic, by their labels (scraped over HTTP, as Prometheus
    does)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{bed.running.metrics_port}/metrics", timeout=10) as r:
        text = r.read().decode()
    found = {}
    for f in text_string_to_metric_families(text):
        for s in f.samples:
            if s.name == family and s.labels.get("topic") == bed.data:
                found[tuple(sorted(s.labels.items()))] = s.value
    return found


def completed(pid: int, updated_ms: int) -> TxnLogValue:
    """The owner's transaction committed, listing no partition any more."""
    return TxnLogValue(
        version=1,
        producer_id=pid,
        producer_epoch=0,
        transaction_timeout_ms=60_000,
        status=TxnStatus.COMPLETE_COMMIT,
        partitions=(),
        last_update_timestamp_ms=updated_ms,
        start_timestamp_ms=updated_ms - 1_000,
        previous_producer_id=pid,
        client_transaction_version=2,
    )


def test_the_hanging_series_are_back_after_a_restart_with_no_verdict_changed(
    spark: SparkSession, bed: Bed
) -> None:
    t0 = _now()
    hanging = metrics.HANGING_TRANSACTION_OPEN_SINCE_TIMESTAMP_SECONDS.name
    lag = metrics.LAST_STABLE_OFFSET_LAG.name
    # A transaction left open on partition 0 after its owner's last transaction committed: HANGING.
    bed.coordinator_record("left", completed(PID, t0 - 60_000))
    for _ in range(3):
        bed.sweep((PID, 0, t0 - 30_000))
        bed.read_all()
        time.sleep(1.2)  # past the grace (1 s) since the first sighting
    verdict = _wait_for(
        lambda: (v := bed.verdict(PID, 0)) is not None and v.kind == "HANGING" and v, 60, "HANGING"
    )
    before, lag_before = series(bed, hanging), series(bed, lag)
    assert [dict(labels)["partition"] for labels in before] == ["0"]
    assert [dict(labels)["producer_id"] for labels in before] == [str(PID)]
    assert list(lag_before.values()) == [2.0]  # the high watermark 9, the LSO 7
    # The job restarts from its checkpoint: a new driver, whose live state is empty.
    bed.running.stop()
    bed.running = job.start(
        spark,
        job.StreamOptions(settings=bed.settings, kafka_options={"bootstrap.servers": bed.bootstrap}),
        out=None,
        queries=("reconcile",),
    )
    bed.query = bed.running.queries[0]
    assert bed.verdict(PID, 0) is None and series(bed, hanging) == {}
    # Only the collector's next position comes in (no snapshot: nothing about the transaction is new), and
    # every stage-2 bucket gets it.
    bed.sweep()
    bed.read_all()
    again = _wait_for(lambda: bed.verdict(PID, 0), 60, "the verdict told again")
    assert (again.kind, again.reason, again.candidate_id) == (
        verdict.kind,
        verdict.reason,
        verdict.candidate_id,
    )
    after = series(bed, hanging)
    assert list(after) == list(before)  # the same series: partition, owner, producer id, reason, candidate
    # When it opened, as the driver works it out (event time - age): within a sweep's delay of before.
    assert abs(next(iter(after.values())) - next(iter(before.values()))) < 30
    assert series(bed, lag) == lag_before
    # One candidate for it, opened before the restart: telling the verdict again opened none.
    opened = [json.loads(r.value) for r in bed.candidates()]
    assert [c["candidate_id"] for c in opened if c["status"] == "OPENED"] == [verdict.candidate_id]
