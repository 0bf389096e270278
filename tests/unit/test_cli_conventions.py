"""Every command's conventions (collect, stream, inspect, proposals): durations in flag names end in `-ms` as in
Kafka's tools, the old spellings still work (hidden); one exit-code table that each `--help` and docs/proposals.md
agree with; errors as one JSON object on stderr when JSON is asked for; `proposals list --fail-if-any`; `proposals
abort --topic --partition --start-offset`; and `--timeout-ms` bounding how long an unreachable cluster is tried (a
closed port on 127.0.0.1: no broker needed)."""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from builders import open_txn, snapshot

import admin.cli.main
import streaming.cli
import txnwatch_cli
from admin.proposals.verified_marker import NOT_PROPOSED, candidate_at
from admin.wire.errors import AdminError
from common.cli_options import (
    ALL_COMMANDS,
    EXIT_CANDIDATES_LISTED,
    EXIT_CODE_TABLE,
    EXIT_ERROR,
    EXIT_REFUSED,
    EXIT_USAGE,
)
from detectors.abort import plan_abort
from detectors.health import interval_ms
from detectors.models import AbortCandidate, CandidateStatus, DetectionLimits
from detectors.rules import classify

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("TXNWATCH_"):
            monkeypatch.delenv(key)


def subcommand(path: str) -> argparse.ArgumentParser:
    """The argparse parser of a command ("stream", "proposals abort")."""
    parser = txnwatch_cli.build_parser()
    for word in path.split():
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[word]
    return parser


# --------------------------------------------------------------------------------------------- flags

# A flag that takes a span of time: its name says so (interval, duration, timeout, a Spark trigger, window or
# watermark, a TTL, ...) or ends in a unit. (`--max-offsets-per-trigger` is a count.)
_DURATION = re.compile(
    r"interval|duration|timeout|wait|delay|linger|period|lease|seconds|every|ttl|expire|"
    r"^--(trigger|window|watermark)|-s$|-secs?$|-minutes?$"
)


@pytest.mark.parametrize("command", ALL_COMMANDS)
def test_every_visible_duration_flag_ends_in_ms(command: str) -> None:
    visible = [
        flag
        for action in subcommand(command)._actions
        if action.help != argparse.SUPPRESS
        for flag in action.option_strings
    ]
    durations = [f for f in visible if _DURATION.search(f)]
    assert all(f.endswith("-ms") for f in durations), durations


@pytest.mark.parametrize(
    ("argv", "dest", "seconds"),
    [
        pytest.param(["collect", "--interval-ms", "2500"], "interval", 2.5, id="collect-interval-ms"),
        pytest.param(["collect", "--interval", "5"], "interval", 5.0, id="collect-old-interval-seconds"),
        pytest.param(["collect"], "interval", None, id="collect-interval-unset"),
        pytest.param(
            ["proposals", "watch", "--duration-ms", "8000"], "duration_s", 8.0, id="watch-duration-ms"
        ),
        pytest.param(
            ["proposals", "watch", "--duration-s", "8"], "duration_s", 8.0, id="watch-old-duration-s"
        ),
        pytest.param(["stream", "--duration-ms", "1500"], "seconds", 1.5, id="stream-duration-ms"),
        pytest.param(["stream", "--seconds", "3"], "seconds", 3.0, id="stream-old-seconds"),
        pytest.param(
            ["stream", "--restart-queries-every-ms", "0"],
            "restart_queries_every_s",
            0.0,
            id="stream-restart-every-ms-never",
        ),
        pytest.param(
            ["stream", "--restart-queries-every-ms", "90000"],
            "restart_queries_every_s",
            90.0,
            id="stream-restart-every-ms",
        ),
        pytest.param(
            ["stream", "--restart-queries-every-s", "60"],
            "restart_queries_every_s",
            60.0,
            id="stream-old-restart-every-s",
        ),
    ],
)
def test_old_spellings_still_work_and_mean_the_same(
    argv: list[str], dest: str, seconds: float | None
) -> None:
    args = txnwatch_cli.build_parser().parse_args(argv)
    assert getattr(args, dest) == seconds


@pytest.mark.parametrize("field", ["trigger", "window", "watermark"])
def test_stream_interval_flags_in_ms_and_their_old_spelling_reach_the_settings(field: str) -> None:
    """`--trigger-ms 2500` sets the Spark interval the settings hold ("2500 milliseconds", which Spark and the
    job's own reading of it take as 2.5 s); `--trigger '3 seconds'` still sets what it always did."""
    from common.cli_options import settings_from
    from common.settings import Settings

    flag = f"--{field}-ms"
    args = txnwatch_cli.build_parser().parse_args(["stream", flag, "2500"])
    settings, _ = settings_from(args, flags=streaming.cli.STREAM_FLAGS, environment=Settings())
    assert getattr(settings.stream, field) == "2500 milliseconds"
    assert interval_ms(getattr(settings.stream, field)) == 2500
    args = txnwatch_cli.build_parser().parse_args(["stream", f"--{field}", "3 seconds"])
    settings, _ = settings_from(args, flags=streaming.cli.STREAM_FLAGS, environment=Settings())
    assert getattr(settings.stream, field) == "3 seconds"


def test_collect_interval_ms_reaches_the_settings() -> None:
    from common.cli_options import settings_from
    from common.settings import Settings

    args = txnwatch_cli.build_parser().parse_args(["collect", "--interval-ms", "750"])
    settings, _ = settings_from(args, flags=admin.cli.main.COLLECT_FLAGS, environment=Settings())
    assert settings.collector.interval_s == 0.75


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["collect", "--interval", "5", "--interval-ms", "5000"], id="collect-both-spellings"),
        pytest.param(["collect", "--interval-ms", "0"], id="collect-zero-ms"),
        pytest.param(["collect", "--interval-ms", "1.5"], id="collect-fractional-ms"),
        pytest.param(["proposals", "watch", "--duration-s", "1", "--duration-ms", "1000"], id="watch-both"),
        pytest.param(["stream", "--trigger", "5 seconds", "--trigger-ms", "5000"], id="stream-trigger-both"),
        pytest.param(["stream", "--seconds", "1", "--duration-ms", "1000"], id="stream-duration-both"),
        pytest.param(["stream", "--window-ms", "1 minute"], id="stream-window-not-ms"),
        pytest.param(["stream", "--duration-ms", "0"], id="stream-zero-duration"),
        pytest.param(["stream", "--restart-queries-every-ms", "-1"], id="stream-negative-restart"),
        pytest.param(["collect", "--timeout-ms", "0"], id="collect-zero-timeout"),
    ],
)
def test_a_bad_duration_flag_is_a_usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        txnwatch_cli.build_parser().parse_args(argv)
    assert exit_.value.code == EXIT_USAGE
    assert "error: argument --" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------- exit codes


def documented_exit_codes() -> dict[int, tuple[str, frozenset[str]]]:
    """docs/proposals.md's exit-code table: code -> (name, commands)."""
    text = (ROOT / "docs" / "proposals.md").read_text()
    section = text.split("\n## Exit codes", 1)[1].split("\n## ", 1)[0]
    rows: dict[int, tuple[str, frozenset[str]]] = {}
    for line in section.splitlines():
        m = re.match(r"^\|\s*(\d+)\s*\|\s*`?([a-z-]+)`?\s*\|\s*([^|]+?)\s*\|", line)
        if m is None:
            continue
        commands = m.group(3)
        named = (
            frozenset(ALL_COMMANDS)
            if commands == "all"
            else frozenset(c.strip().strip("`").removeprefix("txnwatch ") for c in commands.split(","))
        )
        rows[int(m.group(1))] = (m.group(2), named)
    return rows


def test_the_documented_exit_codes_are_the_codes_table() -> None:
    in_code = {e.code: (e.name, frozenset(e.commands)) for e in EXIT_CODE_TABLE}
    assert documented_exit_codes() == in_code
    # "all" is every command: the section says which those are.
    text = (ROOT / "docs" / "proposals.md").read_text()
    intro = text.split("\n## Exit codes", 1)[1].split("\n| code", 1)[0]
    assert {f"`{c.split()[0]}`" for c in ALL_COMMANDS} <= set(re.findall(r"`[a-z]+`", intro)), intro


def test_the_table_holds_the_constants_the_commands_return() -> None:
    from admin.proposals import verified_marker as proposals

    constants: set[int] = set()
    for module in (admin.cli.main, streaming.cli):
        constants |= {v for k, v in vars(module).items() if k.startswith("EXIT_") and isinstance(v, int)}
    assert constants == {e.code for e in EXIT_CODE_TABLE}
    assert set(proposals.EXIT_CODES.values()) <= constants


@pytest.mark.parametrize("command", ALL_COMMANDS)
def test_each_help_lists_its_exit_codes(command: str) -> None:
    text = subcommand(command).format_help()
    assert "exit codes:" in text, text
    listed = {int(m) for m in re.findall(r"^  (\d+)\s", text.split("exit codes:", 1)[1], re.MULTILINE)}
    assert listed == {e.code for e in EXIT_CODE_TABLE if command in e.commands}


# ------------------------------------------------------------------------------------- JSON errors


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = txnwatch_cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def unreachable(monkeypatch: pytest.MonkeyPatch) -> None:
    """The proposals commands against a cluster that cannot be read (no Kafka in this tier)."""

    def cannot_read(*_a: Any, **_k: Any) -> Any:
        raise AdminError("cannot reach the bootstrap servers k:9092")

    monkeypatch.setattr(admin.cli.main, "_read_candidates", cannot_read)
    monkeypatch.setattr(admin.cli.main, "connect_admin", cannot_read)
    monkeypatch.setattr(admin.cli.main, "_setup_logging", lambda level: None)


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["proposals", "list"], id="list"),
        pytest.param(["proposals", "show", "c-1"], id="show"),
        pytest.param(["proposals", "abort", "c-1"], id="abort"),
        pytest.param(["proposals", "commit", "c-1"], id="commit"),
        pytest.param(
            ["inspect", "partition", "--topic", "orders", "--partition", "0"], id="inspect-partition"
        ),
    ],
)
def test_an_error_is_one_json_object_on_stderr_when_json_is_asked_for(
    argv: list[str], unreachable: None, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    command = " ".join(argv[:2])
    code, out, err = _run([*argv, "--output", "json"], capsys)
    assert (code, out) == (EXIT_ERROR, "")
    assert json.loads(err) == {
        "command": command,
        "error": "cannot reach the bootstrap servers k:9092",
        "exit_code": EXIT_ERROR,
    }
    monkeypatch.setenv("TXNWATCH_OUTPUT", "json")  # the environment asks the same
    code, _, err = _run(argv, capsys)
    assert code == EXIT_ERROR and json.loads(err)["command"] == command
    monkeypatch.delenv("TXNWATCH_OUTPUT")
    code, _, err = _run([*argv, "--output", "table"], capsys)
    assert err == f"txnwatch {command}: cannot reach the bootstrap servers k:9092\n"


def test_a_bad_setting_is_json_too_with_its_exit_code(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    missing = tmp_path / "missing.properties"
    code, out, err = _run(["proposals", "list", "--output", "json", "--command-config", str(missing)], capsys)
    assert (code, out) == (EXIT_USAGE, "")
    said = json.loads(err)
    assert said["exit_code"] == EXIT_USAGE and "No such file or directory" in said["error"]


# ------------------------------------------------------------------------------ list --fail-if-any


def a_candidate(
    topic: str = "orders", partition: int = 0, start_offset: int = 100, **kw: Any
) -> AbortCandidate:
    txn = open_txn(start_offset=start_offset, coordinator_epoch=-1)
    snap = snapshot(txn, topic=topic, partition=partition, **kw)
    v = classify(
        txn,
        snap,
        None,
        now_ms=snap.observed_at_ms,
        limits=DetectionLimits(),
        view_current_ms=snap.observed_at_ms,
    )
    return plan_abort(snap, txn, v, first_detected_ms=snap.observed_at_ms)


@pytest.mark.parametrize(
    ("listed", "flag", "code"),
    [
        pytest.param(True, True, EXIT_CANDIDATES_LISTED, id="listed-with-flag"),
        pytest.param(False, True, 0, id="none-with-flag"),
        pytest.param(True, False, 0, id="listed-without-flag"),
    ],
)
def test_list_fail_if_any(
    listed: bool, flag: bool, code: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    c = a_candidate(cluster="prod")
    monkeypatch.setattr(admin.cli.main, "_read_candidates", lambda *a: {c.candidate_id: c} if listed else {})
    monkeypatch.setattr(admin.cli.main, "_done_ids", lambda *a: set())
    monkeypatch.setattr(admin.cli.main, "_setup_logging", lambda level: None)
    argv = [
        "proposals",
        "list",
        "--cluster",
        "prod",
        "--output",
        "json",
        *(["--fail-if-any"] if flag else []),
    ]
    got, out, _ = _run(argv, capsys)
    assert got == code
    assert [r["candidate_id"] for r in json.loads(out)] == ([c.candidate_id] if listed else [])


# ------------------------------------------------------------- abort --topic --partition --start-offset


def test_candidate_at_finds_the_proposed_candidate() -> None:
    here = a_candidate(cluster="prod")
    elsewhere = a_candidate(cluster="prod", partition=1)
    other_cluster = a_candidate(cluster="staging")
    found = candidate_at(
        [elsewhere, other_cluster, here], cluster="prod", topic="orders", partition=0, start_offset=100
    )
    assert found == here


@pytest.mark.parametrize(
    ("status", "where", "said"),
    [
        pytest.param(None, {"start_offset": 101}, "has proposed no abort", id="no-candidate-at-the-offset"),
        pytest.param(None, {"cluster": "staging"}, "has proposed no abort", id="only-another-clusters"),
        pytest.param(CandidateStatus.WITHDRAWN, {}, "is WITHDRAWN", id="withdrawn"),
        pytest.param(CandidateStatus.RESOLVED, {}, "is RESOLVED", id="resolved"),
    ],
)
def test_candidate_at_refuses_by_name_what_the_job_does_not_propose(
    status: CandidateStatus | None, where: dict[str, Any], said: str
) -> None:
    c = a_candidate(cluster="prod")
    if status is not None:
        c = c.model_copy(update={"status": status})
    asked: dict[str, Any] = {
        "cluster": "prod",
        "topic": "orders",
        "partition": 0,
        "start_offset": 100,
        **where,
    }
    found = candidate_at([c], **asked)
    assert isinstance(found, str) and found.startswith(f"{NOT_PROPOSED}: ") and said in found, found
    assert "never aborts what it has not proven" in found


def test_candidate_at_refuses_two_proposed_candidates_for_one_offset() -> None:
    a = a_candidate(cluster="prod")
    b = a.model_copy(update={"candidate_id": "other-id"})
    found = candidate_at([a, b], cluster="prod", topic="orders", partition=0, start_offset=100)
    assert isinstance(found, str) and "several candidates" in found and "other-id" in found


def test_abort_by_offsets_refuses_with_exit_3_when_nothing_is_proposed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    c = a_candidate(cluster="prod")
    monkeypatch.setattr(admin.cli.main, "_read_candidates", lambda *a: {c.candidate_id: c})
    monkeypatch.setattr(
        admin.cli.main, "connect_admin", lambda *a, **k: pytest.fail("nothing to connect for")
    )
    monkeypatch.setattr(admin.cli.main, "_setup_logging", lambda level: None)
    argv = ["proposals", "abort", "--topic", "orders", "--partition", "0", "--start-offset", "99"]
    code, out, err = _run([*argv, "--cluster", "prod", "--execute", "--output", "json"], capsys)
    assert (code, out) == (EXIT_REFUSED, "")
    said = json.loads(err)
    assert said["exit_code"] == EXIT_REFUSED and f"no marker written: {NOT_PROPOSED}:" in said["error"]


@pytest.mark.parametrize("command", ["abort", "commit"])
def test_a_withdrawn_candidate_named_by_its_id_is_refused(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    # Before, only the offsets' path looked at the status: `proposals abort ID --execute` of a WITHDRAWN candidate
    # went on to live verification and a marker, with the job's proof taken back.
    status, reason = CandidateStatus.WITHDRAWN, "UNCONFIRMED (collector-clock-ahead)"
    c = a_candidate(cluster="prod").model_copy(
        update={"status": status, "resolved_at_ms": 1, "withdrawn_reason": reason}
    )
    monkeypatch.setattr(admin.cli.main, "_read_candidates", lambda *a: {c.candidate_id: c})
    monkeypatch.setattr(
        admin.cli.main, "connect_admin", lambda *a, **k: pytest.fail("nothing to connect for")
    )
    monkeypatch.setattr(admin.cli.main, "_setup_logging", lambda level: None)
    argv = ["proposals", command, c.candidate_id, "--cluster", "prod", "--execute", "--output", "json"]
    code, out, err = _run(argv, capsys)
    assert (code, out) == (EXIT_REFUSED, "")
    said = json.loads(err)["error"]
    assert f"no marker written: {NOT_PROPOSED}: candidate {c.candidate_id} is WITHDRAWN: {reason}" in said


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["proposals", "abort"], id="neither"),
        pytest.param(
            ["proposals", "abort", "c-1", "--topic", "orders", "--partition", "0", "--start-offset", "1"],
            id="both",
        ),
        pytest.param(["proposals", "commit", "--topic", "orders", "--start-offset", "1"], id="no-partition"),
    ],
)
def test_abort_needs_an_id_or_all_three_offsets(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(argv, capsys)
    assert (code, out) == (EXIT_USAGE, "")
    assert "--topic, --partition and --start-offset" in err


# ------------------------------------------------------------------------------- the connect timeout


def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on: connections are refused at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def txnwatch(argv: list[str]) -> tuple[subprocess.CompletedProcess[str], float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TXNWATCH_")}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "txnwatch_cli", *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done, time.monotonic() - started


TIMEOUT_MS = 1500
# Python, pydantic and kafka-python take about a second to start here; the 2 shared cores make it vary.
MARGIN_S = 2.5


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["collect", "--once"], id="collect"),
        pytest.param(["collect", "--once", "--publish"], id="collect-publish"),
        pytest.param(["stream", "--metrics-port", "0"], id="stream"),
        pytest.param(["proposals", "list"], id="list"),
        pytest.param(["proposals", "show", "c-1"], id="show"),
        pytest.param(["proposals", "abort", "c-1"], id="abort"),
        pytest.param(["proposals", "commit", "c-1"], id="commit"),
        pytest.param(["proposals", "watch"], id="watch"),
        pytest.param(
            ["inspect", "partition", "--topic", "orders", "--partition", "0"], id="inspect-partition"
        ),
        pytest.param(["inspect", "coordinator-log"], id="inspect-coordinator-log"),
    ],
)
def test_an_unreachable_cluster_fails_within_the_timeout(argv: list[str], tmp_path: Path) -> None:
    # What starting the command costs before it tries the cluster: the same command with a client.properties
    # that is not there, refused once the command has loaded what it runs with (stream: Spark's Python side).
    missing = tmp_path / "missing.properties"
    usage, startup_s = txnwatch([*argv, "--command-config", str(missing)])
    assert usage.returncode == EXIT_USAGE, usage.stderr
    bootstrap = f"127.0.0.1:{closed_port()}"
    done, took_s = txnwatch([*argv, "--bootstrap-server", bootstrap, "--timeout-ms", str(TIMEOUT_MS)])
    assert done.returncode == EXIT_ERROR, done.stderr
    assert bootstrap in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert took_s <= TIMEOUT_MS / 1000 + startup_s + MARGIN_S, (took_s, startup_s)
    print(
        f"\n{' '.join(argv[:2])}: failed in {took_s:.1f} s (start-up {startup_s:.1f} s, timeout {TIMEOUT_MS} ms)"
    )
