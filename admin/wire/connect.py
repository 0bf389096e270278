"""Connecting to Kafka the way Kafka's tools do, and saying what went wrong in operator terms.

Client settings come from `Settings().kafka` (env `TXNWATCH_KAFKA__*`), overlaid by `--command-config
client.properties` and `--bootstrap-server`. Errors are translated here: an authorization failure names the ACL to
grant, an unsupported API names the Kafka version that has it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import kafka.errors as Errors
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer

from common.broker_info import offered_api_keys
from common.settings import KafkaSettings

log = logging.getLogger(__name__)

KIP_664_MESSAGE = (
    "brokers older than 3.0 lack KIP-664's APIs (DescribeProducers, ListTransactions, DescribeTransactions); "
    "txnwatch needs Apache Kafka 3.0 or newer on every broker"
)
DURATION_FILTER_MESSAGE = "ListTransactions' DurationFilter needs brokers on Kafka 3.8 or newer (KIP-994)"

# (API, Kafka error) → the ACL that is missing. `{resource}` is the topic, transactional id, ... concerned.
_MISSING_ACLS: dict[tuple[str, str], str] = {
    ("Metadata", "TOPIC_AUTHORIZATION_FAILED"): "Describe on topic {resource}",
    ("DescribeProducers", "TOPIC_AUTHORIZATION_FAILED"): "Read on topic {resource}",
    ("Fetch", "TOPIC_AUTHORIZATION_FAILED"): "Read on topic {resource}",
    ("ListOffsets", "TOPIC_AUTHORIZATION_FAILED"): "Describe on topic {resource}",
    ("DescribeConfigs", "CLUSTER_AUTHORIZATION_FAILED"): "DescribeConfigs on the cluster",
    ("ListTransactions", "CLUSTER_AUTHORIZATION_FAILED"): "Describe on transactional ids (none are listed)",
    (
        "DescribeTransactions",
        "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
    ): "Describe on transactional id {resource}",
    (
        "DescribeTransactions",
        "TOPIC_AUTHORIZATION_FAILED",
    ): "Describe on the topics of transaction {resource}",
    ("Produce", "TOPIC_AUTHORIZATION_FAILED"): "Write on topic {resource}",
    ("Produce", "CLUSTER_AUTHORIZATION_FAILED"): "IdempotentWrite on the cluster (brokers before 2.8)",
    ("InitProducerId", "CLUSTER_AUTHORIZATION_FAILED"): "IdempotentWrite on the cluster (brokers before 2.8)",
    ("CreateTopics", "TOPIC_AUTHORIZATION_FAILED"): "Create on topic {resource} (or create it beforehand)",
    (
        "CreateTopics",
        "CLUSTER_AUTHORIZATION_FAILED",
    ): "Create on the cluster (or create {resource} beforehand)",
    ("Consume", "TOPIC_AUTHORIZATION_FAILED"): "Read on topic {resource}",
    ("Consume", "GROUP_AUTHORIZATION_FAILED"): "Read on the consumer group",
}
_AUTH_ERRORS = {
    "TOPIC_AUTHORIZATION_FAILED",
    "GROUP_AUTHORIZATION_FAILED",
    "CLUSTER_AUTHORIZATION_FAILED",
    "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
    "DELEGATION_TOKEN_AUTHORIZATION_FAILED",
}


class AdminError(Exception):
    """A failure an operator must act on; the message already says what to do."""


# kafka-python still uses names Kafka has since changed.
_RENAMED = {"NOT_LEADER_FOR_PARTITION": "NOT_LEADER_OR_FOLLOWER"}


def error_name(exc: BaseException) -> str:
    """A stable name for an error: Kafka's own (NOT_LEADER_OR_FOLLOWER, ...) or a client-side one."""
    if isinstance(exc, Errors.IncompatibleBrokerVersion | Errors.UnrecognizedBrokerVersion):
        return "UNSUPPORTED_VERSION"
    if isinstance(exc, Errors.BrokerResponseError) and exc.message:
        return _RENAMED.get(str(exc.message), str(exc.message))
    if isinstance(exc, Errors.KafkaTimeoutError):
        return "REQUEST_TIMED_OUT"
    if isinstance(exc, Errors.KafkaConnectionError | Errors.NodeNotReadyError):
        return "BROKER_UNREACHABLE"
    if isinstance(exc, Errors.UnknownBrokerIdError):
        return "UNKNOWN_BROKER"
    if isinstance(exc, Errors.KafkaError):
        return type(exc).__name__
    return "CLIENT_ERROR"


def code_name(error_code: int) -> str | None:
    """Kafka's name for a wire error code, None for 0."""
    if error_code == 0:
        return None
    name = str(Errors.for_code(error_code).message or f"ERROR_{error_code}")
    return _RENAMED.get(name, name)


def is_authorization_error(name: str) -> bool:
    return name in _AUTH_ERRORS


def missing_acl(api: str, error: str, resource: str | None = None) -> str | None:
    """The ACL whose absence makes `api` fail with `error`, e.g. "Read on topic orders"; None if not an ACL error."""
    template = _MISSING_ACLS.get((api, error))
    if template is None:
        if error not in _AUTH_ERRORS:
            return None
        template = f"{error.replace('_AUTHORIZATION_FAILED', '').title()} authorization for {api}"
    return template.format(resource=resource if resource is not None else "(unknown)")


def explain(api: str, error: str, resource: str | None = None, detail: str | None = None) -> str:
    """One line for operators: what failed, and what to do if the cause is known."""
    where = f" for {resource}" if resource else ""
    acl = missing_acl(api, error, resource)
    if acl is not None:
        return f"{api}{where} was denied ({error}): grant the ACL {acl} to txnwatch's principal"
    if error == "UNSUPPORTED_VERSION":
        return f"{api}{where} is not supported by the broker: {KIP_664_MESSAGE}"
    if error == "BROKER_UNREACHABLE":
        return f"{api}{where}: broker unreachable ({detail or 'connection failed'})"
    suffix = f": {detail}" if detail else ""
    return f"{api}{where} failed with {error}{suffix}"


def client_kwargs(
    kafka: KafkaSettings, client: type[Any], overrides: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """kafka-python kwargs for `client` (KafkaAdminClient, KafkaProducer, KafkaConsumer): keys the class does
    not know are dropped with a warning, since kafka-python rejects them."""
    kwargs: dict[str, Any] = dict(kafka.client_kwargs())
    kwargs.update(overrides or {})
    known = set(client.DEFAULT_CONFIG)
    dropped = sorted(k for k in kwargs if k not in known)
    if dropped:
        log.debug("%s does not take %s; left out", client.__name__, ", ".join(dropped))
    return {k: v for k, v in kwargs.items() if k in known}


def connect_admin(
    kafka: KafkaSettings, *, request_timeout_ms: int = 15_000, bootstrap_timeout_ms: int | None = None
) -> KafkaAdminClient:
    """A bootstrapped KafkaAdminClient; every broker must offer DescribeProducers (KIP-664).

    Args:
        kafka: the client settings.
        request_timeout_ms: each request's timeout.
        bootstrap_timeout_ms: how long to try the bootstrap servers (a command's `--timeout-ms`); None: the
            request timeout, at least 10 s (kafka-python's own default is 30 s).

    Raises:
        AdminError: unreachable bootstrap servers, authentication failure, or brokers without KIP-664.
    """
    bootstrap_ms = max(request_timeout_ms, 10_000) if bootstrap_timeout_ms is None else bootstrap_timeout_ms
    kwargs = client_kwargs(
        kafka,
        KafkaAdminClient,
        {"request_timeout_ms": request_timeout_ms, "bootstrap_timeout_ms": bootstrap_ms},
    )
    try:
        admin = KafkaAdminClient(**kwargs)
    except Errors.KafkaTimeoutError as exc:
        raise AdminError(f"cannot reach the bootstrap servers {kafka.bootstrap_servers}: {exc}") from exc
    except (Errors.SaslAuthenticationFailedError, Errors.AuthorizationError) as exc:
        raise AdminError(
            f"authentication to {kafka.bootstrap_servers} failed: {exc} (check sasl.* / ssl.* in "
            "--command-config)"
        ) from exc
    except Errors.KafkaError as exc:
        raise AdminError(f"cannot connect to {kafka.bootstrap_servers}: {exc}") from exc
    try:
        require_kip_664(admin)
    except AdminError:
        admin.close()
        raise
    return admin


def require_kip_664(admin: KafkaAdminClient) -> None:
    """Raises AdminError unless the bootstrap broker offers DescribeProducers (Kafka 2.8+; admin use 3.0+)."""
    from kafka.protocol.admin.transactions import DescribeProducersRequest

    # Not admin.api_versions(): it fails on Kafka 4.4 (common/broker_info.py).
    offered = offered_api_keys(admin)
    if offered is None:  # no versions negotiated yet: the first request will say
        return
    if DescribeProducersRequest.API_KEY not in offered:
        raise AdminError(KIP_664_MESSAGE)


def producer_for(kafka: KafkaSettings, **overrides: Any) -> KafkaProducer:
    """The collector's producer: idempotent, acks=all."""
    defaults: dict[str, Any] = {
        "acks": "all",
        "enable_idempotence": True,
        "linger_ms": 20,
        "compression_type": None,
    }
    defaults.update(overrides)
    return KafkaProducer(**client_kwargs(kafka, KafkaProducer, defaults))


def consumer_for(kafka: KafkaSettings, **overrides: Any) -> KafkaConsumer:
    """A group-less consumer (assign only) that never commits."""
    defaults: dict[str, Any] = {"enable_auto_commit": False, "group_id": None}
    defaults.update(overrides)
    return KafkaConsumer(**client_kwargs(kafka, KafkaConsumer, defaults))
