"""`txnwatch stream`'s lifecycle: its options, the three queries (reconcile, windows, dead-letter) on one
SparkSession with their own checkpoints, starting them one after the other, and stopping. Inputs are
streaming/sources.py, the stateful stages streaming/reconcile.py, the foreachBatch ends streaming/sinks.py;
the layout: docs/streaming.md.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import sys
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TextIO

from prometheus_client import CollectorRegistry
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from common.broker_info import broker_count
from common.settings import Settings
from common.topics import replication_factor, stream_output_topics
from detectors.health import interval_ms, stream_ready_within_ms
from detectors.tracking import ReconcileConfig
from streaming import sources
from streaming.exporter import (
    DriverHealth,
    Endpoint,
    Health,
    HealthListener,
    LiveState,
    StateStaleness,
    VerdictCollector,
    serve,
)
from streaming.reconcile import reconcile_events
from streaming.sinks import DriverProducer, Output, Sinks
from streaming.windows import window_metrics

log = logging.getLogger("txnwatch.stream")


@dataclass(frozen=True)
class StreamOptions:
    """What `txnwatch stream` is told beyond its settings: the settings themselves (the job's own in
    `settings.stream`), the Java client properties for Spark's connector, and what is not a setting."""

    settings: Settings
    kafka_options: Mapping[str, str]  # Java client properties, without the "kafka." prefix
    command_config_path: str | None = None
    output: Output = "table"
    # The windows and dead-letter queries: their outputs need no seconds-fresh answer, and on 2 cores every
    # batch they skip is CPU the reconcile query (detection latency) gets.
    secondary_trigger: str = "15 seconds"

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
        # A batch only when a source has new records. Spark's default runs one at every trigger besides: under
        # processing-time timers transformWithState always asks for another batch, so an idle job ran both
        # stateful stages every 5 s (0.4-0.6 of a core on a quiet cluster, docs/BENCHMARKS.md). Nothing waits
        # on an idle batch: each sweep of the collector (10 s) puts rows in every bucket of stage 2, and those
        # batches fire the expiry timers and apply the state's TTL; with no sweep arriving, nothing is
        # expired, as a silent collector is no news of an ending (docs/streaming.md).
        "spark.sql.streaming.noDataMicroBatches.enabled": "false",
    }


# --------------------------------------------------------------------------------------------- inputs


def _source(
    opts: StreamOptions, topic: str, starting: str, *, coordinator: bool = False
) -> sources.KafkaSource:
    stream = opts.settings.stream
    limit = stream.max_offsets_per_trigger
    if coordinator and stream.coordinator_max_offsets_per_trigger is not None:
        limit = stream.coordinator_max_offsets_per_trigger
    return sources.KafkaSource(
        topic=topic,
        options=opts.spark_kafka_options,
        starting_offsets=starting,
        max_offsets_per_trigger=limit,
    )


def _snapshots(spark: SparkSession, opts: StreamOptions) -> DataFrame:
    starting = opts.settings.stream.starting_offsets
    raw = sources.read_kafka(spark, _source(opts, opts.settings.topics.producer_state, starting))
    return sources.parse_snapshots(raw, cluster=opts.settings.cluster)


def _coordinator_inputs(spark: SparkSession, opts: StreamOptions) -> list[tuple[str, DataFrame]]:
    stream = opts.settings.stream
    tasks = stream.coordinator_read_tasks or spark.sparkContext.defaultParallelism
    inputs = []
    if stream.coordinator_source in ("log", "both"):
        raw = sources.read_kafka(
            spark, _source(opts, stream.transaction_log_topic, "earliest", coordinator=True)
        )
        inputs.append(("transaction-log", sources.decode_transaction_log(raw, compact=True, tasks=tasks)))
    if stream.coordinator_source in ("describe", "both"):
        raw = sources.read_kafka(
            spark, _source(opts, opts.settings.topics.coordinator_state, "earliest", coordinator=True)
        )
        inputs.append(("coordinator-state", sources.parse_coordinator_json(raw, tasks=tasks)))
    return inputs


def _union(frames: list[DataFrame]) -> DataFrame:
    out = frames[0]
    for f in frames[1:]:
        out = out.unionByName(f)
    return out


# ------------------------------------------------------------------------------------------ lifecycle


@dataclass
class RunningJob:
    queries: list[StreamingQuery]
    live: LiveState
    health: Health
    spark: SparkSession
    listener: HealthListener
    metrics_server: Any
    driver: DriverHealth
    # The run's endpoint, which outlives these queries; None: the server is these queries' own.
    endpoint: Endpoint | None = None
    # Starts the queries again from their checkpoints (`restart_queries`); None: this job cannot.
    start_queries: Callable[[], list[StreamingQuery]] | None = None
    # The py4j connections these queries' batches called the sinks on (`release_callback_connections`).
    callback_connections: set[Any] = field(default_factory=set)
    # The driver's own producer (candidates, withdrawals), closed with the queries.
    writer: DriverProducer | None = None

    @property
    def metrics_port(self) -> int:
        return int(self.metrics_server.server_port)

    def stop(self, why: str = "the queries are stopped") -> None:
        """Stop the queries, the health listener and the /metrics endpoint (a later start begins clean); a run's
        endpoint stays up, saying `why` on /readyz and serving the last values, stale, on /metrics."""
        # Said first: stopping a query whose batch waits on a broker that does not answer takes up to
        # stopTimeout each, and the probes should tell the decision, not the end of the wait.
        if self.endpoint is not None:
            self.endpoint.queries_stopped(why)
        self._stop_queries()
        if self.writer is not None:
            try:
                self.writer.close()
            except Exception as exc:  # best effort: what it wrote was acknowledged already
                log.warning("closing the driver's producer: %s", exc)
        try:
            self.spark.streams.removeListener(self.listener)
        except Exception as exc:  # the session may already be gone
            log.warning("removing the health listener: %s", exc)
        if self.endpoint is None:
            self.metrics_server.shutdown()
            self.metrics_server.server_close()

    def _stop_queries(self) -> None:
        # Stopping a query interrupts its running batch, and Spark and py4j then log the cancelled batch at ERROR
        # with whole Java and Python stack traces: noise on the way out, not a failure. Silenced while stopping.
        py4j = logging.getLogger("py4j")
        py4j_level = py4j.level
        py4j.setLevel(logging.CRITICAL)
        self.spark.sparkContext.setLogLevel("OFF")
        try:
            for q in self.queries:
                try:
                    q.stop()
                except Exception as exc:  # stopping is best effort; report and go on with the others
                    log.warning("stopping %s: %s", q.name, exc)
        finally:
            self.spark.sparkContext.setLogLevel("WARN")
            py4j.setLevel(py4j_level)

    def restart_queries(self) -> float:
        """Stop the queries between two batches and start them again from their checkpoints; returns how long
        they were stopped (s). The endpoint, the metrics and the verdicts stay as they are, so neither /readyz nor an
        alert sees the restart. Why at all (RocksDB's MANIFEST grows while a store stays open): docs/deploy.md,
        "Planned restarts"."""
        if self.start_queries is None:
            raise RuntimeError("this job was not started by start(): it cannot start its queries again")
        # Stopping a query interrupts its running batch, which then runs again after the restart (Spark's Kafka
        # sink is at-least-once: the same records again). Between batches there is nothing to run again.
        _await_between_batches(self.queries, self.driver, BETWEEN_BATCHES_WAIT_S)
        began = time.monotonic()
        stopped = self.queries
        self._stop_queries()
        _await_stopped(stopped, self.driver)
        self.release_callback_connections()
        self.queries = self.start_queries()
        return time.monotonic() - began

    def release_callback_connections(self) -> None:
        """Close the py4j connections the stopped queries' threads called Python on.

        PySpark's py4j pins a connection to each JVM thread that calls Python: a socket, a thread on either side.
        When that JVM thread ends (a stopped query's) py4j keeps the connection open for good, so every restart
        would leave three threads in this process and three in the JVM. Closing it from this side ends both."""
        if any(q.isActive for q in self.queries):  # a query that would not stop may still be in a batch
            return
        for connection in list(self.callback_connections):
            # Shut the socket down rather than close the connection: its own thread is blocked reading it, and
            # closing the stream under that read blocks for good. On the end of stream that thread closes the
            # connection itself and ends, and so does the JVM's reader of the other end.
            sock = getattr(connection, "socket", None)
            if sock is not None:
                with contextlib.suppress(OSError):  # already closed by the other side
                    sock.shutdown(socket.SHUT_RDWR)
        self.callback_connections.clear()

    def failed(self) -> str | None:
        for q in self.queries:
            if not q.isActive and q.exception() is not None:
                return f"query {q.name} stopped: {q.exception()}"
        return None


def ensure_topics(opts: StreamOptions, client_kwargs: Mapping[str, Any]) -> None:
    """Create the job's output topics that are missing, as `common.topics.stream_output_topics` specifies
    (kafka-python here: streaming/ does not import admin/)."""
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic
    from kafka.errors import TopicAlreadyExistsError, for_code

    # kafka-python refuses options its admin client does not take (a consumer's default.api.timeout.ms in
    # --command-config is for Spark's consumers), as the pre-flight checks in streaming/cli.py filter them.
    admin = KafkaAdminClient(
        **{k: v for k, v in client_kwargs.items() if k in KafkaAdminClient.DEFAULT_CONFIG}
    )
    try:
        existing = set(admin.list_topics())
        missing = [t for t in stream_output_topics(opts.settings.topics) if t.name not in existing]
        if missing:
            rf = replication_factor(broker_count(admin))
            result = admin.create_topics(
                [NewTopic(t.name, t.partitions, rf, topic_configs=dict(t.configs)) for t in missing],
                raise_errors=False,
            )
            # Per topic: the error names the topics it was about, not every topic asked for.
            failed: dict[int, list[str]] = {}
            for topic in result["topics"]:
                code = topic["error_code"]
                if code not in (0, TopicAlreadyExistsError.errno):
                    failed.setdefault(code, []).append(topic["name"])
            for code, names in failed.items():
                raise for_code(code)(", ".join(names))
    finally:
        admin.close()


QUERIES = ("reconcile", "windows", "dead-letter")
FIRST_BATCH_WAIT_S = 120.0


def _await_first_batch(query: StreamingQuery, timeout_s: float, driver: DriverHealth) -> None:
    """Start queries one after the other: their first batches (Python workers, RocksDB, the whole transaction
    log) compete for the same two cores otherwise. The wait is the driver's loop turning (/healthz)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and query.isActive and query.lastProgress is None:
        driver.turned()
        time.sleep(0.5)


# A trigger this module cannot read is taken as this long, for the /readyz window only.
UNREADABLE_TRIGGER_MS = 60_000


def _ready_within_ms(trigger: str, opts: StreamOptions) -> int:
    stream = opts.settings.stream
    trigger_ms = interval_ms(trigger)
    if trigger_ms is None:
        log.warning(
            "cannot read the trigger %r; /readyz assumes %d s", trigger, UNREADABLE_TRIGGER_MS // 1000
        )
        trigger_ms = UNREADABLE_TRIGGER_MS
    return stream_ready_within_ms(
        trigger_ms=trigger_ms, ready_intervals=stream.ready_intervals, slack_s=stream.ready_slack_s
    )


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


def _remember_connection(
    sink: Callable[[DataFrame, int], None], spark: SparkSession, into: set[Any]
) -> Callable[[DataFrame, int], None]:
    """Note the py4j connection a batch calls the sink on (the query's JVM thread's own), so that it can be
    closed once the query stopped (`RunningJob.release_callback_connections`)."""
    client = getattr(getattr(spark.sparkContext, "_gateway", None), "_gateway_client", None)
    this_thread = getattr(client, "get_thread_connection", None)  # py4j's ClientServer (PySpark's default)

    def run_sink(df: DataFrame, batch_id: int) -> None:
        if this_thread is not None:
            connection = this_thread()
            if connection is not None:
                into.add(connection)
        sink(df, batch_id)

    run_sink.__name__ = sink.__name__
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
    endpoint: Endpoint | None = None,
    live: LiveState | None = None,
) -> RunningJob:
    """Start the three queries and the /metrics endpoint (or show them on the run's `endpoint`); returns once
    they started. `live`: the verdicts the run's earlier queries knew (a fresh state when None)."""
    stream = opts.settings.stream
    registry = registry or CollectorRegistry()
    live = live if live is not None else LiveState()
    health = Health(registry)
    registry.register(VerdictCollector(live, opts.settings.cluster))
    driver = endpoint.driver if endpoint is not None else DriverHealth(stall_after_ms=_stall_after_ms(opts))
    registry.register(StateStaleness(driver, opts.settings.cluster))
    listener = HealthListener(health, driver)
    spark.streams.addListener(listener)
    if endpoint is not None:
        endpoint.show(registry)
        server = endpoint.server
    else:
        server = serve(registry, stream.metrics_host, stream.metrics_port, driver)
    writer = DriverProducer(opts.settings.kafka.client_kwargs())
    sinks = Sinks(
        spark,
        live,
        health,
        out,
        kafka_options=opts.spark_kafka_options,
        topics=opts.settings.topics,
        writer=writer,
        output=opts.output,
    )
    config = ReconcileConfig(
        limits=opts.settings.detection,
        expire_after_ms=stream.expire_after_ms,
        view_ttl_ms=stream.view_ttl_ms,
        bootstrap=opts.kafka_options.get("bootstrap.servers"),
        command_config=opts.command_config_path,
        transaction_log_topic=(
            stream.transaction_log_topic if stream.coordinator_source in ("log", "both") else None
        ),
        coordinator_state_topic=(
            opts.settings.topics.coordinator_state
            if stream.coordinator_source in ("describe", "both")
            else None
        ),
        # New with every start: `live` may be new (a fresh process), and stage 2 then tells it every verdict
        # again (it emits a verdict only when it changes). The planned restarts of `restart_queries` keep it.
        run_id=uuid.uuid4().hex,
    )
    ck = stream.checkpoint_location.rstrip("/")
    callback_connections: set[Any] = set()

    def start_query(
        name: str, df: DataFrame, sink: Callable[[DataFrame, int], None], mode: str, trigger: str
    ) -> StreamingQuery:
        query = (
            df.writeStream.queryName(name)
            .outputMode(mode)
            .foreachBatch(_remember_connection(_short_errors(sink), spark, callback_connections))
            .trigger(processingTime=trigger)
            .option("checkpointLocation", f"{ck}/{name}")
            .start()
        )
        driver.started(str(query.id), name)
        return query

    # The job is ready once every query it runs has moved, not merely the first to start.
    for name, trigger in (
        ("txnwatch-reconcile", stream.trigger),
        ("txnwatch-windows", opts.secondary_trigger),
        ("txnwatch-dead-letter", opts.secondary_trigger),
    ):
        if name.removeprefix("txnwatch-") in queries:
            driver.expect(name, _ready_within_ms(trigger, opts))

    def start_queries() -> list[StreamingQuery]:
        started = []
        if "reconcile" in queries:
            snapshots = _snapshots(spark, opts)
            coordinator = _coordinator_inputs(spark, opts)
            records = _union([sources.coordinator_rows_read(df) for _, df in coordinator])
            pin_state_buckets(spark, f"{ck}/txnwatch-reconcile", stream.state_buckets)
            events = reconcile_events(
                sources.good_snapshots_and_positions(snapshots), records, config, stream.state_buckets
            )
            started.append(start_query("txnwatch-reconcile", events, sinks.events, "append", stream.trigger))
            _await_first_batch(started[-1], FIRST_BATCH_WAIT_S, driver)
        if "windows" in queries:
            win = window_metrics(
                sources.good_snapshots(_snapshots(spark, opts)),
                opts.settings.detection,
                window=stream.window,
                watermark=stream.watermark,
            )
            started.append(
                start_query("txnwatch-windows", win, sinks.windows, "update", opts.secondary_trigger)
            )
            _await_first_batch(started[-1], FIRST_BATCH_WAIT_S, driver)
        if "dead-letter" in queries:  # a separate read: a query has one sink
            coordinator = _coordinator_inputs(spark, opts)
            dead = [sources.snapshot_dead_letters(_snapshots(spark, opts))]
            dead += [sources.coordinator_dead_letters(df, name) for name, df in coordinator]
            health.count_dead_letters_from_zero([sources.SNAPSHOT_SOURCE, *(name for name, _ in coordinator)])
            started.append(
                start_query(
                    "txnwatch-dead-letter", _union(dead), sinks.dead_letters, "append", opts.secondary_trigger
                )
            )
        return started

    return RunningJob(
        start_queries(),
        live,
        health,
        spark,
        listener,
        server,
        driver,
        endpoint,
        start_queries,
        callback_connections,
        writer,
    )


def _stall_after_ms(opts: StreamOptions) -> int:
    return round(opts.settings.stream.stall_after_s * 1000)


# While Kafka does not answer, the job checks again after 1, 2, 4 ... seconds, at most this long.
OUTAGE_BACKOFF_MAX_S = 15.0
# A query that fails again this many times in a row while Kafka answers is not an outage: the job exits.
OUTAGE_RESTARTS_MAX = 5
# No batch for this long: the job asks whether Kafka answers (then every third of it while it stays so).
STALL_CHECK_S = 30.0
# Stopping a query whose batch waits on a broker that does not answer (up or not, it holds the connection) blocks
# until Kafka's timeouts fire, for minutes. `run` asks Spark to give up waiting after this long (the query's thread
# ends later by itself) and then waits for the stopped queries' threads to end, its loop turning for at most
# STOPPED_QUERIES_WAIT_S (then /healthz says the loop stalled: a query that never ends is for a restart).
STOP_TIMEOUT_MS = 10_000
STOPPED_QUERIES_WAIT_S = 600.0


def _await_stopped(queries: list[StreamingQuery], driver: DriverHealth) -> None:
    """Wait until the stopped queries' threads ended (a query of the same name cannot start before)."""
    began = time.monotonic()
    while any(q.isActive for q in queries):
        if time.monotonic() - began < STOPPED_QUERIES_WAIT_S:
            driver.turned()
        time.sleep(1)


# A planned restart waits this long for a moment no query runs a batch, then restarts anyway (a query that is
# always busy has its batch run again, as after a crash).
BETWEEN_BATCHES_WAIT_S = 60.0


def _await_between_batches(queries: list[StreamingQuery], driver: DriverHealth, timeout_s: float) -> bool:
    """Return as soon as no query runs a batch (True), or after `timeout_s` (False)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not any(q.isActive and q.status["isTriggerActive"] for q in queries):
            return True
        driver.turned()
        time.sleep(0.1)
    return False


def restart_due(opened_at_s: float, now_s: float, every_s: float) -> bool:
    """A planned restart is due `every_s` after the queries were last started (0: never)."""
    return every_s > 0 and now_s - opened_at_s >= every_s


def kafka_problem(opts: StreamOptions, timeout_ms: int = 5_000) -> str | None:
    """Why no bootstrap server answers now (one line), or None when one does (kafka-python, quietly)."""
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

    kwargs = {
        k: v for k, v in opts.settings.kafka.client_kwargs().items() if k in KafkaAdminClient.DEFAULT_CONFIG
    }
    kwargs["bootstrap_timeout_ms"] = timeout_ms
    logger = logging.getLogger("kafka")
    level = logger.level
    logger.setLevel(logging.CRITICAL)  # kafka-python logs every refused connection at ERROR
    try:
        admin = KafkaAdminClient(**kwargs)
        admin.close()
    except (KafkaError, OSError) as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        logger.setLevel(level)
    return None


# Loggers of the driver's JVM that say one thing over and over; their ERRORs still show.
QUIET_LOGGERS = (
    # A WARN per connection attempt while a broker is down (about 500 lines a minute with three queries); the job
    # says so itself, once (`run`).
    "org.apache.kafka.clients.NetworkClient",
    # A WARN per state key a batch asks for that the state does not hold yet ("Map state ... doesn't contain
    # key"): every transactional id and producer id new to the job, a million lines on a catch-up over a million.
    # A miss is how the job learns an id is new; nothing is lost by not logging it.
    "org.apache.spark.sql.execution.python.streaming.TransformWithStateInPySparkStateServer",
)


def quiet_noisy_loggers(spark: SparkSession) -> None:
    """`QUIET_LOGGERS` at ERROR in this JVM (with `local[...]`, the executors' too: they are this JVM)."""
    try:
        jvm: Any = getattr(spark.sparkContext, "_jvm", None)
        log4j = jvm.org.apache.logging.log4j
        for name in QUIET_LOGGERS:
            log4j.core.config.Configurator.setLevel(name, log4j.Level.ERROR)
    except Exception as exc:  # a different logging backend: keep the warnings
        log.debug("cannot quiet Spark's and Kafka's repeated warnings: %s", exc)


def _announce(job: RunningJob, opts: StreamOptions, out: TextIO | None) -> None:
    if out is not None:
        print(
            f"txnwatch stream: metrics on http://{opts.settings.stream.metrics_host}:{job.metrics_port}/metrics, "
            f"checkpoints in {opts.settings.stream.checkpoint_location}",
            file=out,
            flush=True,
        )


def _last_batch(job: RunningJob) -> int:
    progress = job.queries[0].lastProgress if job.queries else None
    return int(progress["batchId"]) if progress else -1


def run(
    spark: SparkSession, opts: StreamOptions, *, seconds: float | None = None, out: TextIO | None = sys.stdout
) -> int:
    """Run until Ctrl-C, a failed query, or `seconds`; returns the exit code.

    Kafka unreachable is said once on stderr, and once more when it answers again. While batches stall for
    `STALL_CHECK_S` the job asks whether a bootstrap server answers. A query that fails while none does (Spark's
    Kafka consumers give up after their 60 s API timeout and fail the batch) does not end the job: the queries
    stop, the job checks with backoff until Kafka answers, and starts them again from their checkpoints (as a
    restart would: the failed batch runs again).
    """
    quiet_noisy_loggers(spark)
    spark.conf.set("spark.sql.streaming.stopTimeout", str(STOP_TIMEOUT_MS))
    # One endpoint for the whole run: its probes answer while the queries are stopped for a Kafka outage.
    stream = opts.settings.stream
    endpoint = Endpoint(
        stream.metrics_host, stream.metrics_port, DriverHealth(stall_after_ms=_stall_after_ms(opts))
    )
    # One state of verdicts for the whole run too: queries started again after an outage resume the checkpointed
    # state those verdicts came from, and only their events (a GONE) may take a verdict away. A fresh state would
    # drop every hanging series until the next batch, and resolve its page.
    live = LiveState()
    try:
        first = start(spark, opts, out=out, endpoint=endpoint, live=live)
    except BaseException:
        endpoint.close()
        raise
    _announce(first, opts, out)
    job: RunningJob | None = first
    deadline = None if seconds is None else time.monotonic() + seconds
    restarts = 0
    opened_at = time.monotonic()  # when the queries last started: they restart every restart_queries_every_s
    down_since: float | None = None  # when "Kafka does not answer" was said
    last_batch, batch_seen_at, probed_at = -1, time.monotonic(), 0.0

    def say_down(why: str, what: str) -> None:
        nonlocal down_since
        if down_since is None:
            down_since = time.monotonic()
            print(f"txnwatch stream: Kafka does not answer ({why}): {what}", file=sys.stderr, flush=True)

    def say_up(what: str) -> None:
        nonlocal down_since
        if down_since is not None:
            print(
                f"txnwatch stream: Kafka answers again after {time.monotonic() - down_since:.0f}s: {what}",
                file=sys.stderr,
                flush=True,
            )
            down_since = None

    try:
        while deadline is None or time.monotonic() < deadline:
            problem = job.failed() if job is not None else None
            if job is not None:
                job.driver.turned()  # job.failed() asked Spark's JVM about every query, and it answered
            if problem and job is not None:
                unreachable = kafka_problem(opts)
                restarts = restarts + 1 if unreachable is None else 0
                if unreachable is None and restarts >= OUTAGE_RESTARTS_MAX:
                    print(f"txnwatch stream: {problem}", file=sys.stderr)
                    return 1
                which = problem.split(":", 1)[0]  # "query NAME stopped"; the rest is a Py4J traceback
                if unreachable:
                    say_down(
                        unreachable,
                        f"{which}; the queries stop, and resume from their checkpoints once it answers "
                        f"(checked with backoff, up to {OUTAGE_BACKOFF_MAX_S:.0f}s)",
                    )
                elif down_since is None:
                    print(
                        f"txnwatch stream: {which}; Kafka answers: resuming from the checkpoints "
                        f"(attempt {restarts} of {OUTAGE_RESTARTS_MAX - 1})",
                        file=sys.stderr,
                        flush=True,
                    )
                stopped, stopped_job = job.queries, job
                job.stop(
                    "the queries are stopped: Kafka does not answer"
                    if unreachable
                    else "the queries are stopped: resuming from the checkpoints"
                )
                job = None
                _await_stopped(stopped, endpoint.driver)
                stopped_job.release_callback_connections()
                pause = 1.0
                while kafka_problem(opts) is not None:
                    endpoint.driver.turned()  # the loop waits for Kafka, as it should: live
                    if deadline is not None and time.monotonic() >= deadline:
                        return 0
                    time.sleep(pause)
                    pause = min(pause * 2, OUTAGE_BACKOFF_MAX_S)
                job = start(spark, opts, out=out, endpoint=endpoint, live=live)
                opened_at = time.monotonic()
                say_up("queries resumed from their checkpoints")
                _announce(job, opts, out)
                last_batch, batch_seen_at = _last_batch(job), time.monotonic()
                continue
            if job is not None and restart_due(opened_at, time.monotonic(), stream.restart_queries_every_s):
                took = job.restart_queries()
                opened_at = time.monotonic()
                print(
                    f"txnwatch stream: restarted the queries from their checkpoints in {took:.1f}s (planned, "
                    f"every {stream.restart_queries_every_s:.0f}s: reopens their state stores)",
                    file=sys.stderr,
                    flush=True,
                )
                last_batch, batch_seen_at = _last_batch(job), time.monotonic()
                continue
            if job is not None:
                now = time.monotonic()
                batch = _last_batch(job)
                if batch != last_batch:
                    last_batch, batch_seen_at = batch, now
                    say_up("batches run again")
                    if restarts and all(q.lastProgress is not None for q in job.queries):
                        restarts = 0
                elif now - batch_seen_at > STALL_CHECK_S and now - probed_at > STALL_CHECK_S / 3:
                    # No batch for a while: a busy job, no input, or Kafka gone. Only the last is worth a word.
                    probed_at = now
                    unreachable = kafka_problem(opts)
                    if unreachable:
                        say_down(
                            unreachable, f"no batch for {now - batch_seen_at:.0f}s; the queries wait for it"
                        )
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        if job is not None:
            job.stop()
        endpoint.close()
    return 0
