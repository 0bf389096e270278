"""Shared fixtures: the real KRaft test bed (dev/kafka.py) and, for the spark tier, a real local SparkSession.

Set TXNWATCH_TEST_BOOTSTRAP=host:port to reuse a running test bed (it must have partition verification off for
the hanging scenario); otherwise one is started for the session and stopped at the end. A broker that cannot
start is an error, never a skip.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from dev.kafka import Cluster, TestBedConfig, start_cluster, stop_cluster

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def kafka_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    reuse = os.environ.get("TXNWATCH_TEST_BOOTSTRAP")
    if reuse:
        yield Cluster(reuse, "external", [], {}, "")
        return
    state_dir = tmp_path_factory.mktemp("testbed")
    cluster = start_cluster(TestBedConfig(nodes=1, partition_verification=False), state_dir)
    try:
        yield cluster
    finally:
        stop_cluster(state_dir)


@pytest.fixture(scope="session")
def bootstrap(kafka_cluster: Cluster) -> str:
    return kafka_cluster.bootstrap_servers


@pytest.fixture
def unique() -> str:
    """A fresh prefix for topics and transactional ids, so tests sharing the broker never see each other."""
    return f"t{uuid.uuid4().hex[:10]}-"


@pytest.fixture(scope="session")
def spark():  # type: ignore[no-untyped-def]
    from streaming.job import spark_conf
    from streaming.session import build_session

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    session = build_session(
        master="local[2]",
        app_name="txnwatch-tests",
        extra_conf={
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.sql.shuffle.partitions": "2",
            "spark.default.parallelism": "2",
            "spark.sql.adaptive.enabled": "false",
            **spark_conf(),
        },
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
