"""The job's Kafka source options (streaming/sources.py `reader_options`), without a JVM."""

from __future__ import annotations

import pytest

from streaming.sources import FETCH_MAX_WAIT_MS, KafkaSource, reader_options

pytestmark = pytest.mark.unit


def test_the_brokers_hold_the_jobs_fetches_briefly_unless_the_client_properties_say_otherwise() -> None:
    """Kafka's default `fetch.max.wait.ms` (500 ms) cost about 0.25 s per partition of every batch: most of a batch
    on a 50-partition `__transaction_state` (docs/BENCHMARKS.md)."""
    plain = reader_options(KafkaSource("__transaction_state", {"kafka.bootstrap.servers": "b:9092"}))
    assert plain["kafka.fetch.max.wait.ms"] == str(FETCH_MAX_WAIT_MS) and FETCH_MAX_WAIT_MS <= 50
    assert plain["subscribe"] == "__transaction_state" and plain["failOnDataLoss"] == "false"
    assert "maxOffsetsPerTrigger" not in plain
    theirs = reader_options(
        KafkaSource(
            "t", {"kafka.fetch.max.wait.ms": "200"}, starting_offsets="latest", max_offsets_per_trigger=9
        )
    )
    assert theirs["kafka.fetch.max.wait.ms"] == "200"
    assert (theirs["startingOffsets"], theirs["maxOffsetsPerTrigger"]) == ("latest", "9")
