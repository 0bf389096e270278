"""The `--command-config` client.properties parser (common/client_properties.py): Java properties syntax,
sasl.jaas.config, and the translation to kafka-python kwargs with what it refuses and why."""

from __future__ import annotations

from typing import Any

import pytest

from common.client_properties import (
    ClientPropertiesError,
    coerce_value,
    parse_client_properties,
    parse_jaas_config,
    parse_properties,
)

pytestmark = pytest.mark.unit


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
    pytest.param(
        "security.protocol=SASL_SSL\nsasl.mechanism=OAUTHBEARER\n"
        "sasl.jaas.config=org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required "
        'unsecuredLoginStringClaim_sub="txnwatch-collector" unsecuredLoginLifetimeSeconds="600";\n'
        "ssl.truststore.type=PEM\nssl.truststore.location=/bed/tls/ca.pem",
        {
            "security_protocol": "SASL_SSL",
            "sasl_mechanism": "OAUTHBEARER",
            "sasl_oauth_unsecured_sub": "txnwatch-collector",
            "sasl_oauth_unsecured_lifetime_s": 600,
            "ssl_cafile": "/bed/tls/ca.pem",
        },
        id="oauthbearer-unsecured-jws-claims",
    ),
    pytest.param(
        "security.protocol=SASL_SSL\nsasl.mechanism=OAUTHBEARER\n"
        "sasl.login.callback.handler.class="
        "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler\n"
        "sasl.oauthbearer.token.endpoint.url=https://idp.example/oauth2/token\n"
        "sasl.oauthbearer.client.credentials.client.id=txnwatch\n"
        "sasl.oauthbearer.client.credentials.client.secret=s3cret\n"
        "sasl.oauthbearer.scope=kafka\n"
        "sasl.jaas.config=org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required;",
        {
            "security_protocol": "SASL_SSL",
            "sasl_mechanism": "OAUTHBEARER",
            "sasl_oauth_token_endpoint_url": "https://idp.example/oauth2/token",
            "sasl_oauth_client_id": "txnwatch",
            "sasl_oauth_client_secret": "s3cret",
            "sasl_oauth_scope": "kafka",
        },
        id="oauthbearer-client-credentials-kafka-4-1-names",
    ),
    pytest.param(
        "sasl.mechanism=OAUTHBEARER\n"
        "sasl.oauthbearer.token.endpoint.url=https://idp.example/token\n"
        "sasl.jaas.config=org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required "
        'clientId="txnwatch" clientSecret="s3cret" scope="kafka";',
        {
            "sasl_mechanism": "OAUTHBEARER",
            "sasl_oauth_token_endpoint_url": "https://idp.example/token",
            "sasl_oauth_client_id": "txnwatch",
            "sasl_oauth_client_secret": "s3cret",
            "sasl_oauth_scope": "kafka",
        },
        id="oauthbearer-client-credentials-in-jaas-options",
    ),
    pytest.param(
        "security.protocol=SASL_SSL\nsasl.mechanism=OAUTHBEARER\n"
        "sasl.jaas.config=org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required;\n"
        "sasl.login.callback.handler.class=software.amazon.msk.auth.iam.IAMOAuthBearerLoginCallbackHandler\n"
        "sasl.client.callback.handler.class=software.amazon.msk.auth.iam.IAMOAuthBearerLoginCallbackHandler",
        {"security_protocol": "SASL_SSL", "sasl_mechanism": "OAUTHBEARER", "sasl_oauth_aws_msk_iam": True},
        id="msk-iam-over-oauthbearer",
    ),
    pytest.param(
        "security.protocol=SASL_SSL\nsasl.mechanism=AWS_MSK_IAM\n"
        "sasl.jaas.config=software.amazon.msk.auth.iam.IAMLoginModule required;\n"
        "sasl.client.callback.handler.class=software.amazon.msk.auth.iam.IAMClientCallbackHandler",
        {"security_protocol": "SASL_SSL", "sasl_mechanism": "AWS_MSK_IAM"},
        id="msk-iam-java-client-file",
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
        pytest.param(
            "sasl.mechanism=OAUTHBEARER", "no token source", id="oauthbearer-without-a-token-source"
        ),
        pytest.param(
            "sasl.jaas.config=org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required;",
            "no token source",
            id="oauthbearer-login-module-without-a-token-source",
        ),
        pytest.param(
            "sasl.mechanism=OAUTHBEARER\n"
            "sasl.login.callback.handler.class=com.example.CustomLoginCallbackHandler\n"
            "sasl.jaas.config=org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required;",
            "no token source",
            id="oauthbearer-custom-login-handler",
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


@pytest.mark.parametrize(
    ("raw", "value"),
    [
        pytest.param("123", 123, id="digits-are-ints"),
        pytest.param(" -5 ", -5, id="negative-with-blanks"),
        pytest.param("TRUE", True, id="booleans-any-case"),
        pytest.param("false", False, id="false"),
        pytest.param("1.5", "1.5", id="anything-else-unchanged"),
    ],
)
def test_coerce_value(raw: str, value: object) -> None:
    assert coerce_value(raw) == value
