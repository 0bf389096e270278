"""`txnwatch proposals watch` against the real broker: it prints the pending candidate and the one proposed while
it runs; with `--auto-abort --policy`, it aborts (verified, audited) the real orphan the policy allows, holds
the one whose topic it does not, naming the policy field, and never waives `live-owner-same-epoch` (refused, the
refusal named). Bad policy use is a clear exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from workloads import Proposals, lso, plan_by_hand, produce_plain, run_workload

from admin.wire.kafka_wire import KafkaWire

pytestmark = pytest.mark.broker

ROOT = Path(__file__).resolve().parent.parent.parent


def orphan(bootstrap: str, prefix: str, *extra: str) -> dict[str, Any]:
    truth = run_workload(bootstrap, "--scenario", "hanging", "--topic-prefix", prefix, *extra)
    (h,) = [t for t in truth["transactions"] if t["kind"] == "hanging"]
    produce_plain(bootstrap, h["topic"], h["partition"], b"held-back")  # an LSO lag of at least one
    return h  # type: ignore[no-any-return]


def watch(bed: Proposals, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "txnwatch_cli",
            "proposals",
            "watch",
            *args,
            "--bootstrap-server",
            bed.bootstrap,
            "--cluster",
            bed.cluster,
            "--topic-prefix",
            bed.prefix,
            "--output",
            "json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if not k.startswith("TXNWATCH_")},
    )


def test_auto_abort_aborts_what_the_policy_allows_and_holds_the_rest(
    bootstrap: str, unique: str, wire: KafkaWire, tmp_path: Path
) -> None:
    bed = Proposals(bootstrap, f"{unique}tw")
    allowed = orphan(bootstrap, f"{unique}orders-")
    other = orphan(bootstrap, f"{unique}ledger-")
    # Allowed by the policy, but its transactional id stays live at the orphan's epoch (no restart).
    live = orphan(bootstrap, f"{unique}orders-live-", "--owner-stays-live")
    first = plan_by_hand(wire, allowed["topic"], allowed["partition"], allowed["producer_id"])
    second = plan_by_hand(wire, other["topic"], other["partition"], other["producer_id"])
    third = plan_by_hand(wire, live["topic"], live["partition"], live["producer_id"])
    bed.publish(first)  # pending before watch starts
    bed.publish(third)
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "reasons: [no-coordinator-state]\n"
        "min_age_s: 0\n"
        "min_lso_lag: 1\n"
        f"topics:\n  allow: ['{unique}orders-*']\n"
        "max_aborts_per_hour: 5\n"
    )

    proc = watch(bed, "--auto-abort", "--policy", str(policy), "--actor", "ops-bot", "--duration-ms", "25000")
    try:
        time.sleep(5)
        bed.publish(second)  # proposed while watch runs
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    events = [json.loads(line) for line in out.splitlines()]
    seen = [(e["event"], e["candidate_id"]) for e in events]
    assert ("OPENED", first.candidate_id) in seen and ("OPENED", second.candidate_id) in seen
    attempts = {e["candidate_id"]: e for e in events if e["event"] == "ABORT"}
    assert set(attempts) == {first.candidate_id, third.candidate_id}, attempts
    aborted, refused = attempts[first.candidate_id], attempts[third.candidate_id]
    assert aborted["outcome"] == "ABORTED" and aborted["refusals"] == [], aborted
    # auto-abort never passes --allow-live-owner: refused by name, and the line says a person decides.
    assert refused["outcome"] == "REFUSED" and refused["refusals"] == ["live-owner-same-epoch"], refused
    assert f"live-owner-same-epoch: transactional id {live['transactional_id']}" in refused["detail"]
    assert "auto-abort never passes --allow-live-owner" in refused["detail"]
    (held,) = [e for e in events if e["event"] == "HELD"]
    assert held["candidate_id"] == second.candidate_id and "matches no allow pattern" in held["detail"]

    # The allowed orphan is gone; the held and the refused ones untouched.
    assert (lso(wire, allowed["topic"], allowed["partition"]) or 0) > allowed["start_offset"]
    assert lso(wire, other["topic"], other["partition"]) == other["start_offset"]
    assert lso(wire, live["topic"], live["partition"]) == live["start_offset"]
    endings = bed.endings(2)
    assert sorted((a.candidate_id, a.outcome.value, a.actor) for a in endings) == sorted(
        [
            (first.candidate_id, "ABORTED", "auto-abort:ops-bot"),
            (third.candidate_id, "REFUSED", "auto-abort:ops-bot"),
        ]
    )

    # Leave the shared broker clean (the live owner's orphan by a person who knows it no longer writes there).
    done = bed.run("abort", second.candidate_id, "--execute")
    assert done.returncode == 0, done.stderr
    done = bed.run("abort", third.candidate_id, "--execute", "--allow-live-owner")
    assert done.returncode == 0, done.stderr


def test_watch_without_policy_prints_and_aborts_nothing(bootstrap: str, unique: str, wire: KafkaWire) -> None:
    bed = Proposals(bootstrap, f"{unique}tw")
    h = orphan(bootstrap, unique)
    candidate = plan_by_hand(wire, h["topic"], h["partition"], h["producer_id"])
    bed.publish(candidate)
    proc = watch(bed, "--duration-ms", "8000")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    events = [json.loads(line) for line in out.splitlines()]
    assert [(e["event"], e["candidate_id"]) for e in events] == [("OPENED", candidate.candidate_id)]
    assert lso(wire, h["topic"], h["partition"]) == h["start_offset"]
    assert bed.run("abort", candidate.candidate_id, "--execute").returncode == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--auto-abort"], "--auto-abort and --policy FILE go together"),
        (["--auto-abort", "--policy", "/nonexistent/policy.yaml"], "cannot read the policy"),
    ],
)
def test_bad_policy_use_is_one_line_and_exit_2(
    bootstrap: str, unique: str, args: list[str], message: str
) -> None:
    proc = watch(Proposals(bootstrap, f"{unique}tw"), *args)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and message in err and "Traceback" not in err, err
