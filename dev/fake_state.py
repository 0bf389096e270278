"""In-memory stand-ins for the state variables pyspark's transformWithStateInPandas hands a StatefulProcessor, for
one grouping key: what the processors of streaming/reconcile.py call, no state server, no JVM.

Part of the test bed, shared by the stage-2 benchmark (benchmarks/bench_stage2.py) and the processors' unit
tests (tests/unit/test_reconcile.py), so both drive the real processors through one fake. Map states with a TTL
forget an entry `ttl_ms` after it was last written, on the `Clock` the test or benchmark moves, as Spark's
processing-time TTL does.
"""

from __future__ import annotations

from typing import Any


class Clock:
    """Processing time, moved by hand."""

    def __init__(self, now_ms: int) -> None:
        self.now_ms = now_ms


class FakeValueState:
    """A ValueState's surface (what _save and _load use), in memory."""

    def __init__(self) -> None:
        self.value: tuple[Any, ...] | None = None

    def exists(self) -> bool:
        return self.value is not None

    def get(self) -> tuple[Any, ...] | None:
        return self.value

    def update(self, newValue: tuple[Any, ...]) -> None:
        self.value = newValue

    def clear(self) -> None:
        self.value = None


class FakeMapState:
    """A MapState's surface (what the processors use), in memory; with `ttl_ms`, an entry reads as absent from
    `ttl_ms` after it was last written, as Spark's processing-time TTL does."""

    def __init__(self, clock: Clock, ttl_ms: int | None = None) -> None:
        self.clock, self.ttl_ms = clock, ttl_ms
        self.entries: dict[tuple[Any, ...], tuple[tuple[Any, ...], int]] = {}
        self.calls = 0

    def _alive(self, written_ms: int) -> bool:
        return self.ttl_ms is None or written_ms + self.ttl_ms > self.clock.now_ms

    def _live(self) -> dict[tuple[Any, ...], tuple[Any, ...]]:
        return {k: v for k, (v, at) in self.entries.items() if self._alive(at)}

    def exists(self) -> bool:
        return any(self._alive(at) for _, at in self.entries.values())

    def getValue(self, key: tuple[Any, ...]) -> tuple[Any, ...] | None:
        # one entry, not the whole map: the benchmark reads thousands per batch
        self.calls += 1
        found = self.entries.get(key)
        return found[0] if found is not None and self._alive(found[1]) else None

    def updateValue(self, key: tuple[Any, ...], value: tuple[Any, ...]) -> None:
        self.calls += 1
        self.entries[key] = (value, self.clock.now_ms)

    def removeKey(self, key: tuple[Any, ...]) -> None:
        self.calls += 1
        self.entries.pop(key, None)

    def iterator(self) -> Any:
        return iter(list(self._live().items()))

    def keys_now(self) -> set[Any]:
        return {k[0] for k in self._live()}


class FakeHandle:
    """A StatefulProcessorHandle's surface, for one grouping key."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.maps: dict[str, FakeMapState] = {}
        self.values: dict[str, FakeValueState] = {}
        self.timers: set[int] = set()

    def getValueState(self, name: str, schema: str) -> FakeValueState:
        return self.values.setdefault(name, FakeValueState())

    def getMapState(self, name: str, key: str, value: str, ttl_ms: int | None = None) -> FakeMapState:
        return self.maps.setdefault(name, FakeMapState(self.clock, ttl_ms))

    def registerTimer(self, at_ms: int) -> None:
        self.timers.add(at_ms)

    def deleteTimer(self, at_ms: int) -> None:
        self.timers.discard(at_ms)


class Timer:
    """The TimerValues a handler gets: the clock's processing time."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    def getCurrentProcessingTimeInMs(self) -> int:
        return self.clock.now_ms
