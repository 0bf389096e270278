"""`txnwatch collect`, `txnwatch inspect partition|coordinator-log` and `txnwatch proposals list|show|abort|commit`, with
Kafka's tool conventions.

Every command takes the flags of `common.cli_options.add_common_flags` (`--bootstrap-server`,
`--command-config client.properties`, `--output`, `--cluster`, `--topic-prefix`, `--log-level`), like `txnwatch
stream`; everything else also comes from the environment (`TXNWATCH_*`, see common/settings.py). This module is
the only place in admin/ that builds `Settings()` (through `cli_options.settings_from`).
"""

from __future__ import annotations

import argparse
import functools
import getpass
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

from pydantic import ValidationError

from admin.collect.blocked import BlockedGroups
from admin.collect.collector import Collector, loop_health, run
from admin.collect.coordinator import CoordinatorPoll, CoordinatorPoller, open_producer_ids
from admin.collect.metrics import CollectorMetrics, serve
from admin.collect.publish import KafkaSink, Publisher, ensure_topics, restore_open_partitions
from admin.collect.redescribe import Redescribes
from admin.collect.restore import restore_sightings
from admin.inspect.report import (
    LOG_HEADER,
    entry_json,
    inspect_partition,
    read_coordinator_log,
    render_log_entry,
    render_partition,
)
from admin.live.evidence import observe
from admin.proposals.show import ActWith, candidate_row, look_around, render_list, render_show, show_json
from admin.proposals.verified_marker import (
    NOT_PROPOSED,
    TopicAuditLog,
    abort,
    audit_json,
    audit_records,
    candidate_at,
    commit,
    first_read_committed_offset,
    follow_topic,
    latest_candidates,
    no_longer_proposed,
    read_topic,
)
from admin.proposals.watch import PolicyError, Watch, load_policy, policy_summary, printer
from admin.wire.connect import Consumer, Producer, connect_admin, consumer_for, producer_for
from admin.wire.errors import AdminError, WireError, WireTimeout, explain
from admin.wire.groups import KafkaGroupOffsets
from admin.wire.kafka_wire import KafkaWire
from admin.wire.requests import RequestLog
from admin.wire.types import ClusterWire, SweepResult, wall_clock_ms
from common.cli_options import (
    EXIT_ALREADY_RESOLVED,
    EXIT_CANDIDATES_LISTED,
    EXIT_COLLISION,
    EXIT_DONE,
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_REFUSED,
    EXIT_USAGE,
    FlagTargets,
    KeepLines,
    SettingsError,
    StoreSeconds,
    add_common_flags,
    default_text,
    exit_codes_epilog,
    output_format,
    positive_ms,
    settings_from,
)
from common.redaction import hide_secrets_in_logs
from common.settings import (
    MAX_DESCRIBE_BATCH,
    CollectorSettings,
    CoordinatorSource,
    KafkaSettings,
    Settings,
)
from common.text import format_table
from common.topics import CleanupPolicy, OutputTopicSettings
from detectors.abort import MarkerResult, pending_candidates, resolved_by_audit, verify_marker
from detectors.contract import TRANSACTION_LOG_TOPIC
from detectors.models import AbortCandidate, AuditRecord, CoordinatorLogPosition
from detectors.policy import AbortPolicy, abort_times

log = logging.getLogger("txnwatch")

# Exit codes: each command's --help shows its rows of common.cli_options.EXIT_CODE_TABLE, one table for every
# txnwatch command (docs/proposals.md, "Exit codes"); `proposals abort`/`commit` return admin/proposals/verified_marker.py's.


def _default(field: str) -> str:
    """A `collect` flag's default in its help text, from CollectorSettings."""
    return default_text(CollectorSettings, field)


def register(subparsers: Any) -> None:
    """Add `collect` and `inspect` to the `txnwatch` argparse tree."""
    collect = subparsers.add_parser(
        "collect",
        help="sweep partition leaders' producer state and publish it to Kafka (long-running)",
        description="Sweep every partition leader with DescribeProducers, read the start batch of every new open "
        "transaction, and publish PartitionSnapshots and per-broker sweep summaries to <prefix>.producer-state. "
        "With --coordinator-source describe, also publish CoordinatorRecords from ListTransactions + "
        "DescribeTransactions to <prefix>.coordinator-state.",
        epilog=exit_codes_epilog(
            "collect", {EXIT_DONE: "stopped (Ctrl-C, SIGTERM, --max-sweeps) or --once done"}
        ),
        formatter_class=KeepLines,
    )
    add_common_flags(collect)
    interval = collect.add_mutually_exclusive_group()
    interval.add_argument(
        "--interval-ms",
        dest="interval",
        type=positive_ms,
        action=StoreSeconds,
        metavar="MS",
        help=f"milliseconds between sweeps (default {round(float(_default('interval_s')) * 1000)})",
    )
    # The old spelling, in seconds: hidden, still honoured (charts and scripts pass it).
    interval.add_argument("--interval", type=float, help=argparse.SUPPRESS)
    collect.add_argument(
        "--once", action="store_true", help="run one sweep, print it (see --output) and exit"
    )
    collect.add_argument("--publish", action="store_true", help="with --once: also publish the sweep")
    collect.add_argument("--max-sweeps", type=int, help="stop after this many sweeps")
    collect.add_argument(
        "--coordinator-source",
        choices=get_args(CoordinatorSource),
        help="log: the streaming job reads __transaction_state; describe: poll ListTransactions + "
        "DescribeTransactions and publish to <prefix>.coordinator-state (no Read on __transaction_state needed) "
        f"(default {_default('coordinator_source')})",
    )
    collect.add_argument(
        "--coordinator-duration-filter-ms",
        type=int,
        help="describe mode: re-describe only active transactions running longer than this (Kafka 3.8+)",
    )
    collect.add_argument(
        "--metrics-port",
        type=int,
        help=f"Prometheus endpoint port, 0 to disable (default {_default('metrics_port')})",
    )
    collect.add_argument(
        "--blocked-groups-after-ms",
        type=int,
        metavar="MS",
        help="name on /metrics the consumer groups a transaction holds up (at the partition's LSO, or its pending "
        "offset commit) once the partition's oldest open transaction has been open this long; 0: never (needs "
        f"Describe on groups) (default {_default('blocked_groups_after_ms')})",
    )
    collect.add_argument(
        "--probe-interval-ms",
        type=int,
        metavar="MS",
        help="between sweeps, ListOffsets of every partition this often to see new open transactions sooner, and "
        "describe a partition again once a report of it can prove a young one (HANGING in about the grace plus "
        f"the clock-skew tolerance, not a sweep later); 0: full sweeps only (default {_default('probe_interval_ms')})",
    )
    collect.add_argument(
        "--describe-batch-size",
        type=int,
        help=f"partitions per DescribeProducers (<= {MAX_DESCRIBE_BATCH}, default {_default('describe_batch_size')})",
    )
    collect.add_argument(
        "--request-timeout-ms",
        type=int,
        help=f"per-request timeout (default {_default('request_timeout_ms')})",
    )
    collect.add_argument(
        "--timeout-ms",
        type=positive_ms,
        help="reaching the cluster at start-up; an unreachable one fails after this long (exit 1) (default: "
        f"--request-timeout-ms, at least {CONNECT_TIMEOUT_MS})",
    )
    collect.add_argument("--topic-partitions", type=int, help="partitions of output topics created")
    collect.add_argument("--topic-replication-factor", type=int, help="replication of output topics created")
    collect.add_argument("--topic-retention-ms", type=int, help="retention.ms of output topics created")
    collect.add_argument(
        "--topic-cleanup-policy",
        choices=get_args(CleanupPolicy),
        metavar="|".join(get_args(CleanupPolicy)),
        help="cleanup.policy of output topics created",
    )
    collect.add_argument(
        "--no-restore",
        action="store_true",
        help="do not read the snapshot topic back at start-up (the first sweep then publishes an empty snapshot "
        "for every partition without open transactions)",
    )
    collect.set_defaults(func=_interruptible(cmd_collect))

    inspect = subparsers.add_parser(
        "inspect", help="on-call inspection of one partition or the coordinator log"
    )
    isub = inspect.add_subparsers(dest="inspect_command", metavar="WHAT", required=True)
    part = isub.add_parser(
        "partition",
        help="open transactions of one partition: start time, age, LSO lag, and the coordinator's view",
        epilog=exit_codes_epilog("inspect partition"),
        formatter_class=KeepLines,
    )
    add_common_flags(part)
    part.add_argument("--topic", required=True)
    part.add_argument("--partition", type=int, required=True)
    part.add_argument(
        "--timeout-ms",
        type=positive_ms,
        default=CONNECT_TIMEOUT_MS,
        help=f"reaching the cluster (default {CONNECT_TIMEOUT_MS})",
    )
    part.set_defaults(func=_interruptible(cmd_inspect_partition))
    txlog = isub.add_parser(
        "coordinator-log",
        help="decoded __transaction_state, live (like kafka-dump-log --transaction-log-decoder)",
        epilog=exit_codes_epilog(
            "inspect coordinator-log", {EXIT_DONE: "stopped (Ctrl-C, SIGTERM, --max-records or --timeout-ms)"}
        ),
        formatter_class=KeepLines,
    )
    add_common_flags(txlog)
    txlog.add_argument("--transactional-id", help="only this transactional id (reads only its partition)")
    txlog.add_argument(
        "--from-beginning", action="store_true", help="start at the oldest record, not the end"
    )
    txlog.add_argument("--max-records", type=int, help="exit after this many records")
    txlog.add_argument(
        "--timeout-ms",
        type=positive_ms,
        help=f"exit when no record arrived for this long; also bounds reaching the cluster (default: follow for "
        f"ever, {CONNECT_TIMEOUT_MS} to reach it)",
    )
    txlog.set_defaults(func=_interruptible(cmd_inspect_coordinator_log))
    _register_proposals(subparsers)


CONNECT_TIMEOUT_MS = 10_000  # reaching the cluster when a command has no --timeout-ms of its own


ABORT_EPILOG = (
    exit_codes_epilog(
        "proposals abort",
        {
            EXIT_DONE: "aborted and post-checked (the LSO moved past the start offset), or a dry run that "
            "verified the abort is safe right now",
            EXIT_ERROR: "error: cluster unreachable, candidate unknown, WriteTxnMarkers denied (grant Alter on the "
            "cluster, ClusterAction before Kafka 3.8), the marker failed, or it was written but the post-check "
            "failed",
            EXIT_REFUSED: "refused, no marker written: the transaction changed since the plan (committed or "
            "aborted by someone else, epoch, coordinator epoch or start offset moved), or its coordinator owns it "
            "(Ongoing with this partition, or any Prepare state), or the coordinator side cannot be checked, or "
            "another execution holds the candidate, or live-owner-same-epoch (see --allow-live-owner), or "
            "leader-changed-since-start (see --allow-leader-change), or "
            f"{NOT_PROPOSED} (--topic/--partition/--start-offset name no transaction the job proposes to abort)",
            EXIT_ALREADY_RESOLVED: "nothing to do: an earlier (or concurrent) run of txnwatch aborted it; nothing "
            "written",
            EXIT_COLLISION: "COLLISION: aborted, but the producer id's live owner moved between verify and marker "
            "(it added the partition, began or ended a transaction, or wrote to the partition): records it wrote "
            "there may have been aborted with the orphan while its transaction commits elsewhere. Tell its owners "
            "now (runbook)",
        },
    )
    + """

Name the transaction by its candidate ID, or as kafka-transactions.sh abort does: --topic T --partition P
--start-offset O (the candidate the job proposes for it; none: refused, not-proposed). --execute first claims the
candidate on <prefix>.audit, so two concurrent executions write one marker. Every run (dry or not) publishes an
audit record to <prefix>.audit. Details: docs/proposals.md."""
)


COMMIT_EPILOG = (
    exit_codes_epilog(
        "proposals commit",
        {
            EXIT_DONE: "committed and post-checked (the LSO moved past the start offset and a read_committed "
            "reader gets the record at the start offset), or a dry run that verified the COMMIT is safe right now",
            EXIT_ERROR: "error: cluster unreachable, candidate unknown, WriteTxnMarkers denied (grant Alter on the "
            "cluster, ClusterAction before Kafka 3.8), the marker failed, or it was written but the post-check "
            "failed",
            EXIT_REFUSED: "refused, no marker written: abort-candidate (not a lost commit: `proposals abort` is its "
            "command), commit-unproven (the evidence does not show the PrepareCommit listed the partition), "
            "commit-owner-gone or coordinator-contradicts-commit (the coordinator no longer shows the commit), the "
            "transaction changed since the plan, its coordinator owns it (Ongoing with this partition, or any "
            "Prepare state), the coordinator side cannot be checked, another execution holds the candidate, "
            f"live-owner-same-epoch (see --allow-live-owner), or {NOT_PROPOSED} (--topic/--partition/--start-offset "
            "name no transaction the job proposes)",
            EXIT_ALREADY_RESOLVED: "nothing to do: an earlier (or concurrent) run of txnwatch committed it; nothing "
            "written",
            EXIT_COLLISION: "COLLISION: committed, but the producer id's live owner moved between verify and "
            "marker: records it wrote there may have been committed with the lost transaction. Tell its owners now "
            "(runbook)",
        },
    )
    + """

Only for a lost-commit-marker candidate: its coordinator committed the transaction with this partition in its
PrepareCommit, and the partition's marker was lost (an unclean leader election). Kafka's tools cannot write a
COMMIT marker. --execute first claims the candidate on <prefix>.audit; every run publishes an audit record.
Details: docs/proposals.md."""
)


WATCH_EPILOG = """\
example policy (every field but topics.deny is required):
  reasons: [coordinator-completed, partition-not-in-transaction]
  min_age_s: 900
  min_lso_lag: 1
  topics: {allow: ["orders-*"], deny: ["orders-audit"]}
  max_aborts_per_hour: 3

""" + exit_codes_epilog("proposals watch", {EXIT_DONE: "stopped (Ctrl-C, SIGTERM or --duration-ms)"})

# Reading txnwatch's topics, and reaching the cluster: the proposals commands' --timeout-ms.
TOPICS_TIMEOUT_MS = 30_000
_TIMEOUT_HELP = f"reaching the cluster, and reading the topics (default {TOPICS_TIMEOUT_MS})"


def _register_proposals(subparsers: Any) -> None:
    proposals = subparsers.add_parser(
        "proposals",
        help="abort candidates the job proposed: list them, show one live, abort one (verified), or restore a "
        "lost commit",
    )
    psub = proposals.add_subparsers(dest="proposals_command", metavar="WHAT", required=True)
    plist = psub.add_parser(
        "list",
        help="pending candidates (OPENED, not RESOLVED, not already aborted), largest LSO lag first, then oldest",
        epilog=exit_codes_epilog(
            "proposals list", {EXIT_DONE: "listed (none, or any without --fail-if-any)"}
        ),
        formatter_class=KeepLines,
    )
    add_common_flags(plist)
    plist.add_argument("--timeout-ms", type=positive_ms, default=TOPICS_TIMEOUT_MS, help=_TIMEOUT_HELP)
    plist.add_argument(
        "--fail-if-any",
        action="store_true",
        help=f"exit {EXIT_CANDIDATES_LISTED} when any candidate is listed (for cron and scripts)",
    )
    plist.set_defaults(func=_interruptible(cmd_proposals_list))
    show = psub.add_parser(
        "show",
        help="one candidate's evidence refreshed live, and how to act on it",
        epilog=exit_codes_epilog("proposals show"),
        formatter_class=KeepLines,
    )
    add_common_flags(show)
    show.add_argument("candidate_id", metavar="ID")
    show.add_argument("--timeout-ms", type=positive_ms, default=TOPICS_TIMEOUT_MS, help=_TIMEOUT_HELP)
    show.set_defaults(func=_interruptible(cmd_proposals_show))
    ab = psub.add_parser(
        "abort",
        help="verify a candidate live and (with --execute) abort it with WriteTxnMarkers",
        description="Plan (the candidate's WriteTxnMarkersSpec) -> verify live (the leader still reports the same "
        "producer id, epoch, coordinator epoch and start offset open; its coordinator does not own it, and no "
        "live transactional id owns it at the marker's epoch; the partition's leader is in the leader epoch the "
        "transaction's start batch was appended in) -> "
        "with --execute: write the ABORT marker to the current leader -> post-check (the transaction is gone, "
        "the LSO moved past it; the owner did not move meanwhile) -> audit record. Dry run by default. A "
        "lost-commit-marker candidate is refused (its remedy is `proposals commit`).",
        epilog=ABORT_EPILOG,
        formatter_class=KeepLines,
    )
    _marker_flags(ab, "abort")
    ab.add_argument(
        "--allow-leader-change",
        action="store_true",
        help="abort even though the partition's leader changed since the transaction began, or that cannot be "
        "shown (refusal leader-changed-since-start: its start batch's leader epoch is not the leader's now). The "
        "risk: an unclean leader election may have lost a COMMIT marker of this transaction; its coordinator "
        "then committed it, every other partition of it holds its records committed and its client was told so, "
        "and an ABORT here would undo them on this partition, for good. Only when you have checked that it was "
        "never committed: the partition's log around the start offset (kafka-dump-log.sh: a COMMIT control "
        "batch of the producer id before it means the transaction began after that commit) and its "
        "coordinator's history (txnwatch inspect coordinator-log --transactional-id ID --from-beginning); see "
        "docs/runbook.md. The flag is recorded in the audit record. Not for `proposals commit`, which restores "
        "a commit",
    )
    ab.set_defaults(func=_interruptible(cmd_proposals_abort))
    co = psub.add_parser(
        "commit",
        help="restore a lost commit marker: verify a lost-commit-marker candidate live and (with --execute) "
        "write its COMMIT marker",
        description="For a lost-commit-marker candidate only. Plan (its WriteTxnMarkersSpec, COMMIT) -> verify "
        "live (the leader still reports the same producer id, epoch, coordinator epoch and start offset open; "
        "the candidate's evidence shows the coordinator committed the transaction with this partition in its "
        "PrepareCommit; the transactional id still owns the producer id and its coordinator does not contradict "
        "that commit; no live transactional id owns it at the marker's epoch) -> with --execute: write the "
        "COMMIT marker to the current leader -> post-check (the transaction is gone, the LSO moved past it, a "
        "read_committed reader gets its records; the owner did not move meanwhile) -> audit record. Dry run by "
        "default.",
        epilog=COMMIT_EPILOG,
        formatter_class=KeepLines,
    )
    _marker_flags(co, "commit")
    co.set_defaults(func=_interruptible(cmd_proposals_commit))
    watch = psub.add_parser(
        "watch",
        help="follow new candidates and print them; with --auto-abort --policy FILE, abort the ones it allows",
        description="Prints every pending candidate, then each new one the job proposes and each it resolves. "
        "With --auto-abort and an explicit --policy file (reasons, min_age_s, min_lso_lag, topics allow/deny, "
        "max_aborts_per_hour; see docs/proposals.md), each allowed candidate goes through the same verified abort "
        "as `proposals abort --execute` (claim, verify live, marker, post-check, audit), once per run. Off by "
        "default.",
        epilog=WATCH_EPILOG,
        formatter_class=KeepLines,
    )
    add_common_flags(watch)
    watch.add_argument(
        "--auto-abort", action="store_true", help="abort what --policy allows (needs --policy)"
    )
    watch.add_argument("--policy", type=Path, metavar="FILE", help="the auto-abort policy (YAML)")
    watch.add_argument(
        "--actor", help="who runs this, for the audit records (default: TXNWATCH_ACTOR, else the login name)"
    )
    duration = watch.add_mutually_exclusive_group()
    duration.add_argument(
        "--duration-ms",
        dest="duration_s",
        type=positive_ms,
        action=StoreSeconds,
        metavar="MS",
        help="stop after this long (default: until Ctrl-C)",
    )
    # The old spelling, in seconds: hidden, still honoured.
    duration.add_argument("--duration-s", type=float, help=argparse.SUPPRESS)
    watch.add_argument("--timeout-ms", type=positive_ms, default=TOPICS_TIMEOUT_MS, help=_TIMEOUT_HELP)
    watch.set_defaults(func=_interruptible(cmd_proposals_watch))


def _marker_flags(parser: argparse.ArgumentParser, act: str) -> None:
    """The flags `proposals abort` and `proposals commit` share (`act`: the verb in their help)."""
    add_common_flags(parser)
    parser.add_argument(
        "candidate_id",
        metavar="ID",
        nargs="?",
        help="the candidate (`proposals list`); or name its transaction with --topic, --partition, --start-offset",
    )
    parser.add_argument("--topic", help="with --partition and --start-offset: the transaction's partition")
    parser.add_argument("--partition", type=int, help="with --topic and --start-offset")
    parser.add_argument(
        "--start-offset",
        type=int,
        help="with --topic and --partition: the offset of the transaction's first record, as "
        f"kafka-transactions.sh {act} takes it; the candidate the job proposes for it is used",
    )
    parser.add_argument("--execute", action="store_true", help="write the marker (default: dry run)")
    parser.add_argument(
        "--actor", help="who runs this, for the audit record (default: TXNWATCH_ACTOR, else the login name)"
    )
    caught = (
        "the marker aborts it too, while its transaction still commits on its other partitions"
        if act == "abort"
        else "the marker commits it too, whatever its coordinator decides for its other partitions"
    )
    parser.add_argument(
        "--allow-live-owner",
        action="store_true",
        help=f"{act} even though the transactional id that owns the producer id is live at the marker's epoch "
        "(refusal live-owner-same-epoch). The risk: if its producer adds this partition and writes to it between "
        f"the check and the marker, that write joins the open transaction and {caught}: exactly-once silently "
        "broken for it. Only when you know that producer no longer writes to this partition (stopped, or it "
        "never writes here). The flag is recorded in the audit record; a collision is still reported "
        f"(COLLISION, exit {EXIT_COLLISION})",
    )
    parser.add_argument("--timeout-ms", type=positive_ms, default=TOPICS_TIMEOUT_MS, help=_TIMEOUT_HELP)


# `txnwatch collect` flags → the fields of Settings.collector they set (the topic flags set both output topics).
COLLECT_FLAGS: dict[str, str | tuple[str, ...]] = {
    "interval": "collector.interval_s",
    "coordinator_source": "collector.coordinator_source",
    "coordinator_duration_filter_ms": "collector.coordinator_duration_filter_ms",
    "metrics_port": "collector.metrics_port",
    "describe_batch_size": "collector.describe_batch_size",
    "blocked_groups_after_ms": "collector.blocked_groups_after_ms",
    "probe_interval_ms": "collector.probe_interval_ms",
    "request_timeout_ms": "collector.request_timeout_ms",
    **{
        flag: (f"collector.producer_state_topic.{name}", f"collector.coordinator_state_topic.{name}")
        for flag, name in (
            ("topic_partitions", "partitions"),
            ("topic_replication_factor", "replication_factor"),
            ("topic_retention_ms", "retention_ms"),
            ("topic_cleanup_policy", "cleanup_policy"),
        )
    },
}


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    # kafka-python logs every refused connection and cancelled refresh at ERROR; txnwatch reports what matters
    # in its own terms (with the ACL or broker concerned), so kafka-python speaks only at DEBUG.
    logging.getLogger("kafka").setLevel(logging.DEBUG if level == "DEBUG" else logging.CRITICAL)


def _denied(wire: KafkaWire, topic: str) -> bool:
    try:
        return wire.describe_denied(topic)
    except WireError:  # the sweep reports an unreachable cluster in its own words
        return False


@dataclass
class _ErrorFormat:
    """How `_fail` writes an error on stderr: one line `txnwatch <command>: <message>`, or, when JSON output was
    asked for (`--output json` or TXNWATCH_OUTPUT=json; not `auto`, whose choice depends on stdout), one JSON
    object `{"command", "error", "exit_code", ...}` on one line. Set by `_settings` for the command that runs."""

    json: bool = False


_ERRORS = _ErrorFormat()


def _fail(command: str, message: str, code: int = EXIT_ERROR, **fields: Any) -> int:
    """Say what went wrong, on stderr (stdout stays the command's result), and return the exit code.

    Args:
        fields: more keys of the JSON object (text output prints each, as JSON, on a line of its own before).
    """
    if _ERRORS.json:
        # Messages keep their own characters (−1, →): JSON on a UTF-8 stream needs no escapes for them.
        error = {"command": command, "error": message, "exit_code": code, **fields}
        print(json.dumps(error, ensure_ascii=False), file=sys.stderr)
    else:
        for value in fields.values():
            print(json.dumps(value), file=sys.stderr)
        print(f"txnwatch {command}: {message}", file=sys.stderr)
    return code


def _asked_for_json(args: argparse.Namespace) -> bool:
    """JSON asked for by the flag, else by the environment: read raw when the settings themselves failed."""
    chosen = getattr(args, "output", None) or os.environ.get("TXNWATCH_OUTPUT", "")
    return str(chosen).strip().lower() == "json"


def _interruptible(command: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """The command, ending with `EXIT_INTERRUPTED` instead of a traceback when Ctrl-C interrupts it."""

    @functools.wraps(command)
    def run_command(args: argparse.Namespace) -> int:
        try:
            return command(args)
        except KeyboardInterrupt:
            print("txnwatch: interrupted", file=sys.stderr)
            return EXIT_INTERRUPTED

    return run_command


def _settings(
    command: str, args: argparse.Namespace, flags: FlagTargets | None = None, *, log_level: str = "INFO"
) -> Settings | int:
    """The command's settings (environment, then --command-config, then flags) with logging set up, or the exit
    code after saying in one line what is wrong with them."""
    _ERRORS.json = _asked_for_json(args)
    try:
        settings, ignored = settings_from(args, flags=flags, read_text=Path.read_text)
    except (SettingsError, ValidationError) as exc:
        return _fail(command, str(exc), EXIT_USAGE)
    _ERRORS.json = settings.output == "json"
    _setup_logging(settings.log_level or log_level)
    hide_secrets_in_logs(settings.kafka)
    for item in ignored:
        log.warning("--command-config %s: %s", args.command_config, item)
    return settings


def _is_terminal() -> bool:
    return sys.stdout.isatty()


@contextmanager
def _stop_on_signals() -> Iterator[threading.Event]:
    """Ctrl-C / SIGTERM set the event (the current sweep finishes, then we exit); a second Ctrl-C aborts."""
    stop = threading.Event()

    def handler(signum: int, _frame: object) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        log.info("signal %d: finishing the current sweep, then stopping", signum)
        stop.set()

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


# ----------------------------------------------------------------------------------------- collect


def cmd_collect(args: argparse.Namespace) -> int:
    settings = _settings("collect", args, COLLECT_FLAGS)
    if isinstance(settings, int):
        return settings
    kafka, cs, topics = settings.kafka, settings.collector, settings.topics
    publish = not args.once or args.publish
    metrics = CollectorMetrics()
    requests = RequestLog(metrics)
    try:
        admin = connect_admin(
            kafka, request_timeout_ms=cs.request_timeout_ms, bootstrap_timeout_ms=args.timeout_ms
        )
    except AdminError as exc:
        return _fail("collect", str(exc))
    publisher: Publisher | None = None
    server: Any = None
    try:
        wire = KafkaWire(
            admin,
            request_timeout_ms=cs.request_timeout_ms,
            max_in_flight=cs.max_in_flight_per_broker,
            fetch_partition_max_bytes=cs.fetch_partition_max_bytes,
            fetch_max_bytes=cs.fetch_max_bytes,
            fetch_rounds=cs.start_batch_fetch_rounds,
            requests=requests,
        )
        if cs.coordinator_source == "log" and _denied(wire, TRANSACTION_LOG_TOPIC):
            # Left out of the sweep's metadata without a word, the topic would silently get no position, and the
            # job would withhold every HANGING verdict for ever.
            log.error(
                "%s; without it no coordinator log position is measured and the streaming job never proves a "
                "transaction HANGING (or run both with --coordinator-source describe)",
                explain("Metadata", "TOPIC_AUTHORIZATION_FAILED", TRANSACTION_LOG_TOPIC),
            )
        open_partitions: set[tuple[str, int]] | None = set()
        sightings = None
        if publish:
            wanted: dict[str, OutputTopicSettings] = {topics.producer_state: cs.producer_state_topic}
            if cs.coordinator_source == "describe":
                wanted[topics.coordinator_state] = cs.coordinator_state_topic
            ensure_topics(admin, wanted)
            if args.no_restore:
                open_partitions = None
            else:
                consumer = consumer_for(kafka, client_id=f"{kafka.client_id}-restore")
                try:
                    open_partitions = restore_open_partitions(
                        consumer, topics.producer_state, timeout_s=cs.restore_timeout_s
                    )
                    sightings = restore_sightings(
                        consumer,
                        topics.producer_state,
                        cluster=settings.cluster,
                        timeout_s=cs.restore_timeout_s,
                    )
                finally:
                    consumer.close()
            publisher = Publisher(
                # A publish, like every request of the sweep, waits at most the request timeout (send's
                # metadata wait included): a cluster gone away is a failed sweep, said, not a minute's hang.
                KafkaSink(
                    producer_for(kafka, max_block_ms=cs.request_timeout_ms),
                    timeout_s=cs.request_timeout_ms / 1000,
                ),
                snapshot_topic=topics.producer_state,
                coordinator_topic=topics.coordinator_state,
                metrics=metrics,
            )
        collector = Collector(
            wire,
            cluster=settings.cluster,
            settings=cs,
            open_partitions=open_partitions,
            metrics=metrics,
            # Scheduled by the job's own limits (the same settings file or environment): a re-describe then
            # comes when the job's rules can first settle the transaction, and, where the job reads
            # __transaction_state, early reports its proofs can order by the log's offsets.
            redescribes=Redescribes(settings.detection, ordered=cs.coordinator_source == "log")
            if cs.probe_interval_ms
            else None,
            sightings=sightings,
        )
        poller = (
            CoordinatorPoller(
                wire, duration_filter_ms=cs.coordinator_duration_filter_ms, clock_ms=wall_clock_ms
            )
            if cs.coordinator_source == "describe"
            else None
        )
        # Without --once every sweep is published, so a publisher exists; --once publishes only with --publish.
        if args.once or publisher is None:
            output = output_format(settings.output, is_terminal=_is_terminal())
            return _collect_once(collector, publisher, poller, wire, settings.cluster, output)
        health = loop_health(cs)
        if cs.metrics_port:
            server = serve(metrics, cs.metrics_port, cs.metrics_addr, health=health)
            log.info("metrics on http://%s:%d/metrics", cs.metrics_addr, cs.metrics_port)
        publish_sweep: Callable[[SweepResult], object] = publisher.publish_sweep
        also: list[Callable[[], object]] = []
        if poller is not None:
            pub, cluster = publisher, settings.cluster

            def note_open_then_publish(result: SweepResult) -> None:
                # The poll after this sweep describes every id whose producer id it saw open, however its listing
                # looks (`CoordinatorPoller.saw_open`). Noted first: a publish that fails may have delivered
                # some of the sweep's reports.
                poller.saw_open(open_producer_ids(result))
                pub.publish_sweep(result)

            publish_sweep = note_open_then_publish

            def poll_coordinators() -> int:
                withheld = poller.withheld_expiries
                poll, _ = publish_coordinator_poll(poller, pub, wire, cluster=cluster, metrics=metrics)
                metrics.coordinator_expiries_withheld.inc(poller.withheld_expiries - withheld)
                return len(poll.records)

            also.append(poll_coordinators)
        # A re-describe says nothing of the other partitions, so it is published without the blocked-groups
        # lookup, which reports on every partition of a full sweep.
        publish_redescribe = publish_sweep
        if cs.blocked_groups_after_ms:
            publish_sweep = _then_blocked_groups(publish_sweep, admin, requests, cs, metrics)
        log.info(
            "collecting from %s every %.1fs into %s (cluster %s)",
            kafka.bootstrap_servers,
            cs.interval_s,
            topics.producer_state,
            settings.cluster,
        )
        with _stop_on_signals() as stop:
            sweeps = run(
                collector,
                publish_sweep,
                interval_s=cs.interval_s,
                stop=stop,
                also=also,
                metrics=metrics,
                max_sweeps=args.max_sweeps,
                health=health,
                probe_interval_s=cs.probe_interval_ms / 1000,
                publish_redescribe=publish_redescribe,
            )
        log.info("stopped after %d sweeps", sweeps)
        return 0
    except AdminError as exc:
        return _fail("collect", str(exc))
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    finally:
        if server is not None:
            server.shutdown()
        if publisher is not None:
            publisher.close()
        admin.close()


def _then_blocked_groups(
    publish_sweep: Callable[[SweepResult], object],
    admin: Any,
    requests: RequestLog,
    cs: CollectorSettings,
    metrics: CollectorMetrics,
) -> Callable[[SweepResult], object]:
    """Publish, then look up the consumer groups the sweep's long-open partitions hold up (admin/collect/blocked.py):
    after the publish, so the lookup never delays the snapshots, and never failing the sweep."""
    blocked = BlockedGroups(
        KafkaGroupOffsets(admin, requests=requests),
        after_ms=cs.blocked_groups_after_ms,
        report=metrics.observe_blocked_groups,
    )

    def publish_then_look_up(result: SweepResult) -> None:
        publish_sweep(result)
        blocked.after_sweep(result.snapshots)

    return publish_then_look_up


def publish_coordinator_poll(
    poller: CoordinatorPoller,
    publisher: Publisher,
    wire: ClusterWire,
    *,
    cluster: str,
    metrics: CollectorMetrics | None = None,
) -> tuple[CoordinatorPoll, CoordinatorLogPosition | None]:
    """One describe-fallback poll: its changed records, then the position of the coordinator-state topic.

    The position is measured only after `publish_coordinator` returned, i.e. after every record of the poll was
    acknowledged (acks=all): each record derived from coordinator state seen at or after the poll's `as_of_ms`
    (read before its ListTransactions) then lies below the end offsets, so a job that has applied everything
    below them holds the coordinators' state as of `as_of_ms`. If publishing fails, the poll is undone (sent
    again next time) and no position is published. An incomplete poll (`poll.incomplete`: a listing or a
    describe failed, a `__transaction_state` partition had no leader or moved) publishes its records, which are
    true, but no position: it vouches for every id, and ids the poll did not refresh may have moved on.
    """
    poll = poller.poll_as_of()
    try:
        publisher.publish_coordinator(poll.records)
    except BaseException:
        poller.unpublished(poll)
        raise
    if poll.incomplete is not None:
        if metrics is not None:
            metrics.coordinator_positions_withheld.labels(reason=poll.incomplete.reason).inc()
        return poll, None
    position = poller.log_position(wire, publisher.coordinator_topic, poll, cluster=cluster)
    if position is not None:
        publisher.publish_positions([position])
    return poll, position


def _collect_once(
    collector: Collector,
    publisher: Publisher | None,
    poller: CoordinatorPoller | None,
    wire: ClusterWire,
    cluster: str,
    output: str,
) -> int:
    result = collector.sweep()
    if poller is not None:
        poller.saw_open(open_producer_ids(result))  # as `cmd_collect`'s loop does
    if publisher is not None:
        publisher.publish_sweep(result)
    poll: CoordinatorPoll | None = None
    position: CoordinatorLogPosition | None = None
    if poller is not None and publisher is not None:
        poll, position = publish_coordinator_poll(poller, publisher, wire, cluster=cluster)
    elif poller is not None:
        # Nothing published, so no position: end offsets of the coordinator-state topic would not vouch for
        # records that never reached it.
        poll = poller.poll_as_of()
    # Why no position could vouch for this poll, even had it been published (None: complete).
    incomplete = poll.incomplete if poll is not None else None
    if output == "table":
        print(render_sweep(result))
        if incomplete is not None:
            print(f"coordinator-state position withheld ({incomplete.reason}): {incomplete.detail}")
    else:
        out = result.as_json()
        if poll is not None:
            out["coordinator_records"] = [r.model_dump(mode="json") for r in poll.records]
            out["coordinator_position_withheld"] = None if incomplete is None else incomplete._asdict()
            if position is not None:
                out["coordinator_log_positions"].append(position.model_dump(mode="json"))
        print(json.dumps(out))
    return 0


def render_sweep(result: SweepResult) -> str:
    lines = [
        f"sweep {result.sweep_id}: {result.partitions_covered}/{result.partitions_total} partitions covered in "
        f"{result.duration_s:.3f}s; {result.open_transactions} open transactions on {len(result.snapshots)} partitions"
    ]
    rows = [
        ["Topic", "Partition", "Leader", "ProducerId", "Epoch", "StartOffset", "StartTimestamp", "LSO", "HW"]
    ]
    for s in result.snapshots:
        for t in s.open_transactions:
            rows.append(
                [
                    s.topic,
                    str(s.partition),
                    str(s.leader),
                    str(t.producer_id),
                    str(t.producer_epoch),
                    str(t.start_offset),
                    str(t.start_timestamp_ms if t.start_timestamp_ms is not None else "-"),
                    str(s.last_stable_offset),
                    str(s.high_watermark),
                ]
            )
    if len(rows) > 1:
        lines.append(format_table(rows))
    for summary in result.summaries:
        errors = ", ".join(f"{k}={v}" for k, v in summary.errors.items()) or "none"
        lines.append(
            f"broker {summary.broker}: {summary.partitions_covered} partitions covered, errors: {errors}"
        )
    for position in result.positions:
        lines.append(
            f"{position.topic}: end offsets of {len(position.end_offsets)}/{position.partitions} partitions "
            f"as of {position.as_of_ms}"
        )
    lines.extend(f"problem: {p}" for p in dict.fromkeys(result.problems))
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------- inspect


def cmd_inspect_partition(args: argparse.Namespace) -> int:
    settings = _settings("inspect partition", args, log_level="WARNING")
    if isinstance(settings, int):
        return settings
    output = output_format(settings.output, is_terminal=_is_terminal())
    try:
        admin = connect_admin(settings.kafka, bootstrap_timeout_ms=args.timeout_ms)
    except AdminError as exc:
        return _fail("inspect partition", str(exc))
    try:
        report = inspect_partition(KafkaWire(admin), args.topic, args.partition, limits=settings.detection)
    except AdminError as exc:
        return _fail("inspect partition", str(exc))
    finally:
        admin.close()
    print(json.dumps(report.as_json()) if output == "json" else render_partition(report))
    return 0


def cmd_inspect_coordinator_log(args: argparse.Namespace) -> int:
    settings = _settings("inspect coordinator-log", args, log_level="WARNING")
    if isinstance(settings, int):
        return settings
    kafka = settings.kafka
    output = output_format(settings.output, is_terminal=_is_terminal())
    try:
        consumer = consumer_for(
            kafka,
            client_id=f"{kafka.client_id}-inspect",
            bootstrap_timeout_ms=args.timeout_ms or CONNECT_TIMEOUT_MS,
        )
    except WireError as exc:
        return _fail("inspect coordinator-log", f"cannot connect to {kafka.bootstrap_servers}: {exc}")
    try:
        with _stop_on_signals() as stop:
            if output != "json":
                print("\t".join(LOG_HEADER), flush=True)
            for entry in read_coordinator_log(
                consumer,
                transactional_id=args.transactional_id,
                from_beginning=args.from_beginning,
                max_records=args.max_records,
                idle_timeout_ms=args.timeout_ms,
                stop=stop,
            ):
                if output == "json":
                    print(json.dumps(entry_json(entry)), flush=True)
                else:
                    print("\t".join(render_log_entry(entry)), flush=True)
    except AdminError as exc:
        return _fail("inspect coordinator-log", str(exc))
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    finally:
        consumer.close()
    return 0


# --------------------------------------------------------------------------------------- proposals


def _proposals_consumer(kafka: KafkaSettings, timeout_ms: int) -> Consumer:
    """A group-less consumer for the candidates and audit topics, given `timeout_ms` (the command's --timeout-ms)
    to reach the cluster; an unreachable cluster is said as such."""
    try:
        return consumer_for(kafka, client_id=f"{kafka.client_id}-proposals", bootstrap_timeout_ms=timeout_ms)
    except WireTimeout as exc:
        raise AdminError(
            f"cannot reach the bootstrap servers {kafka.bootstrap_servers} ({exc}): check --bootstrap-server "
            "and --command-config"
        ) from exc


def _read_candidates(settings: Settings, timeout_ms: int) -> dict[str, AbortCandidate]:
    kafka = settings.kafka
    consumer = _proposals_consumer(kafka, timeout_ms)
    try:
        latest, malformed = latest_candidates(
            read_topic(consumer, settings.topics.abort_candidates, timeout_s=timeout_ms / 1000)
        )
    finally:
        consumer.close()
    if malformed:
        log.warning("%s: %d malformed records skipped", settings.topics.abort_candidates, malformed)
    return latest


def _done_ids(settings: Settings, timeout_ms: int) -> set[str]:
    kafka = settings.kafka
    consumer = _proposals_consumer(kafka, timeout_ms)
    try:
        records, _ = audit_records(read_topic(consumer, settings.topics.audit, timeout_s=timeout_ms / 1000))
    finally:
        consumer.close()
    return resolved_by_audit(records)


def _find_candidate(command: str, settings: Settings, args: argparse.Namespace) -> AbortCandidate | int:
    """The candidate named by its id, or (abort, commit) by --topic, --partition and --start-offset; else the exit
    code after saying why not."""
    topic: str | None = getattr(args, "topic", None)
    partition: int | None = getattr(args, "partition", None)
    start_offset: int | None = getattr(args, "start_offset", None)
    given = [v is not None for v in (topic, partition, start_offset)]
    if any(given) == (args.candidate_id is not None) or (any(given) and not all(given)):
        return _fail(
            command,
            "name a candidate by its ID, or by --topic, --partition and --start-offset (all three)",
            EXIT_USAGE,
        )
    try:
        latest = _read_candidates(settings, args.timeout_ms)
    except (AdminError, WireError) as exc:
        return _fail(command, str(exc))
    if topic is not None and partition is not None and start_offset is not None:
        found = candidate_at(
            latest.values(),
            cluster=settings.cluster,
            topic=topic,
            partition=partition,
            start_offset=start_offset,
        )
        if isinstance(found, str):
            return _fail(command, f"refused, no marker written: {found}", EXIT_REFUSED)
        return found
    candidate_id = args.candidate_id
    candidate = latest.get(candidate_id)
    if candidate is None:
        return _fail(command, f"no candidate {candidate_id} on {settings.topics.abort_candidates}")
    if candidate.cluster != settings.cluster:
        return _fail(
            command,
            f"candidate {candidate_id} is for cluster {candidate.cluster!r}, not {settings.cluster!r} "
            "(--cluster / TXNWATCH_CLUSTER): refusing to act on another cluster",
        )
    return candidate


def cmd_proposals_list(args: argparse.Namespace) -> int:
    settings = _settings("proposals list", args, log_level="WARNING")
    if isinstance(settings, int):
        return settings
    output = output_format(settings.output, is_terminal=_is_terminal())
    try:
        latest = _read_candidates(settings, args.timeout_ms)
        done = _done_ids(settings, args.timeout_ms)
    except (AdminError, WireError) as exc:
        return _fail("proposals list", str(exc))
    now = wall_clock_ms()
    pending = pending_candidates(latest.values(), cluster=settings.cluster, now_ms=now, done=done)
    if output == "json":
        print(json.dumps([candidate_row(c, now) for c in pending]))
    else:
        print(render_list(pending, now))
    return EXIT_CANDIDATES_LISTED if args.fail_if_any and pending else EXIT_DONE


def cmd_proposals_show(args: argparse.Namespace) -> int:
    settings = _settings("proposals show", args, log_level="WARNING")
    if isinstance(settings, int):
        return settings
    output = output_format(settings.output, is_terminal=_is_terminal())
    candidate = _find_candidate("proposals show", settings, args)
    if isinstance(candidate, int):
        return candidate
    try:
        admin = connect_admin(settings.kafka, bootstrap_timeout_ms=args.timeout_ms)
    except AdminError as exc:
        return _fail("proposals show", str(exc))
    wire = KafkaWire(admin)
    try:
        live = observe(wire, candidate)
        around = look_around(wire, candidate, live)
    except AdminError as exc:
        return _fail("proposals show", str(exc))
    finally:
        admin.close()
    # The candidate's own marker: a lost commit is verified for `proposals commit`, never as an abort.
    verify = verify_marker(candidate, live, result=candidate.spec.transaction_result)
    act = ActWith(
        bootstrap=settings.kafka.bootstrap_servers,
        cluster=settings.cluster,
        topic_prefix=settings.topics.prefix,
        command_config=str(args.command_config) if args.command_config else None,
    )
    now = wall_clock_ms()
    if output == "json":
        print(json.dumps(show_json(candidate, live, verify, act, now, around)))
    else:
        print(render_show(candidate, live, verify, act, now, around))
    return 0


def cmd_proposals_abort(args: argparse.Namespace) -> int:
    return _write_marker("proposals abort", args, "ABORT")


def cmd_proposals_commit(args: argparse.Namespace) -> int:
    return _write_marker("proposals commit", args, "COMMIT")


def _write_marker(command: str, args: argparse.Namespace, result: MarkerResult) -> int:
    """`proposals abort` (`result` ABORT) and `proposals commit` (COMMIT): the verified marker, its audit record
    published, its exit code."""
    settings = _settings(command, args, log_level="WARNING")
    if isinstance(settings, int):
        return settings
    output = output_format(settings.output, is_terminal=_is_terminal())
    candidate = _find_candidate(command, settings, args)
    if isinstance(candidate, int):
        return candidate
    refusal = no_longer_proposed(candidate)  # named by its id; the offsets' path finds OPENED ones only
    if refusal is not None:
        return _fail(command, f"refused, no marker written: {refusal}", EXIT_REFUSED)
    actor = args.actor or settings.actor or getpass.getuser()
    timeout_s = args.timeout_ms / 1000
    try:
        admin = connect_admin(settings.kafka, bootstrap_timeout_ms=args.timeout_ms)
    except AdminError as exc:
        return _fail(command, str(exc))
    audit_topic = settings.topics.audit
    clients: list[Producer | Consumer] = []
    try:
        try:
            ensure_topics(admin, {audit_topic: OutputTopicSettings(cleanup_policy="delete", partitions=1)})
            producer = producer_for(settings.kafka, linger_ms=0)
            clients.append(producer)
            consumer = consumer_for(settings.kafka, client_id=f"{settings.kafka.client_id}-proposals")
            clients.append(consumer)
        except (AdminError, WireError) as exc:
            return _fail(command, f"cannot use the audit topic {audit_topic}: {exc}; nothing was done")
        audit_log = TopicAuditLog(producer, consumer, audit_topic, timeout_s=timeout_s)
        options: dict[str, Any] = {
            "execute": args.execute,
            "actor": actor,
            "audit_log": audit_log,
            "allow_live_owner": args.allow_live_owner,
        }
        if result == "ABORT":
            options["allow_leader_change"] = args.allow_leader_change
        if result == "COMMIT":
            try:
                reader = consumer_for(
                    settings.kafka,
                    client_id=f"{settings.kafka.client_id}-proposals-read-committed",
                    isolation_level="read_committed",
                )
            except WireError as exc:
                return _fail(command, f"cannot read {candidate.topic} back: {exc}; nothing was done")
            clients.append(reader)
            attempt = commit(
                KafkaWire(admin),
                candidate,
                read_committed=lambda c: first_read_committed_offset(reader, c),
                **options,
            )
        else:
            attempt = abort(KafkaWire(admin), candidate, **options)
        record = attempt.audit
        try:
            audit_log.append(record)
        except (AdminError, WireError) as exc:
            # The attempt happened: never lose its record. It goes to stderr, and the run counts as failed.
            return _fail(
                command,
                f"{record.message}; the audit record was NOT published: {exc}",
                EXIT_ERROR,
                audit_record=record.model_dump(mode="json"),
            )
    finally:
        for client in clients:
            client.close()
        admin.close()
    if output == "json":
        print(audit_json(record))
    else:
        print(f"{record.outcome.value}: {record.message}")
        print(f"audit {record.audit_id} -> {audit_topic}")
    if attempt.exit_code != EXIT_DONE:
        return _fail(command, record.message, attempt.exit_code)
    return attempt.exit_code


def cmd_proposals_watch(args: argparse.Namespace) -> int:
    command = "proposals watch"
    settings = _settings(command, args, log_level="WARNING")
    if isinstance(settings, int):
        return settings
    policy: AbortPolicy | None = None
    if args.auto_abort or args.policy is not None:
        if not (args.auto_abort and args.policy is not None):
            return _fail(
                command, "--auto-abort and --policy FILE go together: the policy says what may be aborted", 2
            )
        try:
            policy = load_policy(args.policy)
        except PolicyError as exc:
            return _fail(command, str(exc), 2)
    output = output_format(settings.output, is_terminal=_is_terminal())
    base_actor = args.actor or settings.actor or getpass.getuser()
    actor = f"auto-abort:{base_actor}"
    timeout_s = args.timeout_ms / 1000
    kafka = settings.kafka
    try:
        admin = connect_admin(kafka, bootstrap_timeout_ms=args.timeout_ms)
    except AdminError as exc:
        return _fail(command, str(exc))
    clients: list[Any] = []
    try:
        follower = consumer_for(kafka, client_id=f"{kafka.client_id}-proposals-watch")
        clients.append(follower)
        audit_log: TopicAuditLog | None = None
        done: set[str] = set()
        earlier: list[int] = []
        try:
            if policy is not None:
                audit_topic = settings.topics.audit
                ensure_topics(
                    admin, {audit_topic: OutputTopicSettings(cleanup_policy="delete", partitions=1)}
                )
                producer = producer_for(kafka, linger_ms=0)
                clients.append(producer)
                reader = _proposals_consumer(kafka, args.timeout_ms)
                clients.append(reader)
                audit_log = TopicAuditLog(producer, reader, audit_topic, timeout_s=timeout_s)
                past = audit_log.all_records()
            else:
                consumer = _proposals_consumer(kafka, args.timeout_ms)
                clients.append(consumer)
                past, _ = audit_records(read_topic(consumer, settings.topics.audit, timeout_s=timeout_s))
        except (AdminError, WireError) as exc:
            return _fail(command, str(exc))
        done = resolved_by_audit(past)
        earlier = abort_times(past, actor=actor)  # every marker it wrote, or may have, counts
        wire = KafkaWire(admin)

        def attempt(candidate: AbortCandidate, audit_log: TopicAuditLog) -> AuditRecord:
            record = abort(wire, candidate, execute=True, actor=actor, audit_log=audit_log).audit
            try:
                audit_log.append(record)
            except (AdminError, WireError) as exc:
                print(audit_json(record), file=sys.stderr)
                log.error("the audit record of %s was NOT published: %s", candidate.candidate_id, exc)
            return record

        emit = printer(output, lambda line: print(line, flush=True))
        log_for_aborts = audit_log
        tries = (lambda c: attempt(c, log_for_aborts)) if log_for_aborts is not None else _no_abort
        state = Watch(settings.cluster, policy, tries, emit, done=done, aborts_at_ms=earlier)
        if policy is not None and output != "json":
            print(
                f"auto-abort as {actor}, policy {args.policy}: " + "; ".join(policy_summary(policy)),
                flush=True,
            )
        deadline = None if args.duration_s is None else time.monotonic() + args.duration_s
        with _stop_on_signals() as stop:
            try:
                for records in follow_topic(follower, settings.topics.abort_candidates, stop):
                    now = wall_clock_ms()
                    state.take(records, now)
                    state.act(now)
                    if deadline is not None and time.monotonic() > deadline:
                        break
            except (AdminError, WireError) as exc:
                return _fail(command, str(exc))
    finally:
        for client in clients:
            client.close()
        admin.close()
    return 0


def _no_abort(candidate: AbortCandidate) -> AuditRecord:
    # Watch calls `attempt` only with a policy, and a policy comes with an audit log.
    raise RuntimeError(f"no auto-abort without a policy ({candidate.candidate_id})")
