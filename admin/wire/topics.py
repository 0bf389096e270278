"""Creating txnwatch's output topics (CreateTopics) where they do not exist yet, and waiting for their leaders."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence

import kafka.errors as Errors
from kafka.admin import NewTopic

from admin.wire.connect import AdminClient
from admin.wire.errors import AdminError, error_name, explain, translating
from common.broker_info import broker_count
from common.topics import OutputTopicSettings, replication_factor

log = logging.getLogger(__name__)


@translating
def ensure_topics(
    admin: AdminClient, wanted: Mapping[str, OutputTopicSettings], *, timeout_s: float = 30.0
) -> list[str]:
    """Create the topics that do not exist yet (existing ones are left as they are).

    Returns:
        The names created.

    Raises:
        AdminError: creation denied (names the ACL) or failed.
        WireError: the topics could not be listed or described.
    """
    existing = set(admin.list_topics())
    missing = [name for name in wanted if name not in existing]
    if not missing:
        return []
    brokers = broker_count(admin)
    new = [
        NewTopic(
            name,
            wanted[name].partitions,
            wanted[name].replication_factor or replication_factor(brokers),
            topic_configs=wanted[name].topic_configs(),
        )
        for name in missing
    ]
    created: list[str] = []
    for topic in new:
        try:
            admin.create_topics([topic])
            created.append(topic.name)
        except Errors.TopicAlreadyExistsError:
            continue  # created meanwhile by another collector
        except Errors.KafkaError as exc:
            raise AdminError(explain("CreateTopics", error_name(exc), topic.name, str(exc))) from exc
    _wait_for_leaders(admin, created, timeout_s)
    for name in created:
        log.info("created topic %s (%s)", name, wanted[name].topic_configs())
    return created


def _wait_for_leaders(admin: AdminClient, topics: Sequence[str], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while topics and time.monotonic() < deadline:
        described = admin.describe_topics(list(topics))
        if len(described) == len(topics) and all(
            p["leader_id"] is not None and p["leader_id"] >= 0 for t in described for p in t["partitions"]
        ):
            return
        time.sleep(0.2)
