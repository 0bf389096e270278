"""Where a process's native memory is, beside its RSS (the soak's figures and the malloc bound's test)."""

from __future__ import annotations


def native_python() -> dict[str, float]:
    """Where this process's native memory is, beside its RSS: glibc malloc's heap (mallinfo2: bytes taken from the
    system for its arenas, mapped blocks, and the part in use) and Arrow's memory pool (the events sink's
    `toArrow`), which is not glibc's (mimalloc here). A step in the RSS that none of these take is elsewhere
    (thread stacks, pymalloc's arenas, a library's own mappings)."""
    import ctypes

    import pyarrow as pa

    class MallInfo2(ctypes.Structure):
        _fields_ = [
            (name, ctypes.c_size_t)
            for name in (
                "arena",
                "ordblks",
                "smblks",
                "hblks",
                "hblkhd",
                "usmblks",
                "fsmblks",
                "uordblks",
                "fordblks",
                "keepcost",
            )
        ]

    out: dict[str, float] = {}
    libc = ctypes.CDLL("libc.so.6")
    if hasattr(libc, "mallinfo2"):  # glibc 2.33 and later
        libc.mallinfo2.restype = MallInfo2
        mi = libc.mallinfo2()
        out["malloc_heap_mb"] = (mi.arena + mi.hblkhd) / 1e6  # from the system: arenas and mmapped blocks
        out["malloc_in_use_mb"] = (mi.uordblks + mi.hblkhd) / 1e6
        out["malloc_free_mb"] = mi.fordblks / 1e6  # held by malloc's arenas, free: fragmentation
    pool = pa.default_memory_pool()
    out["arrow_pool_mb"] = pool.bytes_allocated() / 1e6
    out["arrow_pool_peak_mb"] = pool.max_memory() / 1e6
    return out
