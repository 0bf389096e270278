"""What one broker's ApiVersions say about the few behaviours of txnwatch that depend on its Kafka release.

kafka-python negotiates every request's version per connection; these are the places where txnwatch itself must
choose. A broker's versions are its connection's (`KafkaWire.broker_apis`): kafka-python keeps, per
connection, the lower of the bootstrap broker's and that broker's own (`KafkaConnection._get_api_versions`), so a
broker newer than the bootstrap one reads as old. Every choice below is safe on an older broker: no filter, or an
ACL that every release accepts.
"""

from __future__ import annotations

from collections.abc import Mapping

# A broker's ApiVersions: API key -> (min version, max version). Empty: unknown (not connected, or no answer).
BrokerApis = Mapping[int, tuple[int, int]]

WRITE_TXN_MARKERS = 27
LIST_TRANSACTIONS = 66
# ListTransactions v1 (DurationFilter, KIP-994) came with Kafka 3.8, the release in which KIP-1037 let Alter on the
# cluster authorize WriteTxnMarkers: one version tells both.
DURATION_FILTER_LIST_TRANSACTIONS = 1
# WriteTxnMarkers v2 (KIP-1228, Kafka 4.2) carries the marker's TransactionVersion; kafka-python sends v2 to a broker
# that offers it, as Kafka's Admin does (`WriteTxnMarkersRequest.Builder`: every version, the newest negotiated).
TRANSACTION_VERSION_WRITE_TXN_MARKERS = 2
# The TransactionVersion Kafka's own `Admin.abortTransaction` sends (AbortTransactionHandler.buildBatchedRequest
# never sets it: the field's default, 0, whatever the request's version). A broker then checks the marker's epoch
# the legacy way, >= the producer's (`ProducerAppendInfo.checkProducerEpoch`); at 2 it would need a strictly greater
# epoch and refuse a marker at the open transaction's own epoch (INVALID_PRODUCER_EPOCH).
ADMIN_MARKER_TRANSACTION_VERSION = 0


def max_version(apis: BrokerApis, api_key: int) -> int:
    """The newest version of `api_key` the broker offers; -1 if it offers none or is unknown."""
    offered = apis.get(api_key)
    return -1 if offered is None else offered[1]


def takes_duration_filter(apis: BrokerApis) -> bool:
    """The broker offers ListTransactions v1 (Kafka 3.8+): it can list only the transactions older than a
    DurationFilter."""
    return max_version(apis, LIST_TRANSACTIONS) >= DURATION_FILTER_LIST_TRANSACTIONS


def alter_authorizes_markers(apis: BrokerApis) -> bool:
    """Kafka 3.8+ (KIP-1037): `KafkaApis.handleWriteTxnMarkersRequest` authorizes Alter on the cluster, else
    ClusterAction. Before 3.8 only ClusterAction (checked in the 3.7.2 and 3.8.1 jars)."""
    return max_version(apis, LIST_TRANSACTIONS) >= DURATION_FILTER_LIST_TRANSACTIONS


def marker_acl(apis: BrokerApis) -> str:
    """The ACL that lets txnwatch's principal write a marker on this broker. ClusterAction where the broker is
    older than 3.8 or its release is unknown: every release accepts it."""
    if alter_authorizes_markers(apis):
        return "Alter on the cluster (Kafka 3.8+, KIP-1037; or ClusterAction on the cluster)"
    return (
        "ClusterAction on the cluster (this broker is older than Kafka 3.8, or its version is unknown: Alter on "
        "the cluster is not enough before 3.8, KIP-1037)"
    )
