"""The job's inputs: partition snapshots (JSON) and coordinator records (`__transaction_state` binary, or the
collector's JSON fallback), each split into good rows and dead letters. `__transaction_state` needs Spark's
consumer-based offset reader: docs/streaming.md, "Reading `__transaction_state`".
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from detectors.began import begin_marks
from detectors.codec import DecodeError, decode_key, decode_value
from detectors.contract import (
    COORDINATOR_LOG_POSITION_TYPE,
    SNAPSHOT_TYPE,
    TRANSACTION_LOG_TOPIC,
    TYPE_HEADER,
)
from detectors.models import SCHEMA_VERSION, CoordinatorState
from detectors.tracking import run_ends
from streaming.schemas import COORDINATOR_RECORD_SCHEMA, PARTITION_SNAPSHOT_SCHEMA

# CoordinatorLogPosition, as far as Spark checks it (JSON object keys are strings; stage 2 reads the raw JSON).
POSITION_SCHEMA = T.StructType(
    [
        T.StructField("schema_version", T.LongType()),
        T.StructField("cluster", T.StringType()),
        T.StructField("sweep_id", T.StringType()),
        T.StructField("topic", T.StringType()),
        T.StructField("partitions", T.LongType()),
        T.StructField("as_of_ms", T.LongType()),
        T.StructField("end_offsets", T.MapType(T.StringType(), T.LongType())),
        T.StructField("log_end_offsets", T.MapType(T.StringType(), T.LongType())),  # optional
    ]
)

DEAD_LETTER_SCHEMA = T.StructType(
    [
        T.StructField("source", T.StringType(), False),
        T.StructField("source_topic", T.StringType(), False),
        T.StructField("source_partition", T.IntegerType(), False),
        T.StructField("source_offset", T.LongType(), False),
        T.StructField("error", T.StringType(), False),
        T.StructField("key", T.BinaryType(), True),
        T.StructField("value", T.BinaryType(), True),
    ]
)


# How long a broker may hold a fetch of the job's Kafka consumers open for more data (Kafka's default: 500 ms).
# With the default, every partition of a batch's offset ranges cost about a quarter of a second of waiting, not
# of work: a plain Spark read of 6,000 records took 13-16 s from a 50-partition topic and 0.2-0.5 s from a
# 4-partition one, and 1.0-1.3 s from the 50 partitions at 10 ms (docs/BENCHMARKS.md). (A Kafka consumer sends no
# new fetch to a broker while one is outstanding there, and one sent past the end of a range waits for data that
# is not coming.) Spark knows each range before reading it, so a short wait loses nothing; on a real cluster's
# 50-partition `__transaction_state` it was most of a batch. `fetch.max.wait.ms` in `--command-config` overrides it.
FETCH_MAX_WAIT_MS = 10


@dataclass(frozen=True)
class KafkaSource:
    """Where and how to read one topic."""

    topic: str
    options: Mapping[str, str]  # kafka.* client properties plus source options
    starting_offsets: str = "earliest"
    max_offsets_per_trigger: int | None = None


def reader_options(source: KafkaSource) -> dict[str, str]:
    """The Kafka source's options for `source`: the job's, then the source's own (client properties win)."""
    options = {
        "subscribe": source.topic,
        "startingOffsets": source.starting_offsets,
        "includeHeaders": "true",
        # Compaction and retention may remove offsets the checkpoint points at; that is not a reason to stop.
        "failOnDataLoss": "false",
        "kafka.fetch.max.wait.ms": str(FETCH_MAX_WAIT_MS),
    }
    if source.max_offsets_per_trigger:
        options["maxOffsetsPerTrigger"] = str(source.max_offsets_per_trigger)
    return options | dict(source.options)


def read_kafka(spark: SparkSession, source: KafkaSource) -> DataFrame:
    return spark.readStream.format("kafka").options(**reader_options(source)).load()


def _header(name: str) -> Column:
    matching = F.filter(F.col("headers"), lambda h: h["key"] == F.lit(name))
    return F.when(F.size(matching) > 0, F.element_at(matching, 1)["value"].cast("string"))


# ------------------------------------------------------------------------------------- snapshots


def _snapshot_problem(s: Column) -> Column:
    """Why a parsed snapshot is unusable, or null if it is fine (from_json turns bad fields into nulls)."""
    txn_ok = F.forall(
        F.coalesce(s["open_transactions"], F.array()),
        lambda t: (
            t["producer_id"].isNotNull() & t["producer_epoch"].isNotNull() & t["start_offset"].isNotNull()
        ),
    )
    return (
        F.when(s.isNull(), F.lit("not JSON"))
        .when(s["schema_version"] != SCHEMA_VERSION, F.lit(f"schema_version is not {SCHEMA_VERSION}"))
        .when(
            s["cluster"].isNull()
            | s["topic"].isNull()
            | s["partition"].isNull()
            | s["leader"].isNull()
            | s["observed_at_ms"].isNull()
            | s["open_transactions"].isNull(),
            F.lit("missing or mistyped PartitionSnapshot fields"),
        )
        .when(~txn_ok, F.lit("an open transaction lacks producer_id, producer_epoch or start_offset"))
    )


def _position_problem(p: Column) -> Column:
    """Why a parsed CoordinatorLogPosition is unusable, or null if it is fine."""
    return (
        F.when(p.isNull() | p["schema_version"].isNull(), F.lit("not JSON"))
        .when(p["schema_version"] != SCHEMA_VERSION, F.lit(f"schema_version is not {SCHEMA_VERSION}"))
        .when(
            p["topic"].isNull()
            | p["partitions"].isNull()
            | p["as_of_ms"].isNull()
            | p["end_offsets"].isNull(),
            F.lit("missing or mistyped CoordinatorLogPosition fields"),
        )
        .when(p["partitions"] < 1, F.lit("partitions must be at least 1"))
        .when(
            _bad_offsets(p["end_offsets"], p["partitions"]),
            F.lit("end_offsets must map partitions 0..partitions-1 to offsets >= 0"),
        )
        .when(
            # Optional (earlier collectors leave it out): a null map makes `exists` null, which passes.
            _bad_offsets(p["log_end_offsets"], p["partitions"]),
            F.lit("log_end_offsets must map partitions 0..partitions-1 to offsets >= 0"),
        )
    )


def _bad_offsets(offsets: Column, partitions: Column) -> Column:
    """Some entry of a partition -> offset map is not a partition of the topic or not an offset."""
    return F.exists(
        F.map_entries(offsets),
        lambda e: (
            e["value"].isNull()
            | (e["value"] < 0)
            | e["key"].cast("long").isNull()
            | (e["key"].cast("long") < 0)
            | (e["key"].cast("long") >= partitions)
        ),
    )


def is_position() -> Column:
    """The row is a CoordinatorLogPosition (the collector's measure of the coordinator topics' ends)."""
    return F.coalesce(F.col("record_type") == COORDINATOR_LOG_POSITION_TYPE, F.lit(False))


def _other_cluster(record: Column, cluster: str | None) -> Column:
    """Why a record of another cluster than the job's is refused (null if it is the job's, or no cluster is
    set): a mirrored or shared producer-state topic would otherwise mix two clusters' leaders and positions into
    one view, and a position of cluster A could vouch for a view of cluster B."""
    if cluster is None:
        return F.lit(None).cast("string")
    return F.when(
        record["cluster"] != F.lit(cluster),
        F.concat(
            F.lit("from cluster '"),
            record["cluster"],
            F.lit(f"', not this job's '{cluster}' (a mirrored or shared producer-state topic? refused)"),
        ),
    )


def parse_snapshots(raw: DataFrame, *, cluster: str | None = None) -> DataFrame:
    """Kafka rows → one row per message: `snapshot` struct (PartitionSnapshot), `position` struct
    (CoordinatorLogPosition) and `problem` (null if good). With `cluster`, a snapshot or position of another
    cluster is a problem too (a dead letter, never judged).

    Sweep summaries (`detectors.contract.SUMMARY_TYPE`) are dropped here. Positions stay: the reconcile
    query reads them from the same scan (a second read of the topic would fetch every snapshot twice).
    """
    typed = raw.withColumn("record_type", _header(TYPE_HEADER)).where(
        F.col("record_type").isNull()
        | (F.col("record_type") == SNAPSHOT_TYPE)
        | (F.col("record_type") == COORDINATOR_LOG_POSITION_TYPE)
    )
    # inline(array(struct(...))) parses each message once: a plain column would be inlined by the optimizer into
    # every expression that reads it (the problem checks, the filter pushed below them, each field), and JSON
    # parsing is not code-generated, so Spark parsed each message about 20 times. A generator is a barrier it
    # keeps. Both parses (snapshot and position) sit inside it: an operator holding a from_json runs without
    # whole-stage codegen, so with the position parsed outside, the checks and projections below ran row by row
    # (and parsed each position several times).
    text = F.col("value").cast("string")
    parsed = typed.select(
        "*",
        F.inline(
            F.array(
                F.struct(
                    F.when(
                        ~is_position(), F.from_json(text, PARTITION_SNAPSHOT_SCHEMA, {"mode": "PERMISSIVE"})
                    ).alias("snapshot"),
                    F.when(is_position(), F.from_json(text, POSITION_SCHEMA, {"mode": "PERMISSIVE"})).alias(
                        "position"
                    ),
                )
            )
        ),
    )
    # from_json yields a struct of nulls for text that is not JSON at all.
    parsed = parsed.withColumn(
        "snapshot",
        F.when(F.col("snapshot")["schema_version"].isNull(), F.lit(None)).otherwise(F.col("snapshot")),
    )
    return parsed.withColumn(
        "problem",
        F.when(
            is_position(),
            F.coalesce(_position_problem(F.col("position")), _other_cluster(F.col("position"), cluster)),
        ).otherwise(
            F.coalesce(_snapshot_problem(F.col("snapshot")), _other_cluster(F.col("snapshot"), cluster))
        ),
    )


# The dead letters' `source` of a snapshot-topic record; a coordinator input's is its name (streaming.job).
SNAPSHOT_SOURCE = "producer-state"


def snapshot_dead_letters(parsed: DataFrame) -> DataFrame:
    return parsed.where(F.col("problem").isNotNull()).select(
        F.lit(SNAPSHOT_SOURCE).alias("source"),
        F.col("topic").alias("source_topic"),
        F.col("partition").alias("source_partition"),
        F.col("offset").alias("source_offset"),
        F.concat(
            F.when(is_position(), F.lit("malformed CoordinatorLogPosition: ")).otherwise(
                F.lit("malformed PartitionSnapshot: ")
            ),
            F.col("problem"),
        ).alias("error"),
        "key",
        "value",
    )


def good_snapshots(parsed: DataFrame) -> DataFrame:
    return parsed.where(F.col("problem").isNull() & ~is_position()).select("snapshot.*")


def good_snapshots_and_positions(parsed: DataFrame) -> DataFrame:
    """The reconcile query's snapshot input: good snapshots flattened, plus `is_position`, `position_json` and
    `position_as_of_ms` (set on position rows only)."""
    return parsed.where(F.col("problem").isNull()).select(
        "snapshot.*",
        is_position().alias("is_position"),
        F.when(is_position(), F.col("value").cast("string")).alias("position_json"),
        F.col("position")["as_of_ms"].alias("position_as_of_ms"),
    )


# ------------------------------------------------------------------------------ coordinator records


def _arrow_type(data_type: T.DataType) -> pa.DataType:
    if isinstance(data_type, T.LongType):
        return pa.int64()
    if isinstance(data_type, T.IntegerType):
        return pa.int32()
    if isinstance(data_type, T.StringType):
        return pa.string()
    if isinstance(data_type, T.BooleanType):
        return pa.bool_()
    if isinstance(data_type, T.BinaryType):
        return pa.binary()
    if isinstance(data_type, T.ArrayType):
        return pa.list_(_arrow_type(data_type.elementType))
    if isinstance(data_type, T.StructType):
        return pa.struct([pa.field(f.name, _arrow_type(f.dataType)) for f in data_type.fields])
    raise TypeError(f"no Arrow type for {data_type}")


DECODED_SCHEMA = T.StructType(
    [
        # All nullable: a row that does not decode has only its error, raw bytes and origin.
        *(T.StructField(f.name, f.dataType, True) for f in COORDINATOR_RECORD_SCHEMA.fields),
        T.StructField("error", T.StringType(), True),
        T.StructField("key", T.BinaryType(), True),
        T.StructField("value", T.BinaryType(), True),
        T.StructField("kafka_topic", T.StringType(), True),
        T.StructField("kafka_partition", T.IntegerType(), True),
        T.StructField("kafka_offset", T.LongType(), True),
        # the offset read before it from the same partition, when that is not the one before (`read_after`)
        T.StructField("kafka_read_after", T.LongType(), True),
    ]
)
# The decoded columns: CoordinatorRecord's fields (same names and types as the JSON fallback) plus the raw
# bytes, where they came from and the decode error, so bad rows can go to the dead-letter topic untouched.
DECODED_ARROW_SCHEMA = pa.schema([pa.field(f.name, _arrow_type(f.dataType)) for f in DECODED_SCHEMA.fields])
_MARKS_INDEX = DECODED_ARROW_SCHEMA.get_field_index("began_since")
_MARKS_TYPE = DECODED_ARROW_SCHEMA.field("began_since").type


# The decoded fields, in the order `_decode_fields` returns them; the other columns come from the input as they are.
_DECODED_FIELDS = (
    "transactional_id",
    "producer_id",
    "producer_epoch",
    "previous_producer_id",
    "next_producer_id",
    "client_transaction_version",
    "transaction_timeout_ms",
    "state",
    "partitions",
    "last_update_timestamp_ms",
    "start_timestamp_ms",
    "tombstone",
)


def _decode_fields(key: bytes | None, value: bytes | None, ts_ms: int) -> tuple[Any, ...]:
    """One `__transaction_state` record → the values of _DECODED_FIELDS (raises DecodeError or ValueError).

    `CoordinatorRecord.from_log_value` without pydantic, for the hot path (tests/unit/test_reconcile.py holds
    the two equal)."""
    if key is None:
        raise DecodeError("record has no key")
    transactional_id = decode_key(key).transactional_id
    v = decode_value(value)
    if v is None:  # tombstone: the coordinator expired the transactional id
        return (transactional_id, -1, -1, -1, -1, 0, -1, None, [], ts_ms, -1, True)
    return (
        transactional_id,
        v.producer_id,
        v.producer_epoch,
        v.previous_producer_id,
        v.next_producer_id,
        v.client_transaction_version,
        v.transaction_timeout_ms,
        CoordinatorState.from_status(int(v.status)).value,
        # sorted by topic, then partition, as CoordinatorRecord.from_log_value does (Kafka lists each topic once)
        [{"topic": t, "partition": p} for t, ids in sorted(v.partitions or ()) for p in sorted(ids)],
        v.last_update_timestamp_ms,
        v.start_timestamp_ms,
        False,
    )


def _key_id(key: bytes | None) -> str | None:
    """The transactional id of a record key, or None if the key does not decode either."""
    if key is None:
        return None
    try:
        return decode_key(key).transactional_id
    except DecodeError:
        return None


def read_after(partitions: Sequence[int], offsets: Sequence[int], last: dict[int, int]) -> list[int | None]:
    """Per row (in read order): None when its offset is the one after the row read before it from the same
    partition; else that row's offset, or -1 for the first row this reader saw of the partition. A compacted topic
    has gaps where the cleaner removed records (a non-transactional topic has no other; `__transaction_state`
    and the collector's coordinator-state topic are both compacted). `last` carries each partition's last offset
    from one Arrow batch to the next of the same task (a task reads each of its partitions' ranges in order)."""
    out: list[int | None] = []
    for partition, offset in zip(partitions, offsets, strict=True):
        before = last.get(partition, -1)
        out.append(None if before >= 0 and offset == before + 1 else before)
        last[partition] = offset
    return out


def decode_batches(batches: Iterator[pa.RecordBatch], compact: bool = False) -> Iterator[pa.RecordBatch]:
    """mapInArrow body: raw `__transaction_state` rows → DECODED_SCHEMA rows (runs on executors).

    Built column by column: only the decoded fields pass through Python objects; where a record came from is
    copied from the input arrays, and the raw bytes are kept only for rows that did not decode (dead letters).
    A row that did not decode keeps the transactional id of its key when the key alone decodes (a value version
    txnwatch does not know): which id the view may now miss a record of (docs/detection.md, "Records that do not
    decode").
    `compact` keeps only the records stage 1 needs (`run_ends`), within each Arrow batch: a Kafka partition's
    records come in offset order, and all records of a transactional id are in one partition. A row after a
    break in the offsets (`read_after`) is always kept: stage 2 needs every one (`ViewCurrency.read`).
    """
    last: dict[int, int] = {}
    for batch in batches:
        n = batch.num_rows
        decoded: list[list[Any]] = [[] for _ in _DECODED_FIELDS]
        errors: list[str | None] = []
        key_ids: list[str | None] = []  # the transactional id, also for a row whose value did not decode
        for key, value, ts_ms in zip(
            batch.column("key").to_pylist(),
            batch.column("value").to_pylist(),
            batch.column("ts_ms").to_pylist(),
            strict=True,
        ):
            try:
                fields: tuple[Any, ...] = _decode_fields(key, value, ts_ms)
                errors.append(None)
                key_ids.append(fields[0])
            except (DecodeError, ValueError) as exc:
                fields = (None,) * len(_DECODED_FIELDS)
                errors.append(f"undecodable {TRANSACTION_LOG_TOPIC} record: {exc}")
                key_ids.append(_key_id(key))
            for column, item in zip(decoded, fields, strict=True):
                column.append(item)
        bad = pa.array([e is not None for e in errors], pa.bool_())
        partition = batch.column("partition")
        after = read_after(partition.to_pylist(), batch.column("offset").to_pylist(), last)
        columns = {
            **{
                name: pa.array(col, DECODED_ARROW_SCHEMA.field(name).type)
                for name, col in zip(_DECODED_FIELDS, decoded, strict=True)
            },
            "transactional_id": pa.array(key_ids, pa.string()),
            # set by stage 1 from the Prepare record before a Complete one (detectors.tracking.with_prepared)
            "prepared_partitions": pa.nulls(n, DECODED_ARROW_SCHEMA.field("prepared_partitions").type),
            # set by stage 1 from the Prepare records it folds (detectors.tracking.advance_owners)
            "listed_since": pa.nulls(n, DECODED_ARROW_SCHEMA.field("listed_since").type),
            "completed_since": pa.nulls(n, DECODED_ARROW_SCHEMA.field("completed_since").type),
            "began_since": pa.nulls(n, _MARKS_TYPE),
            "schema_version": pa.nulls(n, pa.int64()).fill_null(SCHEMA_VERSION),
            "source_partition": partition.cast(pa.int64()),
            "source_offset": batch.column("offset"),
            "source_timestamp_ms": batch.column("ts_ms"),
            "origin": pa.nulls(n, pa.string()).fill_null("transaction-log"),
            "error": pa.array(errors, pa.string()),
            "key": pc.if_else(bad, batch.column("key"), pa.scalar(None, pa.binary())),
            "value": pc.if_else(bad, batch.column("value"), pa.scalar(None, pa.binary())),
            "kafka_topic": batch.column("topic"),
            "kafka_partition": partition.cast(pa.int32()),
            "kafka_offset": batch.column("offset"),
            "kafka_read_after": pa.array(after, pa.int64()),
        }
        out = pa.RecordBatch.from_arrays(
            [columns[f.name].cast(f.type) for f in DECODED_ARROW_SCHEMA], schema=DECODED_ARROW_SCHEMA
        )
        if compact:  # decoded[0] has no id for a row that did not decode: run_ends keeps every such row
            keep = run_ends(
                decoded[0],
                decoded[1],
                decoded[-1],
                decoded[_DECODED_FIELDS.index("state")],
                decoded[_DECODED_FIELDS.index("partitions")],
            )
            kept = [k or a is not None for k, a in zip(keep, after, strict=True)]
            marks = begin_marks(
                decoded[0],
                decoded[1],
                decoded[_DECODED_FIELDS.index("start_timestamp_ms")],
                batch.column("offset").to_pylist(),
                kept,
            )
            if any(m is not None for m in marks):
                out = out.set_column(_MARKS_INDEX, "began_since", _marks_array(marks))
            out = out.filter(pa.array(kept, pa.bool_()))
        yield out


def _marks_array(marks: list[list[tuple[int, int]] | None]) -> pa.Array:
    """The `began_since` column of a batch (`detectors.began.begin_marks`)."""
    rows = [None if m is None else [{"start_timestamp_ms": s, "offset": o} for s, o in m] for m in marks]
    return pa.array(rows, _MARKS_TYPE)


def in_tasks(raw: DataFrame, tasks: int | None) -> DataFrame:
    """`raw` read by at most `tasks` Spark tasks (None: one per Kafka partition, as Kafka's source plans it).

    A coalesce, not a shuffle: each task reads its Kafka partitions one after the other, each in offset order,
    which is all the decoders rely on (`read_after`, `run_ends`)."""
    return raw if tasks is None else raw.coalesce(tasks)


def decode_transaction_log(raw: DataFrame, *, compact: bool = False, tasks: int | None = None) -> DataFrame:
    """Kafka rows of `__transaction_state` → decoded coordinator records (with `error` set on bad rows).

    `compact=True` drops the records the reconcile stages would overwrite anyway (`run_ends`): the job's
    input. Without it every record comes out (inspection, tests). `tasks`: see `in_tasks`.
    """
    slim = in_tasks(raw, tasks).select(
        "key", "value", "topic", "partition", "offset", (F.unix_millis(F.col("timestamp"))).alias("ts_ms")
    )
    return slim.mapInArrow(functools.partial(decode_batches, compact=compact), DECODED_SCHEMA)


def _with_read_breaks(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """mapInArrow body: the rows as they are, plus `kafka_read_after` (`read_after`)."""
    last: dict[int, int] = {}
    for batch in batches:
        after = read_after(batch.column("partition").to_pylist(), batch.column("offset").to_pylist(), last)
        yield pa.RecordBatch.from_arrays(
            [*batch.columns, pa.array(after, pa.int64())], names=[*batch.schema.names, "kafka_read_after"]
        )


def parse_coordinator_json(raw: DataFrame, *, tasks: int | None = None) -> DataFrame:
    """The collector's fallback topic (CoordinatorRecord JSON) → the same columns as the decoded log. That topic
    is compacted too, so where its reading breaks is marked as for the log (`read_after`). `tasks`: `in_tasks`."""
    raw = in_tasks(raw, tasks).mapInArrow(
        _with_read_breaks, raw.schema.add("kafka_read_after", T.LongType(), True)
    )
    parsed = raw.select(  # parsed once: see parse_snapshots
        "*",
        F.explode(
            F.array(
                F.from_json(F.col("value").cast("string"), COORDINATOR_RECORD_SCHEMA, {"mode": "PERMISSIVE"})
            )
        ).alias("r"),
    )
    r = F.col("r")
    problem = (
        F.when(r["schema_version"].isNull(), F.lit("not JSON"))
        .when(r["schema_version"] != SCHEMA_VERSION, F.lit(f"schema_version is not {SCHEMA_VERSION}"))
        .when(
            r["transactional_id"].isNull()
            | r["producer_id"].isNull()
            | r["tombstone"].isNull()
            | r["last_update_timestamp_ms"].isNull(),
            F.lit("missing or mistyped CoordinatorRecord fields"),
        )
    )
    return parsed.select(
        *[r[f.name].alias(f.name) for f in COORDINATOR_RECORD_SCHEMA.fields],
        F.when(problem.isNotNull(), F.concat(F.lit("malformed CoordinatorRecord: "), problem)).alias("error"),
        "key",
        "value",
        F.col("topic").alias("kafka_topic"),
        F.col("partition").alias("kafka_partition"),
        F.col("offset").alias("kafka_offset"),
        "kafka_read_after",
    )


def coordinator_dead_letters(decoded: DataFrame, source: str) -> DataFrame:
    return decoded.where(F.col("error").isNotNull()).select(
        F.lit(source).alias("source"),
        F.col("kafka_topic").alias("source_topic"),
        F.col("kafka_partition").alias("source_partition"),
        F.col("kafka_offset").alias("source_offset"),
        F.col("error"),
        "key",
        "value",
    )


def good_coordinator_records(decoded: DataFrame) -> DataFrame:
    return decoded.where(F.col("error").isNull()).select(*[f.name for f in COORDINATOR_RECORD_SCHEMA.fields])


def coordinator_rows_read(decoded: DataFrame) -> DataFrame:
    """The reconcile query's coordinator input: every row read, with where it was read (`read_topic`,
    `read_partition`, `read_offset`). A row that did not decode keeps only that and the transactional id its key
    names, if any (its other record fields are null, `producer_id` among them): it goes to the dead-letter
    query, and it counts towards how far the view has read, or one bad last record would keep a partition from
    ever being current. But it is not applied: its content is lost, so stage 1 marks its id (or, with no id,
    its partition) as missing a record until a decodable one supersedes it (detectors/currency.py), and no
    verdict that depends on it is a proof."""
    good = F.col("error").isNull()
    return decoded.select(
        *[
            F.col(f.name) if f.name == "transactional_id" else F.when(good, F.col(f.name)).alias(f.name)
            for f in COORDINATOR_RECORD_SCHEMA.fields
        ],
        F.col("kafka_topic").alias("read_topic"),
        F.col("kafka_partition").cast("long").alias("read_partition"),
        F.col("kafka_offset").alias("read_offset"),
        F.col("kafka_read_after").alias("read_after"),
    )
