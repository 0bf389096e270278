"""Keeping the SASL and SSL key passwords out of logs: kafka-python logs its whole configuration, password
included, at DEBUG (`Starting KafkaAdminClient with configuration: {...}`). Shared by `txnwatch collect|inspect|
proposals` (admin/cli/main.py) and `txnwatch stream` (streaming/cli.py), which install it on the root handlers."""

from __future__ import annotations

import logging

from common.settings import KafkaSettings


def kafka_secrets(kafka: KafkaSettings) -> list[str]:
    """The passwords in the settings that must never be shown."""
    values = (kafka.sasl_plain_password, kafka.ssl_password, kafka.sasl_oauth_client_secret)
    return [secret for v in values if v is not None and (secret := v.get_secret_value())]


class RedactSecrets(logging.Filter):
    """Replaces the given secrets in every record's message with `[hidden]`."""

    def __init__(self, secrets: list[str]) -> None:
        super().__init__()
        self._secrets = [s for s in secrets if s]

    def filter(self, record: logging.LogRecord) -> bool:
        if self._secrets:
            try:
                message = record.getMessage()
            except Exception:  # a malformed record: the handler reports it as it would have
                return True
            if any(s in message for s in self._secrets):
                for secret in self._secrets:
                    message = message.replace(secret, "[hidden]")
                record.msg, record.args = message, None
        return True


def hide_secrets_in_logs(kafka: KafkaSettings) -> None:
    """Install `RedactSecrets` for the settings' passwords on every handler of the root logger."""
    secrets = kafka_secrets(kafka)
    if secrets:
        redact = RedactSecrets(secrets)
        for handler in logging.getLogger().handlers:
            handler.addFilter(redact)
