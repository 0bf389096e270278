"""What the brokers are (how many, which APIs the bootstrap broker offers), asked in ways that work on every
Apache Kafka release txnwatch supports (docs/compatibility.md).

kafka-python 3.0.12 gets two of these wrong on some releases, found by the compatibility matrix
(tests/compat/test_matrix.py):
- `KafkaAdminClient.describe_cluster()` removes DescribeCluster v1's `endpoint_type` (KIP-919, Kafka 3.7) from every
  answer, so against a 3.5 or 3.6 broker, which answers v0, it raises KeyError('endpoint_type'). The brokers of a
  Metadata answer (which `list_topics` has just refreshed) say the same.
- `KafkaAdminClient.api_versions()` turns every offered API key into its `ApiKey` enum, which ends at 92: Kafka
  4.4 offers key 93 (StreamsGroupTopologyDescriptionUpdate), and the call raises ValueError. The negotiated
  versions themselves are plain integers.
Both fall back to kafka-python's connection manager (`admin._manager`, private; kafka-python is pinned to its
minor in pyproject.toml for this and admin/wire/kafka_wire.py).
"""

from __future__ import annotations

from typing import Any


def broker_count(admin: Any) -> int:
    """How many brokers the cluster has (DescribeCluster, else the brokers of the client's Metadata)."""
    try:
        return len(admin.describe_cluster()["brokers"])
    except KeyError:  # DescribeCluster v0 (Kafka before 3.7): kafka-python's parser wants v1's endpoint_type
        return len(admin._manager.cluster.brokers())


def offered_api_keys(admin: Any) -> set[int] | None:
    """The API keys the bootstrap broker offers, or None while no versions were negotiated yet."""
    data = getattr(admin._manager, "broker_version_data", None)
    versions = getattr(data, "api_versions", None)
    if versions is None:
        return None
    return {int(key) for key in versions}
