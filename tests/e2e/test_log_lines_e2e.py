"""End to end: `txnwatch stream` at its shipped log level writes no line per state key (issue 40, item 3).

Spark's state server logs a WARN for every lookup of a key its map state does not hold
(`TransformWithStateInPySparkStateServer`: "Map state ... doesn't contain key"), and a catch-up over a log of new
transactional ids looks up every one of them: before the job set that logger to ERROR (streaming/job.py
`QUIET_LOGGERS`), a catch-up over a million ids wrote about a million lines. Here the real CLI, as a process of
its own with its own log configuration, catches up on a copy of the transaction log (`--transaction-log-topic`)
holding 100,000 transactional ids it has never seen, one record each, until it says its coordinator view is
current; its whole output is then counted. It reads the copy in batches of 20,000 records
(`--coordinator-max-offsets-per-trigger`), as a first start on a large log is advised to: a batch then asks each
state bucket for a few hundred ids one by one, and every id it does not hold is a miss (a batch that touches
thousands of ids of a bucket reads its whole map instead, and the first batch finds every map empty: neither
asks for a key).
"""

from __future__ import annotations

import collections
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import NewTopic
from test_stream_e2e import wait_for

from detectors.codec import TxnLogKey, TxnLogValue, TxnStatus, encode_key, encode_value
from detectors.contract import COORDINATOR_LOG_POSITION_TYPE, TYPE_HEADER
from detectors.models import CoordinatorLogPosition

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
IDS = 100_000
BATCH = 20_000  # records a batch: a few hundred ids per state bucket, asked for one by one
# Far fewer than one per id: start-up, the catch-up's few reports, Spark's own handful.
MAX_LINES = 400


def _write_ids(bootstrap: str, topic: str, prefix: str) -> int:
    """One Empty record (InitProducerId) per transactional id, as the coordinator writes it; returns the end."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=50, batch_size=512_000)
    try:
        now = int(time.time() * 1000)
        for i in range(IDS):
            value = TxnLogValue(
                version=1,
                producer_id=5_000_000 + i,
                producer_epoch=0,
                transaction_timeout_ms=60_000,
                status=TxnStatus.EMPTY,
                partitions=None,
                last_update_timestamp_ms=now,
                start_timestamp_ms=-1,
            )
            producer.send(
                topic, key=encode_key(TxnLogKey(f"{prefix}-app-{i:06d}")), value=encode_value(value)
            )
        producer.flush(timeout=120)
    finally:
        producer.close()
    return IDS


def test_a_catch_up_over_100k_new_ids_writes_no_line_per_id(bootstrap: str, tmp_path: Path) -> None:
    prefix = f"logl{uuid.uuid4().hex[:6]}"
    log_copy = f"{prefix}-txnlog-copy"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(log_copy, 1, 1), NewTopic(f"{prefix}.producer-state", 1, 1)])
    admin.close()
    end = _write_ids(bootstrap, log_copy, prefix)
    out, err = tmp_path / "stream.out", tmp_path / "stream.err"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TXNWATCH_")}
    with out.open("wb") as o, err.open("wb") as e:
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "txnwatch_cli", "stream", "--bootstrap-server", bootstrap),
                *("--topic-prefix", prefix, "--cluster", "logl", "--master", "local[2]"),
                *("--checkpoint-location", str(tmp_path / "ck"), "--starting-offsets", "earliest"),
                *("--transaction-log-topic", log_copy, "--metrics-port", "0"),
                *("--coordinator-max-offsets-per-trigger", str(BATCH)),
            ],
            stdout=o,
            stderr=e,
            cwd=ROOT,
            env=env | {"PYSPARK_PYTHON": sys.executable},
            start_new_session=True,
        )
    try:
        # The collector's position of the copy, as after a sweep: the job is current once it applied all of it.
        position = CoordinatorLogPosition(
            cluster="logl",
            sweep_id="s",
            topic=log_copy,
            partitions=1,
            as_of_ms=int(time.time() * 1000),
            end_offsets={0: end},
        )
        producer = KafkaProducer(bootstrap_servers=bootstrap)
        producer.send(
            f"{prefix}.producer-state",
            value=position.model_dump_json().encode(),
            headers=[(TYPE_HEADER, COORDINATOR_LOG_POSITION_TYPE.encode())],
        ).get(timeout=30)
        producer.close()
        began = time.monotonic()
        wait_for(
            lambda: "coordinator view current" in out.read_text(errors="replace") or proc.poll() is not None,
            420,
            "the job to catch up on 100k ids",
            2,
        )
        caught_up_s = time.monotonic() - began
        assert proc.poll() is None, err.read_text(errors="replace")[-3000:]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            proc.kill()
    lines = out.read_text(errors="replace").splitlines() + err.read_text(errors="replace").splitlines()
    shapes = collections.Counter(re.sub(r"\d+", "N", line)[:120] for line in lines if line.strip())
    print(
        f"\ncaught up on {IDS:,} new ids in {caught_up_s:.0f}s; {len(lines)} lines of output, most repeated:"
    )
    for shape, n in shapes.most_common(5):
        print(f"  {n:>5} x {shape}")
    assert not [line for line in lines if "doesn't contain key" in line]
    assert len(lines) < MAX_LINES, shapes.most_common(10)
