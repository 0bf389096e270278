"""A collector whose clock runs a minute ahead of the broker's, on a real broker (issue 30, item 3).

A real transaction is open; the collector sweeps twice (its clock, hence every stamp it writes, 60 s ahead), and
the transaction commits right after the second sweep. Its CompleteCommit is stamped by the coordinator's honest
clock, so by the stamps the second report came a minute after the commit, and stage 2 proves the committed
transaction HANGING `coordinator-completed`: an abort candidate for a transaction the coordinator committed.

The positions the collector publishes carry the log end offsets of `__transaction_state` (ListOffsets with
replica id -2, asked after the high watermarks), and the CompleteCommit lies at or above the second one: it was
appended after the report, whatever its stamp says. Stage 2 (`detectors.tracking.BucketState`, fed the
collector's real snapshots and positions and the coordinator's real records) then withholds the proof:
UNCONFIRMED `collector-clock-ahead`."""

from __future__ import annotations

import contextlib
import time

import pytest
from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import NewTopic
from stage2_rows import applied_row, batch, open_row, position_row, view_row
from workloads import transaction_log_records

from admin.collect.collector import Collector
from admin.wire.kafka_wire import KafkaWire
from admin.wire.types import wall_clock_ms
from common.settings import CollectorSettings
from detectors.currency import coordinator_partition
from detectors.models import (
    CoordinatorState,
    DetectionLimits,
)
from detectors.tracking import BucketState, ReconcileConfig

pytestmark = pytest.mark.broker

AHEAD_MS = 60_000
LIMITS = DetectionLimits()
SETTINGS = CollectorSettings(retry_backoff_ms=100, request_timeout_ms=10_000)


def ahead_ms() -> int:
    return wall_clock_ms() + AHEAD_MS


@pytest.mark.parametrize(
    "more_reports",
    [
        pytest.param(0, id="the-next-report"),
        # A busy collector (re-describes, follow-ups) publishes many positions: the one the guard needs, the first
        # after the report, must outlast them (it was dropped after 16).
        pytest.param(24, id="after-24-more-reports"),
    ],
)
def test_a_commit_after_the_report_of_a_collector_whose_clock_runs_ahead_is_not_hanging(
    bootstrap: str, unique: str, more_reports: int
) -> None:
    topic, tid = f"{unique}orders", f"{unique}tx"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(topic, 1, 1)])
    producer = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=tid, acks="all")
    wire = KafkaWire(admin, request_timeout_ms=SETTINGS.request_timeout_ms, clock_ms=ahead_ms)
    collector = Collector(wire, cluster="test", settings=SETTINGS, open_partitions=set(), clock_ms=ahead_ms)
    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send(topic, b"x").get(timeout=30)
        first = collector.sweep()
        time.sleep((LIMITS.grace_ms + LIMITS.clock_skew_ms) / 1000 + 1)
        second = collector.sweep()
        producer.commit_transaction()  # after the second sweep measured the log
        deadline = time.monotonic() + 30
        while (records := transaction_log_records(bootstrap, tid))[
            -1
        ].state is not CoordinatorState.COMPLETE_COMMIT:
            assert time.monotonic() < deadline, records
            time.sleep(0.2)
        third = collector.sweep()  # the leader no longer reports it; the log measured after the commit
        more = [collector.sweep().positions[0] for _ in range(more_reports)]
    finally:
        with contextlib.suppress(Exception):
            producer.close(timeout=5)
        admin.close()

    partition = coordinator_partition(tid, first.positions[0].partitions)
    (position_1,), (position_2,), (position_3,) = first.positions, second.positions, third.positions
    # The log end offset, asked of a real broker with replica id -2: at least the high watermark.
    assert position_2.log_end_offsets[partition] >= position_2.end_offsets[partition]
    snaps = [[s for s in sweep.snapshots if s.topic == topic] for sweep in (first, second)]
    assert all(len(s) == 1 and len(s[0].open_transactions) == 1 for s in snaps), snaps
    done = records[-1]
    assert done.source_offset >= position_2.log_end_offsets[partition], (
        "the commit was appended after the report"
    )
    # By the stamps, the report followed the commit by far more than the grace and skew.
    assert snaps[1][0].observed_at_ms - done.last_update_timestamp_ms > AHEAD_MS - 10_000

    # Stage 2, on the collector's clock, fed what the job would read: the Ongoing record, both reports and their
    # positions, then the CompleteCommit and the position measured after it (the view current as of then).
    config = ReconcileConfig(
        limits=LIMITS, expire_after_ms=600_000, view_ttl_ms=3_600_000, bootstrap=bootstrap
    )
    bucket = BucketState(config, {}, {})
    ongoing = [r for r in records if r.state is CoordinatorState.ONGOING][-1]
    before = dict.fromkeys(range(position_1.partitions), 0) | {partition: ongoing.source_offset + 1}
    batch(
        bucket,
        ahead_ms(),
        view_row(ongoing),
        applied_row(before),
        open_row(snaps[0][0]),
        position_row(position_1),
    )
    batch(bucket, ahead_ms(), open_row(snaps[1][0]), position_row(position_2))
    ends = {p: position_3.end_offsets.get(p, 0) for p in range(position_3.partitions)}
    events = batch(
        bucket,
        ahead_ms(),
        view_row(done),
        applied_row(ends),
        position_row(position_3),
        *(position_row(p) for p in more),
    )

    verdicts = [e for e in events if e["event"] == "VERDICT"]
    assert verdicts, events
    (verdict,) = verdicts
    assert verdict["kind"] != "HANGING", verdict["explanation"]
    assert (verdict["kind"], verdict["withheld"]) == ("UNCONFIRMED", "collector-clock-ahead"), verdict
    assert not [e for e in events if e["event"] == "OPENED"]
