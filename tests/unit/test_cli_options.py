"""The flags every command shares (common/cli_options.py): the same flags with the same help on `collect`,
`inspect partition`, `inspect coordinator-log` and `stream`, and one precedence for all of them:
TXNWATCH_* environment → `--command-config` → flags (flags win)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Literal, get_args, get_origin

import pytest
from pydantic import BaseModel

import txnwatch_cli
from admin.cli import main as admin_cli
from common.cli_options import (
    COMMON_FLAGS,
    FlagTargets,
    SettingsError,
    add_common_flags,
    default_text,
    flag_overrides,
    output_format,
    settings_from,
)
from common.settings import CollectorSettings, Settings, StreamSettings
from streaming import cli as stream_cli

pytestmark = pytest.mark.unit

# Each command with the arguments it requires besides the common flags.
COMMANDS: dict[str, list[str]] = {
    "collect": ["collect"],
    "inspect partition": ["inspect", "partition", "--topic", "t", "--partition", "0"],
    "inspect coordinator-log": ["inspect", "coordinator-log"],
    "stream": ["stream"],
}
COMMON_OPTIONS = (
    "--bootstrap-server",
    "--command-config",
    "--output",
    "--cluster",
    "--topic-prefix",
    "--log-level",
)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("TXNWATCH_"):
            monkeypatch.delenv(key)


def _subparser(*path: str) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = txnwatch_cli.build_parser()
    for name in path:
        (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[name]
    return parser


def _common_actions(parser: argparse.ArgumentParser) -> dict[str, tuple[object, ...]]:
    return {
        a.option_strings[0]: (a.dest, a.help, a.choices, a.default, a.type, a.metavar, a.nargs)
        for a in parser._actions
        if a.option_strings and a.option_strings[0] in COMMON_OPTIONS
    }


def test_every_command_has_the_common_flags_with_identical_help() -> None:
    reference = argparse.ArgumentParser()
    add_common_flags(reference)
    expected = _common_actions(reference)
    assert sorted(expected) == sorted(COMMON_OPTIONS)
    for name in COMMANDS:
        assert _common_actions(_subparser(*name.split())) == expected, name


def test_common_flags_default_to_unset_so_the_environment_counts() -> None:
    for name, argv in COMMANDS.items():
        args = txnwatch_cli.build_parser().parse_args(argv)
        assert [getattr(args, dest) for dest in (*COMMON_FLAGS, "command_config")] == [None] * 6, name


PROPERTIES = "bootstrap.servers=file:9092\nsecurity.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\n"


def _read(path: Path) -> str:
    assert path == Path("client.properties")
    return PROPERTIES


@pytest.mark.parametrize("command", list(COMMANDS))
def test_environment_then_command_config_then_flags(command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TXNWATCH_KAFKA__BOOTSTRAP_SERVERS", "env:9092")
    monkeypatch.setenv("TXNWATCH_KAFKA__CLIENT_ID", "from-env")
    monkeypatch.setenv("TXNWATCH_CLUSTER", "env-cluster")
    monkeypatch.setenv("TXNWATCH_TOPICS__PREFIX", "env-prefix")
    monkeypatch.setenv("TXNWATCH_OUTPUT", "json")
    monkeypatch.setenv("TXNWATCH_LOG_LEVEL", "ERROR")
    parse = txnwatch_cli.build_parser().parse_args

    only_env, _ = settings_from(parse(COMMANDS[command]))
    assert (only_env.kafka.bootstrap_servers, only_env.cluster, only_env.topics.prefix) == (
        "env:9092",
        "env-cluster",
        "env-prefix",
    )
    assert (only_env.output, only_env.log_level) == ("json", "ERROR")

    with_file, _ = settings_from(
        parse([*COMMANDS[command], "--command-config", "client.properties"]), read_text=_read
    )
    k = with_file.kafka
    assert (k.bootstrap_servers, k.security_protocol, k.client_id) == (
        "file:9092",
        "SASL_PLAINTEXT",
        "from-env",
    )

    flags = [
        *(
            "--command-config",
            "client.properties",
            "--bootstrap-server",
            "flag:9092",
            "--cluster",
            "flag-cluster",
        ),
        *("--topic-prefix", "flag-prefix", "--output", "table", "--log-level", "DEBUG"),
    ]
    s, _ = settings_from(parse([*COMMANDS[command], *flags]), read_text=_read)
    assert (s.kafka.bootstrap_servers, s.kafka.security_protocol, s.kafka.client_id) == (
        "flag:9092",
        "SASL_PLAINTEXT",  # the file still counts for what no flag says
        "from-env",
    )
    assert (s.cluster, s.topics.producer_state, s.output, s.log_level) == (
        "flag-cluster",
        "flag-prefix.producer-state",
        "table",
        "DEBUG",
    )


def test_ignored_properties_are_returned_for_a_warning() -> None:
    args = argparse.Namespace(command_config=Path("p"))
    _, ignored = settings_from(args, read_text=lambda _: "group.id=x\n", environment=Settings())
    assert ignored == ("group.id: unknown to txnwatch (dropped)",)


@pytest.mark.parametrize(
    ("read_text", "message"),
    [
        pytest.param(
            Path.read_text, "--command-config /nonexistent/client.properties: No such file", id="missing-file"
        ),
        pytest.param(
            lambda _: "sasl.mechanism=OAUTHBEARER\n",
            "--command-config /nonexistent/client.properties: sasl.mechanism=OAUTHBEARER",
            id="unusable-setting",
        ),
    ],
)
def test_a_bad_command_config_is_one_line_naming_the_file(read_text: object, message: str) -> None:
    args = argparse.Namespace(command_config=Path("/nonexistent/client.properties"))
    with pytest.raises(SettingsError) as info:
        settings_from(args, read_text=read_text, environment=Settings())  # type: ignore[arg-type]
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


def test_command_flags_set_their_section_and_may_set_several_fields() -> None:
    args = argparse.Namespace(interval=2.5, partitions=12, unset=None)
    update = flag_overrides(
        args,
        {
            "interval": "collector.interval_s",
            "partitions": (
                "collector.producer_state_topic.partitions",
                "collector.coordinator_state_topic.partitions",
            ),
            "unset": "cluster",
        },
    )
    assert update == {
        "collector": {
            "interval_s": 2.5,
            "producer_state_topic": {"partitions": 12},
            "coordinator_state_topic": {"partitions": 12},
        }
    }


@pytest.mark.parametrize(
    ("choice", "is_terminal", "shown"),
    [
        pytest.param("auto", True, "table", id="auto-on-a-terminal-is-a-table"),
        pytest.param("auto", False, "json", id="auto-into-a-pipe-is-json"),
        pytest.param("table", False, "table", id="asked-for-a-table"),
        pytest.param("json", True, "json", id="asked-for-json"),
    ],
)
def test_output_format(choice: str, is_terminal: bool, shown: str) -> None:
    assert output_format(choice, is_terminal=is_terminal) == shown  # type: ignore[arg-type]


# --------------------------------------------------------------------- choices and defaults come from Settings


def _settings_field(target: str) -> tuple[type[BaseModel], str]:
    """The model class and field name a flag target ("section.sub.field") names, walking Settings' annotations."""
    model: type[BaseModel] = Settings
    *sections, name = target.split(".")
    for section in sections:
        annotation = model.model_fields[section].annotation
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            raise AssertionError(f"{target}: {section} is not a settings section")
        model = annotation
    return model, name


def _literal_choices(model: type[BaseModel], name: str) -> tuple[object, ...] | None:
    annotation = model.model_fields[name].annotation
    return get_args(annotation) if get_origin(annotation) is Literal else None


@pytest.mark.parametrize(
    ("command", "flags"),
    [
        (("collect",), {**COMMON_FLAGS, **admin_cli.COLLECT_FLAGS}),
        (("stream",), {**COMMON_FLAGS, **stream_cli.STREAM_FLAGS}),
    ],
    ids=["collect", "stream"],
)
def test_flag_choices_and_defaults_are_the_settings(command: tuple[str, ...], flags: FlagTargets) -> None:
    # The flags default to None (the environment may set the same field), so what the help promises and what
    # argparse accepts must be read from the settings model, not written again.
    actions = {a.dest: a for a in _subparser(*command)._actions}
    checked = 0
    for dest, targets in flags.items():
        action = actions[dest]
        for target in (targets,) if isinstance(targets, str) else targets:
            model, name = _settings_field(target)
            literal = _literal_choices(model, name)
            if literal is not None:
                assert action.choices is not None and tuple(action.choices) == literal, dest
                checked += 1
            help_text = action.help or ""
            # A None default is said in words ("default: the one spark-submit gives", "--max-offsets-per-trigger").
            if "(default" in help_text and model.model_fields[name].default is not None:
                shown = default_text(model, name)
                said = (f"default {shown}", f"default: {shown}", f"default: '{shown}'")
                assert any(s in help_text for s in said), (dest, help_text)
                checked += 1
    assert checked >= 5


def test_default_text_is_read_from_the_model() -> None:
    assert default_text(CollectorSettings, "interval_s") == "10"
    assert default_text(CollectorSettings, "metrics_port") == "9464"
    assert default_text(StreamSettings, "trigger") == "5 seconds"
    assert default_text(CollectorSettings, "broker_backoff_initial_s") == "1"
