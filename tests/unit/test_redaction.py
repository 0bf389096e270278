"""`common.redaction`: the SASL and SSL key passwords never reach a log line, whatever logs them."""

from __future__ import annotations

import logging

import pytest

from common.redaction import RedactSecrets, kafka_secrets
from common.settings import KafkaSettings

pytestmark = pytest.mark.unit


def test_secrets_are_hidden_in_messages_and_arguments() -> None:
    kafka = KafkaSettings(sasl_plain_password="s3cret-pw", ssl_password="key-pw")
    assert kafka_secrets(kafka) == ["s3cret-pw", "key-pw"]
    redact = RedactSecrets(kafka_secrets(kafka))
    record = logging.LogRecord(
        "kafka.admin",
        logging.DEBUG,
        __file__,
        1,
        "configuration: %s",
        ({"sasl_plain_password": "s3cret-pw"},),
        None,
    )
    assert (
        redact.filter(record) and "s3cret-pw" not in record.getMessage() and "[hidden]" in record.getMessage()
    )


def test_no_secrets_no_change() -> None:
    assert kafka_secrets(KafkaSettings()) == []
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "plain %s", ("text",), None)
    assert RedactSecrets([]).filter(record) and record.getMessage() == "plain text"
