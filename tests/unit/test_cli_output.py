"""What the commands print by default, the same way in both rooms: a table on a terminal, JSON into a pipe
(`collect --once`, `inspect partition`, `inspect coordinator-log`, and `stream`'s console), unless `--output` or
TXNWATCH_OUTPUT say otherwise; and a bad setting is one line and exit code 2 on every command."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from collector_fakes import T0, FakeCluster, FakeCoordinators, producer, start_batch

import admin.cli.main
import txnwatch_cli
from admin.inspect.report import decode_entry
from admin.wire.types import Offsets
from common.settings import Settings
from detectors.codec import TxnLogKey, TxnLogValue, TxnStatus, encode_key, encode_value

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("TXNWATCH_"):
            monkeypatch.delenv(key)


@dataclass
class FakeBoth(FakeCluster, FakeCoordinators):
    pass


class _Closable:
    def close(self) -> None:
        pass


def _cluster() -> FakeBoth:
    return FakeBoth(
        leaders={("orders", 0): 1},
        producers={("orders", 0): [producer()]},
        starts={(("orders", 0), 100): start_batch()},
        offsets={("orders", 0): Offsets(100, 103)},
    )


def _log_entry() -> Any:
    value = TxnLogValue(
        version=1,
        producer_id=1000,
        producer_epoch=5,
        transaction_timeout_ms=60_000,
        status=TxnStatus.ONGOING,
        partitions=(("orders", (0,)),),
        last_update_timestamp_ms=T0 + 1,
        start_timestamp_ms=T0,
    )
    return decode_entry(2, 41, T0 + 2, encode_key(TxnLogKey("tx-1")), encode_value(value))


@pytest.fixture
def admin_cli(monkeypatch: pytest.MonkeyPatch) -> Any:
    """admin/cli/main.py against fakes: no Kafka, and the terminal question answered by the test."""
    fake = _cluster()
    monkeypatch.setattr(admin.cli.main, "connect_admin", lambda *a, **k: _Closable())
    monkeypatch.setattr(admin.cli.main, "KafkaWire", lambda *a, **k: fake)
    monkeypatch.setattr(admin.cli.main, "consumer_for", lambda *a, **k: _Closable())
    monkeypatch.setattr(admin.cli.main, "read_coordinator_log", lambda *a, **k: iter([_log_entry()]))
    monkeypatch.setattr(admin.cli.main, "_setup_logging", lambda level: None)
    return admin.cli.main


ADMIN_COMMANDS = {
    "collect --once": ["collect", "--once"],
    "inspect partition": ["inspect", "partition", "--topic", "orders", "--partition", "0"],
    "inspect coordinator-log": ["inspect", "coordinator-log", "--max-records", "1"],
}
# How each command's table starts.
TABLE_STARTS = {
    "collect --once": "sweep ",
    "inspect partition": "orders-0  leader 1",
    "inspect coordinator-log": "Partition\tOffset",
}


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = txnwatch_cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def _is_json(out: str) -> bool:
    try:
        for line in out.splitlines():
            json.loads(line)
    except ValueError:
        return False
    return bool(out.strip())


@pytest.mark.parametrize("command", list(ADMIN_COMMANDS))
@pytest.mark.parametrize(
    ("terminal", "extra", "env", "shown"),
    [
        pytest.param(True, [], None, "table", id="terminal-gets-a-table"),
        pytest.param(False, [], None, "json", id="pipe-gets-json"),
        pytest.param(False, ["--output", "table"], None, "table", id="flag-asks-for-a-table-in-a-pipe"),
        pytest.param(True, ["--output", "json"], None, "json", id="flag-asks-for-json-on-a-terminal"),
        pytest.param(True, [], "json", "json", id="environment-asks-for-json"),
        pytest.param(False, ["--output", "table"], "json", "table", id="flag-wins-over-the-environment"),
    ],
)
def test_admin_commands_default_to_a_table_on_a_terminal_and_json_otherwise(
    command: str,
    terminal: bool,
    extra: list[str],
    env: str | None,
    shown: str,
    admin_cli: Any,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(admin_cli, "_is_terminal", lambda: terminal)
    if env is not None:
        monkeypatch.setenv("TXNWATCH_OUTPUT", env)
    code, out, err = _run([*ADMIN_COMMANDS[command], *extra], capsys)
    assert code == 0, err
    if shown == "json":
        assert _is_json(out), out
    else:
        assert out.startswith(TABLE_STARTS[command]) and not _is_json(out), out


def test_collect_once_json_is_the_sweep(admin_cli: Any, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(["collect", "--once", "--output", "json", "--cluster", "c1"], capsys)
    sweep = json.loads(out)
    assert code == 0 and sweep["partitions_covered"] == 1 and sweep["snapshots"][0]["cluster"] == "c1"


def test_stream_console_follows_the_same_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    from streaming.cli import load_settings, stream_options

    parse = txnwatch_cli.build_parser().parse_args
    for argv, terminal, shown in (
        (["stream"], True, "table"),
        (["stream"], False, "json"),
        (["stream", "--output", "table"], False, "table"),
        (["stream", "--output", "json"], True, "json"),
    ):
        settings, _, props = load_settings(parse(argv))
        assert stream_options(settings, props, is_terminal=terminal).output == shown, (argv, terminal)


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["collect", "--once"], id="collect"),
        pytest.param(
            ["inspect", "partition", "--topic", "orders", "--partition", "0"], id="inspect-partition"
        ),
        pytest.param(["inspect", "coordinator-log"], id="inspect-coordinator-log"),
        pytest.param(["stream"], id="stream"),
    ],
)
def test_a_bad_setting_is_one_line_and_exit_2_everywhere(
    argv: list[str], admin_cli: Any, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    missing = tmp_path / "missing.properties"
    code, out, err = _run([*argv, "--command-config", str(missing)], capsys)
    command = " ".join(a for a in argv[:2] if not a.startswith("-"))
    assert (code, out) == (2, "")
    assert err == f"txnwatch {command}: --command-config {missing}: No such file or directory\n"


def test_settings_from_the_environment_reach_inspect(
    admin_cli: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # inspect judges with the detection limits of the one Settings object, like the job.
    seen: list[Any] = []
    real = admin_cli.inspect_partition

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs.get("limits"))
        return real(*args, **kwargs)

    monkeypatch.setattr(admin_cli, "inspect_partition", spy)
    monkeypatch.setenv("TXNWATCH_DETECTION__GRACE_MS", "1234")
    code, _, err = _run(["inspect", "partition", "--topic", "orders", "--partition", "0"], capsys)
    assert code == 0, err
    assert seen == [Settings().detection] and seen[0].grace_ms == 1234
