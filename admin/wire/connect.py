"""Connecting to Kafka the way Kafka's tools do: the admin client, the producer and the group-less consumer.

Client settings come from `Settings().kafka` (env `TXNWATCH_KAFKA__*`), overlaid by `--command-config
client.properties` and `--bootstrap-server`. A client that cannot be built raises `AdminError` or `WireError`
(admin/wire/errors.py); the other rooms hold the clients as the opaque `AdminClient`, `Producer`, `Consumer`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, TypeAlias

import kafka.errors as Errors
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer

from admin.wire.errors import KIP_664_MESSAGE, AdminError, translating
from common.broker_info import offered_api_keys
from common.settings import KafkaSettings

log = logging.getLogger(__name__)

# The clients as the other rooms name them: handles they hold, close and hand back to the wire, never use.
AdminClient: TypeAlias = KafkaAdminClient
Producer: TypeAlias = KafkaProducer
Consumer: TypeAlias = KafkaConsumer


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
        translating(require_kip_664)(admin)
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


@translating
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


@translating
def consumer_for(kafka: KafkaSettings, **overrides: Any) -> KafkaConsumer:
    """A group-less consumer (assign only) that never commits."""
    defaults: dict[str, Any] = {"enable_auto_commit": False, "group_id": None}
    defaults.update(overrides)
    return KafkaConsumer(**client_kwargs(kafka, KafkaConsumer, defaults))
