"""Every request the wire sends, counted by (api, broker, outcome), and told to an observer (the collector's
metrics) that the wire knows only as a Protocol."""

from __future__ import annotations

import threading
from collections import Counter as Tally
from typing import Protocol


class RequestObserver(Protocol):
    """Who is told of each request and of partition errors (admin.collect.metrics.CollectorMetrics)."""

    def request_sent(self, api: str, error: str | None) -> None: ...

    def partition_errors(self, api: str, error: str, count: int) -> None: ...


class RequestLog:
    """Counts every request the wire sends, by (api, broker, outcome); tells `observer` when given.

    `outcome` is "ok" or the error name. Thread-safe: the wire reports from kafka-python's IO thread.
    """

    def __init__(self, observer: RequestObserver | None = None) -> None:
        self._observer = observer
        self._lock = threading.Lock()
        self.counts: Tally[tuple[str, int, str]] = Tally()

    def record(self, api: str, broker: int, error: str | None = None) -> None:
        outcome = error or "ok"
        with self._lock:
            self.counts[(api, broker, outcome)] += 1
        if self._observer is not None:
            self._observer.request_sent(api, error)

    def record_partition_error(self, api: str, error: str, count: int = 1) -> None:
        """An error a broker returned for some partitions of an otherwise answered request."""
        if self._observer is not None and count:
            self._observer.partition_errors(api, error, count)

    def snapshot(self) -> Tally[tuple[str, int, str]]:
        with self._lock:
            return Tally(self.counts)

    def by_broker(self, api: str) -> dict[int, int]:
        """Requests of one API sent to each broker, whatever their outcome."""
        out: dict[int, int] = {}
        with self._lock:
            for (a, broker, _), n in self.counts.items():
                if a == api:
                    out[broker] = out.get(broker, 0) + n
        return out
