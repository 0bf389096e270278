"""The verified abort's decisions: `detectors.abort.verify_abort` for every changed-state case, `post_check`,
`pending_candidates`, and `admin.proposals.verified_marker.abort`'s flow on a scripted cluster (dry run, execute, leader move,
missing ACL, fenced marker, failed post-check), plus reading the candidates topic."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from builders import HOUR, LEADER_EPOCH, LIMITS, MINUTE, T0, coord, open_txn, snapshot
from collector_fakes import FakeCluster, FakeCoordinators, description, producer
from test_lost_markers import lost_commit

from admin.live.evidence import observe
from admin.proposals.verified_marker import (
    CLAIM_LEASE_MS,
    EXIT_ALREADY_RESOLVED,
    EXIT_COLLISION,
    EXIT_DONE,
    EXIT_ERROR,
    EXIT_REFUSED,
    ActWith,
    Surroundings,
    abort,
    audit_records,
    commit,
    latest_candidates,
    look_around,
    render_show,
    show_json,
    stuck_groups,
)
from admin.wire.types import TP, GroupOffsets, ListingResult, Offsets
from detectors.abort import (
    candidate_age_ms,
    claim_holder,
    collision_signs,
    lso_lag,
    pending_candidates,
    plan_abort,
    post_check,
    refusal_name,
    resolved_by_audit,
    verify_abort,
    waiver_flags,
)
from detectors.contract import TRANSACTION_LOG_TOPIC
from detectors.models import (
    AbortCandidate,
    AuditOutcome,
    AuditRecord,
    CoordinatorState,
    LeaderProducer,
    LiveCoordinator,
    LiveEvidence,
    VerifyOutcome,
    VerifyResult,
    WriteTxnMarkersSpec,
)
from detectors.rules import classify

pytestmark = pytest.mark.unit

TPX: TP = ("orders", 0)


def candidate(*, coordinator_epoch: int = -1, since_ms: int = T0, **snap: Any) -> AbortCandidate:
    """Producer 1000's orphan on orders-0, judged without a coordinator view; the partition's leader still in the
    leader epoch its start batch was appended in (unless `snap` says otherwise)."""
    txn = open_txn(
        coordinator_epoch=coordinator_epoch,
        start_timestamp_ms=since_ms,
        last_timestamp_ms=since_ms,
        start_batch_leader_epoch=LEADER_EPOCH,
    )
    s = snapshot(txn, **{"leader_epoch": LEADER_EPOCH, **snap})
    verdict = classify(txn, s, None, now_ms=s.observed_at_ms, limits=LIMITS, view_current_ms=s.observed_at_ms)
    return plan_abort(s, txn, verdict, first_detected_ms=s.observed_at_ms)


def leader(**overrides: Any) -> LeaderProducer:
    fields: dict[str, Any] = {
        "producer_id": 1000,
        "producer_epoch": 5,
        "coordinator_epoch": -1,
        "current_txn_start_offset": 100,
        "last_timestamp_ms": T0,
    }
    fields.update(overrides)
    return LeaderProducer(**fields)


def owner(**overrides: Any) -> LiveCoordinator:
    fields: dict[str, Any] = {
        "transactional_id": "tx-1",
        "state": "CompleteCommit",
        "producer_id": 1000,
        "producer_epoch": 6,
        "partition_listed": False,
    }
    fields.update(overrides)
    return LiveCoordinator(**fields)


def live(**overrides: Any) -> LiveEvidence:
    fields: dict[str, Any] = {
        "observed_at_ms": T0 + 2 * MINUTE,
        "leader": 1,
        "producer": leader(),
        "last_stable_offset": 100,
        "high_watermark": 250,
        "coordinator": owner(),
        "leader_epoch": LEADER_EPOCH,
    }
    fields.update(overrides)
    return LiveEvidence(**fields)


# ------------------------------------------------------------------------------------------ verify


def test_unchanged_orphan_is_safe_with_coordinator_epoch_zero_never_minus_one() -> None:
    c = candidate()
    result = verify_abort(c, live())
    assert result.outcome is VerifyOutcome.SAFE and result.changes == ()
    assert result.marker == WriteTxnMarkersSpec(
        topic="orders", partition=0, producer_id=1000, producer_epoch=5, coordinator_epoch=0
    )


def test_leader_reported_coordinator_epoch_is_kept() -> None:
    c = candidate(coordinator_epoch=7)
    result = verify_abort(c, live(producer=leader(coordinator_epoch=7)))
    assert result.marker is not None and result.marker.coordinator_epoch == 7


@pytest.mark.parametrize(
    ("producer_row", "expected"),
    [
        (None, "no longer lists producer 1000"),
        (leader(current_txn_start_offset=-1), "has no open transaction on orders-0 any more"),
        (
            leader(current_txn_start_offset=180, producer_epoch=6),
            "another transaction open on orders-0 at offset 180",
        ),
    ],
    ids=["producer-gone", "committed-or-aborted", "newer-transaction"],
)
def test_transaction_no_longer_open_is_already_resolved(
    producer_row: LeaderProducer | None, expected: str
) -> None:
    result = verify_abort(candidate(), live(producer=producer_row))
    assert result.outcome is VerifyOutcome.ALREADY_RESOLVED and result.marker is None
    (line,) = result.changes
    assert expected in line


@pytest.mark.parametrize(
    ("evidence", "expected"),
    [
        (live(producer=leader(producer_epoch=6)), "producer epoch moved from 5 to 6"),
        (live(producer=leader(coordinator_epoch=4)), "coordinator epoch for producer 1000 moved from 0 to 4"),
        (live(producer=leader(current_txn_start_offset=90)), "starts at offset 90, not 100"),
        (
            live(coordinator=owner(state="Ongoing", partition_listed=True, producer_epoch=5)),
            "is Ongoing with orders-0 in its partitions",
        ),
        (live(coordinator=owner(state="PrepareCommit", partition_listed=True)), "is PrepareCommit"),
        (live(coordinator=owner(state="PrepareAbort", partition_listed=True)), "is PrepareAbort"),
        (live(coordinator=owner(state="PrepareEpochFence", partition_listed=True)), "is PrepareEpochFence"),
        # A Prepare state is never aborted by hand, listed or not, at the marker's epoch.
        (
            live(coordinator=owner(state="PrepareCommit", partition_listed=False, producer_epoch=5)),
            "never aborted by hand",
        ),
        (live(coordinator=None, coordinator_error="ListTransactions failed"), "cannot be checked"),
        (live(coordinator=owner(state="Frozen")), "does not know (Frozen)"),
    ],
    ids=[
        "epoch-moved",
        "coordinator-epoch-moved",
        "start-offset-moved",
        "live-ongoing",
        "prepare-commit",
        "prepare-abort",
        "prepare-epoch-fence",
        "prepare-unlisted",
        "coordinator-unreadable",
        "unknown-state",
    ],
)
def test_changed_or_unsafe_state_is_refused(evidence: LiveEvidence, expected: str) -> None:
    result = verify_abort(candidate(), evidence)
    assert result.outcome is VerifyOutcome.REFUSED and result.marker is None
    assert any(expected in line for line in result.changes), result.changes


def test_every_change_is_named() -> None:
    evidence = live(
        producer=leader(producer_epoch=6, coordinator_epoch=2),
        coordinator=owner(state="Ongoing", partition_listed=True),
    )
    result = verify_abort(candidate(), evidence)
    assert result.outcome is VerifyOutcome.REFUSED and len(result.changes) == 3


@pytest.mark.parametrize(
    "coordinator",
    [
        None,
        owner(state="Ongoing", partition_listed=False),
        owner(state="Empty"),
        owner(state="CompleteAbort"),
    ],
    ids=["no-owner", "ongoing-without-partition", "empty", "complete-abort"],
)
def test_coordinator_that_does_not_own_the_partition_allows_the_abort(
    coordinator: LiveCoordinator | None,
) -> None:
    assert verify_abort(candidate(), live(coordinator=coordinator)).outcome is VerifyOutcome.SAFE


def test_verify_result_has_a_marker_exactly_when_safe() -> None:
    spec = candidate().spec
    with pytest.raises(ValueError, match="exactly when"):
        VerifyResult(outcome=VerifyOutcome.REFUSED, marker=spec)
    with pytest.raises(ValueError, match="exactly when"):
        VerifyResult(outcome=VerifyOutcome.SAFE)


# -------------------------------------------------------------------------------------- post-check


def test_post_check() -> None:
    c = candidate()
    gone = leader(current_txn_start_offset=-1)
    assert post_check(c, live(producer=gone, last_stable_offset=251)).ok
    still = post_check(c, live(last_stable_offset=100))
    assert not still.ok and len(still.problems) == 2
    assert not post_check(c, live(producer=gone, last_stable_offset=None)).ok
    # Held by another, older open transaction: not this candidate's business.
    assert post_check(c, live(producer=gone, last_stable_offset=40, other_open=((7, 40),))).ok
    assert not post_check(c, live(producer=gone, last_stable_offset=40, other_open=((7, 120),))).ok


# ----------------------------------------------------------------------------------------- listing


def test_pending_candidates_are_filtered_and_sorted_by_lso_lag_then_age() -> None:
    small_lag_old = candidate(last_stable_offset=100, high_watermark=110)
    big_lag = candidate(topic="payments", last_stable_offset=100, high_watermark=900)
    small_lag_young = candidate(
        topic="audit",
        last_stable_offset=100,
        high_watermark=110,
        since_ms=T0 + 30 * MINUTE,
        observed_at_ms=T0 + 40 * MINUTE,
    )
    resolved = candidate(topic="gone").resolved(resolved_at_ms=T0 + HOUR)
    other_cluster = candidate(topic="elsewhere", cluster="staging")
    done = candidate(topic="aborted")
    now = T0 + HOUR
    pending = pending_candidates(
        [small_lag_young, resolved, small_lag_old, other_cluster, done, big_lag],
        cluster="prod",
        now_ms=now,
        done={done.candidate_id},
    )
    assert [c.topic for c in pending] == ["payments", "orders", "audit"]
    assert lso_lag(big_lag) == 800 and candidate_age_ms(small_lag_old, now) == HOUR


def test_latest_candidates_keep_the_last_record_per_key() -> None:
    c = candidate()
    resolved = c.resolved(resolved_at_ms=T0 + HOUR)
    other = candidate(topic="payments")
    key = c.candidate_id.encode()
    latest, malformed = latest_candidates(
        [
            (key, c.model_dump_json().encode()),
            (b"junk", b"{not json"),
            (other.candidate_id.encode(), other.model_dump_json().encode()),
            (key, resolved.model_dump_json().encode()),
            (other.candidate_id.encode(), None),  # tombstone
        ]
    )
    assert latest == {c.candidate_id: resolved} and malformed == 1


# --------------------------------------------------------------------------------- abort, scripted


@dataclass
class FakeProposalWire(FakeCluster):
    coordinators: FakeCoordinators = field(default_factory=FakeCoordinators)
    marker_errors: list[str | None] = field(default_factory=list)  # answers to successive markers; then None
    markers: list[tuple[int, dict[str, int | str]]] = field(default_factory=list)
    # What the leader shows once a marker was written (the transaction aborted).
    after_marker: dict[str, Any] = field(default_factory=dict)
    # Applied when metadata is read again after a leader move.
    on_move: dict[str, Any] = field(default_factory=dict)
    deny_describe: bool = False

    def broker_apis(self, brokers: Sequence[int]) -> dict[int, Mapping[int, tuple[int, int]]]:
        return self.coordinators.broker_apis(brokers)

    def list_transactions(self, **kwargs: Any) -> ListingResult:
        return self.coordinators.list_transactions(**kwargs)

    def describe_transactions(self, by_coordinator: Any) -> Any:
        answers = self.coordinators.describe_transactions(by_coordinator)
        if self.deny_describe:  # a principal without Describe on ids it was not granted
            return [
                a._replace(error="TRANSACTIONAL_ID_AUTHORIZATION_FAILED")
                if a.transactional_id not in self.coordinators.descriptions
                else a
                for a in answers
            ]
        return answers

    def committed_offsets(self, topic: str, partition: int) -> GroupOffsets:
        return GroupOffsets({})

    def write_abort_marker(self, broker: int, **marker: Any) -> str | None:
        self.markers.append((broker, marker))
        error = self.marker_errors.pop(0) if self.marker_errors else None
        if error is None and self.after_marker:
            self.producers[TPX] = self.after_marker["producers"]
            self.offsets[TPX] = self.after_marker["offsets"]
            # The owner as its coordinator shows it after the marker, if the test moves it.
            self.coordinators = self.after_marker.get("coordinators", self.coordinators)
        elif error == "NOT_LEADER_OR_FOLLOWER" and self.on_move:
            self.leaders.update(self.on_move.get("leaders", {}))
            if "producers" in self.on_move:
                self.producers[TPX] = self.on_move["producers"]
        return error


def scripted(**overrides: Any) -> FakeProposalWire:
    fields: dict[str, Any] = {
        "leaders": {TPX: 1, **{(TRANSACTION_LOG_TOPIC, p): 1 for p in range(3)}},
        "epochs": {TPX: LEADER_EPOCH},
        "producers": {TPX: [producer(coordinator_epoch=-1)]},
        "offsets": {TPX: Offsets(100, 250)},
        "coordinators": FakeCoordinators(
            {"tx-1": description(state="CompleteCommit", producer_epoch=6, partitions=(("orders", 1),))}
        ),
        "after_marker": {
            "producers": [producer(current_txn_start_offset=-1, coordinator_epoch=0)],
            "offsets": Offsets(251, 251),
        },
    }
    fields.update(overrides)
    return FakeProposalWire(**fields)


@dataclass
class FakeAuditLog:
    """The audit topic in memory; `others` are appended by "another execution" before each history read."""

    records: list[AuditRecord] = field(default_factory=list)
    others: list[list[AuditRecord]] = field(default_factory=list)

    def history(self, candidate_id: str) -> list[AuditRecord]:
        if self.others:
            self.records.extend(self.others.pop(0))
        return [r for r in self.records if r.candidate_id == candidate_id]

    def append(self, record: AuditRecord) -> None:
        self.records.append(record)


def run(
    wire: FakeProposalWire, *, execute: bool = True, audit_log: FakeAuditLog | None = None, **kwargs: Any
) -> AuditRecord:
    attempt = abort(
        wire,
        candidate(),
        execute=execute,
        audit_log=audit_log if audit_log is not None else FakeAuditLog(),
        actor="alice",
        clock_ms=lambda: T0 + HOUR,
        sleep=lambda _s: None,
        **kwargs,
    )
    assert (
        attempt.exit_code
        == {
            AuditOutcome.DRY_RUN: EXIT_DONE,
            AuditOutcome.ABORTED: EXIT_DONE,
            AuditOutcome.REFUSED: EXIT_REFUSED,
            AuditOutcome.ALREADY_RESOLVED: EXIT_ALREADY_RESOLVED,
            AuditOutcome.DENIED: EXIT_ERROR,
            AuditOutcome.FAILED: EXIT_ERROR,
            AuditOutcome.COLLISION: EXIT_COLLISION,
        }[attempt.audit.outcome]
    )
    return attempt.audit


def test_dry_run_verifies_and_writes_nothing() -> None:
    wire = scripted()
    record = run(wire, execute=False)
    assert record.outcome is AuditOutcome.DRY_RUN and wire.markers == [] and not record.marker_written
    assert record.actor == "alice" and record.before is not None and record.verify is not None


def test_execute_writes_one_marker_to_the_leader_and_post_checks() -> None:
    wire = scripted()
    record = run(wire)
    assert record.outcome is AuditOutcome.ABORTED and record.marker_written
    assert wire.markers == [
        (
            1,
            {
                "topic": "orders",
                "partition": 0,
                "producer_id": 1000,
                "producer_epoch": 5,
                "coordinator_epoch": 0,
                "transaction_result": "ABORT",
            },
        )
    ]
    assert record.after is not None and record.after.last_stable_offset == 251
    assert record.post_check is not None and record.post_check.ok


def test_leader_move_refreshes_metadata_once_and_reverifies() -> None:
    wire = scripted(marker_errors=["NOT_LEADER_OR_FOLLOWER"], on_move={"leaders": {TPX: 2}})
    record = run(wire)
    assert record.outcome is AuditOutcome.ABORTED and record.leader_moves == 1
    assert [broker for broker, _ in wire.markers] == [1, 2]


def test_state_changed_during_a_leader_move_is_refused_without_a_second_marker() -> None:
    moved = [producer(coordinator_epoch=-1, producer_epoch=6)]
    wire = scripted(
        marker_errors=["NOT_LEADER_OR_FOLLOWER"], on_move={"leaders": {TPX: 2}, "producers": moved}
    )
    record = run(wire)
    assert record.outcome is AuditOutcome.REFUSED and "epoch moved from 5 to 6" in record.message
    assert len(wire.markers) == 1 and not record.marker_written


def test_second_leader_move_is_an_error() -> None:
    wire = scripted(marker_errors=["NOT_LEADER_OR_FOLLOWER", "NOT_LEADER_OR_FOLLOWER"])
    record = run(wire)
    assert record.outcome is AuditOutcome.FAILED and len(wire.markers) == 2
    assert record.marker_written is False and "nothing was written" in record.message


def test_missing_cluster_acl_is_named_and_audited() -> None:
    wire = scripted(marker_errors=["CLUSTER_AUTHORIZATION_FAILED"])
    record = run(wire)
    assert record.outcome is AuditOutcome.DENIED and not record.marker_written
    assert "grant the ACL Alter on the cluster" in record.message


def test_a_marker_denied_by_a_broker_before_3_8_names_cluster_action() -> None:
    """Kafka 3.7 authorizes WriteTxnMarkers with ClusterAction on the cluster only (KIP-1037 added Alter in 3.8):
    the leader's ApiVersions (no ListTransactions v1) make the audit name ClusterAction, not Alter."""
    wire = scripted(marker_errors=["CLUSTER_AUTHORIZATION_FAILED"])
    wire.coordinators.before_3_8 = frozenset({1, 2, 3})
    record = run(wire)
    assert record.outcome is AuditOutcome.DENIED and not record.marker_written
    assert "grant the ACL ClusterAction on the cluster (this broker is older than Kafka 3.8" in record.message
    assert "grant the ACL Alter" not in record.message


@pytest.mark.parametrize("error", ["TRANSACTION_COORDINATOR_FENCED", "INVALID_PRODUCER_EPOCH"])
def test_marker_fenced_by_the_broker_is_a_refusal(error: str) -> None:
    record = run(scripted(marker_errors=[error]))
    assert record.outcome is AuditOutcome.REFUSED and error in record.message


def test_live_transaction_is_refused_before_any_marker() -> None:
    wire = scripted(coordinators=FakeCoordinators({"tx-1": description(state="Ongoing")}))
    record = run(wire)
    assert record.outcome is AuditOutcome.REFUSED and wire.markers == []
    assert "Ongoing with orders-0" in record.message


def test_transaction_ended_since_the_plan_is_refused_and_writes_nothing() -> None:
    wire = scripted(
        producers={TPX: [producer(current_txn_start_offset=-1)]}, offsets={TPX: Offsets(251, 251)}
    )
    record = run(wire)
    assert record.outcome is AuditOutcome.REFUSED and wire.markers == []
    assert "changed since the plan" in record.message and "committed or aborted" in record.message
    assert record.verify is not None and record.verify.outcome is VerifyOutcome.ALREADY_RESOLVED
    assert resolved_by_audit([record]) == {record.candidate_id}  # `list` stops showing it


def test_second_execution_after_our_abort_is_a_no_op() -> None:
    log = FakeAuditLog()
    first = run(scripted(), audit_log=log)
    log.append(first)
    wire = scripted()
    second = run(wire, audit_log=log)
    assert first.outcome is AuditOutcome.ABORTED
    assert second.outcome is AuditOutcome.ALREADY_RESOLVED and wire.markers == []
    assert "aborted by alice" in second.message and first.audit_id in second.message


def _other(outcome: AuditOutcome, audit_id: str = "other", at_ms: int = T0 + HOUR) -> AuditRecord:
    template = run(scripted(), execute=False)
    return template.model_copy(
        update={"audit_id": audit_id, "actor": "bob", "outcome": outcome, "at_ms": at_ms}
    )


def test_execute_claims_before_the_marker_and_verifies_again() -> None:
    log = FakeAuditLog()
    record = run(scripted(), audit_log=log)
    (claim,) = log.records
    assert claim.outcome is AuditOutcome.CLAIMED and claim.audit_id == record.audit_id and claim.execute
    assert record.outcome is AuditOutcome.ABORTED


def test_dry_run_takes_no_claim() -> None:
    log = FakeAuditLog()
    run(scripted(), execute=False, audit_log=log)
    assert log.records == []


def test_concurrent_execution_waits_for_the_holder_and_writes_nothing() -> None:
    # bob claimed first; by our second look at the log he has aborted it.
    bob_claim = _other(AuditOutcome.CLAIMED)
    log = FakeAuditLog(others=[[bob_claim], [], [_other(AuditOutcome.ABORTED)]])
    wire = scripted()
    record = run(wire, audit_log=log)
    assert record.outcome is AuditOutcome.ALREADY_RESOLVED and wire.markers == []
    assert "aborted by bob" in record.message


def test_concurrent_execution_refuses_when_the_holder_does_not_end() -> None:
    log = FakeAuditLog(others=[[_other(AuditOutcome.CLAIMED)]])
    wire = scripted()
    record = run(wire, audit_log=log, claim_wait_s=0)
    assert record.outcome is AuditOutcome.REFUSED and wire.markers == []
    assert "another execution holds this candidate: bob" in record.message


def test_holder_that_failed_releases_the_claim() -> None:
    log = FakeAuditLog(others=[[_other(AuditOutcome.CLAIMED)], [], [_other(AuditOutcome.FAILED)]])
    record = run(scripted(), audit_log=log)
    assert record.outcome is AuditOutcome.ABORTED


def test_expired_claim_of_a_crashed_run_does_not_block() -> None:
    stale = _other(AuditOutcome.CLAIMED, at_ms=T0 + HOUR - CLAIM_LEASE_MS - 1)
    record = run(scripted(), audit_log=FakeAuditLog(others=[[stale]]))
    assert record.outcome is AuditOutcome.ABORTED


def test_claim_holder_is_the_first_live_claim() -> None:
    a, b = _other(AuditOutcome.CLAIMED, "a"), _other(AuditOutcome.CLAIMED, "b")
    now = T0 + HOUR
    assert claim_holder([a, b], now_ms=now, lease_ms=1000) == a
    assert claim_holder([a, b, _other(AuditOutcome.REFUSED, "a")], now_ms=now, lease_ms=1000) == b
    assert claim_holder([a], now_ms=now + 1000, lease_ms=1000) is None


def test_no_owner_is_shown_by_a_describe_probe() -> None:
    wire = scripted(coordinators=FakeCoordinators({}))  # nobody owns producer 1000
    record = run(wire)
    assert record.outcome is AuditOutcome.ABORTED
    assert any(
        any(i.startswith("txnwatch-describe-probe-") for i in ids) for ids in wire.coordinators.described
    )


def test_no_owner_without_describe_on_every_id_is_refused() -> None:
    wire = scripted(coordinators=FakeCoordinators({}), deny_describe=True)
    record = run(wire)
    assert record.outcome is AuditOutcome.REFUSED and wire.markers == []
    assert "grant the ACL Describe on TransactionalId '*'" in record.message


def test_failed_post_check_is_an_error_with_the_marker_written() -> None:
    wire = scripted(after_marker={})  # the leader keeps showing the transaction open
    record = run(wire, post_check_timeout_s=0)
    assert record.outcome is AuditOutcome.FAILED and record.marker_written
    assert "post-check failed" in record.message


def test_unreachable_leader_is_an_error() -> None:
    wire = scripted(down={1})
    record = run(wire)
    assert record.outcome is AuditOutcome.FAILED and "cannot verify" in record.message and wire.markers == []


def test_audit_records_round_trip_and_done_ids() -> None:
    aborted = run(scripted())
    refused = run(scripted(marker_errors=["INVALID_PRODUCER_EPOCH"]))
    records, malformed = audit_records(
        [(b"k", aborted.model_dump_json().encode()), (b"k", refused.model_dump_json().encode()), (b"k", b"x")]
    )
    assert records == [aborted, refused] and malformed == 1
    assert resolved_by_audit(records) == {aborted.candidate_id}


def test_marker_lost_in_flight_is_an_error_of_unknown_effect() -> None:
    record = run(scripted(marker_errors=["REQUEST_TIMED_OUT"]))
    assert record.outcome is AuditOutcome.FAILED and record.marker_written is None
    assert "may or may not have been written" in record.message


def test_stuck_groups_are_those_at_or_past_the_lso() -> None:
    groups = GroupOffsets({"billing": 100, "reports": 250, "slow": 42})
    assert stuck_groups(live(last_stable_offset=100), groups) == {"billing": 100, "reports": 250}
    assert stuck_groups(live(last_stable_offset=None), groups) == {}


def test_show_reads_the_named_id_when_it_no_longer_owns_the_producer() -> None:
    txn = open_txn(
        coordinator_epoch=-1,
        start_timestamp_ms=T0,
        last_timestamp_ms=T0,
        start_batch_leader_epoch=LEADER_EPOCH,
    )
    s = snapshot(txn, leader_epoch=LEADER_EPOCH)
    record = coord(state=CoordinatorState.COMPLETE_COMMIT, partitions=(), last_update_timestamp_ms=T0 + 1)
    verdict = classify(
        txn, s, record, now_ms=s.observed_at_ms, limits=LIMITS, view_current_ms=s.observed_at_ms
    )
    c = plan_abort(s, txn, verdict, first_detected_ms=s.observed_at_ms)
    assert c.evidence.coordinator is not None and c.evidence.coordinator.transactional_id == "tx-1"
    # tx-1 has moved on to another producer id: nobody owns producer 1000 now.
    wire = scripted(coordinators=FakeCoordinators({"tx-1": description(producer_id=2000, state="Ongoing")}))
    live_now = observe(wire, c, sleep=lambda _s: None)
    assert live_now.coordinator is None and live_now.coordinator_error is None
    around = look_around(wire, c, live_now)
    assert around.named is not None and (around.named.producer_id, around.named.state) == (2000, "Ongoing")
    shown = render_show(
        c, live_now, verify_abort(c, live_now), ActWith("b:9092", "prod", "txnwatch"), T0, around
    )
    assert "tx-1 (named by the evidence) now: Ongoing, producer 2000" in shown


# ------------------------------------------------------------------------ a live owner at the marker's epoch


def judged(client_transaction_version: int) -> AbortCandidate:
    """An orphan proven coordinator-completed against its owner's own record: tx-1, producer 1000 at epoch 5 (the
    orphan's), CompleteCommit without orders-0, written by a client of that transaction version."""
    txn = open_txn(
        coordinator_epoch=-1,
        start_timestamp_ms=T0,
        last_timestamp_ms=T0,
        start_batch_leader_epoch=LEADER_EPOCH,
    )
    s = snapshot(txn, leader_epoch=LEADER_EPOCH)
    record = coord(
        state=CoordinatorState.COMPLETE_COMMIT,
        partitions=(),
        last_update_timestamp_ms=T0 + 1,
        client_transaction_version=client_transaction_version,
    )
    verdict = classify(
        txn, s, record, now_ms=s.observed_at_ms, limits=LIMITS, view_current_ms=s.observed_at_ms
    )
    return plan_abort(s, txn, verdict, first_detected_ms=s.observed_at_ms)


@pytest.mark.parametrize("state", ["CompleteCommit", "CompleteAbort", "Empty", "Ongoing"])
def test_owner_live_at_the_markers_epoch_is_refused_by_name(state: str) -> None:
    """Under TV0/TV1 every transaction of tx-1 runs at epoch 5 until it initialises again: any of them that adds
    orders-0 writes into the orphan's open transaction, which the marker at epoch 5 would abort."""
    result = verify_abort(judged(0), live(coordinator=owner(state=state, producer_epoch=5)))
    assert result.outcome is VerifyOutcome.REFUSED and result.marker is None and result.waived == ()
    (line,) = result.changes
    assert line.startswith(
        "live-owner-same-epoch: transactional id tx-1 owns producer 1000 at epoch 5, the marker's, and is live "
        f"({state}, transaction version 0 or unknown)"
    )
    assert "run again with --allow-live-owner" in line and "restart that producer" in line


def test_a_transaction_version_2_owner_at_the_markers_epoch_is_refused_too() -> None:
    """Under TV2 the epoch moves at the end of each transaction, and the Complete record carries the epoch the
    next transaction writes with (`TransactionMetadata.prepareComplete`): an owner at the marker's epoch runs, or
    is about to run, a transaction at it."""
    result = verify_abort(judged(2), live(coordinator=owner(state="CompleteCommit", producer_epoch=5)))
    assert result.outcome is VerifyOutcome.REFUSED
    assert "(CompleteCommit, transaction version 2)" in result.changes[0]


@pytest.mark.parametrize(
    "coordinator",
    [
        owner(state="CompleteCommit", producer_epoch=6),
        owner(state="Ongoing", producer_epoch=6),
        owner(state="Dead", producer_epoch=5),
        owner(state="CompleteCommit", producer_epoch=5, producer_id=2000),
        None,
    ],
    ids=["fenced", "fenced-ongoing", "dead", "moved-to-another-producer-id", "no-owner"],
)
def test_owner_not_live_at_the_markers_epoch_does_not_refuse(coordinator: LiveCoordinator | None) -> None:
    result = verify_abort(judged(0), live(coordinator=coordinator))
    assert result.outcome is VerifyOutcome.SAFE and result.waived == ()


def test_allow_live_owner_waives_that_refusal_and_keeps_it_on_record() -> None:
    c, evidence = judged(0), live(coordinator=owner(state="CompleteCommit", producer_epoch=5))
    refused = verify_abort(c, evidence)
    allowed = verify_abort(c, evidence, allow_live_owner=True)
    assert allowed.outcome is VerifyOutcome.SAFE and allowed.changes == ()
    assert allowed.waived == refused.changes and allowed.marker is not None
    assert allowed.waived[0].startswith("live-owner-same-epoch: transactional id tx-1")


def test_allow_live_owner_waives_nothing_else() -> None:
    moved = live(
        producer=leader(producer_epoch=6), coordinator=owner(state="CompleteCommit", producer_epoch=5)
    )
    result = verify_abort(candidate(), moved, allow_live_owner=True)
    assert result.outcome is VerifyOutcome.REFUSED and result.changes == ("producer epoch moved from 5 to 6",)
    assert result.waived[0].startswith("live-owner-same-epoch")
    # A stronger refusal says more than the live owner: the coordinator owns the partition.
    listed = live(coordinator=owner(state="Ongoing", producer_epoch=5, partition_listed=True))
    result = verify_abort(candidate(), listed, allow_live_owner=True)
    assert result.outcome is VerifyOutcome.REFUSED and result.waived == ()
    assert "Ongoing with orders-0" in result.changes[0]


def test_an_owner_past_the_markers_epoch_committing_elsewhere_does_not_stop_the_abort() -> None:
    """A TV2 owner moves its epoch every transaction and is caught in PrepareCommit of one on other partitions
    now and then: that transaction is not the orphan's and writes no marker to its partition."""
    busy = live(coordinator=owner(state="PrepareCommit", producer_epoch=9, partition_listed=False))
    assert verify_abort(judged(2), busy).outcome is VerifyOutcome.SAFE
    listed = live(coordinator=owner(state="PrepareCommit", producer_epoch=9, partition_listed=True))
    assert verify_abort(judged(2), listed).outcome is VerifyOutcome.REFUSED


def test_a_live_owner_caught_committing_elsewhere_is_named_beside_its_prepare_state() -> None:
    """A busy owner at the marker's epoch is in PrepareCommit of a transaction on other partitions about as often
    as not: the refusal names the Prepare state and the live owner, so the operator learns to restart the
    producer rather than to retry; no flag gets it through while the coordinator writes markers."""
    c = judged(0)
    busy = live(coordinator=owner(state="PrepareCommit", producer_epoch=5, partition_listed=False))
    result = verify_abort(c, busy)
    assert result.outcome is VerifyOutcome.REFUSED
    assert [refusal_name(line) for line in result.changes][-1] == "live-owner-same-epoch"
    assert any("never aborted by hand" in line for line in result.changes)
    assert waiver_flags(result) == ()
    waived = verify_abort(c, busy, allow_live_owner=True)
    assert waived.outcome is VerifyOutcome.REFUSED and waived.waived[0].startswith("live-owner-same-epoch")
    # Writing this partition's markers is a stronger refusal: the live owner is not added.
    listed = live(coordinator=owner(state="PrepareCommit", producer_epoch=5, partition_listed=True))
    assert not any(line.startswith("live-owner-same-epoch") for line in verify_abort(c, listed).changes)


@pytest.mark.parametrize(
    ("evidence", "offered"),
    [
        (live(coordinator=owner(state="CompleteCommit", producer_epoch=5)), True),
        (live(coordinator=owner(state="Empty", producer_epoch=6)), False),
        (
            live(
                producer=leader(producer_epoch=6), coordinator=owner(state="CompleteCommit", producer_epoch=5)
            ),
            False,
        ),
    ],
    ids=["live-owner-the-one-refusal", "owner-restarted-safe", "live-owner-and-epoch-moved"],
)
def test_show_offers_allow_live_owner_only_when_that_refusal_is_all_that_stops_the_abort(
    evidence: LiveEvidence, offered: bool
) -> None:
    """`show`'s ready-made command: the flag only when verification refuses for `live-owner-same-epoch` alone;
    then beside the plain command (after the owner's restart it needs no flag). A safe abort needs no flag, and
    with another refusal the flag would not get it through."""
    c, act = judged(0), ActWith("b:9092", "prod", "txnwatch")
    verify = verify_abort(c, evidence)
    around = Surroundings(GroupOffsets({}))
    shown = render_show(c, evidence, verify, act, T0, around)
    flagged = act.txnwatch(c, allow_live_owner=True)
    assert flagged.endswith("--execute --allow-live-owner") and act.txnwatch(c).endswith("--execute")
    assert show_json(c, evidence, verify, act, T0, around)["act"]["txnwatch_allow_live_owner"] == (
        flagged if offered else None
    )
    acts = "\n".join(line for line in shown.splitlines() if line.lstrip().startswith("act"))
    assert ("--allow-live-owner" in acts) is offered
    if offered:
        assert f"act (once tx-1's producer restarted):  {act.txnwatch(c)}" in shown
        assert f"act (only if tx-1 no longer writes to orders-0):  {flagged}" in shown


def live_owner_cluster(**overrides: Any) -> FakeProposalWire:
    """tx-1 owns producer 1000 at epoch 5, the orphan's, CompleteCommit on another partition."""
    owner_now = description(
        state="CompleteCommit", producer_epoch=5, partitions=(("orders", 1),), start_time_ms=T0
    )
    return scripted(coordinators=FakeCoordinators({"tx-1": owner_now}), **overrides)


def owner_adds_the_partition(*, producer_epoch: int = 5) -> dict[str, Any]:
    """What the cluster shows after the marker when tx-1 began a transaction, added orders-0 and wrote there
    (sequence 10) between verification and the marker: the leader has nothing open, the LSO moved on."""
    moved = description(
        state="Ongoing",
        producer_epoch=producer_epoch,
        partitions=(("orders", 0), ("orders", 1)),
        start_time_ms=T0 + HOUR,
    )
    return {
        "producers": [producer(current_txn_start_offset=-1, coordinator_epoch=0, last_sequence=10)],
        "offsets": Offsets(252, 252),
        "coordinators": FakeCoordinators({"tx-1": moved}),
    }


def test_live_owner_is_refused_before_any_marker() -> None:
    wire = live_owner_cluster()
    record = run(wire)
    assert record.outcome is AuditOutcome.REFUSED and wire.markers == [] and not record.marker_written
    assert "live-owner-same-epoch: transactional id tx-1 owns producer 1000 at epoch 5" in record.message
    assert record.allow_live_owner is False


def test_allow_live_owner_aborts_and_the_audit_says_so() -> None:
    log = FakeAuditLog()
    wire = live_owner_cluster()
    record = run(wire, audit_log=log, allow_live_owner=True)
    assert record.outcome is AuditOutcome.ABORTED and len(wire.markers) == 1 and record.collision == ()
    assert record.allow_live_owner and record.verify is not None
    assert record.verify.waived[0].startswith("live-owner-same-epoch")
    assert record.message.endswith(
        "--allow-live-owner waived live-owner-same-epoch, and the owner did not move before the marker"
    )
    (claim,) = log.records
    assert claim.allow_live_owner
    dry = run(live_owner_cluster(), execute=False, allow_live_owner=True)
    assert dry.outcome is AuditOutcome.DRY_RUN
    assert "with --allow-live-owner waiving: live-owner-same-epoch: transactional id tx-1" in dry.message


def test_owner_that_adds_the_partition_before_the_marker_is_a_collision() -> None:
    """Verified with tx-1 live at the marker's epoch (the flag given); between verification and the marker tx-1
    adds orders-0 and writes there. The post-check passes (the orphan is gone, the LSO moved), yet the run ends
    COLLISION, exit 5, with each sign named and what it means."""
    wire = live_owner_cluster(after_marker=owner_adds_the_partition())
    record = run(wire, allow_live_owner=True)
    assert record.outcome is AuditOutcome.COLLISION and record.marker_written is True
    assert record.post_check is not None and record.post_check.ok and len(wire.markers) == 1
    assert record.collision == (
        "tx-1 now lists orders-0 in its transaction: it added the partition between verification and the marker",
        "tx-1 moved from CompleteCommit to Ongoing",
        f"tx-1 began a transaction since verification (its start moved from {T0} to {T0 + HOUR} ms)",
        "the leader of orders-0 took records of producer 1000 since verification (its last sequence moved from 9 "
        "to 10)",
    )
    assert record.message.startswith(
        "COLLISION: marker written by broker 1, post-check passed (orders-0 LSO 252 is past offset 100), but the "
        "owner of producer 1000 at the marker's epoch moved: tx-1 now lists orders-0"
    )
    assert "its commit still succeeds on its other partitions" in record.message
    assert "tell its owners now" in record.message


def test_owner_unreadable_after_the_marker_is_a_collision_it_cannot_exclude() -> None:
    unreadable = {
        **owner_adds_the_partition(),
        "coordinators": FakeCoordinators(
            {"tx-1": description(state="CompleteCommit", producer_epoch=5, partitions=(("orders", 1),))},
            failed={1: "COORDINATOR_NOT_AVAILABLE"},
        ),
    }
    unreadable["producers"] = [producer(current_txn_start_offset=-1, coordinator_epoch=0)]
    record = run(live_owner_cluster(after_marker=unreadable), allow_live_owner=True)
    assert record.outcome is AuditOutcome.COLLISION
    (sign,) = record.collision
    assert sign.startswith("the owner of producer 1000 could not be read again after the marker (")


def test_a_fenced_owner_that_moves_is_no_collision() -> None:
    """At epoch 6 the owner cannot write into the orphan's epoch-5 transaction: a batch of it would have raised
    the leader's epoch and the marker would have been fenced. Its moves are its own business."""
    fenced = description(
        state="CompleteCommit", producer_epoch=6, partitions=(("orders", 1),), start_time_ms=T0
    )
    wire = scripted(
        coordinators=FakeCoordinators({"tx-1": fenced}),
        after_marker={
            **owner_adds_the_partition(producer_epoch=6),
            "producers": [producer(current_txn_start_offset=-1)],
        },
    )
    record = run(wire)
    assert record.outcome is AuditOutcome.ABORTED and record.collision == ()


def test_a_collision_is_the_abort_for_later_runs() -> None:
    log = FakeAuditLog()
    first = run(
        live_owner_cluster(after_marker=owner_adds_the_partition()), audit_log=log, allow_live_owner=True
    )
    log.append(first)
    wire = live_owner_cluster()
    second = run(wire, audit_log=log)
    assert first.outcome is AuditOutcome.COLLISION
    assert second.outcome is AuditOutcome.ALREADY_RESOLVED and wire.markers == []
    assert resolved_by_audit([first]) == {first.candidate_id}


def test_a_write_the_coordinator_never_listed_shows_at_the_leader() -> None:
    """A TV2 client's batch at the epoch of a transaction already open on the partition skips the leader's
    verification (`UnifiedLog.hasOngoingTransaction`), so its coordinator never lists the partition: only the
    leader's last sequence for the producer shows the write."""
    c = candidate()
    before = live(producer=leader(last_sequence=9), coordinator=owner(state="Ongoing", producer_epoch=5))
    after = live(
        producer=leader(current_txn_start_offset=-1, last_sequence=12),
        last_stable_offset=260,
        coordinator=owner(state="Ongoing", producer_epoch=5),
    )
    assert collision_signs(c, before, after) == (
        "the leader of orders-0 took records of producer 1000 since verification (its last sequence moved from 9 "
        "to 12)",
    )
    assert collision_signs(c, before, before) == ()
    fenced = live(producer=leader(last_sequence=9), coordinator=owner(state="Ongoing", producer_epoch=6))
    assert collision_signs(c, fenced, after.model_copy(update={"coordinator": fenced.coordinator})) == ()


# ------------------------------------------------------- proposals commit: a lost commit marker, on a scripted cluster


def commit_cluster(**overrides: Any) -> FakeProposalWire:
    """orders-0 holds producer 1000's transaction open at 100 (epoch 5, coordinator epoch 3) after tx-1 committed it
    (CompleteCommit, its PrepareCommit listed orders-0); tx-1 now at epoch 6. The marker ends it."""
    fields: dict[str, Any] = {
        "producers": {TPX: [producer()]},
        "coordinators": FakeCoordinators(
            {
                "tx-1": description(
                    state="CompleteCommit", producer_epoch=6, start_time_ms=T0 - 100, partitions=()
                )
            }
        ),
        "after_marker": {
            "producers": [producer(current_txn_start_offset=-1)],
            "offsets": Offsets(251, 251),
        },
    }
    fields.update(overrides)
    return scripted(**fields)


def run_commit(
    wire: FakeProposalWire,
    c: AbortCandidate | None = None,
    *,
    first_visible: int | None = 100,
    execute: bool = True,
    audit_log: FakeAuditLog | None = None,
    **kwargs: Any,
) -> tuple[AuditRecord, int, list[int]]:
    """`commit` on the scripted cluster; (its audit record, exit code, the offsets the read_committed reader was
    asked from)."""
    asked: list[int] = []

    def read_committed(candidate_: AbortCandidate) -> int | None:
        asked.append(candidate_.start_offset)
        return first_visible

    attempt = commit(
        wire,
        c if c is not None else lost_commit(),
        read_committed=read_committed,
        execute=execute,
        audit_log=audit_log if audit_log is not None else FakeAuditLog(),
        actor="alice",
        clock_ms=lambda: T0 + HOUR,
        sleep=lambda _s: None,
        **kwargs,
    )
    return attempt.audit, attempt.exit_code, asked


def test_commit_writes_one_commit_marker_and_reads_the_records_back() -> None:
    wire = commit_cluster()
    record, code, asked = run_commit(wire)
    assert (record.outcome, code) == (AuditOutcome.COMMITTED, EXIT_DONE) and record.marker_written
    assert wire.markers == [
        (
            1,
            {
                "topic": "orders",
                "partition": 0,
                "producer_id": 1000,
                "producer_epoch": 5,
                "coordinator_epoch": 3,
                "transaction_result": "COMMIT",
            },
        )
    ]
    assert asked == [100] and "a read_committed reader gets offset 100" in record.message
    assert record.message.startswith("committed: COMMIT marker written by broker 1")
    assert record.post_check is not None and record.post_check.ok
    assert resolved_by_audit([record]) == {record.candidate_id}


def test_commit_dry_run_verifies_and_writes_nothing() -> None:
    wire = commit_cluster()
    record, code, asked = run_commit(wire, execute=False)
    assert (record.outcome, code, wire.markers, asked) == (AuditOutcome.DRY_RUN, EXIT_DONE, [], [])
    assert "safe to commit now" in record.message and "add --execute to commit" in record.message


def run_abort_of(wire: FakeProposalWire, c: AbortCandidate) -> AuditRecord:
    attempt = abort(
        wire,
        c,
        execute=True,
        audit_log=FakeAuditLog(),
        actor="alice",
        clock_ms=lambda: T0 + HOUR,
        sleep=lambda _s: None,
    )
    assert attempt.exit_code == (EXIT_REFUSED if attempt.audit.outcome is AuditOutcome.REFUSED else EXIT_DONE)
    return attempt.audit


def test_abort_refuses_a_lost_commit_by_name_and_writes_nothing() -> None:
    wire = commit_cluster()
    record = run_abort_of(wire, lost_commit())
    assert record.outcome is AuditOutcome.REFUSED and wire.markers == [] and not record.marker_written
    assert "lost-commit-marker: " in record.message and "txnwatch proposals commit" in record.message


def test_commit_refuses_an_abort_candidate_by_name_and_writes_nothing() -> None:
    wire = scripted()  # an orphan no coordinator owns: its marker is ABORT
    record, code, _ = run_commit(wire, candidate())
    assert (record.outcome, code, wire.markers) == (AuditOutcome.REFUSED, EXIT_REFUSED, [])
    assert "abort-candidate: " in record.message and "txnwatch proposals abort" in record.message


def test_commit_whose_records_stay_hidden_from_read_committed_fails_its_post_check() -> None:
    # The LSO moved and the transaction is gone, but the reader skips it: not the COMMIT that was meant.
    record, code, asked = run_commit(commit_cluster(), first_visible=101, post_check_timeout_s=0)
    assert (record.outcome, code) == (AuditOutcome.FAILED, EXIT_ERROR) and record.marker_written
    assert "skips offset 100" in record.message and asked == [100]


def test_commit_refused_while_the_coordinator_contradicts_it() -> None:
    # tx-1's record of the same transaction (its start) says CompleteAbort now: its log went back and on.
    aborted_now = FakeCoordinators(
        {"tx-1": description(state="CompleteAbort", producer_epoch=6, start_time_ms=T0 - 100, partitions=())}
    )
    wire = commit_cluster(coordinators=aborted_now)
    record, code, _ = run_commit(wire)
    assert (record.outcome, code, wire.markers) == (AuditOutcome.REFUSED, EXIT_REFUSED, [])
    assert "coordinator-contradicts-commit: " in record.message


def test_second_commit_after_ours_is_a_no_op() -> None:
    log = FakeAuditLog()
    first, _, _ = run_commit(commit_cluster(), audit_log=log)
    log.append(first)
    wire = commit_cluster()
    second, code, _ = run_commit(wire, audit_log=log)
    assert (second.outcome, code, wire.markers) == (AuditOutcome.ALREADY_RESOLVED, EXIT_ALREADY_RESOLVED, [])
    assert "committed by alice" in second.message and first.audit_id in second.message
