"""txnwatch's own topics, named and specified once: their names (`TopicSettings`, one prefix; the collector's output
topics are settings, the job's are fixed) and how each is created when missing. An existing topic is left as it
is. Kafka's `__transaction_state` is the wire contract's: `detectors.contract.TRANSACTION_LOG_TOPIC`.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

from pydantic import Field, computed_field

from detectors.models import Model

CleanupPolicy = Literal["compact", "delete", "compact,delete"]


class TopicSettings(Model):
    """txnwatch's own topics, all named from one prefix."""

    prefix: str = Field(default="txnwatch", min_length=1)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def producer_state(self) -> str:
        return f"{self.prefix}.producer-state"

    @computed_field  # type: ignore[prop-decorator]
    @property
    def coordinator_state(self) -> str:
        return f"{self.prefix}.coordinator-state"

    @computed_field  # type: ignore[prop-decorator]
    @property
    def abort_candidates(self) -> str:
        return f"{self.prefix}.abort-candidates"

    @computed_field  # type: ignore[prop-decorator]
    @property
    def audit(self) -> str:
        return f"{self.prefix}.audit"

    @computed_field  # type: ignore[prop-decorator]
    @property
    def dead_letter(self) -> str:
        return f"{self.prefix}.dead-letter"


# ------------------------------------------------------------------------------- the collector's output topics


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


# Each output topic's own defaults live on its class, so that setting one field of it (for example
# TXNWATCH_COLLECTOR__PRODUCER_STATE_TOPIC__PARTITIONS) keeps the others: a default_factory instance would be
# replaced by a plain OutputTopicSettings built from that one field.
class ProducerStateTopicSettings(OutputTopicSettings):
    """<prefix>.producer-state: compacted, and a day's retention."""

    retention_ms: int | None = Field(default=86_400_000, ge=-1)


class CoordinatorStateTopicSettings(OutputTopicSettings):
    """<prefix>.coordinator-state (describe fallback): compacted, the broker's retention."""

    cleanup_policy: CleanupPolicy = "compact"


# ---------------------------------------------------------------------------- the streaming job's output topics


class TopicSpec(NamedTuple):
    """A topic as txnwatch creates it when it is missing (an existing topic is left as it is)."""

    name: str
    partitions: int
    configs: tuple[tuple[str, str], ...]  # topic configs, (name, value)


DEAD_LETTER_RETENTION_MS = 14 * 24 * 3_600_000


def abort_candidates_topic(topics: TopicSettings) -> TopicSpec:
    """Abort candidates, compacted on the candidate id: a consumer sees the latest record of each candidate."""
    return TopicSpec(topics.abort_candidates, 1, (("cleanup.policy", "compact"),))


def dead_letter_topic(topics: TopicSettings) -> TopicSpec:
    """Malformed input with its raw bytes, kept 14 days for a person to look at."""
    return TopicSpec(topics.dead_letter, 1, (("retention.ms", str(DEAD_LETTER_RETENTION_MS)),))


def audit_topic(topics: TopicSettings) -> TopicSpec:
    """The audit trail: every abort attempt (`txnwatch proposals abort`) and every candidate the job withdrew,
    deleted by the broker's retention like any log (as `proposals abort` creates it)."""
    return TopicSpec(topics.audit, 1, (("cleanup.policy", "delete"),))


def stream_output_topics(topics: TopicSettings) -> tuple[TopicSpec, ...]:
    """The topics the streaming job writes (and creates when missing)."""
    return (abort_candidates_topic(topics), dead_letter_topic(topics), audit_topic(topics))


def replication_factor(brokers: int) -> int:
    """Replicas of a topic txnwatch creates: three where the cluster has them, else every broker."""
    return min(3, max(brokers, 1))
