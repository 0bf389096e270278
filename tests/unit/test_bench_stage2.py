"""benchmarks/bench_stage2.py runs on today's stage 2 (benchmarks are not tests; this keeps the benchmark from
rotting): a few hundred rows through its replay of the job's stage-2 input and the real processor, no JVM."""

from __future__ import annotations

import json

import pytest

from benchmarks import bench_stage2
from detectors.tracking import STAGE2_INPUT_COLUMNS

pytestmark = pytest.mark.unit

SMALL = ["--batch", "200", "--batches", "3", "--rounds", "1", "--partitions", "100"]


def _summary(out: str) -> dict[str, object]:
    summary: dict[str, object] = json.loads(out.strip().splitlines()[-1])
    return summary


def test_the_benchmark_replays_stage_2_and_every_transaction_is_its_coordinators_open_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert bench_stage2.main([*SMALL, "--profile"]) == 0
    out = capsys.readouterr().out
    summary = _summary(out)
    assert summary["identical_events"] is True
    runs = summary["runs"]
    assert isinstance(runs, list) and [r["paused"] for r in runs] == [False, True]
    for batch in runs[-1]["batches"]:
        assert batch["rows"] > 0 and batch["us_per_row"] > 0
        # the coordinator's records and the collector's positions reached stage 2: the view is current and
        # every transaction is its coordinator's open one, so nothing is withheld
        assert batch["events"]["VERDICT OPEN"] > 0 and batch["events"]["VIEW"] == 1
        assert not [k for k in batch["events"] if "UNCONFIRMED" in k or "HANGING" in k]
    assert "handleInputRows" in out  # --profile's top functions


def test_without_the_coordinator_the_transactions_past_the_grace_are_withheld(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert bench_stage2.main([*SMALL, "--without-coordinator"]) == 0
    events = _summary(capsys.readouterr().out)["runs"][-1]["batches"][-1]["events"]  # type: ignore[index]
    assert events["VERDICT UNCONFIRMED explained"] > 0 and "VIEW" not in events


def test_a_stage_2_column_the_benchmark_cannot_build_fails_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A new column of stage 2's input with no field of its name must stop the benchmark, not shift its rows."""
    monkeypatch.setattr(bench_stage2, "STAGE2_INPUT_COLUMNS", (*STAGE2_INPUT_COLUMNS, "new_column"))
    with pytest.raises(KeyError, match="new_column"):
        bench_stage2.stage2_batches(200, 1, 100)
