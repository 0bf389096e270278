"""`txnwatch stream`: three Structured Streaming queries on one SparkSession, plus the driver's /metrics.

- reconcile: snapshots + coordinator records → stage 1 (transactional id) → stage 2 (producer id) → verdicts,
  abort candidates (to the compacted candidates topic) and the live state behind the gauges;
- windows: snapshots → KIP-664 windows → the duration and late-partition gauges;
- dead-letter: malformed input of every source → the dead-letter topic and a counter.
Each has its own checkpoint under `--checkpoint-location`; a restart resumes state, timers and offsets.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, TextIO

from prometheus_client import CollectorRegistry
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from detectors.settings import Settings
from streaming import sources
from streaming.exporter import Health, HealthListener, LiveState, VerdictCollector, serve
from streaming.reconcile import (
    EVENT_COLUMNS,
    EVENT_SCHEMA,
    FACT_SCHEMA,
    STAGE1_INPUT_COLUMNS,
    STAGE2_INPUT_COLUMNS,
    ProducerIdFacts,
    ReconcileConfig,
    TransactionReconciler,
    bucket_of,
)
from streaming.schemas import COORDINATOR_RECORD_SCHEMA, PARTITION_SNAPSHOT_SCHEMA
from streaming.windows import window_metrics

log = logging.getLogger("txnwatch.stream")

TRANSACTION_LOG = "__transaction_state"
CoordinatorSource = Literal["log", "describe", "both"]


@dataclass(frozen=True)
class StreamOptions:
    """Everything `txnwatch stream` is told (flags over Settings)."""

    settings: Settings
    kafka_options: Mapping[str, str]  # Java client properties, without the "kafka." prefix
    checkpoint_location: str
    trigger: str = "5 seconds"
    # The windows and dead-letter queries: their outputs need no seconds-fresh answer, and on 2 cores every
    # batch they skip is CPU the reconcile query (detection latency) gets.
    secondary_trigger: str = "15 seconds"
    starting_offsets: str = (
        "latest"  # of the snapshot topic; the transaction log is always read from earliest
    )
    max_offsets_per_trigger: int | None = None
    # The coordinator topic's own bound (a first start on a large retained transaction log: smaller batches,
    # snapshots not held back); None: max_offsets_per_trigger.
    coordinator_max_offsets_per_trigger: int | None = None
    window: str = "1 minute"
    watermark: str = "2 minutes"
    expire_after_ms: int = 30_000
    view_ttl_ms: int = 24 * 3_600_000
    # Hash buckets of ids per stateful stage (streaming/reconcile.py says why). Fixed for a checkpoint.
    state_buckets: int = 32
    transaction_log_topic: str = TRANSACTION_LOG
    coordinator_source: CoordinatorSource = "log"
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 9465  # the collector's endpoint defaults to 9464
    command_config_path: str | None = None
    output: Literal["table", "json"] = "table"

    @property
    def spark_kafka_options(self) -> dict[str, str]:
        return {f"kafka.{k}": v for k, v in self.kafka_options.items()}


def spark_conf() -> dict[str, str]:
    return {
        # The default (AdminClient) offset reader drops internal topics, so it sees no partition of
        # __transaction_state; the consumer-based reader does not (tests/spark/test_kafka_connector.py).
        "spark.sql.streaming.kafka.useDeprecatedOffsetFetching": "true",
        # On 2 cores, three queries' Python workers start at once and can take longer than the 15 s default
        # to connect back ("Python worker failed to connect back").
        "spark.python.authenticate.socketTimeout": "120s",
    }


# --------------------------------------------------------------------------------------------- inputs


def _source(
    opts: StreamOptions, topic: str, starting: str, *, coordinator: bool = False
) -> sources.KafkaSource:
    limit = opts.max_offsets_per_trigger
    if coordinator and opts.coordinator_max_offsets_per_trigger is not None:
        limit = opts.coordinator_max_offsets_per_trigger
    return sources.KafkaSource(
        topic=topic,
        options=opts.spark_kafka_options,
        starting_offsets=starting,
        max_offsets_per_trigger=limit,
    )


def _snapshots(spark: SparkSession, opts: StreamOptions) -> DataFrame:
    raw = sources.read_kafka(spark, _source(opts, opts.settings.topics.producer_state, opts.starting_offsets))
    return sources.parse_snapshots(raw)


def _coordinator_inputs(spark: SparkSession, opts: StreamOptions) -> list[tuple[str, DataFrame]]:
    inputs = []
    if opts.coordinator_source in ("log", "both"):
        raw = sources.read_kafka(
            spark, _source(opts, opts.transaction_log_topic, "earliest", coordinator=True)
        )
        inputs.append(("transaction-log", sources.decode_transaction_log(raw, compact=True)))
    if opts.coordinator_source in ("describe", "both"):
        raw = sources.read_kafka(
            spark, _source(opts, opts.settings.topics.coordinator_state, "earliest", coordinator=True)
        )
        inputs.append(("coordinator-state", sources.parse_coordinator_json(raw)))
    return inputs


def _union(frames: list[DataFrame]) -> DataFrame:
    out = frames[0]
    for f in frames[1:]:
        out = out.unionByName(f)
    return out


_TXN_TYPE = PARTITION_SNAPSHOT_SCHEMA["open_transactions"].dataType.elementType  # type: ignore[attr-defined]


def open_transaction_rows(snapshots: DataFrame, buckets: int) -> DataFrame:
    """One row per open transaction: the columns stage 2 decides on, and a one-transaction PartitionSnapshot
    JSON it parses only to explain a new verdict or plan an abort. Given `sources.good_snapshots_and_positions`,
    each CoordinatorLogPosition also becomes one "position" row per stage-2 bucket (every bucket judges, so every
    bucket needs to know how current the coordinator view is)."""
    if "is_position" not in snapshots.columns:
        snapshots = snapshots.select(
            "*",
            F.lit(False).alias("is_position"),
            F.lit(None).cast("string").alias("position_json"),
            F.lit(None).cast("long").alias("position_as_of_ms"),
        )
    position = F.col("is_position")
    items = F.when(
        position,
        F.transform(
            F.sequence(F.lit(0), F.lit(buckets - 1)),
            lambda b: F.struct(F.lit(None).cast(_TXN_TYPE).alias("t"), b.cast("int").alias("b")),
        ),
    ).otherwise(
        F.transform("open_transactions", lambda t: F.struct(t.alias("t"), F.lit(None).cast("int").alias("b")))
    )
    s = snapshots.select("*", F.explode(items).alias("x")).select("*", F.col("x.t").alias("t"))
    one = F.struct(
        "schema_version",
        "cluster",
        "sweep_id",
        "observed_at_ms",
        "leader",
        "topic",
        "partition",
        F.array("t").alias("open_transactions"),
        "last_stable_offset",
        "high_watermark",
        "max_transaction_timeout_ms",
    )
    return s.select(
        F.coalesce(F.col("x.b"), bucket_of("t.producer_id", buckets)).alias("bucket"),
        F.coalesce(F.col("t.producer_id"), F.lit(-1)).alias("producer_id"),
        F.when(position, F.lit("position")).otherwise(F.lit("open")).alias("fact"),
        F.lit(None).cast("string").alias("transactional_id"),
        F.col("position_json").alias("record_json"),
        F.col("position_as_of_ms").alias("fact_time_ms"),
        "topic",
        "partition",
        F.when(~position, F.to_json(one)).alias("snapshot_json"),
        "observed_at_ms",
        "leader",
        F.col("t.start_offset").alias("start_offset"),
        F.col("t.producer_epoch").alias("producer_epoch"),
        F.col("t.start_batch_producer_epoch").alias("start_batch_producer_epoch"),
        F.col("t.start_timestamp_ms").alias("start_timestamp_ms"),
        F.col("t.last_timestamp_ms").alias("last_timestamp_ms"),
        "max_transaction_timeout_ms",
        (F.col("high_watermark") - F.col("last_stable_offset")).alias("lso_lag"),
    )


def fact_rows(facts: DataFrame, buckets: int) -> DataFrame:
    """Stage 1's facts as stage-2 rows: a fact about a producer id goes to its bucket; an "applied" fact (how far
    the coordinator topics were read) to every bucket."""
    none = {c: F.lit(None).cast("long") for c in STAGE2_INPUT_COLUMNS[6:]}
    none.update(topic=F.lit(None).cast("string"), snapshot_json=F.lit(None).cast("string"))
    targets = F.when(F.col("fact") == "applied", F.sequence(F.lit(0), F.lit(buckets - 1))).otherwise(
        F.array(bucket_of("producer_id", buckets).cast("int"))
    )
    return facts.select("*", F.explode(targets).alias("target")).select(
        F.col("target").cast("long").alias("bucket"),
        "producer_id",
        "fact",
        "transactional_id",
        "record_json",
        "fact_time_ms",
        *[none[c].alias(c) for c in STAGE2_INPUT_COLUMNS[6:]],
    )


# Where a record was read from: not part of the coordinator's view (stage 2 keeps one view per producer id, so
# every byte left out is a byte less to rewrite per batch; the model's defaults fill them back in).
_PROVENANCE = {"schema_version", "source_partition", "source_offset", "source_timestamp_ms", "origin"}


def coordinator_rows(records: DataFrame, buckets: int) -> DataFrame:
    """Stage 1's input: the columns its rule reads, and the record as JSON (built here, in the JVM)."""
    record = F.struct(*[F.col(f.name) for f in COORDINATOR_RECORD_SCHEMA.fields if f.name not in _PROVENANCE])
    for name, kind in (("read_topic", "string"), ("read_partition", "long"), ("read_offset", "long")):
        if name not in records.columns:  # records without where they were read: no progress to report
            records = records.withColumn(name, F.lit(None).cast(kind))
    return records.select(
        bucket_of("transactional_id", buckets).alias("bucket"),
        *STAGE1_INPUT_COLUMNS[1:8],
        F.to_json(record, {"ignoreNullFields": "false"}).alias("record_json"),
        *STAGE1_INPUT_COLUMNS[9:],
    )


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


# ---------------------------------------------------------------------------------------------- sinks


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


def collect_events(df: DataFrame) -> list[EventRow]:
    """The batch's events on the driver, through Arrow: one row per open transaction touched, tens of thousands
    at high rates, where `collect()` (a Row object per row through pickle) took seconds."""
    table = df.toArrow()
    columns = [table.column(name).to_pylist() for name in EVENT_COLUMNS]
    return [EventRow(*values) for values in zip(*columns, strict=True)]


def format_event(r: EventRow) -> str:
    where = f"{r.topic}-{r.partition} producer {r.producer_id} start offset {r.start_offset}"
    if r.event == "OPENED":
        cli = json.loads(r.payload)["kafka_cli"]
        return f"HANGING   {where}: {r.explanation}\n          abort: {cli}\n          candidate {r.candidate_id}"
    if r.event == "RESOLVED":
        return f"RESOLVED  {where}: no longer open (candidate {r.candidate_id})"
    # Only news is explained, and not plain OPEN: a verdict unchanged since before a restart comes without one.
    return f"{r.kind:<9} {where}" + (f": {r.explanation}" if r.explanation else "")


class Sinks:
    """The driver-side ends of the queries (foreachBatch bodies)."""

    def __init__(
        self, spark: SparkSession, opts: StreamOptions, live: LiveState, health: Health, out: TextIO | None
    ) -> None:
        self.spark = spark
        self.opts = opts
        self.live = live
        self.health = health
        self.out = out
        self._last_kind: dict[tuple[str, int, int], str] = {}

        self._view_behind_since: int | None = None  # batches in a row the view was behind
        self._view_announced: str | None = None  # "behind" | "current", once said
        self._view_last_said = 0.0

    def _write_kafka(self, df: DataFrame, topic: str) -> None:
        df.write.format("kafka").options(**self.opts.spark_kafka_options).option("topic", topic).save()

    def events(self, df: DataFrame, batch_id: int) -> None:
        # Read once: the stateful stages run once per batch, and the few candidates are written from the driver
        # (caching the batch to read it twice cost more than the rest of the sink).
        rows = collect_events(df)
        self.live.apply_events(rows)
        for r in rows:
            if r.event == "VIEW":
                self._announce_view(json.loads(r.payload))
        candidates = [(r.candidate_id, r.payload) for r in rows if r.event in ("OPENED", "RESOLVED")]
        if candidates:
            self._write_kafka(
                self.spark.createDataFrame(candidates, "key string, value string"),
                self.opts.settings.topics.abort_candidates,
            )
        if self.out is not None:
            for r in rows:
                if r.event == "VIEW":
                    continue
                key = (r.topic, int(r.partition), int(r.producer_id))
                changed = r.event == "VERDICT" and self._last_kind.get(key) != r.kind
                # People see what needs them: candidates opened and resolved, and verdicts that moved to
                # something other than OPEN (HANGING is announced by its OPENED line). Scripts (--output json)
                # get every change.
                quiet = r.kind in ("OPEN", "HANGING") and self.opts.output != "json"
                if r.event in ("OPENED", "RESOLVED") or (changed and not quiet):
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
        if self.opts.output == "json":
            return json.dumps({k: v for k, v in r._asdict().items() if v is not None})
        return format_event(r)

    def windows(self, df: DataFrame, batch_id: int) -> None:
        self.live.apply_windows(df.collect())

    def dead_letters(self, df: DataFrame, batch_id: int) -> None:
        df.persist()
        try:
            rows = df.select("source", "source_topic", "source_partition", "source_offset", "error").collect()
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
            header = lambda name, col: F.struct(  # noqa: E731
                F.lit(name).alias("key"), F.col(col).cast("string").cast("binary").alias("value")
            )
            self._write_kafka(
                df.select(
                    "key",
                    "value",
                    F.array(
                        header("txnwatch.source", "source"),
                        header("txnwatch.source-topic", "source_topic"),
                        header("txnwatch.source-partition", "source_partition"),
                        header("txnwatch.source-offset", "source_offset"),
                        header("txnwatch.error", "error"),
                    ).alias("headers"),
                ),
                self.opts.settings.topics.dead_letter,
            )
        finally:
            df.unpersist()


# ------------------------------------------------------------------------------------------------ job


@dataclass
class RunningJob:
    queries: list[StreamingQuery]
    live: LiveState
    health: Health
    spark: SparkSession
    listener: HealthListener
    metrics_server: Any

    @property
    def metrics_port(self) -> int:
        return int(self.metrics_server.server_port)

    def stop(self) -> None:
        """Stop the queries, the health listener and the /metrics endpoint (a later start begins clean)."""
        for q in self.queries:
            try:
                q.stop()
            except Exception as exc:  # stopping is best effort; report and go on with the others
                log.warning("stopping %s: %s", q.name, exc)
        try:
            self.spark.streams.removeListener(self.listener)
        except Exception as exc:  # the session may already be gone
            log.warning("removing the health listener: %s", exc)
        self.metrics_server.shutdown()
        self.metrics_server.server_close()

    def failed(self) -> str | None:
        for q in self.queries:
            if not q.isActive and q.exception() is not None:
                return f"query {q.name} stopped: {q.exception()}"
        return None


def ensure_topics(opts: StreamOptions, client_kwargs: Mapping[str, Any]) -> None:
    """Create the job's output topics if missing: candidates compacted (key = candidate id), dead letters kept."""
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic
    from kafka.errors import TopicAlreadyExistsError

    admin = KafkaAdminClient(**client_kwargs)
    try:
        brokers = len(admin.describe_cluster()["brokers"])
        rf = min(3, brokers)
        existing = set(admin.list_topics())
        topics = opts.settings.topics
        wanted = [
            NewTopic(topics.abort_candidates, 1, rf, topic_configs={"cleanup.policy": "compact"}),
            NewTopic(topics.dead_letter, 1, rf, topic_configs={"retention.ms": str(14 * 24 * 3_600_000)}),
        ]
        missing = [t for t in wanted if t.name not in existing]
        if missing:
            with contextlib.suppress(TopicAlreadyExistsError):
                admin.create_topics(missing)
    finally:
        admin.close()


QUERIES = ("reconcile", "windows", "dead-letter")
FIRST_BATCH_WAIT_S = 120.0


def _await_first_batch(query: StreamingQuery, timeout_s: float) -> None:
    """Start queries one after the other: their first batches (Python workers, RocksDB, the whole transaction
    log) compete for the same two cores otherwise."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and query.isActive and query.lastProgress is None:
        time.sleep(0.5)


def _short_errors(sink: Callable[[DataFrame, int], None]) -> Callable[[DataFrame, int], None]:
    """Re-raise a failed foreachBatch body with a bounded message.

    A Py4J error carries whole nested Java and Python stack traces; Spark then formats that text with a regex
    that overflows the stream thread's stack (seen when stopping a query interrupts a batch mid-collect), which
    buries the real cause under thousands of lines.
    """

    def run_sink(df: DataFrame, batch_id: int) -> None:
        try:
            sink(df, batch_id)
        except Exception as exc:
            cause = getattr(exc, "java_exception", None) or exc
            raise RuntimeError(f"{sink.__name__} failed in batch {batch_id}: {str(cause)[:2000]}") from None

    return run_sink


def pin_state_buckets(spark: SparkSession, query_checkpoint: str, buckets: int) -> None:
    """Refuse to run a checkpoint with another bucket count than it was made with: its state would be read
    under the wrong keys. Written beside the query's checkpoint through Spark, so any checkpoint filesystem works.
    """
    path = f"{query_checkpoint}-state-buckets"
    try:
        pinned = int(spark.read.text(path).first()[0])  # type: ignore[index]
    except AnalysisException:  # no such file: a new checkpoint
        spark.createDataFrame([(str(buckets),)], "value string").coalesce(1).write.text(path)
        return
    if pinned != buckets:
        raise SystemExit(
            f"the checkpoint {query_checkpoint} was made with --state-buckets {pinned}, not {buckets}: "
            f"run with --state-buckets {pinned}, or with a new --checkpoint-location (state starts empty)"
        )


def start(
    spark: SparkSession,
    opts: StreamOptions,
    *,
    out: TextIO | None = sys.stdout,
    registry: CollectorRegistry | None = None,
    queries: tuple[str, ...] = QUERIES,
) -> RunningJob:
    """Start the three queries and the /metrics endpoint; returns at once."""
    registry = registry or CollectorRegistry()
    live = LiveState()
    health = Health(registry)
    registry.register(VerdictCollector(live, opts.settings.cluster))
    listener = HealthListener(health)
    spark.streams.addListener(listener)
    server = serve(registry, opts.metrics_host, opts.metrics_port)
    sinks = Sinks(spark, opts, live, health, out)
    config = ReconcileConfig(
        limits=opts.settings.detection,
        expire_after_ms=opts.expire_after_ms,
        view_ttl_ms=opts.view_ttl_ms,
        bootstrap=opts.kafka_options.get("bootstrap.servers"),
        command_config=opts.command_config_path,
        transaction_log_topic=(
            opts.transaction_log_topic if opts.coordinator_source in ("log", "both") else None
        ),
        coordinator_state_topic=(
            opts.settings.topics.coordinator_state
            if opts.coordinator_source in ("describe", "both")
            else None
        ),
    )
    ck = opts.checkpoint_location.rstrip("/")

    def start_query(
        name: str, df: DataFrame, sink: Callable[[DataFrame, int], None], mode: str, trigger: str
    ) -> StreamingQuery:
        return (
            df.writeStream.queryName(name)
            .outputMode(mode)
            .foreachBatch(_short_errors(sink))
            .trigger(processingTime=trigger)
            .option("checkpointLocation", f"{ck}/{name}")
            .start()
        )

    started = []
    if "reconcile" in queries:
        snapshots = _snapshots(spark, opts)
        coordinator = _coordinator_inputs(spark, opts)
        records = _union([sources.coordinator_rows_read(df) for _, df in coordinator])
        pin_state_buckets(spark, f"{ck}/txnwatch-reconcile", opts.state_buckets)
        events = reconcile_events(
            sources.good_snapshots_and_positions(snapshots), records, config, opts.state_buckets
        )
        started.append(start_query("txnwatch-reconcile", events, sinks.events, "append", opts.trigger))
        _await_first_batch(started[-1], FIRST_BATCH_WAIT_S)
    if "windows" in queries:
        win = window_metrics(
            sources.good_snapshots(_snapshots(spark, opts)),
            opts.settings.detection,
            window=opts.window,
            watermark=opts.watermark,
        )
        started.append(start_query("txnwatch-windows", win, sinks.windows, "update", opts.secondary_trigger))
        _await_first_batch(started[-1], FIRST_BATCH_WAIT_S)
    if "dead-letter" in queries:  # a separate read: a query has one sink
        dead = [sources.snapshot_dead_letters(_snapshots(spark, opts))]
        dead += [sources.coordinator_dead_letters(df, name) for name, df in _coordinator_inputs(spark, opts)]
        started.append(
            start_query(
                "txnwatch-dead-letter", _union(dead), sinks.dead_letters, "append", opts.secondary_trigger
            )
        )
    return RunningJob(started, live, health, spark, listener, server)


def run(
    spark: SparkSession, opts: StreamOptions, *, seconds: float | None = None, out: TextIO | None = sys.stdout
) -> int:
    """Run until Ctrl-C, a failed query, or `seconds`; returns the exit code."""
    job = start(spark, opts, out=out)
    if out is not None:
        print(
            f"txnwatch stream: metrics on http://{opts.metrics_host}:{job.metrics_port}/metrics, "
            f"checkpoints in {opts.checkpoint_location}",
            file=out,
            flush=True,
        )
    deadline = None if seconds is None else time.monotonic() + seconds
    try:
        while deadline is None or time.monotonic() < deadline:
            problem = job.failed()
            if problem:
                print(f"txnwatch stream: {problem}", file=sys.stderr)
                return 1
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        job.stop()
    return 0
