"""Kafka's own tools as the tests' oracle: `kafka-transactions.sh` (TransactionsCommand) and JmxTool.

Both run from the jars in .cache/jars/kafka, exactly as `bin/kafka-transactions.sh` would run them; with
`kafka_version`, from that release's own kafka-tools (the compatibility matrix: each release's find-hanging).
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Sequence

from dev.kafka import java_binary, kafka_classpath
from dev.kafka_versions import DEFAULT_VERSION

TOOLS_TIMEOUT_S = 120


def run_tool(
    main_class: str, args: Sequence[str], kafka_version: str = DEFAULT_VERSION
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [java_binary(), "-cp", kafka_classpath(kafka_version), main_class, *args],
        capture_output=True,
        text=True,
        timeout=TOOLS_TIMEOUT_S,
    )


def transactions_command(bootstrap: str, *args: str, kafka_version: str = DEFAULT_VERSION) -> str:
    """Run `kafka-transactions.sh --bootstrap-server B ARGS...`; returns stdout, raises with stderr on failure."""
    done = run_tool(
        "org.apache.kafka.tools.TransactionsCommand", ["--bootstrap-server", bootstrap, *args], kafka_version
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"TransactionsCommand {' '.join(args)} exited {done.returncode}: "
            f"{done.stderr.strip()[-2000:]} {done.stdout.strip()[-500:]}"
        )
    return done.stdout


def parse_table(text: str) -> list[dict[str, str]]:
    """Rows of the tab-separated table TransactionsCommand prints (ToolsUtils.prettyPrintTable)."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return []
    headers = [h.strip() for h in lines[0].split("\t") if h.strip()]
    rows = []
    for line in lines[1:]:
        cells = [c.strip() for c in line.split("\t")]
        rows.append(dict(zip(headers, cells, strict=False)))
    return rows


def find_hanging(
    bootstrap: str,
    *,
    topic: str | None = None,
    broker_id: int | None = None,
    max_transaction_timeout_min: int = 15,
    kafka_version: str = DEFAULT_VERSION,
) -> list[dict[str, str]]:
    args = ["find-hanging", "--max-transaction-timeout", str(max_transaction_timeout_min)]
    if topic is not None:
        args += ["--topic", topic]
    if broker_id is not None:
        args += ["--broker-id", str(broker_id)]
    return parse_table(transactions_command(bootstrap, *args, kafka_version=kafka_version))


def describe_producers(bootstrap: str, topic: str, partition: int) -> list[dict[str, str]]:
    return parse_table(
        transactions_command(bootstrap, "describe-producers", "--topic", topic, "--partition", str(partition))
    )


def jmx_value(jmx_url: str, object_name: str, attribute: str = "Value") -> float:
    """Read one numeric MBean attribute with Kafka's JmxTool (one-time)."""
    done = run_tool(
        "org.apache.kafka.tools.JmxTool",
        [
            "--jmx-url",
            jmx_url,
            "--object-name",
            object_name,
            "--attributes",
            attribute,
            "--one-time",
            "true",
            "--report-format",
            "properties",
        ],
    )
    if done.returncode != 0:
        raise RuntimeError(f"JmxTool failed: {done.stderr.strip()[-1000:]}")
    match = re.search(rf"{re.escape(object_name)}:{attribute}=([-0-9.Ee]+)", done.stdout)
    if match is None:
        raise RuntimeError(f"JmxTool printed no {object_name}:{attribute}: {done.stdout[-1000:]}")
    return float(match.group(1))
