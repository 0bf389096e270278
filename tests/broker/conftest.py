"""Fixtures the broker tier shares (the session broker itself is tests/conftest.py's)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kafka import KafkaAdminClient

from admin.wire.kafka_wire import KafkaWire


@pytest.fixture
def wire(bootstrap: str) -> Iterator[KafkaWire]:
    """txnwatch's own kafka-python seam on the session broker, closed after the test."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        yield KafkaWire(admin)
    finally:
        admin.close()
