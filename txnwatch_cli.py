"""The `txnwatch` console script: one argparse tree, subcommands registered by the rooms that own them.

`admin/` registers `collect` and `inspect partition|coordinator-log` (`admin/cli.py`), `streaming/` registers
`stream` (`streaming/cli.py`); the demo is `make demo` (`dev/demo.py`), not a subcommand. The rooms never import
each other; this module is the only place that knows both, and it imports each lazily so `txnwatch collect`
never loads Spark.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# Each module exposes `register(subparsers) -> None`; its subcommands set `func(args) -> int` as a default.
COMMAND_MODULES = ("admin.cli", "streaming.cli")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="txnwatch",
        description="Find, explain and safely abort hanging Kafka transactions.",
        epilog="Every command takes --bootstrap-server and --command-config client.properties, like Kafka's tools.",
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
