"""A lost marker is not an orphan to abort (issue 30 #7). Kafka documents (KAFKA-20716) that an unclean leader
election can drop commit/abort markers: the coordinator completed the transaction (its Prepare record listed the
partition, every marker acknowledged before Complete* was written), yet the partition still holds the transaction
open. For a commit, the data was committed everywhere else and the client was told so: an ABORT would break the
transaction's atomicity. The rules name it (`lost-commit-marker`, `lost-abort-marker`), the candidate carries the
marker that restores the coordinator's outcome (COMMIT for a commit), and a commit that cannot be told from a
write after it is withheld. Stage 1 carries the Prepare record's partitions over to the Complete record (Kafka's
Complete record lists none)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from builders import HOUR, LIMITS, MINUTE, PID, SECOND, T0, coord, open_txn, snapshot, tps
from test_tracking import row as tracking_row

from detectors.abort import (
    NO_KAFKA_CLI_COMMIT,
    needs_read_committed,
    plan_abort,
    post_check,
    verify_abort,
    verify_commit,
)
from detectors.models import (
    TWO_PHASE_COMMIT_TIMEOUT_MS,
    AbortCandidate,
    CoordinatorRecord,
    CoordinatorState,
    HangingReason,
    LeaderProducer,
    LiveCoordinator,
    LiveEvidence,
    VerdictKind,
    VerifyOutcome,
    WithheldReason,
)
from detectors.rules import classify, coord_facts, decide, decide_by_rules, txn_facts
from detectors.tracking import CoordinatorRow, Owner, advance_owners, run_ends

pytestmark = pytest.mark.unit

S = CoordinatorState
K = VerdictKind
R = HangingReason
DONE_AT = T0 + 10 * SECOND  # the coordinator completed the transaction; the leader reports it a minute later
OBSERVED = T0 + MINUTE


def completed(state: CoordinatorState, prepared: str | None, **overrides: Any) -> CoordinatorRecord:
    return coord(
        state=state,
        partitions=(),
        prepared_partitions=None if prepared is None else tps(prepared),
        last_update_timestamp_ms=DONE_AT,
        **overrides,
    )


def verdict(
    record: CoordinatorRecord,
    *,
    seen_open_ms: int | None,
    start_leader_epoch: int | None = None,
    leader_epoch: int | None = None,
) -> Any:
    txn = open_txn(seen_open_ms=seen_open_ms, start_batch_leader_epoch=start_leader_epoch)
    snap = snapshot(txn, observed_at_ms=OBSERVED, leader_epoch=leader_epoch)
    v = classify(
        txn, snap, record, now_ms=OBSERVED, limits=LIMITS, view_current_ms=OBSERVED, first_seen_ms=T0 + SECOND
    )
    # the hot path and the rule chain agree on every case here
    t = txn_facts(txn, snap, first_seen_ms=T0 + SECOND)
    assert decide(t, coord_facts(record), OBSERVED, LIMITS) == decide_by_rules(
        t, coord_facts(record), OBSERVED, LIMITS
    )
    return v


def test_a_commit_whose_marker_was_lost_is_restored_with_a_commit_never_aborted() -> None:
    v = verdict(completed(S.COMPLETE_COMMIT, "orders-0"), seen_open_ms=T0 + SECOND)
    assert (v.kind, v.reason) == (K.HANGING, R.LOST_COMMIT_MARKER)
    assert "COMMIT marker for this partition was lost" in v.explanation and "never an ABORT" in v.explanation
    c = plan_abort(snapshot(open_txn(seen_open_ms=T0 + SECOND)), open_txn(seen_open_ms=T0 + SECOND), v,
                   first_detected_ms=OBSERVED)  # fmt: skip
    assert c.spec.transaction_result == "COMMIT" and c.kafka_cli == NO_KAFKA_CLI_COMMIT
    assert v.evidence.coordinator is not None and v.evidence.coordinator.prepared_partition_listed


def test_an_abort_whose_marker_was_lost_is_restored_with_an_abort() -> None:
    v = verdict(completed(S.COMPLETE_ABORT, "orders-0"), seen_open_ms=T0 + SECOND)
    assert (v.kind, v.reason) == (K.HANGING, R.LOST_ABORT_MARKER)
    c = plan_abort(snapshot(open_txn(seen_open_ms=T0 + SECOND)), open_txn(seen_open_ms=T0 + SECOND), v,
                   first_detected_ms=OBSERVED)  # fmt: skip
    assert c.spec.transaction_result == "ABORT" and c.kafka_cli.startswith("kafka-transactions.sh")


def test_a_commit_listing_the_partition_before_a_transaction_not_seen_open_is_withheld() -> None:
    # Seen open only after the commit: a lost marker (COMMIT) or a write after the marker (ABORT)?
    v = verdict(completed(S.COMPLETE_COMMIT, "orders-0"), seen_open_ms=DONE_AT + SECOND)
    assert (v.kind, v.reason, v.withheld) == (
        K.UNCONFIRMED,
        R.COORDINATOR_COMPLETED,
        WithheldReason.COMMIT_OR_LATE_WRITE,
    )
    assert "no remedy is proposed" in v.explanation
    unknown = verdict(completed(S.COMPLETE_COMMIT, "orders-0"), seen_open_ms=None)
    assert unknown.withheld is WithheldReason.COMMIT_OR_LATE_WRITE


def test_a_write_after_the_commit_marker_is_told_apart_by_the_partitions_leader_epoch() -> None:
    """Seen open only after a commit that listed the partition, but its start batch was appended in the leader
    epoch the leader still reports: the marker cannot have been lost since, so the transaction began after it (a
    Produce retried after the commit): HANGING write-after-marker, ABORT. Another epoch, or an unknown one: a lost
    commit marker is possible, and it stays withheld."""
    record = completed(S.COMPLETE_COMMIT, "orders-0")
    kept = verdict(record, seen_open_ms=DONE_AT + SECOND, start_leader_epoch=7, leader_epoch=7)
    assert (kept.kind, kept.reason) == (K.HANGING, R.WRITE_AFTER_MARKER)
    assert (
        "began after the marker" in kept.explanation and "unconfirmed that no commit" not in kept.explanation
    )
    txn = open_txn(seen_open_ms=DONE_AT + SECOND, start_batch_leader_epoch=7)
    c = plan_abort(snapshot(txn, leader_epoch=7), txn, kept, first_detected_ms=OBSERVED)
    assert c.spec.transaction_result == "ABORT"
    for start, now in ((6, 7), (None, 7), (7, None)):
        v = verdict(record, seen_open_ms=DONE_AT + SECOND, start_leader_epoch=start, leader_epoch=now)
        assert (v.kind, v.withheld) == (K.UNCONFIRMED, WithheldReason.COMMIT_OR_LATE_WRITE), (start, now)


def test_an_abort_proposed_after_a_leader_change_says_a_commit_may_be_lost() -> None:
    """A transaction whose coordinator moved on (here: Empty after a restart) is HANGING and ABORT is its remedy,
    but where the partition's leader changed since it began, the marker of a commit may have been lost in an
    unclean election: the verdict says so (and `proposals abort` asks for an acknowledgement)."""
    empty = coord(state=S.EMPTY, partitions=(), last_update_timestamp_ms=DONE_AT, start_timestamp_ms=-1)
    moved = verdict(empty, seen_open_ms=DONE_AT + SECOND, start_leader_epoch=6, leader_epoch=7)
    assert (moved.kind, moved.reason) == (K.HANGING, R.COORDINATOR_COMPLETED)
    assert (
        "unconfirmed that no commit was lost" in moved.explanation and "leader epoch 6" in moved.explanation
    )
    same = verdict(empty, seen_open_ms=DONE_AT + SECOND, start_leader_epoch=7, leader_epoch=7)
    assert "unconfirmed that no commit" not in same.explanation


def test_an_abort_listing_the_partition_is_aborted_either_way() -> None:
    v = verdict(completed(S.COMPLETE_ABORT, "orders-0"), seen_open_ms=DONE_AT + SECOND)
    assert (v.kind, v.reason) == (K.HANGING, R.COORDINATOR_COMPLETED)


@pytest.mark.parametrize("prepared", ["payments-3", None], ids=["not-listed", "prepare-not-read"])
def test_a_completion_that_did_not_list_the_partition_proves_it_hanging_as_before(
    prepared: str | None,
) -> None:
    v = verdict(completed(S.COMPLETE_COMMIT, prepared), seen_open_ms=T0 + SECOND)
    assert (v.kind, v.reason) == (K.HANGING, R.COORDINATOR_COMPLETED)


# ------------------------------------------------------------------------------------------- stage 1


def row(record: CoordinatorRecord, offset: int) -> CoordinatorRow:
    """Stage 1's row of `record` at `offset`, with its state (which carries a Prepare over to its Complete)."""
    return tracking_row(record)._replace(
        source_offset=offset, state=record.state.value if record.state else None
    )


def test_stage_one_carries_the_prepare_records_partitions_to_the_complete_record() -> None:
    prepare = coord(state=S.PREPARE_COMMIT, partitions=tps("orders-0", "orders-1"))
    complete = coord(state=S.COMPLETE_COMMIT, partitions=())
    owners: dict[str, Owner] = {}
    (fact,) = advance_owners(owners, [row(prepare, 10), row(complete, 11)])
    assert json.loads(fact[3])["prepared_partitions"] == [
        {"topic": "orders", "partition": 0},
        {"topic": "orders", "partition": 1},
    ]
    # across batches: the Prepare is kept with the id until its Complete arrives
    owners = {}
    advance_owners(owners, [row(prepare, 20)])
    assert owners["tx-1"].prepared is not None
    (fact,) = advance_owners(owners, [row(complete, 21)])
    assert CoordinatorRecord.model_validate_json(fact[3]).prepared_partitions == tps("orders-0", "orders-1")
    assert owners["tx-1"].prepared is None


def test_a_complete_record_of_another_epoch_or_without_its_prepare_says_so() -> None:
    prepare = coord(state=S.PREPARE_COMMIT, partitions=tps("orders-0"), producer_epoch=4)
    complete = coord(state=S.COMPLETE_COMMIT, partitions=(), producer_epoch=5)
    (fact,) = advance_owners({}, [row(prepare, 10), row(complete, 11)])
    assert CoordinatorRecord.model_validate_json(fact[3]).prepared_partitions is None
    (fact,) = advance_owners({}, [row(complete, 11)])
    assert CoordinatorRecord.model_validate_json(fact[3]).prepared_partitions is None
    old_owner = Owner(PID, 5)  # stored by a version without `prepared`
    (fact,) = advance_owners({"tx-1": old_owner}, [row(complete, 11)])
    assert CoordinatorRecord.model_validate_json(fact[3]).prepared_partitions is None


def test_the_decoder_keeps_the_prepare_record_each_complete_one_needs() -> None:
    states = ["Ongoing", "PrepareCommit", "CompleteCommit", "Ongoing", "PrepareCommit", "CompleteCommit"]
    keep = run_ends(["tx"] * 6, [PID] * 6, [False] * 6, states)
    assert keep == [True, False, False, False, True, True]  # first, the newest Prepare, its Complete
    assert run_ends(["tx"] * 6, [PID] * 6, [False] * 6) == [True, False, False, False, False, True]


def test_proposals_abort_refuses_a_lost_commit_by_name() -> None:
    from detectors.abort import verify_abort
    from detectors.models import LeaderProducer, LiveEvidence, VerifyOutcome

    txn = open_txn(seen_open_ms=T0 + SECOND)
    v = verdict(completed(S.COMPLETE_COMMIT, "orders-0"), seen_open_ms=T0 + SECOND)
    c = plan_abort(snapshot(txn), txn, v, first_detected_ms=OBSERVED)
    live = LiveEvidence(
        observed_at_ms=OBSERVED,
        leader=1,
        producer=LeaderProducer(
            producer_id=PID, producer_epoch=5, coordinator_epoch=3, current_txn_start_offset=100
        ),
    )
    result = verify_abort(c, live)
    assert result.outcome is VerifyOutcome.REFUSED
    assert result.changes[0].startswith("lost-commit-marker:") and "proposals commit" in result.changes[0]


# ------------------------------------------------------------------------------ proposals commit: verify_commit


def lost_commit(**record: Any) -> AbortCandidate:
    """A lost-commit-marker candidate: tx-1 CompleteCommit at DONE_AT, its PrepareCommit listed orders-0."""
    txn = open_txn(seen_open_ms=T0 + SECOND)
    v = verdict(completed(S.COMPLETE_COMMIT, "orders-0", **record), seen_open_ms=T0 + SECOND)
    return plan_abort(snapshot(txn), txn, v, first_detected_ms=OBSERVED)


def owner_now(**overrides: Any) -> LiveCoordinator:
    """tx-1 as its coordinator shows it now: still CompleteCommit of the same transaction (its start), producer
    1000 at epoch 6 (restarted since, or TV2: the Complete record carries the next epoch)."""
    fields: dict[str, Any] = {
        "transactional_id": "tx-1",
        "state": "CompleteCommit",
        "producer_id": PID,
        "producer_epoch": 6,
        "partition_listed": False,
        "transaction_start_ms": T0 - 100,  # `coord`'s start_timestamp_ms
    }
    fields.update(overrides)
    return LiveCoordinator(**fields)


def live_now(**overrides: Any) -> LiveEvidence:
    fields: dict[str, Any] = {
        "observed_at_ms": OBSERVED + MINUTE,
        "leader": 1,
        "producer": LeaderProducer(
            producer_id=PID, producer_epoch=5, coordinator_epoch=3, current_txn_start_offset=100
        ),
        "last_stable_offset": 100,
        "high_watermark": 250,
        "coordinator": owner_now(),
    }
    fields.update(overrides)
    return LiveEvidence(**fields)


def test_proposals_commit_verifies_a_lost_commit_and_plans_its_commit_marker() -> None:
    result = verify_commit(lost_commit(), live_now())
    assert result.outcome is VerifyOutcome.SAFE and result.changes == ()
    assert result.marker is not None and result.marker.transaction_result == "COMMIT"
    assert (result.marker.producer_id, result.marker.producer_epoch, result.marker.coordinator_epoch) == (
        PID,
        5,
        3,
    )


def test_proposals_commit_refuses_an_abort_candidate_by_name() -> None:
    # An orphan no coordinator committed (no coordinator state): its marker is ABORT, and a COMMIT would commit
    # what nobody committed.
    txn = open_txn(seen_open_ms=T0 + SECOND)
    v = verdict(completed(S.COMPLETE_ABORT, "orders-0"), seen_open_ms=T0 + SECOND)
    c = plan_abort(snapshot(txn), txn, v, first_detected_ms=OBSERVED)
    assert c.spec.transaction_result == "ABORT"
    result = verify_commit(c, live_now())
    assert result.outcome is VerifyOutcome.REFUSED and result.marker is None
    assert result.changes[0].startswith("abort-candidate:")
    assert f"txnwatch proposals abort {c.candidate_id}" in result.changes[0]
    # ... which `proposals abort` takes (a lost abort marker is restored with an ABORT).
    assert verify_abort(c, live_now()).outcome is VerifyOutcome.SAFE


@pytest.mark.parametrize(
    "evidence",
    [
        {"prepared_partition_listed": False},
        {"prepared_partition_listed": None},
        {"state": S.COMPLETE_ABORT},
    ],
    ids=["prepare-did-not-list", "prepare-not-read", "not-a-commit"],
)
def test_proposals_commit_needs_evidence_that_the_prepare_commit_listed_the_partition(
    evidence: dict[str, Any],
) -> None:
    c = lost_commit()
    assert c.evidence.coordinator is not None
    forged = c.model_copy(
        update={
            "evidence": c.evidence.model_copy(
                update={"coordinator": c.evidence.coordinator.model_copy(update=evidence)}
            )
        }
    )
    result = verify_commit(forged, live_now())
    assert result.outcome is VerifyOutcome.REFUSED
    assert [line.split(":", 1)[0] for line in result.changes] == ["commit-unproven"]


@pytest.mark.parametrize(
    ("coordinator", "named"),
    [
        (None, "commit-owner-gone"),
        (owner_now(state="CompleteAbort"), "coordinator-contradicts-commit"),
        (owner_now(state="Ongoing"), "coordinator-contradicts-commit"),
        (owner_now(producer_epoch=4), "coordinator-contradicts-commit"),
        (owner_now(state="PrepareCommit"), "transactional id tx-1 (producer 1000) is PrepareCommit"),
        (
            owner_now(state="Ongoing", partition_listed=True, transaction_start_ms=T0 + HOUR),
            "Ongoing with orders-0",
        ),
        (owner_now(producer_epoch=5, transaction_start_ms=T0 + HOUR), "live-owner-same-epoch"),
    ],
    ids=[
        "no-owner",
        "same-transaction-now-aborted",
        "same-transaction-back-to-ongoing",
        "epoch-went-back",
        "writing-markers",
        "owner-live-with-the-partition",
        "live-owner-at-the-marker-epoch",
    ],
)
def test_proposals_commit_refuses_a_coordinator_that_no_longer_shows_the_commit_or_owns_the_partition(
    coordinator: LiveCoordinator | None, named: str
) -> None:
    result = verify_commit(lost_commit(), live_now(coordinator=coordinator))
    assert result.outcome is VerifyOutcome.REFUSED and result.marker is None
    assert any(named in line for line in result.changes), result.changes


def test_a_later_transaction_of_the_owner_leaves_the_commit_as_it_was() -> None:
    later = owner_now(state="CompleteAbort", producer_epoch=7, transaction_start_ms=T0 + HOUR)
    assert verify_commit(lost_commit(), live_now(coordinator=later)).outcome is VerifyOutcome.SAFE
    restarted = owner_now(state="Empty", producer_epoch=6, transaction_start_ms=-1)
    assert verify_commit(lost_commit(), live_now(coordinator=restarted)).outcome is VerifyOutcome.SAFE


def test_a_live_owner_at_the_marker_epoch_is_waived_for_a_commit_as_for_an_abort() -> None:
    same_epoch = live_now(coordinator=owner_now(producer_epoch=5))
    refused = verify_commit(lost_commit(), same_epoch)
    assert "the marker would commit it too" in refused.changes[0]
    waived = verify_commit(lost_commit(), same_epoch, allow_live_owner=True)
    assert waived.outcome is VerifyOutcome.SAFE and waived.waived[0].startswith("live-owner-same-epoch:")


def test_a_two_phase_commit_transaction_whose_commit_marker_was_lost_is_restored() -> None:
    # Its transaction manager decided COMMIT and its coordinator completed it: the COMMIT marker is that outcome
    # (an ABORT is refused for 2PC and for a lost commit alike).
    c = lost_commit(transaction_timeout_ms=TWO_PHASE_COMMIT_TIMEOUT_MS)
    assert c.two_phase_commit
    live = live_now(coordinator=owner_now(transaction_timeout_ms=TWO_PHASE_COMMIT_TIMEOUT_MS))
    assert verify_commit(c, live).outcome is VerifyOutcome.SAFE
    assert verify_abort(c, live).outcome is VerifyOutcome.REFUSED


def test_a_commit_is_post_checked_by_what_a_read_committed_reader_gets() -> None:
    c = lost_commit()
    ended = live_now(
        producer=LeaderProducer(
            producer_id=PID, producer_epoch=5, coordinator_epoch=3, current_txn_start_offset=-1
        ),
        last_stable_offset=251,
    )
    assert needs_read_committed(c, ended) and not needs_read_committed(c, live_now())
    assert post_check(c, ended, 100).ok
    skipped = post_check(c, ended, 101)  # the reader skips the transaction: an ABORT marker landed
    assert not skipped.ok and "skips offset 100" in skipped.problems[0]
    assert not post_check(c, ended, None).ok
    # An abort candidate is not read back.
    orphan = c.model_copy(update={"spec": c.spec.model_copy(update={"transaction_result": "ABORT"})})
    assert post_check(orphan, ended).ok and not needs_read_committed(orphan, ended)


def test_a_policy_cannot_auto_abort_a_lost_commit() -> None:
    from detectors.policy import AbortPolicy

    with pytest.raises(ValueError, match="lost-commit-marker cannot be auto-aborted"):
        AbortPolicy.model_validate(
            {
                "reasons": ["lost-commit-marker"],
                "min_age_s": 0,
                "min_lso_lag": 0,
                "topics": {"allow": ["*"]},
                "max_aborts_per_hour": 1,
            }
        )


def test_show_offers_the_commit_and_no_kafka_abort_line_for_a_lost_commit() -> None:
    from admin.proposals.show import ActWith, candidate_row

    txn = open_txn(seen_open_ms=T0 + SECOND)
    v = verdict(completed(S.COMPLETE_COMMIT, "orders-0"), seen_open_ms=T0 + SECOND)
    c = plan_abort(snapshot(txn), txn, v, first_detected_ms=OBSERVED)
    act = ActWith("b:9092", "prod", "txnwatch")
    assert act.txnwatch(c).startswith(f"txnwatch proposals commit {c.candidate_id} ")
    assert act.kafka_cli(c) == NO_KAFKA_CLI_COMMIT
    assert candidate_row(c, OBSERVED)["marker"] == "COMMIT"
