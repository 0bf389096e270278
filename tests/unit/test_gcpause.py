"""streaming.gcpause: the collector is off exactly while the wrapped handler's own code runs."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from streaming.gcpause import without_cyclic_gc


@pytest.fixture(autouse=True)
def _restore_gc() -> Iterator[None]:
    was = gc.isenabled()
    yield
    if was:
        gc.enable()
    else:
        gc.disable()


class Handler:
    def __init__(self) -> None:
        self.seen: list[bool] = []

    @without_cyclic_gc
    def handleInputRows(self, key: int, rows: list[int], timerValues: object) -> Iterator[int]:
        self.seen.append(gc.isenabled())
        yield key + sum(rows)
        self.seen.append(gc.isenabled())
        yield -1
        self.seen.append(gc.isenabled())

    @without_cyclic_gc
    def fails(self) -> Iterator[int]:
        self.seen.append(gc.isenabled())
        raise ValueError("boom")
        yield 0  # pragma: no cover


def test_off_while_the_handler_runs_on_while_its_output_is_consumed() -> None:
    gc.enable()
    h = Handler()
    consumer_saw = []
    # by keyword, as pyspark calls it
    for item in h.handleInputRows(key=1, rows=[2, 3], timerValues=None):
        consumer_saw.append((item, gc.isenabled()))
    assert consumer_saw == [(6, True), (-1, True)]
    assert h.seen == [False, False, False]
    assert gc.isenabled()


def test_an_exception_turns_it_back_on() -> None:
    gc.enable()
    h = Handler()
    with pytest.raises(ValueError, match="boom"):
        list(h.fails())
    assert h.seen == [False]
    assert gc.isenabled()


def test_a_collector_that_was_off_stays_off() -> None:
    gc.disable()
    h = Handler()
    assert list(h.handleInputRows(1, [], None)) == [1, -1]
    assert not gc.isenabled()


def test_the_signature_is_the_handlers() -> None:
    import inspect

    assert list(inspect.signature(Handler.handleInputRows).parameters) == [
        "self",
        "key",
        "rows",
        "timerValues",
    ]
