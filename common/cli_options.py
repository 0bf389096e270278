"""The flags every txnwatch command shares, defined once for admin/ and streaming/, and how the environment,
`--command-config` and the command line make one `Settings` (in that order: flags win).

argparse is stdlib and this module does no I/O: the apps pass in how to read the properties file and whether
stdout is a terminal.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal, get_args

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
