"""The ``log:`` section of ``headwater.yaml``: backend, file and Kafka settings, per-topic cleaning."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from core.config_model import ConfigModel


class KafkaConfig(ConfigModel):
    """Connection settings of the ``kafka`` log backend; security settings pass through to the client."""

    bootstrap_servers: str = "localhost:9092"
    client: Literal["kafka-python", "confluent-kafka"] = "kafka-python"
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None


class FileLogConfig(ConfigModel):
    """Settings of the embedded ``file`` log backend."""

    fsync: Literal["always", "never"] = "always"
    segment_bytes: int = Field(default=128 * 1024 * 1024, gt=0)
    #: Records sections of appended batches stored zstd-compressed (when smaller) or plain.
    compression: Literal["none", "zstd"] = "zstd"
    #: ``<home>/log`` is on a filesystem every Spark node mounts at the same path, so executors
    #: of a cluster (``spark.master`` not local) can read it; without it such a master is refused.
    shared: bool = False


#: A ``log.topics`` key: a topic name, or a glob of one (``*``, ``?``, ``[...]``).
_TOPIC_PATTERN = re.compile(r"^[A-Za-z0-9._\-*?\[\]!]{1,249}$")


class TopicCleaningConfig(ConfigModel):
    """How the cleaner treats the topics one ``log.topics`` key matches; an unset key keeps the topic's own.

    Kafka's topic configs under their names: ``cleanup`` is ``cleanup.policy``;
    ``retention_ms`` / ``retention_bytes`` of -1 keep records forever.
    """

    cleanup: Literal["compact", "delete", "compact,delete"] | None = None
    retention_ms: int | None = Field(default=None, ge=-1)
    retention_bytes: int | None = Field(default=None, ge=-1)
    min_compaction_lag_ms: int | None = Field(default=None, ge=0)
    delete_retention_ms: int | None = Field(default=None, ge=0)
    segment_bytes: int | None = Field(default=None, ge=1024)

    @field_validator("cleanup", mode="before")
    @classmethod
    def _either_order(cls, value: Any) -> Any:
        if isinstance(value, str) and set(value.replace(" ", "").split(",")) == {"compact", "delete"}:
            return "compact,delete"
        return value

    @model_validator(mode="after")
    def _retention_needs_delete(self) -> TopicCleaningConfig:
        limited = {self.retention_ms, self.retention_bytes} - {None, -1}
        if self.cleanup == "compact" and limited:
            msg = "retention_ms and retention_bytes apply only with cleanup 'delete' or 'compact,delete'"
            raise ValueError(msg)
        return self


class LogConfig(ConfigModel):
    """Which log backend stores topics, its defaults for new topics, and how topics are cleaned."""

    backend: Literal["file", "kafka"] = "file"
    partitions: int = Field(default=3, ge=1, le=1024)
    min_compaction_lag_s: int = Field(default=7 * 24 * 3600, ge=0)
    delete_retention_s: int = Field(default=24 * 3600, ge=0)
    kafka: KafkaConfig = KafkaConfig()
    file: FileLogConfig = FileLogConfig()
    #: Per topic name or glob: cleaning that replaces the topic's own (the exact name wins, else the first glob).
    topics: dict[str, TopicCleaningConfig] = {}
    #: How often the background cleaner (``capture --follow``, ``run --follow``, ``log clean --follow``) looks.
    cleaner_interval_s: float = Field(default=60.0, gt=0)

    @field_validator("topics")
    @classmethod
    def _topic_patterns(cls, value: dict[str, TopicCleaningConfig]) -> dict[str, TopicCleaningConfig]:
        for pattern in value:
            if not _TOPIC_PATTERN.match(pattern):
                msg = f"{pattern!r} is not a topic name or glob (A-Z a-z 0-9 . _ - and * ? [ ])"
                raise ValueError(msg)
        return value
