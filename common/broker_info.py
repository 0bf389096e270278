"""What the brokers are (how many, which API keys the bootstrap broker offers), asked in ways that work on every
Apache Kafka release txnwatch supports: kafka-python 3.0.12's `describe_cluster()` fails on 3.5 and 3.6 and its
`api_versions()` on 4.4, so both fall back to its private connection manager (`admin._manager`; the pin in
pyproject.toml says why). The two failures: docs/compatibility.md, "Findings".
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
