"""The ACL a marker needs, by Kafka release, on real brokers (issue 31, item 2): Kafka 3.7.2 and 3.8.1 from Maven
Central (dev/kafka_versions.py), KRaft, SASL/SCRAM with the StandardAuthorizer (no ACL = denied).

`KafkaApis.handleWriteTxnMarkersRequest` authorizes ClusterAction on the cluster only before 3.8 and Alter (else
ClusterAction) from 3.8 on (KIP-1037). The abort principal gets what docs/security.md lists for it, with Alter on the
cluster: on 3.8.1 `txnwatch proposals abort --execute` aborts a real orphan; on 3.7.2 it is DENIED and the message
names ClusterAction, the leader's ApiVersions telling its release; granted ClusterAction, the same abort lands.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import (
    ACL,
    ACLFilter,
    ACLOperation,
    ACLPermissionType,
    ACLResourcePatternType,
    NewTopic,
    ResourcePattern,
    ResourcePatternFilter,
    ResourceType,
)
from workloads import PROPOSALS_CLUSTER, lso, plan_by_hand

import dev.kafka as testbed
from admin.wire.kafka_wire import KafkaWire
from dev import workload

# Two SASL beds of other releases (about 2 minutes): `make compat`, beside the matrix.
pytestmark = [pytest.mark.broker, pytest.mark.compat]

ROOT = Path(__file__).resolve().parents[2]
ABORT = "txnwatch-abort"


def allow(principal: str, rtype: ResourceType, name: str, op: ACLOperation, pattern: Any) -> ACL:
    return ACL(f"User:{principal}", "*", op, ACLPermissionType.ALLOW, ResourcePattern(rtype, name, pattern))


def grant(admin: KafkaAdminClient, acls: list[ACL]) -> None:
    result = admin.create_acls(acls)
    assert not result["failed"], result["failed"]
    time.sleep(1.0)  # one broker applies its metadata at once; leave it a moment


@pytest.fixture(scope="module", params=["3.7.2", "3.8.1"])
def bed(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Any]]:
    """(release, cluster): a one-node SASL/SCRAM bed of that release, partition verification off (the orphan)."""
    version = str(request.param)
    state = tmp_path_factory.mktemp(f"acl-{version}")
    cluster = testbed.start_cluster(
        testbed.TestBedConfig(security="sasl-scram", partition_verification=False, kafka_version=version),
        state,
    )
    try:
        yield version, cluster
    finally:
        testbed.stop_cluster(state)


def make_orphan(cluster: Any, prefix: str) -> dict[str, Any]:
    """dev/workload.py's hanging scenario as the super user: a committed transaction that also wrote, unverified,
    to a partition its coordinator never added; then its producer restarts (the id moves to the next epoch)."""
    kwargs = cluster.client_kwargs()
    security = {k: v for k, v in kwargs.items() if k != "bootstrap_servers"}
    admin = KafkaAdminClient(**kwargs)
    try:
        topic, orphan_topic = f"{prefix}t", f"{prefix}orphan"
        workload.ensure_topics(admin, [topic, orphan_topic], 1)
        txn_id = f"{prefix}{uuid.uuid4().hex[:6]}"
        producer = workload._producer(cluster.bootstrap_servers, txn_id, **security)
        pid, epoch = workload._pid_epoch(producer)
        producer.begin_transaction()
        producer.send(topic, value=b"committed", partition=0).get(timeout=30)
        offset = workload.raw_transactional_produce(
            admin,
            topic=orphan_topic,
            partition=0,
            transactional_id=txn_id,
            producer_id=pid,
            producer_epoch=epoch,
            base_sequence=0,
            timestamp_ms=int(time.time() * 1000),
            value=b"orphan",
        )
        producer.commit_transaction()
        producer.close(timeout=10)
        assert workload.restart_owner(cluster.bootstrap_servers, txn_id, **security) == epoch + 1
    finally:
        admin.close()
    return {"topic": orphan_topic, "partition": 0, "producer_id": pid, "start_offset": offset}


def publish_candidate(cluster: Any, prefix: str, orphan: dict[str, Any]) -> str:
    """The orphan planned as the job would plan it, on `<prefix>.abort-candidates` (as the super user)."""
    kwargs = cluster.client_kwargs()
    admin = KafkaAdminClient(**kwargs)
    try:
        candidate = plan_by_hand(KafkaWire(admin), orphan["topic"], 0, orphan["producer_id"])
        admin.create_topics(
            [NewTopic(f"{prefix}.abort-candidates", 1, 1, topic_configs={"cleanup.policy": "compact"})]
        )
    finally:
        admin.close()
    producer = KafkaProducer(acks="all", **kwargs)
    try:
        producer.send(
            f"{prefix}.abort-candidates",
            key=candidate.candidate_id.encode(),
            value=candidate.model_dump_json().encode(),
        ).get(timeout=30)
    finally:
        producer.close()
    return str(candidate.candidate_id)


def abort(cluster: Any, prefix: str, candidate_id: str) -> subprocess.CompletedProcess[str]:
    """`txnwatch proposals abort ID --execute` as the abort principal."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "txnwatch_cli",
            "proposals",
            "abort",
            candidate_id,
            "--execute",
            "--actor",
            "on-call",
            "--bootstrap-server",
            cluster.bootstrap_servers,
            "--command-config",
            str(cluster.client_properties(ABORT)),
            "--cluster",
            PROPOSALS_CLUSTER,
            "--topic-prefix",
            prefix,
            "--output",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
    )


def test_the_abort_names_the_cluster_acl_of_the_brokers_release(bed: tuple[str, Any]) -> None:
    version, cluster = bed
    prefix = f"v{uuid.uuid4().hex[:8]}"
    admin = KafkaAdminClient(**cluster.client_kwargs())
    try:
        # What docs/security.md gives the abort principal (topics wider: only the cluster ACL is under test).
        literal, cluster_name = ACLResourcePatternType.LITERAL, "kafka-cluster"
        grant(
            admin,
            [
                *(
                    allow(ABORT, ResourceType.TOPIC, "*", op, literal)
                    for op in (
                        ACLOperation.READ,
                        ACLOperation.WRITE,
                        ACLOperation.CREATE,
                        ACLOperation.DESCRIBE,
                    )
                ),
                allow(ABORT, ResourceType.TRANSACTIONAL_ID, "*", ACLOperation.DESCRIBE, literal),
                allow(ABORT, ResourceType.CLUSTER, cluster_name, ACLOperation.ALTER, literal),
            ],
        )
        orphan = make_orphan(cluster, f"{prefix}-")
        candidate_id = publish_candidate(cluster, prefix, orphan)

        first = abort(cluster, prefix, candidate_id)
        if version == "3.8.1":
            # KIP-1037: Alter on the cluster authorizes WriteTxnMarkers.
            assert first.returncode == 0, first.stdout + first.stderr
            assert json.loads(first.stdout)["outcome"] == "ABORTED"
        else:
            assert first.returncode == 1, first.stdout + first.stderr
            record = json.loads(first.stdout)
            assert record["outcome"] == "DENIED" and record["marker_written"] is False
            assert record["message"].startswith(
                "WriteTxnMarkers was denied (CLUSTER_AUTHORIZATION_FAILED): grant the ACL ClusterAction on the "
                "cluster (this broker is older than Kafka 3.8"
            ), record["message"]
            assert "grant the ACL Alter" not in first.stdout + first.stderr
            # The ACL the message names makes the same abort land.
            grant(
                admin,
                [allow(ABORT, ResourceType.CLUSTER, cluster_name, ACLOperation.CLUSTER_ACTION, literal)],
            )
            second = abort(cluster, prefix, candidate_id)
            assert second.returncode == 0, second.stdout + second.stderr
            assert json.loads(second.stdout)["outcome"] == "ABORTED"
        wire = KafkaWire(admin)
        assert (lso(wire, orphan["topic"], 0) or 0) > orphan["start_offset"]
    finally:
        admin.delete_acls(
            [
                ACLFilter(
                    f"User:{ABORT}",
                    "*",
                    ACLOperation.ANY,
                    ACLPermissionType.ANY,
                    ResourcePatternFilter(ResourceType.ANY, None, ACLResourcePatternType.ANY),
                )
            ]
        )
        admin.close()
