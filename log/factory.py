"""Build the configured :class:`~log.base.Log` backend from the project config."""

from __future__ import annotations

from typing import TYPE_CHECKING

from log.base import Log
from log.file.backend import FileLog
from log.kafka.backend import KafkaLog

if TYPE_CHECKING:
    from core.config import ProjectConfig


def open_log(config: ProjectConfig) -> Log:
    """The log backend ``config.log.backend`` names: the embedded file log or Kafka.

    A Kafka client library is loaded only when a KafkaLog is built (:func:`log.kafka.clients.open_client`).
    """
    if config.log.backend == "kafka":
        return KafkaLog(config.log.kafka)
    return FileLog(
        config.home_dir / "log",
        fsync=config.log.file.fsync,
        segment_bytes=config.log.file.segment_bytes,
        compression=config.log.file.compression,
    )
