"""Kafka's errors in operator terms: a stable name for each, the ACL an authorization failure asks for, and
`WireError`, which every kafka-python error becomes at the wire, so no other room catches kafka-python's own."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import wraps
from typing import ParamSpec, TypeVar

import kafka.errors as Errors

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
    if isinstance(exc, WireError):
        return exc.name
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


class WireError(Exception):
    """A kafka-python error translated at the wire: `name` is its stable name (`error_name`), str() its message."""

    def __init__(self, message: str, name: str = "CLIENT_ERROR") -> None:
        super().__init__(message)
        self.name = name


class WireTimeout(WireError):
    """kafka-python gave up waiting (KafkaTimeoutError): no answer, no acknowledgement or no bootstrap in time."""

    def __init__(self, message: str, name: str = "REQUEST_TIMED_OUT") -> None:
        super().__init__(message, name)


def translated(exc: Errors.KafkaError) -> WireError:
    """`exc` as the wire's own error, with the same message and name."""
    kind = WireTimeout if isinstance(exc, Errors.KafkaTimeoutError) else WireError
    return kind(str(exc), error_name(exc))


@contextmanager
def kafka_errors_translated() -> Iterator[None]:
    """Raises every kafka-python error inside as a `WireError` (the original as its cause)."""
    try:
        yield
    except Errors.KafkaError as exc:
        raise translated(exc) from exc


_P = ParamSpec("_P")
_R = TypeVar("_R")


def translating(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """`fn`, raising `WireError` where kafka-python raised."""

    @wraps(fn)
    def call(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        with kafka_errors_translated():
            return fn(*args, **kwargs)

    return call
