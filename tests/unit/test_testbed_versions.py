"""The test bed's per-release choices (dev/kafka_versions.py, dev/kafka.py), without starting anything: what each
release is formatted and configured with. tests/compat/test_matrix.py starts every release for real."""

from __future__ import annotations

from pathlib import Path

import pytest

from dev.kafka import TestBedConfig, _server_properties, effective_config
from dev.kafka_versions import LATEST_PATCHES, pom_text

pytestmark = pytest.mark.unit


def props(cfg: TestBedConfig) -> dict[str, str]:
    text = _server_properties(effective_config(cfg), 1, {1: (9092, 9093)}, Path("/data"), zookeeper_port=2181)
    return dict(line.split("=", 1) for line in text.splitlines())


def test_before_4_0_every_transaction_is_version_0() -> None:
    assert effective_config(TestBedConfig(kafka_version="3.9.2")).transaction_version == 0
    assert (
        effective_config(TestBedConfig(kafka_version="4.0.2", transaction_version=0)).transaction_version == 0
    )
    assert effective_config(TestBedConfig(kafka_version="4.0.2")).transaction_version == 2


def test_3_5_has_no_partition_verification_setting() -> None:
    assert "transaction.partition.verification.enable" not in props(TestBedConfig(kafka_version="3.5.2"))
    assert effective_config(TestBedConfig(kafka_version="3.5.2")).partition_verification is False
    assert props(TestBedConfig(kafka_version="3.6.2"))["transaction.partition.verification.enable"] == "true"


def test_a_zookeeper_broker_has_no_kraft_settings() -> None:
    zk = props(TestBedConfig(kafka_version="3.9.2", metadata="zookeeper"))
    assert zk["zookeeper.connect"] == "127.0.0.1:2181" and zk["broker.id"] == "1"
    assert not {"process.roles", "node.id", "controller.quorum.voters", "controller.listener.names"} & set(zk)
    assert zk["listeners"] == "PLAINTEXT://127.0.0.1:9092"
    assert "CONTROLLER" not in zk["listener.security.protocol.map"]
    kraft = props(TestBedConfig(kafka_version="3.9.2"))
    assert kraft["process.roles"] == "broker,controller" and "zookeeper.connect" not in kraft


def test_what_a_release_cannot_run_is_refused() -> None:
    with pytest.raises(ValueError, match="no ZooKeeper mode"):
        effective_config(TestBedConfig(kafka_version="4.0.2", metadata="zookeeper"))
    with pytest.raises(ValueError, match="PLAINTEXT only"):
        effective_config(TestBedConfig(kafka_version="3.9.2", metadata="zookeeper", security="sasl-scram"))
    with pytest.raises(ValueError, match="starts Kafka 3"):
        effective_config(TestBedConfig(kafka_version="3.4.1"))


def test_each_release_logs_through_what_its_distribution_ships() -> None:
    for version in LATEST_PATCHES:
        pom = pom_text(version)
        assert f"<artifactId>kafka_2.13</artifactId><version>{version}</version>" in pom
        if version.startswith("3."):
            assert "reload4j" in pom and "log4j-core" not in pom
        else:
            assert "log4j-core" in pom and "reload4j" not in pom
