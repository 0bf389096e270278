"""Health probes, decided once for both components: is the loop turning (/healthz), has it made progress lately
(/readyz), the HTTP answers, and the labels of `txnwatch_build_info`. Pure: every time is an argument
(milliseconds on one clock the caller chose). What the windows mean: docs/streaming.md and docs/collector.md,
"Probes".
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import NamedTuple

LIVE_PATH = "/healthz"
READY_PATH = "/readyz"


class ProbeAnswer(NamedTuple):
    """A probe's answer: `ok` (HTTP 200) or not (503), and one line saying why, for whoever reads the probe."""

    ok: bool
    reason: str


class Progress(NamedTuple):
    """One thing that must move for a component to be ready: when it last moved (None: not yet, since start) and
    how long it may stand still."""

    what: str  # what moving means, e.g. "sweep published", "txnwatch-reconcile batch"
    last_ms: int | None
    within_ms: int


def loop_turning(*, last_turn_ms: int, now_ms: int, stall_after_ms: int) -> ProbeAnswer:
    """Liveness: the component's own loop turned lately.

    Args:
        last_turn_ms: when the loop last turned (the start time before its first turn).
        now_ms: now, on the same clock.
        stall_after_ms: the longest a working loop may go without turning (its pauses and its slowest legitimate
            step together).

    Returns:
        ok while the loop turned within `stall_after_ms`; otherwise not, naming how long it has been stuck.
    """
    since_ms = now_ms - last_turn_ms
    if since_ms > stall_after_ms:
        return ProbeAnswer(
            False,
            f"stalled: the loop has not turned for {since_ms / 1000:.1f}s (limit {stall_after_ms / 1000:.1f}s)",
        )
    return ProbeAnswer(True, f"live: the loop turned {since_ms / 1000:.1f}s ago")


def progress_recent(progress: list[Progress], *, now_ms: int) -> ProbeAnswer:
    """Readiness: everything the component must move moved within its window.

    Returns:
        ok when every entry moved within its `within_ms`; otherwise not, naming the first that did not (never moved
        since start, or stood still too long). An empty list is a caller bug.

    Raises:
        ValueError: if `progress` is empty (nothing to be ready on).
    """
    if not progress:
        raise ValueError("readiness needs at least one thing that must move")
    for p in progress:
        if p.last_ms is None:
            return ProbeAnswer(False, f"not ready: no {p.what} yet")
        since_ms = now_ms - p.last_ms
        if since_ms > p.within_ms:
            return ProbeAnswer(
                False,
                f"not ready: last {p.what} {since_ms / 1000:.1f}s ago (ready within {p.within_ms / 1000:.1f}s)",
            )
    ages = ", ".join(f"last {p.what} {(now_ms - (p.last_ms or 0)) / 1000:.1f}s ago" for p in progress)
    return ProbeAnswer(True, f"ready: {ages}")


# --------------------------------------------------------------------------------------- the windows


def collector_windows(
    *,
    interval_s: float,
    longest_pause_s: float,
    request_timeout_ms: int,
    ready_intervals: float,
    stall_after_s: float | None,
) -> tuple[int, int]:
    """The collector's probe windows, in ms: (ready within, stalled after).

    Args:
        interval_s: the sweep interval.
        longest_pause_s: the longest wait between two sweeps (the interval, or the backoff after failed sweeps).
        request_timeout_ms: the bound on each request a sweep sends.
        ready_intervals: how many intervals may pass without a published sweep while still ready.
        stall_after_s: the liveness window, when set; else estimated.

    Returns:
        Ready: a sweep was published within `ready_intervals` intervals plus one request timeout (the sweep's own
        time: a leader that does not answer holds it that long). Stalled: no turn for longer than the longest
        pause plus a sweep on a sick cluster, a handful of requests each allowed a request timeout.
    """
    ready_ms = round(ready_intervals * interval_s * 1000) + request_timeout_ms
    if stall_after_s is not None:
        return ready_ms, round(stall_after_s * 1000)
    return ready_ms, round(longest_pause_s * 1000) + SWEEP_REQUEST_TIMEOUTS * request_timeout_ms


# A sweep's requests in the worst case, each bounded by the request timeout: metadata, DescribeProducers and its
# retry rounds, the log position, start-batch fetches, ListOffsets, DescribeConfigs, the publish.
SWEEP_REQUEST_TIMEOUTS = 10


def stream_ready_within_ms(*, trigger_ms: int, ready_intervals: float, slack_s: float) -> int:
    """How long a streaming query may go without finishing a batch (or finding nothing to do) and still be ready:
    `ready_intervals` triggers plus `slack_s`, since a micro-batch may legitimately run longer than its trigger."""
    return round(ready_intervals * trigger_ms + slack_s * 1000)


_UNIT_MS = {
    "ms": 1,
    "millisecond": 1,
    "milliseconds": 1,
    "s": 1000,
    "sec": 1000,
    "secs": 1000,
    "second": 1000,
    "seconds": 1000,
    "m": 60_000,
    "min": 60_000,
    "mins": 60_000,
    "minute": 60_000,
    "minutes": 60_000,
    "h": 3_600_000,
    "hour": 3_600_000,
    "hours": 3_600_000,
    "d": 86_400_000,
    "day": 86_400_000,
    "days": 86_400_000,
}
_PART = re.compile(r"(\d+(?:\.\d+)?)\s*([a-z]+)")


def interval_ms(text: str) -> int | None:
    """A Spark processing-time interval ("5 seconds", "interval 1 minute 30 seconds", "500ms") in ms; None when
    it is not one this understands (the caller then assumes a conservative value)."""
    rest = text.strip().lower().removeprefix("interval").strip()
    if not rest:
        return None
    total = 0.0
    pos = 0
    for m in _PART.finditer(rest):
        if rest[pos : m.start()].strip():
            return None
        unit = _UNIT_MS.get(m.group(2))
        if unit is None:
            return None
        total += float(m.group(1)) * unit
        pos = m.end()
    if rest[pos:].strip() or pos == 0:
        return None
    return round(total)


# ------------------------------------------------------------------------------------ the HTTP contract


def probe_response(
    path: str, *, live: Callable[[], ProbeAnswer], ready: Callable[[], ProbeAnswer]
) -> tuple[str, bytes] | None:
    """The status line and body for a probe path; None for any other path (the metrics app answers those).

    Only the asked probe is decided (each reads the caller's clock once). Body: the reason, one line.
    """
    if path == LIVE_PATH:
        answer = live()
    elif path == READY_PATH:
        answer = ready()
    else:
        return None
    status = "200 OK" if answer.ok else "503 Service Unavailable"
    return status, (answer.reason + "\n").encode()


# ------------------------------------------------------------------------------------- what is running

BUILD_INFO_LABELS = ("version", "python", "pyspark", "kafka_python")
# The distributions behind the labels (importlib.metadata names).
BUILD_INFO_DISTRIBUTIONS: Mapping[str, str] = {
    "version": "txnwatch",
    "pyspark": "pyspark",
    "kafka_python": "kafka-python",
}
NOT_INSTALLED = "none"


def build_info(version_of: Callable[[str], str | None], python_version: str) -> dict[str, str]:
    """The labels of `txnwatch_build_info` (and the lines of `txnwatch --version`).

    Args:
        version_of: a distribution's installed version (`importlib.metadata.version`): None, or an ImportError
            such as its PackageNotFoundError, when it is not installed.
        python_version: the interpreter's version, e.g. "3.11.2".
    """
    labels = {"python": python_version}
    for label, distribution in BUILD_INFO_DISTRIBUTIONS.items():
        try:
            labels[label] = version_of(distribution) or NOT_INSTALLED
        except ImportError:
            labels[label] = NOT_INSTALLED
    return {label: labels[label] for label in BUILD_INFO_LABELS}
