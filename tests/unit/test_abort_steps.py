"""The verified abort's named steps one at a time (admin/proposals/verified_marker.py): plan, the audit history, verifying what
was read, the marker's answer, the claim on a fake clock, the post-check's ending. The whole flow on a scripted
cluster is tests/unit/test_verified_abort.py; on a real broker, tests/broker/test_abort_races.py."""

from __future__ import annotations

import pytest
from builders import HOUR, T0
from kafka.protocol.broker_version_data import BROKER_API_VERSIONS
from test_lost_markers import lost_commit
from test_verified_abort import FakeAuditLog, candidate, commit_cluster, leader, live, owner, scripted

from admin.proposals.verified_marker import (
    LOOK_UP_LEADER_AGAIN,
    MARKER_WRITTEN,
    AbortAttempt,
    AfterMarker,
    Attempt,
    MarkerEnding,
    Verified,
    audit_history_ending,
    claim,
    dry_run_ending,
    ended_by_another,
    marker_answer,
    plan,
    post_check_ending,
    post_check_until,
    verified_or_ending,
    verify_live,
)
from admin.wire.errors import AdminError
from admin.wire.versions import BrokerApis
from detectors.abort import post_check, verify_abort
from detectors.models import AbortCandidate, AuditOutcome, AuditRecord, VerifyOutcome

pytestmark = pytest.mark.unit

NOW = T0 + HOUR
# What brokers of these releases answer to ApiVersions (kafka-python's table, recorded from real brokers).
KAFKA_3_7, KAFKA_3_8, KAFKA_4_3 = (BROKER_API_VERSIONS[v] for v in ((3, 7), (3, 8), (4, 3)))


def attempt(*, execute: bool = True) -> Attempt:
    return plan(candidate(), execute=execute, actor="alice", clock_ms=lambda: NOW, audit_id="a1")


def verified() -> Verified:
    a = attempt()
    checked = verified_or_ending(a, live(), verify_abort(a.candidate, live()), moves=0)
    assert isinstance(checked, Verified)
    return checked


def test_plan_stamps_every_record_with_the_candidates_plan() -> None:
    a = attempt()
    r = a.record(AuditOutcome.CLAIMED, "claimed")
    assert (r.audit_id, r.actor, r.execute, r.at_ms) == ("a1", "alice", True, NOW)
    assert r.plan == a.candidate.spec and r.candidate_id == a.candidate.candidate_id
    assert plan(candidate(), execute=False, actor="x", clock_ms=lambda: NOW).base["audit_id"] != "a1"


def test_audit_history_ends_the_run_when_the_candidate_was_aborted() -> None:
    a = attempt()
    assert audit_history_ending(a, FakeAuditLog()) is None
    aborted = a.record(AuditOutcome.ABORTED, "aborted")
    ended = audit_history_ending(attempt(), FakeAuditLog(records=[aborted]))
    assert ended is not None and ended.audit.outcome is AuditOutcome.ALREADY_RESOLVED
    assert ended.exit_code == 4 and "aborted by alice" in ended.audit.message


def test_audit_history_that_cannot_be_read_is_a_failure() -> None:
    class Broken(FakeAuditLog):
        def history(self, candidate_id: str) -> list[AuditRecord]:
            raise AdminError("denied")

    ended = audit_history_ending(attempt(), Broken())
    assert (
        ended is not None and ended.audit.outcome is AuditOutcome.FAILED and "denied" in ended.audit.message
    )


def test_a_safe_verification_goes_on_with_its_marker() -> None:
    v = verified()
    assert v.marker.coordinator_epoch == 0 and v.context["leader_moves"] == 0
    assert v.verify.outcome is VerifyOutcome.SAFE


def test_a_refused_verification_ends_the_run_with_nothing_written() -> None:
    a = attempt()
    changed = live(producer=None, last_stable_offset=251, high_watermark=251)
    ended = verified_or_ending(a, changed, verify_abort(a.candidate, changed), moves=1)
    assert isinstance(ended, AbortAttempt) and ended.audit.outcome is AuditOutcome.REFUSED
    assert "no marker written" in ended.audit.message and ended.audit.leader_moves == 1


def test_dry_run_ends_once_verified() -> None:
    ended = dry_run_ending(attempt(execute=False), verified())
    assert ended.audit.outcome is AuditOutcome.DRY_RUN and ended.exit_code == 0
    assert "leader 1, coordinator epoch 0" in ended.audit.message


def test_verify_live_reads_the_scripted_cluster() -> None:
    got = verify_live(scripted(), attempt(), moves=0, sleep=lambda _s: None)
    assert isinstance(got, Verified) and got.before.leader == 1


def test_unreadable_leader_keeps_the_previous_verification() -> None:
    previous = verified()
    ended = verify_live(scripted(down={1}), attempt(), moves=1, previous=previous, sleep=lambda _s: None)
    assert isinstance(ended, AbortAttempt) and ended.audit.outcome is AuditOutcome.FAILED
    assert ended.audit.before == previous.before and "cannot verify" in ended.audit.message


@pytest.mark.parametrize(
    ("error", "moves", "outcome", "written"),
    [
        pytest.param("NOT_LEADER_OR_FOLLOWER", 1, AuditOutcome.FAILED, False, id="second-leader-move-fails"),
        pytest.param("INVALID_PRODUCER_EPOCH", 0, AuditOutcome.REFUSED, False, id="fenced-is-a-refusal"),
        pytest.param("CLUSTER_AUTHORIZATION_FAILED", 0, AuditOutcome.DENIED, False, id="acl-is-named"),
        pytest.param("REQUEST_TIMED_OUT", 0, AuditOutcome.FAILED, None, id="unknown-error-may-have-written"),
    ],
)
def test_marker_errors_end_the_run(
    error: str, moves: int, outcome: AuditOutcome, written: bool | None
) -> None:
    answer = marker_answer(error, leader=3, moves=moves, leader_apis=KAFKA_4_3)
    assert isinstance(answer, MarkerEnding)
    ended = attempt().end(answer.outcome, answer.message, **answer.fields)
    assert ended.audit.outcome is outcome and ended.audit.marker_written is written
    assert error in ended.audit.message


def test_marker_written_and_first_leader_move() -> None:
    assert marker_answer(None, leader=1, moves=0, leader_apis=KAFKA_4_3) == MARKER_WRITTEN
    assert (
        marker_answer("NOT_LEADER_OR_FOLLOWER", leader=1, moves=0, leader_apis=KAFKA_4_3)
        == LOOK_UP_LEADER_AGAIN
    )
    assert marker_answer("UNKNOWN_BROKER", leader=1, moves=0, leader_apis=KAFKA_4_3) == LOOK_UP_LEADER_AGAIN


@pytest.mark.parametrize(
    ("leader_apis", "acl"),
    [
        pytest.param(KAFKA_4_3, "Alter on the cluster (Kafka 3.8+, KIP-1037; or ClusterAction", id="4.3"),
        pytest.param(KAFKA_3_8, "Alter on the cluster (Kafka 3.8+, KIP-1037; or ClusterAction", id="3.8"),
        pytest.param(
            KAFKA_3_7, "ClusterAction on the cluster (this broker is older than Kafka 3.8", id="3.7"
        ),
        pytest.param({}, "ClusterAction on the cluster (this broker is older than Kafka 3.8", id="unknown"),
    ],
)
def test_a_denied_marker_names_the_acl_of_the_leaders_release(leader_apis: BrokerApis, acl: str) -> None:
    """Before 3.8 `KafkaApis.handleWriteTxnMarkersRequest` authorizes ClusterAction on the cluster only; 3.8+
    (KIP-1037) Alter first. The leader's ApiVersions tell which (ListTransactions v1 came with 3.8); unknown
    ones get ClusterAction, which every release accepts."""
    answer = marker_answer("CLUSTER_AUTHORIZATION_FAILED", leader=3, moves=0, leader_apis=leader_apis)
    assert isinstance(answer, MarkerEnding) and answer.outcome is AuditOutcome.DENIED
    assert answer.message.startswith(
        f"WriteTxnMarkers was denied (CLUSTER_AUTHORIZATION_FAILED): grant the ACL {acl}"
    )
    assert "broker 3 denied it" in answer.message


class Ticks:
    """A monotonic clock that moves only when the claim sleeps."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_claim_waits_on_its_own_clock_then_refuses() -> None:
    a = attempt()
    holder = a.record(AuditOutcome.CLAIMED, "theirs").model_copy(update={"audit_id": "bob", "actor": "bob"})
    log = FakeAuditLog(records=[holder])
    ticks = Ticks()
    ended = claim(log, a, verified().context, wait_s=5, lease_ms=HOUR, sleep=ticks.sleep, monotonic=ticks)
    assert ended is not None and ended.audit.outcome is AuditOutcome.REFUSED
    assert "another execution holds this candidate: bob" in ended.audit.message
    assert ticks.now == 5.5  # waited 0.5 s at a time past the 5 s, on the injected clock only


def test_claim_held_by_this_run_goes_on() -> None:
    log = FakeAuditLog()
    assert claim(log, attempt(), verified().context, wait_s=0, lease_ms=HOUR) is None
    assert [r.outcome for r in log.records] == [AuditOutcome.CLAIMED]


def test_post_check_gives_up_on_its_own_clock() -> None:
    ticks = Ticks()
    looked = post_check_until(
        scripted(),  # the leader keeps showing the transaction open
        candidate(),
        timeout_s=1,
        sleep=ticks.sleep,
        monotonic=ticks,
        clock_ms=lambda: NOW,
    )
    assert looked.check is not None and not looked.check.ok and ticks.now == pytest.approx(1.2)


def test_post_check_ending() -> None:
    a, v = attempt(), verified()
    done = live(producer=None, last_stable_offset=251, high_watermark=251)
    ok = post_check_ending(
        a,
        AfterMarker(done, post_check(a.candidate, done), None),
        leader=1,
        context=v.context,
        before=v.before,
    )
    assert ok.audit.outcome is AuditOutcome.ABORTED and ok.audit.marker_written
    assert "LSO 251 is past offset 100" in ok.audit.message
    failed = post_check_ending(
        a, AfterMarker(None, None, "leader gone"), leader=1, context=v.context, before=v.before
    )
    assert failed.audit.outcome is AuditOutcome.FAILED and failed.audit.marker_written
    assert failed.audit.message == "marker written, but the post-check failed: leader gone"


def test_plan_carries_the_operators_allow_live_owner() -> None:
    a = plan(candidate(), execute=True, actor="alice", clock_ms=lambda: NOW, allow_live_owner=True)
    assert a.allow_live_owner and a.record(AuditOutcome.CLAIMED, "claimed").allow_live_owner
    assert not attempt().record(AuditOutcome.CLAIMED, "claimed").allow_live_owner


def test_post_check_ending_reports_a_collision_even_when_the_post_check_fails() -> None:
    """Verified with the owner live at the marker's epoch (waived by the flag); after the marker it lists the
    partition. A post-check that did not pass does not hide that: COLLISION (exit 5), the post-check's problem
    named in the same message."""
    a = plan(candidate(), execute=True, actor="alice", clock_ms=lambda: NOW, allow_live_owner=True)
    at_epoch = live(producer=leader(last_sequence=9), coordinator=owner(producer_epoch=5))
    checked = verified_or_ending(
        a, at_epoch, verify_abort(a.candidate, at_epoch, allow_live_owner=True), moves=0
    )
    assert isinstance(checked, Verified) and checked.verify.waived
    listed = at_epoch.model_copy(
        update={"coordinator": owner(producer_epoch=5, state="Ongoing", partition_listed=True)}
    )
    still_open = post_check(a.candidate, listed)
    assert not still_open.ok
    ended = post_check_ending(
        a, AfterMarker(listed, still_open, None), leader=1, context=checked.context, before=checked.before
    )
    assert ended.audit.outcome is AuditOutcome.COLLISION and ended.exit_code == 5
    assert ended.audit.message.startswith(
        "COLLISION: marker written by broker 1, post-check failed: producer"
    )
    assert ended.audit.collision[0].startswith("tx-1 now lists orders-0 in its transaction")


def test_found_ended_while_another_run_holds_the_claim_ends_as_that_run_did() -> None:
    """Two engineers press enter together: bob's marker is written before alice's run reads the partition, but
    his ABORTED record is not on the audit log yet. Alice's run waits for it and says who aborted, exit 4."""
    a = attempt()
    ended_live = live(producer=None, last_stable_offset=251, high_watermark=251)
    refused = verified_or_ending(a, ended_live, verify_abort(a.candidate, ended_live), moves=0)
    assert isinstance(refused, AbortAttempt) and refused.audit.outcome is AuditOutcome.REFUSED
    bob = {"audit_id": "bob", "actor": "bob"}
    bobs_claim = a.record(AuditOutcome.CLAIMED, "claimed").model_copy(update=bob)
    bobs_end = a.record(AuditOutcome.ABORTED, "aborted").model_copy(update=bob)
    log = FakeAuditLog(records=[bobs_claim], others=[[], [bobs_end]])
    ticks = Ticks()
    got = ended_by_another(log, a, refused, wait_s=5, lease_ms=HOUR, sleep=ticks.sleep, monotonic=ticks)
    assert got.audit.outcome is AuditOutcome.ALREADY_RESOLVED and got.exit_code == 4
    assert "aborted by bob" in got.audit.message and got.audit.before == refused.audit.before
    assert ticks.now == 0.5  # one wait, then bob's ending was read


def test_found_ended_with_no_claim_held_stays_changed_since_the_plan() -> None:
    a = attempt()
    ended_live = live(producer=None, last_stable_offset=251, high_watermark=251)
    refused = verified_or_ending(a, ended_live, verify_abort(a.candidate, ended_live), moves=0)
    assert isinstance(refused, AbortAttempt)
    assert ended_by_another(FakeAuditLog(), a, refused, wait_s=5, lease_ms=HOUR) is refused
    # a claim that never ends: waits its bound on the injected clock, then the refusal stands
    stuck = a.record(AuditOutcome.CLAIMED, "claimed").model_copy(update={"audit_id": "bob", "actor": "bob"})
    ticks = Ticks()
    got = ended_by_another(
        FakeAuditLog(records=[stuck]), a, refused, wait_s=2, lease_ms=HOUR, sleep=ticks.sleep, monotonic=ticks
    )
    assert got is refused and ticks.now == 2.5


# ------------------------------------------------------------------- the same steps for a COMMIT (proposals commit)


def test_a_commit_runs_the_same_steps_with_its_own_marker() -> None:
    a = plan(lost_commit(), execute=True, actor="alice", clock_ms=lambda: NOW, audit_id="c1", result="COMMIT")
    # verify_live verifies the command's marker: the same candidate through `proposals abort` is refused.
    wire = commit_cluster()
    checked = verify_live(wire, a, moves=0, sleep=lambda _s: None)
    assert isinstance(checked, Verified) and checked.marker.transaction_result == "COMMIT"
    as_abort = verify_live(
        wire, plan(lost_commit(), execute=True, actor="alice", clock_ms=lambda: NOW), moves=0
    )
    assert isinstance(as_abort, AbortAttempt) and "lost-commit-marker: " in as_abort.audit.message
    assert "safe to commit now" in dry_run_ending(a, checked).audit.message
    # The post-check reads the records back only once the LSO is past the start offset.
    asked: list[int] = []

    def reader(c: AbortCandidate) -> int | None:
        asked.append(c.start_offset)
        return c.start_offset

    ticks = Ticks()
    still_open = post_check_until(
        wire, a.candidate, timeout_s=0.3, sleep=ticks.sleep, monotonic=ticks, clock_ms=lambda: NOW,
        read_committed=reader,
    )  # fmt: skip
    assert still_open.check is not None and not still_open.check.ok and asked == []
    ended = live(
        producer=leader(current_txn_start_offset=-1, coordinator_epoch=3),
        last_stable_offset=251,
        high_watermark=251,
    )
    committed = post_check_ending(
        a,
        AfterMarker(ended, post_check(a.candidate, ended, 100), None, 100),
        leader=1,
        context=checked.context,
        before=checked.before,
    )
    assert committed.audit.outcome is AuditOutcome.COMMITTED and committed.exit_code == 0
    assert "a read_committed reader gets offset 100" in committed.audit.message
    # A later run of either command finds it ended by this one.
    ended_by = audit_history_ending(attempt(), FakeAuditLog(records=[committed.audit]))
    assert ended_by is not None and "committed by alice" in ended_by.audit.message
