"""The reconcile, windows and dead-letter queries' driver-side ends (foreachBatch bodies) and the console.

Events reach the metrics' live state, abort candidates the compacted candidates topic, malformed input the
dead-letter topic (with where it came from in headers, `detectors.contract.DEAD_LETTER_HEADERS`); people get
the verdicts that need them and whether the coordinator view is current, scripts (`--output json`) every change.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any, Literal, NamedTuple, TextIO

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from common.topics import TopicSettings
from detectors.contract import DEAD_LETTER_HEADERS
from detectors.models import AbortCandidate
from detectors.tracking import EVENT_COLUMNS, withdrawal_audit
from streaming.exporter import Health, LiveState

log = logging.getLogger("txnwatch.stream")

# The dead-letter rows' columns carried in DEAD_LETTER_HEADERS, in that order (sources.DEAD_LETTER_SCHEMA).
# The events that carry an abort candidate's new state to `<prefix>.abort-candidates` (compacted on its id).
CANDIDATE_EVENTS = ("OPENED", "RESOLVED", "WITHDRAWN")
_DEAD_LETTER_COLUMNS = ("source", "source_topic", "source_partition", "source_offset", "error")


def _header(name: str, column: str) -> Column:
    """A Kafka record header (name, the column's value as text) for Spark's Kafka sink."""
    return F.struct(F.lit(name).alias("key"), F.col(column).cast("string").cast("binary").alias("value"))


class EventRow(NamedTuple):
    """One EVENT_SCHEMA row on the driver (what the sinks read; attribute access like a Spark Row)."""

    event: str
    producer_id: int
    topic: str
    partition: int
    leader: int | None
    start_offset: int
    kind: str | None
    reason: str | None
    age_ms: int | None
    lso_lag: int | None
    explanation: str | None
    candidate_id: str | None
    payload: str | None
    event_time_ms: int
    withheld: str | None
    two_phase_commit: bool | None
    transactional_id: str | None


def collect_events(df: DataFrame) -> list[EventRow]:
    """The batch's events on the driver, through Arrow: one row per verdict changed (every open transaction at
    the first batches of a run), tens of thousands when catching up, where `collect()` (a Row object per row
    through pickle) took seconds."""
    table = df.toArrow()
    columns = [table.column(name).to_pylist() for name in EVENT_COLUMNS]
    return [EventRow(*values) for values in zip(*columns, strict=True)]


def _payload(r: EventRow) -> Any:
    """The JSON every OPENED, RESOLVED, WITHDRAWN and VIEW event carries."""
    if r.payload is None:
        raise ValueError(f"{r.event} event without a payload")
    return json.loads(r.payload)


def verified_path(candidate: AbortCandidate) -> str:
    """The console's next steps for a new candidate, each through txnwatch's verification: `proposals show` (the
    evidence, asked again live), then the candidate's own marker (`proposals commit` for a lost commit, else
    `proposals abort`), a dry run that verifies again until `--execute`. Never Kafka's
    `kafka-transactions.sh abort` line: it re-checks nothing, and this is printed before anyone verified, so it
    would write the marker where verification refuses it now (the coordinator owns the transaction, or its owner
    is live at that epoch); `proposals show` offers Kafka's line only while it says SAFE."""
    marker = "commit" if candidate.spec.transaction_result == "COMMIT" else "abort"
    return (
        f"          {'show:':<8}txnwatch proposals show {candidate.candidate_id}\n"
        f"          {marker + ':':<8}txnwatch proposals {marker} {candidate.candidate_id}"
        "   (verifies again; writes only with --execute)"
    )


def format_event(r: EventRow) -> str:
    where = f"{r.topic}-{r.partition} producer {r.producer_id} start offset {r.start_offset}"
    if r.event == "OPENED":
        act = verified_path(AbortCandidate.model_validate(_payload(r)))
        return f"HANGING   {where}: {r.explanation}\n{act}\n          candidate {r.candidate_id}"
    if r.event == "RESOLVED":
        return f"RESOLVED  {where}: no longer open (candidate {r.candidate_id})"
    if r.event == "WITHDRAWN":
        return f"WITHDRAWN {where}: no longer proven, do not abort on it: {r.explanation} (candidate {r.candidate_id})"
    # Only news is explained, and not plain OPEN: a verdict unchanged since before a restart comes without one.
    return f"{r.kind:<9} {where}" + (f": {r.explanation}" if r.explanation else "")


Output = Literal["table", "json"]

# How long the driver waits for the brokers to acknowledge what it writes itself (candidates, withdrawals): past
# it the batch fails and runs again, as a failed Spark write would fail it.
DRIVER_WRITE_TIMEOUT_S = 60.0


def _utf8(text: str | None) -> bytes | None:
    return None if text is None else text.encode()


class DriverProducer:
    """The few records the driver writes itself, with a kafka-python producer at the delivery guarantee of Spark's
    Kafka sink (acks=all, idempotent), made at the first write and kept for the job's life.

    Why not Spark's sink: a candidate was a DataFrame built in the driver and a Spark job of its own inside the
    detection batch (tasks, a producer on an executor), the slowest way to write one small record, and always
    on the path from a proof to the candidate. `send` returns once every record is acknowledged, in order, or
    raises."""

    def __init__(
        self, client_kwargs: Mapping[str, Any], *, timeout_s: float = DRIVER_WRITE_TIMEOUT_S
    ) -> None:
        self._kwargs = dict(client_kwargs)
        self._timeout_s = timeout_s
        self._producer: Any = None

    def send(self, topic: str, records: Sequence[tuple[str | None, str | None]]) -> None:
        """(key, value) pairs as UTF-8, None as Kafka's null, as Spark's sink writes string columns."""
        from kafka import KafkaProducer  # imported here: the windows and tests never write

        if self._producer is None:
            known = {k: v for k, v in self._kwargs.items() if k in KafkaProducer.DEFAULT_CONFIG}
            self._producer = KafkaProducer(**{**known, "acks": "all", "enable_idempotence": True})
        deadline = time.monotonic() + self._timeout_s
        futures = [self._producer.send(topic, key=_utf8(k), value=_utf8(v)) for k, v in records]
        self._producer.flush(timeout=max(0.0, deadline - time.monotonic()))
        for future in futures:
            future.get(timeout=max(0.0, deadline - time.monotonic()))  # raises the broker's error

    def close(self) -> None:
        if self._producer is not None:
            self._producer.close(timeout=10)
            self._producer = None


class Sinks:
    """The driver-side ends of the queries (foreachBatch bodies).

    Args:
        kafka_options: Spark's Kafka sink options (`kafka.`-prefixed client properties), for the dead letters.
        topics: where candidates and dead letters go.
        writer: writes candidates and withdrawals from the driver.
        output: the console view; `out` None prints nothing.
    """

    def __init__(
        self,
        spark: SparkSession,
        live: LiveState,
        health: Health,
        out: TextIO | None,
        *,
        kafka_options: Mapping[str, str],
        topics: TopicSettings,
        writer: DriverProducer,
        output: Output = "table",
    ) -> None:
        self.spark = spark
        self.kafka_options = dict(kafka_options)
        self.writer = writer
        self.topics = topics
        self.output = output
        self.live = live
        self.health = health
        self.out = out
        self._last_kind: dict[tuple[str, int, int], str | None] = {}

        self._view_behind_since: int | None = None  # batches in a row the view was behind
        self._view_announced: str | None = None  # "behind" | "current", once said
        self._view_last_said = 0.0

    def _write_kafka(self, df: DataFrame, topic: str) -> None:
        df.write.format("kafka").options(**self.kafka_options).option("topic", topic).save()

    def events(self, df: DataFrame, batch_id: int) -> None:
        # Read once: the stateful stages run once per batch, and the few candidates are written from the driver
        # (caching the batch to read it twice cost more than the rest of the sink).
        rows = collect_events(df)
        self.live.apply_events(rows)
        for r in rows:
            if r.event == "VIEW":
                self._announce_view(_payload(r))
        candidates = [(r.candidate_id, r.payload) for r in rows if r.event in CANDIDATE_EVENTS]
        if candidates:
            self.writer.send(self.topics.abort_candidates, candidates)
        # A withdrawal goes on the audit trail too, beside the abort attempts (after the candidate record: an
        # abort that reads the audit log then finds the candidate already withdrawn).
        withdrawn = [
            (
                r.candidate_id,
                withdrawal_audit(AbortCandidate.model_validate(_payload(r))).model_dump_json(),
            )
            for r in rows
            if r.event == "WITHDRAWN"
        ]
        if withdrawn:
            self.writer.send(self.topics.audit, withdrawn)
        if self.out is not None:
            for r in rows:
                if r.event == "VIEW":
                    continue
                key = (r.topic, int(r.partition), int(r.producer_id))
                changed = r.event == "VERDICT" and self._last_kind.get(key) != r.kind
                # People see what needs them: candidates opened and resolved, and verdicts that moved to
                # something other than OPEN (HANGING is announced by its OPENED line). Scripts (--output json)
                # get every change.
                quiet = r.kind in ("OPEN", "HANGING") and self.output != "json"
                if r.event in CANDIDATE_EVENTS or (changed and not quiet):
                    print(self._render(r), file=self.out, flush=True)
                if r.event == "VERDICT":
                    self._last_kind[key] = r.kind
                elif r.event == "GONE":
                    self._last_kind.pop(key, None)

    def _announce_view(self, lag: dict[str, Any]) -> None:
        """Say once that the job is catching up on the coordinator log (and how far behind, every 30 s), and once
        that it is current. One batch behind is normal (a position can arrive before the records it covers)."""
        if self.out is None:
            return
        now = time.monotonic()
        if lag["current"]:
            self._view_behind_since = None
            if self._view_announced != "current":
                print("coordinator view current: HANGING verdicts can be proven", file=self.out, flush=True)
            self._view_announced = "current"
            return
        if self._view_behind_since is None:
            self._view_behind_since = 0
        self._view_behind_since += 1
        if self._view_behind_since < 2 and self._view_announced is not None:
            return
        last = self._view_last_said if self._view_announced == "behind" else None
        if last is not None and now - last < 30:
            return
        self._view_last_said = now
        self._view_announced = "behind"
        if not lag["measured"]:
            print(
                "waiting for the collector's first position of the coordinator log "
                "(is `txnwatch collect` running?); HANGING verdicts are withheld until then",
                file=self.out,
                flush=True,
            )
        else:
            print(
                f"catching up on the coordinator log: {lag['records_behind']} records behind "
                f"({lag['lag_ms'] / 1000:.0f}s); HANGING verdicts are withheld (UNCONFIRMED) until current",
                file=self.out,
                flush=True,
            )

    def _render(self, r: EventRow) -> str:
        if self.output == "json":
            return json.dumps({k: v for k, v in r._asdict().items() if v is not None})
        return format_event(r)

    def windows(self, df: DataFrame, batch_id: int) -> None:
        self.live.apply_windows(df.collect())

    def dead_letters(self, df: DataFrame, batch_id: int) -> None:
        df.persist()
        try:
            rows = df.select(*_DEAD_LETTER_COLUMNS).collect()
            if not rows:
                return
            for r in rows:
                self.health.dead_letters.labels(r.source).inc()
                log.warning(
                    "dead letter from %s %s-%s@%s: %s",
                    r.source,
                    r.source_topic,
                    r.source_partition,
                    r.source_offset,
                    r.error,
                )
            self._write_kafka(
                df.select(
                    "key",
                    "value",
                    F.array(
                        *[
                            _header(name, column)
                            for name, column in zip(DEAD_LETTER_HEADERS, _DEAD_LETTER_COLUMNS, strict=True)
                        ]
                    ).alias("headers"),
                ),
                self.topics.dead_letter,
            )
        finally:
            df.unpersist()
