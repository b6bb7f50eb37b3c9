"""Names in the log: topics, their quarantine topics, Headwater's internal topics, consumer groups.

Every producer and consumer builds names here, so a name means the same thing everywhere.
Topic names follow Kafka's rules (1-249 of ``A-Z a-z 0-9 . _ -``); names starting with
``_headwater.`` or ``__`` are reserved for the log's own topics. Consumer groups that
members join (:mod:`log.consumer`) use the same alphabet, so a group is also a file name.
"""

from __future__ import annotations

import re

from log.errors import InvalidGroupNameError, InvalidTopicNameError

#: Prefix of Headwater's internal topics.
INTERNAL_PREFIX = "_headwater."
#: Each table topic's column list and key, one record per version (:mod:`log.table_schemas`).
SCHEMAS_TOPIC = "_headwater.schemas"
#: Consumer-group offsets of the file backend (:mod:`log.consumer_groups`).
OFFSETS_TOPIC = "_headwater.offsets"
#: Suffix of the topic that keeps a topic's records that could not be stored or passed (not compacted).
QUARANTINE_SUFFIX = ".quarantine"
#: Header naming why a record was quarantined or dropped.
ERROR_HEADER = "headwater.error"
#: Consumer group of a feed's job, and of the loader of a warehouse table (build) name.
FEED_GROUP_PREFIX = "headwater.feed."
LOAD_GROUP_PREFIX = "headwater.load."
#: Consumer group of a sink (:mod:`sinks`); its dead-letter topic is ``<group>.dead_letter``.
SINK_GROUP_PREFIX = "headwater.sink."
DEAD_LETTER_SUFFIX = ".dead_letter"

_LEGAL = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
_TOPIC_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def validate_topic_name(name: str, *, internal: bool = False) -> str:
    """Return ``name`` if it is a legal Kafka topic name; reserved prefixes only when ``internal``."""
    if not _LEGAL.match(name):
        raise InvalidTopicNameError(name, "use 1-249 characters from A-Z a-z 0-9 . _ -")
    if name in {".", ".."}:
        raise InvalidTopicNameError(name, "'.' and '..' are not allowed")
    if not internal and (name.startswith(INTERNAL_PREFIX) or name.startswith("__")):
        raise InvalidTopicNameError(name, f"names starting with {INTERNAL_PREFIX!r} or '__' are reserved")
    return name


def validate_group_name(name: str) -> str:
    """Return ``name`` if it can name a consumer group on both backends (a file name on the file backend)."""
    if not _LEGAL.match(name) or name in {".", ".."}:
        raise InvalidGroupNameError(name, "use 1-249 characters from A-Z a-z 0-9 . _ -")
    return name


def table_topic(source: str, schema: str, table: str) -> str:
    """``<source>.<schema>.<table>``; characters Kafka forbids become ``_`` (as Debezium does)."""
    return ".".join(_TOPIC_UNSAFE.sub("_", part) for part in (source, schema, table))


def message_topic(source: str) -> str:
    """Topic of logical-message events (Debezium: ``<prefix>.message``)."""
    return f"{source}.message"


def quarantine_topic(topic: str) -> str:
    """``<topic>.quarantine``."""
    return f"{topic}{QUARANTINE_SUFFIX}"


def is_quarantine_topic(topic: str) -> bool:
    """True for topics made by :func:`quarantine_topic` (stored without compaction)."""
    return topic.endswith(QUARANTINE_SUFFIX)


def feed_group(feed: str) -> str:
    """The consumer group a feed's job commits its input position to."""
    return FEED_GROUP_PREFIX + feed


def load_group(build: str) -> str:
    """The consumer group the loader of warehouse table ``build`` (``<table>`` or ``<table>.v<N>``) commits to."""
    return LOAD_GROUP_PREFIX + build


def sink_group(sink: str) -> str:
    """The consumer group a sink reads as (its offsets, members and lag)."""
    return SINK_GROUP_PREFIX + sink


def dead_letter_topic(sink: str) -> str:
    """``headwater.sink.<sink>.dead_letter``: records the sink's target refused for good (not compacted)."""
    return sink_group(sink) + DEAD_LETTER_SUFFIX


def is_dead_letter_topic(topic: str) -> bool:
    """True for topics made by :func:`dead_letter_topic`."""
    return topic.startswith(SINK_GROUP_PREFIX) and topic.endswith(DEAD_LETTER_SUFFIX)
