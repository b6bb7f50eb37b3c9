"""Secrets in ``headwater.yaml``: DSN masking, SecretStr fields, Kafka SASL/SSL settings for both clients."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import SecretStr

from core.config import parse_config
from core.errors import ConfigError
from core.log_config import KafkaConfig
from core.source_config import redact_dsn
from log.kafka.clients import ClientSettings, open_client
from log.kafka.security import kafka_python_security, librdkafka_security

SECRET = "Qz7-s3cr3t"


@pytest.mark.parametrize(
    ("dsn", "shown"),
    [
        ("postgresql://capture:Qz7-s3cr3t@db:5432/shop", "postgresql://capture:***@db:5432/shop"),
        ("postgres://capture:Qz7-s3cr3t@db/shop?sslmode=require", "postgres://capture:***@db/shop?sslmode=require"),
        # percent-encoded and with characters a URL must encode
        ("postgresql://capture:Qz7-s3cr3t%40%2F%3A@db/shop", "postgresql://capture:***@db/shop"),
        # an unencoded '@' or ':' in the password is masked whole
        ("postgresql://capture:Qz7-s3cr3t@:x@db/shop", "postgresql://capture:***@db/shop"),
        # multi-host and IPv6 host lists stay as written (urlsplit could not parse them)
        ("postgresql://capture:Qz7-s3cr3t@h1:5432,h2:5433/shop", "postgresql://capture:***@h1:5432,h2:5433/shop"),
        ("postgresql://capture:Qz7-s3cr3t@[::1]:5432/shop", "postgresql://capture:***@[::1]:5432/shop"),
        # password and sslpassword as query parameters
        (
            "postgresql://capture@db/shop?password=Qz7-s3cr3t&sslmode=verify-full",
            "postgresql://capture@db/shop?password=***&sslmode=verify-full",
        ),
        (
            "postgresql://capture:Qz7-s3cr3t@db/shop?sslmode=verify-full&sslpassword=Qz7-s3cr3t&sslrootcert=/ca.pem",
            "postgresql://capture:***@db/shop?sslmode=verify-full&sslpassword=***&sslrootcert=/ca.pem",
        ),
        ("postgresql://capture:Qz7-s3cr3t@db?dbname=shop", "postgresql://capture:***@db?dbname=shop"),
        # key=value form, quoted or not
        ("host=db user=capture password=Qz7-s3cr3t dbname=shop", "host=db user=capture password=*** dbname=shop"),
        ("host=db password = 'Qz7 s3cr3t\\'x' dbname=shop", "host=db password = *** dbname=shop"),
        ("host=db sslpassword=Qz7-s3cr3t sslmode=require", "host=db sslpassword=*** sslmode=require"),
        # nothing to mask
        ("postgresql://capture@db/shop", "postgresql://capture@db/shop"),
        ("postgresql://capture:${SHOP_PW}@db/shop", "postgresql://capture:***@db/shop"),
    ],
)
def test_redact_dsn_masks_every_password(dsn: str, shown: str) -> None:
    assert redact_dsn(dsn) == shown
    assert "s3cr3t" not in redact_dsn(dsn)


def test_redact_dsn_never_raises_on_a_malformed_url() -> None:
    assert redact_dsn("postgresql://u:Qz7-s3cr3t@db:notaport/shop") == "postgresql://u:***@db:notaport/shop"


def project(**kafka: object) -> dict[str, object]:
    return {
        "project": "shop",
        "log": {"backend": "kafka", "kafka": {"bootstrap_servers": "k:9093", **kafka}},
        "sources": {
            "shop": {
                "dsn": "postgresql://capture:${SHOP_PW}@db:5432/shop?sslmode=verify-full&sslrootcert=/ca.pem",
                "tables": ["public.customers"],
            }
        },
    }


def test_secrets_are_secret_str_and_never_shown_by_repr_or_dump() -> None:
    env = {"SHOP_PW": SECRET, "KAFKA_PW": SECRET + "-k"}
    raw = project(
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="capture",
        sasl_password="${KAFKA_PW}",
        ssl_cafile="/ca.pem",
    )
    config = parse_config(raw, Path("headwater.yaml"), env)
    source = config.sources["shop"]
    kafka = config.log.kafka
    assert isinstance(source.dsn, SecretStr) and isinstance(kafka.sasl_password, SecretStr)
    # The value reaches the drivers unchanged, sslmode and sslrootcert included ...
    assert source.dsn.get_secret_value() == (
        f"postgresql://capture:{SECRET}@db:5432/shop?sslmode=verify-full&sslrootcert=/ca.pem"
    )
    assert kafka.sasl_password.get_secret_value() == SECRET + "-k"
    # ... and no rendering of the config shows it.
    for text in (repr(config), str(config), config.model_dump_json(), str(config.model_dump()), source.dsn_redacted):
        assert SECRET not in text
    assert source.dsn_redacted == "postgresql://capture:***@db:5432/shop?sslmode=verify-full&sslrootcert=/ca.pem"


def test_a_misplaced_secret_in_the_config_is_not_echoed_by_the_error() -> None:
    raw = project()
    raw["sources"]["shop"]["dns"] = f"postgresql://capture:{SECRET}@db/shop"  # type: ignore[index]
    with pytest.raises(ConfigError) as caught:
        parse_config(raw, Path("headwater.yaml"), {"SHOP_PW": SECRET})
    assert "sources.shop.dns: unknown key" in str(caught.value)
    assert SECRET not in str(caught.value)
    raw = project(sasl_password=["not", SECRET])
    with pytest.raises(ConfigError) as caught:
        parse_config(raw, Path("headwater.yaml"), {"SHOP_PW": SECRET})
    assert "log.kafka.sasl_password" in str(caught.value) and SECRET not in str(caught.value)


def test_kafka_security_keys_are_a_closed_set() -> None:
    with pytest.raises(ConfigError, match=r"log\.kafka\.security_protocol: must be"):
        parse_config(project(security_protocol="SASL_TLS"), Path("headwater.yaml"), {"SHOP_PW": "x"})
    with pytest.raises(ConfigError, match=r"log\.kafka\.sasl_mechanism: must be"):
        parse_config(project(sasl_mechanism="GSSAPI-ish"), Path("headwater.yaml"), {"SHOP_PW": "x"})


def test_default_kafka_security_is_plaintext_for_both_clients() -> None:
    config = KafkaConfig()
    assert kafka_python_security(config) == {"security_protocol": "PLAINTEXT"}
    assert librdkafka_security(config) == {"security.protocol": "plaintext"}


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_sasl_settings_map_to_each_clients_own_names(mechanism: str) -> None:
    config = KafkaConfig(
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism=mechanism,  # type: ignore[arg-type]
        sasl_username="capture",
        sasl_password=SecretStr(SECRET),
    )
    # kafka-python takes the SCRAM credentials under its sasl_plain_* names too.
    assert kafka_python_security(config) == {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": mechanism,
        "sasl_plain_username": "capture",
        "sasl_plain_password": SECRET,
    }
    assert librdkafka_security(config) == {
        "security.protocol": "sasl_plaintext",
        "sasl.mechanism": mechanism,
        "sasl.username": "capture",
        "sasl.password": SECRET,
    }
    assert SECRET not in repr(config)


def test_ssl_files_map_to_each_clients_own_names() -> None:
    config = KafkaConfig(
        security_protocol="SSL", ssl_cafile="/ca.pem", ssl_certfile="/client.pem", ssl_keyfile="/client.key"
    )
    assert kafka_python_security(config) == {
        "security_protocol": "SSL",
        "ssl_cafile": "/ca.pem",
        "ssl_certfile": "/client.pem",
        "ssl_keyfile": "/client.key",
    }
    assert librdkafka_security(config) == {
        "security.protocol": "ssl",
        "ssl.ca.location": "/ca.pem",
        "ssl.certificate.location": "/client.pem",
        "ssl.key.location": "/client.key",
    }


@pytest.mark.parametrize("client", ["kafka-python", "confluent-kafka"])
def test_each_client_is_built_with_the_mapped_settings(client: str) -> None:
    """Clients connect lazily, so their library settings can be read without a broker."""
    config = KafkaConfig(
        client=client,  # type: ignore[arg-type]
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-256",
        sasl_username="capture",
        sasl_password=SecretStr(SECRET),
        ssl_cafile="/ca.pem",
    )
    built = open_client(ClientSettings(config), config.client)
    expected = kafka_python_security(config) if client == "kafka-python" else librdkafka_security(config)
    assert expected.items() <= built._common.items()  # type: ignore[attr-defined]
    assert SECRET not in repr(built) and SECRET not in repr(built.settings)
