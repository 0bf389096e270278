"""The job's planned restart (streaming/job.py): when it is due, that it stops the queries between two batches, and
that it keeps the run's metrics and verdicts. Fake queries: the restart against real Spark is in
tests/e2e/test_stream_e2e.py, its effect on the snapshots in the soak (docs/reliability.md)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from streaming import job
from streaming.exporter import DriverHealth, LiveState


class FakeQuery:
    """A query that is busy with a batch for its first `busy_polls` status reads."""

    def __init__(self, name: str, busy_polls: int = 0) -> None:
        self.name, self.busy_polls = name, busy_polls
        self.isActive = True
        self.stopped_while_busy: bool | None = None

    @property
    def status(self) -> dict[str, Any]:
        busy = self.busy_polls > 0
        self.busy_polls -= 1
        return {"isTriggerActive": busy}

    def stop(self) -> None:
        self.stopped_while_busy = self.busy_polls > 0
        self.isActive = False


def fake_job(queries: list[FakeQuery], restarted: list[FakeQuery]) -> job.RunningJob:
    spark: Any = SimpleNamespace(sparkContext=SimpleNamespace(setLogLevel=lambda level: None))
    return job.RunningJob(
        queries=queries,  # type: ignore[arg-type]
        live=LiveState(),
        health=None,  # type: ignore[arg-type]
        spark=spark,
        listener=None,  # type: ignore[arg-type]
        metrics_server=None,
        driver=DriverHealth(stall_after_ms=60_000),
        start_queries=lambda: restarted,  # type: ignore[arg-type,return-value]
    )


@pytest.mark.parametrize(
    ("opened_at", "now", "every", "due"),
    [
        (0.0, 21_599.9, 21_600.0, False),
        (0.0, 21_600.0, 21_600.0, True),
        (100.0, 1e9, 0.0, False),  # 0: never
    ],
)
def test_restart_is_due_every_interval_after_the_last_start(
    opened_at: float, now: float, every: float, due: bool
) -> None:
    assert job.restart_due(opened_at, now, every) is due


def test_restart_waits_until_no_query_runs_a_batch_then_starts_them_again() -> None:
    old = [FakeQuery("txnwatch-reconcile", busy_polls=3), FakeQuery("txnwatch-windows", busy_polls=5)]
    new = [FakeQuery("txnwatch-reconcile"), FakeQuery("txnwatch-windows")]
    running = fake_job(old, new)
    live = running.live
    took = running.restart_queries()
    assert [q.stopped_while_busy for q in old] == [False, False]  # stopped between batches, not in one
    assert running.queries is new
    assert running.live is live  # the verdicts /metrics shows are kept: the resumed state is theirs
    assert took >= 0


def test_a_query_always_busy_is_restarted_after_the_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(job, "BETWEEN_BATCHES_WAIT_S", 0.3)
    old = [FakeQuery("txnwatch-reconcile", busy_polls=10**6)]
    new = [FakeQuery("txnwatch-reconcile")]
    running = fake_job(old, new)
    running.restart_queries()
    assert old[0].stopped_while_busy is True  # its batch runs again after the restart, as after a crash
    assert running.queries is new


class FakeSocket:
    def __init__(self) -> None:
        self.closed = False

    def shutdown(self, how: int) -> None:
        self.closed = True


class FakeConnection:
    """py4j's ClientServerConnection as the job sees it: its socket (None once closed)."""

    def __init__(self) -> None:
        self.socket: FakeSocket | None = FakeSocket()

    @property
    def closed(self) -> bool:
        return self.socket is not None and self.socket.closed


def test_restart_closes_the_py4j_connections_of_the_stopped_queries() -> None:
    running = fake_job([FakeQuery("txnwatch-reconcile")], [FakeQuery("txnwatch-reconcile")])
    old = [FakeConnection(), FakeConnection()]
    running.callback_connections.update(old)
    running.restart_queries()
    assert all(c.closed for c in old)  # each ends a thread here and one in the JVM
    assert not running.callback_connections  # the new queries' own are noted as their batches run


def test_a_query_that_did_not_stop_keeps_its_connection() -> None:
    busy = FakeQuery("txnwatch-reconcile")
    running = fake_job([busy], [])
    kept = FakeConnection()
    running.callback_connections.add(kept)
    running.release_callback_connections()  # the query is still active: it may be in a batch
    assert not kept.closed


def test_a_job_without_its_start_cannot_restart() -> None:
    running = fake_job([FakeQuery("txnwatch-reconcile")], [])
    running.start_queries = None
    with pytest.raises(RuntimeError, match="cannot start its queries again"):
        running.restart_queries()
