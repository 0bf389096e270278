"""The soak's figures (benchmarks/soak.py): the level and drift docs/reliability.md quotes for each curve, and the
picture drawn again from a run's saved samples. Made-up samples; the soak itself runs with `make soak`."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import pytest

from benchmarks import soak
from dev.memory import native_python


def test_drift_is_the_fitted_slope_per_hour_and_the_level_the_median() -> None:
    # 10 MB an hour from 100 MB, one sample a minute for half an hour, one outlier that a median ignores
    points = [(60.0 * m, 100.0 + 10.0 * m / 60) for m in range(31)]
    points[15] = (points[15][0], 500.0)
    found = soak.level_and_drift(points)
    assert found is not None
    assert found["level"] == pytest.approx(100 + 10 * 16 / 60)  # the median sample, not the outlier
    assert found["max"] == 500.0
    straight = soak.level_and_drift([(60.0 * m, 100.0 + 10.0 * m / 60) for m in range(31)])
    assert straight is not None and straight["drift_per_hour"] == pytest.approx(10.0)
    assert straight["drift_pct_per_hour"] == pytest.approx(100 * 10.0 / straight["level"])


def test_too_few_points_give_no_figure() -> None:
    assert soak.level_and_drift([(0.0, 1.0), (30.0, 2.0)]) is None


def test_plot_draws_a_saved_run_again_with_its_restarts(tmp_path: Path) -> None:
    samples = [
        {
            "t_s": 30.0 * i,
            "driver_jvm_rss_mb": 1600.0 + i,
            "python_workers_pss_mb": 500.0,
            "driver_python_rss_mb": 170.0,
            "collector_rss_mb": 55.0,
            "jvm_heap_used_mb": 400.0,
            "jvm_live_heap_mb": 150.0 if i % 2 == 0 else None,
            "state_rows": 131,
            "checkpoint_mb": 1.4,
            "checkpoint_snapshot_mb": 0.45,
            "state_memory_mb": 10.0,
            "view_lag_s": 0.0,
            "reconcile_batch_s": 1.7,
            "sweep_s": 0.0,
            "last_batch_age_s": 2.0,
            "loadavg_1m": 1.0,
            "snapshots_behind": 2,
            "log_behind": 200,
        }
        for i in range(50)
    ]
    run = {
        "args": {"seconds": 1200.0, "ids": 200, "rate": 20.0},
        "samples": samples,
        "orphans": [{"made_at_s": 300.0, "found_after_s": 20.0}],
        "restarts": [{"at_s": 600.0, "took_s": 9.0}],
    }
    saved, png = tmp_path / "soak.json", tmp_path / "soak.png"
    saved.write_text(json.dumps(run))
    assert soak.main(["--json", str(saved), "--png", str(png), "plot"]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_tracemalloc_names_the_line_that_grew() -> None:
    tracemalloc.start()
    try:
        first, found = soak.python_allocations(None, compare=True)
        assert first is not None and "python_grew_most" not in found  # nothing to compare with yet
        kept = [bytearray(1000) for _ in range(2000)]  # about 2 MB, held
        same, between = soak.python_allocations(first, compare=False)
        assert same is first and between["python_traced_mb"] >= found["python_traced_mb"] + 1.9
        _, grown = soak.python_allocations(first, compare=True)
        assert "test_soak_figures.py" in grown["python_grew_most"][0], grown
        assert len(kept) == 2000
    finally:
        tracemalloc.stop()


def test_native_python_sees_arrow_and_malloc_grow() -> None:
    """The soak's split of its own native memory: an Arrow buffer shows in Arrow's pool, a malloc'd block in
    glibc's heap (in use), each by about its size."""
    import ctypes

    import pyarrow as pa

    before = native_python()
    buf = pa.allocate_buffer(32 * 1024 * 1024)
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    block = libc.malloc(16 * 1024 * 1024)
    try:
        after = native_python()
    finally:
        libc.free(ctypes.c_void_p(block))
        del buf
    assert after["arrow_pool_mb"] - before["arrow_pool_mb"] == pytest.approx(33.55, abs=0.1)
    assert after["malloc_in_use_mb"] - before["malloc_in_use_mb"] == pytest.approx(16.8, abs=0.5)
    assert after["malloc_heap_mb"] >= after["malloc_in_use_mb"]
