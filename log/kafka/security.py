"""``log.kafka`` security settings (``KafkaConfig``) under each client library's own names.

Passwords are unwrapped here, at the client boundary, and nowhere else: never logged or
put in messages.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import SecretStr

from core.log_config import KafkaConfig

#: Each library's name of every KafkaConfig security setting.
_KAFKA_PYTHON_NAMES = {
    "security_protocol": "security_protocol",
    "sasl_mechanism": "sasl_mechanism",
    # kafka-python takes SCRAM credentials under its sasl_plain_* names too.
    "sasl_username": "sasl_plain_username",
    "sasl_password": "sasl_plain_password",
    "ssl_cafile": "ssl_cafile",
    "ssl_certfile": "ssl_certfile",
    "ssl_keyfile": "ssl_keyfile",
}
_LIBRDKAFKA_NAMES = {
    "security_protocol": "security.protocol",
    "sasl_mechanism": "sasl.mechanism",
    "sasl_username": "sasl.username",
    "sasl_password": "sasl.password",
    "ssl_cafile": "ssl.ca.location",
    "ssl_certfile": "ssl.certificate.location",
    "ssl_keyfile": "ssl.key.location",
}


def _security_options(config: KafkaConfig, names: Mapping[str, str]) -> dict[str, Any]:
    """The security settings that are set, under the library's ``names``."""
    options: dict[str, Any] = {}
    for field, name in names.items():
        value = getattr(config, field)
        if isinstance(value, SecretStr):
            value = value.get_secret_value()
        if value is not None:
            options[name] = value
    return options


def kafka_python_security(config: KafkaConfig) -> dict[str, Any]:
    """KafkaConfig's security settings as kafka-python keyword arguments."""
    return _security_options(config, _KAFKA_PYTHON_NAMES)


def librdkafka_security(config: KafkaConfig) -> dict[str, Any]:
    """KafkaConfig's security settings as librdkafka (confluent-kafka) properties."""
    options = _security_options(config, _LIBRDKAFKA_NAMES)
    options["security.protocol"] = config.security_protocol.lower()  # librdkafka's spelling
    return options
