"""Client settings (--bootstrap-server, --command-config, env) and error translation for operators."""

from __future__ import annotations

import kafka.errors as Errors
import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer

from admin.wire.connect import client_kwargs
from admin.wire.errors import (
    KIP_664_MESSAGE,
    WireError,
    WireTimeout,
    code_name,
    error_name,
    explain,
    kafka_errors_translated,
    missing_acl,
)
from common.settings import KafkaSettings

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("api", "error", "resource", "acl"),
    [
        pytest.param(
            "DescribeProducers", "TOPIC_AUTHORIZATION_FAILED", "orders", "Read on topic orders", id="dp-read"
        ),
        pytest.param(
            "Fetch", "TOPIC_AUTHORIZATION_FAILED", "orders", "Read on topic orders", id="fetch-read"
        ),
        pytest.param(
            "ListOffsets", "TOPIC_AUTHORIZATION_FAILED", "orders", "Describe on topic orders", id="lo"
        ),
        pytest.param(
            "DescribeConfigs", "CLUSTER_AUTHORIZATION_FAILED", "broker 1", "DescribeConfigs on the cluster"
        ),
        pytest.param(
            "DescribeTransactions",
            "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
            "tx-1",
            "Describe on transactional id tx-1",
            id="dt",
        ),
        pytest.param(
            "Produce",
            "TOPIC_AUTHORIZATION_FAILED",
            "txnwatch.producer-state",
            "Write on topic txnwatch.producer-state",
        ),
        pytest.param(
            "Consume",
            "TOPIC_AUTHORIZATION_FAILED",
            "__transaction_state",
            "Read on topic __transaction_state",
            id="txn-log",
        ),
        pytest.param("Fetch", "NOT_LEADER_OR_FOLLOWER", "orders", None, id="not-an-acl-error"),
    ],
)
def test_missing_acl(api: str, error: str, resource: str, acl: str | None) -> None:
    assert missing_acl(api, error, resource) == acl


def test_unmapped_authorization_error_still_says_it_is_an_acl() -> None:
    assert missing_acl("Whatever", "GROUP_AUTHORIZATION_FAILED", "g") == "Group authorization for Whatever"


def test_explain_messages() -> None:
    assert explain("DescribeProducers", "TOPIC_AUTHORIZATION_FAILED", "orders") == (
        "DescribeProducers for orders was denied (TOPIC_AUTHORIZATION_FAILED): grant the ACL Read on topic orders "
        "to txnwatch's principal"
    )
    assert KIP_664_MESSAGE in explain("DescribeProducers", "UNSUPPORTED_VERSION", "broker 1")
    assert "brokers older than 3.0 lack KIP-664's APIs" in KIP_664_MESSAGE
    assert explain("DescribeProducers", "BROKER_UNREACHABLE", "broker 2", "ECONNREFUSED") == (
        "DescribeProducers for broker 2: broker unreachable (ECONNREFUSED)"
    )
    assert explain("Fetch", "CORRUPT_MESSAGE") == "Fetch failed with CORRUPT_MESSAGE"


@pytest.mark.parametrize(
    ("exc", "name"),
    [
        (
            Errors.NotLeaderForPartitionError(),
            "NOT_LEADER_OR_FOLLOWER",
        ),  # kafka-python's old name, Kafka's new
        (Errors.TopicAuthorizationFailedError(), "TOPIC_AUTHORIZATION_FAILED"),
        (Errors.IncompatibleBrokerVersion(), "UNSUPPORTED_VERSION"),
        (Errors.KafkaTimeoutError(), "REQUEST_TIMED_OUT"),
        (Errors.KafkaConnectionError(), "BROKER_UNREACHABLE"),
        (Errors.NodeNotReadyError(3), "BROKER_UNREACHABLE"),
        (Errors.UnknownBrokerIdError(), "UNKNOWN_BROKER"),
        (ValueError("x"), "CLIENT_ERROR"),
    ],
)
def test_error_name(exc: BaseException, name: str) -> None:
    assert error_name(exc) == name


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (Errors.TopicAuthorizationFailedError("orders"), WireError),
        (Errors.KafkaTimeoutError("no answer"), WireTimeout),
        (Errors.KafkaConnectionError(), WireError),
    ],
)
def test_kafka_errors_leave_the_wire_as_its_own_with_the_same_name_and_message(
    exc: Errors.KafkaError, kind: type[WireError]
) -> None:
    with pytest.raises(kind) as raised, kafka_errors_translated():
        raise exc
    assert type(raised.value) is kind and raised.value.__cause__ is exc
    assert (error_name(raised.value), str(raised.value)) == (error_name(exc), str(exc))
    assert explain("Consume", error_name(raised.value), "t") == explain("Consume", error_name(exc), "t")


def test_code_name() -> None:
    assert code_name(0) is None
    assert code_name(6) == "NOT_LEADER_OR_FOLLOWER"
    assert code_name(29) == "TOPIC_AUTHORIZATION_FAILED"


@pytest.mark.parametrize("client", [KafkaAdminClient, KafkaProducer, KafkaConsumer])
def test_client_kwargs_only_keys_the_client_accepts(client: type) -> None:
    kafka = KafkaSettings(ssl_ciphers="ECDHE", extra={"metadata.max.age.ms": "1000", "group.id": "g"})
    kwargs = client_kwargs(kafka, client, {"request_timeout_ms": 5})
    assert set(kwargs) <= set(client.DEFAULT_CONFIG)
    assert kwargs["metadata_max_age_ms"] == 1000 and kwargs["request_timeout_ms"] == 5
    assert ("group_id" in kwargs) == (client is KafkaConsumer)
