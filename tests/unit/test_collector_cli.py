"""The `collect` / `inspect` command lines, settings merging, and the inspection helpers."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from dataclasses import dataclass

import pytest
from collector_fakes import T0, FakeCluster, FakeCoordinators, description, producer, start_batch

import txnwatch_cli
from admin.cli.main import COLLECT_FLAGS, _stop_on_signals, render_sweep
from admin.collect.collector import Collector
from admin.inspect.report import (
    VIEW_NOTE,
    decode_entry,
    entry_json,
    inspect_partition,
    render_log_entry,
    render_partition,
)
from admin.wire.types import FetchFailure, Offsets, record_from_description
from common.cli_options import settings_from
from common.settings import CollectorSettings, Settings
from common.text import duration, iso
from detectors.codec import TxnLogKey, TxnLogValue, TxnStatus, encode_key, encode_value
from detectors.models import CoordinatorState, DetectionLimits, HangingReason, VerdictKind, WithheldReason
from detectors.rules import classify

pytestmark = pytest.mark.unit


def parse(*argv: str) -> object:
    return txnwatch_cli.build_parser().parse_args(list(argv))


# ------------------------------------------------------------------------------------------- parsing


def collector_section(*argv: str, environment: Settings | None = None) -> CollectorSettings:
    settings, _ = settings_from(parse(*argv), flags=COLLECT_FLAGS, environment=environment or Settings())  # type: ignore[arg-type]
    return settings.collector


def test_collect_arguments() -> None:
    args = parse(
        "collect",
        "--bootstrap-server",
        "b:9092",
        "--command-config",
        "client.properties",
        "--interval-ms",
        "2500",
        "--coordinator-source",
        "describe",
        "--topic-partitions",
        "12",
        "--topic-cleanup-policy",
        "compact",
        "--once",
    )
    assert args.func.__name__ == "cmd_collect"  # type: ignore[attr-defined]
    cs = collector_section(
        "collect",
        "--interval-ms",
        "2500",
        "--coordinator-source",
        "describe",
        "--topic-partitions",
        "12",
        "--topic-cleanup-policy",
        "compact",
    )
    assert (cs.interval_s, cs.coordinator_source) == (2.5, "describe")
    assert cs.producer_state_topic.partitions == cs.coordinator_state_topic.partitions == 12
    assert cs.producer_state_topic.cleanup_policy == "compact"
    assert cs.producer_state_topic.retention_ms == 86_400_000  # not given: the default stays


def test_flags_override_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    # The names admin/settings.CollectorEnvironment read, now the `collector` section of the one Settings.
    monkeypatch.setenv("TXNWATCH_COLLECTOR__INTERVAL_S", "30")
    monkeypatch.setenv("TXNWATCH_COLLECTOR__METRICS_PORT", "9999")
    monkeypatch.setenv("TXNWATCH_COLLECTOR__PRODUCER_STATE_TOPIC__PARTITIONS", "3")
    env = Settings().collector
    assert (env.interval_s, env.metrics_port, env.producer_state_topic.partitions) == (30, 9999, 3)
    cs = collector_section("collect", "--interval-ms", "5000", environment=Settings())
    assert (cs.interval_s, cs.metrics_port, cs.producer_state_topic.partitions) == (5, 9999, 3)


def test_invalid_flag_values_are_rejected() -> None:
    with pytest.raises(ValueError, match="describe_batch_size"):
        collector_section("collect", "--describe-batch-size", "501")


def test_inspect_arguments() -> None:
    args = parse("inspect", "partition", "--topic", "orders", "--partition", "3", "--output", "json")
    assert (args.topic, args.partition, args.output) == ("orders", 3, "json")  # type: ignore[attr-defined]
    args = parse("inspect", "coordinator-log", "--transactional-id", "tx", "--from-beginning")
    assert args.func.__name__ == "cmd_inspect_coordinator_log"  # type: ignore[attr-defined]
    with pytest.raises(SystemExit):
        parse("inspect", "partition", "--topic", "orders")


def test_ctrl_c_sets_the_stop_event_and_a_second_one_interrupts() -> None:
    before = signal.getsignal(signal.SIGINT)  # not always Python's default: a SparkContext installs its own
    with _stop_on_signals() as stop:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
        assert stop.is_set()
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
    assert signal.getsignal(signal.SIGINT) is before


def test_render_sweep() -> None:
    cluster = FakeCluster(
        leaders={("orders", 0): 1},
        producers={("orders", 0): [producer()]},
        starts={(("orders", 0), 100): start_batch()},
        offsets={("orders", 0): Offsets(100, 103)},
    )
    text = render_sweep(
        Collector(cluster, cluster="c", settings=CollectorSettings(), open_partitions=set()).sweep()
    )
    assert "1/1 partitions covered" in text and "1 open transactions on 1 partitions" in text
    assert "orders  0          1       1000        5      100          1750000000000   100  103" in text
    assert "broker 1: 1 partitions covered, errors: none" in text


# ------------------------------------------------------------------------------------ inspect partition


@dataclass
class FakeBoth(FakeCluster, FakeCoordinators):
    pass


def test_inspect_partition_joins_leader_and_coordinator_views() -> None:
    fake = FakeBoth(
        leaders={("orders", 0): 1, ("__transaction_state", 0): 1},
        producers={
            ("orders", 0): [
                producer(),  # tx-1 Ongoing without orders-0: find-hanging's rule
                producer(producer_id=2, current_txn_start_offset=120),  # owned by nobody
                producer(producer_id=3, current_txn_start_offset=130),  # tx-3 lists orders-0
            ]
        },
        starts={(("orders", 0), 100): start_batch(), (("orders", 0), 130): FetchFailure("X", permanent=True)},
        offsets={("orders", 0): Offsets(100, 150)},
        descriptions={
            "tx-1": description(partitions=(("orders", 1),)),
            "tx-3": description(transactional_id="tx-3", producer_id=3, partitions=(("orders", 0),)),
        },
    )
    report = inspect_partition(fake, "orders", 0, clock_ms=lambda: T0 + 120_000)
    assert (report.leader, report.last_stable_offset, report.high_watermark, report.lso_lag) == (
        1,
        100,
        150,
        50,
    )
    t1, t2, t3 = report.transactions
    assert t1.txn.start_timestamp_ms == T0 and t1.age_ms == 120_000
    assert t1.coordinator.transactional_id == "tx-1" and t1.coordinator.partition_listed is False
    assert t2.coordinator.transactional_id is None and t2.coordinator.error is None
    assert t3.coordinator.partition_listed
    assert t3.start_batch_error == "X" and t3.age_ms == 120_000 - 1_000  # LastTimestamp stands in
    assert fake.list_calls[-1]["producer_ids"] == [1000, 2, 3]
    # The verdicts are rules.classify's. DescribeTransactions is not a view shown current, so a HANGING rule
    # that holds (find-hanging's, and no owner at all) is withheld: UNCONFIRMED, never HANGING.
    assert t1.verdict is not None and t2.verdict is not None and t3.verdict is not None
    assert (t1.verdict.kind, t1.verdict.reason, t1.verdict.withheld) == (
        VerdictKind.UNCONFIRMED,
        HangingReason.PARTITION_NOT_IN_TRANSACTION,
        WithheldReason.COORDINATOR_VIEW_BEHIND,
    )
    assert (t2.verdict.kind, t2.verdict.reason) == (
        VerdictKind.UNCONFIRMED,
        HangingReason.NO_COORDINATOR_STATE,
    )
    # tx-3 lists the partition but began 2 minutes ago with a 1-minute timeout: the coordinator would be overdue,
    # but inspect does not show its view current (docs/detection.md section 4), so it is only LATE.
    assert t3.verdict.kind is VerdictKind.LATE and t3.verdict.reason is None
    assert all(t.note == t.verdict.explanation for t in (t1, t2, t3) if t.verdict is not None)
    assert "does not list the partition" in t1.note and "no transactional id owns producer 2" in t2.note
    assert all(t.verdict.evidence.view_current_as_of_ms is None for t in (t1, t2, t3) if t.verdict)
    out = report.as_json()
    assert out["lso_lag"] == 50 and out["open_transactions"][0]["coordinator"]["state"] == "Ongoing"
    assert [t["verdict"]["kind"] for t in out["open_transactions"]] == [
        "UNCONFIRMED",
        "UNCONFIRMED",
        "LATE",
    ]
    json.dumps(out)
    text = render_partition(report)
    assert "orders-0  leader 1  LSO 100  HW 150  LSO lag 50" in text
    assert "tx-1" in text and "tx-3" in text
    assert "UNCONFIRMED (partition-not-in-transaction)" in text and "LATE" in text
    assert text.splitlines()[1].split()[-2:] == ["Verdict", "Note"]
    assert text.endswith(VIEW_NOTE) and "HANGING rule that holds shows as UNCONFIRMED" in VIEW_NOTE


def test_inspect_partition_verdict_is_classify_on_the_described_record() -> None:
    fake = FakeBoth(
        leaders={("orders", 0): 1},
        producers={("orders", 0): [producer()]},
        starts={(("orders", 0), 100): start_batch()},
        descriptions={"tx-1": description(state="CompleteCommit", partitions=())},
    )
    now = T0 + 600_000
    limits = DetectionLimits(grace_ms=1_000)
    report = inspect_partition(fake, "orders", 0, limits=limits, clock_ms=lambda: now)
    (t,) = report.transactions
    record = record_from_description(fake.descriptions["tx-1"], seen_at_ms=now)
    assert t.verdict == classify(t.txn, report, record, now_ms=now, limits=limits, view_current_ms=None)
    # When the coordinator last changed is not in DescribeTransactions: it counts as seen now, so "completed
    # before the report" cannot be proven here; the transaction is judged on its age only (10 min > 1 min).
    assert t.verdict is not None and t.verdict.kind is VerdictKind.LATE
    assert t.verdict.evidence.coordinator is not None
    assert t.verdict.evidence.coordinator.last_update_timestamp_ms == now


def test_inspect_partition_without_a_coordinator_view_gives_no_verdict() -> None:
    fake = FakeBoth(
        leaders={("orders", 0): 1},
        producers={("orders", 0): [producer(), producer(producer_id=2, current_txn_start_offset=120)]},
        descriptions={"tx-1": description()},
        describe_errors={"tx-1": "COORDINATOR_LOAD_IN_PROGRESS"},
        failed={2: "BROKER_UNREACHABLE"},
    )
    t1, t2 = inspect_partition(fake, "orders", 0).transactions
    assert t1.verdict is None and t2.verdict is None
    assert t1.note.startswith("coordinator view unavailable: DescribeTransactions for tx-1 failed")
    assert t2.note == "coordinator view unavailable: ListTransactions failed on broker 2: BROKER_UNREACHABLE"
    row = render_partition(inspect_partition(fake, "orders", 0)).splitlines()[2]
    assert re.search(r"  -\s+coordinator view unavailable: DescribeTransactions for tx-1", row)


def test_inspect_partition_asks_the_new_leader_after_not_leader() -> None:
    pauses: list[float] = []
    fake = FakeBoth(leaders={("orders", 0): 1}, not_leader_once={("orders", 0)})
    report = inspect_partition(fake, "orders", 0, sleep=pauses.append)
    assert report.transactions == [] and pauses == [0.3] and sum(fake.describe_requests.values()) == 2


def test_inspect_partition_gives_up_on_a_leader_that_keeps_moving() -> None:
    from admin.wire.errors import AdminError

    pauses: list[float] = []
    fake = FakeBoth(leaders={("orders", 0): 1}, partition_errors={("orders", 0): "NOT_LEADER_OR_FOLLOWER"})
    with pytest.raises(AdminError, match="NOT_LEADER_OR_FOLLOWER"):
        inspect_partition(fake, "orders", 0, sleep=pauses.append)
    assert pauses == [0.3, 0.3] and sum(fake.describe_requests.values()) == 3


def test_inspect_partition_without_open_transactions() -> None:
    fake = FakeBoth(leaders={("orders", 0): 1}, offsets={("orders", 0): Offsets(7, 7)})
    report = inspect_partition(fake, "orders", 0)
    assert report.transactions == [] and report.lso_lag == 0
    assert render_partition(report).endswith("no open transactions")


def test_inspect_unknown_partition() -> None:
    from admin.wire.errors import AdminError

    with pytest.raises(AdminError, match="does not exist"):
        inspect_partition(FakeBoth(leaders={("orders", 0): 1}), "orders", 9)


def test_iso_and_duration() -> None:
    assert iso(T0) == "2025-06-15T15:06:40.000Z" and iso(-1) == "-" and iso(None) == "-"
    assert duration(61_500) == "1m01s" and duration(3_723_000) == "1h02m03s"


# ------------------------------------------------------------------------------------- coordinator log


# Kafka's placement of a transactional id (detectors/placement.py): tests/unit/test_placement.py.


def test_decode_entry() -> None:
    key = encode_key(TxnLogKey("tx-1"))
    value = encode_value(
        TxnLogValue(
            version=1,
            producer_id=1000,
            producer_epoch=5,
            transaction_timeout_ms=60_000,
            status=TxnStatus.ONGOING,
            partitions=(("orders", (0, 1)),),
            last_update_timestamp_ms=T0 + 1,
            start_timestamp_ms=T0,
        )
    )
    entry = decode_entry(2, 41, T0 + 2, key, value)
    assert entry.record is not None and entry.record.state is CoordinatorState.ONGOING
    assert (entry.record.source_partition, entry.record.source_offset) == (2, 41)
    row = render_log_entry(entry)
    assert row[3:6] == ["tx-1", "Ongoing", "1000"] and row[8] == "orders-0,orders-1"
    assert entry_json(entry)["transactional_id"] == "tx-1"
    tomb = decode_entry(2, 42, T0 + 3, key, None)
    assert tomb.record is not None and tomb.record.tombstone and render_log_entry(tomb)[4] == "<DELETE>"
    bad = decode_entry(2, 43, T0, key, b"\x00\x09garbage")
    assert bad.record is None and bad.error and render_log_entry(bad)[4].startswith("undecodable")
    assert entry_json(bad)["key_hex"] == key.hex()
    assert decode_entry(0, 0, T0, None, None).error == "record without a key"


def test_inspect_partition_says_when_no_owner_cannot_be_shown() -> None:
    # Without Describe on every transactional id, ListTransactions leaves owners out without a word.
    fake = FakeBoth(
        leaders={("orders", 0): 1, ("__transaction_state", 0): 1},
        producers={("orders", 0): [producer(producer_id=2, current_txn_start_offset=120)]},
        offsets={("orders", 0): Offsets(120, 150)},
        deny_unknown=True,
    )
    (t,) = inspect_partition(fake, "orders", 0, clock_ms=lambda: T0 + 120_000).transactions
    assert t.verdict is None and t.coordinator.error is not None
    assert "grant the ACL Describe on TransactionalId '*'" in t.coordinator.error
