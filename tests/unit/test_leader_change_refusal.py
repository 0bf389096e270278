"""`leader-changed-since-start`: `proposals abort` refuses an ABORT (of any reason but `lost-abort-marker`) unless the
partition's leader is still in the leader epoch the transaction's start batch was appended in. A marker can only be
missing where the leader changed after it was written (the coordinator completes a transaction only once every
marker was acknowledged, acks=all, and a leader never truncates its own log within its epoch); across an election a
COMMIT marker of it may have been lost, and the ABORT would undo a commit. Waived by `--allow-leader-change` (kept
in the audit record); `show` offers the flag when the waivable refusals are all there is; `proposals commit` and
`lost-abort-marker` are not subject to it. The live epoch is the metadata's, confirmed by the leader's ListOffsets
at it."""

from __future__ import annotations

import argparse
from typing import Any

import pytest
from builders import LEADER_EPOCH, LIMITS, MINUTE, SECOND, T0, coord, open_txn, snapshot, tps
from collector_fakes import FakeCoordinators, description
from test_abort_policy import kv, loop, policy, record
from test_lost_markers import live_now, lost_commit
from test_verified_abort import TPX, FakeAuditLog, leader, live, owner, run, scripted

import txnwatch_cli
from admin.live.evidence import observe
from admin.proposals.verified_marker import ActWith, Surroundings, abort, render_show, show_json
from admin.wire.types import GroupOffsets
from detectors.abort import plan_abort, verify_abort, verify_commit, waiver_flags
from detectors.models import (
    AbortCandidate,
    AuditOutcome,
    AuditRecord,
    CoordinatorRecord,
    CoordinatorState,
    HangingReason,
    LiveEvidence,
    VerifyOutcome,
    VerifyResult,
)
from detectors.rules import classify

pytestmark = pytest.mark.unit

ACT = ActWith("b:9092", "prod", "txnwatch")
AROUND = Surroundings(GroupOffsets({}))


def orphan(
    start_epoch: int | None,
    *,
    leader_epoch: int | None = LEADER_EPOCH,
    record: CoordinatorRecord | None = None,
    seen_open_ms: int | None = None,
) -> AbortCandidate:
    """Producer 1000's orphan on orders-0 (no coordinator view unless `record`), its start batch appended at
    `start_epoch`, judged on a report at `leader_epoch`."""
    txn = open_txn(
        coordinator_epoch=-1,
        start_timestamp_ms=T0,
        last_timestamp_ms=T0,
        start_batch_leader_epoch=start_epoch,
        seen_open_ms=seen_open_ms,
    )
    s = snapshot(txn, leader_epoch=leader_epoch)
    verdict = classify(
        txn,
        s,
        record,
        now_ms=s.observed_at_ms,
        limits=LIMITS,
        view_current_ms=s.observed_at_ms,
        first_seen_ms=seen_open_ms,
    )
    return plan_abort(s, txn, verdict, first_detected_ms=s.observed_at_ms)


def live_at(epoch: int | None, **overrides: Any) -> LiveEvidence:
    return live(leader_epoch=epoch, **overrides)


def lost_abort(start_epoch: int) -> AbortCandidate:
    """A lost-abort-marker candidate: tx-1 CompleteAbort, its PrepareAbort listed orders-0, the transaction seen
    open before that; its start batch appended at `start_epoch`."""
    done_at = T0 + 10 * SECOND
    record = coord(
        state=CoordinatorState.COMPLETE_ABORT,
        partitions=(),
        prepared_partitions=tps("orders-0"),
        last_update_timestamp_ms=done_at,
    )
    c = orphan(start_epoch, record=record, seen_open_ms=T0 + SECOND)
    assert c.reason is HangingReason.LOST_ABORT_MARKER and c.spec.transaction_result == "ABORT"
    return c


# -------------------------------------------------------------------------------------------- verify


def test_an_abort_is_refused_when_the_leader_changed_since_the_transaction_began() -> None:
    c = orphan(6)
    assert (c.evidence.start_batch_leader_epoch, c.evidence.leader_epoch) == (6, LEADER_EPOCH)
    result = verify_abort(c, live_at(LEADER_EPOCH))
    assert result.outcome is VerifyOutcome.REFUSED and result.marker is None and result.waived == ()
    (line,) = result.changes
    assert line.startswith(
        "leader-changed-since-start: the leader of orders-0 changed since this transaction began (its start batch "
        "was appended at leader epoch 6, the leader is at epoch 7 now), so a commit marker of it may have been lost "
        "in an unclean leader election, and an ABORT would then undo records its coordinator committed; check the "
        "partition's log around offset 100 (kafka-dump-log.sh"
    )
    assert "txnwatch inspect coordinator-log" in line
    assert line.endswith("if you are sure it was never committed, run again with --allow-leader-change")


def test_the_leader_epoch_read_now_counts_not_the_one_the_job_judged_at() -> None:
    """Judged at the start batch's epoch, the leader moved since: refused. The reverse (judged across a change that
    the live leader no longer shows) cannot be: epochs only grow."""
    result = verify_abort(orphan(LEADER_EPOCH), live_at(LEADER_EPOCH + 1))
    assert result.outcome is VerifyOutcome.REFUSED
    assert "appended at leader epoch 7, the leader is at epoch 8 now" in result.changes[0]


@pytest.mark.parametrize(
    ("start", "now", "said"),
    [
        (None, LEADER_EPOCH, "appended at leader epoch unknown, the leader is at epoch 7 now"),
        (LEADER_EPOCH, None, "appended at leader epoch 7, the leader is at epoch unknown now"),
        (None, None, "appended at leader epoch unknown, the leader is at epoch unknown now"),
    ],
    ids=["start-batch-epoch-unknown", "live-epoch-unknown", "both-unknown"],
)
def test_an_abort_is_refused_when_either_leader_epoch_is_unknown(
    start: int | None, now: int | None, said: str
) -> None:
    result = verify_abort(orphan(start), live_at(now))
    assert result.outcome is VerifyOutcome.REFUSED
    (line,) = result.changes
    assert (
        line.startswith("leader-changed-since-start: the leader of orders-0 may have changed since")
        and said in line
    )


def test_an_abort_is_not_refused_while_the_leader_kept_the_start_batchs_epoch() -> None:
    result = verify_abort(orphan(LEADER_EPOCH), live_at(LEADER_EPOCH))
    assert result.outcome is VerifyOutcome.SAFE and result.changes == () and result.waived == ()


def test_the_start_batch_read_now_decides_for_a_candidate_that_did_not_carry_its_epoch() -> None:
    """A candidate the job proposed before snapshots carried the start batch's epoch (an upgrade), or whose batch
    the collector could not read: verification reads the batch at the start offset now, and that epoch decides."""
    c = orphan(None)
    kept = verify_abort(c, live_at(LEADER_EPOCH, start_batch_leader_epoch=LEADER_EPOCH))
    assert kept.outcome is VerifyOutcome.SAFE, kept.changes
    moved = verify_abort(c, live_at(LEADER_EPOCH, start_batch_leader_epoch=LEADER_EPOCH - 1))
    assert moved.outcome is VerifyOutcome.REFUSED and "appended at leader epoch 6" in moved.changes[0]


@pytest.mark.parametrize("now", [LEADER_EPOCH + 1, None], ids=["changed", "unknown"])
def test_a_lost_abort_marker_is_not_refused_for_a_leader_change(now: int | None) -> None:
    """Its ABORT restores what its coordinator decided for this very partition: no commit can be undone."""
    c = lost_abort(LEADER_EPOCH)
    assert verify_abort(c, live_at(now)).outcome is VerifyOutcome.SAFE


@pytest.mark.parametrize("now", [LEADER_EPOCH, None], ids=["changed", "unknown"])
def test_proposals_commit_is_not_subject_to_the_leader_change_refusal(now: int | None) -> None:
    """A lost commit marker is lost *because* the leader changed: its COMMIT restores the coordinator's outcome."""
    c = lost_commit()
    c = c.model_copy(update={"evidence": c.evidence.model_copy(update={"start_batch_leader_epoch": 3})})
    result = verify_commit(c, live_now(leader_epoch=now))
    assert result.outcome is VerifyOutcome.SAFE and result.waived == ()


def test_allow_leader_change_waives_that_refusal_and_keeps_it_on_record() -> None:
    c, evidence = orphan(6), live_at(LEADER_EPOCH)
    refused = verify_abort(c, evidence)
    allowed = verify_abort(c, evidence, allow_leader_change=True)
    assert allowed.outcome is VerifyOutcome.SAFE and allowed.changes == () and allowed.marker is not None
    assert allowed.waived == refused.changes
    # --allow-live-owner is no acknowledgement of a leader change.
    assert verify_abort(c, evidence, allow_live_owner=True).changes == refused.changes


def test_allow_leader_change_waives_nothing_else() -> None:
    moved = live_at(LEADER_EPOCH, producer=leader(producer_epoch=6))
    result = verify_abort(orphan(6), moved, allow_leader_change=True)
    assert result.outcome is VerifyOutcome.REFUSED and result.changes == ("producer epoch moved from 5 to 6",)
    assert result.waived[0].startswith("leader-changed-since-start:")


def owned_orphan(start_epoch: int) -> AbortCandidate:
    """An orphan proven coordinator-completed against tx-1's own record (CompleteCommit without orders-0, TV0):
    with tx-1 live at epoch 5 now, it is also refused for its live owner."""
    record = coord(
        state=CoordinatorState.COMPLETE_COMMIT,
        partitions=(),
        last_update_timestamp_ms=T0 + 1,
        client_transaction_version=0,
    )
    return orphan(start_epoch, record=record)


def test_a_live_owner_and_a_leader_change_need_both_flags() -> None:
    c = owned_orphan(6)
    evidence = live_at(LEADER_EPOCH, coordinator=owner(state="CompleteCommit", producer_epoch=5))
    refused = verify_abort(c, evidence)
    assert [line.split(":", 1)[0] for line in refused.changes] == [
        "live-owner-same-epoch",
        "leader-changed-since-start",
    ]
    assert waiver_flags(refused) == ("--allow-live-owner", "--allow-leader-change")
    one = verify_abort(c, evidence, allow_live_owner=True)
    assert one.outcome is VerifyOutcome.REFUSED and waiver_flags(one) == ("--allow-leader-change",)
    both = verify_abort(c, evidence, allow_live_owner=True, allow_leader_change=True)
    assert both.outcome is VerifyOutcome.SAFE and both.waived == refused.changes


def test_waiver_flags_only_when_every_refusal_is_waivable() -> None:
    safe = verify_abort(orphan(LEADER_EPOCH), live_at(LEADER_EPOCH))
    assert waiver_flags(safe) == ()
    both = verify_abort(orphan(6), live_at(LEADER_EPOCH, producer=leader(producer_epoch=6)))
    assert both.outcome is VerifyOutcome.REFUSED and waiver_flags(both) == ()
    assert waiver_flags(VerifyResult(outcome=VerifyOutcome.REFUSED)) == ()


# ----------------------------------------------------------------------------------- show: the act lines


def act_lines(shown: str) -> list[str]:
    return [line.strip() for line in shown.splitlines() if line.lstrip().startswith("act")]


def test_show_offers_allow_leader_change_when_that_refusal_is_all_that_stops_the_abort() -> None:
    c, evidence = orphan(6), live_at(LEADER_EPOCH)
    verify = verify_abort(c, evidence)
    flagged = ACT.txnwatch(c, flags=("--allow-leader-change",))
    assert flagged.endswith("--execute --allow-leader-change")
    act = show_json(c, evidence, verify, ACT, T0, AROUND)["act"]
    assert act["txnwatch_waiving"] == flagged and act["txnwatch_allow_live_owner"] is None
    assert act["kafka_cli"] is None
    assert act_lines(render_show(c, evidence, verify, ACT, T0, AROUND)) == [
        f"act (only if orders-0's log and its coordinator show it was never committed):  {flagged}"
    ]


def test_show_offers_both_flags_for_a_live_owner_and_a_leader_change() -> None:
    c = owned_orphan(6)
    evidence = live_at(LEADER_EPOCH, coordinator=owner(state="CompleteCommit", producer_epoch=5))
    verify = verify_abort(c, evidence)
    both = ACT.txnwatch(c, flags=("--allow-live-owner", "--allow-leader-change"))
    assert both.endswith("--execute --allow-live-owner --allow-leader-change")
    act = show_json(c, evidence, verify, ACT, T0, AROUND)["act"]
    assert act["txnwatch_waiving"] == both and act["txnwatch_allow_live_owner"] is None
    assert act_lines(render_show(c, evidence, verify, ACT, T0, AROUND)) == [
        "act (once tx-1's producer restarted, and only if orders-0's log and its coordinator show it was never "
        f"committed):  {ACT.txnwatch(c, flags=('--allow-leader-change',))}",
        "act (only if tx-1 no longer writes to orders-0 and orders-0's log and its coordinator show it was never "
        f"committed):  {both}",
    ]


def test_show_offers_no_flag_when_another_refusal_stands() -> None:
    c = orphan(6)
    evidence = live_at(LEADER_EPOCH, producer=leader(producer_epoch=6))
    verify = verify_abort(c, evidence)
    assert show_json(c, evidence, verify, ACT, T0, AROUND)["act"]["txnwatch_waiving"] is None
    assert not any(
        "--allow-" in line for line in act_lines(render_show(c, evidence, verify, ACT, T0, AROUND))
    )


# ------------------------------------------------------------------------------- abort, on a scripted cluster


def moved_cluster(**overrides: Any) -> Any:
    """orders-0's leader is at epoch 8 now; the candidate's start batch was appended at 7."""
    return scripted(epochs={TPX: LEADER_EPOCH + 1}, **overrides)


def test_the_live_leader_epoch_is_the_metadatas_confirmed_by_the_leaders_list_offsets() -> None:
    wire = scripted()
    assert observe(wire, orphan(LEADER_EPOCH), sleep=lambda _s: None).leader_epoch == LEADER_EPOCH
    assert wire.offsets_epochs[-1] == {TPX: LEADER_EPOCH}
    # Stale metadata (epoch 6) routes to broker 1, which leads at 7: its ListOffsets at 6 is fenced, the epoch
    # unknown (and the LSO with it).
    stale = scripted(epoch_views=[{TPX: 6}])
    seen = observe(stale, orphan(LEADER_EPOCH), sleep=lambda _s: None)
    assert seen.leader_epoch is None and seen.last_stable_offset is None
    # Metadata without epochs: unknown.
    assert observe(scripted(epochs={}), orphan(LEADER_EPOCH), sleep=lambda _s: None).leader_epoch is None


def test_a_leader_change_is_refused_before_any_marker() -> None:
    wire = moved_cluster()
    record = run(wire)
    assert record.outcome is AuditOutcome.REFUSED and wire.markers == [] and not record.marker_written
    assert "leader-changed-since-start: the leader of orders-0 changed" in record.message
    assert record.before is not None and record.before.leader_epoch == LEADER_EPOCH + 1
    assert record.allow_leader_change is False


def test_allow_leader_change_aborts_and_the_audit_says_so() -> None:
    log = FakeAuditLog()
    wire = moved_cluster()
    record = run(wire, audit_log=log, allow_leader_change=True)
    assert record.outcome is AuditOutcome.ABORTED and len(wire.markers) == 1
    assert record.allow_leader_change and not record.allow_live_owner and record.verify is not None
    assert record.verify.waived[0].startswith("leader-changed-since-start:")
    assert record.message.endswith("; --allow-leader-change waived leader-changed-since-start")
    (claim,) = log.records
    assert claim.allow_leader_change
    dry = run(moved_cluster(), execute=False, allow_leader_change=True)
    assert dry.outcome is AuditOutcome.DRY_RUN
    assert (
        "with --allow-leader-change waiving: leader-changed-since-start: the leader of orders-0"
        in dry.message
    )


def test_a_live_owner_and_a_leader_change_waived_together_are_both_said() -> None:
    owner_now = description(
        state="CompleteCommit", producer_epoch=5, partitions=(("orders", 1),), start_time_ms=T0
    )
    wire = moved_cluster(coordinators=FakeCoordinators({"tx-1": owner_now}))
    attempt = abort(
        wire,
        owned_orphan(LEADER_EPOCH),
        execute=True,
        audit_log=FakeAuditLog(),
        actor="alice",
        clock_ms=lambda: T0 + MINUTE * 60,
        sleep=lambda _s: None,
        allow_live_owner=True,
        allow_leader_change=True,
    )
    r = attempt.audit
    assert r.outcome is AuditOutcome.ABORTED and r.allow_live_owner and r.allow_leader_change
    assert r.message.endswith(
        "; --allow-live-owner waived live-owner-same-epoch, and the owner did not move before the marker"
        "; --allow-leader-change waived leader-changed-since-start"
    )


# ------------------------------------------------------------------------------------------------- CLI


def test_allow_leader_change_is_a_flag_of_proposals_abort_only() -> None:
    parse = txnwatch_cli.build_parser().parse_args
    assert parse(["proposals", "abort", "ID", "--allow-leader-change"]).allow_leader_change is True
    assert parse(["proposals", "abort", "ID"]).allow_leader_change is False
    with pytest.raises(SystemExit):
        parse(["proposals", "commit", "ID", "--allow-leader-change"])


def test_allow_leader_change_help_teaches_the_risk_and_when() -> None:
    parser: argparse.ArgumentParser = txnwatch_cli.build_parser()
    for name in ("proposals", "abort"):
        (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[name]
    text = " ".join(parser.format_help().split())
    assert "--allow-leader-change" in text and "leader-changed-since-start" in text
    assert "unclean leader election may have lost a COMMIT marker" in text
    assert "Only when you have checked that it was never committed" in text
    assert "recorded in the audit record" in text


def test_watch_never_waives_a_leader_change() -> None:
    line = (
        "leader-changed-since-start: the leader of orders-0 changed since this transaction began (...), and if you "
        "are sure it was never committed, run again with --allow-leader-change"
    )

    def refused(c: AbortCandidate) -> AuditRecord:
        verify = VerifyResult(outcome=VerifyOutcome.REFUSED, changes=(line,))
        return record(c, AuditOutcome.REFUSED).model_copy(
            update={"verify": verify, "message": f"refused, no marker written: {line}"}
        )

    w, events = loop(policy(), ending=refused)
    c = orphan(6)
    w.take([kv(c)], T0 + MINUTE * 60)
    w.act(T0 + MINUTE * 60)
    (event,) = [e for e in events if e.kind == "ABORT"]
    assert event.as_json()["refusals"] == ["leader-changed-since-start"]
    assert "auto-abort never passes --allow-leader-change" in event.detail
