"""The collector's settings (`TXNWATCH_COLLECTOR__*`), kept beside the shared `Settings` until it grows a
`collector` section; the CLI flags of `txnwatch collect` override them.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from detectors.models import Model

CleanupPolicy = Literal["compact", "delete", "compact,delete"]
CoordinatorSource = Literal["log", "describe"]

# DescribeProducers requests carry at most this many partitions (TransactionsCommand's MAX_BATCH_SIZE).
MAX_DESCRIBE_BATCH = 500


class OutputTopicSettings(Model):
    """How the collector creates one of its output topics when it is missing (an existing topic is left alone)."""

    partitions: int = Field(default=6, ge=1)
    # None: min(3, number of brokers).
    replication_factor: int | None = Field(default=None, ge=1)
    # None: the broker's default retention.
    retention_ms: int | None = Field(default=None, ge=-1)
    cleanup_policy: CleanupPolicy = "compact,delete"

    def topic_configs(self) -> dict[str, str]:
        configs: dict[str, str] = {"cleanup.policy": self.cleanup_policy}
        if self.retention_ms is not None:
            configs["retention.ms"] = str(self.retention_ms)
        return configs


class CollectorSettings(Model):
    """`txnwatch collect`: sweep cadence, request sizing, retries, output topics, coordinator fallback."""

    interval_s: float = Field(default=10.0, gt=0)
    describe_batch_size: int = Field(default=MAX_DESCRIBE_BATCH, ge=1, le=MAX_DESCRIBE_BATCH)
    # kafka-python pauses a connection at 5 requests in flight; keep room for metadata and fetches.
    max_in_flight_per_broker: int = Field(default=3, ge=1, le=4)
    request_timeout_ms: int = Field(default=15_000, ge=100)
    # Extra DescribeProducers rounds within one sweep for partitions whose leader moved.
    retries_per_sweep: int = Field(default=2, ge=0)
    retry_backoff_ms: int = Field(default=200, ge=0)
    config_refresh_s: float = Field(default=600.0, gt=0)
    broker_backoff_initial_s: float = Field(default=1.0, gt=0)
    broker_backoff_max_s: float = Field(default=60.0, gt=0)
    # Fetch rounds per broker per sweep for start batches that did not fit a response.
    start_batch_fetch_rounds: int = Field(default=10, ge=1)
    fetch_partition_max_bytes: int = Field(default=1 << 20, ge=1024)
    fetch_max_bytes: int = Field(default=16 << 20, ge=1024)
    # How long start-up may spend reading the snapshot topic back to learn which partitions were open.
    restore_timeout_s: float = Field(default=30.0, ge=0)
    metrics_port: int = Field(default=9464, ge=0, le=65535)  # 0: no endpoint
    metrics_addr: str = "0.0.0.0"
    coordinator_source: CoordinatorSource = "log"
    # describe mode: re-describe active transactions running longer than this each poll (ListTransactions v1
    # DurationFilter); 0 re-describes every active transaction. New and changed ones are always described.
    coordinator_duration_filter_ms: int = Field(default=0, ge=0)
    producer_state_topic: OutputTopicSettings = Field(
        default_factory=lambda: OutputTopicSettings(cleanup_policy="compact,delete", retention_ms=86_400_000)
    )
    coordinator_state_topic: OutputTopicSettings = Field(
        default_factory=lambda: OutputTopicSettings(cleanup_policy="compact")
    )


class CollectorEnvironment(BaseSettings):
    """Reads `TXNWATCH_COLLECTOR__INTERVAL_S`, `TXNWATCH_COLLECTOR__PRODUCER_STATE_TOPIC__PARTITIONS`, ..."""

    model_config = SettingsConfigDict(
        env_prefix="TXNWATCH_", env_nested_delimiter="__", frozen=True, extra="ignore"
    )

    collector: CollectorSettings = Field(default_factory=CollectorSettings)
