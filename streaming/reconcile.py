"""The two stateful stages (transformWithState, RocksDB), thin adapters around detectors/.

Stage 1, keyed by transactional id, turns coordinator records into producer-id facts: the record is the view of
its current producer id, and a producer id the transactional id left (new producer id, or tombstone) is
retired. Stage 2, keyed by producer id, keeps the coordinator view and the open transactions partition leaders
report, classifies each with `detectors.rules.classify`, and emits verdicts and abort candidates (OPENED once,
RESOLVED when the transaction is gone). Processing-time timers forget transactions the collector stopped
confirming; TTL forgets coordinator views of producer ids nobody uses any more.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Row
from pyspark.sql import types as T
from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle, TimerValues

from detectors.abort import plan_abort
from detectors.models import (
    AbortCandidate,
    CoordinatorRecord,
    DetectionLimits,
    PartitionSnapshot,
    VerdictKind,
)
from detectors.rules import classify

# ------------------------------------------------------------------------------------------- stage 1

FACT_SCHEMA = T.StructType(
    [
        T.StructField("producer_id", T.LongType(), False),
        T.StructField("fact", T.StringType(), False),  # "view" | "retired"
        T.StructField("transactional_id", T.StringType(), False),
        T.StructField("record_json", T.StringType(), True),  # CoordinatorRecord JSON (view)
        T.StructField("fact_time_ms", T.LongType(), False),  # record update time, or when retired
    ]
)


def _record_json(row: Row) -> str:
    d = row.asDict(recursive=True)
    return json.dumps({k: d[k] for k in CoordinatorRecord.model_fields}, separators=(",", ":"))


class ProducerIdFacts(StatefulProcessor):
    """Stage 1: per transactional id, which producer id it owns now; emits facts keyed by producer id."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.owner = handle.getValueState("owner", "producer_id long, source_offset long")

    def handleInputRows(self, key: Any, rows: Iterator[Row], timerValues: TimerValues) -> Iterator[Row]:
        (transactional_id,) = key
        current = self.owner.get() if self.owner.exists() else None
        owned = current[0] if current else None
        last_offset = current[1] if current else -1
        facts: dict[int, Row] = {}
        for r in sorted(rows, key=lambda r: r.source_offset):
            if r.source_offset >= 0 and r.source_offset <= last_offset:
                continue  # replayed or older than what we have: the log is ordered per transactional id
            last_offset = max(last_offset, r.source_offset)
            if r.tombstone:
                if owned is not None:
                    facts[owned] = Row(
                        producer_id=owned,
                        fact="retired",
                        transactional_id=transactional_id,
                        record_json=None,
                        fact_time_ms=r.last_update_timestamp_ms,
                    )
                owned = None
                continue
            record = _record_json(r)
            if owned is not None and owned != r.producer_id:
                # The id moved to a new producer id (epoch overflow, or a new producer after expiry).
                names_old = owned in (r.previous_producer_id, r.next_producer_id)
                facts[owned] = Row(
                    producer_id=owned,
                    fact="view" if names_old else "retired",
                    transactional_id=transactional_id,
                    record_json=record if names_old else None,
                    fact_time_ms=r.last_update_timestamp_ms,
                )
            owned = r.producer_id
            facts[owned] = Row(
                producer_id=owned,
                fact="view",
                transactional_id=transactional_id,
                record_json=record,
                fact_time_ms=r.last_update_timestamp_ms,
            )
        if owned is None:
            self.owner.clear()
        else:
            self.owner.update((owned, last_offset))
        return iter(facts.values())

    def close(self) -> None:
        pass


# ------------------------------------------------------------------------------------------- stage 2

# Both inputs of stage 2 in one schema: coordinator facts (fact != "open") and open transactions.
STAGE2_INPUT_COLUMNS = (
    "producer_id",
    "fact",
    "transactional_id",
    "record_json",
    "fact_time_ms",
    "topic",
    "partition",
    "snapshot_json",
    "observed_at_ms",
)

EVENT_SCHEMA = T.StructType(
    [
        T.StructField("event", T.StringType(), False),  # VERDICT | OPENED | RESOLVED | GONE
        T.StructField("producer_id", T.LongType(), False),
        T.StructField("topic", T.StringType(), False),
        T.StructField("partition", T.LongType(), False),
        T.StructField("leader", T.LongType(), True),
        T.StructField("start_offset", T.LongType(), False),
        T.StructField("kind", T.StringType(), True),
        T.StructField("reason", T.StringType(), True),
        T.StructField("age_ms", T.LongType(), True),
        T.StructField("lso_lag", T.LongType(), True),
        T.StructField("explanation", T.StringType(), True),
        T.StructField("candidate_id", T.StringType(), True),
        T.StructField("payload", T.StringType(), True),  # AbortCandidate JSON for OPENED / RESOLVED
        T.StructField("event_time_ms", T.LongType(), False),
    ]
)


@dataclass(frozen=True)
class ReconcileConfig:
    """What stage 2 needs besides the detection limits; shipped to executors with the processor."""

    limits: DetectionLimits
    expire_after_ms: int  # forget an open transaction not confirmed by a snapshot for this long
    view_ttl_ms: (
        int  # forget a coordinator view not updated for this long (bounds state of dead producer ids)
    )
    bootstrap: str | None = None  # for the kafka-transactions.sh line in candidates
    command_config: str | None = None


OPEN_VALUE_SCHEMA = "snapshot_json string, first_seen_ms long, last_confirmed_ms long, candidate_json string"


class TransactionReconciler(StatefulProcessor):
    """Stage 2: per producer id, open transactions × the coordinator's view → verdicts and candidates."""

    def __init__(self, config: ReconcileConfig) -> None:
        self.config = config

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.view = handle.getValueState(
            "view",
            "record_json string, retired_at_ms long, fact_time_ms long",
            ttlDurationMs=self.config.view_ttl_ms,
        )
        self.open = handle.getMapState("open", "topic string, partition long", OPEN_VALUE_SCHEMA)

    # -- input

    def handleInputRows(self, key: Any, rows: Iterator[Row], timerValues: TimerValues) -> Iterator[Row]:
        (producer_id,) = key
        now_ms = timerValues.getCurrentProcessingTimeInMs()
        events: list[Row] = []
        confirmed_now: set[tuple[str, int]] = set()
        for r in sorted(rows, key=lambda r: (r.fact != "open", r.fact_time_ms or r.observed_at_ms or 0)):
            if r.fact == "open":
                events.extend(self._confirm_open(r, now_ms))
                confirmed_now.add((r.topic, r.partition))
            else:
                self._apply_fact(r)
        events.extend(self._evaluate_all(producer_id, now_ms, confirmed_now))
        self._schedule_expiry(now_ms)
        return iter(events)

    def _apply_fact(self, r: Row) -> None:
        current = self.view.get() if self.view.exists() else None
        if current is not None and current[2] > r.fact_time_ms:
            return  # an older fact arriving late changes nothing
        if r.fact == "retired":
            self.view.update((None, r.fact_time_ms, r.fact_time_ms))
        else:
            self.view.update((r.record_json, None, r.fact_time_ms))

    def _confirm_open(self, r: Row, now_ms: int) -> list[Row]:
        key = (r.topic, r.partition)
        snapshot = PartitionSnapshot.model_validate_json(r.snapshot_json)
        txn = snapshot.open_transactions[0]
        existing = self.open.getValue(key) if self.open.containsKey(key) else None
        events: list[Row] = []
        # First seen on the collector's clock, like observed_at: the rules compare the two.
        first_seen, candidate = snapshot.observed_at_ms, None
        if existing is not None:
            old = PartitionSnapshot.model_validate_json(existing[0])
            if old.observed_at_ms > snapshot.observed_at_ms:
                return []  # an older snapshot arriving late
            if old.open_transactions[0].start_offset == txn.start_offset:
                first_seen, candidate = existing[1], existing[3]
            else:  # the transaction we knew ended and a new one began on the same partition
                events.extend(self._gone(old, existing[3], now_ms))
        # Confirmed as of the snapshot, not as of this batch: a backlog of old snapshots (after a restart or a
        # slow first batch) must not keep long-finished transactions alive.
        self.open.updateValue(key, (r.snapshot_json, first_seen, snapshot.observed_at_ms, candidate))
        return events

    # -- classification

    def _coordinator(self) -> tuple[CoordinatorRecord | None, int | None]:
        if not self.view.exists():
            return None, None
        record_json, retired_at, _ = self.view.get()
        if record_json is None:
            return None, retired_at
        return CoordinatorRecord.model_validate_json(record_json), None

    def _evaluate_all(self, producer_id: int, now_ms: int, confirmed_now: set[tuple[str, int]]) -> list[Row]:
        view, retired_at = self._coordinator()
        if (
            view is not None
            and not view.tombstone
            and producer_id
            not in (
                view.producer_id,
                view.previous_producer_id,
                view.next_producer_id,
            )
        ):
            view = None  # defensive: a view must name this producer id
        events: list[Row] = []
        for (topic, partition), (snapshot_json, first_seen, confirmed, candidate) in list(
            self.open.iterator()
        ):
            snapshot = PartitionSnapshot.model_validate_json(snapshot_json)
            if (topic, partition) not in confirmed_now and confirmed + self.config.expire_after_ms <= now_ms:
                # No snapshot has confirmed it for too long: the collector stopped seeing it open. (A snapshot in
                # this very batch is the newest news we have, however late it arrived.)
                self.open.removeKey((topic, partition))
                events.extend(self._gone(snapshot, candidate, now_ms))
                continue
            txn = snapshot.open_transactions[0]
            # Judged as of the leader's report: ages and deadlines at observed_at, so input that arrives late
            # (a backlog) is not made to look older than it was.
            verdict = classify(
                txn,
                snapshot,
                view,
                now_ms=snapshot.observed_at_ms,
                limits=self.config.limits,
                first_seen_ms=first_seen,
                retired_at_ms=retired_at,
            )
            e = verdict.evidence
            lso_lag = (
                snapshot.high_watermark - snapshot.last_stable_offset
                if snapshot.high_watermark is not None and snapshot.last_stable_offset is not None
                else None
            )
            candidate_id = None
            if verdict.kind is VerdictKind.HANGING and candidate is None:
                planned = plan_abort(
                    snapshot,
                    txn,
                    verdict,
                    bootstrap=self.config.bootstrap,
                    command_config=self.config.command_config,
                    first_detected_ms=now_ms,
                )
                candidate = planned.model_dump_json()
                self.open.updateValue((topic, partition), (snapshot_json, first_seen, confirmed, candidate))
                events.append(self._candidate_event("OPENED", planned, snapshot, now_ms))
            if candidate is not None:
                candidate_id = AbortCandidate.model_validate_json(candidate).candidate_id
            events.append(
                Row(
                    event="VERDICT",
                    producer_id=producer_id,
                    topic=topic,
                    partition=partition,
                    leader=snapshot.leader,
                    start_offset=txn.start_offset,
                    kind=verdict.kind.value,
                    reason=verdict.reason.value if verdict.reason else None,
                    age_ms=e.age_ms,
                    lso_lag=lso_lag,
                    explanation=verdict.explanation,
                    candidate_id=candidate_id,
                    payload=None,
                    event_time_ms=now_ms,
                )
            )
        return events

    @staticmethod
    def _candidate_event(event: str, c: AbortCandidate, snapshot: PartitionSnapshot, now_ms: int) -> Row:
        return Row(
            event=event,
            producer_id=c.spec.producer_id,
            topic=c.topic,
            partition=c.partition,
            leader=snapshot.leader,
            start_offset=c.start_offset,
            kind=VerdictKind.HANGING.value,
            reason=c.reason.value,
            age_ms=c.evidence.age_ms,
            lso_lag=None,
            explanation=c.explanation,
            candidate_id=c.candidate_id,
            payload=c.model_dump_json(),
            event_time_ms=now_ms,
        )

    # -- forgetting

    def _gone(self, snapshot: PartitionSnapshot, candidate: str | None, now_ms: int) -> list[Row]:
        txn = snapshot.open_transactions[0]
        events = [
            Row(
                event="GONE",
                producer_id=txn.producer_id,
                topic=snapshot.topic,
                partition=snapshot.partition,
                leader=snapshot.leader,
                start_offset=txn.start_offset,
                kind=None,
                reason=None,
                age_ms=None,
                lso_lag=None,
                explanation=None,
                candidate_id=None,
                payload=None,
                event_time_ms=now_ms,
            )
        ]
        if candidate is not None:
            resolved = AbortCandidate.model_validate_json(candidate).resolved(resolved_at_ms=now_ms)
            events.append(self._candidate_event("RESOLVED", resolved, snapshot, now_ms))
        return events

    def _schedule_expiry(self, now_ms: int) -> None:
        for t in list(self.handle.listTimers()):
            self.handle.deleteTimer(t)
        if self.open.exists():
            self.handle.registerTimer(now_ms + self.config.expire_after_ms)

    def handleExpiredTimer(self, key: Any, timerValues: TimerValues, expiredTimerInfo: Any) -> Iterator[Row]:
        # Called by keyword: the parameter names must stay exactly these (notes/spark-4.3.md).
        now_ms = timerValues.getCurrentProcessingTimeInMs()
        events: list[Row] = []
        for k, (snapshot_json, _first, confirmed, candidate) in list(self.open.iterator()):
            if confirmed + self.config.expire_after_ms <= now_ms:
                self.open.removeKey(k)
                events.extend(
                    self._gone(PartitionSnapshot.model_validate_json(snapshot_json), candidate, now_ms)
                )
        if self.open.exists():
            self.handle.registerTimer(now_ms + self.config.expire_after_ms)
        return iter(events)

    def close(self) -> None:
        pass
