"""Python's cyclic garbage collector paused while a Spark Python worker runs one of the job's handlers.

A stateful handler call (one state bucket) allocates hundreds of thousands of small objects: pyspark regroups its
input row by row (a tuple per row), the bucket's pickled dict comes back as tuples, and every row judged makes a
few more. Every 700 such allocations start a collection, and the full ones walk every object the worker holds,
among them the modules of pandas, pyarrow, pyspark and pydantic. On the throughput benchmark's snapshot input
(docs/BENCHMARKS.md), replayed through stage 2 with pyspark's regrouping in one process, that was about 15% of
its CPU. What the handlers build holds no reference
cycles they depend on being freed (values are plain tuples, dicts and strings), so freeing by reference counting
alone changes nothing but the time; any cycle made meanwhile is collected once the collector runs again, after
the call.
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
