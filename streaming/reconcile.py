"""The reconcile query's two stateful stages (transformWithStateInPandas, RocksDB): Spark adapters around
detectors/tracking.py, which holds every rule that moves their state.

Stage 1 (`ProducerIdFacts`, keyed by a bucket of transactional ids) turns coordinator records into producer-id
facts (`tracking.advance_owners`). Stage 2 (`TransactionReconciler`, keyed by a bucket of producer ids) keeps the
coordinator views and the open transactions and judges them (`tracking.BucketState`); a processing-time timer
forgets transactions the collector stopped confirming and views nobody uses any more.

Why buckets, not one key per transactional id / producer id: every state access of a Python stateful processor
is a round trip to the JVM's state server, and every key is a group with its own Arrow batch. Keyed per id, that
cost ~2 ms of CPU per id and capped the job near 1k records/s on two cores (docs/BENCHMARKS.md). So each stage is
keyed by a hash bucket of its id (`--state-buckets`, fixed for the life of a checkpoint) and keeps its ids in
one state value per bucket: a pickled dict read once and written once per bucket per batch.
"""

from __future__ import annotations

import dataclasses
import pickle
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol, cast

import pandas as pd
from pyspark.sql import DataFrame
from pyspark.sql import types as T
from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle, TimerValues

from detectors.tracking import (
    EVENT_COLUMNS,
    EVENT_FIELDS,
    FACT_COLUMNS,
    STAGE1_INPUT_COLUMNS,
    STAGE2_INPUT_COLUMNS,
    BucketState,
    CoordinatorRow,
    Owner,
    ReconcileConfig,
    View,
    advance_owners,
    advance_undecodable,
    applied_facts,
    read_facts,
    reconcile_bucket,
    stored_open_entry,
)
from streaming.gcpause import without_cyclic_gc
from streaming.rows import coordinator_rows, fact_rows, open_transaction_rows

# The state value of a bucket: one pickled dict (written and read only by this module).
BLOB_SCHEMA = "blob binary"


class ValueStateLike(Protocol):
    """The part of pyspark's ValueState this module uses (a test fakes it)."""

    def exists(self) -> bool: ...
    def get(self) -> tuple[Any, ...] | None: ...
    def update(self, newValue: tuple[Any, ...]) -> None: ...
    def clear(self) -> None: ...


def _load(state: ValueStateLike, entry: Callable[..., Any]) -> dict[Any, Any]:
    """A bucket's dict; its values come back as `entry` (a NamedTuple class) from the plain tuples stored."""
    stored = state.get() if state.exists() else None
    if stored is None:
        return {}
    return {k: entry(*v) for k, v in pickle.loads(stored[0]).items()}


def _save(state: ValueStateLike, value: Mapping[Any, tuple[Any, ...]]) -> None:
    # Plain tuples: pickling a NamedTuple stores its class per entry and took three times as long.
    if value:
        state.update(
            (pickle.dumps({k: tuple(v) for k, v in value.items()}, protocol=pickle.HIGHEST_PROTOCOL),)
        )
    else:
        state.clear()


def _columns(frames: Iterator[pd.DataFrame], names: Sequence[str]) -> list[list[Any]]:
    """The group's rows as one Python list per column (None for nulls): cheap to walk, unlike pandas rows."""
    parts = list(frames)
    df = parts[0] if len(parts) == 1 else pd.concat(parts, ignore_index=True)
    out = []
    for name in names:
        s = df[name]
        if s.dtype.kind == "f":  # only long columns come in; Arrow → pandas makes those with nulls float64
            out.append([None if v != v else int(v) for v in s.tolist()])
        else:
            out.append(s.tolist())
    return out


# ------------------------------------------------------------------------------------------- stage 1

FACT_SCHEMA = T.StructType(
    [
        T.StructField("producer_id", T.LongType(), False),
        # "view" | "retired" | "applied" (detectors.tracking.FACT_COLUMNS says what each carries)
        T.StructField("fact", T.StringType(), False),
        T.StructField("transactional_id", T.StringType(), False),
        T.StructField("record_json", T.StringType(), True),  # CoordinatorRecord JSON (view)
        T.StructField("fact_time_ms", T.LongType(), False),  # record update time, or when retired
        # the record's offset in its coordinator topic partition: the order of a producer id's facts (-1 unknown)
        T.StructField("log_offset", T.LongType(), False),
    ]
)


class ProducerIdFacts(StatefulProcessor):
    """Stage 1 (keyed by a bucket of transactional ids): which producer id each owns; facts by producer id."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.owners = handle.getValueState("owners", BLOB_SCHEMA)

    @without_cyclic_gc
    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        columns = _columns(rows, STAGE1_INPUT_COLUMNS[1:])
        where = columns[-4:-1]  # read_topic, read_partition, read_offset
        records = cast("Iterator[CoordinatorRow]", zip(*columns[:-4], strict=True))
        owners: dict[str, Owner] = _load(self.owners, Owner)
        # Plain tuples in CoordinatorRow's order: a NamedTuple per row would cost as much as the rule.
        # A row with no producer id did not decode: it is no record to apply, only a taint (advance_undecodable).
        facts = advance_owners(owners, (r for r in records if r[0] is not None and r[1] is not None))
        facts.extend(advance_undecodable(owners, columns[0], columns[1], *where))
        _save(self.owners, owners)
        # Read now, after the fetch of every row of the batch: the bound of when the reader saw its gaps.
        topics, partitions, offsets = where
        facts.extend(read_facts(topics, partitions, offsets, columns[-1], int(time.time() * 1000)))
        facts.extend(applied_facts(*where))
        if facts:
            yield pd.DataFrame(facts, columns=FACT_COLUMNS)

    def close(self) -> None:
        pass


# ------------------------------------------------------------------------------------------- stage 2

# Stage 2's output schema, built from the one declaration of its columns (detectors.tracking.EVENT_FIELDS).
_SPARK_TYPES: dict[str, T.DataType] = {
    "string": T.StringType(),
    "long": T.LongType(),
    "boolean": T.BooleanType(),
}
EVENT_SCHEMA = T.StructType([T.StructField(f.name, _SPARK_TYPES[f.type], f.nullable) for f in EVENT_FIELDS])


def collector_clock(config: ReconcileConfig, positions: Iterable[Any], now_ms: int) -> ReconcileConfig:
    """`config` with `expire_after_ms` counted on the collector's clock: lengthened by how far the newest sweep
    position the job has read (one per sweep) is behind `now_ms`.

    Expiry forgets an open transaction no snapshot confirmed for `expire_after_ms`: the collector stopped seeing
    it. While the collector publishes nothing at all (Kafka unreachable, the collector down), no sweep saw
    anything, and forgetting then RESOLVED every hanging candidate and OPENED it again once sweeps came back
    (tests/e2e/test_faults_e2e.py, Kafka down 60 s). Without any position read yet: processing time, as before.
    """
    newest = max((p.as_of_ms for p in positions), default=None)
    if newest is None or newest >= now_ms:
        return config
    return dataclasses.replace(config, expire_after_ms=config.expire_after_ms + (now_ms - newest))


class TransactionReconciler(StatefulProcessor):
    """Stage 2 (keyed by a bucket of producer ids): open transactions × the coordinator's view → verdicts."""

    def __init__(self, config: ReconcileConfig) -> None:
        self.config = config

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.views = handle.getValueState("views", BLOB_SCHEMA)
        self.opens = handle.getValueState("open", BLOB_SCHEMA)
        self.currency = handle.getValueState("currency", BLOB_SCHEMA)
        self.timer = handle.getValueState("timer", "at_ms long")

    def _bucket(self, now_ms: int) -> BucketState:
        stored = self.currency.get() if self.currency.exists() else None
        currency = self.config.view_currency(None if stored is None else pickle.loads(stored[0]))
        return BucketState(
            collector_clock(self.config, currency.newest.values(), now_ms),
            _load(self.views, View),
            _load(self.opens, stored_open_entry),
            currency,
        )

    def _store(self, bucket: BucketState) -> None:
        if bucket.views_changed:
            _save(self.views, bucket.views)
        if bucket.opens_changed:
            _save(self.opens, bucket.opens)
        if bucket.currency_changed:
            self.currency.update((pickle.dumps(bucket.currency.state(), protocol=pickle.HIGHEST_PROTOCOL),))
        deadline = bucket.next_deadline()
        stored = self.timer.get() if self.timer.exists() else None
        registered = None if stored is None else stored[0]
        if deadline == registered:
            return
        if registered is not None:
            self.handle.deleteTimer(registered)
        if deadline is None:
            self.timer.clear()
        else:
            self.handle.registerTimer(deadline)
            self.timer.update((deadline,))

    @without_cyclic_gc
    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        now_ms = timerValues.getCurrentProcessingTimeInMs()
        bucket = self._bucket(now_ms)
        columns = _columns(rows, STAGE2_INPUT_COLUMNS[1:])
        # Every bucket gets every progress and position row; bucket 0 reports the view's lag to the driver.
        report = key[0] == 0 and any(f in ("applied", "position") for f in columns[1])
        events = reconcile_bucket(bucket, columns, now_ms, report_view=report)
        self._store(bucket)
        if events:
            yield pd.DataFrame(events, columns=EVENT_COLUMNS, dtype=object)

    @without_cyclic_gc
    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: Any
    ) -> Iterator[pd.DataFrame]:
        # Called by keyword: the parameter names must stay exactly these (pyspark's transformWithStateInPandas calls handleInputRows by keyword).
        now_ms = timerValues.getCurrentProcessingTimeInMs()
        self.timer.clear()  # it fired
        bucket = self._bucket(now_ms)
        events = bucket.expire(now_ms)
        self._store(bucket)
        if events:
            yield pd.DataFrame(events, columns=EVENT_COLUMNS, dtype=object)

    def close(self) -> None:
        pass


def reconcile_events(
    snapshots: DataFrame, coordinator_records: DataFrame, config: ReconcileConfig, buckets: int
) -> DataFrame:
    """The two stateful stages: coordinator records + good snapshots → EVENT_SCHEMA rows."""
    facts = (
        coordinator_rows(coordinator_records, buckets)
        .groupBy("bucket")
        .transformWithStateInPandas(ProducerIdFacts(), FACT_SCHEMA, "Append", "None")
    )
    stage2_input = fact_rows(facts, buckets).unionByName(open_transaction_rows(snapshots, buckets))
    return (
        stage2_input.select(*STAGE2_INPUT_COLUMNS)
        .groupBy("bucket")
        .transformWithStateInPandas(TransactionReconciler(config), EVENT_SCHEMA, "Append", "ProcessingTime")
    )
