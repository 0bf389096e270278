"""Table tests for the verdict rules, the KIP scenarios, abort planning, and the comparison with find-hanging."""

from __future__ import annotations

import random
from typing import Any, NamedTuple

import pytest
from builders import (
    HOUR,
    LIMITS,
    MINUTE,
    PID,
    SECOND,
    T0,
    coord,
    limits,
    open_txn,
    snapshot,
    tombstone,
    tps,
)

from detectors.abort import kafka_cli_abort, marker_coordinator_epoch, plan_abort
from detectors.models import (
    MAX_PRODUCER_EPOCH,
    TWO_PHASE_COMMIT_TIMEOUT_MS,
    CandidateStatus,
    CoordinatorRecord,
    CoordinatorRole,
    CoordinatorState,
    DetectionLimits,
    HangingReason,
    OpenTransaction,
    PartitionSnapshot,
    Verdict,
    VerdictKind,
    candidate_id,
)
from detectors.rules import (
    CoordFacts,
    Decision,
    TxnFacts,
    classify,
    coord_facts,
    decide,
    decide_by_rules,
    format_duration,
    is_abort_candidate,
    select_coordinator_view,
    txn_facts,
)

pytestmark = pytest.mark.unit

S = CoordinatorState
K = VerdictKind
R = HangingReason
MAX = MAX_PRODUCER_EPOCH


def verdict(
    txn: OpenTransaction | None = None,
    view: CoordinatorRecord | None = None,
    *,
    observed: int = T0 + MINUTE,
    now: int | None = None,
    lim: DetectionLimits = LIMITS,
    max_timeout: int | None = 900_000,
    **kwargs: Any,
) -> Verdict:
    txn = open_txn() if txn is None else txn
    snap = snapshot(txn, observed_at_ms=observed, max_transaction_timeout_ms=max_timeout)
    # The proof tables: the coordinator view is current as of the report unless a test says otherwise.
    kwargs.setdefault("view_current_ms", observed)
    return classify(txn, snap, view, now_ms=observed if now is None else now, limits=lim, **kwargs)


# ----------------------------------------------------------------------------- the verdict table (proofs)
# Default scene (builders.py): producer 1000 epoch 5 opened a transaction on orders-0 at T0; the snapshot is
# observed at T0 + 1 min; grace 10 s, clock skew 5 s. `coord()` is Ongoing, epoch 5, TV2, listing orders-0.

TABLE = [
    # --- nothing contradicts it
    pytest.param(
        open_txn(), coord(), T0 + MINUTE, K.OPEN, None, id="ongoing-coordinator-lists-partition-is-open"
    ),
    # --- no-coordinator-state
    pytest.param(
        open_txn(),
        None,
        T0 + 3 * SECOND,
        K.OPEN,
        None,
        id="young-txn-without-coordinator-is-open-the-record-may-arrive-late",
    ),
    pytest.param(
        open_txn(), None, T0 + MINUTE, K.HANGING, R.NO_COORDINATOR_STATE, id="unowned-producer-past-grace"
    ),
    pytest.param(
        open_txn(), None, T0 + 15_000, K.OPEN, None, id="exactly-grace-after-skew-reduction-is-not-past-grace"
    ),
    pytest.param(
        open_txn(),
        None,
        T0 + 15_001,
        K.HANGING,
        R.NO_COORDINATOR_STATE,
        id="one-ms-past-grace-after-skew-is-hanging",
    ),
    pytest.param(
        open_txn(),
        tombstone(at_ms=T0 - HOUR),
        T0 + MINUTE,
        K.HANGING,
        R.NO_COORDINATOR_STATE,
        id="tombstoned-transactional-id-owns-nothing",
    ),
    pytest.param(
        open_txn(),
        tombstone(at_ms=T0 + 55 * SECOND),
        T0 + MINUTE,
        K.OPEN,
        None,
        id="tombstone-within-grace-of-snapshot-waits-markers-may-postdate-snapshot",
    ),
    pytest.param(
        open_txn(),
        coord(state=S.DEAD),
        T0 + MINUTE,
        K.HANGING,
        R.NO_COORDINATOR_STATE,
        id="dead-owns-nothing",
    ),
    # --- coordinator-completed
    pytest.param(
        open_txn(),
        coord(
            state=S.COMPLETE_COMMIT,
            producer_epoch=6,
            partitions=(),
            last_update_timestamp_ms=T0 + 20 * SECOND,
        ),
        T0 + MINUTE,
        K.HANGING,
        R.COORDINATOR_COMPLETED,
        id="complete-commit-well-before-snapshot-markers-were-all-acked-so-still-open-is-hanging",
    ),
    pytest.param(
        open_txn(),
        coord(
            state=S.COMPLETE_COMMIT,
            producer_epoch=6,
            partitions=(),
            last_update_timestamp_ms=T0 + 50 * SECOND,
        ),
        T0 + MINUTE,
        K.OPEN,
        None,
        id="completion-within-grace-of-snapshot-snapshot-may-predate-the-marker",
    ),
    pytest.param(
        open_txn(),
        coord(
            state=S.COMPLETE_ABORT, producer_epoch=6, partitions=(), last_update_timestamp_ms=T0 + 20 * SECOND
        ),
        T0 + MINUTE,
        K.HANGING,
        R.COORDINATOR_COMPLETED,
        id="complete-abort-well-before-snapshot",
    ),
    pytest.param(
        open_txn(),
        coord(state=S.EMPTY, producer_epoch=6, partitions=(), last_update_timestamp_ms=T0 + 20 * SECOND),
        T0 + MINUTE,
        K.HANGING,
        R.COORDINATOR_COMPLETED,
        id="empty-after-init-producer-id-ended-the-old-session",
    ),
    pytest.param(
        open_txn(),
        coord(state=S.COMPLETE_COMMIT, partitions=(), last_update_timestamp_ms=T0 - MINUTE),
        T0 + 8 * SECOND,
        K.OPEN,
        None,
        id="young-txn-after-completion-may-be-next-transaction-whose-ongoing-record-lags",
    ),
    # --- partition-not-in-transaction
    pytest.param(
        open_txn(),
        coord(partitions=tps("orders-1")),
        T0 + MINUTE,
        K.HANGING,
        R.PARTITION_NOT_IN_TRANSACTION,
        id="ongoing-without-the-partition-past-grace",
    ),
    pytest.param(
        open_txn(),
        coord(partitions=tps("orders-1")),
        T0 + 3 * SECOND,
        K.OPEN,
        None,
        id="ongoing-without-the-partition-young-the-add-partition-record-may-lag",
    ),
    pytest.param(
        open_txn(),
        coord(
            state=S.PREPARE_COMMIT,
            producer_epoch=6,
            partitions=tps("orders-1"),
            last_update_timestamp_ms=T0 + 20 * SECOND,
        ),
        T0 + MINUTE,
        K.HANGING,
        R.PARTITION_NOT_IN_TRANSACTION,
        id="prepare-commit-without-the-partition-its-markers-go-elsewhere",
    ),
    pytest.param(
        open_txn(),
        coord(
            producer_epoch=6,
            partitions=tps("orders-1"),
            start_timestamp_ms=T0 + 50 * SECOND,
            last_update_timestamp_ms=T0 + 50 * SECOND,
        ),
        T0 + MINUTE,
        K.OPEN,
        None,
        id="snapshot-not-newer-than-coordinator-txn-start-previous-markers-may-postdate-it",
    ),
    # --- older-than-coordinator-transaction
    pytest.param(
        open_txn(),
        coord(producer_epoch=6, partitions=tps("orders-1"), start_timestamp_ms=T0 + 20 * SECOND),
        T0 + MINUTE,
        K.HANGING,
        R.OLDER_THAN_COORDINATOR_TRANSACTION,
        id="tv2-epoch-bumps-per-transaction-epoch-5-leftover-under-epoch-6-ongoing",
    ),
    pytest.param(
        open_txn(),
        coord(producer_epoch=6, partitions=tps("orders-0"), start_timestamp_ms=T0 + 20 * SECOND),
        T0 + MINUTE,
        K.OPEN,
        None,
        id="older-epoch-leftover-in-a-listed-partition-is-closed-by-the-current-marker-never-abort",
    ),
    pytest.param(
        open_txn(),
        coord(producer_epoch=5, partitions=tps("orders-1"), start_timestamp_ms=T0 + 20 * SECOND),
        T0 + MINUTE,
        K.HANGING,
        R.PARTITION_NOT_IN_TRANSACTION,
        id="tv2-same-epoch-is-the-same-transaction-even-if-its-first-record-predates-the-coordinator-start",
    ),
    pytest.param(
        open_txn(),
        coord(
            client_transaction_version=0,
            producer_epoch=5,
            partitions=tps("orders-1"),
            start_timestamp_ms=T0 + 20 * SECOND,
        ),
        T0 + MINUTE,
        K.HANGING,
        R.OLDER_THAN_COORDINATOR_TRANSACTION,
        id="tv0-epoch-does-not-bump-per-txn-start-before-coordinator-txn-start-is-older",
    ),
    pytest.param(
        open_txn(),
        coord(
            client_transaction_version=1,
            producer_epoch=5,
            partitions=tps("orders-1"),
            start_timestamp_ms=T0 + 4 * SECOND,
        ),
        T0 + MINUTE,
        K.HANGING,
        R.PARTITION_NOT_IN_TRANSACTION,
        id="tv1-start-within-clock-skew-of-coordinator-start-is-not-proven-older",
    ),
    pytest.param(
        open_txn(start_batch_producer_epoch=None),
        coord(producer_epoch=6, partitions=tps("orders-1"), start_timestamp_ms=T0 + 20 * SECOND),
        T0 + MINUTE,
        K.HANGING,
        R.OLDER_THAN_COORDINATOR_TRANSACTION,
        id="start-batch-unknown-falls-back-to-producer-epoch",
    ),
    pytest.param(
        open_txn(producer_epoch=6, start_batch_producer_epoch=5),
        coord(producer_epoch=6, partitions=tps("orders-1"), start_timestamp_ms=T0 + 20 * SECOND),
        T0 + MINUTE,
        K.HANGING,
        R.OLDER_THAN_COORDINATOR_TRANSACTION,
        id="start-batch-epoch-reveals-a-leftover-that-later-epoch-6-batches-hide",
    ),
    pytest.param(
        open_txn(producer_epoch=6, start_batch_producer_epoch=None),
        coord(producer_epoch=6, partitions=tps("orders-1"), start_timestamp_ms=T0 + 20 * SECOND),
        T0 + MINUTE,
        K.HANGING,
        R.PARTITION_NOT_IN_TRANSACTION,
        id="without-the-start-batch-the-same-leftover-is-only-partition-not-in-transaction",
    ),
    # --- epoch overflow: a new producer id (KIP-890 NextProducerId / PreviousProducerId)
    pytest.param(
        open_txn(producer_epoch=MAX - 1, start_batch_producer_epoch=MAX - 1),
        coord(
            state=S.PREPARE_COMMIT,
            producer_epoch=MAX,
            previous_producer_id=PID,
            next_producer_id=2000,
            last_update_timestamp_ms=T0 + 55 * SECOND,
        ),
        T0 + MINUTE,
        K.OPEN,
        None,
        id="tv2-overflow-prepare-still-writes-markers-with-the-old-producer-id",
    ),
    pytest.param(
        open_txn(producer_epoch=MAX - 1, start_batch_producer_epoch=MAX - 1),
        coord(
            state=S.PREPARE_COMMIT,
            producer_epoch=MAX,
            previous_producer_id=PID,
            next_producer_id=2000,
            last_update_timestamp_ms=T0 + 20 * SECOND,
        ),
        T0 + MINUTE,
        K.STUCK_PREPARE,
        None,
        id="tv2-overflow-prepare-with-overdue-marker-is-stuck-prepare",
    ),
    pytest.param(
        open_txn(producer_epoch=MAX - 1, start_batch_producer_epoch=MAX - 1),
        coord(
            state=S.COMPLETE_COMMIT,
            producer_id=2000,
            producer_epoch=0,
            previous_producer_id=PID,
            partitions=(),
            last_update_timestamp_ms=T0 + 20 * SECOND,
        ),
        T0 + MINUTE,
        K.HANGING,
        R.OLDER_THAN_COORDINATOR_TRANSACTION,
        id="tv2-overflow-complete-moved-to-next-producer-id-old-id-is-previous-and-retired",
    ),
    pytest.param(
        open_txn(producer_epoch=MAX - 1, start_batch_producer_epoch=MAX - 1),
        coord(
            state=S.ONGOING,
            producer_id=2000,
            producer_epoch=0,
            previous_producer_id=PID,
            partitions=tps("orders-0"),
            start_timestamp_ms=T0 + 20 * SECOND,
            last_update_timestamp_ms=T0 + 20 * SECOND,
        ),
        T0 + MINUTE,
        K.HANGING,
        R.OLDER_THAN_COORDINATOR_TRANSACTION,
        id="retired-producer-id-is-hanging-even-if-the-new-id-lists-the-partition-its-marker-has-the-new-id",
    ),
    pytest.param(
        open_txn(producer_epoch=MAX - 1, start_batch_producer_epoch=MAX - 1),
        coord(
            state=S.COMPLETE_COMMIT,
            producer_id=2000,
            producer_epoch=0,
            previous_producer_id=PID,
            partitions=(),
            last_update_timestamp_ms=T0 + 55 * SECOND,
        ),
        T0 + MINUTE,
        K.OPEN,
        None,
        id="retirement-within-grace-of-snapshot-waits",
    ),
    pytest.param(
        open_txn(producer_epoch=MAX - 1, start_batch_producer_epoch=MAX - 1),
        None,
        T0 + MINUTE,
        K.HANGING,
        R.NO_COORDINATOR_STATE,
        id="overflow-before-kafka-20310-previous-id-not-persisted-so-old-id-is-unowned",
    ),
    pytest.param(
        open_txn(producer_id=2000, producer_epoch=0, start_batch_producer_epoch=0),
        coord(producer_epoch=MAX - 1, next_producer_id=2000, transaction_timeout_ms=-1),
        T0 + MINUTE,
        K.OPEN,
        None,
        id="next-producer-id-handover-in-progress-is-never-hanging",
    ),
    # --- STUCK_PREPARE: alert only
    pytest.param(
        open_txn(),
        coord(state=S.PREPARE_COMMIT, producer_epoch=6, last_update_timestamp_ms=T0 + 20 * SECOND),
        T0 + MINUTE,
        K.STUCK_PREPARE,
        None,
        id="prepare-commit-lists-partition-marker-overdue",
    ),
    pytest.param(
        open_txn(),
        coord(state=S.PREPARE_COMMIT, producer_epoch=6, last_update_timestamp_ms=T0 + 55 * SECOND),
        T0 + MINUTE,
        K.OPEN,
        None,
        id="prepare-commit-lists-partition-marker-in-flight",
    ),
    pytest.param(
        open_txn(),
        coord(state=S.PREPARE_ABORT, producer_epoch=6, last_update_timestamp_ms=T0 + 20 * SECOND),
        T0 + MINUTE,
        K.STUCK_PREPARE,
        None,
        id="prepare-abort-lists-partition-marker-overdue",
    ),
    pytest.param(
        open_txn(),
        coord(state=S.PREPARE_EPOCH_FENCE, producer_epoch=6, last_update_timestamp_ms=T0 + 20 * SECOND),
        T0 + MINUTE,
        K.STUCK_PREPARE,
        None,
        id="prepare-epoch-fence-is-about-to-abort-so-counts-as-prepare",
    ),
]


@pytest.mark.parametrize(("txn", "view", "observed", "kind", "reason"), TABLE)
def test_classify(
    txn: OpenTransaction,
    view: CoordinatorRecord | None,
    observed: int,
    kind: VerdictKind,
    reason: HangingReason | None,
) -> None:
    v = verdict(txn, view, observed=observed)
    assert (v.kind, v.reason) == (kind, reason), v.explanation
    assert is_abort_candidate(v) is (kind is K.HANGING)


# ------------------------------------------------------------------------ ages at now: overdue and late

NOW_TABLE = [
    pytest.param(
        coord(),
        T0 + 80 * SECOND,
        900_000,
        LIMITS,
        K.COORDINATOR_OVERDUE,
        id="ongoing-past-own-timeout-plus-cleanup",
    ),
    pytest.param(
        coord(start_timestamp_ms=T0),
        T0 + 75 * SECOND,
        900_000,
        LIMITS,
        K.LATE,  # past its own 60 s timeout (late_threshold), not yet the coordinator's abort
        id="exactly-timeout-plus-cleanup-after-skew-is-not-overdue",
    ),
    pytest.param(
        coord(transaction_timeout_ms=-1),
        T0 + 2 * HOUR,
        900_000,
        LIMITS,
        K.LATE,
        id="minus-one-timeout-kafka-never-writes-has-no-deadline-only-late",
    ),
    pytest.param(
        coord(transaction_timeout_ms=-1),
        T0 + MINUTE,
        900_000,
        LIMITS,
        K.OPEN,
        id="minus-one-timeout-young-is-open",
    ),
    pytest.param(
        coord(transaction_timeout_ms=900_000),
        T0 + 600_001,
        600_000,
        LIMITS,
        K.LATE,
        id="open-past-broker-max-timeout-is-late",
    ),
    pytest.param(
        coord(transaction_timeout_ms=900_000),
        T0 + 600_000,
        600_000,
        LIMITS,
        K.OPEN,
        id="exactly-broker-max-timeout-is-not-late",
    ),
    pytest.param(
        coord(transaction_timeout_ms=900_000),
        T0 + 600_001,
        600_000,
        limits(late_buffer_ms=60_000),
        K.OPEN,
        id="late-buffer-extends-the-threshold",
    ),
    pytest.param(
        coord(transaction_timeout_ms=900_000),
        T0 + 900_001,
        None,
        LIMITS,
        K.LATE,
        id="unknown-broker-max-timeout-uses-the-15-minute-default",
    ),
    pytest.param(
        coord(transaction_timeout_ms=900_000),
        T0 + 600_001,
        None,
        LIMITS,
        K.OPEN,
        id="unknown-broker-max-timeout-not-yet-past-default",
    ),
    pytest.param(None, T0 + HOUR, 900_000, LIMITS, K.HANGING, id="a-hanging-reason-wins-over-late"),
    pytest.param(
        coord(state=S.PREPARE_COMMIT, producer_epoch=6, last_update_timestamp_ms=T0 + 30 * MINUTE),
        T0 + HOUR,
        900_000,
        LIMITS,
        K.STUCK_PREPARE,
        id="stuck-prepare-wins-over-late",
    ),
]


@pytest.mark.parametrize(("view", "now", "max_timeout", "lim", "kind"), NOW_TABLE)
def test_classify_ages_at_now(
    view: CoordinatorRecord | None, now: int, max_timeout: int | None, lim: DetectionLimits, kind: VerdictKind
) -> None:
    v = verdict(open_txn(), view, observed=now, now=now, max_timeout=max_timeout, lim=lim)
    assert v.kind is kind, v.explanation


def test_overdue_uses_now_not_the_snapshot_time() -> None:
    # Observed at +60 s (not yet overdue then); by now (+80 s) the coordinator is overdue.
    assert (
        verdict(open_txn(), coord(), observed=T0 + MINUTE, now=T0 + 80 * SECOND).kind is K.COORDINATOR_OVERDUE
    )


@pytest.mark.parametrize(
    ("first_seen", "kind"),
    [
        pytest.param(
            T0 + 55 * SECOND,
            K.LATE,
            id="old-producer-timestamp-but-first-seen-5s-ago-is-late-not-yet-hanging",
        ),
        pytest.param(T0 + 30 * SECOND, K.HANGING, id="first-seen-30s-ago-is-past-grace"),
    ],
)
def test_first_seen_guards_against_old_producer_timestamps(first_seen: int, kind: VerdictKind) -> None:
    txn = open_txn(start_timestamp_ms=T0 - HOUR, last_timestamp_ms=T0 - HOUR)
    assert verdict(txn, None, first_seen_ms=first_seen).kind is kind


@pytest.mark.parametrize(
    ("retired_at", "kind"),
    [
        pytest.param(T0 + 55 * SECOND, K.OPEN, id="owner-lost-just-before-snapshot-markers-may-postdate-it"),
        pytest.param(T0 + 20 * SECOND, K.HANGING, id="owner-lost-well-before-snapshot"),
    ],
)
def test_retired_at_guards_no_coordinator_state(retired_at: int, kind: VerdictKind) -> None:
    assert verdict(open_txn(), None, retired_at_ms=retired_at).kind is kind


NO_TIMESTAMPS = {"start_timestamp_ms": None, "start_batch_producer_epoch": None, "last_timestamp_ms": -1}


@pytest.mark.parametrize(
    ("first_seen", "kind"),
    [
        pytest.param(None, K.OPEN, id="no-timestamps-and-never-tracked-is-never-past-grace-nor-late"),
        pytest.param(T0 + 55 * MINUTE, K.HANGING, id="no-timestamps-but-first-seen-5-min-ago-is-past-grace"),
    ],
)
def test_unknown_timestamps_are_unknown_not_old(first_seen: int | None, kind: VerdictKind) -> None:
    v = verdict(open_txn(**NO_TIMESTAMPS), None, observed=T0 + HOUR, first_seen_ms=first_seen)
    assert v.kind is kind
    assert (v.evidence.open_since_basis, v.evidence.age_ms) == ("unknown", 0)
    assert "age unknown" in v.explanation


def test_producer_clock_ahead_gives_zero_age_never_negative() -> None:
    v = verdict(open_txn(start_timestamp_ms=T0 + 2 * MINUTE, last_timestamp_ms=T0 + 2 * MINUTE), None)
    assert (v.kind, v.evidence.age_ms) == (K.OPEN, 0)


def test_a_record_about_another_producer_is_a_caller_bug() -> None:
    with pytest.raises(ValueError, match="not about producer 1000"):
        verdict(open_txn(), coord(producer_id=7))


# ----------------------------------------------------------------------- scenario: TV2, one epoch per txn


def test_tv2_epoch_bump_per_transaction_sequence() -> None:
    """Txn 1 (epoch 5) writes orders-0 and orders-1; a late epoch-5 batch lands on orders-2, never added.
    The coordinator goes Ongoing(5) -> PrepareCommit(6) -> CompleteCommit(6) -> Ongoing(6) for txn 2."""
    leftover = open_txn(start_timestamp_ms=T0, start_batch_producer_epoch=5)
    snap_at = T0 + 2 * MINUTE
    steps = [
        (coord(partitions=tps("orders-0", "orders-1")), R.PARTITION_NOT_IN_TRANSACTION),
        (
            coord(
                state=S.PREPARE_COMMIT,
                producer_epoch=6,
                partitions=tps("orders-0", "orders-1"),
                last_update_timestamp_ms=T0 + 10 * SECOND,
            ),
            R.PARTITION_NOT_IN_TRANSACTION,
        ),
        (
            coord(
                state=S.COMPLETE_COMMIT,
                producer_epoch=6,
                partitions=(),
                last_update_timestamp_ms=T0 + 11 * SECOND,
            ),
            R.COORDINATOR_COMPLETED,
        ),
        (
            coord(
                producer_epoch=6,
                partitions=tps("orders-0"),
                start_timestamp_ms=T0 + 30 * SECOND,
                last_update_timestamp_ms=T0 + 30 * SECOND,
                transaction_timeout_ms=900_000,
            ),
            R.OLDER_THAN_COORDINATOR_TRANSACTION,
        ),
    ]
    for record, reason in steps:
        v = classify(
            leftover,
            snapshot(leftover, topic="orders", partition=2, observed_at_ms=snap_at),
            record,
            now_ms=snap_at,
            limits=LIMITS,
            view_current_ms=snap_at,
        )
        assert (v.kind, v.reason) == (K.HANGING, reason), (record.state, v.explanation)
    # Txn 2's own batch on orders-0 (epoch 6) is fine.
    mine = open_txn(producer_epoch=6, start_batch_producer_epoch=6, start_timestamp_ms=T0 + 31 * SECOND)
    assert verdict(mine, steps[-1][0], observed=snap_at).kind is K.OPEN


# ---------------------------------------------------------------- scenario: KIP-939's example, step by step
# Producer 42 (TV2, 2PC: timeout Integer.MAX_VALUE, as Kafka writes it) at epoch MAX-1 adds orders-0, writes it, prepares, crashes; the
# coordinator hands out 73 (then 85) as next producer ids; commit moves the transactional id to 85.

S2 = T0  # AddPartitionsToTxn
S4 = T0 + 10 * MINUTE  # InitProducerId(keepPrepared=true) after the crash
S9 = T0 + 2 * HOUR  # Commit (PrepareCommit written)
S10 = S9 + 2 * SECOND  # CompleteCommit written


def kip939(step: int) -> CoordinatorRecord:
    base: dict[str, Any] = {
        "transactional_id": "tx-2pc",
        "producer_id": 42,
        "producer_epoch": MAX - 1,
        "transaction_timeout_ms": TWO_PHASE_COMMIT_TIMEOUT_MS,
        "client_transaction_version": 2,
        "start_timestamp_ms": S2,
    }
    if step == 1:
        return coord(
            **{**base, "start_timestamp_ms": -1},
            state=S.EMPTY,
            partitions=(),
            last_update_timestamp_ms=S2 - 1,
        )
    if step == 2:
        return coord(**base, state=S.ONGOING, partitions=tps("orders-0"), last_update_timestamp_ms=S2)
    if step in (4, 6, 8):
        return coord(
            **base,
            state=S.ONGOING,
            partitions=tps("orders-0"),
            next_producer_id=73,
            last_update_timestamp_ms=S4,
        )
    if step == 9:
        return coord(
            **{**base, "producer_epoch": MAX},
            state=S.PREPARE_COMMIT,
            partitions=tps("orders-0"),
            previous_producer_id=73,
            next_producer_id=85,
            last_update_timestamp_ms=S9,
        )
    if step == 10:
        return coord(
            **{**base, "producer_id": 85, "producer_epoch": 0},
            state=S.COMPLETE_COMMIT,
            partitions=(),
            previous_producer_id=73,
            last_update_timestamp_ms=S10,
        )
    raise AssertionError(step)


TXN_42_P = open_txn(
    producer_id=42, producer_epoch=MAX - 1, start_batch_producer_epoch=MAX - 1, start_timestamp_ms=S2 + 10
)
TXN_42_Q = open_txn(
    producer_id=42, producer_epoch=MAX - 1, start_batch_producer_epoch=MAX - 1, start_timestamp_ms=S2 + 20
)
TXN_73_P = open_txn(
    producer_id=73, producer_epoch=0, start_batch_producer_epoch=0, start_timestamp_ms=S4 + 10
)


class Kip939Case(NamedTuple):
    step: int
    txn: OpenTransaction
    partition: int
    observed: int
    kind: VerdictKind
    reason: HangingReason | None


KIP939 = [
    pytest.param(Kip939Case(2, TXN_42_P, 0, S2 + MINUTE, K.OPEN, None), id="step2-ongoing-lists-partition"),
    pytest.param(
        Kip939Case(4, TXN_42_P, 0, S4 + MINUTE, K.OPEN, None),
        id="step4-prepared-2pc-with-next-producer-id-still-owned-by-42",
    ),
    pytest.param(
        Kip939Case(8, TXN_42_P, 0, S9 - MINUTE, K.LATE, None),
        id="step8-prepared-for-2h-two-phase-commit-is-late-never-overdue-never-hanging",
    ),
    pytest.param(
        Kip939Case(4, TXN_73_P, 0, S4 + MINUTE, K.OPEN, None), id="step4-producer-73-is-only-next-not-hanging"
    ),
    pytest.param(
        Kip939Case(9, TXN_42_P, 0, S9 + 3 * SECOND, K.LATE, None),
        id="step9-prepare-commit-marker-in-flight",
    ),
    pytest.param(
        Kip939Case(9, TXN_42_P, 0, S9 + MINUTE, K.STUCK_PREPARE, None),
        id="step9-prepare-commit-marker-overdue-is-stuck-prepare-never-abort",
    ),
    pytest.param(
        Kip939Case(9, TXN_42_Q, 1, S9 + MINUTE, K.HANGING, R.PARTITION_NOT_IN_TRANSACTION),
        id="step9-partition-not-in-the-prepared-transaction",
    ),
    pytest.param(
        Kip939Case(10, TXN_73_P, 0, S10 + MINUTE, K.HANGING, R.OLDER_THAN_COORDINATOR_TRANSACTION),
        id="step10-producer-73-is-previous-of-85-retired",
    ),
]


@pytest.mark.parametrize("case", KIP939)
def test_kip939_example_sequence(case: Kip939Case) -> None:
    snap = snapshot(case.txn, partition=case.partition, observed_at_ms=case.observed)
    v = classify(
        case.txn, snap, kip939(case.step), now_ms=case.observed, limits=LIMITS, view_current_ms=case.observed
    )
    assert (v.kind, v.reason) == (case.kind, case.reason), v.explanation


def test_kip939_step10_old_producer_id_is_unowned_once_retired() -> None:
    # After CompleteCommit(85, previous 73), no record names 42 any more: stage 1 passes None, retired at S10.
    view = select_coordinator_view(42, [kip939(10)])
    assert view is None
    snap = snapshot(TXN_42_P, observed_at_ms=S10 + 3 * SECOND)
    early = classify(
        TXN_42_P,
        snap,
        view,
        now_ms=S10 + 3 * SECOND,
        limits=LIMITS,
        retired_at_ms=S10,
        view_current_ms=S10 + 3 * SECOND,
    )
    assert early.kind is K.LATE  # the marker may still be landing
    snap = snapshot(TXN_42_P, observed_at_ms=S10 + MINUTE)
    late = classify(
        TXN_42_P,
        snap,
        view,
        now_ms=S10 + MINUTE,
        limits=LIMITS,
        retired_at_ms=S10,
        view_current_ms=S10 + MINUTE,
    )
    assert (late.kind, late.reason) == (K.HANGING, R.NO_COORDINATOR_STATE)


def test_kip939_step1_empty_has_no_partitions_and_step2_lists_one() -> None:
    assert kip939(1).partitions == ()
    assert kip939(2).lists("orders", 0)


# ------------------------------------------------------------------------------ selecting the view


def test_select_prefers_current_then_previous_then_next() -> None:
    current = coord(transactional_id="a", producer_id=PID, last_update_timestamp_ms=T0)
    previous = coord(
        transactional_id="b", producer_id=2, previous_producer_id=PID, last_update_timestamp_ms=T0 + 9
    )
    nxt = coord(transactional_id="c", producer_id=3, next_producer_id=PID, last_update_timestamp_ms=T0 + 9)
    assert select_coordinator_view(PID, [nxt, previous, current]) == current
    assert select_coordinator_view(PID, [nxt, previous]) == previous
    assert select_coordinator_view(PID, [nxt]) == nxt


def test_select_ignores_tombstones_dead_and_strangers() -> None:
    records = [tombstone(), coord(state=S.DEAD), coord(transactional_id="z", producer_id=5)]
    assert select_coordinator_view(PID, records) is None


def test_select_breaks_ties_by_latest_update() -> None:
    old = coord(transactional_id="a", producer_id=9, previous_producer_id=PID, last_update_timestamp_ms=T0)
    new = coord(
        transactional_id="b", producer_id=8, previous_producer_id=PID, last_update_timestamp_ms=T0 + 1
    )
    assert select_coordinator_view(PID, [new, old]) == new


# ----------------------------------------------------------------------------- lean path == model path


@pytest.mark.parametrize(("txn", "view", "observed", "kind", "reason"), TABLE)
def test_decide_agrees_with_classify(
    txn: OpenTransaction,
    view: CoordinatorRecord | None,
    observed: int,
    kind: VerdictKind,
    reason: HangingReason | None,
) -> None:
    snap = snapshot(txn, observed_at_ms=observed)
    facts = coord_facts(view) if view is not None else None
    retired = view.source_timestamp_ms if view is not None and view.tombstone else None
    d = decide(txn_facts(txn, snap), facts, observed, LIMITS, retired_at_ms=retired)
    assert (d.kind, d.reason) == (kind, reason)
    assert decide_by_rules(txn_facts(txn, snap), facts, observed, LIMITS, retired_at_ms=retired) == d


def random_scenario(
    rng: random.Random,
) -> tuple[TxnFacts, CoordFacts | None, int, DetectionLimits, int | None]:
    """Instants on a 5 s grid around T0 with +-1 ms neighbours: differences land exactly on the grace, skew
    and timeout values (multiples of 5 s), so every strict boundary is exercised."""

    def instant() -> int:
        return T0 + rng.randint(-4, 16) * 5_000 + rng.choice((-1, 0, 1))

    def maybe(value: int) -> int | None:
        return value if rng.random() < 0.5 else None

    t = TxnFacts(
        topic="orders",
        partition=rng.randint(0, 1),
        producer_id=PID,
        first_batch_epoch=rng.randint(4, 6),
        open_since_ms=instant() if rng.random() < 0.9 else -1,  # -1: no timestamp known
        observed_at_ms=instant(),
        max_transaction_timeout_ms=rng.choice((None, 30_000, 60_000)),
        first_seen_ms=maybe(instant()),
        seen_open_ms=maybe(instant()),
        moved_on_ms=maybe(instant()),
        leader_kept=rng.choice((None, True, False)),
        # offsets on a small grid, so "below the end measured before the report" is on both sides and equal
        log_end_before=maybe(rng.randint(0, 4)),
        moved_on_offset=maybe(rng.randint(-1, 4)),
    )
    role = rng.choice(("current", "current", "current", "previous", "next", "none", "stranger"))
    c = None
    if role != "none":
        ids = {
            "current": (PID, -1, -1),
            "previous": (7, PID, -1),
            "next": (7, -1, PID),
            "stranger": (7, 8, 9),
        }
        pid, prev, nxt = ids[role]
        c = CoordFacts(
            producer_id=pid,
            producer_epoch=rng.randint(4, 6),
            previous_producer_id=prev,
            next_producer_id=nxt,
            client_transaction_version=rng.randint(0, 2),
            transaction_timeout_ms=rng.choice((-1, 0, 10_000, 30_000, TWO_PHASE_COMMIT_TIMEOUT_MS)),
            state=rng.choice((None, *CoordinatorState)),
            partitions=frozenset(
                p for p in (("orders", 0), ("orders", 1), ("other", 0)) if rng.random() < 0.5
            ),
            last_update_timestamp_ms=instant(),
            start_timestamp_ms=instant(),
            # a Complete* record's Prepare partitions (None: not read), which decide the lost-marker rules
            prepared_partitions=None
            if rng.random() < 0.3
            else frozenset(p for p in (("orders", 0), ("orders", 1)) if rng.random() < 0.5),
            log_offset=maybe(rng.randint(-1, 4)),
        )
    lim = DetectionLimits(
        grace_ms=rng.choice((0, 5_000, 10_000)),
        clock_skew_ms=rng.choice((0, 5_000)),
        late_buffer_ms=rng.choice((0, 10_000)),
        coordinator_cleanup_interval_ms=rng.choice((0, 10_000)),
        default_max_transaction_timeout_ms=rng.choice((60_000, 900_000)),
    )
    return t, c, instant(), lim, maybe(instant())


def test_fast_decide_equals_the_rules_applied_in_order() -> None:
    # A seeded sweep (cheap enough for 60k scenarios, where hypothesis manages a few thousand): the hot-path
    # `decide` must give exactly the answer of the rule functions applied in their documented order.
    rng = random.Random(20260522)
    seen: set[Decision] = set()
    combinations: set[tuple[CoordinatorState | None, str, bool]] = set()
    for _ in range(60_000):
        t, c, now, lim, retired = random_scenario(rng)
        combinations.add(state_combination(t, c))
        try:
            expected = decide_by_rules(t, c, now, lim, retired_at_ms=retired)
        except ValueError:
            with pytest.raises(ValueError, match="is not about producer"):
                decide(t, c, now, lim, retired_at_ms=retired)
            continue
        got = decide(t, c, now, lim, retired_at_ms=retired)
        assert got == expected, (t, c, now, lim, retired)
        seen.add(got)
    # Every outcome the rules can produce was reached, so the comparison covered all of them.
    # with lost-commit-marker, lost-abort-marker, commit-or-late-write, owner-moved-on, write-after-marker
    assert len(seen) == 20, sorted(seen)
    # And every coordinator state (None = no record or a tombstone), in every role, listing the partition or
    # not: the fast path's dispatch on state sets cannot hide a state the rules treat otherwise.
    every = {
        (state, role, listed)
        for state in (None, *CoordinatorState)
        for role in ("current", "previous", "next", "stranger")
        for listed in (False, True)
    } | {(None, "none", False)}
    assert combinations == every, sorted(every - combinations, key=str)


def state_combination(t: TxnFacts, c: CoordFacts | None) -> tuple[CoordinatorState | None, str, bool]:
    """(coordinator state, how the record names the producer id, whether it lists the partition)."""
    if c is None:
        return (None, "none", False)
    ids = {c.producer_id: "current", c.previous_producer_id: "previous", c.next_producer_id: "next"}
    return (c.state, ids.get(t.producer_id, "stranger"), (t.topic, t.partition) in c.partitions)


# --------------------------------------------------------------------------------- evidence, explanation


def test_evidence_carries_the_numbers_a_human_needs() -> None:
    view = coord(
        state=S.COMPLETE_COMMIT, producer_epoch=6, partitions=(), last_update_timestamp_ms=T0 + 20 * SECOND
    )
    v = verdict(open_txn(), view)
    e = v.evidence
    assert (e.age_ms, e.open_since_ms, e.open_since_basis) == (MINUTE, T0, "start-timestamp")
    assert (e.grace_ms, e.clock_skew_ms, e.late_threshold_ms) == (10_000, 5_000, 900_000)
    assert e.max_transaction_timeout_source == "broker"
    assert e.coordinator is not None
    assert (e.coordinator.role, e.coordinator.state, e.coordinator.producer_epoch) == (
        CoordinatorRole.CURRENT,
        S.COMPLETE_COMMIT,
        6,
    )
    assert e.coordinator.partition_listed is False
    assert (e.last_stable_offset, e.high_watermark) == (100, 250)
    assert "\n" not in v.explanation
    assert "HANGING (coordinator-completed)" in v.explanation and "'tx-1'" in v.explanation


def test_evidence_says_when_the_age_is_from_last_timestamp() -> None:
    v = verdict(open_txn(start_timestamp_ms=None, start_batch_producer_epoch=None), None)
    assert v.evidence.open_since_basis == "last-timestamp"
    assert "at least" in v.explanation


@pytest.mark.parametrize(
    ("ms", "text"),
    [(850, "850ms"), (42_000, "42s"), (185_000, "3m05s"), (7_260_000, "2h01m"), (3 * 86_400_000, "3d00h")],
)
def test_format_duration(ms: int, text: str) -> None:
    assert format_duration(ms) == text


# --------------------------------------------------------------------------------------------- abort plan


def hanging_case(**txn_overrides: Any) -> tuple[PartitionSnapshot, OpenTransaction, Verdict]:
    txn = open_txn(**txn_overrides)
    snap = snapshot(txn)
    return (
        snap,
        txn,
        classify(
            txn, snap, None, now_ms=snap.observed_at_ms, limits=LIMITS, view_current_ms=snap.observed_at_ms
        ),
    )


@pytest.mark.parametrize(
    ("leader_epoch", "marker_epoch"),
    [
        pytest.param(-1, 0, id="never-marked-producer-shows-minus-one-sent-as-zero-like-TransactionsCommand"),
        pytest.param(0, 0, id="zero-stays-zero"),
        pytest.param(3, 3, id="leader-reported-epoch-is-used-as-is"),
    ],
)
def test_plan_abort_coordinator_epoch_is_never_minus_one(leader_epoch: int, marker_epoch: int) -> None:
    snap, txn, v = hanging_case(coordinator_epoch=leader_epoch)
    c = plan_abort(snap, txn, v, bootstrap="k1:9092", first_detected_ms=T0 + MINUTE)
    assert c.spec.coordinator_epoch == marker_epoch == marker_coordinator_epoch(leader_epoch)


def test_plan_abort_builds_the_candidate() -> None:
    snap, txn, v = hanging_case()
    c = plan_abort(snap, txn, v, bootstrap="k1:9092,k2:9092", first_detected_ms=T0 + MINUTE)
    assert c.candidate_id == candidate_id("prod", "orders", 0, PID, 5, 100)
    assert (c.spec.producer_id, c.spec.producer_epoch, c.spec.topic, c.spec.partition) == (
        PID,
        5,
        "orders",
        0,
    )
    assert c.reason is R.NO_COORDINATOR_STATE and c.status is CandidateStatus.OPENED
    assert c.kafka_cli == (
        "kafka-transactions.sh --bootstrap-server k1:9092,k2:9092 abort --topic orders --partition 0 --start-offset 100"
    )
    assert plan_abort(snap, txn, v, first_detected_ms=T0).kafka_cli.startswith(
        "kafka-transactions.sh --bootstrap-server <bootstrap-server> abort"
    )
    resolved = c.resolved(resolved_at_ms=T0 + HOUR)
    assert (resolved.status, resolved.resolved_at_ms, resolved.candidate_id) == (
        CandidateStatus.RESOLVED,
        T0 + HOUR,
        c.candidate_id,
    )


def test_kafka_cli_quotes_unsafe_values_and_adds_command_config() -> None:
    line = kafka_cli_abort(
        topic="t", partition=1, start_offset=2, bootstrap="h:9092", command_config="/etc/my c.p"
    )
    assert line == (
        "kafka-transactions.sh --bootstrap-server h:9092 --command-config '/etc/my c.p' abort "
        "--topic t --partition 1 --start-offset 2"
    )


@pytest.mark.parametrize(
    "view",
    [
        pytest.param(
            coord(state=S.PREPARE_COMMIT, producer_epoch=6, last_update_timestamp_ms=T0 + 20 * SECOND),
            id="stuck-prepare-is-never-aborted-it-would-break-the-commit",
        ),
        pytest.param(coord(), id="open-is-not-aborted"),
    ],
)
def test_plan_abort_refuses_anything_but_hanging(view: CoordinatorRecord) -> None:
    txn = open_txn()
    snap = snapshot(txn)
    v = classify(
        txn, snap, view, now_ms=snap.observed_at_ms, limits=LIMITS, view_current_ms=snap.observed_at_ms
    )
    assert not is_abort_candidate(v)
    with pytest.raises(ValueError, match="only a HANGING verdict"):
        plan_abort(snap, txn, v, first_detected_ms=T0)


def test_plan_abort_refuses_a_transaction_not_in_the_snapshot() -> None:
    snap, _, v = hanging_case()
    with pytest.raises(ValueError, match="no such open transaction"):
        plan_abort(snap, open_txn(start_offset=7), v, first_detected_ms=T0)


# ------------------------------------------------------------------------- comparison with find-hanging


def find_hanging_answer(
    txn: OpenTransaction,
    snap: PartitionSnapshot,
    coordinator_records: list[CoordinatorRecord],
    *,
    now_ms: int,
    max_transaction_timeout_ms: int = 15 * MINUTE,
    describe_acl: bool = True,
) -> bool:
    """Kafka's `kafka-transactions.sh find-hanging`, reimplemented (TransactionsCommand, notes section 1.2).

    Candidate iff now - LastTimestamp > --max-transaction-timeout (15 min, strict). Then ListTransactions
    (filtered by producer id) matches only the coordinator's *current* producer id, skips Dead (tombstoned ids
    are gone) and drops ids the caller may not DESCRIBE; no transactional id -> hanging; otherwise hanging iff
    DescribeTransactions' partitions (empty once Complete*/Empty) do not contain the partition. No state or
    epoch check.
    """
    if not now_ms - txn.last_timestamp_ms > max_transaction_timeout_ms:
        return False
    owner = next(
        (
            r
            for r in coordinator_records
            if r.state is not None and r.state is not S.DEAD and r.producer_id == txn.producer_id
        ),
        None,
    )
    if owner is None or not describe_acl:
        return True
    listed = owner.lists(snap.topic, snap.partition) and owner.state not in (
        S.EMPTY,
        S.COMPLETE_COMMIT,
        S.COMPLETE_ABORT,
    )
    return not listed


class Comparison(NamedTuple):
    txn: OpenTransaction
    records: list[CoordinatorRecord]
    observed: int
    find_hanging: bool
    ours: tuple[VerdictKind, HangingReason | None]
    describe_acl: bool = True
    max_timeout: int = 900_000


DISAGREEMENTS = [
    pytest.param(
        Comparison(
            open_txn(last_timestamp_ms=T0 + SECOND),
            [
                coord(
                    state=S.COMPLETE_COMMIT,
                    producer_epoch=6,
                    partitions=(),
                    last_update_timestamp_ms=T0 + 5 * SECOND,
                )
            ],
            T0 + MINUTE,
            find_hanging=False,
            ours=(K.HANGING, R.COORDINATOR_COMPLETED),
        ),
        # find-hanging waits until LastTimestamp is 15 min old; Complete* is only written after every marker
        # was acknowledged, so a partition still open a grace period later will never get one: proof now.
        id="young-txn-after-completion-find-hanging-not-yet-a-candidate-ours-proven-hanging-in-seconds",
    ),
    pytest.param(
        Comparison(
            open_txn(start_timestamp_ms=T0, last_timestamp_ms=T0 + HOUR - SECOND),
            [
                coord(
                    client_transaction_version=0,
                    partitions=tps("orders-1"),
                    start_timestamp_ms=T0 + HOUR - 30 * SECOND,
                    last_update_timestamp_ms=T0 + HOUR - 30 * SECOND,
                )
            ],
            T0 + HOUR,
            find_hanging=False,
            ours=(K.HANGING, R.OLDER_THAN_COORDINATOR_TRANSACTION),
        ),
        # A buggy TV0 client keeps writing orders-0 without adding it, transaction after transaction: each
        # write refreshes LastTimestamp, so find-hanging never makes it a candidate. The open transaction started
        # an hour ago, long before the coordinator's current one (same epoch: TV0 does not bump), which does not
        # list orders-0: nothing will ever write its marker.
        id="producer-keeps-writing-unadded-partition-last-timestamp-fresh-find-hanging-never-sees-it",
    ),
    pytest.param(
        Comparison(
            open_txn(start_timestamp_ms=T0, last_timestamp_ms=T0 + SECOND),
            [coord(transaction_timeout_ms=3_600_000)],
            T0 + 20 * MINUTE,
            find_hanging=True,
            ours=(K.OPEN, None),
            describe_acl=False,
            max_timeout=3_600_000,
        ),
        # Without DESCRIBE on the transactional id, ListTransactions hides it and find-hanging calls a healthy
        # 20-minute transaction (broker max timeout 1 h) hanging; we read __transaction_state: Ongoing, listed.
        id="missing-describe-acl-find-hanging-false-positive-ours-reads-the-coordinator-log",
    ),
    pytest.param(
        Comparison(
            open_txn(producer_id=73, producer_epoch=0, start_batch_producer_epoch=0, last_timestamp_ms=T0),
            [coord(producer_id=42, producer_epoch=MAX - 1, next_producer_id=73, transaction_timeout_ms=-1)],
            T0 + 20 * MINUTE,
            find_hanging=True,
            ours=(K.LATE, None),
        ),
        # ListTransactions matches only current producer ids, so find-hanging calls data of the coordinator's
        # *next* producer id hanging. We defer: the coordinator will either make 73 current (then its rules
        # apply) or record it as previous (then older-than-coordinator-transaction proves it). Deferred, not
        # dismissed; it is LATE meanwhile.
        id="next-producer-id-find-hanging-says-hanging-ours-defers-until-the-handover-resolves",
    ),
]


@pytest.mark.parametrize("case", DISAGREEMENTS)
def test_where_find_hanging_answers_differently(case: Comparison) -> None:
    snap = snapshot(case.txn, observed_at_ms=case.observed, max_transaction_timeout_ms=case.max_timeout)
    fh = find_hanging_answer(
        case.txn, snap, case.records, now_ms=case.observed, describe_acl=case.describe_acl
    )
    view = select_coordinator_view(case.txn.producer_id, case.records)
    v = classify(case.txn, snap, view, now_ms=case.observed, limits=LIMITS, view_current_ms=case.observed)
    assert fh is case.find_hanging
    assert (v.kind, v.reason) == case.ours, v.explanation
    assert (v.kind is K.HANGING) is not fh  # the point of the case: the two answers differ


AGREEMENTS = [
    pytest.param(
        Comparison(
            open_txn(last_timestamp_ms=T0), [], T0 + 20 * MINUTE, True, (K.HANGING, R.NO_COORDINATOR_STATE)
        ),
        id="unowned-producer-id",
    ),
    pytest.param(
        Comparison(
            open_txn(last_timestamp_ms=T0),
            [tombstone()],
            T0 + 20 * MINUTE,
            True,
            (K.HANGING, R.NO_COORDINATOR_STATE),
        ),
        id="tombstoned-transactional-id",
    ),
    pytest.param(
        Comparison(
            open_txn(last_timestamp_ms=T0, producer_epoch=MAX - 1, start_batch_producer_epoch=MAX - 1),
            [
                coord(
                    producer_id=2000,
                    producer_epoch=0,
                    previous_producer_id=PID,
                    state=S.COMPLETE_COMMIT,
                    partitions=(),
                )
            ],
            T0 + 20 * MINUTE,
            True,
            (K.HANGING, R.OLDER_THAN_COORDINATOR_TRANSACTION),
        ),
        # Same answer, better reason: find-hanging only sees "no transactional id" for the retired id.
        id="epoch-overflow-retired-producer-id-same-answer-named-reason",
    ),
    pytest.param(
        Comparison(
            open_txn(last_timestamp_ms=T0),
            [coord(state=S.PREPARE_COMMIT, producer_epoch=6, last_update_timestamp_ms=T0 + SECOND)],
            T0 + 20 * MINUTE,
            False,
            (K.STUCK_PREPARE, None),
        ),
        # Neither aborts; we also raise an alert, because a marker overdue by 20 minutes is a coordinator problem.
        id="prepare-commit-listing-partition-neither-aborts-we-alert",
    ),
    pytest.param(
        Comparison(
            open_txn(last_timestamp_ms=T0),
            [coord(partitions=tps("orders-1"))],
            T0 + 20 * MINUTE,
            True,
            (K.HANGING, R.PARTITION_NOT_IN_TRANSACTION),
        ),
        id="ongoing-without-partition",
    ),
]


@pytest.mark.parametrize("case", AGREEMENTS)
def test_where_find_hanging_agrees(case: Comparison) -> None:
    snap = snapshot(case.txn, observed_at_ms=case.observed, max_transaction_timeout_ms=case.max_timeout)
    fh = find_hanging_answer(
        case.txn, snap, case.records, now_ms=case.observed, describe_acl=case.describe_acl
    )
    view = select_coordinator_view(case.txn.producer_id, case.records)
    retired = case.records[0].source_timestamp_ms if case.records and case.records[0].tombstone else None
    v = classify(
        case.txn,
        snap,
        view,
        now_ms=case.observed,
        limits=LIMITS,
        retired_at_ms=retired,
        view_current_ms=case.observed,
    )
    assert fh is case.find_hanging
    assert (v.kind, v.reason) == case.ours, v.explanation
    assert (v.kind is K.HANGING) is fh
