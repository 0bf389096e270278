"""`txnwatch stream`: the Structured Streaming job, with Kafka's tool conventions.

`--command-config client.properties` is handed to Spark's Kafka connector as `kafka.<key>` options unchanged (it
speaks Java client properties) and to kafka-python (topic creation) through detectors.settings' translation.
This module is the only place in streaming/ that builds `Settings()`.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from detectors.settings import (
    ClientPropertiesError,
    Settings,
    kafka_settings_from_properties,
    parse_properties,
)

log = logging.getLogger("txnwatch.stream")

# How long the pre-flight check waits for a bootstrap server. Without the check, an unreachable cluster surfaced as
# a traceback after kafka-python's 30 s default (topic creation), or as JVM stack traces from Spark's Kafka source;
# a reachable cluster answers well within this, SASL_SSL handshakes included.
BOOTSTRAP_TIMEOUT_MS = 10_000


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "stream",
        help="run the Spark Structured Streaming job: verdicts, abort candidates, KIP-664 metrics",
        description="Reconcile the collector's partition snapshots (<prefix>.producer-state) with the coordinators' "
        "records (__transaction_state, or <prefix>.coordinator-state in fallback mode) in a long-running Spark "
        "Structured Streaming job. Writes abort candidates to <prefix>.abort-candidates (compacted), malformed "
        "input to <prefix>.dead-letter, serves Prometheus metrics, and prints verdict changes for people.",
        epilog="Example: txnwatch stream --bootstrap-server broker:9092 --command-config client.properties "
        "--checkpoint-location /var/lib/txnwatch/checkpoints",
    )
    p.add_argument("--bootstrap-server", help="host:port[,host:port] (TXNWATCH_KAFKA__BOOTSTRAP_SERVERS)")
    p.add_argument(
        "--command-config",
        type=Path,
        help="client.properties (security.protocol, sasl.*, ssl.*), as for Kafka's tools",
    )
    p.add_argument(
        "--checkpoint-location",
        default=os.environ.get("TXNWATCH_CHECKPOINT_LOCATION", "txnwatch-checkpoints"),
        help="where Spark keeps offsets and state; keep it to resume after a restart (default: %(default)s)",
    )
    p.add_argument("--master", default="local[*]", help="Spark master (default: %(default)s)")
    p.add_argument(
        "--conf", action="append", default=[], metavar="KEY=VALUE", help="extra Spark conf (repeatable)"
    )
    p.add_argument("--trigger", default="5 seconds", help="micro-batch interval (default: %(default)s)")
    p.add_argument(
        "--starting-offsets",
        default="latest",
        help="where a new checkpoint starts reading snapshots: latest|earliest (the transaction log is always read "
        "from earliest, it is compacted) (default: %(default)s)",
    )
    p.add_argument("--max-offsets-per-trigger", type=int, help="rate limit per micro-batch and source")
    p.add_argument(
        "--coordinator-max-offsets-per-trigger",
        type=int,
        help="rate limit per micro-batch of the coordinator log alone (a first start on a large retained "
        "__transaction_state: smaller batches without holding snapshots back; HANGING verdicts wait until the "
        "job has caught up) (default: --max-offsets-per-trigger)",
    )
    p.add_argument("--window", default="1 minute", help="KIP-664 metrics window (default: %(default)s)")
    p.add_argument(
        "--watermark", default="2 minutes", help="lateness allowed for snapshots (default: %(default)s)"
    )
    p.add_argument(
        "--expire-after-ms",
        type=int,
        default=30_000,
        help="forget an open transaction no snapshot confirmed for this long; set to ~3 collector intervals "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--view-ttl-ms",
        type=int,
        default=24 * 3_600_000,
        help="forget the coordinator's view of a producer id not updated for this long (bounds the state when "
        "transactional ids churn); every coordinator record renews it (default: %(default)s, 24 h)",
    )
    p.add_argument(
        "--state-buckets",
        type=int,
        default=32,
        help="hash buckets of ids in each stateful stage: fewer = fewer state round trips per batch, more = "
        "smaller state values rewritten per batch; fixed for a checkpoint (default: %(default)s)",
    )
    p.add_argument(
        "--coordinator-source",
        choices=("log", "describe", "both"),
        default="log",
        help="log: read __transaction_state (needs Read on it); describe: read the collector's "
        "<prefix>.coordinator-state (collect --coordinator-source describe) (default: %(default)s)",
    )
    p.add_argument(
        "--transaction-log-topic",
        default="__transaction_state",
        help="read coordinator records from this topic (a copy of __transaction_state, for replays and tests)",
    )
    p.add_argument(
        "--metrics-host", default="127.0.0.1", help="Prometheus endpoint address (default: %(default)s)"
    )
    p.add_argument(
        "--metrics-port", type=int, default=9465, help="Prometheus endpoint port (default: %(default)s)"
    )
    p.add_argument("--cluster", help="cluster name in records and labels (TXNWATCH_CLUSTER)")
    p.add_argument("--topic-prefix", help="prefix of txnwatch's topics (TXNWATCH_TOPICS__PREFIX)")
    p.add_argument(
        "--output", choices=("table", "json"), default="table", help="console view (default: %(default)s)"
    )
    p.add_argument("--seconds", type=float, help="stop after this long (default: run until Ctrl-C)")
    p.set_defaults(func=run_stream)


def build_options(args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    """StreamOptions and kafka-python kwargs from flags, the properties file and TXNWATCH_* settings."""
    from streaming.job import StreamOptions

    overrides: dict[str, Any] = {}
    if args.cluster:
        overrides["cluster"] = args.cluster
    if args.topic_prefix:
        overrides["topics"] = {"prefix": args.topic_prefix}
    settings = Settings(**overrides)
    text = args.command_config.read_text() if args.command_config else ""
    java_props = parse_properties(text)
    bootstrap = (
        args.bootstrap_server or java_props.get("bootstrap.servers") or settings.kafka.bootstrap_servers
    )
    java_props["bootstrap.servers"] = bootstrap
    kafka, ignored = kafka_settings_from_properties(text, bootstrap_servers=bootstrap, base=settings.kafka)
    for key in ignored:
        log.warning("client.properties: %s is not used by kafka-python (Spark still receives it)", key)
    settings = settings.model_copy(update={"kafka": kafka})
    opts = StreamOptions(
        settings=settings,
        kafka_options=java_props,
        checkpoint_location=str(Path(args.checkpoint_location).resolve()),
        trigger=args.trigger,
        starting_offsets=args.starting_offsets,
        max_offsets_per_trigger=args.max_offsets_per_trigger,
        coordinator_max_offsets_per_trigger=args.coordinator_max_offsets_per_trigger,
        window=args.window,
        watermark=args.watermark,
        expire_after_ms=args.expire_after_ms,
        state_buckets=args.state_buckets,
        view_ttl_ms=args.view_ttl_ms,
        transaction_log_topic=args.transaction_log_topic,
        coordinator_source=args.coordinator_source,
        metrics_host=args.metrics_host,
        metrics_port=args.metrics_port,
        command_config_path=str(args.command_config) if args.command_config else None,
        output=args.output,
    )
    return opts, kafka.client_kwargs()


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


def run_stream(args: argparse.Namespace) -> int:
    from streaming import job
    from streaming.session import build_session

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        opts, client_kwargs = build_options(args)
    except (ClientPropertiesError, OSError, ValueError) as exc:
        print(f"txnwatch stream: {exc}", file=sys.stderr)
        return 2
    problem = bootstrap_problem(client_kwargs)
    if problem is not None:
        print(f"txnwatch stream: {problem}", file=sys.stderr)
        return 1
    job.ensure_topics(opts, client_kwargs)
    # Each shuffle partition is a RocksDB instance and a Python worker in both stateful stages: Spark's default
    # of 200 makes every micro-batch slow for a job whose state is thousands of keys. Fixed by the first
    # checkpoint; --conf spark.sql.shuffle.partitions=N for large clusters.
    conf = {"spark.sql.shuffle.partitions": "4", **job.spark_conf()}
    conf.update(kv.split("=", 1) for kv in args.conf)
    spark = build_session(master=args.master, app_name="txnwatch-stream", extra_conf=conf)
    spark.sparkContext.setLogLevel("WARN")
    return job.run(spark, opts, seconds=args.seconds)
