"""Upgrades keep state: a checkpoint the previous release (v0.1.0) wrote is resumed by this tree's job.

The previous release is taken from git (`v0.1.0`, else its commit: a clone may carry no tags) into a temporary
folder and run as it ran then: its own `txnwatch collect` and `txnwatch stream` (a subprocess whose imports are
shown to come from that folder), same venv, on a fresh checkpoint, with a real orphan (dev/workload.py
--scenario hanging) until its candidate is OPENED. Then both are stopped and this tree's collector and job start
on the same checkpoint and topics, as `helm upgrade` does. The orphan must stay one candidate (no second OPENED:
counted by distinct record, Spark's Kafka sink being at-least-once), its verdict must still be HANGING (the
restored coordinator view, not NO_COORDINATOR_STATE and a new detection), nothing RESOLVED or GONE, and
`proposals abort --execute` must then resolve it once. Reuses the session broker.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import uuid
from pathlib import Path
from typing import Any

import pytest
from test_faults_e2e import read_topic
from test_stream_e2e import scrape, wait_for
from workloads import ROOT, Proposals, batches_committed, produce_plain, run_workload

from detectors.models import AbortCandidate

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

# The previous release: its tag, or the commit it tags (always in a clone's history: an ancestor of main).
PREVIOUS_TAG = "v0.1.0"
PREVIOUS_COMMIT = "c2d7d13"
CLUSTER = "e2e-upgrade"
DETECTION_TIMEOUT_S = 240.0
RESOLVE_TIMEOUT_S = 120.0


def previous_release() -> str:
    """The previous release's commit: the tag if this clone has it, else the commit it names."""
    for ref in (f"{PREVIOUS_TAG}^{{commit}}", f"{PREVIOUS_COMMIT}^{{commit}}"):
        found = subprocess.run(
            ["git", "rev-parse", "--verify", "--quiet", ref], cwd=ROOT, capture_output=True, text=True
        )
        if found.returncode == 0:
            return found.stdout.strip()
    raise AssertionError(f"neither {PREVIOUS_TAG} nor {PREVIOUS_COMMIT} is in this clone's history")


def extract_release(commit: str, into: Path) -> Path:
    """The tree of `commit` in `into` (git archive: no work tree, no .git)."""
    archive = into / "release.tar"
    with archive.open("wb") as out:
        subprocess.run(["git", "archive", "--format=tar", commit], cwd=ROOT, stdout=out, check=True)
    tree = into / "tree"
    tree.mkdir()
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    archive.unlink()
    return tree


def environment(tree: Path | None) -> dict[str, str]:
    """The process environment: `tree` first on the import path (None: this tree, as installed in the venv);
    the jars `make jars` resolved for this tree in either case (the previous release looked for them in its own
    folder by default)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TXNWATCH_") and k != "PYTHONPATH"}
    env["PYSPARK_PYTHON"] = sys.executable
    env["TXNWATCH_STREAM__JARS_DIR"] = str(ROOT / ".cache" / "jars")
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    return env


def imported_from(tree: Path) -> list[str]:
    """Where a process started like the previous release's imports the project's packages from."""
    shown = subprocess.run(
        [
            sys.executable,
            "-c",
            "import admin, detectors, streaming, txnwatch_cli; "
            "print('\\n'.join(m.__file__ for m in (admin, detectors, streaming, txnwatch_cli)))",
        ],
        cwd=tree,
        env=environment(tree),
        capture_output=True,
        text=True,
        check=True,
    )
    return shown.stdout.split()


class Proc:
    """A txnwatch process in its own session (SIGTERM reaches Spark's JVM and Python workers too)."""

    def __init__(self, name: str, args: list[str], cwd: Path, env: dict[str, str], logs: Path) -> None:
        self.name, self.cwd, self.env = name, cwd, env
        self.args = [sys.executable, "-m", "txnwatch_cli", *args]
        self.out, self.err = logs / f"{name}.out", logs / f"{name}.err"
        self.popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.out.open("wb") as out, self.err.open("wb") as err:
            self.popen = subprocess.Popen(
                self.args, stdout=out, stderr=err, cwd=self.cwd, env=self.env, start_new_session=True
            )

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def stop(self) -> None:
        """SIGTERM to the whole group, as a pod being replaced gets; SIGKILL if it does not end in 60 s."""
        if self.popen is None or self.popen.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGTERM)
        try:
            self.popen.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(timeout=30)

    def text(self, which: str = "err") -> str:
        return (self.err if which == "err" else self.out).read_text(errors="replace")


def batches_done(checkpoint: Path) -> int:
    return batches_committed(p.name for p in (checkpoint / "txnwatch-reconcile" / "commits").glob("*"))


def json_lines(text: str) -> list[dict[str, Any]]:
    """The job's `--output json` events (its other lines are plain text)."""
    out = []
    for line in text.splitlines():
        if line.startswith("{"):
            with contextlib.suppress(json.JSONDecodeError):
                out.append(json.loads(line))
    return out


METRICS_URL = re.compile(r"metrics on http://[^:]+:(\d+)/metrics")


def test_checkpoint_of_the_previous_release_resumes(bootstrap: str, tmp_path: Path) -> None:
    previous = previous_release()
    old_tree = extract_release(previous, tmp_path)
    # The previous release's processes really run the previous release's code, not this tree's.
    assert all(Path(f).resolve().is_relative_to(old_tree.resolve()) for f in imported_from(old_tree))

    prefix = f"upg{uuid.uuid4().hex[:8]}"
    checkpoint = tmp_path / "checkpoint"
    common = ["--bootstrap-server", bootstrap, "--topic-prefix", prefix, "--cluster", CLUSTER]
    collect = ["collect", *common, "--interval", "2", "--metrics-port", "0"]
    stream = [
        *("stream", *common, "--checkpoint-location", str(checkpoint), "--master", "local[2]"),
        *("--trigger", "3 seconds", "--starting-offsets", "earliest", "--expire-after-ms", "20000"),
        *("--metrics-port", "0", "--output", "json"),
    ]
    old = [
        Proc("old-collector", collect, old_tree, environment(old_tree), tmp_path),
        Proc("old-stream", stream, old_tree, environment(old_tree), tmp_path),
    ]
    new_collector = Proc("new-collector", collect, ROOT, environment(None), tmp_path)
    new_job = Proc("new-stream", stream, ROOT, environment(None), tmp_path)
    everything = [*old, new_collector, new_job]
    proposals = Proposals(bootstrap, prefix, cluster=CLUSTER)

    def candidates(topic: str) -> list[AbortCandidate]:
        return [
            AbortCandidate.model_validate_json(r.value)
            for r in read_topic(bootstrap, f"{prefix}.abort-candidates")
            if r.value is not None and AbortCandidate.model_validate_json(r.value).topic == topic
        ]

    def running(p: Proc) -> bool:
        assert p.alive(), f"{p.name} ended:\n{p.text()[-4000:]}"
        return True

    try:
        # ---- the previous release: a real orphan, detected, its candidate OPENED, state in the checkpoint
        for p in old:
            p.start()
        truth = run_workload(bootstrap, "--scenario", "hanging", "--topic-prefix", f"{prefix}-hang-")
        (h,) = [t for t in truth["transactions"] if t["kind"] == "hanging"]
        topic, partition, start = h["topic"], h["partition"], h["start_offset"]
        produce_plain(bootstrap, topic, partition, b"after-the-orphan")

        def opened() -> list[AbortCandidate]:
            running(old[1])
            return [c for c in candidates(topic) if c.status.value == "OPENED"]

        (candidate,) = wait_for(opened, DETECTION_TIMEOUT_S, "the previous release's OPENED candidate", 2)
        assert (candidate.partition, candidate.start_offset, candidate.spec.producer_id) == (
            partition,
            start,
            h["producer_id"],
        )
        # Two more batches committed after the OPENED one: the checkpoint holds the candidate as opened.
        seen = batches_done(checkpoint)
        wait_for(lambda: running(old[1]) and batches_done(checkpoint) >= seen + 2, 60, "two old batches", 1)
        for p in old:
            p.stop()
        old_batches = batches_done(checkpoint)

        # ---- this tree, on the same checkpoint and topics
        new_collector.start()
        new_job.start()
        wait_for(
            lambda: running(new_job) and batches_done(checkpoint) >= old_batches + 5,
            300,
            "five batches of the new job on the old checkpoint",
            2,
        )
        events = json_lines(new_job.text("out"))
        mine = [e for e in events if e.get("topic") == topic and e.get("producer_id") == h["producer_id"]]
        verdicts = [(e["event"], e.get("kind"), e.get("reason")) for e in mine]
        print(f"\nprevious release {previous[:12]}; the new job's events for the orphan: {verdicts}")
        # The restored view judges it as before: HANGING with no new detection, nothing resolved or forgotten.
        assert ("VERDICT", "HANGING") in [(e, k) for e, k, _ in verdicts], verdicts
        assert {e for e, _, _ in verdicts} == {"VERDICT"}, verdicts  # no OPENED, RESOLVED or GONE
        assert {k for _, k, _ in verdicts} == {"HANGING"}, verdicts  # no UNCONFIRMED / NO_COORDINATOR_STATE
        # For the reason the previous release gave (a lost view would make it no-coordinator-state) ...
        before = [
            e for e in json_lines(old[1].text("out")) if e.get("candidate_id") == candidate.candidate_id
        ]
        assert {e["reason"] for e in before if e["event"] == "OPENED"} == {r for _, _, r in verdicts}, before
        # ... and unexplained: a verdict is explained when it is new or changed, this one was restored.
        assert not [e["explanation"] for e in mine if e.get("explanation")], mine
        url = METRICS_URL.search(new_job.text("out"))
        assert url, new_job.text("out")[-3000:]
        hanging = scrape(int(url.group(1))).get("txnwatch_hanging_transactions", [])
        assert sum(v for _, v in hanging) >= 1, hanging
        mine_candidates = candidates(topic)
        # One candidate across both runs; an identical replayed record (at-least-once sink) is no second one.
        assert {c.candidate_id for c in mine_candidates} == {candidate.candidate_id}, mine_candidates
        assert {c.model_dump_json() for c in mine_candidates} == {candidate.model_dump_json()}, (
            mine_candidates
        )

        # ---- on-call aborts it: the new job resolves the candidate the previous release opened, once
        done = proposals.run("abort", candidate.candidate_id, "--execute", "--actor", "e2e-upgrade")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["outcome"] == "ABORTED"

        def statuses() -> list[str]:
            running(new_job)
            return [c.status.value for c in candidates(topic)]

        wait_for(lambda: "RESOLVED" in statuses(), RESOLVE_TIMEOUT_S, "the new job's RESOLVED", 2)
        assert statuses() == ["OPENED", "RESOLVED"]
    finally:
        for p in everything:
            p.stop()
        print(f"upgrade test logs in {tmp_path}")
