"""SASL/OAUTHBEARER for kafka-python: `with_token_provider` turns the `sasl_oauth_*` settings a `client.properties`
gives into the token provider object kafka-python takes, the one Kafka's Java client would use for the same
file: the client-credentials grant, Kafka's unsecured JWS (development only), or Amazon MSK IAM. What each sends:
docs/security.md, section 7.
"""

from __future__ import annotations

import base64
import json
import os
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

from kafka.net.sasl.oauth import AbstractTokenProvider

# The settings (kafka-python-style names, KafkaSettings fields) this module turns into a provider.
OAUTH_SETTINGS = (
    "sasl_oauth_token_endpoint_url",
    "sasl_oauth_client_id",
    "sasl_oauth_client_secret",
    "sasl_oauth_scope",
    "sasl_oauth_unsecured_sub",
    "sasl_oauth_unsecured_lifetime_s",
    "sasl_oauth_aws_msk_iam",
    "sasl_oauth_aws_region",
)
# Kafka's unsecuredLoginLifetimeSeconds default: one hour.
UNSECURED_LIFETIME_S = 3600
# Kafka's sasl.login.refresh.window.factor default: a token is renewed after 80 % of its lifetime.
REFRESH_WINDOW_FACTOR = 0.8
# Kafka's sasl.login.connect.timeout.ms / read.timeout.ms leave it to the JDK; an operator's tool must not hang.
TOKEN_REQUEST_TIMEOUT_S = 10.0


class OAuthError(RuntimeError):
    """No token: the endpoint refused or answered without one, or a provider's package is missing."""


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def unsecured_jws(sub: str, now_s: float, lifetime_s: int) -> str:
    """Kafka's unsecured JWS for principal `sub`: what `OAuthBearerUnsecuredValidatorCallbackHandler` accepts
    (algorithm `none`, an empty signature, `sub` a string, `exp` a number)."""
    header = _b64url(json.dumps({"alg": "none"}).encode())
    issued = int(now_s)
    claims = _b64url(json.dumps({"sub": sub, "iat": issued, "exp": issued + lifetime_s}).encode())
    return f"{header}.{claims}."


class UnsecuredTokenProvider(AbstractTokenProvider):  # type: ignore[misc]  # kafka-python is untyped
    """The unsecured JWS of Kafka's default OAUTHBEARER login, made afresh for every connection."""

    def __init__(self, sub: str, lifetime_s: int = UNSECURED_LIFETIME_S) -> None:
        super().__init__()
        self.sub = sub
        self.lifetime_s = lifetime_s

    def token(self) -> str:
        return unsecured_jws(self.sub, time.time(), self.lifetime_s)


class ClientCredentialsTokenProvider(AbstractTokenProvider):  # type: ignore[misc]
    """The OAuth client-credentials grant against `endpoint`, the token reused until 80 % of its lifetime."""

    def __init__(
        self,
        endpoint: str,
        client_id: str,
        client_secret: str,
        scope: str | None = None,
        *,
        post: Callable[[urllib.request.Request], Mapping[str, Any]] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.endpoint = endpoint
        self.client_id = client_id
        self._client_secret = client_secret
        self.scope = scope
        self._post = post or _post_json
        self._clock = clock
        self._lock = threading.Lock()
        self._token: str | None = None
        self._renew_at = 0.0

    def __repr__(self) -> str:  # kafka-python logs its configuration at DEBUG: never the secret
        return f"ClientCredentialsTokenProvider({self.endpoint!r}, client_id={self.client_id!r})"

    def request(self) -> urllib.request.Request:
        """The token request Kafka's Java client sends (ClientCredentialsRequestFormatter, no URL-encoding of
        the credentials: sasl.oauthbearer.header.urlencode=false)."""
        body = {"grant_type": "client_credentials"}
        if self.scope:
            body["scope"] = self.scope
        basic = base64.b64encode(f"{self.client_id}:{self._client_secret}".encode()).decode()
        return urllib.request.Request(
            self.endpoint,
            data=urllib.parse.urlencode(body).encode(),
            headers={
                "Authorization": f"Basic {basic}",
                "Content-Type": "application/x-www-form-urlencoded",
                "Accept": "application/json",
                "Cache-Control": "no-cache",
            },
            method="POST",
        )

    def token(self) -> str:
        with self._lock:
            now = self._clock()
            if self._token is None or now >= self._renew_at:
                answer = self._post(self.request())
                access = answer.get("access_token")
                if not isinstance(access, str) or not access:
                    raise OAuthError(
                        f"the token endpoint {self.endpoint} answered without an access_token "
                        f"(keys: {', '.join(sorted(answer)) or 'none'})"
                    )
                expires_in = answer.get("expires_in")
                lifetime_s = (
                    float(expires_in) if isinstance(expires_in, int | float) else UNSECURED_LIFETIME_S
                )
                self._token, self._renew_at = access, now + REFRESH_WINDOW_FACTOR * lifetime_s
            return self._token


def _post_json(req: urllib.request.Request) -> Mapping[str, Any]:
    try:
        with urllib.request.urlopen(req, timeout=TOKEN_REQUEST_TIMEOUT_S) as response:
            answer = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        raise OAuthError(
            f"the token endpoint {req.full_url} refused the client credentials: HTTP {exc.code}"
        ) from exc
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise OAuthError(f"the token endpoint {req.full_url} did not answer with JSON: {exc}") from exc
    if not isinstance(answer, dict):
        raise OAuthError(
            f"the token endpoint {req.full_url} answered {type(answer).__name__}, not a JSON object"
        )
    return answer


class MskIamTokenProvider(AbstractTokenProvider):  # type: ignore[misc]
    """Amazon MSK IAM over OAUTHBEARER: a token signed with the process's AWS credentials (default chain)."""

    def __init__(self, region: str) -> None:
        super().__init__()
        try:
            from aws_msk_iam_sasl_signer import MSKAuthTokenProvider
        except ImportError as exc:
            raise OAuthError(
                "Amazon MSK IAM (IAMOAuthBearerLoginCallbackHandler) needs the aws-msk-iam-sasl-signer-python "
                "package: pip install aws-msk-iam-sasl-signer-python"
            ) from exc
        self.region = region
        self._signer = MSKAuthTokenProvider

    def token(self) -> str:
        token, _expiry_ms = self._signer.generate_auth_token(self.region)
        return str(token)


def token_provider(settings: Mapping[str, Any]) -> AbstractTokenProvider:
    """The provider the `sasl_oauth_*` settings describe: MSK IAM, else the client-credentials grant, else unsecured JWS.

    Raises:
        OAuthError: none describes a provider, or client credentials are incomplete.
    """
    endpoint = settings.get("sasl_oauth_token_endpoint_url")
    if settings.get("sasl_oauth_aws_msk_iam"):
        region = settings.get("sasl_oauth_aws_region") or aws_region_from_environment()
        if not region:
            raise OAuthError(
                "Amazon MSK IAM needs the cluster's AWS region: set AWS_REGION (or TXNWATCH_KAFKA__SASL_OAUTH_AWS_REGION)"
            )
        return MskIamTokenProvider(str(region))
    if endpoint:
        client_id, secret = settings.get("sasl_oauth_client_id"), settings.get("sasl_oauth_client_secret")
        if not client_id or not secret:
            raise OAuthError(
                "sasl.oauthbearer.token.endpoint.url needs a client id and secret: set "
                "sasl.oauthbearer.client.credentials.client.id / .client.secret (or clientId / clientSecret "
                "in sasl.jaas.config)"
            )
        scope = settings.get("sasl_oauth_scope")
        return ClientCredentialsTokenProvider(
            str(endpoint), str(client_id), str(secret), scope and str(scope)
        )
    if settings.get("sasl_oauth_unsecured_sub"):
        lifetime = settings.get("sasl_oauth_unsecured_lifetime_s") or UNSECURED_LIFETIME_S
        return UnsecuredTokenProvider(str(settings["sasl_oauth_unsecured_sub"]), int(lifetime))
    raise OAuthError(
        "sasl.mechanism=OAUTHBEARER needs a token source: sasl.oauthbearer.token.endpoint.url with client "
        "credentials, Amazon MSK's IAMOAuthBearerLoginCallbackHandler, or (unsecured brokers only) "
        'sasl.jaas.config=...OAuthBearerLoginModule required unsecuredLoginStringClaim_sub="<principal>";'
    )


def with_token_provider(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """kafka-python kwargs: the `sasl_oauth_*` settings replaced by `sasl_oauth_token_provider` when the
    mechanism is OAUTHBEARER (dropped otherwise: kafka-python rejects keys it does not know).

    Raises:
        OAuthError: see `token_provider`.
    """
    out = {k: v for k, v in kwargs.items() if k not in OAUTH_SETTINGS}
    if kwargs.get("sasl_mechanism") == "OAUTHBEARER" and "sasl_oauth_token_provider" not in kwargs:
        out["sasl_oauth_token_provider"] = token_provider(kwargs)
    return out


def aws_region_from_environment() -> str | None:
    """The region the AWS SDKs use when none is configured: AWS_REGION, then AWS_DEFAULT_REGION."""
    return os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
