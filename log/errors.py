"""Errors raised by the log and its backends."""

from __future__ import annotations

from core.errors import HeadwaterError, PermanentError, TransientError


class LogError(HeadwaterError):
    """Base class of log errors."""


class UnknownTopicError(LogError, PermanentError):
    """The topic does not exist."""

    def __init__(self, topic: str) -> None:
        super().__init__(f"topic {topic!r} does not exist; list topics with 'headwater log topics'")
        self.topic = topic


class InvalidTopicNameError(LogError, PermanentError):
    """A topic name breaks Kafka's naming rules or uses a reserved prefix."""

    def __init__(self, topic: str, reason: str) -> None:
        super().__init__(f"invalid topic name {topic!r}: {reason}")
        self.topic = topic


class UnknownPartitionError(LogError, PermanentError):
    """The partition number is outside the topic's partitions."""

    def __init__(self, topic: str, partition: int, partitions: int) -> None:
        super().__init__(f"topic {topic!r} has partitions 0..{partitions - 1}, not {partition}")
        self.topic = topic
        self.partition = partition


class CorruptLogError(LogError, PermanentError):
    """A segment holds a damaged batch that is not a torn tail: never skipped silently."""

    def __init__(self, path: str, position: int, detail: str) -> None:
        super().__init__(
            f"corrupt log segment {path} at byte {position}: {detail}; "
            "restore the file from a backup, or rebuild the topic from its source (re-snapshot)"
        )
        self.path = path
        self.position = position


class WriterLockedError(LogError, PermanentError):
    """Another process already writes this partition (one writer per partition)."""

    def __init__(self, topic: str, partition: int, holder: str) -> None:
        super().__init__(
            f"partition {topic}/{partition} is being written by {holder}; stop that process or wait for it to exit"
        )
        self.topic = topic
        self.partition = partition
        self.holder = holder


class LogAuthenticationError(LogError, PermanentError):
    """The broker refused the client's credentials (SASL) or TLS handshake: fix the ``log.kafka`` settings."""


class LogUnavailableError(LogError, TransientError):
    """The log cannot be reached or written right now (broker down, disk full): retry later."""


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

    def __init__(self, topic: str, partition: int, records: int, size: int, *, limit: int, max_records: int) -> None:
        super().__init__(
            f"{topic}/{partition}: a batch of {records} records (~{size} bytes) exceeds one Kafka record batch "
            f"(at most {max_records} records and {limit} bytes); split it or raise max_batch_bytes"
        )
        self.topic = topic
        self.partition = partition
        self.records = records
        self.size = size
        self.limit = limit


class InvalidGroupNameError(LogError, PermanentError):
    """A consumer group name is empty, too long or uses characters outside Kafka's topic alphabet."""

    def __init__(self, group: str, reason: str) -> None:
        super().__init__(f"invalid consumer group name {group!r}: {reason}")
        self.group = group


class UnknownGroupError(LogError, PermanentError):
    """No member ever joined the consumer group and it never committed an offset."""

    def __init__(self, group: str) -> None:
        super().__init__(f"consumer group {group!r} does not exist; list groups with 'headwater log groups'")
        self.group = group


class FencedMemberError(LogError, PermanentError):
    """A group member lost a partition (its lease expired, or the group gave the partition to another member).

    Its commit is refused, so nothing it did after losing the partition counts: the new
    owner resumes at the last accepted commit. The member itself rejoins at its next poll.
    """

    def __init__(self, group: str, member: str, topic: str, partition: int, reason: str) -> None:
        super().__init__(
            f"member {member} of consumer group {group!r} no longer owns {topic}/{partition} ({reason}): "
            "its commit was refused; the partition's new owner resumes at the last accepted commit"
        )
        self.group = group
        self.member = member
        self.topic = topic
        self.partition = partition


class IncompleteHistoryError(LogError, PermanentError):
    """A full-history rebuild (SCD2 reprocess, daily backfill) needs records the cleaner already removed."""

    def __init__(self, topic: str, partition: int, clean_offset: int, needed: int, *, what: str, remedy: str) -> None:
        super().__init__(
            f"partition {partition} of {topic!r} holds every version only from offset {clean_offset} on "
            f"(compaction or retention removed records before it), but {what} needs offset {needed}; {remedy}"
        )
        self.topic = topic
        self.partition = partition
        self.clean_offset = clean_offset
        self.needed = needed
