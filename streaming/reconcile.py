"""The reconcile query's two stateful stages (transformWithStateInPandas, RocksDB): Spark adapters around
detectors/tracking.py. Stage 1 (`ProducerIdFacts`) and stage 2 (`TransactionReconciler`) are keyed by a hash
bucket of their id and keep map state per id, reading and writing only the ids a batch touches; an earlier
release's checkpoint is migrated on first read. Why buckets and per-id state: docs/streaming.md, "The stateful
stages".
"""

from __future__ import annotations

import dataclasses
import functools
import json
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
    Views,
    advance_owners,
    advance_undecodable,
    applied_facts,
    in_progress,
    kept_past_ttl,
    read_facts,
    reconcile_bucket,
    stored_open_entry,
)
from streaming.gcpause import without_cyclic_gc
from streaming.rows import coordinator_rows, fact_rows, open_transaction_rows

_DDL_TYPES = {
    "string": T.StringType(),
    "long": T.LongType(),
    "binary": T.BinaryType(),
    "boolean": T.BooleanType(),
}


@functools.cache
def struct(ddl: str) -> T.StructType:
    """A state schema from its DDL ("name type, ..."; nullable columns, as Spark parses them), built here: a DDL
    string handed to getValueState/getMapState costs a round trip to the JVM to parse, in every task's `init`.
    Built once per Python worker (cached): every task's `init` asks for the same few."""
    fields = []
    for column in ddl.split(","):
        name, kind = column.split()
        fields.append(T.StructField(name, _DDL_TYPES[kind], True))
    return T.StructType(fields)


# A state value of a bucket that is one pickled object (written and read only by this module).
BLOB_SCHEMA = "blob binary"

# A batch that touches at least this many ids of one bucket reads the bucket's whole map in one stream (Arrow
# batches from the state server) rather than one round trip per id: catching up a log of a million ids, the
# first batches touch every id.
BULK_READ_IDS = 2_000


class ValueStateLike(Protocol):
    """The part of pyspark's ValueState this module uses (a test fakes it)."""

    def exists(self) -> bool: ...
    def get(self) -> tuple[Any, ...] | None: ...
    def update(self, newValue: tuple[Any, ...]) -> None: ...
    def clear(self) -> None: ...


class MapStateLike(Protocol):
    """The part of pyspark's MapState this module uses (a test fakes it)."""

    def exists(self) -> bool: ...
    def getValue(self, key: tuple[Any, ...]) -> tuple[Any, ...] | None: ...
    def updateValue(self, key: tuple[Any, ...], value: tuple[Any, ...]) -> None: ...
    def removeKey(self, key: tuple[Any, ...]) -> None: ...
    def iterator(self) -> Iterator[tuple[tuple[Any, ...], tuple[Any, ...]]]: ...


def _read_map(state: MapStateLike, ids: set[Any], decode: Callable[[tuple[Any, ...]], Any]) -> dict[Any, Any]:
    """The stored values of `ids` (absent ones left out): one round trip per id, or, for many ids, the whole
    map in one stream (`BULK_READ_IDS`); nothing at all from an empty map (the first batches of a new job)."""
    if not ids or not state.exists():
        return {}
    if len(ids) >= BULK_READ_IDS:
        return {k[0]: decode(v) for k, v in state.iterator() if k[0] in ids}
    found = {}
    for i in ids:
        row = state.getValue((i,))
        if row is not None:
            found[i] = decode(row)
    return found


def _load(state: ValueStateLike, entry: Callable[..., Any]) -> dict[Any, Any]:
    """A bucket's dict; its values come back as `entry` (a NamedTuple class) from the plain tuples stored."""
    # exists() first: a get() of an absent value logs a WARN in the state server, which executors in JVMs of their
    # own print (the job quiets it only in the driver's JVM), and the legacy values are absent in every batch.
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


# Stage 1's state per transactional id (detectors.tracking.Owner): the two rarely set fields as JSON.
OWNER_KEY_SCHEMA = "transactional_id string"
OWNER_SCHEMA = "producer_id long, source_offset long, undecodable string, prepared string"


def owner_row(owner: Owner) -> tuple[Any, ...]:
    """An Owner as OWNER_SCHEMA's columns."""
    return (
        owner.producer_id,
        owner.source_offset,
        json.dumps(owner.undecodable) if owner.undecodable else None,
        json.dumps(owner.prepared) if owner.prepared is not None else None,
    )


def owner_of(row: tuple[Any, ...]) -> Owner:
    """The Owner stored as OWNER_SCHEMA's columns (`owner_row`)."""
    undecodable = tuple((topic, offset) for topic, offset in json.loads(row[2])) if row[2] else ()
    prepared = tuple(json.loads(row[3])) if row[3] else None
    return Owner(row[0], row[1], undecodable, prepared)


class ProducerIdFacts(StatefulProcessor):
    """Stage 1 (keyed by a bucket of transactional ids): which producer id each owns; facts by producer id."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.owners = handle.getMapState("owner", struct(OWNER_KEY_SCHEMA), struct(OWNER_SCHEMA))
        # A bucket's one dict, before per-id state.
        self.legacy = handle.getValueState("owners", struct(BLOB_SCHEMA))
        self.migrated: set[Any] = set()

    def _migrate_owners(self, key: Any) -> None:
        """A bucket an earlier release stored as one pickled dict: every owner into the map, once."""
        if key in self.migrated:
            return
        for tid, owner in _load(self.legacy, Owner).items():
            self.owners.updateValue((tid,), owner_row(owner))
        self.legacy.clear()
        self.migrated.add(key)

    @without_cyclic_gc
    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        columns = _columns(rows, STAGE1_INPUT_COLUMNS[1:])
        where = columns[-4:-1]  # read_topic, read_partition, read_offset
        records = cast("Iterator[CoordinatorRow]", zip(*columns[:-4], strict=True))
        self._migrate_owners(key)
        touched = {tid for tid in columns[0] if tid is not None}
        stored: dict[str, Owner] = _read_map(self.owners, touched, owner_of)
        owners = dict(stored)
        # Plain tuples in CoordinatorRow's order: a NamedTuple per row would cost as much as the rule.
        # A row with no producer id did not decode: it is no record to apply, only a taint (advance_undecodable).
        facts = advance_owners(owners, (r for r in records if r[0] is not None and r[1] is not None))
        facts.extend(advance_undecodable(owners, columns[0], columns[1], *where))
        for tid in touched:
            owner, before = owners.get(tid), stored.get(tid)
            if owner == before:
                continue
            if owner is None:
                self.owners.removeKey((tid,))
            else:
                self.owners.updateValue((tid,), owner_row(owner))
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


# Stage 2's state per producer id (detectors.tracking.View), in one of two maps: the views kept past the TTL
# (`kept_past_ttl`: the coordinator still owns the transaction, or an open one of the producer id is tracked)
# and the ones the state store forgets `view_ttl_ms` after they were last written.
VIEW_KEY_SCHEMA = "producer_id long"
VIEW_SCHEMA = (
    "record_json string, retired_at_ms long, fact_time_ms long, updated_ms long, log_offset long, "
    "in_progress boolean"
)


class TransactionReconciler(StatefulProcessor):
    """Stage 2 (keyed by a bucket of producer ids): open transactions × the coordinator's view → verdicts."""

    def __init__(self, config: ReconcileConfig) -> None:
        self.config = config

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.kept = handle.getMapState("views_kept", struct(VIEW_KEY_SCHEMA), struct(VIEW_SCHEMA))
        self.expiring = handle.getMapState(
            "views_expiring", struct(VIEW_KEY_SCHEMA), struct(VIEW_SCHEMA), self.config.view_ttl_ms
        )
        self.kept_ids = handle.getValueState("views_kept_ids", struct(BLOB_SCHEMA))  # which map holds a view
        self.legacy_views = handle.getValueState("views", struct(BLOB_SCHEMA))  # a bucket's one dict, before
        self.opens = handle.getValueState("open", struct(BLOB_SCHEMA))
        self.currency = handle.getValueState("currency", struct(BLOB_SCHEMA))
        self.timer = handle.getValueState("timer", struct("at_ms long"))
        # The run of the job (ReconcileConfig.run_id) the bucket last told every verdict to: VERDICTs are emitted
        # only when they change, and a driver started again knows none until told. Added after v0.1.0: a bucket
        # of an earlier checkpoint has none, and tells.
        self.announced = handle.getValueState("announced", struct("run_id string"))
        self.migrated: set[Any] = set()

    def _migrate_views(self, key: Any, opens: Mapping[Any, Any], kept_ids: set[int]) -> None:
        """A bucket an earlier release stored as one pickled dict: every view into its map, once."""
        if key in self.migrated:
            return
        in_use = {k[0] for k in opens}
        for pid, view in _load(self.legacy_views, View).items():
            if view.in_progress is None:
                view = view._replace(in_progress=in_progress(view.record_json))
            if kept_past_ttl(view, pid in in_use):
                self.kept.updateValue((pid,), tuple(view))
                kept_ids.add(pid)
            else:
                self.expiring.updateValue((pid,), tuple(view))
        self.legacy_views.clear()
        self.migrated.add(key)

    def _bucket(
        self, key: Any, now_ms: int, producer_ids: Iterable[int] = ()
    ) -> tuple[BucketState, set[int]]:
        stored = self.currency.get() if self.currency.exists() else None
        currency = self.config.view_currency(None if stored is None else pickle.loads(stored[0]))
        opens = _load(self.opens, stored_open_entry)
        held = self.kept_ids.get() if self.kept_ids.exists() else None
        kept_ids: set[int] = set() if held is None else pickle.loads(held[0])
        self._migrate_views(key, opens, kept_ids)
        wanted = set(producer_ids) | {k[0] for k in opens}
        if len(wanted) >= BULK_READ_IDS:
            # Catching up: the bucket's views in two streams, not a round trip per producer id.
            views = Views(_read_map(self.kept, wanted, _view_of) | _read_map(self.expiring, wanted, _view_of))
        else:

            def load(pid: int) -> View | None:
                row = (self.kept if pid in kept_ids else self.expiring).getValue((pid,))
                return None if row is None else View(*row)

            views = Views(load=load)
        bucket = BucketState(
            collector_clock(self.config, currency.newest.values(), now_ms), views, opens, currency
        )
        return bucket, kept_ids

    def _store(self, bucket: BucketState, kept_ids: set[int], kept_at_load: frozenset[int]) -> None:
        changed = bucket.views.changed
        for pid, view, kept in bucket.view_homes():
            was_kept = pid in kept_ids
            if pid not in changed and kept == was_kept:
                continue  # its use changed, its home did not
            (self.kept if kept else self.expiring).updateValue((pid,), tuple(view))
            if kept != was_kept:
                (self.expiring if kept else self.kept).removeKey((pid,))
                if kept:
                    kept_ids.add(pid)
                else:
                    kept_ids.discard(pid)
        if kept_ids != kept_at_load:
            if kept_ids:
                self.kept_ids.update((pickle.dumps(kept_ids, protocol=pickle.HIGHEST_PROTOCOL),))
            else:
                self.kept_ids.clear()
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
        columns = _columns(rows, STAGE2_INPUT_COLUMNS[1:])
        # The producer ids of view, retired and open rows (progress and position rows carry -1).
        bucket, kept_ids = self._bucket(key, now_ms, (p for p in columns[0] if p >= 0))
        kept_at_load = frozenset(kept_ids)
        # Every bucket gets every progress and position row; bucket 0 reports the view's lag to the driver.
        report = key[0] == 0 and any(f in ("applied", "position") for f in columns[1])
        # Every bucket gets rows at the first batch with a collector position (they go to every bucket), so the
        # driver of a new run is told every verdict within a sweep of starting.
        told = self.announced.get() if self.announced.exists() else None
        announce = told_another_run(None if told is None else told[0], self.config.run_id)
        events = reconcile_bucket(bucket, columns, now_ms, report_view=report, announce=announce)
        self._store(bucket, kept_ids, kept_at_load)
        if announce:
            self.announced.update((self.config.run_id,))
        if events:
            yield pd.DataFrame(events, columns=EVENT_COLUMNS, dtype=object)

    @without_cyclic_gc
    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: Any
    ) -> Iterator[pd.DataFrame]:
        # Called by keyword: the parameter names must stay exactly these (pyspark's transformWithStateInPandas calls handleInputRows by keyword).
        now_ms = timerValues.getCurrentProcessingTimeInMs()
        self.timer.clear()  # it fired
        bucket, kept_ids = self._bucket(key, now_ms)
        kept_at_load = frozenset(kept_ids)
        events = bucket.expire(now_ms)
        self._store(bucket, kept_ids, kept_at_load)
        if events:
            yield pd.DataFrame(events, columns=EVENT_COLUMNS, dtype=object)

    def close(self) -> None:
        pass


def told_another_run(told_run_id: str | None, run_id: str) -> bool:
    """Whether a bucket last told its verdicts to another run of the job than this one (or never did): it must
    tell every one again, the driver's live state starts empty."""
    return told_run_id != run_id


def _view_of(row: tuple[Any, ...]) -> View:
    return View(*row)


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
