"""The `txnwatch` console script: one argparse tree, subcommands registered by the rooms that own them.

`admin/` registers `collect` and `inspect partition|coordinator-log` (`admin/cli/main.py`), `streaming/` registers
`stream` (`streaming/cli.py`); the demo is `make demo` (`dev/demo.py`), not a subcommand. The rooms never import
each other; this module is the only place that knows both, and it imports each lazily so `txnwatch collect`
never loads Spark. `txnwatch --version` says what runs without importing either room (the installed
distributions' metadata only).
"""

from __future__ import annotations

import argparse
import importlib
import platform
import sys
from collections.abc import Sequence
from importlib import metadata
from typing import Any

from detectors.health import build_info

# Each module exposes `register(subparsers) -> None`; its subcommands set `func(args) -> int` as a default.
COMMAND_MODULES = ("admin.cli.main", "streaming.cli")


# `txnwatch --version` names the distributions as pip does; the labels of txnwatch_build_info use underscores.
VERSION_NAMES = {
    "version": "txnwatch",
    "python": "python",
    "pyspark": "pyspark",
    "kafka_python": "kafka-python",
}


def version_text() -> str:
    """One line per component: txnwatch, Python, PySpark, kafka-python ("none" when not installed)."""
    info = build_info(metadata.version, platform.python_version())
    return "\n".join(f"{VERSION_NAMES[label]} {value}" for label, value in info.items())


class _VersionAction(argparse.Action):
    """Prints `version_text()` and exits 0, before any subcommand is required (argparse's own "version" action
    would build the text even when not asked)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *args: Any) -> None:
        print(version_text())
        parser.exit(0)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="txnwatch",
        description="Find, explain and safely abort hanging Kafka transactions.",
        epilog="Every command takes --bootstrap-server and --command-config client.properties, like Kafka's tools.",
    )
    parser.add_argument(
        "--version",
        action=_VersionAction,
        help="print the versions of txnwatch, Python, PySpark and kafka-python",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue  # that room has no commands yet
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
