"""Settings from the environment, and the client.properties (--command-config) parser."""

from __future__ import annotations

import os
from typing import Any

import pytest
from pydantic import SecretStr, ValidationError

from detectors.settings import (
    ClientPropertiesError,
    KafkaSettings,
    Settings,
    kafka_settings_from_properties,
    parse_client_properties,
    parse_jaas_config,
    parse_properties,
)

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
    assert (d.grace_ms, d.late_buffer_ms, d.clock_skew_ms) == (10_000, 0, 5_000)
    assert (d.coordinator_cleanup_interval_ms, d.default_max_transaction_timeout_ms) == (10_000, 900_000)
    t = s.topics
    assert (t.producer_state, t.coordinator_state, t.abort_candidates, t.audit, t.dead_letter) == (
        "txnwatch.producer-state",
        "txnwatch.coordinator-state",
        "txnwatch.abort-candidates",
        "txnwatch.audit",
        "txnwatch.dead-letter",
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


# ------------------------------------------------------------------------------------- .properties syntax


def test_java_properties_syntax() -> None:
    text = "\n".join(
        [
            "# comment",
            "! also a comment",
            "   ",
            "a=1",
            "b : 2",
            "c 3",
            "d = value with # not a comment",
            "e=first \\",
            "   second",
            "f\\=g=h",
            "u=\\u0041\\tB",
            "empty=",
            "odd=ends with backslash \\\\",
        ]
    )
    assert parse_properties(text) == {
        "a": "1",
        "b": "2",
        "c": "3",
        "d": "value with # not a comment",
        "e": "first second",
        "f=g": "h",
        "u": "A\tB",
        "empty": "",
        "odd": "ends with backslash \\",
    }


@pytest.mark.parametrize(
    ("value", "module", "options"),
    [
        pytest.param(
            'org.apache.kafka.common.security.plain.PlainLoginModule required username="u" password="p";',
            "org.apache.kafka.common.security.plain.PlainLoginModule",
            {"username": "u", "password": "p"},
            id="plain-quoted",
        ),
        pytest.param(
            "org.apache.kafka.common.security.scram.ScramLoginModule required username=u password=p",
            "org.apache.kafka.common.security.scram.ScramLoginModule",
            {"username": "u", "password": "p"},
            id="scram-bare-without-semicolon",
        ),
        pytest.param(
            'x.Y required password="a \\"quoted\\" pass; word";',
            "x.Y",
            {"password": 'a "quoted" pass; word'},
            id="escaped-quotes-and-semicolon-inside-quotes",
        ),
    ],
)
def test_jaas_config(value: str, module: str, options: dict[str, str]) -> None:
    assert parse_jaas_config(value) == (module, options)


# ----------------------------------------------------------------------------------- client.properties


SCRAM_SSL = """
bootstrap.servers=b1:9093,b2:9093
security.protocol=SASL_SSL
sasl.mechanism=SCRAM-SHA-512
sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required \\
    username="alice" \\
    password="alice-secret";
ssl.truststore.location=/etc/kafka/ca.pem
ssl.truststore.type=PEM
ssl.endpoint.identification.algorithm=
request.timeout.ms=30000
group.id=not-for-admin
"""

CASES: list[Any] = [
    pytest.param(
        SCRAM_SSL,
        {
            "bootstrap_servers": "b1:9093,b2:9093",
            "security_protocol": "SASL_SSL",
            "sasl_mechanism": "SCRAM-SHA-512",
            "sasl_plain_username": "alice",
            "sasl_plain_password": "alice-secret",
            "ssl_cafile": "/etc/kafka/ca.pem",
            "ssl_check_hostname": False,
            "request_timeout_ms": 30000,
        },
        id="scram-over-ssl-with-pem-truststore-and-hostname-check-off",
    ),
    pytest.param(
        "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\n"
        "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username=bob password=pw;",
        {
            "security_protocol": "SASL_PLAINTEXT",
            "sasl_mechanism": "PLAIN",
            "sasl_plain_username": "bob",
            "sasl_plain_password": "pw",
        },
        id="plain-credentials-map-to-sasl-plain-kwargs",
    ),
    pytest.param(
        "security.protocol=SSL\nssl.truststore.location=/certs/ca.crt\n"
        "ssl.keystore.location=/certs/client.pem\nssl.keystore.type=PEM\nssl.key.password=kp\n"
        "ssl.endpoint.identification.algorithm=https",
        {
            "security_protocol": "SSL",
            "ssl_cafile": "/certs/ca.crt",
            "ssl_certfile": "/certs/client.pem",
            "ssl_password": "kp",
            "ssl_check_hostname": True,
        },
        id="mutual-tls-with-pem-stores",
    ),
    pytest.param(
        "security.protocol=SSL\nssl.cafile=/certs/ca.pem\nssl.certfile=/certs/c.pem\nssl.keyfile=/certs/k.pem",
        {
            "security_protocol": "SSL",
            "ssl_cafile": "/certs/ca.pem",
            "ssl_certfile": "/certs/c.pem",
            "ssl_keyfile": "/certs/k.pem",
        },
        id="kafka-python-pem-file-keys-are-accepted-too",
    ),
    pytest.param(
        "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=GSSAPI\nsasl.kerberos.service.name=kafka\n",
        {
            "security_protocol": "SASL_PLAINTEXT",
            "sasl_mechanism": "GSSAPI",
            "sasl_kerberos_service_name": "kafka",
        },
        id="kerberos-service-name",
    ),
]


@pytest.mark.parametrize(("text", "kwargs"), CASES)
def test_client_properties_to_kafka_python_kwargs(text: str, kwargs: dict[str, Any]) -> None:
    assert parse_client_properties(text).kwargs == kwargs


def test_unusable_keys_are_listed_not_silently_dropped() -> None:
    ignored = parse_client_properties(SCRAM_SSL).ignored
    assert ignored == ("group.id: unknown to txnwatch (dropped)",)


def test_kerberos_keytab_options_are_reported() -> None:
    text = (
        "sasl.mechanism=GSSAPI\nsasl.jaas.config=com.sun.security.auth.module.Krb5LoginModule required "
        'useKeyTab=true keyTab="/k.keytab" principal="tw@EX.COM" serviceName="kafka";'
    )
    parsed = parse_client_properties(text)
    assert parsed.kwargs == {"sasl_mechanism": "GSSAPI", "sasl_kerberos_service_name": "kafka"}
    assert [i.split(":")[0] for i in parsed.ignored] == [
        "sasl.jaas.config keyTab",
        "sasl.jaas.config principal",
        "sasl.jaas.config useKeyTab",
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param(
            "ssl.truststore.location=/etc/kafka/truststore.jks\nssl.truststore.password=changeit",
            "give that file as ssl.cafile",
            id="jks-truststore-tells-the-user-to-give-a-pem-cafile",
        ),
        pytest.param(
            "ssl.truststore.location=/etc/kafka/ts.p12\nssl.truststore.type=PKCS12",
            "PKCS12 store",
            id="pkcs12-truststore",
        ),
        pytest.param(
            "ssl.keystore.location=/etc/kafka/ks.jks\nssl.keystore.password=x",
            "ssl.certfile and ssl.keyfile",
            id="jks-keystore-tells-the-user-to-give-pem-files",
        ),
        pytest.param(
            "ssl.truststore.certificates=-----BEGIN CERTIFICATE-----",
            "cannot take inline PEM",
            id="inline-pem",
        ),
        pytest.param("sasl.mechanism=OAUTHBEARER", "token provider", id="oauthbearer"),
        pytest.param(
            "sasl.jaas.config=org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required;",
            "token provider",
            id="oauthbearer-login-module",
        ),
        pytest.param(
            "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username=u;",
            "without password",
            id="plain-without-password",
        ),
        pytest.param("security.protocol=TLS", "is not one of", id="unknown-security-protocol"),
        pytest.param("sasl.jaas.config=garbage", "cannot parse", id="unparseable-jaas"),
    ],
)
def test_settings_kafka_python_cannot_honour_fail_clearly(text: str, message: str) -> None:
    with pytest.raises(ClientPropertiesError, match=message):
        parse_client_properties(text)


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
