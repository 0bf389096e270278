"""How admin's commands write instants, durations and tables for people (inspect, proposals, watch, collect)."""

from __future__ import annotations

from datetime import UTC, datetime

from detectors import lateness


def iso(ms: int | None) -> str:
    # Non-positive timestamps are unknown (detectors.lateness.known), not instants in 1970.
    if ms is None or not lateness.known(ms):
        return "-"
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def duration(ms: int) -> str:
    seconds = max(ms, 0) // 1000
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"


def format_table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )
