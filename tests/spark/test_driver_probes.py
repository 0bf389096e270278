"""The driver's /healthz and /readyz (streaming/exporter.py `DriverHealth`), over real HTTP with a clock the test
turns, fed as Spark feeds it: progress and idle events through the health listener. No query runs here; the
process test (tests/e2e/test_health_probes.py) runs a real job."""

from __future__ import annotations

import urllib.error
import urllib.request
from importlib import metadata
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from streaming.exporter import (
    DriverHealth,
    Endpoint,
    Health,
    HealthListener,
    LiveState,
    StateStaleness,
    VerdictCollector,
    serve,
)

pytestmark = pytest.mark.spark


class Clock:
    def __init__(self) -> None:
        self.s = 500.0

    def __call__(self) -> float:
        return self.s


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


HANGING_SERIES = (
    "txnwatch_hanging_transaction_open_since_timestamp_seconds",
    (
        ("candidate_id", "c7"),
        ("cluster", "prod"),
        ("partition", "3"),
        ("producer_id", "7"),
        ("reason", "no-coordinator-state"),
        ("topic", "orders"),
        ("transactional_id", ""),
    ),
)
STALE = ("txnwatch_stream_state_stale", (("cluster", "prod"),))


def hanging_verdict() -> SimpleNamespace:
    """A reconcile event as the sinks hand it to LiveState: a HANGING verdict with its candidate."""
    return SimpleNamespace(
        event="VERDICT",
        topic="orders",
        partition=3,
        producer_id=7,
        kind="HANGING",
        reason="no-coordinator-state",
        lso_lag=5,
        age_ms=100_000,
        candidate_id="c7",
        withheld=None,
        event_time_ms=1_700_000_100_000,
        payload=None,
        start_offset=10,
        two_phase_commit=False,
        transactional_id=None,
    )


def samples(body: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The hanging transactions' series and the staleness flag of a /metrics body."""
    wanted = {HANGING_SERIES[0], STALE[0]}
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
        if s.name in wanted
    }


def progress_event(query_id: str) -> SimpleNamespace:
    p = SimpleNamespace(name="txnwatch-reconcile", id=query_id, batchDuration=800, sources=[])
    return SimpleNamespace(progress=p)


def test_the_driver_is_ready_while_every_query_moves_and_live_while_its_loop_turns() -> None:
    clock = Clock()
    registry = CollectorRegistry()
    driver = DriverHealth(stall_after_ms=20_000, monotonic=clock)
    listener = HealthListener(Health(registry), driver)
    server = serve(registry, "127.0.0.1", 0, driver)
    url = f"http://127.0.0.1:{server.server_port}"
    try:
        assert get(f"{url}/readyz") == (503, "not ready: no query started yet\n")
        driver.expect("txnwatch-reconcile", 10_000)
        driver.expect("txnwatch-windows", 30_000)
        driver.started("q-1", "txnwatch-reconcile")
        assert get(f"{url}/readyz") == (503, "not ready: no txnwatch-reconcile batch yet\n")
        listener.onQueryProgress(progress_event("q-1"))
        # The windows query has not even started: the job is not ready on its first query alone.
        assert get(f"{url}/readyz") == (503, "not ready: no txnwatch-windows batch yet\n")
        driver.started("q-2", "txnwatch-windows")
        listener.onQueryIdle(SimpleNamespace(id="q-2"))  # nothing new to read: current as well
        assert get(f"{url}/readyz")[0] == 200
        clock.s += 11  # the reconcile query has not finished a batch for 11 s, its window is 10 s
        status, body = get(f"{url}/readyz")
        assert status == 503 and "txnwatch-reconcile batch 11.0s ago" in body
        listener.onQueryIdle(SimpleNamespace(id="q-1"))
        assert get(f"{url}/readyz")[0] == 200
        # Liveness is the driver's loop: 11 s without a turn is within 20 s, 21 s is not.
        assert get(f"{url}/healthz")[0] == 200
        clock.s += 10
        status, body = get(f"{url}/healthz")
        assert status == 503 and body.startswith("stalled: the loop has not turned for 21.0s")
        driver.turned()
        assert get(f"{url}/healthz")[0] == 200
        status, text = get(f"{url}/metrics")
        assert status == 200 and "txnwatch_stream_batch_duration_seconds" in text
        assert f'txnwatch_build_info{{kafka_python="{metadata.version("kafka-python")}"' in text
        assert f'version="{metadata.version("txnwatch")}"' in text
    finally:
        server.shutdown()
        server.server_close()


def test_the_run_endpoint_keeps_answering_probes_while_the_queries_are_stopped() -> None:
    clock = Clock()
    driver = DriverHealth(stall_after_ms=20_000, monotonic=clock)
    endpoint = Endpoint("127.0.0.1", 0, driver)
    url = f"http://127.0.0.1:{endpoint.server.server_port}"
    live = LiveState()  # the run's, as streaming/job.py `run` keeps it across restarts

    def registry_of_a_start() -> CollectorRegistry:
        registry = CollectorRegistry()
        Health(registry)
        registry.register(VerdictCollector(live, "prod"))
        registry.register(StateStaleness(driver, "prod"))
        return registry

    try:
        assert get(f"{url}/metrics") == (503, "no metrics: the queries have not started yet\n")
        endpoint.show(registry_of_a_start())
        driver.expect("txnwatch-reconcile", 10_000)
        driver.started("q-1", "txnwatch-reconcile")
        driver.moved("q-1")
        live.apply_events([hanging_verdict()])
        assert get(f"{url}/readyz")[0] == 200
        status, body = get(f"{url}/metrics")
        assert status == 200 and "txnwatch_build_info{" in body
        assert samples(body) == {HANGING_SERIES: 1_700_000_000.0, STALE: 0.0}
        # A Kafka outage: run() stops the queries and waits, its loop still turning.
        endpoint.queries_stopped("the queries are stopped: Kafka does not answer")
        clock.s += 30
        driver.turned()
        assert get(f"{url}/healthz")[0] == 200
        assert get(f"{url}/readyz") == (503, "not ready: the queries are stopped: Kafka does not answer\n")
        # /metrics serves what the job last knew, marked stale: the hanging series stays, and so does its page.
        status, body = get(f"{url}/metrics")
        assert status == 200
        assert samples(body) == {HANGING_SERIES: 1_700_000_000.0, STALE: 1.0}
        # Started again from the checkpoints, on a new registry over the same verdicts: still stale until the
        # query moves again, current after.
        endpoint.show(registry_of_a_start())
        driver.started("q-2", "txnwatch-reconcile")
        assert get(f"{url}/readyz") == (503, "not ready: no txnwatch-reconcile batch yet\n")
        assert samples(get(f"{url}/metrics")[1]) == {HANGING_SERIES: 1_700_000_000.0, STALE: 1.0}
        driver.moved("q-2")
        assert get(f"{url}/readyz")[0] == 200
        status, body = get(f"{url}/metrics")
        assert status == 200 and samples(body) == {HANGING_SERIES: 1_700_000_000.0, STALE: 0.0}
        # The series ends only with the transaction (the job's GONE).
        live.apply_events([SimpleNamespace(**{**vars(hanging_verdict()), "event": "GONE"})])
        assert samples(get(f"{url}/metrics")[1]) == {STALE: 0.0}
    finally:
        endpoint.close()
