"""The streaming job's pieces on real Spark with small inputs: schemas vs. models, decoding, the two stateful
stages, the KIP-664 windows (checked against detectors.kip664)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from detectors import kip664
from detectors.codec import TxnLogKey, TxnLogValue, TxnStatus, encode_key, encode_value
from detectors.models import (
    CoordinatorLogPosition,
    CoordinatorRecord,
    CoordinatorState,
    DetectionLimits,
    OpenTransaction,
    PartitionSnapshot,
    TopicPartition,
)
from detectors.tracking import ReconcileConfig
from streaming import sources
from streaming.reconcile import reconcile_events
from streaming.schemas import COORDINATOR_RECORD_SCHEMA, PARTITION_SNAPSHOT_SCHEMA
from streaming.windows import window_metrics

pytestmark = pytest.mark.spark

NOW = int(time.time() * 1000)
LIMITS = DetectionLimits(grace_ms=10_000, clock_skew_ms=1_000)


def snapshot(
    topic: str, partition: int, observed_at_ms: int, *txns: OpenTransaction, leader: int = 1
) -> PartitionSnapshot:
    return PartitionSnapshot(
        cluster="c",
        sweep_id="s",
        observed_at_ms=observed_at_ms,
        leader=leader,
        topic=topic,
        partition=partition,
        open_transactions=txns,
        last_stable_offset=5,
        high_watermark=9,
        max_transaction_timeout_ms=60_000,
    )


def txn(pid: int, start_ms: int, *, epoch: int = 0, offset: int = 5) -> OpenTransaction:
    return OpenTransaction(
        producer_id=pid,
        producer_epoch=epoch,
        start_offset=offset,
        start_timestamp_ms=start_ms,
        start_batch_producer_epoch=epoch,
        last_timestamp_ms=start_ms,
    )


def txn_at(pid: int, start_ms: int | None, last_ms: int, *, offset: int = 5) -> OpenTransaction:
    """An open transaction with its start batch timestamp and LastTimestamp set independently."""
    return OpenTransaction(
        producer_id=pid,
        producer_epoch=0,
        start_offset=offset,
        start_timestamp_ms=start_ms,
        last_timestamp_ms=last_ms,
    )


def coordinator(
    txn_id: str,
    pid: int,
    state: CoordinatorState,
    updated_ms: int,
    offset: int,
    *partitions: tuple[str, int],
    timeout_ms: int = 60_000,
) -> CoordinatorRecord:
    return CoordinatorRecord(
        transactional_id=txn_id,
        producer_id=pid,
        producer_epoch=0,
        transaction_timeout_ms=timeout_ms,
        state=state,
        partitions=tuple(TopicPartition(topic=t, partition=p) for t, p in partitions),
        last_update_timestamp_ms=updated_ms,
        start_timestamp_ms=updated_ms - 1_000,
        source_partition=0,
        source_offset=offset,
        source_timestamp_ms=updated_ms,
    )


def test_spark_schemas_carry_the_models_json_unchanged(spark: SparkSession) -> None:
    snap = snapshot("t", 3, NOW, txn(7, NOW - 5_000), txn(8, NOW - 1_000, epoch=2, offset=9))
    rec = coordinator("x", 7, CoordinatorState.ONGOING, NOW, 4, ("t", 3), ("u", 0))
    for model, schema in ((snap, PARTITION_SNAPSHOT_SCHEMA), (rec, COORDINATOR_RECORD_SCHEMA)):
        df = spark.createDataFrame([(model.model_dump_json(),)], "j string")
        back = df.select(F.to_json(F.from_json("j", schema)).alias("j")).first()
        assert back is not None
        assert type(model).model_validate_json(back.j) == model


def test_transaction_log_decoding_matches_the_codec_and_isolates_bad_rows(spark: SparkSession) -> None:
    value = TxnLogValue(
        version=1,
        producer_id=42,
        producer_epoch=3,
        transaction_timeout_ms=60_000,
        status=TxnStatus.ONGOING,
        partitions=(("orders", (0, 2)),),
        last_update_timestamp_ms=NOW,
        start_timestamp_ms=NOW - 10,
        client_transaction_version=2,
    )
    rows = [
        (encode_key(TxnLogKey("tx-1")), encode_value(value), "__transaction_state", 0, 10, NOW),
        (encode_key(TxnLogKey("tx-2")), None, "__transaction_state", 0, 11, NOW),  # tombstone
        (b"\x00\x00\x00\x03abc", b"\x00\x01\xff", "__transaction_state", 0, 12, NOW),  # truncated value
    ]
    raw = spark.createDataFrame(
        rows, "key binary, value binary, topic string, partition int, offset long, ms long"
    )
    raw = raw.withColumn("timestamp", F.timestamp_millis("ms")).drop("ms")
    decoded = {r.kafka_offset: r for r in sources.decode_transaction_log(raw).collect()}
    good = decoded[10]
    assert good.error is None
    assert (good.transactional_id, good.producer_id, good.producer_epoch, good.state) == (
        "tx-1",
        42,
        3,
        "Ongoing",
    )
    assert [(p.topic, p.partition) for p in good.partitions] == [("orders", 0), ("orders", 2)]
    assert good.client_transaction_version == 2
    assert decoded[11].tombstone is True and decoded[11].error is None
    assert decoded[12].error.startswith("undecodable __transaction_state record")
    assert decoded[12].value == b"\x00\x01\xff"  # the raw bytes travel to the dead-letter topic


def test_snapshot_parsing_separates_dead_letters(spark: SparkSession) -> None:
    good = snapshot("t", 0, NOW, txn(7, NOW)).model_dump_json().encode()
    header = [("txnwatch.type", bytearray(b"partition-snapshot"))]
    summary = [("txnwatch.type", bytearray(b"broker-sweep-summary"))]
    rows = [
        (b"t-0", good, "ps", 0, 1, header),
        (b"t-0", b"{oops", "ps", 0, 2, header),
        (b"t-0", json.dumps({"schema_version": 1, "cluster": "c"}).encode(), "ps", 0, 3, header),
        (b"__sweep__-broker-1", b"{}", "ps", 0, 4, summary),
    ]
    raw = spark.createDataFrame(
        rows,
        "key binary, value binary, topic string, partition int, offset long, "
        "headers array<struct<key:string,value:binary>>",
    )
    parsed = sources.parse_snapshots(raw)
    assert [r.topic for r in sources.good_snapshots(parsed).collect()] == ["t"]
    dead = {r.source_offset: r.error for r in sources.snapshot_dead_letters(parsed).collect()}
    assert dead == {
        2: "malformed PartitionSnapshot: not JSON",
        3: "malformed PartitionSnapshot: missing or mistyped PartitionSnapshot fields",
    }


def test_snapshots_and_positions_of_another_cluster_are_refused_as_dead_letters(spark: SparkSession) -> None:
    """A mirrored or shared producer-state topic: records of cluster "other" beside the job's "c". Before the
    check they were judged with the job's own (another cluster's position vouching for this cluster's view)."""
    header = [("txnwatch.type", bytearray(b"coordinator-log-position"))]

    def position(cluster: str) -> bytes:
        return (
            CoordinatorLogPosition(
                cluster=cluster,
                sweep_id="s",
                topic="__transaction_state",
                partitions=1,
                as_of_ms=7,
                end_offsets={},
            )
            .model_dump_json()
            .encode()
        )

    ours = snapshot("t", 0, NOW).model_copy(update={"cluster": "c"})
    theirs = ours.model_copy(update={"cluster": "other"})
    rows = [
        (b"t-0", ours.model_dump_json().encode(), "ps", 0, 1, []),
        (b"t-0", theirs.model_dump_json().encode(), "ps", 0, 2, []),
        (b"p", position("c"), "ps", 0, 3, header),
        (b"p", position("other"), "ps", 0, 4, header),
    ]
    raw = spark.createDataFrame(
        rows,
        "key binary, value binary, topic string, partition int, offset long, "
        "headers array<struct<key:string,value:binary>>",
    )
    parsed = sources.parse_snapshots(raw, cluster="c")
    assert [(r.is_position, r.cluster) for r in sources.good_snapshots_and_positions(parsed).collect()] == [
        (False, "c"),
        (True, None),
    ]
    dead = {r.source_offset: r.error for r in sources.snapshot_dead_letters(parsed).collect()}
    refused = "from cluster 'other', not this job's 'c' (a mirrored or shared producer-state topic? refused)"
    assert dead == {
        2: f"malformed PartitionSnapshot: {refused}",
        4: f"malformed CoordinatorLogPosition: {refused}",
    }


def test_positions_ride_with_the_snapshots_and_bad_ones_are_dead_letters(spark: SparkSession) -> None:
    header = [("txnwatch.type", bytearray(b"coordinator-log-position"))]
    good = CoordinatorLogPosition(
        cluster="c",
        sweep_id="s",
        topic="__transaction_state",
        partitions=2,
        as_of_ms=7,
        end_offsets={1: 4},
        log_end_offsets={1: 5},
    ).model_dump_json()
    out_of_range = json.loads(good) | {"end_offsets": {"2": 4}}
    bad_log_end = json.loads(good) | {"log_end_offsets": {"1": -1}}
    older = {k: v for k, v in json.loads(good).items() if k != "log_end_offsets"}  # an earlier collector's
    rows = [
        (b"p", good.encode(), "ps", 0, 1, header),
        (b"p", json.dumps(out_of_range).encode(), "ps", 0, 2, header),
        (b"p", b"[]", "ps", 0, 3, header),
        (b"t-0", snapshot("t", 0, NOW).model_dump_json().encode(), "ps", 0, 4, []),
        (b"p", json.dumps(bad_log_end).encode(), "ps", 0, 5, header),
        (b"p", json.dumps(older).encode(), "ps", 0, 6, header),
    ]
    raw = spark.createDataFrame(
        rows,
        "key binary, value binary, topic string, partition int, offset long, "
        "headers array<struct<key:string,value:binary>>",
    )
    parsed = sources.parse_snapshots(raw)
    assert [r.topic for r in sources.good_snapshots(parsed).collect()] == ["t"]
    both = sources.good_snapshots_and_positions(parsed).collect()
    assert [(r.is_position, r.position_as_of_ms) for r in both] == [(True, 7), (False, None), (True, 7)]
    assert json.loads(both[0].position_json)["end_offsets"] == {"1": 4}
    assert json.loads(both[0].position_json)["log_end_offsets"] == {"1": 5}
    dead = {r.source_offset: r.error for r in sources.snapshot_dead_letters(parsed).collect()}
    assert dead == {
        2: "malformed CoordinatorLogPosition: end_offsets must map partitions 0..partitions-1 to offsets >= 0",
        3: "malformed CoordinatorLogPosition: not JSON",
        5: "malformed CoordinatorLogPosition: log_end_offsets must map partitions 0..partitions-1 to offsets >= 0",
    }


def _file_stream(spark: SparkSession, directory: Path, schema: T.StructType) -> DataFrame:
    directory.mkdir(parents=True, exist_ok=True)
    return spark.readStream.schema(schema).json(str(directory))


def _await_rows(query, rows: int, timeout_s: float = 240) -> None:  # type: ignore[no-untyped-def]
    """Wait until the query has read `rows` input rows and waits for more (no batch running, none due).

    The job's conf runs no batch without new records (`spark.sql.streaming.noDataMicroBatches.enabled` off), so
    the query is then idle until the next file arrives.
    """
    deadline = time.monotonic() + timeout_s
    read = 0
    while time.monotonic() < deadline:
        progress = query.recentProgress
        read = sum(p["numInputRows"] for p in progress)
        status = query.status
        if read >= rows and not status["isTriggerActive"] and not status["isDataAvailable"]:
            return
        time.sleep(0.5)
    raise AssertionError(f"query read {read} of {rows} rows in {timeout_s}s")


def _publish(directory: Path, name: str, lines: list[str]) -> None:
    tmp = directory / f".{name}.tmp"
    tmp.write_text("\n".join(lines) + "\n")
    os.rename(tmp, directory / f"{name}.json")  # atomic: the file source never sees half a file


def test_two_stateful_stages_turn_records_and_snapshots_into_verdicts(
    spark: SparkSession, tmp_path: Path
) -> None:
    now = int(time.time() * 1000)  # processing time drives stage 2: be near it
    coords_dir, snaps_dir, pos_dir = tmp_path / "coords", tmp_path / "snaps", tmp_path / "positions"
    # As the job reads them: every coordinator row says where it was read (here: __transaction_state-0 at
    # its source offset), and the collector's positions come with the snapshots.
    coords = _file_stream(spark, coords_dir, COORDINATOR_RECORD_SCHEMA).select(
        "*",
        F.lit("__transaction_state").alias("read_topic"),
        F.lit(0).cast("long").alias("read_partition"),
        F.col("source_offset").alias("read_offset"),
    )
    snaps = _file_stream(spark, snaps_dir, PARTITION_SNAPSHOT_SCHEMA).select(
        "*",
        F.lit(False).alias("is_position"),
        F.lit(None).cast("string").alias("position_json"),
        F.lit(None).cast("long").alias("position_as_of_ms"),
    )
    positions = _file_stream(spark, pos_dir, sources.POSITION_SCHEMA).select(
        *[F.lit(None).cast(f.dataType).alias(f.name) for f in PARTITION_SNAPSHOT_SCHEMA.fields],
        F.lit(True).alias("is_position"),
        F.to_json(F.struct("*")).alias("position_json"),
        F.col("as_of_ms").alias("position_as_of_ms"),
    )
    config = ReconcileConfig(
        limits=LIMITS, expire_after_ms=600_000, view_ttl_ms=3_600_000, bootstrap="b:9092"
    )
    events = reconcile_events(snaps.unionByName(positions), coords, config, buckets=4)
    out: list = []
    query = (
        events.writeStream.foreachBatch(lambda df, _: out.extend(df.collect()))
        .option("checkpointLocation", str(tmp_path / "ck"))
        .start()
    )
    try:
        _publish(
            coords_dir,
            "0",
            [
                # 7: its transaction completed a minute ago -> an open transaction seen now is hanging.
                coordinator("done", 7, CoordinatorState.COMPLETE_COMMIT, now - 60_000, 1).model_dump_json(),
                # 8 then 9: the transactional id moved to a new producer id -> 8 is retired.
                coordinator("moved", 8, CoordinatorState.COMPLETE_ABORT, now - 90_000, 2).model_dump_json(),
                coordinator("moved", 9, CoordinatorState.EMPTY, now - 60_000, 3).model_dump_json(),
                # 10: ongoing and owns the partition -> not hanging (a 15-minute timeout: a slow first batch
                # on a busy machine must not make it COORDINATOR_OVERDUE).
                coordinator(
                    "live", 10, CoordinatorState.ONGOING, now - 2_000, 4, ("t", 2), timeout_ms=900_000
                ).model_dump_json(),
            ],
        )
        _publish(
            snaps_dir,
            "0",
            [
                snapshot("t", 0, now - 20_000, txn(7, now - 25_000)).model_dump_json(),
                snapshot("t", 1, now - 20_000, txn(8, now - 25_000)).model_dump_json(),
                snapshot("t", 2, now - 20_000, txn(10, now - 3_000)).model_dump_json(),
            ],
        )
        _await_rows(query, 7)
        _publish(
            snaps_dir,
            "1",
            [
                snapshot("t", 0, now, txn(7, now - 25_000)).model_dump_json(),
                snapshot("t", 1, now, txn(8, now - 25_000)).model_dump_json(),
                snapshot("t", 2, now, txn(10, now - 3_000)).model_dump_json(),
            ],
        )
        _await_rows(query, 10)
        # No position yet: nothing is proven, the would-be HANGING ones are withheld.
        withheld = {r.producer_id: (r.kind, r.reason, r.withheld) for r in out if r.event == "VERDICT"}
        assert withheld[7] == ("UNCONFIRMED", "coordinator-completed", "coordinator-view-behind")
        assert not [r for r in out if r.event == "OPENED"]
        # The collector measured the log (offsets 1..4 written, so it ends at 5) after both snapshots.
        position = CoordinatorLogPosition(
            cluster="c",
            sweep_id="s",
            topic="__transaction_state",
            partitions=1,
            as_of_ms=now,
            end_offsets={0: 5},
        )
        _publish(pos_dir, "0", [position.model_dump_json()])
        _await_rows(query, 11)
    finally:
        query.stop()
    latest = {}
    for r in out:
        if r.event == "VERDICT":
            latest[r.producer_id] = (r.kind, r.reason)
    assert latest[7] == ("HANGING", "coordinator-completed")
    assert latest[8] == ("HANGING", "no-coordinator-state")
    assert latest[10][0] == "OPEN"
    opened = [r for r in out if r.event == "OPENED"]
    assert sorted(r.producer_id for r in opened) == [7, 8]  # exactly one OPENED each, over two batches
    assert all("--start-offset 5" in json.loads(r.payload)["kafka_cli"] for r in opened)


def test_windows_agree_with_detectors_kip664(spark: SparkSession, tmp_path: Path) -> None:
    snaps_dir = tmp_path / "snaps"
    stream = _file_stream(spark, snaps_dir, PARTITION_SNAPSHOT_SCHEMA)
    snapshots = [
        snapshot("t", 0, NOW, txn(1, NOW - 61_000)),  # late: 61 s > 60 s
        snapshot("t", 1, NOW, txn(2, NOW - 60_000)),  # exactly the threshold: not late
        snapshot("t", 2, NOW, txn(3, NOW - 5_000), txn(4, NOW - 70_000), leader=2),  # late, by its oldest
        snapshot("t", 3, NOW),  # nothing open
        # Non-positive timestamps are unknown (Kafka's NO_TIMESTAMP is -1): an unknown age is duration 0 and
        # never late (detectors.models.open_since_ms, detectors.lateness.age_ms), not 55 years since the epoch.
        snapshot("t", 4, NOW, txn_at(5, None, -1), leader=3),  # no start batch, no LastTimestamp
        snapshot("t", 5, NOW, txn_at(6, 0, -1), leader=3),  # start 0 is unknown too
        snapshot("t", 6, NOW, txn_at(7, -1, NOW - 61_000), leader=3),  # start -1: LastTimestamp, late
        snapshot("t", 7, NOW, txn_at(8, 0, NOW - 5_000), leader=3),  # start 0: LastTimestamp, timely
        snapshot("t", 8, NOW, txn_at(9, None, NOW - 61_000), leader=3),  # no start batch: LastTimestamp, late
        snapshot("t", 9, NOW, txn_at(10, None, 0), leader=3),  # LastTimestamp 0 is unknown
        # an unknown age next to a known one: the known one is the partition's duration
        snapshot("t", 10, NOW, txn_at(11, None, -1), txn(12, NOW - 5_000), leader=3),
        # Event time: records stamped 2 h ago on a transaction the collector saw open after its report 3 s ago
        # (aged 3 s, not late); stamped in the future, aged from the collector's first report of it open; an
        # unknown time with a known opening.
        snapshot("t", 11, NOW, txn(13, NOW - 7_200_000).model_copy(update={"opened_after_ms": NOW - 3_000})),
        snapshot("t", 12, NOW, txn(14, NOW + 600_000).model_copy(update={"seen_open_ms": NOW - 70_000})),
        snapshot("t", 13, NOW, txn_at(15, None, -1).model_copy(update={"opened_after_ms": NOW - 4_000})),
    ]
    out: list = []
    query = (
        window_metrics(stream, LIMITS, window="1 minute", watermark="1 minute")
        .writeStream.outputMode("update")
        .foreachBatch(lambda df, _: out.extend(df.collect()))
        .option("checkpointLocation", str(tmp_path / "ck"))
        .start()
    )
    try:
        _publish(snaps_dir, "0", [s.model_dump_json() for s in snapshots])
        query.processAllAvailable()
    finally:
        query.stop()
    ours = {r.partition: r.newest for r in out}
    durations = {s.partition: kip664.partition_duration_ms(s, now_ms=NOW) for s in snapshots}
    expected = {p: d for p, d in durations.items() if d is not None}
    assert {p: n.duration_ms for p, n in ours.items() if n.open_count > 0} == expected
    # One snapshot per partition: the window's longest is the newest snapshot's.
    assert {r.partition: r.window_max_duration_ms for r in out if r.newest.open_count > 0} == expected
    # detectors' own answers for the unknown timestamps, so this test notices if they ever change
    assert [expected[p] for p in (4, 5, 6, 7, 9, 10)] == [0, 0, 61_000, 5_000, 0, 5_000]
    assert [expected[p] for p in (11, 12, 13)] == [3_000, 70_000, 4_000]
    late = {
        s.partition for s in snapshots if kip664.partition_has_late_transaction(s, now_ms=NOW, limits=LIMITS)
    }
    assert {p for p, n in ours.items() if n.late} == late
    assert {p for p, n in ours.items() if n.late} == {0, 2, 6, 8, 12}
    assert {r.partition for r in out if r.window_any_late} == {0, 2, 6, 8, 12}


def test_a_checkpoint_keeps_its_state_bucket_count(spark: SparkSession, tmp_path: Path) -> None:
    from streaming.job import pin_state_buckets

    query_checkpoint = str(tmp_path / "txnwatch-reconcile")
    pin_state_buckets(spark, query_checkpoint, 32)  # a new checkpoint: remembered
    pin_state_buckets(spark, query_checkpoint, 32)  # the same count: fine
    with pytest.raises(SystemExit, match="--state-buckets 32, not 16"):
        pin_state_buckets(spark, query_checkpoint, 16)


def test_the_state_schemas_built_in_python_are_what_spark_parses(spark: SparkSession) -> None:
    """streaming.reconcile builds its state schemas without the JVM's parser (a round trip per state variable in
    every task); they must be the very schemas Spark parses from the same DDL, or a checkpoint's stored state
    schema would no longer match."""
    from pyspark.sql.types import _parse_datatype_string

    from streaming import reconcile

    for ddl in (
        reconcile.BLOB_SCHEMA,
        reconcile.OWNER_KEY_SCHEMA,
        reconcile.OWNER_SCHEMA,
        reconcile.VIEW_KEY_SCHEMA,
        reconcile.VIEW_SCHEMA,
        "at_ms long",
        "run_id string",
    ):
        assert reconcile.struct(ddl) == _parse_datatype_string(ddl), ddl
