"""The cluster itself: Metadata (brokers, leaders and their epochs), a broker's `transaction.max.timeout.ms`
(DescribeConfigs) and the ApiVersions its connection negotiated."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kafka.protocol.admin import DescribeConfigsRequest
from kafka.protocol.metadata import MetadataRequest

from admin.wire.errors import code_name
from admin.wire.requests import RequestLog
from admin.wire.types import TP, BrokerTimeout, ClusterView
from admin.wire.versions import BrokerApis

BROKER_RESOURCE = 4  # ConfigResourceType.BROKER
MAX_TIMEOUT_CONFIG = "transaction.max.timeout.ms"


def metadata_request(topics: Sequence[str] | None) -> Any:
    """Metadata for `topics` (None: every topic the principal may Describe), never creating one."""
    wanted = None if topics is None else [MetadataRequest.MetadataRequestTopic(name=t) for t in topics]
    return MetadataRequest(topics=wanted, allow_auto_topic_creation=False)


def parse_metadata(response: Any, requests: RequestLog) -> ClusterView:
    """Brokers, leaders and leader epochs; a topic's error other than "deleted meanwhile" is counted."""
    brokers = {b.node_id: f"{b.host}:{b.port}" for b in response.brokers}
    leaders: dict[TP, int] = {}
    epochs: dict[TP, int] = {}
    internal: set[str] = set()
    for topic in response.topics:
        if topic.error_code != 0 or topic.name is None:
            if topic.error_code not in (0, 3):  # UNKNOWN_TOPIC_OR_PARTITION: deleted meanwhile
                requests.record_partition_error("Metadata", code_name(topic.error_code) or "?")
            continue
        if topic.is_internal:
            internal.add(topic.name)
        for p in topic.partitions:
            leaders[(topic.name, p.partition_index)] = p.leader_id if p.leader_id is not None else -1
            epoch = getattr(p, "leader_epoch", None)  # Metadata v7+; -1 when the broker did not say
            if epoch is not None and epoch >= 0:
                epochs[(topic.name, p.partition_index)] = epoch
    return ClusterView(
        brokers=brokers, leaders=leaders, internal_topics=frozenset(internal), leader_epochs=epochs
    )


def describe_denied(response: Any, topic: str) -> bool:
    """The Metadata answer for `topic` says TOPIC_AUTHORIZATION_FAILED."""
    return any(
        t.name == topic and code_name(t.error_code) == "TOPIC_AUTHORIZATION_FAILED" for t in response.topics
    )


def max_timeout_request(broker: int) -> Any:
    """DescribeConfigs of `broker`'s `transaction.max.timeout.ms` only."""
    resource = DescribeConfigsRequest.DescribeConfigsResource
    return DescribeConfigsRequest(
        resources=[
            resource(
                resource_type=BROKER_RESOURCE,
                resource_name=str(broker),
                configuration_keys=[MAX_TIMEOUT_CONFIG],
            )
        ],
        include_synonyms=False,
    )


def parse_max_timeout(response: Any, requests: RequestLog) -> BrokerTimeout:
    """The configured value, or why it is unknown (a resource's error is counted in `requests`)."""
    for result in response.results:
        error = code_name(result.error_code)
        if error is not None:
            requests.record_partition_error("DescribeConfigs", error)
            return BrokerTimeout(None, error)
        for config in result.configs:
            if config.name == MAX_TIMEOUT_CONFIG and config.value is not None:
                try:
                    return BrokerTimeout(int(config.value))
                except ValueError:
                    return BrokerTimeout(None, "INVALID_CONFIG_VALUE")
    return BrokerTimeout(None, "CONFIG_NOT_RETURNED")


def negotiated_apis(connection: Any) -> BrokerApis:
    """The ApiVersions a connected kafka-python connection negotiated; empty when it has none."""
    data = connection.broker_version_data
    return {} if data is None or data.api_versions is None else dict(data.api_versions)
