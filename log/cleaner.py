"""The background cleaner: compaction and retention of every topic, by its spec and ``log.topics``.

Per topic, every ``log.cleaner_interval_s`` (``capture --follow``, ``run --follow``,
``headwater log clean --follow``):

* a log that cleans itself (:class:`CleansItself`, the file backend) runs a pass over each
  partition where one could remove something new (:func:`log.file.compaction.cleaning_due`),
  never at or past the partition's *hold*;
* on Kafka (:class:`AlignsTopicConfigs`) the broker cleans: the cleaner makes each topic's
  configs match its ``log.topics`` entry, and the broker's cleaner follows them.

Holds protect readers that need every version: a callable gives, per topic, the offset of
each partition below which cleaning may happen (:func:`operations.pipeline.history_holds`
gives the committed positions of the SCD2 tables' loaders). ``_headwater.schemas`` is
never cleaned: readers decode old records with the shape version they were written under,
and versions are few. A pass is safe to stop at any moment (segments are replaced
atomically), and cleaners of one partition take turns (``cleaner.lock``), so any number of
them may run.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from core.errors import TransientError
from log.base import CompactionResult, Log
from log.errors import UnknownTopicError
from log.topics import SCHEMAS_TOPIC

logger = logging.getLogger(__name__)

#: Per topic: partition → the offset nothing at or after which may be cleaned.
Holds = Callable[[str], Mapping[int, int]]
#: Topics the cleaner leaves alone (see the module docstring).
KEEP_EVERY_VERSION = frozenset({SCHEMAS_TOPIC})


@dataclass(frozen=True, slots=True)
class TopicUsage:
    """A topic's bytes on disk; ``dirty_bytes`` are closed segments not yet compacted."""

    topic: str
    bytes: int
    closed_bytes: int
    dirty_bytes: int

    @property
    def dirty_ratio(self) -> float:
        """Dirty bytes over closed bytes (Kafka's ratio; the active segment is never cleaned)."""
        return self.dirty_bytes / self.closed_bytes if self.closed_bytes else 0.0


@runtime_checkable
class CleansItself(Protocol):
    """A log whose cleaning runs in the cleaner's process (the file backend)."""

    def clean(
        self, topic: str, *, holds: Mapping[int, int] | None = None, only_if_due: bool = False
    ) -> CompactionResult | None:
        """One pass over the topic's partitions; ``None`` when ``only_if_due`` skipped every one."""
        ...


@runtime_checkable
class AlignsTopicConfigs(Protocol):
    """A log whose store cleans by itself (Kafka), by configs the cleaner keeps in line with ``log.topics``."""

    def align_topic_configs(self, topic: str) -> bool:
        """Make the topic's cleaning configs those its spec and ``log.topics`` entry give; whether they changed."""
        ...


@runtime_checkable
class ReportsUsage(Protocol):
    """A log that knows its topics' bytes and dirty bytes (``headwater status``)."""

    def usage(self, topic: str) -> TopicUsage:
        """The topic's bytes on disk and its dirty bytes."""
        ...


@dataclass(frozen=True, slots=True)
class CleanedTopic:
    """What one look at a topic did: a pass (``result``) or a change of the broker's configs."""

    topic: str
    result: CompactionResult | None = None
    configs_changed: bool = False
    #: How long the look took (a pass, or asking the broker).
    seconds: float = 0.0

    def describe(self) -> str:
        """One line for the operator."""
        if self.result is None:
            return f"{self.topic}: cleaning configs updated" if self.configs_changed else f"{self.topic}: nothing to do"
        r = self.result
        return (
            f"{self.topic}: {r.records_before} -> {r.records_after} records, {r.bytes_before} -> {r.bytes_after} bytes"
        )


class Cleaner:
    """Cleans a log's topics (see the module docstring)."""

    def __init__(self, log: Log, *, holds: Holds | None = None) -> None:
        self._log = log
        self._holds = holds

    def run_once(self, topics: Iterable[str] | None = None) -> list[CleanedTopic]:
        """Look at every topic (or ``topics``) once; what was done, topics with nothing to do left out."""
        done: list[CleanedTopic] = []
        for topic in self._log.list_topics() if topics is None else topics:
            if topic in KEEP_EVERY_VERSION:
                continue
            started = time.monotonic()
            try:
                cleaned = self._clean(topic)
            except UnknownTopicError:
                continue  # deleted meanwhile
            cleaned = dataclasses.replace(cleaned, seconds=time.monotonic() - started)
            if cleaned.result is not None or cleaned.configs_changed:
                done.append(cleaned)
        return done

    def _clean(self, topic: str) -> CleanedTopic:
        log = self._log
        if isinstance(log, CleansItself):
            holds = self._holds(topic) if self._holds is not None else None
            return CleanedTopic(topic, result=log.clean(topic, holds=holds, only_if_due=True))
        if isinstance(log, AlignsTopicConfigs):
            return CleanedTopic(topic, configs_changed=log.align_topic_configs(topic))
        return CleanedTopic(topic)

    def run(self, stop: threading.Event, interval_s: float, report: Callable[[CleanedTopic], None]) -> None:
        """Clean every ``interval_s`` until ``stop`` is set; a transient failure is logged and retried next time."""
        while True:
            try:
                for cleaned in self.run_once():
                    report(cleaned)
            except (TransientError, OSError) as exc:  # a broker away, a full disk: next time may work
                logger.warning("log cleaner: %s; retrying in %gs", exc, interval_s)
            if stop.wait(interval_s):
                return
