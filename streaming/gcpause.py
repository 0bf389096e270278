"""Python's cyclic garbage collector paused while a Spark Python worker runs one of the job's stateful handlers:
its collections cost about 15% of stage 2's Python CPU (docs/BENCHMARKS.md). Why pausing it is safe:
docs/streaming.md, "The stateful stages".
"""

from __future__ import annotations

import functools
import gc
from collections.abc import Callable, Iterator
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


def without_cyclic_gc(handler: Callable[P, Iterator[T]]) -> Callable[P, Iterator[T]]:
    """`handler` (a generator function) with the cyclic collector off while its code runs, and back on (if it was
    on) whenever it yields or ends, so whoever consumes its output runs with the collector as before."""

    @functools.wraps(handler)
    def run(*args: P.args, **kwargs: P.kwargs) -> Iterator[T]:
        items = handler(*args, **kwargs)
        while True:
            enabled = gc.isenabled()
            gc.disable()
            try:
                item = next(items)
            except StopIteration:
                return
            finally:
                if enabled:
                    gc.enable()
            yield item

    return run
