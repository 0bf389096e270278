"""The driver's /metrics endpoint and the health listener (streaming/exporter.py), without running a query."""

from __future__ import annotations

import logging
import urllib.request
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from streaming.exporter import Health, HealthListener, serve

pytestmark = pytest.mark.spark


def progress(name: str = "txnwatch-reconcile", *, sources: Any = ()) -> SimpleNamespace:
    p = SimpleNamespace(name=name, id="q-1", batchDuration=1500, sources=list(sources))
    return SimpleNamespace(progress=p)


def test_the_endpoint_serves_counters_without_created_series() -> None:
    registry = CollectorRegistry()
    health = Health(registry)
    HealthListener(health).onQueryProgress(
        progress(sources=[SimpleNamespace(description="KafkaV2[Subscribe[t]]", numInputRows=3, metrics={})])
    )
    server = serve(registry, "127.0.0.1", 0)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.server_port}/metrics", timeout=10) as response:
            text = response.read().decode()
    finally:
        server.shutdown()
        server.server_close()
    assert 'txnwatch_stream_input_rows_total{query="txnwatch-reconcile",source="t"} 3.0' in text
    assert "_created" not in text


def test_a_progress_event_it_cannot_read_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    listener = HealthListener(Health(CollectorRegistry()))
    broken = SimpleNamespace(progress=None)  # no attributes at all
    with caplog.at_level(logging.DEBUG, logger="txnwatch.stream.metrics"):
        for _ in range(3):
            listener.onQueryProgress(broken)  # never raises: the listener thread serves every query
    levels = [r.levelno for r in caplog.records if r.name == "txnwatch.stream.metrics"]
    assert levels == [logging.WARNING, logging.DEBUG, logging.DEBUG]  # once loud, then quiet
    assert caplog.records[0].exc_info is not None
