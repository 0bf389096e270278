"""Reading the snapshot topic's recent tail back at start-up: the sightings a restart would otherwise lose.

When the collector first saw each open transaction (admin/collect/sighting.py) lives in its memory, and every snapshot it
publishes carries it (`opened_after_ms`, `seen_open_ms`). A partition with open transactions is published every
sweep, so its newest snapshot is among the last records of the topic: the tail (`RECENT_RECORDS` per partition,
at most `RESTORE_SIGHTINGS_MAX_S`) gives the next run the same first sightings, and the proofs, the proving
re-describes and the duration metric that rest on them survive the restart. What cannot be read is not fatal:
the run then sees those transactions anew, as before.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from pydantic import ValidationError

from admin.collect.sighting import Sightings
from admin.wire.connect import Consumer
from admin.wire.errors import WireError, error_name, explain
from admin.wire.records import TopicRead
from detectors.contract import SNAPSHOT_TYPE, TYPE_HEADER
from detectors.models import PartitionSnapshot

log = logging.getLogger(__name__)

# Per partition of the snapshot topic: a few sweeps' records even with 10,000 partitions open (6 partitions).
RECENT_RECORDS = 5_000
# Start-up has already read the whole topic back for the open partitions (`restore_timeout_s`): the tail is
# quick, and a broker too slow for it should not hold the first sweep much longer.
RESTORE_SIGHTINGS_MAX_S = 10.0


def restore_sightings(consumer: Consumer, topic: str, *, cluster: str, timeout_s: float) -> Sightings:
    """The sightings `cluster`'s recent snapshots on `topic` left (`Sightings.from_snapshots`); none if the topic
    is missing, empty or unreadable. Reads for at most `timeout_s` (capped at `RESTORE_SIGHTINGS_MAX_S`)."""
    budget = min(timeout_s, RESTORE_SIGHTINGS_MAX_S)
    sightings = Sightings.from_snapshots(recent_snapshots(consumer, topic, timeout_s=budget), cluster)
    if sightings:
        log.info("restored the first sightings of %d open transactions from %s", len(sightings), topic)
    return sightings


def recent_snapshots(
    consumer: Consumer, topic: str, *, timeout_s: float, records: int = RECENT_RECORDS
) -> Iterator[PartitionSnapshot]:
    """The snapshots among the last `records` records of each partition of `topic`, in each partition's order.

    Logs once and ends early (never raises a Kafka error) if the topic is missing, unreadable or slower than
    `timeout_s`; what was read by then is yielded."""
    read = TopicRead(consumer, topic, timeout_s=timeout_s, last=records)
    try:
        for r in read:
            snap = _snapshot(r.headers, r.value)
            if snap is not None:
                yield snap
    except WireError as exc:
        log.warning(
            "%s; open transactions are seen anew (no sightings restored)",
            explain("Consume", error_name(exc), topic, str(exc)),
        )
        return
    if read.missing:
        log.info("%s does not exist yet: no sightings to restore", topic)
    elif not read.complete:
        log.warning(
            "reading the last records of %s took longer than %.0fs; sightings restored from what was read",
            topic,
            timeout_s,
        )


def _snapshot(headers: list[tuple[str, bytes]] | None, value: bytes | None) -> PartitionSnapshot | None:
    # A record without the header counts as a snapshot, as the open-partitions read-back counts it (admin/collect/publish.py).
    kind = next((v for k, v in headers or () if k == TYPE_HEADER), None)
    if value is None or (kind is not None and kind != SNAPSHOT_TYPE.encode()):
        return None
    try:
        return PartitionSnapshot.model_validate_json(value)
    except ValidationError:
        return None
