"""The one Settings object: its sections, the environment (`TXNWATCH_*`, nested with `__`, and the names older than
the `stream` section), and `overlay` (how flags are laid over it)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import SecretStr, ValidationError
from test_client_properties import SCRAM_SSL

from common.settings import (
    CollectorSettings,
    KafkaSettings,
    Settings,
    StreamSettings,
    kafka_settings_from_properties,
    overlay,
)
from common.topics import TopicSettings

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("TXNWATCH_"):
            monkeypatch.delenv(key)


# ---------------------------------------------------------------------------------------------- Settings


def test_defaults() -> None:
    s = Settings()
    assert s.cluster == "default"
    assert s.kafka.bootstrap_servers == "localhost:9092" and s.kafka.security_protocol == "PLAINTEXT"
    d = s.detection
    assert (d.grace_ms, d.late_buffer_ms, d.clock_skew_ms) == (4_000, 0, 2_000)
    assert (d.coordinator_cleanup_interval_ms, d.default_max_transaction_timeout_ms) == (10_000, 900_000)
    t = s.topics
    assert (t.producer_state, t.coordinator_state, t.abort_candidates, t.audit, t.dead_letter) == (
        "txnwatch.producer-state",
        "txnwatch.coordinator-state",
        "txnwatch.abort-candidates",
        "txnwatch.audit",
        "txnwatch.dead-letter",
    )
    assert (s.output, s.log_level) == ("auto", None)
    assert s.collector == CollectorSettings() and s.collector.interval_s == 10.0
    assert s.stream == StreamSettings()
    # master None: spark-submit's, else local[*] (streaming/session.py)
    assert (s.stream.checkpoint_location, s.stream.master, s.stream.trigger) == (
        "txnwatch-checkpoints",
        None,
        "5 seconds",
    )
    assert (s.stream.transaction_log_topic, s.stream.metrics_port, s.stream.jars_dir) == (
        "__transaction_state",
        9465,
        None,
    )


def test_environment_with_nested_sections(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {
        "TXNWATCH_CLUSTER": "prod-eu",
        "TXNWATCH_KAFKA__BOOTSTRAP_SERVERS": "k1:9093,k2:9093",
        "TXNWATCH_KAFKA__SECURITY_PROTOCOL": "SASL_SSL",
        "TXNWATCH_KAFKA__SASL_MECHANISM": "SCRAM-SHA-512",
        "TXNWATCH_KAFKA__SASL_PLAIN_USERNAME": "txnwatch",
        "TXNWATCH_KAFKA__SASL_PLAIN_PASSWORD": "s3cret",
        "TXNWATCH_KAFKA__EXTRA__REQUEST_TIMEOUT_MS": "5000",
        "TXNWATCH_DETECTION__GRACE_MS": "30000",
        "TXNWATCH_DETECTION__LATE_BUFFER_MS": "60000",
        "TXNWATCH_TOPICS__PREFIX": "team-a.txnwatch",
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    s = Settings()
    assert s.cluster == "prod-eu"
    assert (s.detection.grace_ms, s.detection.late_buffer_ms) == (30_000, 60_000)
    assert s.topics.abort_candidates == "team-a.txnwatch.abort-candidates"
    assert isinstance(s.kafka.sasl_plain_password, SecretStr)
    assert "s3cret" not in repr(s)
    assert s.kafka.client_kwargs() == {
        "bootstrap_servers": "k1:9093,k2:9093",
        "client_id": "txnwatch",
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "txnwatch",
        "sasl_plain_password": "s3cret",
        "ssl_check_hostname": True,
        "request_timeout_ms": 5000,
    }


@pytest.mark.parametrize(
    ("key", "value"),
    [
        pytest.param("TXNWATCH_DETECTION__GRACE_MS", "-1", id="negative-grace"),
        pytest.param("TXNWATCH_KAFKA__SECURITY_PROTOCOL", "TLS", id="unknown-security-protocol"),
        pytest.param("TXNWATCH_DETECTION__DEFAULT_MAX_TRANSACTION_TIMEOUT_MS", "0", id="zero-max-timeout"),
        pytest.param(
            "TXNWATCH_KAFKA__BOOTSTRAP_SERVER", "k:9092", id="typo-in-a-nested-key-is-not-silently-ignored"
        ),
    ],
)
def test_invalid_environment_is_rejected(monkeypatch: pytest.MonkeyPatch, key: str, value: str) -> None:
    monkeypatch.setenv(key, value)
    with pytest.raises(ValidationError):
        Settings()


def test_settings_are_frozen() -> None:
    s = Settings()
    with pytest.raises(ValidationError):
        s.cluster = "x"  # type: ignore[misc]


def test_extra_client_settings_are_coerced() -> None:
    k = KafkaSettings(extra={"request_timeout_ms": "5000", "api.version.auto.timeout.ms": "100", "x": "true"})
    kw = k.client_kwargs()
    assert (kw["request_timeout_ms"], kw["api_version_auto_timeout_ms"], kw["x"]) == (5000, 100, True)


def test_collector_and_stream_sections_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    # The collector's names are the ones admin/settings.CollectorEnvironment read before it folded into Settings.
    env = {
        "TXNWATCH_OUTPUT": "json",
        "TXNWATCH_LOG_LEVEL": "DEBUG",
        "TXNWATCH_COLLECTOR__INTERVAL_S": "30",
        "TXNWATCH_COLLECTOR__METRICS_PORT": "0",
        "TXNWATCH_COLLECTOR__PRODUCER_STATE_TOPIC__PARTITIONS": "3",
        "TXNWATCH_STREAM__CHECKPOINT_LOCATION": "/var/lib/txnwatch/ck",
        "TXNWATCH_STREAM__STATE_BUCKETS": "8",
        "TXNWATCH_STREAM__COORDINATOR_SOURCE": "both",
        "TXNWATCH_STREAM__MAX_OFFSETS_PER_TRIGGER": "1000",
        "TXNWATCH_STREAM__JARS_DIR": "/opt/jars",
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    s = Settings()
    assert (s.output, s.log_level) == ("json", "DEBUG")
    c = s.collector
    assert (c.interval_s, c.metrics_port, c.producer_state_topic.partitions) == (30.0, 0, 3)
    assert c.producer_state_topic.retention_ms == 86_400_000  # the rest of the section keeps its defaults
    st = s.stream
    assert (st.checkpoint_location, st.state_buckets, st.coordinator_source) == (
        "/var/lib/txnwatch/ck",
        8,
        "both",
    )
    assert (st.max_offsets_per_trigger, st.jars_dir) == (1000, Path("/opt/jars"))


def test_variables_older_than_the_stream_section_still_work(monkeypatch: pytest.MonkeyPatch) -> None:
    # Read by streaming/cli.py and streaming/session.py straight from os.environ before issue 10.
    monkeypatch.setenv("TXNWATCH_CHECKPOINT_LOCATION", "/old/ck")
    monkeypatch.setenv("TXNWATCH_JARS_DIR", "/old/jars")
    monkeypatch.setenv("TXNWATCH_STREAM__TRIGGER", "1 second")  # merges with them, section by field
    s = Settings()
    assert (s.stream.checkpoint_location, s.stream.jars_dir, s.stream.trigger) == (
        "/old/ck",
        Path("/old/jars"),
        "1 second",
    )


def test_the_sectioned_name_wins_over_the_old_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TXNWATCH_CHECKPOINT_LOCATION", "/old/ck")
    monkeypatch.setenv("TXNWATCH_STREAM__CHECKPOINT_LOCATION", "/new/ck")
    assert Settings().stream.checkpoint_location == "/new/ck"


def test_arguments_win_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TXNWATCH_CHECKPOINT_LOCATION", "/old/ck")
    monkeypatch.setenv("TXNWATCH_STREAM__TRIGGER", "1 second")
    s = Settings(stream={"checkpoint_location": "/arg/ck"})  # type: ignore[arg-type]
    assert (s.stream.checkpoint_location, s.stream.trigger) == ("/arg/ck", "1 second")


def test_unrelated_txnwatch_variables_are_not_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    # The test suite's and the test bed's own variables share the prefix.
    monkeypatch.setenv("TXNWATCH_TEST_BOOTSTRAP", "127.0.0.1:1")
    monkeypatch.setenv("TXNWATCH_TESTBED_DIR", "/tmp/tb")
    assert Settings() == Settings.model_validate({})


@pytest.mark.parametrize(
    ("key", "value"),
    [
        pytest.param("TXNWATCH_COLLECTOR__INTERVAL", "5", id="typo-in-the-collector-section"),
        pytest.param("TXNWATCH_COLLECTOR__DESCRIBE_BATCH_SIZE", "501", id="above-kafkas-batch-limit"),
        pytest.param("TXNWATCH_STREAM__STATE_BUCKETS", "0", id="no-buckets"),
        pytest.param("TXNWATCH_STREAM__COORDINATOR_SOURCE", "kafka", id="unknown-coordinator-source"),
        pytest.param("TXNWATCH_OUTPUT", "yaml", id="unknown-output"),
        pytest.param("TXNWATCH_LOG_LEVEL", "LOUD", id="unknown-log-level"),
    ],
)
def test_invalid_sections_are_rejected(monkeypatch: pytest.MonkeyPatch, key: str, value: str) -> None:
    monkeypatch.setenv(key, value)
    with pytest.raises(ValidationError):
        Settings()


# ---------------------------------------------------------------------------------------------- overlay


def test_overlay_merges_sections_field_by_field_and_validates() -> None:
    base = Settings(cluster="c", collector=CollectorSettings(interval_s=30, metrics_port=0))
    s = overlay(base, {"collector": {"interval_s": 5, "producer_state_topic": {"partitions": 12}}})
    assert (s.cluster, s.collector.interval_s, s.collector.metrics_port) == ("c", 5, 0)
    assert (s.collector.producer_state_topic.partitions, s.collector.producer_state_topic.retention_ms) == (
        12,
        86_400_000,
    )
    assert base.collector.interval_s == 30  # a new object; the base is untouched
    with pytest.raises(ValidationError, match="describe_batch_size"):
        overlay(base, {"collector": {"describe_batch_size": 501}})
    with pytest.raises(ValidationError):
        overlay(base, {"colector": {}})


def test_overlay_does_not_read_the_environment_again(monkeypatch: pytest.MonkeyPatch) -> None:
    base = Settings()
    monkeypatch.setenv("TXNWATCH_CLUSTER", "changed-since")
    assert overlay(base, {"topics": TopicSettings(prefix="p")}).cluster == "default"


def test_overlay_keeps_secrets_secret() -> None:
    base = Settings(kafka=KafkaSettings(sasl_plain_password="s3cret"))  # type: ignore[arg-type]
    s = overlay(base, {"kafka": {"bootstrap_servers": "b:9092"}})
    assert s.kafka.client_kwargs()["sasl_plain_password"] == "s3cret" and "s3cret" not in repr(s)


def test_kafka_settings_from_properties_with_bootstrap_override() -> None:
    base = KafkaSettings(client_id="txnwatch-cli", extra={"retry_backoff_ms": "50"})
    k, ignored = kafka_settings_from_properties(SCRAM_SSL, bootstrap_servers="override:9093", base=base)
    assert k.bootstrap_servers == "override:9093"
    assert k.client_id == "txnwatch-cli"
    assert k.sasl_plain_password is not None and k.sasl_plain_password.get_secret_value() == "alice-secret"
    assert (k.ssl_cafile, k.ssl_check_hostname) == ("/etc/kafka/ca.pem", False)
    assert k.extra == {"retry_backoff_ms": "50", "request_timeout_ms": "30000"}
    assert k.client_kwargs()["request_timeout_ms"] == 30000
    assert ignored == ("group.id: unknown to txnwatch (dropped)",)
