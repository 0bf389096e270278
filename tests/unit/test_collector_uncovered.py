"""The collector names each partition a sweep could not describe (txnwatch_collector_partition_uncovered), at most
100 of them, while the by-reason gauge keeps counting them all."""

from __future__ import annotations

import pytest
from collector_fakes import FakeCluster
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from admin.collect.collector import Collector
from admin.collect.metrics import MAX_UNCOVERED_SERIES, CollectorMetrics, uncovered_series
from common.settings import CollectorSettings

pytestmark = pytest.mark.unit


def sweep_once(cluster: FakeCluster) -> str:
    metrics = CollectorMetrics()
    Collector(
        cluster, cluster="prod", settings=CollectorSettings(), open_partitions=set(), metrics=metrics
    ).sweep()
    return generate_latest(metrics.registry).decode()


def samples(text: str, name: str) -> list[dict[str, str]]:
    return [s.labels for f in text_string_to_metric_families(text) for s in f.samples if s.name == name]


def test_each_undescribed_partition_is_named_with_its_reason_and_a_described_one_is_not() -> None:
    cluster = FakeCluster(
        leaders={("orders", 0): 1, ("orders", 1): -1, ("pay", 3): 2, ("ok", 0): 1}, down={2}
    )
    text = sweep_once(cluster)
    named = samples(text, "txnwatch_collector_partition_uncovered")
    assert sorted(named, key=lambda x: x["topic"]) == [
        {"topic": "orders", "partition": "1", "reason": "LEADER_NOT_AVAILABLE"},
        {"topic": "pay", "partition": "3", "reason": "BROKER_UNREACHABLE"},
    ]
    assert (
        'txnwatch_collector_partition_uncovered{partition="1",reason="LEADER_NOT_AVAILABLE",topic="orders"} 1.0'
        in (text)
    )


def test_at_most_100_partitions_are_named_and_the_by_reason_gauge_counts_them_all() -> None:
    leaders = {("big", p): -1 for p in range(250)}
    leaders[("ok", 0)] = 1
    text = sweep_once(FakeCluster(leaders=leaders))
    named = samples(text, "txnwatch_collector_partition_uncovered")
    assert len(named) == MAX_UNCOVERED_SERIES == 100
    assert 'txnwatch_collector_partitions_uncovered{reason="LEADER_NOT_AVAILABLE"} 250.0' in text


def test_a_partition_described_again_loses_its_series() -> None:
    cluster = FakeCluster(leaders={("orders", 0): -1, ("ok", 0): 1})
    metrics = CollectorMetrics()
    collector = Collector(
        cluster, cluster="prod", settings=CollectorSettings(), open_partitions=set(), metrics=metrics
    )
    collector.sweep()
    assert samples(generate_latest(metrics.registry).decode(), "txnwatch_collector_partition_uncovered")
    cluster.leaders[("orders", 0)] = 1
    collector.sweep()
    assert not samples(generate_latest(metrics.registry).decode(), "txnwatch_collector_partition_uncovered")


def test_the_cap_keeps_the_same_partitions_from_sweep_to_sweep_by_reason_then_partition() -> None:
    uncovered = {("b", 1): "X", ("a", 2): "X", ("a", 10): "X", ("z", 0): "A"}
    assert uncovered_series(uncovered, 3) == [(("z", 0), "A"), (("a", 2), "X"), (("a", 10), "X")]
    assert uncovered_series(uncovered, 10)[-1] == (("b", 1), "X")
