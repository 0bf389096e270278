"""Bad command lines and bad `client.properties` files, through the real console script: a non-zero exit code, one
line on stderr that names the problem, never a traceback.

argparse's own errors (unknown flag, a value of the wrong type, a missing argument) print the usage first, as
Kafka's tools do; their last line names the problem. Every other error is the one line alone. Each case fails
before any connection is made (nothing here needs a broker).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
USAGE = 2  # argparse's exit code, and txnwatch's for settings an operator must fix

# (argv, expected in the problem line). "{props}" is replaced by the client.properties file of the case.
FLAG_CASES = [
    pytest.param(
        ["collect", "--interval-ms", "abc"],
        "argument --interval-ms: invalid number of milliseconds: 'abc'",
        id="collect-interval-not-a-number",
    ),
    pytest.param(
        ["collect", "--interval-ms", "-5", "--once"],
        "argument --interval-ms: must be more than 0 milliseconds (got -5)",
        id="collect-interval-negative",
    ),
    pytest.param(
        ["collect", "--output", "xml"],
        "argument --output: invalid choice: 'xml'",
        id="collect-output-unknown",
    ),
    pytest.param(
        ["collect", "--describe-batch-size", "501", "--once"],
        "--describe-batch-size (describe_batch_size): Input should be less than or equal to 500",
        id="collect-batch-over-kafka-max",
    ),
    pytest.param(
        ["collect", "--metrics-port", "99999", "--once"],
        "--metrics-port (metrics_port): Input should be less than or equal to 65535",
        id="collect-port-out-of-range",
    ),
    pytest.param(
        ["collect", "--bootstrap-server", "broker:nine", "--once"],
        "--bootstrap-server 'broker:nine': port 'nine'",
        id="collect-bootstrap-port-not-a-number",
    ),
    pytest.param(
        ["collect", "--bootstrap-server", "a:9092,,b:9092", "--once"],
        "an empty address",
        id="collect-bootstrap-empty-entry",
    ),
    pytest.param(
        ["collect", "--cluster", "", "--once"],
        "--cluster (cluster): String should have at least 1 character",
        id="collect-empty-cluster",
    ),
    pytest.param(
        ["collect", "--no-such-flag"], "unrecognized arguments: --no-such-flag", id="collect-unknown-flag"
    ),
    pytest.param(
        ["stream", "--state-buckets", "0"],
        "--state-buckets (state_buckets): Input should be greater than or equal to 1",
        id="stream-zero-buckets",
    ),
    pytest.param(
        ["stream", "--conf", "spark.sql.shuffle.partitions"],
        "argument --conf: expected KEY=VALUE",
        id="stream-conf-without-value",
    ),
    pytest.param(
        ["stream", "--coordinator-source", "ldap"],
        "argument --coordinator-source: invalid choice: 'ldap'",
        id="stream-source-unknown",
    ),
    pytest.param(
        ["stream", "--bootstrap-server", "127.0.0.1:0"],
        "port '0' of '127.0.0.1:0' is not a number from 1 to 65535",
        id="stream-bootstrap-port-zero",
    ),
    pytest.param(
        ["stream", "--max-offsets-per-trigger", "-1"],
        "--max-offsets-per-trigger (max_offsets_per_trigger): Input should be greater than or equal to 1",
        id="stream-negative-rate-limit",
    ),
    pytest.param(
        ["inspect", "partition", "--topic", "orders", "--partition", "first"],
        "argument --partition: invalid int value: 'first'",
        id="inspect-partition-not-a-number",
    ),
    pytest.param(
        ["inspect", "partition", "--partition", "0"],
        "the following arguments are required: --topic",
        id="inspect-partition-no-topic",
    ),
    pytest.param(
        ["inspect", "coordinator-log", "--max-records", "many"],
        "argument --max-records: invalid int value: 'many'",
        id="inspect-log-max-records",
    ),
    pytest.param(["inspect"], "the following arguments are required: WHAT", id="inspect-without-what"),
    pytest.param(
        ["proposals", "show"], "the following arguments are required: ID", id="proposals-show-without-id"
    ),
    pytest.param(
        ["proposals", "list", "--timeout-ms", "soon"],
        "argument --timeout-ms: invalid number of milliseconds: 'soon'",
        id="proposals-list-timeout",
    ),
    pytest.param(
        ["proposals", "abort", "--bootstrap-server", "[::1]:x", "c1"],
        "port 'x' of '[::1]:x'",
        id="proposals-abort-bootstrap-port",
    ),
    pytest.param(
        ["proposals", "frobnicate"],
        "argument WHAT: invalid choice: 'frobnicate'",
        id="proposals-unknown-subcommand",
    ),
]

# (client.properties text, or a directory / non-UTF-8 bytes; expected after "--command-config <path>: ").
PROPERTIES_CASES = [
    pytest.param(None, "No such file or directory", id="missing-file"),
    pytest.param("<dir>", "Is a directory", id="unreadable-a-directory"),
    pytest.param(b"\xff\xfesecurity.protocol=SASL_SSL\n", "not UTF-8 text", id="unreadable-not-utf8"),
    pytest.param(
        "security.protocol=SASL_SSL\nsasl.mechanism=KERBEROS5\n",
        "sasl.mechanism: 'KERBEROS5' is not one of PLAIN",
        id="unknown-sasl-mechanism",
    ),
    pytest.param(
        "security.protocol=SASL_PLAIN\n",
        "security.protocol: 'SASL_PLAIN' is not one of PLAINTEXT",
        id="unknown-security-protocol",
    ),
    pytest.param("sasl.jaas.config=\\u00zz\n", "malformed \\uxxxx escape", id="bad-line-unicode-escape"),
    pytest.param(
        "request.timeout.ms=30s\n", "request.timeout.ms: '30s' is not a whole number", id="bad-line-number"
    ),
    pytest.param(
        "security.protocol=SASL_SSL\nsasl.mechanism=PLAIN\nsasl.jaas.config=user=alice\n",
        "sasl.jaas.config: cannot parse",
        id="bad-jaas-config",
    ),
    pytest.param(
        "ssl.truststore.location=/etc/kafka/truststore.jks\n",
        "is a JKS store, which kafka-python cannot read",
        id="jks-store",
    ),
    pytest.param(
        "bootstrap.servers=broker:port\n",
        "bootstrap.servers 'broker:port': port 'port'",
        id="bootstrap-in-file",
    ),
]
PROPERTIES_COMMANDS = [
    ["collect", "--once"],
    ["stream"],
    ["inspect", "partition", "--topic", "orders", "--partition", "0"],
    ["proposals", "list"],
]


SUBCOMMANDS = {"inspect": ("partition", "coordinator-log"), "proposals": ("list", "show", "abort", "watch")}


def command_name(argv: list[str]) -> str:
    """How argparse and txnwatch name the command in their messages ("inspect partition", "stream", ...)."""
    if len(argv) > 1 and argv[1] in SUBCOMMANDS.get(argv[0], ()):
        return f"{argv[0]} {argv[1]}"
    return argv[0]


def txnwatch(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "txnwatch_cli", *argv],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )


def problem_line(result: subprocess.CompletedProcess[str], command: str) -> str:
    """The one line naming the problem (argparse may print its usage before it); fails on anything else."""
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode != 0
    lines = result.stderr.splitlines()
    assert lines, "nothing on stderr"
    *before, last = lines
    # argparse names the top-level parser for a flag no subcommand knows
    assert last.startswith((f"txnwatch {command}", "txnwatch: error:")), result.stderr
    if before:  # only argparse's usage may come first
        assert before[0].startswith("usage: txnwatch") and "error:" in last, result.stderr
        assert all(ln.startswith(" ") for ln in before[1:]), result.stderr
    return last


@pytest.mark.parametrize(("argv", "expected"), FLAG_CASES)
def test_a_bad_flag_is_named_in_one_line(argv: list[str], expected: str) -> None:
    result = txnwatch(argv)
    line = problem_line(result, command_name(argv))
    assert result.returncode == USAGE
    assert expected in line, line


@pytest.mark.parametrize(
    ("command", "content", "expected"),
    [
        # every command reads the file the same way (common/cli_options.settings_from): each case is run with
        # one command in turn, the missing file with all four
        pytest.param(PROPERTIES_COMMANDS[i % len(PROPERTIES_COMMANDS)], *case.values, id=case.id)
        for i, case in enumerate(PROPERTIES_CASES)
    ]
    + [
        pytest.param(c, None, "No such file or directory", id=f"missing-file-{c[0]}")
        for c in PROPERTIES_COMMANDS[1:]
    ],
)
def test_a_bad_client_properties_is_named_in_one_line(
    command: list[str], content: str | bytes | None, expected: str, tmp_path: Path
) -> None:
    path = tmp_path / "client.properties"
    if content == "<dir>":
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    result = txnwatch([*command, "--command-config", str(path)])
    name = command_name(command)
    line = problem_line(result, name)
    assert len(result.stderr.splitlines()) == 1, result.stderr  # no usage: the flags parsed
    assert result.returncode == USAGE
    assert line.startswith(f"txnwatch {name}: --command-config {path}: ") and expected in line, line


def test_a_bad_environment_variable_is_named_in_one_line() -> None:
    result = txnwatch(["stream"], env={"TXNWATCH_STREAM__STATE_BUCKETS": "many"})
    line = problem_line(result, "stream")
    assert result.returncode == USAGE
    assert line == (
        "txnwatch stream: environment: stream.state_buckets: Input should be a valid integer, unable to parse "
        "string as an integer (got 'many')"
    )
