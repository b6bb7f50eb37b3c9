"""Build the configured :class:`~log.base.Log` backend from the project config."""

from __future__ import annotations

from typing import TYPE_CHECKING

from log.base import Log
from log.file.backend import FileLog

if TYPE_CHECKING:
    from core.config import ProjectConfig


def open_log(config: ProjectConfig) -> Log:
    """The log backend ``config.log.backend`` names: the embedded file log or Kafka.

    The Kafka backend is imported only when chosen, so the file backend needs no Kafka client.
    """
    if config.log.backend == "kafka":
        # KafkaLog is developed alongside; the ignore only matters until it lands.
        from log.kafka.backend import KafkaLog  # type: ignore[import-untyped,import-not-found,unused-ignore]

        kafka: Log = KafkaLog(config.log.kafka)
        return kafka
    return FileLog(
        config.home_dir / "log",
        fsync=config.log.file.fsync,
        segment_bytes=config.log.file.segment_bytes,
        compression=config.log.file.compression,
    )
