"""End to end: a `__transaction_state` record that does not decode is never counted as applied (issue 20, item 6).

The real job (reconcile and dead-letter queries, the real connector) reads a copy of the transaction log
(`--transaction-log-topic`: clients cannot write `__transaction_state`) holding hand-made records, and the
snapshot topic holding hand-made snapshots and positions. A transactional id's last record says CompleteAbort
while a transaction of its producer id is open on a partition: HANGING, once the view is current. Then a record
of the same id with value version 2 arrives, as a broker that writes a TransactionLogValue version txnwatch does
not know would write it (KIP-915: version 2 will not be backward compatible). Its content is lost: the verdict is
UNCONFIRMED (`coordinator-record-undecodable`), no candidate, on /metrics, and the record is on the dead-letter
topic. A decodable record of that id then supersedes it, and the verdict follows that record.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import NewTopic
from pyspark.sql import SparkSession
from test_stream_e2e import Console, first_batch_done, read_topic, scrape, wait_for

from common.settings import KafkaSettings, Settings, StreamSettings
from common.topics import TopicSettings
from detectors.codec import TxnLogKey, TxnLogValue, TxnStatus, encode_key, encode_value
from detectors.contract import COORDINATOR_LOG_POSITION_TYPE, SNAPSHOT_TYPE, TYPE_HEADER
from detectors.models import AbortCandidate, CoordinatorLogPosition, OpenTransaction, PartitionSnapshot
from streaming import job

pytestmark = pytest.mark.e2e

PID = 880_000 + uuid.uuid4().int % 10_000


def value(status: TxnStatus, at_ms: int, *, version: int = 1) -> bytes:
    v = TxnLogValue(
        version=1,
        producer_id=PID,
        producer_epoch=3,
        transaction_timeout_ms=60_000,
        status=status,
        partitions=None,
        last_update_timestamp_ms=at_ms,
        start_timestamp_ms=at_ms - 1_000,
    )
    raw = encode_value(v)
    # A future version: the same layout under another version number, which txnwatch must not read as v1.
    return raw if version == 1 else version.to_bytes(2, "big") + raw[2:]


def test_an_undecodable_record_withholds_the_verdict_until_a_decodable_one_supersedes_it(
    spark: SparkSession, bootstrap: str, tmp_path: Path
) -> None:
    prefix = f"und{uuid.uuid4().hex[:8]}"
    log_copy, data_topic, tid = f"{prefix}-txnlog-copy", f"{prefix}-orders", f"{prefix}-tx"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    # the log copy, and the snapshot topic the collector would have created
    admin.create_topics([NewTopic(log_copy, 1, 1), NewTopic(f"{prefix}.producer-state", 1, 1)])
    admin.close()
    settings = Settings(
        cluster="und",
        kafka=KafkaSettings(bootstrap_servers=bootstrap),
        topics=TopicSettings(prefix=prefix),
        stream=StreamSettings(
            checkpoint_location=str(tmp_path / "ck"),
            trigger="2 seconds",
            starting_offsets="earliest",
            transaction_log_topic=log_copy,
            expire_after_ms=600_000,
            metrics_port=0,
        ),
    )
    opts = job.StreamOptions(
        settings=settings, kafka_options={"bootstrap.servers": bootstrap}, secondary_trigger="2 seconds"
    )
    assert settings.topics.producer_state == f"{prefix}.producer-state"
    job.ensure_topics(opts, settings.kafka.client_kwargs())
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    key = encode_key(TxnLogKey(tid))
    log_end = 0

    def log(raw: bytes) -> None:
        nonlocal log_end
        log_end = producer.send(log_copy, key=key, value=raw).get(timeout=30).offset + 1

    def report(observed_at_ms: int) -> None:
        """The collector's sweep as it publishes it: the partition's open transaction, then the log's end."""
        txn = OpenTransaction(
            producer_id=PID,
            producer_epoch=3,
            start_offset=5,
            start_timestamp_ms=observed_at_ms - 30_000,
            last_timestamp_ms=observed_at_ms - 30_000,
            start_batch_producer_epoch=3,
        )
        snap = PartitionSnapshot(
            cluster="und",
            sweep_id=str(observed_at_ms),
            observed_at_ms=observed_at_ms,
            leader=1,
            topic=data_topic,
            partition=0,
            open_transactions=(txn,),
            last_stable_offset=5,
            high_watermark=9,
            max_transaction_timeout_ms=60_000,
        )
        position = CoordinatorLogPosition(
            cluster="und",
            sweep_id=str(observed_at_ms),
            topic=log_copy,
            partitions=1,
            as_of_ms=observed_at_ms,
            end_offsets={0: log_end},
        )
        for model, kind in ((snap, SNAPSHOT_TYPE), (position, COORDINATOR_LOG_POSITION_TYPE)):
            producer.send(
                settings.topics.producer_state,
                value=model.model_dump_json().encode(),
                headers=[(TYPE_HEADER, kind.encode())],
            ).get(timeout=30)

    def verdict() -> object | None:
        verdicts, _ = running.live.snapshot()
        return next((v for v in verdicts if v.topic == data_topic), None)

    def candidates() -> list[AbortCandidate]:
        return [
            AbortCandidate.model_validate_json(r.value)
            for r in read_topic(bootstrap, settings.topics.abort_candidates)
        ]

    running = job.start(spark, opts, out=Console(), queries=("reconcile", "dead-letter"))
    try:
        wait_for(lambda: first_batch_done(running, "txnwatch-reconcile"), 240, "the job's first batch")
        now = int(time.time() * 1000)
        log(value(TxnStatus.COMPLETE_ABORT, now - 60_000))  # the transaction of PID was aborted a minute ago
        report(now)
        log(value(TxnStatus.ONGOING, now, version=2))  # the id's newest record: not readable
        future_offset = log_end - 1
        wait_for(lambda: time.time() * 1000 > now + 6_000, 10, "the grace to pass")
        report(int(time.time() * 1000))  # the view is current once the job has read the log's end

        def judged_on_the_current_view() -> object | None:
            v = verdict()
            done = v is not None and v.kind in ("UNCONFIRMED", "HANGING")
            return v if done and v.withheld != "coordinator-view-behind" else None

        v = wait_for(judged_on_the_current_view, 180, "the verdict once the view has read the log's end")
        # The stale CompleteAbort record must not prove HANGING: the id's newest record was not read.
        assert (v.kind, v.reason, v.withheld) == (
            "UNCONFIRMED",
            "coordinator-completed",
            "coordinator-record-undecodable",
        )
        for _ in range(3):  # and it stays so: never HANGING, never a candidate
            time.sleep(2)
            assert verdict().kind == "UNCONFIRMED"  # type: ignore[union-attr]
        assert candidates() == []
        m = scrape(running.metrics_port)
        assert m["txnwatch_coordinator_records_undecodable_total"] == [({"cluster": "und"}, 1.0)]
        assert m["txnwatch_coordinator_records_undecodable_pending"] == [({"cluster": "und"}, 1.0)]
        withheld_series = {lb["reason"]: n for lb, n in m["txnwatch_withheld_verdicts"]}
        assert withheld_series == {"coordinator-record-undecodable": 1.0}
        (dead,) = wait_for(lambda: read_topic(bootstrap, settings.topics.dead_letter), 120, "the dead letter")
        assert (dead.key, dead.value) == (key, value(TxnStatus.ONGOING, now, version=2))
        assert dict(dead.headers)["txnwatch.source-offset"].decode() == str(future_offset)
        assert dict(dead.headers)["txnwatch.error"].decode().endswith("unsupported value version 2")

        # A decodable record of the id supersedes it: the verdict follows that record (aborted: HANGING).
        log(value(TxnStatus.COMPLETE_ABORT, int(time.time() * 1000) - 30_000))
        report(int(time.time() * 1000))

        def hanging() -> object | None:
            v = verdict()
            return v if v is not None and v.kind == "HANGING" else None

        v = wait_for(hanging, 180, "the verdict once a decodable record supersedes the lost one")
        assert v.reason == "coordinator-completed"
        (c,) = wait_for(candidates, 120, "the candidate")
        assert (c.topic, c.spec.producer_id, c.start_offset) == (data_topic, PID, 5)
        m = scrape(running.metrics_port)
        assert m["txnwatch_coordinator_records_undecodable_total"] == [({"cluster": "und"}, 1.0)]
        assert m["txnwatch_coordinator_records_undecodable_pending"] == [({"cluster": "und"}, 0.0)]
    finally:
        running.stop()
        producer.close()
