"""The flags every txnwatch command shares, defined once for admin/ and streaming/, and how the environment,
`--command-config` and the command line make one `Settings` (in that order: flags win).

argparse is stdlib and this module does no I/O: the apps pass in how to read the properties file and whether
stdout is a terminal.
"""

from __future__ import annotations

import argparse
import textwrap
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal, NamedTuple, get_args

from pydantic import BaseModel, ValidationError

from common.client_properties import ClientPropertiesError
from common.settings import (
    KafkaSettings,
    LogLevel,
    OutputChoice,
    Settings,
    kafka_settings_from_properties,
    overlay,
)
from common.topics import TopicSettings

# ------------------------------------------------------------------------------------------ exit codes

# Exit codes of every txnwatch command. admin/proposals/verified_marker.py returns the same numbers for the markers' outcomes
# (EXIT_DONE ... EXIT_COLLISION); tests/unit/test_cli_conventions.py holds them to this table.
EXIT_DONE = 0
EXIT_ERROR = 1
EXIT_USAGE = 2  # argparse's own code for bad flags
EXIT_REFUSED = 3
EXIT_ALREADY_RESOLVED = 4
EXIT_COLLISION = 5
EXIT_CANDIDATES_LISTED = 6
EXIT_INTERRUPTED = 130  # as a shell reports SIGINT

ALL_COMMANDS = (
    "collect",
    "stream",
    "inspect partition",
    "inspect coordinator-log",
    "proposals list",
    "proposals show",
    "proposals abort",
    "proposals commit",
    "proposals watch",
)
_MARKER_COMMANDS = ("proposals abort", "proposals commit")


class ExitCode(NamedTuple):
    """One exit code: its number, a short name, the commands that may end with it, and what it means."""

    code: int
    name: str
    commands: tuple[str, ...]
    meaning: str


# The one table of exit codes: each command's --help epilog is made from it, and docs/proposals.md ("Exit codes")
# holds the same rows (tests/unit/test_cli_conventions.py compares them).
EXIT_CODE_TABLE: tuple[ExitCode, ...] = (
    ExitCode(EXIT_DONE, "ok", ALL_COMMANDS, "done"),
    ExitCode(
        EXIT_ERROR,
        "error",
        ALL_COMMANDS,
        "error: the cluster unreachable within --timeout-ms, an ACL missing, a topic unreadable, a request "
        "failed, or (stream) the stream extra not installed or a query failed: the message says which and what "
        "to do",
    ),
    ExitCode(
        EXIT_USAGE,
        "usage",
        ALL_COMMANDS,
        "bad flags, settings, client.properties or (watch) policy, or (stream) an interval Spark refuses when it "
        "plans the query",
    ),
    ExitCode(EXIT_REFUSED, "refused", _MARKER_COMMANDS, "refused: no marker written"),
    ExitCode(
        EXIT_ALREADY_RESOLVED,
        "already-resolved",
        _MARKER_COMMANDS,
        "nothing to do: an earlier (or concurrent) run of txnwatch wrote the marker",
    ),
    ExitCode(
        EXIT_COLLISION,
        "collision",
        _MARKER_COMMANDS,
        "the marker was written, but the producer id's live owner moved between verify and marker",
    ),
    ExitCode(
        EXIT_CANDIDATES_LISTED,
        "candidates-listed",
        ("proposals list",),
        "with --fail-if-any: at least one pending candidate was listed",
    ),
    ExitCode(
        EXIT_INTERRUPTED,
        "interrupted",
        ALL_COMMANDS,
        "interrupted by Ctrl-C (collect, stream, inspect coordinator-log and proposals watch stop cleanly on the "
        "first one, exit 0, and are interrupted by a second)",
    ),
)


def exit_codes_epilog(command: str, detail: Mapping[int, str] | None = None) -> str:
    """The `exit codes:` lines of `command`'s --help, from `EXIT_CODE_TABLE` (`detail`: a command's own wording
    of some codes)."""
    lines = ["exit codes:"]
    for e in EXIT_CODE_TABLE:
        if command in e.commands:
            text = (detail or {}).get(e.code, e.meaning)
            lines += textwrap.wrap(
                text,
                width=110,
                initial_indent=f"  {e.code:<3} ",
                subsequent_indent=" " * 6,
                break_on_hyphens=False,  # a flag's name stays on one line
            )
    return "\n".join(lines)


class KeepLines(argparse.HelpFormatter):
    """Wraps one-line texts (the descriptions) as argparse does, and keeps texts of several lines (the epilogs:
    exit codes, an example policy) as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n" in text:
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


# ------------------------------------------------------------------------------------ duration flags

# Durations in flag names end in `-ms`, as in Kafka's tools. A flag whose settings field is in seconds or a Spark
# interval keeps that field: the `-ms` flag's action converts, and the old spelling stays as a hidden alias with
# the same dest (charts and scripts pass it).


def positive_ms(text: str) -> int:
    """A duration flag's value: whole milliseconds, more than 0."""
    value = _whole_ms(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 milliseconds (got {value})")
    return value


def non_negative_ms(text: str) -> int:
    """A duration flag's value where 0 means "never": whole milliseconds, 0 or more."""
    value = _whole_ms(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more milliseconds (got {value})")
    return value


def _whole_ms(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number of milliseconds: {text!r}") from None


class StoreSeconds(argparse.Action):
    """A `-ms` flag that sets the same seconds as the old spelling it replaces (a hidden alias with the same
    dest): the settings and the code behind them stay in seconds."""

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, *_: Any
    ) -> None:
        setattr(namespace, self.dest, int(values) / 1000)


class StoreSparkInterval(argparse.Action):
    """A `-ms` flag that sets the Spark interval string its old spelling took ("5000 milliseconds"): Spark reads
    the settings field, and TXNWATCH_STREAM__* may still give any interval Spark reads ("5 seconds")."""

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, *_: Any
    ) -> None:
        setattr(namespace, self.dest, f"{int(values)} milliseconds")


def add_duration_flag(
    parser: argparse.ArgumentParser,
    flag: str,
    *,
    dest: str,
    old: str,
    old_type: Callable[[str], Any],
    action: type[argparse.Action],
    help_text: str,
    ms_type: Callable[[str], int] = positive_ms,
) -> None:
    """Add the `-ms` flag `flag` and its old spelling `old` (hidden, same dest; not both at once)."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument(flag, dest=dest, type=ms_type, action=action, metavar="MS", help=help_text)
    group.add_argument(old, dest=dest, type=old_type, help=argparse.SUPPRESS)


# argparse dest → the Settings field it overrides ("section.field"), for the flags of add_common_flags.
COMMON_FLAGS: dict[str, str] = {
    "bootstrap_server": "kafka.bootstrap_servers",
    "cluster": "cluster",
    "topic_prefix": "topics.prefix",
    "output": "output",
    "log_level": "log_level",
}

# A flag's Settings field, or several (one flag setting the same field of two sections).
FlagTargets = Mapping[str, str | tuple[str, ...]]


class SettingsError(ValueError):
    """Settings an operator must fix, in one line that names the flag or file concerned."""


def add_common_flags(parser: argparse.ArgumentParser) -> None:
    """Add `--bootstrap-server`, `--command-config`, `--output`, `--cluster`, `--topic-prefix` and `--log-level`.

    Every flag defaults to None (unset): `settings_from` then keeps what the environment says.
    """
    parser.add_argument(
        "--bootstrap-server",
        metavar="HOST:PORT[,...]",
        help="the Kafka cluster's bootstrap servers (env TXNWATCH_KAFKA__BOOTSTRAP_SERVERS; default: "
        f"{default_text(KafkaSettings, 'bootstrap_servers')})",
    )
    parser.add_argument(
        "--command-config",
        type=Path,
        metavar="client.properties",
        help="Kafka client properties (security.protocol, sasl.*, ssl.*), as for Kafka's own tools",
    )
    parser.add_argument(
        "--output",
        choices=get_args(OutputChoice),
        help=f"console output (env TXNWATCH_OUTPUT; default: {default_text(Settings, 'output')}, a table on a "
        "terminal and JSON otherwise)",
    )
    parser.add_argument(
        "--cluster",
        help="cluster name in records and metric labels (env TXNWATCH_CLUSTER; default: "
        f"'{default_text(Settings, 'cluster')}')",
    )
    parser.add_argument(
        "--topic-prefix",
        help="prefix of txnwatch's own topics (env TXNWATCH_TOPICS__PREFIX; default: "
        f"{default_text(TopicSettings, 'prefix')})",
    )
    parser.add_argument(
        "--log-level",
        choices=get_args(LogLevel),
        help="log level on stderr (env TXNWATCH_LOG_LEVEL; default: INFO, WARNING for inspect)",
    )


def flag_overrides(args: argparse.Namespace, flags: FlagTargets) -> dict[str, Any]:
    """The flags given on the command line (not None) as a nested update for `settings.overlay`.

    Args:
        args: parsed command line.
        flags: argparse dest → "section.field" (or several) it sets.
    """
    out: dict[str, Any] = {}
    for dest, targets in flags.items():
        value = getattr(args, dest, None)
        if value is None:
            continue
        for target in (targets,) if isinstance(targets, str) else targets:
            *sections, name = target.split(".")
            node = out
            for section in sections:
                node = node.setdefault(section, {})
            node[name] = value
    return out


def settings_from(
    args: argparse.Namespace,
    *,
    flags: FlagTargets | None = None,
    read_text: Callable[[Path], str] | None = None,
    environment: Settings | None = None,
) -> tuple[Settings, tuple[str, ...]]:
    """Settings for one command: the environment, then `--command-config`, then the flags.

    Args:
        args: parsed command line with the flags of `add_common_flags`.
        flags: the command's own flags → the Settings fields they set (see `flag_overrides`).
        read_text: reads the `--command-config` file (the apps pass `Path.read_text`); needed only when it is given.
        environment: the settings to start from; None builds `Settings()` from `TXNWATCH_*`.

    Returns:
        The settings and the client.properties keys kafka-python does not use (for a warning).

    Raises:
        SettingsError: the properties file cannot be read or holds settings kafka-python cannot honour, or the
            environment or a flag gives a value the settings reject (one line naming the flag or field).
    """
    targets = {**COMMON_FLAGS, **(flags or {})}
    try:
        base = Settings() if environment is None else environment
    except ValidationError as exc:
        raise SettingsError(f"environment: {_one_line(exc, args, {})}") from exc
    ignored: tuple[str, ...] = ()
    path: Path | None = getattr(args, "command_config", None)
    if path is not None:
        if read_text is None:
            raise ValueError("settings_from: --command-config given without read_text")
        try:
            text = read_text(path)
        except OSError as exc:
            raise SettingsError(f"--command-config {path}: {exc.strerror or exc}") from exc
        except UnicodeDecodeError as exc:
            raise SettingsError(
                f"--command-config {path}: not UTF-8 text ({exc.reason} at byte {exc.start})"
            ) from exc
        try:
            kafka, ignored = kafka_settings_from_properties(text, base=base.kafka)
        except (ClientPropertiesError, ValidationError) as exc:
            what = _one_line(exc, args, {}) if isinstance(exc, ValidationError) else str(exc)
            raise SettingsError(f"--command-config {path}: {what}") from exc
        file_problem = bootstrap_problem(kafka.bootstrap_servers)
        if file_problem is not None and kafka.bootstrap_servers != base.kafka.bootstrap_servers:
            raise SettingsError(f"--command-config {path}: bootstrap.servers {file_problem}")
        base = base.model_copy(update={"kafka": kafka})
    try:
        settings = overlay(base, flag_overrides(args, targets))
    except ValidationError as exc:
        raise SettingsError(_one_line(exc, args, targets)) from exc
    problem = bootstrap_problem(settings.kafka.bootstrap_servers)
    if problem is not None:
        given = getattr(args, "bootstrap_server", None) is not None
        where = "--bootstrap-server" if given else "TXNWATCH_KAFKA__BOOTSTRAP_SERVERS"
        raise SettingsError(f"{where} {problem}")
    return settings, ignored


def _one_line(exc: ValidationError, args: argparse.Namespace, flags: FlagTargets) -> str:
    """pydantic's error list (several lines per error) as one line, each error named by the flag that set the
    field when one did, else by the field."""
    by_field: dict[str, str] = {}
    for dest, targets in flags.items():
        if getattr(args, dest, None) is None:
            continue
        for target in (targets,) if isinstance(targets, str) else targets:
            by_field.setdefault(target.rsplit(".", 1)[-1], "--" + dest.replace("_", "-"))
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err["loc"]) or exc.title
        flag = by_field.get(str(err["loc"][-1]) if err["loc"] else "")
        name = f"{flag} ({loc})" if flag else loc
        got = repr(err.get("input"))
        parts.append(f"{name}: {err['msg']} (got {got[:60] + '...' if len(got) > 60 else got})")
    return "; ".join(parts)


def bootstrap_problem(servers: str) -> str | None:
    """What is wrong with a bootstrap server list (`host[:port][,...]`), or None; kafka-python would raise a
    bare ValueError for a port that is not a number at its first connection."""
    for entry in servers.split(","):
        entry = entry.strip()
        if not entry:
            return f"{servers!r}: an empty address"
        host, sep, port = entry.rpartition(":") if not entry.endswith("]") else ("", "", "")
        if sep and (not port.isdigit() or not 0 < int(port) < 65536):
            return f"{servers!r}: port {port!r} of {entry!r} is not a number from 1 to 65535"
        if sep and not host:
            return f"{servers!r}: {entry!r} has no host"
    return None


def default_text(model: type[BaseModel], field: str) -> str:
    """A settings field's default as a flag's help text shows it (a whole float without its `.0`: 10.0 → "10"), read
    from the model so the help cannot drift from the settings it describes (the flags themselves default to None,
    so that the environment can set the same fields)."""
    value = model.model_fields[field].default
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def output_format(choice: OutputChoice, *, is_terminal: bool) -> Literal["table", "json"]:
    """What `--output` / TXNWATCH_OUTPUT means here: "auto" is a table for people, JSON for pipes and scripts."""
    if choice == "auto":
        return "table" if is_terminal else "json"
    return choice
