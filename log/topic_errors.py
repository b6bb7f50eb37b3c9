"""Topic errors the shared ``log/errors.py`` does not (yet) define."""

from __future__ import annotations

from headwater.errors import PermanentError
from log.errors import LogError


class TopicExistsError(LogError, PermanentError):
    """``create_topic(..., exist_ok=False)`` found the topic already there."""

    def __init__(self, topic: str) -> None:
        super().__init__(f"topic {topic!r} already exists; pass exist_ok or delete it first")
        self.topic = topic
