"""Topic errors the shared ``log/errors.py`` does not (yet) define."""

from __future__ import annotations

from core.errors import PermanentError
from log.errors import LogError
from log.kafka.clients import MAX_BATCH_RECORDS


class TopicExistsError(LogError, PermanentError):
    """``create_topic(..., exist_ok=False)`` found the topic already there."""

    def __init__(self, topic: str) -> None:
        super().__init__(f"topic {topic!r} already exists; pass exist_ok or delete it first")
        self.topic = topic


class BatchTooLargeError(LogError, PermanentError):
    """An append cannot be written as one record batch, so it could not be atomic.

    ``records == 1``: the record alone is larger than the log accepts; the capture agent
    then sends a note of it to ``<topic>.quarantine`` instead of stopping.
    """

    def __init__(self, topic: str, partition: int, records: int, size: int, limit: int) -> None:
        super().__init__(
            f"{topic}/{partition}: a batch of {records} records (~{size} bytes) exceeds one Kafka record batch "
            f"(at most {MAX_BATCH_RECORDS} records and {limit} bytes); split it or raise max_batch_bytes"
        )
        self.topic = topic
        self.partition = partition
        self.records = records
        self.size = size
        self.limit = limit
