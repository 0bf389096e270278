"""The collector's metrics: names, units, labels, and the request log the benchmark counts with."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from admin.collect.metrics import CollectorMetrics
from admin.wire.requests import RequestLog

pytestmark = pytest.mark.unit


def test_request_log_counts_by_api_broker_and_outcome() -> None:
    metrics = CollectorMetrics()
    log = RequestLog(metrics)
    log.record("DescribeProducers", 1)
    log.record("DescribeProducers", 1)
    log.record("DescribeProducers", 2, "BROKER_UNREACHABLE")
    log.record_partition_error("DescribeProducers", "NOT_LEADER_OR_FOLLOWER", 3)
    assert log.by_broker("DescribeProducers") == {1: 2, 2: 1}
    assert log.snapshot()[("DescribeProducers", 2, "BROKER_UNREACHABLE")] == 1
    text = generate_latest(metrics.registry).decode()
    assert 'txnwatch_collector_requests_total{api="DescribeProducers",outcome="ok"} 2.0' in text
    assert 'txnwatch_collector_requests_total{api="DescribeProducers",outcome="error"} 1.0' in text
    assert 'txnwatch_collector_errors_total{api="DescribeProducers",error="BROKER_UNREACHABLE"} 1.0' in text
    assert (
        'txnwatch_collector_errors_total{api="DescribeProducers",error="NOT_LEADER_OR_FOLLOWER"} 3.0' in text
    )


def test_names_follow_the_house_style() -> None:
    registry = CollectorRegistry()
    CollectorMetrics(registry)
    names = {m.name for m in registry.collect()}
    # txnwatch_build_info is the one name both endpoints share (docs/streaming.md).
    assert all(n.startswith("txnwatch_collector_") for n in names - {"txnwatch_build_info"})
    assert {
        "txnwatch_collector_sweep_duration_seconds",
        "txnwatch_collector_partitions_scanned",
        "txnwatch_collector_open_transactions",
        "txnwatch_collector_requests",
        "txnwatch_collector_errors",
        "txnwatch_collector_last_success_timestamp_seconds",
    } <= names
    text = generate_latest(registry).decode()
    assert "# TYPE txnwatch_collector_requests_total counter" in text
    assert "# TYPE txnwatch_collector_last_success_timestamp_seconds gauge" in text


def test_a_log_without_metrics_still_counts() -> None:
    log = RequestLog()
    log.record("Fetch", 3, None)
    assert log.by_broker("Fetch") == {3: 1} and log.by_broker("Metadata") == {}
