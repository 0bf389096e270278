"""txnwatch's one settings object: `Settings`, read from the environment (`TXNWATCH_*`, sections nested with `__`),
built only by the apps' entry points (`common.cli_options.settings_from`, flags win); everything else receives its
section: `kafka`, `detection`, `topics` (common/topics.py), `collector` and `stream`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, Field, SecretStr
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from common.client_properties import ClientValue, coerce_value, parse_client_properties
from common.topics import CoordinatorStateTopicSettings, ProducerStateTopicSettings, TopicSettings
from detectors.contract import TRANSACTION_LOG_TOPIC
from detectors.models import DetectionLimits, Model

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
OutputChoice = Literal["auto", "table", "json"]
LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR"]
CoordinatorSource = Literal["log", "describe"]
StreamCoordinatorSource = Literal["log", "describe", "both"]

# DescribeProducers requests carry at most this many partitions (TransactionsCommand's MAX_BATCH_SIZE).
MAX_DESCRIBE_BATCH = 500


class KafkaSettings(Model):
    """Client connection settings named as kafka-python keys: `KafkaAdminClient(**kafka.client_kwargs())`."""

    bootstrap_servers: str = "localhost:9092"
    client_id: str = "txnwatch"
    security_protocol: SecurityProtocol = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_plain_username: str | None = None
    sasl_plain_password: SecretStr | None = None
    sasl_kerberos_service_name: str | None = None
    sasl_kerberos_domain_name: str | None = None
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_password: SecretStr | None = None
    ssl_crlfile: str | None = None
    ssl_ciphers: str | None = None
    ssl_check_hostname: bool = True
    # SASL/OAUTHBEARER token sources (common/oauth.py makes kafka-python's token provider from them): the
    # client-credentials grant, Amazon MSK IAM, or Kafka's unsecured JWS (test beds).
    sasl_oauth_token_endpoint_url: str | None = None
    sasl_oauth_client_id: str | None = None
    sasl_oauth_client_secret: SecretStr | None = None
    sasl_oauth_scope: str | None = None
    sasl_oauth_aws_msk_iam: bool = False
    sasl_oauth_aws_region: str | None = None
    sasl_oauth_unsecured_sub: str | None = None
    sasl_oauth_unsecured_lifetime_s: int | None = None
    # Any other kafka-python client setting, passed through (values "123" → int, "true"/"false" → bool).
    extra: dict[str, str] = Field(default_factory=dict)

    def client_kwargs(self) -> dict[str, Any]:
        """kafka-python kwargs: unset options left out, secrets revealed, `extra` merged last, the OAUTHBEARER
        settings made into a `sasl_oauth_token_provider` (common/oauth.py)."""
        from common.oauth import with_token_provider  # imports kafka-python: only where clients are made

        out: dict[str, ClientValue] = {}
        for name in type(self).model_fields:
            if name == "extra":
                continue
            value = getattr(self, name)
            if value is None:
                continue
            out[name] = value.get_secret_value() if isinstance(value, SecretStr) else value
        for key, raw in self.extra.items():
            out[key.replace(".", "_")] = coerce_value(raw)
        return with_token_provider(out)


class CollectorSettings(Model):
    """`txnwatch collect` (`TXNWATCH_COLLECTOR__*`): sweep cadence, request sizing, retries, output topics,
    coordinator fallback."""

    interval_s: float = Field(default=10.0, gt=0)
    describe_batch_size: int = Field(default=MAX_DESCRIBE_BATCH, ge=1, le=MAX_DESCRIBE_BATCH)
    # kafka-python pauses a connection at 5 requests in flight; keep room for metadata and fetches.
    max_in_flight_per_broker: int = Field(default=3, ge=1, le=4)
    request_timeout_ms: int = Field(default=15_000, ge=100)
    # Extra DescribeProducers rounds within one sweep for partitions whose leader moved.
    retries_per_sweep: int = Field(default=2, ge=0)
    retry_backoff_ms: int = Field(default=200, ge=0)
    config_refresh_s: float = Field(default=600.0, gt=0)
    broker_backoff_initial_s: float = Field(default=1.0, gt=0)
    broker_backoff_max_s: float = Field(default=60.0, gt=0)
    # Fetch rounds per broker per sweep for start batches that did not fit a response.
    start_batch_fetch_rounds: int = Field(default=10, ge=1)
    fetch_partition_max_bytes: int = Field(default=1 << 20, ge=1024)
    fetch_max_bytes: int = Field(default=16 << 20, ge=1024)
    # How long start-up may spend reading the snapshot topic back to learn which partitions were open.
    restore_timeout_s: float = Field(default=30.0, ge=0)
    metrics_port: int = Field(default=9464, ge=0, le=65535)  # 0: no endpoint
    metrics_addr: str = "0.0.0.0"
    # /readyz: a sweep published within this many intervals (plus one request timeout), detectors/health.py.
    ready_intervals: float = Field(default=3.0, gt=0)
    # /healthz: the sweep loop turned within this; None: the longest pause plus 10 request timeouts.
    stall_after_s: float | None = Field(default=None, gt=0)
    # Look up the consumer groups a transaction holds up once the partition's oldest open transaction has been open
    # this long (admin/collect/blocked.py, the dashboard's blocked groups); 0: never. Kafka's default transaction.timeout.ms.
    blocked_groups_after_ms: int = Field(default=60_000, ge=0)
    # Between sweeps, ListOffsets of every partition this often to see new open transactions, and describe a
    # partition again once a report of it can prove a young one (admin/collect/redescribe.py); 0: full sweeps only.
    probe_interval_ms: int = Field(default=1_000, ge=0)
    coordinator_source: CoordinatorSource = "log"
    # describe mode: re-describe active transactions running longer than this each poll (ListTransactions v1
    # DurationFilter); 0 re-describes every active transaction. New and changed ones are always described.
    coordinator_duration_filter_ms: int = Field(default=0, ge=0)
    producer_state_topic: ProducerStateTopicSettings = Field(default_factory=ProducerStateTopicSettings)
    coordinator_state_topic: CoordinatorStateTopicSettings = Field(
        default_factory=CoordinatorStateTopicSettings
    )


class StreamSettings(Model):
    """`txnwatch stream` (`TXNWATCH_STREAM__*`): checkpoint, Spark, micro-batch sizing, state, metrics endpoint."""

    # Where Spark keeps offsets and state; keep it to resume after a restart. A relative path is taken from the
    # working directory. Also read from TXNWATCH_CHECKPOINT_LOCATION (its name before this section existed).
    checkpoint_location: str = Field(default="txnwatch-checkpoints", min_length=1)
    # None: the master spark-submit gives (`spark.master`), else local[*]. Set it only when txnwatch starts Spark
    # itself (`txnwatch stream`, not under spark-submit): a master set here overrides spark-submit's.
    master: str | None = Field(default=None, min_length=1)
    trigger: str = "5 seconds"
    # Of the snapshot topic; the transaction log is always read from earliest (it is compacted).
    starting_offsets: str = "latest"
    max_offsets_per_trigger: int | None = Field(default=None, ge=1)
    # The coordinator topic's own bound (a first start on a large retained transaction log); None: the above.
    coordinator_max_offsets_per_trigger: int | None = Field(default=None, ge=1)
    # Spark tasks that read and decode the coordinator topics per batch; 0: Spark's default parallelism (the
    # cores). Kafka's source plans one task per topic partition, 50 small tasks a batch on a default
    # __transaction_state, each a Python hand-over; more tasks than partitions change nothing.
    coordinator_read_tasks: int = Field(default=0, ge=0)
    window: str = "1 minute"
    watermark: str = "2 minutes"
    expire_after_ms: int = Field(default=30_000, ge=1)
    view_ttl_ms: int = Field(default=24 * 3_600_000, ge=1)
    # Hash buckets of ids per stateful stage; fixed for a checkpoint.
    state_buckets: int = Field(default=32, ge=1)
    coordinator_source: StreamCoordinatorSource = "log"
    transaction_log_topic: str = Field(default=TRANSACTION_LOG_TOPIC, min_length=1)
    metrics_host: str = "127.0.0.1"
    metrics_port: int = Field(default=9465, ge=0, le=65535)  # the collector's endpoint defaults to 9464
    # /readyz: each query finished a batch (or found nothing to do) within this many triggers plus the slack (a
    # batch may run longer than its trigger); /healthz: the driver's loop turned within stall_after_s.
    ready_intervals: float = Field(default=3.0, gt=0)
    ready_slack_s: float = Field(default=60.0, ge=0)
    stall_after_s: float = Field(default=120.0, gt=0)
    # Restart the queries from their checkpoints this often, between two batches (0: never). RocksDB rewrites the
    # MANIFEST that every state snapshot carries only when a store opens; without a restart each snapshot grows by
    # about 20 bytes a batch for as long as the job runs (docs/reliability.md).
    restart_queries_every_s: float = Field(default=6 * 3600.0, ge=0)
    # The folder `make jars` fills; Spark's Kafka connector is in its spark/ subfolder. None: <checkout>/.cache/jars
    # (common/jars.py). Also read from TXNWATCH_JARS_DIR (its name before this section existed; the test bed reads
    # that one too, through common.jars.jars_dir).
    jars_dir: Path | None = None


# Environment variables older than the `stream` section, still honoured; the sectioned name wins when both are set.
RENAMED_ENVIRONMENT: dict[str, tuple[str, str]] = {
    "TXNWATCH_CHECKPOINT_LOCATION": ("stream", "checkpoint_location"),
    "TXNWATCH_JARS_DIR": ("stream", "jars_dir"),
}


class _RenamedEnvironment(EnvSettingsSource):
    """Reads `RENAMED_ENVIRONMENT` into their sections (the same environment, case rules and empty-value rules
    as the `TXNWATCH_*` source)."""

    def __call__(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, (section, field) in RENAMED_ENVIRONMENT.items():
            value = self.env_vars.get(name if self.case_sensitive else name.lower())
            if value is not None:
                out.setdefault(section, {})[field] = value
        return out


class Settings(BaseSettings):
    """All of txnwatch's settings: `TXNWATCH_CLUSTER`, `TXNWATCH_OUTPUT`, `TXNWATCH_LOG_LEVEL`,
    `TXNWATCH_KAFKA__BOOTSTRAP_SERVERS`, `TXNWATCH_DETECTION__GRACE_MS`, `TXNWATCH_TOPICS__PREFIX`,
    `TXNWATCH_COLLECTOR__INTERVAL_S`, `TXNWATCH_STREAM__CHECKPOINT_LOCATION`, ..."""

    model_config = SettingsConfigDict(
        env_prefix="TXNWATCH_", env_nested_delimiter="__", frozen=True, extra="forbid"
    )

    cluster: str = Field(default="default", min_length=1)
    # Console output: "auto" is a table on a terminal and JSON otherwise (`cli_options.output_format`).
    output: OutputChoice = "auto"
    # stderr log level; None: each command's own (INFO, or WARNING for `inspect`).
    log_level: LogLevel | None = None
    # Who runs `proposals abort`, for its audit record; None: `--actor`, else the login name.
    actor: str | None = Field(default=None, min_length=1)
    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    detection: DetectionLimits = Field(default_factory=DetectionLimits)
    topics: TopicSettings = Field(default_factory=TopicSettings)
    collector: CollectorSettings = Field(default_factory=CollectorSettings)
    stream: StreamSettings = Field(default_factory=StreamSettings)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Highest first: arguments, TXNWATCH_* (sections), the renamed variables, then pydantic-settings' own.
        return (
            init_settings,
            env_settings,
            _RenamedEnvironment(settings_cls),
            dotenv_settings,
            file_secret_settings,
        )


ModelT = TypeVar("ModelT", bound=BaseModel)


def overlay(model: ModelT, update: Mapping[str, Any]) -> ModelT:
    """`model` with `update` laid over it: a mapping given for a section updates that section field by field; the
    result is validated (`model_copy` would not), without reading the environment again.

    Args:
        model: the settings (or one section of them) to start from.
        update: field name → new value, or → a mapping of that section's fields.

    Returns:
        A new model of the same type.

    Raises:
        pydantic.ValidationError: a value the model rejects, or a name it does not have.
    """
    data: dict[str, Any] = {name: getattr(model, name) for name in type(model).model_fields}
    for name, value in update.items():
        current = data.get(name)
        if isinstance(current, BaseModel) and isinstance(value, Mapping):
            value = overlay(current, value)
        data[name] = value
    return type(model).model_validate(data)


def kafka_settings_from_properties(
    text: str, *, bootstrap_servers: str | None = None, base: KafkaSettings | None = None
) -> tuple[KafkaSettings, tuple[str, ...]]:
    """KafkaSettings from a `--command-config` file laid over `base` (the CLI's `--bootstrap-server` wins).

    Returns:
        The settings and the ignored keys (for a warning).

    Raises:
        ClientPropertiesError: see `parse_client_properties`.
    """
    parsed = parse_client_properties(text)
    current = (base or KafkaSettings()).model_dump()
    fields = set(KafkaSettings.model_fields) - {"extra"}
    extra = dict(current.pop("extra"))
    for key, value in parsed.kwargs.items():
        if key in fields:
            current[key] = value
        else:
            extra[key] = str(value).lower() if isinstance(value, bool) else str(value)
    if bootstrap_servers is not None:
        current["bootstrap_servers"] = bootstrap_servers
    for secret in ("sasl_plain_password", "ssl_password", "sasl_oauth_client_secret"):
        if isinstance(current.get(secret), SecretStr):
            current[secret] = current[secret].get_secret_value()
    return KafkaSettings.model_validate({**current, "extra": extra}), parsed.ignored
