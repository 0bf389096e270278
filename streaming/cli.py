"""`txnwatch stream`: the Structured Streaming job, with Kafka's tool conventions.

`--command-config client.properties` is handed to Spark's Kafka connector as `kafka.<key>` options unchanged (it
speaks Java client properties) and to kafka-python (topic creation) through common.settings' translation.
This module is the only place in streaming/ that builds `Settings()`.
"""

from __future__ import annotations

import argparse
import logging
import sys
import textwrap
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args
from urllib.parse import urlparse

from kafka.errors import KafkaError
from pydantic import ValidationError

from common.cli_options import (
    EXIT_DONE,
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    FlagTargets,
    KeepLines,
    SettingsError,
    StoreSeconds,
    StoreSparkInterval,
    add_common_flags,
    add_duration_flag,
    default_text,
    exit_codes_epilog,
    non_negative_ms,
    output_format,
    positive_ms,
    settings_from,
)
from common.client_properties import parse_properties
from common.redaction import hide_secrets_in_logs
from common.settings import Settings, StreamCoordinatorSource, StreamSettings, overlay
from common.topics import stream_output_topics
from detectors.health import interval_ms

if TYPE_CHECKING:
    from streaming.job import StreamOptions

log = logging.getLogger("txnwatch.stream")

# How long the pre-flight check waits for a bootstrap server. Without the check, an unreachable cluster surfaced as
# a traceback after kafka-python's 30 s default (topic creation), or as JVM stack traces from Spark's Kafka source;
# a reachable cluster answers well within this, SASL_SSL handshakes included.
BOOTSTRAP_TIMEOUT_MS = 10_000

# The top-level modules of the stream extra (pyproject.toml: pyspark and py4j, pandas, pyarrow, protobuf): the
# core package (`pip install txnwatch`) has none of them, and this module imports them only to run the job.
STREAM_EXTRA_MODULES = frozenset({"pyspark", "py4j", "pandas", "pyarrow", "google"})

# `txnwatch stream` flags → the fields of Settings.stream they set (each flag is named after its field).
STREAM_FLAGS: FlagTargets = {
    name: f"stream.{name}"
    for name in (
        "checkpoint_location",
        "master",
        "trigger",
        "starting_offsets",
        "max_offsets_per_trigger",
        "coordinator_max_offsets_per_trigger",
        "coordinator_read_tasks",
        "window",
        "watermark",
        "expire_after_ms",
        "view_ttl_ms",
        "state_buckets",
        "coordinator_source",
        "transaction_log_topic",
        "metrics_host",
        "metrics_port",
        "restart_queries_every_s",
    )
}


def _default(field: str) -> str:
    """The help text's `(default: ...)`, from StreamSettings."""
    return f"(default: {default_text(StreamSettings, field)})"


def _default_interval(field: str) -> str:
    """The help text's `(default: ...)` of a Spark interval field, in ms as its flag takes it."""
    text = default_text(StreamSettings, field)
    return f"(default: {interval_ms(text)}, {text})"


def extra_not_installed(missing: str) -> str:
    """What to install when a module of the stream extra is missing (one line for operators)."""
    return (
        f"the streaming job needs the stream extra (pyspark, pandas, pyarrow, protobuf), and {missing} is not "
        "installed: pip install 'txnwatch[stream]' (or run the stream image)"
    )


def is_stream_extra(missing: str | None) -> bool:
    """A missing module that comes with the stream extra (a missing module of its own is a bug, not this)."""
    return (missing or "").split(".")[0] in STREAM_EXTRA_MODULES


def spark_conf_pair(text: str) -> tuple[str, str]:
    """argparse type of `--conf KEY=VALUE`: a malformed one is a usage error (one line, exit 2), not a traceback."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "stream",
        help="run the Spark Structured Streaming job: verdicts, abort candidates, KIP-664 metrics",
        description="Reconcile the collector's partition snapshots (<prefix>.producer-state) with the coordinators' "
        "records (__transaction_state, or <prefix>.coordinator-state in fallback mode) in a long-running Spark "
        "Structured Streaming job. Writes abort candidates to <prefix>.abort-candidates (compacted), malformed "
        "input to <prefix>.dead-letter, serves Prometheus metrics, and prints verdict changes for people.",
        epilog=STREAM_EPILOG,
        formatter_class=KeepLines,
    )
    add_common_flags(p)
    p.add_argument(
        "--checkpoint-location",
        help="where Spark keeps offsets and state; keep it to resume after a restart "
        f"{_default('checkpoint_location')}",
    )
    p.add_argument("--master", help="Spark master (default: the one spark-submit gives, else local[*])")
    p.add_argument(
        "--conf",
        action="append",
        default=[],
        type=spark_conf_pair,
        metavar="KEY=VALUE",
        help="extra Spark conf (repeatable)",
    )
    add_duration_flag(
        p,
        "--trigger-ms",
        dest="trigger",
        old="--trigger",
        old_type=str,
        action=StoreSparkInterval,
        help_text=f"micro-batch interval {_default_interval('trigger')}",
    )
    p.add_argument(
        "--starting-offsets",
        help="where a new checkpoint starts reading snapshots: latest|earliest (the transaction log is always read "
        f"from earliest, it is compacted) {_default('starting_offsets')}",
    )
    p.add_argument("--max-offsets-per-trigger", type=int, help="rate limit per micro-batch and source")
    p.add_argument(
        "--coordinator-max-offsets-per-trigger",
        type=int,
        help="rate limit per micro-batch of the coordinator log alone (a first start on a large retained "
        "__transaction_state: smaller batches without holding snapshots back; HANGING verdicts wait until the "
        "job has caught up) (default: --max-offsets-per-trigger)",
    )
    p.add_argument(
        "--coordinator-read-tasks",
        type=int,
        help="Spark tasks that read and decode the coordinator topics per micro-batch; 0: Spark's default "
        "parallelism, the cores (Kafka's source plans one task per partition: 50 on a default "
        f"__transaction_state) {_default('coordinator_read_tasks')}",
    )
    add_duration_flag(
        p,
        "--window-ms",
        dest="window",
        old="--window",
        old_type=str,
        action=StoreSparkInterval,
        help_text=f"KIP-664 metrics window {_default_interval('window')}",
    )
    add_duration_flag(
        p,
        "--watermark-ms",
        dest="watermark",
        old="--watermark",
        old_type=str,
        action=StoreSparkInterval,
        help_text=f"lateness allowed for snapshots {_default_interval('watermark')}",
    )
    p.add_argument(
        "--expire-after-ms",
        type=int,
        help="forget an open transaction no snapshot confirmed for this long; set to ~3 collector intervals "
        f"{_default('expire_after_ms')}",
    )
    p.add_argument(
        "--view-ttl-ms",
        type=int,
        help="forget the coordinator's view of a producer id not updated for this long (bounds the state when "
        f"transactional ids churn); every coordinator record renews it {_default('view_ttl_ms')[:-1]}, 24 h)",
    )
    p.add_argument(
        "--state-buckets",
        type=int,
        help="hash buckets of ids in each stateful stage: fewer = fewer state round trips per batch, more = "
        f"smaller state values rewritten per batch; fixed for a checkpoint {_default('state_buckets')}",
    )
    p.add_argument(
        "--coordinator-source",
        choices=get_args(StreamCoordinatorSource),
        help="log: read __transaction_state (needs Read on it); describe: read the collector's "
        f"<prefix>.coordinator-state (collect --coordinator-source describe) {_default('coordinator_source')}",
    )
    p.add_argument(
        "--transaction-log-topic",
        help="read coordinator records from this topic (a copy of __transaction_state, for replays and tests) "
        f"{_default('transaction_log_topic')}",
    )
    p.add_argument("--metrics-host", help=f"Prometheus endpoint address {_default('metrics_host')}")
    p.add_argument("--metrics-port", type=int, help=f"Prometheus endpoint port {_default('metrics_port')}")
    restart_every_s = float(default_text(StreamSettings, "restart_queries_every_s"))
    add_duration_flag(
        p,
        "--restart-queries-every-ms",
        dest="restart_queries_every_s",
        old="--restart-queries-every-s",
        old_type=float,
        action=StoreSeconds,
        ms_type=non_negative_ms,
        help_text="restart the queries from their checkpoints this often, between two batches, so that RocksDB "
        "rewrites the MANIFEST each state snapshot carries (it does only when a store opens); 0: never "
        f"(default: {round(restart_every_s * 1000)}, 6 h)",
    )
    add_duration_flag(
        p,
        "--duration-ms",
        dest="seconds",
        old="--seconds",
        old_type=float,
        action=StoreSeconds,
        help_text="stop after this long (default: run until Ctrl-C)",
    )
    p.add_argument(
        "--timeout-ms",
        type=positive_ms,
        default=BOOTSTRAP_TIMEOUT_MS,
        metavar="MS",
        help="reaching the cluster before Spark starts; an unreachable one fails after this long (exit 1) "
        f"(default {BOOTSTRAP_TIMEOUT_MS})",
    )
    p.set_defaults(func=run_stream)


STREAM_EPILOG = (
    "\n".join(
        textwrap.wrap(
            "The options from --checkpoint-location to --restart-queries-every-ms also come from the environment "
            "as TXNWATCH_STREAM__<FIELD> (TXNWATCH_STREAM__CHECKPOINT_LOCATION, TXNWATCH_STREAM__STATE_BUCKETS, "
            "TXNWATCH_STREAM__TRIGGER='5 seconds', TXNWATCH_STREAM__RESTART_QUERIES_EVERY_S, ...); flags win. "
            "Example: txnwatch stream --bootstrap-server broker:9092 --command-config client.properties "
            "--checkpoint-location /var/lib/txnwatch/checkpoints",
            width=110,
        )
    )
    + "\n\n"
    + exit_codes_epilog(
        "stream",
        {
            EXIT_DONE: "stopped (Ctrl-C, SIGTERM or --duration-ms)",
            EXIT_ERROR: "error: the cluster unreachable within --timeout-ms, an ACL missing, the stream extra not "
            "installed (pip install 'txnwatch[stream]'), the connector jars missing, the output topics not "
            "created, or a query failed (the message says which and what to do)",
            EXIT_USAGE: "bad flags, settings or client.properties, or a --trigger-ms, --window-ms or --watermark-ms "
            "Spark refuses when it plans the query",
        },
    )
)


def load_settings(args: argparse.Namespace) -> tuple[Settings, tuple[str, ...], dict[str, str]]:
    """Settings for `txnwatch stream` (TXNWATCH_*, then --command-config, then the flags), the client.properties
    keys kafka-python does not use, and the file's Java properties for Spark (read once, so both agree).

    Raises:
        SettingsError, pydantic.ValidationError: see `common.cli_options.settings_from`.
    """
    texts: list[str] = []

    def read_text(path: Path) -> str:
        texts.append(path.read_text())
        return texts[-1]

    settings, ignored = settings_from(args, flags=STREAM_FLAGS, read_text=read_text)
    return settings, ignored, parse_properties(texts[0] if texts else "")


def absolute_checkpoint(location: str) -> str:
    """A local checkpoint path made absolute (the job may start in another working directory than the next run);
    a Hadoop file system URI (`s3a://bucket/path`, `file:///path`) kept as given: as a path it would become a
    local folder named `s3a:`."""
    if urlparse(location).scheme:
        return location
    return str(Path(location).resolve())


def stream_options(
    settings: Settings,
    java_props: Mapping[str, str],
    *,
    command_config: Path | None = None,
    is_terminal: bool,
) -> StreamOptions:
    """The job's StreamOptions: Spark's Kafka connector gets the file's Java properties unchanged, with the
    resolved bootstrap servers; the job reads its own settings from `settings.stream` (the checkpoint location
    made absolute) and kafka-python uses `settings.kafka`."""
    from streaming.job import StreamOptions

    checkpoint = absolute_checkpoint(settings.stream.checkpoint_location)
    return StreamOptions(
        settings=overlay(settings, {"stream": {"checkpoint_location": checkpoint}}),
        kafka_options={**java_props, "bootstrap.servers": settings.kafka.bootstrap_servers},
        command_config_path=str(command_config) if command_config else None,
        output=output_format(settings.output, is_terminal=is_terminal),
    )


@contextmanager
def _quiet(logger_name: str) -> Iterator[None]:
    """Silence a library's logger for a while: kafka-python logs every refused connection at ERROR, and the
    check below says what went wrong in one line of its own."""
    logger = logging.getLogger(logger_name)
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def bootstrap_problem(client_kwargs: Mapping[str, Any], timeout_ms: int = BOOTSTRAP_TIMEOUT_MS) -> str | None:
    """Why the cluster cannot be used (one line for operators), or None when a bootstrap server answered.

    Checked with kafka-python before Spark starts (streaming/ must not import admin/, which has the collector's
    equivalent): a JVM, its jars and Spark's retries would otherwise stand between the operator and the cause.
    """
    from kafka import KafkaAdminClient
    from kafka.errors import AuthorizationError, KafkaError, KafkaTimeoutError, SaslAuthenticationFailedError

    servers = client_kwargs.get("bootstrap_servers")
    # kafka-python rejects options a client class does not take; the check needs only the connection ones.
    kwargs = {k: v for k, v in client_kwargs.items() if k in KafkaAdminClient.DEFAULT_CONFIG}
    kwargs["bootstrap_timeout_ms"] = timeout_ms
    with _quiet("kafka"):
        try:
            admin = KafkaAdminClient(**kwargs)
        except KafkaTimeoutError:
            return (
                f"cannot reach the bootstrap servers {servers} within {timeout_ms / 1000:g} s: check "
                "--bootstrap-server and that the brokers are up and reachable from here"
            )
        except (SaslAuthenticationFailedError, AuthorizationError) as exc:
            return f"authentication to {servers} failed: {exc} (check sasl.* / ssl.* in --command-config)"
        except (KafkaError, OSError, ValueError) as exc:
            return f"cannot connect to {servers}: {exc}"
        admin.close()
    return None


# Spark's Kafka source names the group of its consumer-based offset reader `<groupIdPrefix>-<uuid>-...`; the job
# leaves groupIdPrefix at Spark's default, so the ACL is a prefixed one on this name plus "-".
SPARK_GROUP_PREFIX = "spark-kafka-source"
_READ, _WRITE = (
    "READ",
    "WRITE",
)  # a topic's authorized operations, as kafka-python's describe_topics names them


def _denied(action: str, error: str, acl: str) -> str:
    return f"{action} was denied ({error}): grant the ACL {acl} to txnwatch's principal"


def access_problems(
    client_kwargs: Mapping[str, Any],
    *,
    reads: Sequence[str],
    writes: Sequence[str],
    group_prefix: str = SPARK_GROUP_PREFIX,
) -> list[str]:
    """What the principal may not do that the job needs, one line per missing ACL (empty when all is granted).

    Checked with kafka-python before Spark starts, like `bootstrap_problem`: inside Spark a denial surfaces as JVM
    stack traces. One Metadata request asks for the principal's authorized operations on the job's topics (Read
    on its inputs, Write on its outputs that exist; a missing output is created, and creation says what it lacks),
    and one DescribeGroups on a name under the group prefix shows whether it may use the offset reader's groups.
    """
    from kafka import KafkaAdminClient
    from kafka.errors import GroupAuthorizationFailedError, KafkaError

    kwargs = {k: v for k, v in client_kwargs.items() if k in KafkaAdminClient.DEFAULT_CONFIG}
    problems: list[str] = []
    with _quiet("kafka"):
        admin = KafkaAdminClient(**kwargs)
        try:
            names = list(dict.fromkeys([*reads, *writes]))
            # kafka-python's public Metadata call, with each topic's authorized operations by name.
            found = {t["name"]: t for t in admin.describe_topics(names)}
            for name in names:
                topic = found.get(name)
                if topic is None or topic["error_code"] == 3:  # UNKNOWN_TOPIC_OR_PARTITION
                    continue
                allowed = set(topic.get("authorized_operations") or ())
                denied = topic["error_code"] == 29  # TOPIC_AUTHORIZATION_FAILED: not even Describe
                if name in reads and (denied or _READ not in allowed):
                    problems.append(
                        _denied(f"reading {name}", "TOPIC_AUTHORIZATION_FAILED", f"Read on topic {name}")
                    )
                if name in writes and (denied or _WRITE not in allowed):
                    problems.append(
                        _denied(f"writing {name}", "TOPIC_AUTHORIZATION_FAILED", f"Write on topic {name}")
                    )
            try:
                admin.describe_groups([f"{group_prefix}-txnwatch-access-check"])
            except GroupAuthorizationFailedError:
                problems.append(
                    _denied(
                        f"using the consumer groups {group_prefix}-* of Spark's Kafka source",
                        "GROUP_AUTHORIZATION_FAILED",
                        f"Read on group {group_prefix}- (--resource-pattern-type prefixed)",
                    )
                )
            except KafkaError:  # no group coordinator yet and the like: not an ACL the job lacks
                pass
        finally:
            admin.close()
    return problems


def create_problem(exc: BaseException, topics: Sequence[str]) -> str:
    """One line for a failed creation of the job's output topics."""
    from kafka.errors import ClusterAuthorizationFailedError, TopicAuthorizationFailedError

    # `job.ensure_topics` raises the error with the names of the topics it was about as its message.
    names = str(exc.args[0]) if exc.args and str(exc.args[0]) else ", ".join(topics)
    if isinstance(exc, TopicAuthorizationFailedError):
        return _denied(
            f"creating {names}",
            "TOPIC_AUTHORIZATION_FAILED",
            "Create on those topics (or create them beforehand)",
        )
    if isinstance(exc, ClusterAuthorizationFailedError):
        return _denied(
            f"creating {names}",
            "CLUSTER_AUTHORIZATION_FAILED",
            "Create on the cluster (or create them beforehand)",
        )
    return f"creating {names} failed: {exc}"


def run_stream(args: argparse.Namespace) -> int:
    try:
        from pyspark.errors import AnalysisException, IllegalArgumentException

        from streaming import job
        from streaming.session import build_session, connector_jars
    except ModuleNotFoundError as exc:
        if not is_stream_extra(exc.name):
            raise
        print(f"txnwatch stream: {extra_not_installed(str(exc.name))}", file=sys.stderr)
        return EXIT_ERROR

    try:
        settings, ignored, java_props = load_settings(args)
    except (SettingsError, ValidationError) as exc:
        print(f"txnwatch stream: {exc}", file=sys.stderr)
        return EXIT_USAGE
    logging.basicConfig(
        level=settings.log_level or "INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    hide_secrets_in_logs(settings.kafka)
    for key in ignored:
        log.warning("client.properties: %s is not used by kafka-python (Spark still receives it)", key)
    opts = stream_options(
        settings, java_props, command_config=args.command_config, is_terminal=sys.stdout.isatty()
    )
    client_kwargs = settings.kafka.client_kwargs()
    problem = bootstrap_problem(client_kwargs, args.timeout_ms)
    if problem is not None:
        print(f"txnwatch stream: {problem}", file=sys.stderr)
        return EXIT_ERROR
    stream, topics = settings.stream, settings.topics
    reads = [topics.producer_state]
    if stream.coordinator_source in ("log", "both"):
        reads.append(stream.transaction_log_topic)
    if stream.coordinator_source in ("describe", "both"):
        reads.append(topics.coordinator_state)
    outputs = [t.name for t in stream_output_topics(topics)]
    problems = access_problems(client_kwargs, reads=reads, writes=outputs)
    for line in problems:
        print(f"txnwatch stream: {line}", file=sys.stderr)
    if problems:
        return EXIT_ERROR
    try:
        jars = connector_jars(settings.stream.jars_dir)
    except RuntimeError as exc:
        print(f"txnwatch stream: {exc}", file=sys.stderr)
        return EXIT_ERROR
    try:
        job.ensure_topics(opts, client_kwargs)
    except KafkaError as exc:
        print(f"txnwatch stream: {create_problem(exc, outputs)}", file=sys.stderr)
        return EXIT_ERROR
    # Each shuffle partition is a RocksDB instance and a Python worker in both stateful stages: Spark's default
    # of 200 makes every micro-batch slow for a job whose state is thousands of keys. Fixed by the first
    # checkpoint; --conf spark.sql.shuffle.partitions=N for large clusters.
    conf = {"spark.sql.shuffle.partitions": "4", **job.spark_conf()}
    conf.update(args.conf)
    spark = build_session(
        master=settings.stream.master, app_name="txnwatch-stream", extra_conf=conf, jars=jars
    )
    spark.sparkContext.setLogLevel("WARN")
    try:
        return job.run(spark, opts, seconds=args.seconds)
    except (IllegalArgumentException, AnalysisException) as exc:
        # A --trigger, --window or --watermark Spark cannot read is refused when the query is planned.
        reason = str(exc).strip().splitlines()[0]
        print(f"txnwatch stream: Spark refused the query: {reason}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        # Ctrl-C while the queries start (job.run handles it once they run): no traceback; Spark ends with us.
        print("txnwatch stream: interrupted while starting", file=sys.stderr)
        return EXIT_INTERRUPTED
