"""docs/compatibility.md's table, from what `make compat` measured (benchmarks/results/compat.json).

`python -m dev.compat_table` prints one Markdown row per cell: each step of tests/compat/test_matrix.py as ✓ (with its
seconds), ✗ (the step that failed) or – (not reached), the `__transaction_state` value versions decoded, the cell's
time and its first failure.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

EXCEPTION_LINE = re.compile(r"^[A-Za-z_.]*(Error|Exception)\b[^(]*:")
RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results" / "compat.json"
# (column, the step of test_matrix.py it shows)
COLUMNS = (
    ("orphans", "orphans"),
    ("find-hanging", "oracle_find_hanging"),
    ("collect describe", "collect_describe_once"),
    ("collect primary", "collect_primary"),
    ("job start", "stream_start"),
    ("HANGING", "stream_hanging"),
    ("inspect", "inspect"),
    ("abort dry run", "abort_dry_run"),
    ("abort --execute", "abort_execute"),
    ("find-hanging after", "oracle_after_abort"),
    ("log decoded", "decode_transaction_log"),
)


def mark(steps: dict[str, dict[str, Any]], step: str) -> str:
    """✓ and seconds, ✗, or – (not reached); ✓* where the step passed only after the workaround of a finding
    (the collector's topics created first: `collect_primary_creates_topics` failed)."""
    if step not in steps:
        return "–"
    if not steps[step]["ok"]:
        return "✗"
    worked_around = not steps.get(f"{step}_creates_topics", {"ok": True})["ok"]
    return f"✓{'*' if worked_around else ''} {steps[step]['seconds']:.0f}s"


def first_failure(text: str | None) -> str:
    """The failed step and its message; of a traceback (a dead process's log tail), its last line, the exception."""
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    if not lines:
        return ""
    if len(lines) == 1:
        return lines[0][:200]
    # pytest appends its own "assert ... where ..." lines after the process's traceback: the exception line is the
    # last that names one.
    errors = [line for line in lines[1:] if EXCEPTION_LINE.match(line)]
    return f"{lines[0].split(':', 1)[0]}: {(errors or lines)[-1]}"[:200]


def row(cell: dict[str, Any]) -> str:
    steps = cell["steps"]
    decoded = steps.get("decode_transaction_log", {})
    versions = ", ".join(f"{k}×{v}" for k, v in sorted(decoded.get("value_versions", {}).items())) or "–"
    failure = first_failure(cell["failure"]) or "; ".join(f"finding: {f}" for f in cell.get("findings", []))
    cells = [
        cell["version"],
        cell["metadata"],
        str(cell["transaction_version"]),
        "**pass**" if cell["passed"] else "**FAIL**",
        *(mark(steps, step) for _, step in COLUMNS),
        versions,
        f"{cell['seconds']:.0f}s",
        failure.replace("|", "\\|"),
    ]
    return "| " + " | ".join(cells) + " |"


def table(results: dict[str, Any]) -> str:
    head = [
        "Kafka",
        "metadata",
        "TV",
        "result",
        *(c for c, _ in COLUMNS),
        "value versions",
        "time",
        "first failure or finding",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    ordered = sorted(
        results["cells"].values(),
        key=lambda c: (
            tuple(int(x) for x in c["version"].split(".")),
            c["metadata"],
            c["transaction_version"],
        ),
    )
    lines += [row(c) for c in ordered]
    return "\n".join(lines)


def main() -> int:
    print(table(json.loads(RESULTS.read_text())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
