"""Tracking (detectors/tracking.py) without Spark: stage 1's `advance_owners`, stage 2's `BucketState` fed through
`reconcile_bucket` exactly as the processor feeds it (one list per input column), and the lean fact builders
held equal to the rules' model path."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from builders import LIMITS, MINUTE, PID, SECOND, T0, coord, open_txn, snapshot, tps

from detectors.began import begin_marks, carried_marks, without_marks
from detectors.contract import TRANSACTION_LOG_TOPIC
from detectors.currency import coordinator_partition
from detectors.models import (
    AbortCandidate,
    BeganMark,
    CandidateStatus,
    CoordinatorLogPosition,
    CoordinatorRecord,
    CoordinatorState,
    OpenTransaction,
    PartitionSnapshot,
    TopicPartition,
)
from detectors.rules import coord_facts, txn_facts
from detectors.tracking import (
    EVENT_COLUMNS,
    STAGE2_INPUT_COLUMNS,
    BucketState,
    CoordinatorRow,
    OpenRow,
    Owner,
    ReconcileConfig,
    VerdictNews,
    View,
    advance_owners,
    applied_facts,
    coord_facts_from_json,
    kept_past_ttl,
    open_entry,
    reconcile_bucket,
    run_ends,
)

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
LOG = TRANSACTION_LOG_TOPIC
CONFIG = ReconcileConfig(
    limits=LIMITS, expire_after_ms=30 * SECOND, view_ttl_ms=60 * MINUTE, bootstrap="b:9092"
)


def test_tracking_runs_without_spark_pandas_or_arrow() -> None:
    """The stages' rules are domain: importing them pulls in none of the job's frameworks, even indirectly."""
    code = (
        "import sys, detectors.tracking; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'pyspark', 'pandas', 'pyarrow', 'py4j'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# ------------------------------------------------------------------------------------------- stage 1


def row(record: CoordinatorRecord) -> CoordinatorRow:
    return CoordinatorRow(
        record.transactional_id,
        record.producer_id,
        record.previous_producer_id,
        record.next_producer_id,
        record.tombstone,
        record.last_update_timestamp_ms,
        record.source_offset,
        record.model_dump_json(),
    )


def test_a_lifecycle_gives_one_view_fact_with_the_newest_record() -> None:
    owners: dict[str, Owner] = {}
    records = [
        coord(state=s, source_offset=o, last_update_timestamp_ms=T0 + o)
        for o, s in enumerate(
            (CoordinatorState.ONGOING, CoordinatorState.PREPARE_COMMIT, CoordinatorState.COMPLETE_COMMIT), 1
        )
    ]
    facts = advance_owners(owners, [row(r) for r in reversed(records)])  # applied in log order anyway
    assert facts == [(PID, "view", "tx-1", records[-1].model_dump_json(), T0 + 3, 3)]
    assert owners == {"tx-1": Owner(PID, 3)}
    # A replay (a restart re-reading the log) changes nothing.
    assert advance_owners(owners, [row(records[1])]) == []
    assert owners == {"tx-1": Owner(PID, 3)}


def test_a_new_producer_id_retires_the_old_one_unless_the_record_names_it() -> None:
    owners = {"tx-1": Owner(PID, 3), "tx-2": Owner(2000, 3)}
    moved = coord(producer_id=PID + 1, source_offset=4, last_update_timestamp_ms=T0 + 4)
    bumped = coord(
        transactional_id="tx-2",
        producer_id=2001,
        previous_producer_id=2000,
        source_offset=4,
        last_update_timestamp_ms=T0 + 4,
    )
    facts = advance_owners(owners, [row(moved), row(bumped)])
    assert (PID, "retired", "tx-1", None, T0 + 4, 4) in facts
    assert (PID + 1, "view", "tx-1", moved.model_dump_json(), T0 + 4, 4) in facts
    # Epoch overflow (KIP-360): the new record still names the old producer id, so it stays its view.
    assert (2000, "view", "tx-2", bumped.model_dump_json(), T0 + 4, 4) in facts
    assert owners == {"tx-1": Owner(PID + 1, 4), "tx-2": Owner(2001, 4)}


def test_a_tombstone_retires_the_producer_id_and_forgets_the_transactional_id() -> None:
    owners = {"tx-1": Owner(PID, 3)}
    gone = CoordinatorRecord.tombstone_of("tx-1", source_partition=7, source_offset=9, source_timestamp_ms=T0)
    assert advance_owners(owners, [row(gone)]) == [
        (PID, "retired", "tx-1", None, gone.last_update_timestamp_ms, 9)
    ]
    assert owners == {}


def test_records_without_offsets_always_apply() -> None:
    # The DescribeTransactions fallback has no log offsets (-1): each record is news.
    owners = {"tx-1": Owner(PID, -1)}
    record = coord(origin="describe-transactions", source_offset=-1, source_partition=-1)
    assert len(advance_owners(owners, [row(record)])) == 1
    assert len(advance_owners(owners, [row(record)])) == 1


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
def test_the_lean_json_reading_agrees_with_the_model(record: CoordinatorRecord) -> None:
    assert coord_facts_from_json(record.model_dump_json()) == coord_facts(record)


def test_stage_1_says_the_same_of_the_compacted_log_as_of_the_whole_log() -> None:
    """run_ends (the decoder applies it) drops the records between the first and last of a run; stage 1 must
    not notice."""
    rng = random.Random(11)
    dropped = 0
    for _ in range(300):
        records: list[CoordinatorRow] = []
        pids = {f"tx-{i}": 1000 + i for i in range(3)}
        for offset in range(rng.randint(1, 40)):
            tid = rng.choice(sorted(pids))
            roll = rng.random()
            if roll < 0.08:
                records.append(CoordinatorRow(tid, -1, -1, -1, True, T0 + offset, offset, "{}"))
                continue
            previous = pids[tid]
            if roll < 0.25:  # a new producer id, sometimes naming the old one
                pids[tid] = previous + 100
            names_old = previous if pids[tid] != previous and rng.random() < 0.5 else -1
            records.append(
                CoordinatorRow(tid, pids[tid], names_old, -1, False, T0 + offset, offset, f'{{"o":{offset}}}')
            )
        start = {f"tx-{i}": Owner(1000 + i, -1) for i in range(3) if rng.random() < 0.5}
        keep = run_ends(
            [r.transactional_id for r in records],
            [r.producer_id for r in records],
            [r.tombstone for r in records],
        )
        whole, compacted = dict(start), dict(start)
        expected = advance_owners(whole, records)
        got = advance_owners(compacted, [r for r, k in zip(records, keep, strict=True) if k])
        assert sorted(got, key=repr) == sorted(expected, key=repr)
        assert compacted == whole
        dropped += keep.count(False)
    assert dropped > 1000  # the scenarios do have runs to compact


def test_stage_1_reports_how_far_each_coordinator_partition_was_read() -> None:
    facts = applied_facts([LOG, LOG, LOG, None], [0, 1, 0, None], [7, 3, 9, None])  # type: ignore[list-item]
    assert facts == [(-1, "applied", LOG, json.dumps({0: 10, 1: 4}), 0, -1)]


# ------------------------------------------------------------------------------------------- stage 2


def open_row(s: PartitionSnapshot) -> list[Any]:
    """A stage-2 input row for the first open transaction of `s`, as streaming.rows.open_transaction_rows builds it."""
    t = s.open_transactions[0]
    one = s.model_copy(update={"open_transactions": (t,)})
    values = {
        "producer_id": t.producer_id,
        "fact": "open",
        "topic": s.topic,
        "partition": s.partition,
        "snapshot_json": one.model_dump_json(),
        "observed_at_ms": s.observed_at_ms,
        "leader": s.leader,
        "start_offset": t.start_offset,
        "producer_epoch": t.producer_epoch,
        "start_batch_producer_epoch": t.start_batch_producer_epoch,
        "start_timestamp_ms": t.start_timestamp_ms,
        "last_timestamp_ms": t.last_timestamp_ms,
        "opened_after_ms": t.opened_after_ms,
        "seen_open_ms": t.seen_open_ms,
        "max_transaction_timeout_ms": s.max_transaction_timeout_ms,
        "lso_lag": s.high_watermark - s.last_stable_offset,  # type: ignore[operator]
        "start_batch_leader_epoch": t.start_batch_leader_epoch,
        "leader_epoch": s.leader_epoch,
    }
    return [values.get(c) for c in STAGE2_INPUT_COLUMNS[1:]]


def fact_row(
    record: CoordinatorRecord | None,
    *,
    producer_id: int = PID,
    retired_at: int = 0,
    log_offset: int | None = None,
) -> list[Any]:
    """Stage 1's view fact of `record` (retired at `retired_at` if None), at `log_offset` in the coordinator log
    (None: unknown, as stage 1 sends a fact of the describe fallback)."""
    values: dict[str, Any] = {
        "producer_id": producer_id,
        "fact": "retired",
        "fact_time_ms": retired_at,
        "log_offset": log_offset,
    }
    if record is not None:
        values.update(
            fact="view",
            transactional_id=record.transactional_id,
            record_json=record.model_dump_json(),
            fact_time_ms=record.last_update_timestamp_ms,
        )
    return [values.get(c) for c in STAGE2_INPUT_COLUMNS[1:]]


def position_row(
    as_of_ms: int,
    ends: dict[int, int] | None = None,
    *,
    partitions: int = 3,
    log_ends: dict[int, int] | None = None,
) -> list[Any]:
    """A CoordinatorLogPosition row, as streaming.rows.open_transaction_rows passes it (the raw JSON)."""
    position = CoordinatorLogPosition(
        cluster="c",
        sweep_id="s",
        topic=LOG,
        partitions=partitions,
        as_of_ms=as_of_ms,
        end_offsets=ends if ends is not None else dict.fromkeys(range(partitions), 0),
        log_end_offsets=log_ends or {},
    )
    values = {"producer_id": -1, "fact": "position", "record_json": position.model_dump_json()}
    values["fact_time_ms"] = as_of_ms
    return [values.get(c) for c in STAGE2_INPUT_COLUMNS[1:]]


def applied_row(ends: dict[int, int]) -> list[Any]:
    """Stage 1's "applied" fact: the view holds every record of the log below these offsets."""
    values = {"producer_id": -1, "fact": "applied", "transactional_id": LOG, "record_json": json.dumps(ends)}
    values["fact_time_ms"] = 0
    return [values.get(c) for c in STAGE2_INPUT_COLUMNS[1:]]


def batch(bucket: BucketState, now_ms: int, *rows: list[Any], current: bool = True) -> list[dict[str, Any]]:
    """One batch; unless `current` is False, the collector measured an empty log at `now_ms` (the view is
    current as of then), as the rules need for any HANGING proof."""
    rows = (*rows, position_row(now_ms)) if current else rows
    columns = [list(c) for c in zip(*rows, strict=True)] if rows else [[] for _ in STAGE2_INPUT_COLUMNS[1:]]
    return [dict(zip(EVENT_COLUMNS, e, strict=True)) for e in reconcile_bucket(bucket, columns, now_ms)]


def open_row_of(s: PartitionSnapshot) -> OpenRow:
    """The OpenRow reconcile_bucket makes of `open_row(s)`."""
    values = open_row(s)
    return OpenRow(values[0], *values[6:])


@pytest.mark.parametrize(
    "txn",
    [
        pytest.param(open_txn(), id="start-batch-known"),
        pytest.param(
            open_txn(start_timestamp_ms=None, start_batch_producer_epoch=None), id="start-batch-unknown"
        ),
        pytest.param(
            open_txn(start_timestamp_ms=-1, last_timestamp_ms=T0 + 3), id="non-positive-start-is-unknown"
        ),
        pytest.param(open_txn(start_batch_producer_epoch=4, producer_epoch=5), id="epoch-bumped-since-start"),
        pytest.param(open_txn(start_timestamp_ms=None, last_timestamp_ms=-1), id="no-timestamp-at-all"),
        pytest.param(
            open_txn(start_timestamp_ms=T0 - 7_200_000, opened_after_ms=T0, seen_open_ms=T0 + 5),
            id="event-time",
        ),
        pytest.param(open_txn(start_timestamp_ms=T0 + 7_200_000, seen_open_ms=T0), id="future-time"),
    ],
)
@pytest.mark.parametrize("max_timeout", [900_000, None])
@pytest.mark.parametrize("first_seen", [T0 - MINUTE, None])
def test_open_entry_facts_are_the_rules_txn_facts(
    txn: OpenTransaction, max_timeout: int | None, first_seen: int | None
) -> None:
    """One way to build an open transaction's facts: the stage's lean row gives what `rules.txn_facts` gives
    the models (the spark tier holds the row itself equal to what Spark builds)."""
    s = snapshot(txn, max_transaction_timeout_ms=max_timeout)
    entry = open_entry(open_row_of(s), first_seen, None, None)
    assert entry.facts == txn_facts(txn, s, first_seen_ms=first_seen)


def new_bucket() -> BucketState:
    return BucketState(CONFIG, {}, {})


def seen_at(at_ms: int, **txn: Any) -> PartitionSnapshot:
    return snapshot(open_txn(**txn), observed_at_ms=at_ms)


def told(b: BucketState, producer_id: int = PID, partition: int = 0) -> VerdictNews:
    """What the driver was last told of the open transaction on orders-`partition` (the VERDICT it holds): a
    batch emits a VERDICT only when this changes."""
    announced = b.opens[(producer_id, "orders", partition)].announced
    assert announced is not None, "never told"
    return VerdictNews(*announced)


def test_a_transaction_left_open_after_its_commit_opens_one_candidate_then_resolves() -> None:
    done = coord(state=CoordinatorState.COMPLETE_COMMIT, partitions=(), last_update_timestamp_ms=T0 + SECOND)
    b = new_bucket()
    t1 = T0 + MINUTE
    first = batch(b, t1, fact_row(done), open_row(seen_at(t1)))
    # First seen just now: the grace period runs from our own first sighting too.
    assert [e["event"] for e in first] == ["VERDICT"]
    assert (first[0]["kind"], first[0]["explanation"]) == ("OPEN", None)  # plain OPEN is not explained

    t2 = t1 + 15 * SECOND
    second = batch(b, t2, open_row(seen_at(t2)))
    assert [e["event"] for e in second] == ["OPENED", "VERDICT"]
    opened, verdict = second
    assert (verdict["kind"], verdict["reason"]) == ("HANGING", "coordinator-completed")
    candidate = AbortCandidate.model_validate_json(opened["payload"])
    assert verdict["candidate_id"] == opened["candidate_id"] == candidate.candidate_id
    assert "--start-offset 100" in candidate.kafka_cli and candidate.spec.producer_id == PID
    assert verdict["age_ms"] == t2 - T0 and verdict["lso_lag"] == 150

    # Confirmed again: the same verdict, which the driver holds: no second OPENED, no VERDICT.
    third = batch(b, t2 + 5 * SECOND, open_row(seen_at(t2 + 5 * SECOND)))
    assert third == []
    assert (told(b).kind, told(b).candidate_id) == ("HANGING", candidate.candidate_id)

    # No snapshot confirms it any more (aborted): forgotten at the deadline, the candidate resolved.
    deadline = b.next_deadline()
    assert deadline == t2 + 5 * SECOND + CONFIG.expire_after_ms
    assert b.expire(deadline - 1) == []
    gone = [dict(zip(EVENT_COLUMNS, e, strict=True)) for e in b.expire(deadline)]
    assert [e["event"] for e in gone] == ["GONE", "RESOLVED"]
    assert AbortCandidate.model_validate_json(gone[1]["payload"]).candidate_id == candidate.candidate_id
    assert b.opens == {}


def test_a_candidate_whose_proof_is_disproved_is_withdrawn_and_opened_again_when_proven_again() -> None:
    """A HANGING candidate stays OPENED only while its proof holds. Here the view reads a later record of the
    owner that lists the partition (the proof's premise, "the coordinator completed", no longer holds): the
    candidate is WITHDRAWN with that verdict as its reason (facts without log offsets apply in the order they
    come, as the describe fallback's do), and the VERDICT no longer names it (the abort
    candidates gauge and alert follow). Before, it stayed OPENED until the transaction ended."""
    done = coord(state=CoordinatorState.COMPLETE_COMMIT, partitions=(), last_update_timestamp_ms=T0 + SECOND)
    b = new_bucket()
    t1 = T0 + MINUTE
    batch(b, t1, fact_row(done), open_row(seen_at(t1)))
    t2 = t1 + 15 * SECOND
    opened, _ = batch(b, t2, open_row(seen_at(t2)))
    assert opened["event"] == "OPENED"
    live = coord(transaction_timeout_ms=900_000, last_update_timestamp_ms=t2)
    t3 = t2 + 5 * SECOND
    withdrawn, verdict = batch(b, t3, fact_row(live), open_row(seen_at(t3)))
    assert (withdrawn["event"], withdrawn["candidate_id"]) == ("WITHDRAWN", opened["candidate_id"])
    candidate = AbortCandidate.model_validate_json(withdrawn["payload"])
    assert candidate.status is CandidateStatus.WITHDRAWN and candidate.resolved_at_ms == t3
    assert candidate.withdrawn_reason is not None and candidate.withdrawn_reason.startswith("OPEN")
    assert (verdict["kind"], verdict["candidate_id"]) == ("OPEN", None)
    # Later the owner completes again without the partition: proven again, OPENED again under the same id.
    again = coord(state=CoordinatorState.COMPLETE_ABORT, partitions=(), last_update_timestamp_ms=t3 + SECOND)
    t4 = t3 + 20 * SECOND
    events = batch(b, t4, fact_row(again), open_row(seen_at(t4)))
    assert [(e["event"], e["candidate_id"]) for e in events] == [
        ("OPENED", opened["candidate_id"]),
        ("VERDICT", opened["candidate_id"]),
    ]


def test_a_verdict_is_explained_when_it_is_new_not_every_batch() -> None:
    b = new_bucket()
    at = T0 + 20 * MINUTE  # open for 20 min, past the broker's 15 min max timeout
    (late,) = batch(b, at, open_row(seen_at(at)))
    assert late["kind"] == "LATE" and "open on orders-0 from offset 100 for 20m00s" in late["explanation"]
    assert batch(b, at + 5 * SECOND, open_row(seen_at(at + 5 * SECOND))) == []  # nothing new
    # The LSO lag moved (a VERDICT for the driver's series), the verdict did not: not explained again.
    moved = snapshot(open_txn(), observed_at_ms=at + 10 * SECOND, high_watermark=400)
    (again,) = batch(b, at + 10 * SECOND, open_row(moved))
    assert (again["kind"], again["explanation"], again["lso_lag"]) == ("LATE", None, 300)


@pytest.mark.parametrize(
    ("change", "news"),
    [
        pytest.param({}, None, id="only-older"),
        pytest.param({"high_watermark": 400}, ("lso_lag", 300), id="lso-lag"),
        pytest.param({"leader": 2}, ("leader", 2), id="leader"),
        pytest.param({"start_timestamp_ms": T0 + SECOND}, ("open_since_ms", T0 + SECOND), id="open-since"),
    ],
)
def test_a_verdict_is_told_again_only_when_what_the_driver_reads_of_it_changes(
    change: dict[str, Any], news: tuple[str, Any] | None
) -> None:
    """The age grows every sweep and the driver works it out (open since); the LSO lag (its per-partition
    series), the leader and when the transaction opened are read as told, so they are news."""
    b = new_bucket()
    assert [e["kind"] for e in batch(b, T0 + MINUTE, open_row(seen_at(T0 + MINUTE)))] == ["OPEN"]
    at = T0 + MINUTE + 5 * SECOND  # within the grace since the first sighting: OPEN throughout
    txn = {k: v for k, v in change.items() if k == "start_timestamp_ms"}
    shown = snapshot(open_txn(**txn), observed_at_ms=at, **{k: v for k, v in change.items() if k not in txn})
    events = batch(b, at, open_row(shown))
    if news is None:
        assert events == []
        return
    (verdict,) = events
    field, value = news
    assert (verdict["event"], verdict["kind"], verdict["explanation"]) == ("VERDICT", "OPEN", None)
    assert getattr(told(b), field) == value
    assert verdict["age_ms"] == at - told(b).open_since_ms  # the driver's open since: event time - age
    assert (
        batch(b, at + 5 * SECOND, open_row(shown.model_copy(update={"observed_at_ms": at + 5 * SECOND})))
        == []
    )


def test_a_new_run_tells_every_open_transaction_tracked_once_changed_or_not() -> None:
    b = new_bucket()
    batch(b, T0 + MINUTE, open_row(seen_at(T0 + MINUTE)))
    batch(
        b,
        T0 + MINUTE,
        open_row(snapshot(open_txn(producer_id=PID + 2), observed_at_ms=T0 + MINUTE, partition=4)),
    )
    columns: list[list[Any]] = [[] for _ in STAGE2_INPUT_COLUMNS[1:]]
    assert reconcile_bucket(b, columns, T0 + MINUTE + SECOND) == []
    events = reconcile_bucket(b, columns, T0 + MINUTE + 2 * SECOND, announce=True)
    assert sorted((e[0], e[1], e[3], e[6]) for e in events) == [
        ("VERDICT", PID, 0, "OPEN"),
        ("VERDICT", PID + 2, 4, "OPEN"),
    ]
    assert reconcile_bucket(b, columns, T0 + MINUTE + 3 * SECOND) == []


def test_a_coordinator_that_still_lists_the_partition_keeps_the_transaction_open() -> None:
    live = coord(transaction_timeout_ms=900_000, last_update_timestamp_ms=T0 + SECOND)
    b = new_bucket()
    for at in (T0 + 20 * SECOND, T0 + 40 * SECOND):
        events = batch(b, at, fact_row(live), open_row(seen_at(at)))
        assert all(e["event"] == "VERDICT" for e in events)  # no OPENED
        assert told(b).kind == "OPEN" and told(b).candidate_id is None


def test_a_retired_producer_id_with_an_open_transaction_hangs() -> None:
    b = new_bucket()
    batch(b, T0 + MINUTE, fact_row(None, retired_at=T0 + SECOND), open_row(seen_at(T0 + MINUTE)))
    events = batch(b, T0 + 2 * MINUTE, open_row(seen_at(T0 + 2 * MINUTE)))
    assert [(e["event"], e["reason"]) for e in events] == [
        ("OPENED", "no-coordinator-state"),
        ("VERDICT", "no-coordinator-state"),
    ]


def test_a_new_transaction_on_the_partition_ends_the_old_one_and_late_snapshots_change_nothing() -> None:
    b = new_bucket()
    batch(b, T0 + MINUTE, open_row(seen_at(T0 + MINUTE)))
    later = seen_at(T0 + 2 * MINUTE, start_offset=300, start_timestamp_ms=T0 + 90 * SECOND)
    events = batch(b, T0 + 2 * MINUTE, open_row(later))
    assert [(e["event"], e["start_offset"]) for e in events] == [("GONE", 100), ("VERDICT", 300)]
    # A snapshot older than what we know, arriving late: ignored (no GONE of the newer transaction).
    assert batch(b, T0 + 2 * MINUTE, open_row(seen_at(T0 + MINUTE))) == []
    (entry,) = b.opens.values()
    assert entry.start_offset == 300 and entry.facts.first_seen_ms == T0 + 2 * MINUTE


def test_only_the_producer_ids_in_a_batch_are_judged_but_expiry_covers_the_bucket() -> None:
    b = new_bucket()
    batch(b, T0 + MINUTE, open_row(seen_at(T0 + MINUTE)))
    other = snapshot(open_txn(producer_id=PID + 2), observed_at_ms=T0 + 80 * SECOND, partition=4)
    events = batch(b, T0 + 80 * SECOND, open_row(other))
    assert [(e["event"], e["producer_id"]) for e in events] == [("VERDICT", PID + 2)]
    events = batch(b, T0 + 95 * SECOND, open_row(other))  # PID was last confirmed 35 s ago
    assert [(e["event"], e["producer_id"]) for e in events] == [("GONE", PID)]  # PID + 2's is unchanged


def test_views_of_finished_transactions_go_to_the_views_that_expire() -> None:
    """Views whose transaction is over (completed, retired) are written to the state the store forgets after
    `view_ttl_ms` (the Spark adapter's TTL map: tests/unit/test_reconcile.py); no timer of the bucket's own."""
    b = new_bucket()
    done = coord(state=CoordinatorState.COMPLETE_COMMIT, partitions=())
    batch(
        b, T0, fact_row(done, log_offset=1), fact_row(None, producer_id=PID + 1, retired_at=T0, log_offset=2)
    )
    assert [(pid, kept) for pid, _, kept in b.view_homes()] == [(PID, False), (PID + 1, False)]
    assert b.next_deadline() is None


# ------------------------------------------------------- ordered by the log, not the clock (issue 20, item 3)


def test_a_later_record_in_the_log_wins_whatever_its_timestamp() -> None:
    """Kafka stamps TransactionLastUpdateTimestampMs with the coordinator broker's clock and never checks that it
    increases (a coordinator moved to a broker whose clock is behind). The record that added orders-1 is later in
    the log but stamped a minute earlier; ordered by the clock it was dropped, and the transaction on orders-1
    was HANGING partition-not-in-transaction until it ended."""
    first = coord(partitions=tps("orders-0"), last_update_timestamp_ms=T0 - 50, source_offset=10)
    added = coord(
        partitions=tps("orders-0", "orders-1"),
        last_update_timestamp_ms=T0 - 50 - MINUTE,
        source_offset=11,
        transaction_timeout_ms=900_000,
    )
    b = new_bucket()
    batch(b, T0, fact_row(first, log_offset=10))
    batch(b, T0 + SECOND, fact_row(added, log_offset=11))
    assert b.views[PID].log_offset == 11
    batch(b, T0 + 2 * SECOND, fact_row(first, log_offset=10))  # an earlier record again: changes nothing
    assert coord_facts_from_json(b.views[PID].record_json or "").partitions == {("orders", 0), ("orders", 1)}
    for at, news in ((T0 + 20 * SECOND, [("VERDICT", "OPEN")]), (T0 + 40 * SECOND, [])):
        events = batch(b, at, open_row(snapshot(open_txn(), observed_at_ms=at, partition=1)))
        assert [(e["event"], e["kind"]) for e in events] == news
        assert told(b, partition=1).kind == "OPEN"  # past the grace too


def test_facts_of_one_batch_apply_in_log_order() -> None:
    first = coord(partitions=tps("orders-0"), last_update_timestamp_ms=T0, source_offset=10)
    added = coord(
        partitions=tps("orders-0", "orders-1"), last_update_timestamp_ms=T0 - MINUTE, source_offset=11
    )
    b = new_bucket()
    batch(b, T0, fact_row(added, log_offset=11), fact_row(first, log_offset=10))
    assert b.views[PID].log_offset == 11
    assert b.views[PID].record_json == added.model_dump_json()


def test_stage_1_facts_carry_the_log_offset_not_the_clock_order() -> None:
    owners: dict[str, Owner] = {}
    first = coord(state=CoordinatorState.ONGOING, source_offset=10, last_update_timestamp_ms=T0)
    added = coord(state=CoordinatorState.ONGOING, source_offset=11, last_update_timestamp_ms=T0 - MINUTE)
    assert advance_owners(owners, [row(first)]) == [(PID, "view", "tx-1", first.model_dump_json(), T0, 10)]
    assert advance_owners(owners, [row(added)]) == [
        (PID, "view", "tx-1", added.model_dump_json(), T0 - MINUTE, 11)
    ]
    assert owners == {"tx-1": Owner(PID, 11)}


# --------------------------------------------- a transaction in progress keeps its view (issue 20, item 2)


@pytest.mark.parametrize(
    "state", [CoordinatorState.ONGOING, CoordinatorState.PREPARE_COMMIT, CoordinatorState.PREPARE_ABORT]
)
def test_a_transaction_in_progress_keeps_its_view_while_its_partition_goes_unreported(
    state: CoordinatorState,
) -> None:
    """A transaction held open longer than the view TTL (two-phase commit: no timeout) whose partition goes
    unreported past `expire_after_ms` (its leader restarts): its open entry is forgotten, but its view must not
    be, or when the partition is reported again it reads as HANGING no-coordinator-state and is OPENED."""
    held = coord(state=state, transaction_timeout_ms=2**31 - 1, last_update_timestamp_ms=T0 - 1)
    b = new_bucket()
    batch(b, T0, fact_row(held, log_offset=5), open_row(seen_at(T0)))
    batch(b, T0 + 20 * SECOND, open_row(seen_at(T0 + 20 * SECOND)))
    gone = b.expire(T0 + 20 * SECOND + CONFIG.expire_after_ms)  # the partition went unreported
    assert [e[0] for e in gone] == ["GONE"] and b.opens == {}
    # no longer in use, but in progress: kept past the TTL
    assert [(pid, kept) for pid, _, kept in b.view_homes()] == [(PID, True)]
    later = T0 + CONFIG.view_ttl_ms + MINUTE
    assert b.views[PID].record_json == held.model_dump_json()
    assert b.next_deadline() is None
    events = [e for at in (later, later + 20 * SECOND) for e in batch(b, at, open_row(seen_at(at)))]
    assert [e["event"] for e in events] == ["VERDICT"]  # no OPENED, and nothing new the second time
    assert {(e["kind"], e["reason"]) for e in events} <= {("LATE", None), ("STUCK_PREPARE", None)}


def test_views_stored_before_the_progress_flag_are_kept_by_their_record() -> None:
    """A v0.1.0 checkpoint stores views as 4-tuples: they load with an unknown log position (the next fact
    applies) and an unknown progress flag, worked out from the record to decide whether they outlive the TTL."""
    ongoing, done = coord(), coord(producer_id=PID + 1, state=CoordinatorState.COMPLETE_ABORT, partitions=())
    stored = {PID: (ongoing.model_dump_json(), None, T0, T0), PID + 1: (done.model_dump_json(), None, T0, T0)}
    views = {pid: View(*v) for pid, v in stored.items()}
    assert views[PID].in_progress is None and views[PID].log_offset == -1
    assert kept_past_ttl(views[PID], in_use=False) and not kept_past_ttl(views[PID + 1], in_use=False)
    assert kept_past_ttl(views[PID + 1], in_use=True)
    b = BucketState(CONFIG, views, {})
    batch(b, T0 + MINUTE, fact_row(coord(state=CoordinatorState.COMPLETE_COMMIT), log_offset=3))
    assert b.views[PID].log_offset == 3 and b.views[PID].in_progress is False  # worked out as it applies
    assert [(pid, kept) for pid, _, kept in b.view_homes()] == [(PID, False)]


# ------------------------------------------------------------------------- the view's currency (issue 9)


def test_a_live_transaction_is_not_hanging_while_the_view_is_behind() -> None:
    """The issue's case: the view still shows the producer's previous transaction completed (its new Ongoing
    record, listing the partition, is not read yet). Today's rules alone say HANGING coordinator-completed."""
    done = coord(state=CoordinatorState.COMPLETE_COMMIT, partitions=(), last_update_timestamp_ms=T0 - MINUTE)
    b = new_bucket()
    t1 = T0 + 5 * SECOND
    # The collector measured the log at 10 records; the view has applied 4 of them.
    batch(b, t1, fact_row(done), position_row(t1, {0: 10, 1: 0, 2: 0}), applied_row({0: 4}), current=False)
    batch(b, t1, open_row(seen_at(t1)), current=False)
    for at in (T0 + 20 * SECOND, T0 + 29 * SECOND):
        events = batch(b, at, open_row(seen_at(at)), position_row(at, {0: 12}), current=False)
        assert all(e["event"] == "VERDICT" for e in events)  # no OPENED
        assert (told(b).kind, told(b).reason, told(b).withheld) == (
            "UNCONFIRMED",
            "coordinator-completed",
            "coordinator-view-behind",
        )
    # The view catches up: the Ongoing record listing the partition arrives with the rest of the log.
    ongoing = coord(start_timestamp_ms=T0 - 10, last_update_timestamp_ms=T0 - 5)
    events = batch(b, T0 + 31 * SECOND, fact_row(ongoing), applied_row({0: 12}), current=False)
    assert [(e["event"], e["kind"]) for e in events if e["event"] != "VIEW"] == [("VERDICT", "OPEN")]
    assert all(e["event"] != "OPENED" for e in events)


def test_an_unseen_producer_id_is_not_hanging_until_every_partition_is_current() -> None:
    b = new_bucket()
    batch(b, T0, open_row(seen_at(T0)), position_row(T0, {0: 5, 1: 5, 2: 5}), applied_row({0: 5, 1: 5}))
    at = T0 + MINUTE
    events = batch(b, at, open_row(seen_at(at)), current=False)
    assert [(e["kind"], e["reason"]) for e in events] == [("UNCONFIRMED", "no-coordinator-state")]
    # Partition 2 is read up to the position taken at T0: current as of T0, when it was first seen, but the
    # grace had not passed since then; not yet proof.
    assert batch(b, at + SECOND, applied_row({2: 5}), current=False) == []  # judged again, unchanged
    assert told(b).kind == "UNCONFIRMED"
    # A newer position, covered: proof now (re-judged without news of its own, because the view moved).
    events = batch(b, at + 2 * SECOND, position_row(at, {0: 5, 1: 5, 2: 5}), current=False)
    assert [(e["event"], e["reason"]) for e in events] == [
        ("OPENED", "no-coordinator-state"),
        ("VERDICT", "no-coordinator-state"),
    ]
    candidate = AbortCandidate.model_validate_json(events[0]["payload"])
    assert candidate.evidence.first_seen_ms == T0  # the original first sighting, kept while withheld
    assert candidate.evidence.view_current_as_of_ms == at and candidate.evidence.judged_as_of_ms == at


def test_a_view_behind_the_newest_report_proves_as_of_an_earlier_one() -> None:
    """Under sustained lag the view never reaches the newest snapshot; an orphan open since before the moment
    it is current as of is still proven, as of that moment."""
    done = coord(state=CoordinatorState.COMPLETE_COMMIT, partitions=(), last_update_timestamp_ms=T0 - MINUTE)
    b = new_bucket()
    batch(b, T0, fact_row(done), open_row(seen_at(T0)), current=False)
    mid = T0 + 20 * SECOND
    batch(b, mid, open_row(seen_at(mid)), position_row(mid, {0: 3, 1: 3, 2: 3}), current=False)
    newest = T0 + 45 * SECOND  # the log keeps growing faster than the job reads it
    events = batch(
        b,
        newest,
        open_row(seen_at(newest)),
        position_row(newest, {0: 9}),
        applied_row({0: 3, 1: 3, 2: 3}),  # read up to mid's position only
        current=False,
    )
    opened = next(e for e in events if e["event"] == "OPENED")
    candidate = AbortCandidate.model_validate_json(opened["payload"])
    assert candidate.evidence.judged_as_of_ms == mid
    assert "judged as of" in candidate.explanation


def test_a_view_naming_another_producer_id_is_withheld_not_hanging() -> None:
    """A stored view that names neither the producer id nor its previous/next one used to read as "no
    coordinator", which after the grace became HANGING no-coordinator-state; the rules refuse that input."""
    b = new_bucket()
    b.views[PID] = View(coord(producer_id=PID + 7).model_dump_json(), None, T0, T0)
    batch(b, T0, open_row(seen_at(T0)))
    events = batch(b, T0 + MINUTE, open_row(seen_at(T0 + MINUTE)))
    assert [(e["event"], e["kind"], e["withheld"]) for e in events] == [
        ("VERDICT", "UNCONFIRMED", "coordinator-view-inconsistent")
    ]


def test_the_view_of_a_producer_id_with_an_open_transaction_outlives_its_ttl() -> None:
    """A view whose transaction is over is still kept past the TTL while an open transaction of its producer id
    is tracked (a lost commit marker must be judged against the commit, never against "no owner"), and goes
    back to the views that expire once that open transaction is forgotten."""
    done = coord(state=CoordinatorState.COMPLETE_COMMIT, last_update_timestamp_ms=T0 - 1)
    b = new_bucket()
    batch(b, T0, fact_row(done))
    assert [(pid, kept) for pid, _, kept in b.view_homes()] == [(PID, False)]
    b = BucketState(CONFIG, b.views.loaded(), {})
    batch(b, T0 + SECOND, open_row(seen_at(T0 + SECOND)))
    assert [(pid, kept) for pid, _, kept in b.view_homes()] == [(PID, True)]  # now in use: it moves
    b = BucketState(CONFIG, b.views.loaded(), dict(b.opens))
    batch(b, T0 + 2 * SECOND, open_row(seen_at(T0 + 2 * SECOND)))
    assert b.view_homes() == []  # unchanged and still in use: nothing to write
    gone = b.expire(T0 + 2 * SECOND + CONFIG.expire_after_ms)
    assert [e[0] for e in gone][:1] == ["GONE"]
    assert [(pid, kept) for pid, _, kept in b.view_homes()] == [(PID, False)]  # no longer in use: expires


def test_bucket_zero_reports_the_views_lag() -> None:
    b = new_bucket()
    columns = [list(c) for c in zip(position_row(T0, {0: 10}), applied_row({0: 4}), strict=True)]
    events = [
        dict(zip(EVENT_COLUMNS, e, strict=True)) for e in reconcile_bucket(b, columns, T0, report_view=True)
    ]
    (view,) = events
    assert view["event"] == "VIEW"
    assert json.loads(view["payload"]) == {
        "measured": True,
        "current": False,
        "lag_ms": 0,
        "records_behind": 6,
        "current_as_of_ms": None,
        "undecodable_pending": 0,
        "undecodable_records": 0,
    }


# ------------------------------------------------------------------------ sightings: the earliest wins


def lost_commit_then_restart() -> tuple[BucketState, list[dict[str, Any]], list[dict[str, Any]]]:
    """A transaction seen open before a CompleteCommit whose Prepare listed its partition (a lost commit
    marker, proven), then reported by a collector that restarted: first seen again, with no earlier report."""
    done = coord(
        state=CoordinatorState.COMPLETE_COMMIT,
        partitions=(),
        prepared_partitions=tps("orders-0"),
        start_timestamp_ms=T0 - SECOND,
        last_update_timestamp_ms=T0 + 10 * SECOND,
    )
    b = new_bucket()
    seen = T0 + 2 * SECOND  # before the completion by more than the skew
    t1 = T0 + 30 * SECOND  # after it by more than grace + skew
    proven = batch(
        b, t1, fact_row(done), open_row(seen_at(t1, opened_after_ms=T0 - SECOND, seen_open_ms=seen))
    )
    t2 = t1 + MINUTE
    restarted = seen_at(t2, seen_open_ms=t2 - SECOND)  # no earlier report: no opened-after, seen late
    after = batch(b, t2, open_row(restarted))
    # Once the late sighting is past the grace, today's rules would call it commit-or-late-write and withdraw.
    t3 = t2 + MINUTE
    after += batch(b, t3, open_row(seen_at(t3, seen_open_ms=t2 - SECOND)))
    return b, proven, after


def test_a_proof_on_an_early_sighting_survives_a_collector_that_restarted() -> None:
    b, proven, after = lost_commit_then_restart()
    assert [(e["event"], e["reason"]) for e in proven] == [
        ("OPENED", "lost-commit-marker"),
        ("VERDICT", "lost-commit-marker"),
    ]
    # The younger sighting neither withdraws the proven lost-commit-marker candidate nor changes its verdict.
    assert [e["event"] for e in after] == []
    entry = b.opens[(PID, "orders", 0)]
    assert entry.facts.seen_open_ms == T0 + 2 * SECOND
    assert entry.opened_after_ms == T0 - SECOND
    kept = PartitionSnapshot.model_validate_json(entry.snapshot_json).open_transactions[0]
    assert (kept.seen_open_ms, kept.opened_after_ms) == (T0 + 2 * SECOND, T0 - SECOND)


def test_a_sighting_restarted_by_a_stale_report_keeps_the_transaction_age() -> None:
    """A report that lost the transaction's sightings (a stale replica answered without it, so its next report
    says "opened after" that answer) does not make a long-open transaction young again: the first bound wins."""
    b = new_bucket()
    t1 = T0 + MINUTE
    batch(b, t1, open_row(seen_at(t1, start_timestamp_ms=T0, opened_after_ms=T0 - SECOND, seen_open_ms=t1)))
    t2 = t1 + MINUTE
    batch(b, t2, open_row(seen_at(t2, start_timestamp_ms=T0, opened_after_ms=t2 - SECOND, seen_open_ms=t2)))
    facts = b.opens[(PID, "orders", 0)].facts
    assert (facts.open_since_ms, facts.seen_open_ms) == (T0, t1)


# ----------------------------------------------------------------- an owner that lives on (owner-moved-on)


def busy_owner_record(at_ms: int, offset: int, *, version: int, epoch: int = 5, **overrides: Any) -> Any:
    """The owner's newest record at `at_ms`: a one-record transaction on another topic, begun 50 ms before."""
    fields: dict[str, Any] = {
        "producer_epoch": epoch,
        "client_transaction_version": version,
        "partitions": tps("other-0"),
        "start_timestamp_ms": at_ms - 50,
        "last_update_timestamp_ms": at_ms - 50,
        "source_offset": offset,
    }
    fields.update(overrides)
    return coord(**fields)


def orphan_seen(at_ms: int) -> PartitionSnapshot:
    """The orphan on orders-0: epoch 5, first seen open at T0 (its records stamped 100 ms before)."""
    return seen_at(at_ms, start_timestamp_ms=T0 - 100, opened_after_ms=T0 - SECOND, seen_open_ms=T0)


def run_busy_owner(version: int, *, seconds: int = 30, bump: bool = False) -> list[dict[str, Any]]:
    """A batch a second: the owner's newest record (it commits every 100 ms: the batch folds the rest) and a
    report of the orphan still open."""
    b = new_bucket()
    events: list[dict[str, Any]] = []
    for i in range(1, seconds + 1):
        at = T0 + i * SECOND
        record = busy_owner_record(at, 5000 + i, version=version, epoch=5 + i if bump else 5)
        events += batch(b, at, fact_row(record, log_offset=5000 + i), open_row(orphan_seen(at)))
    return events


@pytest.mark.parametrize(
    ("version", "bump"),
    [pytest.param(1, False, id="tv1-one-epoch"), pytest.param(2, True, id="tv2-epoch-bump")],
)
def test_an_orphan_whose_owner_keeps_committing_elsewhere_hangs_while_the_owner_runs(
    version: int, bump: bool
) -> None:
    """The busy owner moves its newest record forward every batch, faster than a report can pass it by grace +
    skew; the first record of a transaction that began after the orphan was seen open proves it over."""
    events = run_busy_owner(version, bump=bump)
    opened = [e for e in events if e["event"] == "OPENED"]
    assert len(opened) == 1, [(e["event"], e["kind"], e["reason"]) for e in events]
    assert opened[0]["reason"] == "owner-moved-on"
    # Proven at the first report that is settled (grace past the sighting and the records' time, skew
    # included) and after that record: the sighting is T0, the first later transaction began at T0 + 5.95 s.
    assert opened[0]["event_time_ms"] == T0 + 15 * SECOND
    candidate = AbortCandidate.model_validate_json(opened[0]["payload"])
    assert "its owner lives on" in candidate.explanation
    assert candidate.spec.transaction_result == "ABORT"


def test_a_record_that_lists_the_partition_undoes_the_owner_moved_on_proof() -> None:
    """A transaction of the owner that lists the orphan's partition writes it a marker (which closes the orphan):
    from then on no proof rests on the earlier record, whether the newest record lists it or a Prepare record
    stage 1 folded into it did (`listed_since`)."""
    b = new_bucket()
    for i in range(1, 8):
        at = T0 + i * SECOND
        batch(
            b,
            at,
            fact_row(busy_owner_record(at, 5000 + i, version=1), log_offset=5000 + i),
            open_row(orphan_seen(at)),
        )
    assert b.opens[(PID, "orders", 0)].facts.moved_on_ms == T0 + 6 * SECOND - 50
    at = T0 + 8 * SECOND
    folded = busy_owner_record(at, 5008, version=1, state=CoordinatorState.COMPLETE_COMMIT, partitions=())
    folded = folded.model_copy(update={"listed_since": tps("orders-0", "other-0")})
    batch(b, at, fact_row(folded, log_offset=5008), open_row(orphan_seen(at)))
    assert b.opens[(PID, "orders", 0)].facts.moved_on_ms is None
    # In flight with the partition at the report: never HANGING while it lists it.
    at = T0 + 20 * SECOND
    writing = busy_owner_record(
        at, 5020, version=1, partitions=tps("orders-0", "other-0"), start_timestamp_ms=T0
    )
    events = batch(b, at, fact_row(writing, log_offset=5020), open_row(orphan_seen(at)))
    assert [e["kind"] for e in events if e["event"] == "VERDICT"] in ([], ["OPEN"])
    assert all(e["event"] != "OPENED" for e in events)


@pytest.mark.parametrize(
    ("version", "bump"),
    [pytest.param(1, False, id="tv1-one-epoch"), pytest.param(2, True, id="tv2-epoch-bump")],
)
def test_a_lost_commit_marker_stays_a_commit_while_the_owner_commits_elsewhere(
    version: int, bump: bool
) -> None:
    """The orphan was seen open while its transaction was in flight; that transaction then committed with
    orders-0 in its Prepare (the marker was lost), and the owner goes on committing elsewhere every 100 ms: the
    proof rests on that completion, so the remedy is COMMIT, never an owner-moved-on ABORT of records the
    coordinator committed (not even within the grace after the completion, before a report could prove it)."""
    b = new_bucket()
    events: list[dict[str, Any]] = []
    committed = 8  # seconds after the sighting: past the skew
    for i in range(1, 40):
        at = T0 + i * SECOND
        whole = {"partitions": tps("orders-0", "other-0"), "start_timestamp_ms": T0 - SECOND}
        if i < committed:  # the orphan's own transaction, in flight
            record = busy_owner_record(at, 5000 + i, version=version, **whole)
        elif i == committed:
            record = busy_owner_record(
                at,
                5000 + i,
                version=version,
                epoch=6 if bump else 5,
                state=CoordinatorState.COMPLETE_COMMIT,
                partitions=(),
                prepared_partitions=whole["partitions"],
                start_timestamp_ms=T0 - SECOND,
                last_update_timestamp_ms=at,
            )
        else:
            record = busy_owner_record(at, 5000 + i, version=version, epoch=5 + i if bump else 5)
        events += batch(b, at, fact_row(record, log_offset=5000 + i), open_row(orphan_seen(at)))
    opened = [e for e in events if e["event"] == "OPENED"]
    assert [e["reason"] for e in opened] == ["lost-commit-marker"], [
        (e["event"], e["kind"], e["reason"]) for e in events
    ]
    candidate = AbortCandidate.model_validate_json(opened[0]["payload"])
    assert candidate.spec.transaction_result == "COMMIT"
    assert all(e["reason"] != "owner-moved-on" for e in events if e["event"] == "VERDICT")
    # The completion is kept with the open transaction, whatever the newest record is now.
    kept = b.opens[(PID, "orders", 0)].marker_record
    assert kept is not None and kept[1] == 5000 + committed


@pytest.mark.parametrize(
    ("version", "bump"),
    [pytest.param(1, False, id="tv1-one-epoch"), pytest.param(2, True, id="tv2-epoch-bump")],
)
def test_a_lost_commit_folded_behind_a_busy_owner_in_one_batch_is_still_a_commit(
    version: int, bump: bool
) -> None:
    """One batch of the log holds the orphan's transaction committing with orders-0 (its marker lost) and ten of
    the owner's next transactions on other-0: the decoder keeps the run's ends and the Prepare listing orders-0
    with its Complete, and stage 1 folds them into the newest record; what the commit decided reaches stage 2 with it
    (`completed_since`), and the remedy proposed is the COMMIT, never an owner-moved-on ABORT."""
    b = new_bucket()
    batch(b, T0 + SECOND, open_row(orphan_seen(T0 + SECOND)))  # seen open at T0
    whole, other = tps("orders-0", "other-0"), tps("other-0")
    commit_at = T0 + 8 * SECOND
    since = {"start_timestamp_ms": T0 - SECOND, "client_transaction_version": version}
    log = [
        coord(partitions=whole, last_update_timestamp_ms=T0 - SECOND, **since),
        coord(
            state=CoordinatorState.PREPARE_COMMIT,
            partitions=whole,
            last_update_timestamp_ms=commit_at,
            **since,
        ),
        coord(
            state=CoordinatorState.COMPLETE_COMMIT,
            partitions=(),
            last_update_timestamp_ms=commit_at + 5,
            **since,
        ),
    ]
    for i in range(1, 11):
        at = commit_at + i * 100
        mine = {
            "start_timestamp_ms": at,
            "producer_epoch": 5 + i if bump else 5,
            "client_transaction_version": version,
        }
        log += [
            coord(partitions=other, last_update_timestamp_ms=at, **mine),
            coord(
                state=CoordinatorState.PREPARE_COMMIT,
                partitions=other,
                last_update_timestamp_ms=at + 50,
                **mine,
            ),
            coord(
                state=CoordinatorState.COMPLETE_COMMIT,
                partitions=(),
                last_update_timestamp_ms=at + 60,
                **mine,
            ),
        ]
    log = [r.model_copy(update={"source_offset": 100 + i}) for i, r in enumerate(log)]
    states = [r.state.value if r.state else None for r in log]
    keep = run_ends(
        [r.transactional_id for r in log],
        [r.producer_id for r in log],
        [False] * len(log),
        states,
        [[p.model_dump() for p in r.partitions] for r in log],
    )
    assert keep[1] and keep[2], "the decoder keeps the Prepare listing orders-0 and its Complete"
    assert keep.count(True) == 5, "and the run's first, its newest Prepare, its last"
    rows = [
        CoordinatorRow(*row(r)[:8], state)  # type: ignore[misc]
        for r, state, k in zip(log, states, keep, strict=True)
        if k
    ]
    (fact,) = advance_owners({}, rows)
    folded = CoordinatorRecord.model_validate_json(fact[3])
    assert folded.completed_since is not None and folded.completed_since[0].partitions == whole
    events: list[dict[str, Any]] = []
    for i in range(9, 40):  # a report a second; the owner commits elsewhere all along
        at = T0 + i * SECOND
        facts = (
            [fact_row(folded, log_offset=fact[5])]
            if i == 9
            else [
                fact_row(
                    busy_owner_record(at, 1000 + i, version=version, epoch=20 + i if bump else 5),
                    log_offset=1000 + i,
                )
            ]
        )
        events += batch(b, at, *facts, open_row(orphan_seen(at)))
    opened = [e for e in events if e["event"] == "OPENED"]
    assert [e["reason"] for e in opened] == ["lost-commit-marker"], [
        (e["event"], e["kind"], e["reason"]) for e in events
    ]
    candidate = AbortCandidate.model_validate_json(opened[0]["payload"])
    assert candidate.spec.transaction_result == "COMMIT"
    assert candidate.evidence.coordinator is not None
    assert candidate.evidence.coordinator.prepared_partition_listed is True


def test_a_transaction_that_began_before_the_sighting_proves_nothing() -> None:
    """The owner's transaction began before the orphan was seen open (within the skew): the orphan may be its
    write, and the proof waits for a transaction that began after."""
    b = new_bucket()
    at = T0 + 15 * SECOND  # before partition-not-in-transaction's grace after that transaction's start
    early = busy_owner_record(
        at, 5001, version=1, start_timestamp_ms=T0 + SECOND, last_update_timestamp_ms=at
    )
    events = batch(b, at, fact_row(early, log_offset=5001), open_row(orphan_seen(at)))
    assert b.opens[(PID, "orders", 0)].facts.moved_on_ms is None
    assert all(e["event"] != "OPENED" for e in events)


def test_stage_1_tells_stage_2_what_the_prepare_records_it_folded_listed() -> None:
    owners: dict[str, Owner] = {}
    prepare = coord(
        state=CoordinatorState.PREPARE_COMMIT, partitions=tps("orders-0", "other-0"), source_offset=1
    )
    done = coord(state=CoordinatorState.COMPLETE_COMMIT, partitions=(), source_offset=2)
    again = coord(partitions=tps("other-0"), source_offset=3, start_timestamp_ms=T0 + SECOND)
    rows = [
        CoordinatorRow(*row(r)[:8], r.state.value if r.state else None)  # type: ignore[misc]
        for r in (prepare, done, again)
    ]
    (fact,) = advance_owners(owners, rows)
    record = CoordinatorRecord.model_validate_json(fact[3])
    assert record.partitions == tps("other-0")
    assert record.listed_since == tps("orders-0", "other-0")
    # A producer that writes the same partitions every time is passed on as it is (no JSON round trip).
    same = coord(partitions=tps("orders-0", "other-0"), source_offset=4)
    (fact,) = advance_owners(owners, [CoordinatorRow(*row(same)[:8], "Ongoing")])  # type: ignore[misc]
    assert fact[3] == same.model_dump_json()


def test_the_decoder_keeps_each_prepare_record_that_lists_other_partitions() -> None:
    """Only the first and last records of a run reach stage 1; a Prepare record whose partitions differ from the
    run's Prepare before it is kept too, so no partition a folded transaction listed is lost."""
    a = [{"topic": "other", "partition": 0}]
    ab = [{"topic": "other", "partition": 0}, {"topic": "orders", "partition": 0}]
    states = ["Ongoing", "PrepareCommit", "CompleteCommit"] * 4
    parts = [a, a, [], ab, ab, [], a, a, [], a, a, []]
    keep = run_ends(["tx"] * 12, [PID] * 12, [False] * 12, states, parts)
    kept = [i for i, k in enumerate(keep) if k]
    # first, the Prepare before the change and its Complete, the Prepare listing orders-0 (the next one lists
    # other-0 only) and its Complete, the newest Prepare (its Complete follows) and the last record; the Prepare
    # at 7 lists what the one at 10 does
    assert kept == [0, 1, 2, 4, 5, 10, 11]
    # Stage 1 says the same of the compacted log as of the whole log, what the folded transactions listed and
    # when they completed included.
    records = []
    for i, (state, listed) in enumerate(zip(states, parts, strict=True)):
        r = coord(
            state=CoordinatorState(state),
            partitions=tuple(TopicPartition(**p) for p in listed),
            start_timestamp_ms=T0 + 100 * (i // 3),
            last_update_timestamp_ms=T0 + 100 * (i // 3) + 10 * (i % 3),
            source_offset=i,
        )
        records.append(CoordinatorRow(*row(r)[:8], state))  # type: ignore[misc]
    whole = advance_owners({}, records)
    compacted = advance_owners({}, [r for r, k in zip(records, keep, strict=True) if k])
    assert compacted == whole
    folded = CoordinatorRecord.model_validate_json(whole[0][3])
    assert folded.completed_since is not None
    assert [c.partitions for c in folded.completed_since] == [tuple(TopicPartition(**p) for p in ab)]
    same = [a, a, [], a, a, [], a, a, [], a, a, []]
    assert run_ends(["tx"] * 12, [PID] * 12, [False] * 12, states, same) == [
        i in (0, 10, 11) for i in range(12)
    ]
    assert run_ends(["tx"] * 12, [PID] * 12, [False] * 12, states) == [i in (0, 10, 11) for i in range(12)]


def test_a_busy_owners_proof_is_ordered_by_the_first_transaction_it_began_after_the_sighting() -> None:
    """The owner commits every 200 ms; the job's fold hands stage 2 only the batch's first and last records of
    it. The last began after every report of the batch, so it orders none of them; the transaction that began
    first after the sighting (skew-reduced) does, and the decoder's marks (detectors.began) keep where it is in
    the log. HANGING on the report ordered after it, long before grace and skew settle the report by the clocks
    (before: OPEN until a report of a later batch was ordered after the last record)."""
    log_partition = coordinator_partition("tx-1", 3)

    def record(k: int, **overrides: Any) -> CoordinatorRecord:
        at = T0 + 200 * k
        return busy_owner_record(at, 1000 + k, version=2, source_partition=log_partition, **overrides)

    def ends(at_ms: int) -> dict[int, int]:  # the log end at `at_ms`: one record of the owner's every 200 ms
        return {p: (1000 + (at_ms - T0) // 200 + 1 if p == log_partition else 0) for p in range(3)}

    records = [record(k) for k in range(38)]  # up to T0 + 7.4 s
    keep = run_ends(["tx-1"] * 38, [PID] * 38, [False] * 38)
    marks = begin_marks(
        ["tx-1"] * 38,
        [PID] * 38,
        [r.start_timestamp_ms for r in records],
        [1000 + k for k in range(38)],
        keep,
    )
    kept = [
        r if m is None else r.model_copy(update={"began_since": tuple(BeganMark(start_timestamp_ms=s, offset=o)
                                                                      for s, o in m)})
        for r, k, m in zip(records, keep, marks, strict=True)
        if k
    ]  # fmt: skip
    facts = advance_owners({}, [CoordinatorRow(*row(r)[:8], "Ongoing") for r in kept])  # type: ignore[misc]
    ((pid, fact, tid, record_json, fact_ms, offset),) = facts
    assert offset == 1037 and carried_marks(record_json)  # the batch's last record, with the marks
    t1, t2 = T0 + 6 * SECOND, T0 + 7 * SECOND  # two reports, each sweep measuring the log after it
    first = orphan_seen(t1).model_copy(update={"sweep_id": "r-1"})
    report = orphan_seen(t2).model_copy(update={"sweep_id": "r-2"})

    def judged(fact_json: str) -> tuple[BucketState, list[dict[str, Any]]]:
        values = {"producer_id": pid, "fact": fact, "transactional_id": tid, "record_json": fact_json}
        values.update(fact_time_ms=fact_ms, log_offset=offset)
        b = new_bucket()
        events = batch(
            b,
            T0 + 7_500,
            [values.get(c) for c in STAGE2_INPUT_COLUMNS[1:]],
            open_row(first),
            sweep_position("r-1", t1 + 50, ends(t1 + 50)),
            open_row(report),
            sweep_position("r-2", t2 + 50, ends(t2 + 50)),
            applied_row(ends(T0 + 7_450)),
            current=False,
        )
        return b, [e for e in events if e["event"] != "VIEW"]

    b, events = judged(record_json)
    assert [(e["event"], e["reason"]) for e in events] == [
        ("OPENED", "owner-moved-on"),
        ("VERDICT", "owner-moved-on"),
    ]
    entry = b.opens[(PID, "orders", 0)]
    # the first mark past the sighting + skew (5 s): the transaction begun at T0 + 5.55 s, at offset 1028
    assert entry.moved_on_at == (log_partition, 1028)
    assert entry.facts.moved_on_ms == T0 + 28 * 200 - 50
    assert carried_marks(b.views[PID].record_json) == []  # the view keeps the record, not its marks
    # Without the marks (what stage 2 was handed before) the last record is the first it knows began after the
    # sighting, and no report of the batch is ordered after it.
    b, events = judged(without_marks(record_json)[0])
    assert all(e["event"] != "OPENED" for e in events)
    assert told(b).kind == "OPEN"


# ------------------------------------------------------------------- proofs ordered by offsets (issue 40)


def sweep_position(sweep_id: str, as_of_ms: int, ends: dict[int, int]) -> list[Any]:
    """A position of the transaction log (3 partitions) as the collector publishes it after sweep `sweep_id`."""
    position = CoordinatorLogPosition(
        cluster="c", sweep_id=sweep_id, topic=LOG, partitions=3, as_of_ms=as_of_ms, end_offsets=ends
    )
    values = {"producer_id": -1, "fact": "position", "record_json": position.model_dump_json()}
    values["fact_time_ms"] = as_of_ms
    return [values.get(c) for c in STAGE2_INPUT_COLUMNS[1:]]


def ordered_scene(
    record_offset: int, earlier_sweep: str, report_sweep: str
) -> tuple[BucketState, list[dict[str, Any]]]:
    """The owner's transaction log partition holds its Complete record at `record_offset` (written half a second
    after the orphan began); position `earlier_sweep` measured that partition's end at 11, then the report of
    `report_sweep` shows the orphan open 2 s after it began: long before grace and skew (15 s here) pass."""
    log_partition = coordinator_partition("tx-1", 3)
    ends = {p: (11 if p == log_partition else 0) for p in range(3)}
    done = coord(
        state=CoordinatorState.COMPLETE_COMMIT,
        partitions=(),
        last_update_timestamp_ms=T0 + 500,
        source_partition=log_partition,
        source_offset=record_offset,
    )
    b = new_bucket()
    t1 = T0 + SECOND
    first = seen_at(t1).model_copy(update={"sweep_id": f"{earlier_sweep.rpartition('-')[0]}-0"})
    batch(
        b,
        t1,
        fact_row(done, log_offset=record_offset),
        open_row(first),
        sweep_position(earlier_sweep, t1, ends),
        applied_row(ends),
        current=False,
    )
    t2 = T0 + 2 * SECOND
    report = seen_at(t2).model_copy(update={"sweep_id": report_sweep})
    events = batch(b, t2, open_row(report), sweep_position(report_sweep, t2, ends), current=False)
    return b, events


def test_a_completion_below_the_log_end_measured_before_the_report_proves_at_once() -> None:
    """The Complete record lies below the end offset the collector measured (sweep 1) before it sent the report's
    request (sweep 2): its markers were written before the leader answered, and the view, current as of the
    report, holds nothing newer. HANGING 2 s after the orphan began; by the clocks it waits until grace and
    skew have passed since it began and since it was first seen (before: OPEN here)."""
    b, events = ordered_scene(10, "r-1", "r-2")
    assert [(e["event"], e["reason"]) for e in events if e["event"] != "VIEW"] == [
        ("OPENED", "coordinator-completed"),
        ("VERDICT", "coordinator-completed"),
    ]
    assert told(b).kind == "HANGING"


@pytest.mark.parametrize(
    ("record_offset", "earlier_sweep", "report_sweep", "why"),
    [
        (11, "r-1", "r-2", "the record is at the end measured before: written after that measurement"),
        (10, "q-1", "r-2", "a position of another collector run: only a clock would order the two"),
        (10, "r-2", "r-2", "the report's own sweep measured its position after the report"),
        (10, "r-3", "r-2", "a later sweep of the run"),
    ],
)
def test_what_the_offsets_do_not_order_waits_for_the_clocks(
    record_offset: int, earlier_sweep: str, report_sweep: str, why: str
) -> None:
    b, events = ordered_scene(record_offset, earlier_sweep, report_sweep)
    assert all(e["event"] != "OPENED" for e in events), why
    assert told(b).kind == "OPEN", why


def test_an_ordered_proof_needs_the_view_current_by_the_reports_own_run_not_by_a_clock() -> None:
    """The view has applied the log up to the end a sweep before the report measured (11), not up to the end
    the report's own sweep measured (13: the owner's new Ongoing record listing the partition may be at 11-12).
    Another collector run's position, stamped after the report by a clock running ahead (or the collector's clock
    stepped back), makes the view look current by the clocks. Ordering by offsets would prove the Complete
    record at 10 before the report, and the live transaction HANGING; it must wait for the run's own position."""
    log_partition = coordinator_partition("tx-1", 3)
    applied = {p: (11 if p == log_partition else 0) for p in range(3)}
    grown = {p: (13 if p == log_partition else 0) for p in range(3)}
    done = coord(
        state=CoordinatorState.COMPLETE_COMMIT,
        partitions=(),
        last_update_timestamp_ms=T0 + 500,
        source_partition=log_partition,
        source_offset=10,
    )
    b = new_bucket()
    t1, t2 = T0 + SECOND, T0 + 2 * SECOND
    first = seen_at(t1).model_copy(update={"sweep_id": "r-0"})
    batch(b, t1, fact_row(done, log_offset=10), open_row(first), sweep_position("r-1", t1, applied),
          applied_row(applied), current=False)  # fmt: skip
    report = seen_at(t2).model_copy(update={"sweep_id": "r-2"})
    events = batch(
        b,
        t2,
        open_row(report),
        sweep_position("r-2", t2, grown),
        sweep_position("q-5", t2 + 500, applied),  # another run, its clock ahead: current "as of" t2 + 0.5 s
        current=False,
    )
    assert all(e["event"] != "OPENED" for e in events)
    assert told(b).kind == "OPEN"
    # The view reads on to the run's end, and nothing listed the partition: the next report is proven.
    t3 = t2 + SECOND
    later = seen_at(t3).model_copy(update={"sweep_id": "r-3"})
    events = batch(
        b, t3, open_row(later), sweep_position("r-3", t3, grown), applied_row(grown), current=False
    )
    assert [e["event"] for e in events if e["event"] != "VIEW"] == ["OPENED", "VERDICT"]


def test_a_transaction_log_whose_end_went_down_orders_nothing_any_more() -> None:
    """An unclean election truncated the log between two sweeps of one run: an offset below the end the first
    measured may now hold a record written after the report. Ordering is off for that partition."""
    from detectors.currency import ViewCurrency

    v = ViewCurrency(LOG)
    v.add_position(LOG, 3, T0, {0: 11, 1: 5, 2: 0}, sweep_id="r-1")
    v.applied(LOG, 0, 11)
    v.applied(LOG, 1, 5)
    assert v.ends_before_report("r-2") == {0: 11, 1: 5, 2: 0}
    v.add_position(LOG, 3, T0 + SECOND, {0: 9, 1: 6, 2: 0}, sweep_id="r-2")
    assert v.ordering_off == {0}
    assert v.ends_before_report("r-3") == {1: 6, 2: 0}
    assert not v.current_for_report("r-2", 0)
    restored = ViewCurrency(LOG, state=v.state())
    assert restored.ordering_off == {0} and restored.ends_before_report("r-3") == {1: 6, 2: 0}
