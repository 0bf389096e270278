"""What a real Kafka 4.3 coordinator writes in `__transaction_state`: the tagged PreviousProducerId and NextProducerId
are persisted (so the *previous* and *next* roles of detectors/rules.py can be met on a real broker)."""

from __future__ import annotations

import time

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.admin import NewTopic
from kafka.structs import TopicPartition

from detectors.codec import DecodeError, TxnLogValue, TxnStatus, decode_key, decode_value

pytestmark = pytest.mark.broker

TXN_LOG = "__transaction_state"


def values_of(bootstrap: str, transactional_id: str) -> list[TxnLogValue]:
    """Every decoded value (tombstones left out) of the id's records, in log order."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, consumer_timeout_ms=2_000)
    try:
        parts = [TopicPartition(TXN_LOG, p) for p in sorted(consumer.partitions_for_topic(TXN_LOG) or ())]
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        out = []
        for r in consumer:
            try:
                if decode_key(r.key).transactional_id != transactional_id:
                    continue
                value = decode_value(r.value)
            except DecodeError:
                continue
            if value is not None:
                out.append(value)
        return out
    finally:
        consumer.close()


def test_the_coordinator_persists_the_previous_producer_id_on_every_record(
    bootstrap: str, unique: str
) -> None:
    """Kafka 4.3.1's `TransactionLog.valueToBytes` writes PreviousProducerId and NextProducerId whenever the value
    is v1 (the cluster's transaction.version >= 1). `TransactionMetadata.prepareTransitionTo` sets the previous
    producer id to the producer id before the transition: on every record that keeps the producer id it is that
    id; only a producer-id rotation (epoch overflow) makes it another one. Before KAFKA-20310 both were lost."""
    tid, topic = f"{unique}fields", f"{unique}data"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(topic, 1, 1)])
    admin.close()
    producer = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=tid)
    producer.init_transactions()
    producer.begin_transaction()
    producer.send(topic, b"x").get(timeout=30)
    producer.commit_transaction()
    producer.close()
    deadline = time.monotonic() + 30
    while not (values := values_of(bootstrap, tid)) or values[-1].status is not TxnStatus.COMPLETE_COMMIT:
        assert time.monotonic() < deadline, f"no CompleteCommit for {tid}: {values}"
        time.sleep(0.5)
    assert [v.status for v in values][-3:] == [
        TxnStatus.ONGOING,
        TxnStatus.PREPARE_COMMIT,
        TxnStatus.COMPLETE_COMMIT,
    ]
    assert {v.version for v in values} == {1}
    pid = values[-1].producer_id
    assert [(v.producer_id, v.previous_producer_id, v.next_producer_id) for v in values] == [
        (pid, pid, -1)
    ] * len(values)
