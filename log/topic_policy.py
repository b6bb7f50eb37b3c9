"""Per-topic cleaning from ``headwater.yaml`` (``log.topics``): which entry applies to a topic, and its effect.

A topic's spec (``log.base.TopicSpec``, set by whoever created it) says how it is
cleaned; a ``log.topics`` entry replaces the fields it sets, so operators tune cleaning
without recreating topics. Both backends apply the entry: the file backend when it
describes, cleans and rolls a topic; the Kafka backend when it creates a topic and when
the cleaner aligns an existing topic's configs (the broker then cleans by them).

Which entry applies: the one whose key is the topic's name, else the first glob (in the
file's order) that matches it. Headwater's own topics (``_headwater.*``) are matched
only by their exact name.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import replace

from core.log_config import TopicCleaningConfig
from log.base import TopicSpec
from log.topics import INTERNAL_PREFIX

#: The topic config that carries a topic's segment size (Kafka's name; the file backend reads it too).
SEGMENT_BYTES = "segment.bytes"


class TopicPolicies:
    """The ``log.topics`` entries of a project (empty: every topic keeps its own spec)."""

    def __init__(self, entries: Mapping[str, TopicCleaningConfig] | None = None) -> None:
        self._entries = dict(entries or {})

    def __bool__(self) -> bool:
        return bool(self._entries)

    def entry(self, topic: str) -> TopicCleaningConfig | None:
        """The entry that applies to ``topic`` (see the module docstring), or ``None``."""
        exact = self._entries.get(topic)
        if exact is not None or topic.startswith(INTERNAL_PREFIX):
            return exact
        for pattern, entry in self._entries.items():
            if fnmatch.fnmatchcase(topic, pattern):
                return entry
        return None

    def apply(self, spec: TopicSpec) -> TopicSpec:
        """``spec`` with the fields the applying entry sets replaced."""
        entry = self.entry(spec.name)
        if entry is None:
            return spec
        compacted = spec.compacted if entry.cleanup is None else "compact" in entry.cleanup
        retention_ms, retention_bytes = spec.retention_ms, spec.retention_bytes
        if entry.retention_ms is not None:
            retention_ms = None if entry.retention_ms < 0 else entry.retention_ms
        if entry.retention_bytes is not None:
            retention_bytes = None if entry.retention_bytes < 0 else entry.retention_bytes
        if entry.cleanup == "compact":  # compaction only: nothing is deleted by age or size
            retention_ms = retention_bytes = None
        config = dict(spec.config)
        if entry.segment_bytes is not None:
            config[SEGMENT_BYTES] = str(entry.segment_bytes)
        return replace(
            spec,
            compacted=compacted,
            retention_ms=retention_ms,
            retention_bytes=retention_bytes,
            min_compaction_lag_ms=(
                spec.min_compaction_lag_ms if entry.min_compaction_lag_ms is None else entry.min_compaction_lag_ms
            ),
            delete_retention_ms=(
                spec.delete_retention_ms if entry.delete_retention_ms is None else entry.delete_retention_ms
            ),
            config=config,
        )


def configured_segment_bytes(spec: TopicSpec) -> int | None:
    """The segment size a spec's config sets (``segment.bytes``), or ``None``."""
    raw = spec.config.get(SEGMENT_BYTES)
    return int(raw) if raw is not None else None


def cleanup_policy(spec: TopicSpec) -> str:
    """Kafka's ``cleanup.policy`` of a spec: compaction, deletion by age or size, or both."""
    if not spec.compacted:
        return "delete"
    if spec.retention_ms is not None or spec.retention_bytes is not None:
        return "compact,delete"
    return "compact"
