"""SASL/OAUTHBEARER token providers for kafka-python (common/oauth.py): the unsecured JWS Kafka's default validator
accepts, the client-credentials request Kafka's Java client sends, the settings → provider choice, secrets kept
out of repr. The real broker tests: tests/e2e/test_auth_modes.py."""

from __future__ import annotations

import base64
import json
import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from common.client_properties import parse_client_properties
from common.oauth import (
    ClientCredentialsTokenProvider,
    MskIamTokenProvider,
    OAuthError,
    UnsecuredTokenProvider,
    unsecured_jws,
    with_token_provider,
)
from common.settings import kafka_settings_from_properties

pytestmark = pytest.mark.unit


def _part(segment: str) -> dict[str, Any]:
    decoded: dict[str, Any] = json.loads(base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4)))
    return decoded


def test_unsecured_jws_is_what_kafkas_unsecured_validator_takes() -> None:
    header, claims, signature = unsecured_jws("txnwatch-abort", 1_000.7, 600).split(".")
    # OAuthBearerUnsecuredJws: algorithm "none", no signature; the validator needs sub (string), exp (number).
    assert _part(header) == {"alg": "none"}
    assert _part(claims) == {"sub": "txnwatch-abort", "iat": 1000, "exp": 1600}
    assert signature == ""


class Endpoint:
    """Records the token requests; answers with a new token each time."""

    def __init__(self, answer: Mapping[str, Any]) -> None:
        self.answer = answer
        self.requests: list[urllib.request.Request] = []

    def __call__(self, req: urllib.request.Request) -> Mapping[str, Any]:
        self.requests.append(req)
        return {**self.answer, "access_token": f"{self.answer.get('access_token')}-{len(self.requests)}"}


def test_client_credentials_request_is_kafkas() -> None:
    endpoint = Endpoint({"access_token": "t", "expires_in": 100})
    provider = ClientCredentialsTokenProvider(
        "https://idp/token", "txnwatch", "s3cret", "kafka", post=endpoint, clock=lambda: 0.0
    )
    assert provider.token() == "t-1"
    (req,) = endpoint.requests
    assert req.get_method() == "POST" and req.full_url == "https://idp/token"
    assert req.get_header("Authorization") == "Basic " + base64.b64encode(b"txnwatch:s3cret").decode()
    assert req.get_header("Content-type") == "application/x-www-form-urlencoded"
    assert isinstance(req.data, bytes)
    assert urllib.parse.parse_qs(req.data.decode()) == {
        "grant_type": ["client_credentials"],
        "scope": ["kafka"],
    }


def test_client_credentials_token_is_reused_until_80_percent_of_its_lifetime() -> None:
    now = [0.0]
    endpoint = Endpoint({"access_token": "t", "expires_in": 100})
    provider = ClientCredentialsTokenProvider(
        "https://idp/token", "id", "secret", post=endpoint, clock=lambda: now[0]
    )
    assert provider.token() == "t-1"
    now[0] = 79.9
    assert provider.token() == "t-1"
    now[0] = 80.0
    assert provider.token() == "t-2"
    assert len(endpoint.requests) == 2


def test_an_answer_without_access_token_is_an_error_naming_the_endpoint() -> None:
    provider = ClientCredentialsTokenProvider(
        "https://idp/token", "id", "secret", post=lambda req: {"error": "invalid_client"}
    )
    with pytest.raises(
        OAuthError, match=r"https://idp/token answered without an access_token \(keys: error\)"
    ):
        provider.token()


def test_the_client_secret_is_not_in_repr() -> None:
    provider = ClientCredentialsTokenProvider("https://idp/token", "id", "very-secret")
    assert "very-secret" not in repr(provider) and "very-secret" not in str(vars(provider).get("client_id"))


def _kwargs(text: str) -> dict[str, Any]:
    settings, _ = kafka_settings_from_properties(text, bootstrap_servers="b:9093")
    return settings.client_kwargs()


def test_settings_give_kafka_python_a_token_provider_and_no_unknown_keys() -> None:
    kwargs = _kwargs(
        "security.protocol=SASL_SSL\nsasl.mechanism=OAUTHBEARER\n"
        "sasl.jaas.config=org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required "
        'unsecuredLoginStringClaim_sub="txnwatch-stream";'
    )
    provider = kwargs["sasl_oauth_token_provider"]
    assert isinstance(provider, UnsecuredTokenProvider) and provider.sub == "txnwatch-stream"
    assert not [k for k in kwargs if k.startswith("sasl_oauth_") and k != "sasl_oauth_token_provider"]
    # Every key is one kafka-python's clients take.
    from kafka import KafkaAdminClient

    assert set(kwargs) <= set(KafkaAdminClient.DEFAULT_CONFIG)


def test_client_credentials_settings_make_the_client_credentials_provider() -> None:
    kwargs = _kwargs(
        "sasl.mechanism=OAUTHBEARER\nsasl.oauthbearer.token.endpoint.url=https://idp/token\n"
        "sasl.oauthbearer.client.credentials.client.id=id\nsasl.oauthbearer.client.credentials.client.secret=s\n"
    )
    provider = kwargs["sasl_oauth_token_provider"]
    assert isinstance(provider, ClientCredentialsTokenProvider) and provider.client_id == "id"


def test_client_credentials_without_a_secret_is_an_error() -> None:
    with pytest.raises(OAuthError, match="needs a client id and secret"):
        with_token_provider(
            {"sasl_mechanism": "OAUTHBEARER", "sasl_oauth_token_endpoint_url": "https://idp/token"}
        )


def test_oauth_settings_are_dropped_for_other_mechanisms() -> None:
    assert with_token_provider({"sasl_mechanism": "PLAIN", "sasl_oauth_aws_msk_iam": False}) == {
        "sasl_mechanism": "PLAIN"
    }


def test_msk_iam_oauthbearer_without_the_signer_package_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "aws_msk_iam_sasl_signer", None)  # not installed
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    parsed = parse_client_properties(
        "sasl.mechanism=OAUTHBEARER\n"
        "sasl.login.callback.handler.class=software.amazon.msk.auth.iam.IAMOAuthBearerLoginCallbackHandler"
    )
    with pytest.raises(OAuthError, match="pip install aws-msk-iam-sasl-signer-python"):
        with_token_provider(parsed.kwargs)


def test_msk_iam_oauthbearer_needs_a_region(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    with pytest.raises(OAuthError, match="set AWS_REGION"):
        with_token_provider({"sasl_mechanism": "OAUTHBEARER", "sasl_oauth_aws_msk_iam": True})


def test_msk_iam_provider_signs_for_the_region(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    import types

    signed: list[str] = []

    class MSKAuthTokenProvider:
        @staticmethod
        def generate_auth_token(region: str) -> tuple[str, int]:
            signed.append(region)
            return "signed-token", 1

    module = types.ModuleType("aws_msk_iam_sasl_signer")
    module.MSKAuthTokenProvider = MSKAuthTokenProvider  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "aws_msk_iam_sasl_signer", module)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    provider = with_token_provider({"sasl_mechanism": "OAUTHBEARER", "sasl_oauth_aws_msk_iam": True})[
        "sasl_oauth_token_provider"
    ]
    assert isinstance(provider, MskIamTokenProvider)
    assert provider.token() == "signed-token" and signed == ["us-east-1"]


def test_msk_iam_provider_signs_a_real_token_with_the_installed_package(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The real aws-msk-iam-sasl-signer-python (the msk extra, in the dev extra and both images), not a stand-in:
    the token is MSK's SigV4-presigned kafka-cluster:Connect URL, signed locally with static credentials."""
    # Only the environment's credentials: no profile files, no instance metadata.
    for var in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDTXNWATCHTEST")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-a-secret")
    monkeypatch.setenv("AWS_REGION", "eu-central-1")
    parsed = parse_client_properties(
        "sasl.mechanism=OAUTHBEARER\n"
        "sasl.login.callback.handler.class=software.amazon.msk.auth.iam.IAMOAuthBearerLoginCallbackHandler"
    )
    provider = with_token_provider(parsed.kwargs)["sasl_oauth_token_provider"]
    assert isinstance(provider, MskIamTokenProvider)
    token = provider.token()
    url = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()  # base64url, unpadded
    parts = urllib.parse.urlsplit(url)
    query = urllib.parse.parse_qs(parts.query)
    assert parts.netloc == "kafka.eu-central-1.amazonaws.com"
    assert query["Action"] == ["kafka-cluster:Connect"]
    assert query["X-Amz-Algorithm"] == ["AWS4-HMAC-SHA256"]
    assert query["X-Amz-Credential"][0].startswith("AKIDTXNWATCHTEST/")
    assert query["X-Amz-Credential"][0].endswith("/eu-central-1/kafka-cluster/aws4_request")
    assert len(query["X-Amz-Signature"][0]) == 64
