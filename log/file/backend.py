"""The embedded ``file`` backend of :class:`~log.base.Log`: topics as directories on one machine.

Layout under ``root``::

    <topic>/topic.json                        the TopicSpec
    <topic>/<partition>/<base:020d>.log       segments of CRC-checked batches (log.file.batch_codec)
    <topic>/<partition>/<base:020d>.index     sparse offset index      (log.file.segment_index)
    <topic>/<partition>/<base:020d>.timeindex sparse time index
    <topic>/<partition>/writer.lock           one writer per partition (log.file.writer_lock)
    <topic>/<partition>/cleaner-checkpoint.json  compaction progress   (log.file.compaction)
    <topic>/<partition>/recovery-point        acknowledged end of the active segment (log.file.recovery_point)

Any number of processes may open the same root. A partition's writer lock is taken at
the first append and kept until :meth:`FileLog.close`; internal topics (``_headwater.*``,
written by every process, e.g. consumer offsets) take it around each append instead.
A torn tail left by a crashed writer is truncated (with a warning) when a partition is
first opened while no writer holds it, and always before a new writer appends.
Appended batches store their records zstd-compressed when ``compression="zstd"`` (the
default, ``log.file.compression``) and that is smaller; readers take either kind.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Literal

from log.base import (
    READ_MAX_BYTES,
    READ_MAX_RECORDS,
    AppendResult,
    CompactionResult,
    Record,
    StoredRecord,
    TopicPartition,
    TopicSpec,
)
from log.cleaner import TopicUsage
from log.consumer import GroupDescription, GroupMember, partition_progress
from log.consumer_groups import ConsumerOffsets
from log.errors import TopicExistsError, UnknownGroupError, UnknownPartitionError, UnknownTopicError
from log.file.batch_codec import Compression
from log.file.compaction import CleanerCheckpoint, clean_partition, cleaning_due, partition_usage
from log.file.group_coordinator import GroupCoordinator, list_group_names
from log.file.partition import Partition
from log.file.topic_store import (
    create_topic_directory,
    delete_topic_directory,
    list_topic_names,
    partition_directory,
    read_spec,
    topic_directory,
)
from log.topic_policy import TopicPolicies, configured_segment_bytes
from log.topics import INTERNAL_PREFIX

if TYPE_CHECKING:
    from log.columns import RecordColumns

DEFAULT_SEGMENT_BYTES = 128 * 1024 * 1024


def _now_ms() -> int:
    return int(time.time() * 1000)


class _OpenTopic:
    """A topic as this process opened it; a recreated topic (new directory identity) is a new one."""

    def __init__(self, spec: TopicSpec, identity: tuple[int, int]) -> None:
        self.spec = spec
        self.identity = identity
        self.partitions: dict[int, Partition] = {}

    def close(self) -> None:
        for partition in self.partitions.values():
            partition.close()


class FileLog:
    """A :class:`~log.base.Log` stored in files under ``root`` (see the module docstring)."""

    #: The conformance suite's compaction tests run against this backend.
    supports_compaction = True

    def __init__(
        self,
        root: Path,
        *,
        fsync: Literal["always", "never"] = "always",
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        compression: Compression = "zstd",
        policies: TopicPolicies | None = None,
    ) -> None:
        """Open the log under ``root``; ``policies`` (``log.topics``) replace parts of topics' specs."""
        if segment_bytes <= 0:
            msg = f"segment_bytes must be positive, not {segment_bytes}"
            raise ValueError(msg)
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._fsync = fsync == "always"
        self._segment_bytes = segment_bytes
        self._policies = policies or TopicPolicies()
        #: How appended batches store their records (``log.file.compression``).
        self.compression: Compression = compression
        self._lock = threading.RLock()
        self._topics: dict[str, _OpenTopic] = {}
        self._offsets = ConsumerOffsets(self)

    def __enter__(self) -> FileLog:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- topics -----------------------------------------------------------------------

    def _open_topic(self, name: str) -> _OpenTopic:
        directory = topic_directory(self.root, name)
        try:
            st = os.stat(directory)
        except FileNotFoundError:
            st = None
        # Inode numbers are reused; the change time (set when the topic was renamed into
        # place) tells a recreated topic from the one this process opened.
        identity = (st.st_ino, st.st_ctime_ns) if st is not None else (-1, -1)
        with self._lock:
            opened = self._topics.get(name)
            if opened is not None and opened.identity == identity:
                return opened
            if opened is not None:
                opened.close()
                del self._topics[name]
            if st is None:
                raise UnknownTopicError(name)
            opened = _OpenTopic(self._policies.apply(read_spec(self.root, name)), identity)
            self._topics[name] = opened
            return opened

    def _partition(self, topic: str, partition: int) -> Partition:
        opened = self._open_topic(topic)
        found = opened.partitions.get(partition)
        if found is not None:
            return found
        if not 0 <= partition < opened.spec.partitions:
            raise UnknownPartitionError(topic, partition, opened.spec.partitions)
        with self._lock:
            found = opened.partitions.get(partition)
            if found is None:
                found = Partition(
                    partition_directory(topic_directory(self.root, topic), partition),
                    topic,
                    partition,
                    fsync=self._fsync,
                    segment_bytes=configured_segment_bytes(opened.spec) or self._segment_bytes,
                    shared_writer=topic.startswith(INTERNAL_PREFIX),
                    compression=self.compression,
                )
                found.recover_if_unlocked()
                opened.partitions[partition] = found
            return found

    def create_topic(self, spec: TopicSpec, *, exist_ok: bool = True) -> None:
        """Create a topic; with ``exist_ok`` an existing topic is left as it is.

        Internal names (``_headwater.*``) are accepted here; user-facing layers reject them.
        """
        if not create_topic_directory(self.root, spec) and not exist_ok:
            raise TopicExistsError(spec.name)

    def delete_topic(self, name: str) -> None:
        """Delete a topic and all its records."""
        topic_directory(self.root, name)
        with self._lock:
            opened = self._topics.pop(name, None)
            if opened is not None:
                opened.close()
        delete_topic_directory(self.root, name)

    def list_topics(self) -> list[str]:
        """Names of all topics, internal ones included, sorted."""
        return list_topic_names(self.root)

    def describe_topic(self, name: str) -> TopicSpec:
        """The topic's spec, with the ``log.topics`` entry that applies to it; :class:`UnknownTopicError` if none."""
        return self._open_topic(name).spec

    # -- records ----------------------------------------------------------------------

    def append(self, topic: str, partition: int, records: Sequence[Record]) -> AppendResult:
        """Append ``records`` to one partition atomically and durably; return their offsets."""
        return self._partition(topic, partition).append(records)

    def append_encoded(self, topic: str, partition: int, batch: Sequence[Record]) -> AppendResult:
        """Append a batch encoded by ``log.file.batch_codec`` (an ``EncodedBatch``) as it is.

        :meth:`append` takes such a batch too; this is the same call under the capability's name.
        """
        return self.append(topic, partition, batch)

    def read(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        max_records: int = READ_MAX_RECORDS,
        max_bytes: int = READ_MAX_BYTES,
    ) -> list[StoredRecord]:
        """Read records at or after ``offset`` in offset order (see :meth:`log.base.Log.read`)."""
        return self._partition(topic, partition).read(max(offset, 0), max_records, max_bytes)

    def read_columns(
        self,
        topic: str,
        partition: int,
        offset: int,
        end: int,
        *,
        max_records: int = READ_MAX_RECORDS,
        max_bytes: int = READ_MAX_BYTES,
    ) -> tuple[RecordColumns, int]:
        """The records :meth:`read` gives, those before ``end``, as Arrow columns; and the offset to go on from.

        Read ``[start, end)`` by calling again at the returned offset until it reaches ``end``
        or stays where it was (nothing more held). See :mod:`log.file.column_decoder`.
        """
        return self._partition(topic, partition).read_columns(max(offset, 0), end, max_records, max_bytes)

    def beginning_offset(self, topic: str, partition: int) -> int:
        """The lowest offset still held (the end offset when the partition is empty)."""
        part = self._partition(topic, partition)
        first = part.read(0, 1, 1)
        return first[0].offset if first else part.end_offset()

    def end_offset(self, topic: str, partition: int) -> int:
        """The offset the next appended record will get."""
        return self._partition(topic, partition).end_offset()

    def clean_offset(self, topic: str, partition: int) -> int:
        """The offset from which every record is still held (0 before the first compaction)."""
        part = self._partition(topic, partition)
        spec = self._open_topic(topic).spec
        if not spec.compacted:
            return self.beginning_offset(topic, partition)
        compacted_to = CleanerCheckpoint.load(part.directory).clean_offset
        if spec.retention_ms is None and spec.retention_bytes is None:
            return compacted_to
        return max(compacted_to, self.beginning_offset(topic, partition))

    def offset_for_time(self, topic: str, partition: int, timestamp_ms: int) -> int | None:
        """The earliest offset whose timestamp is at or after ``timestamp_ms``; ``None`` if none."""
        return self._partition(topic, partition).offset_for_time(timestamp_ms)

    # -- consumer groups --------------------------------------------------------------

    def commit(self, group: str, offsets: Mapping[TopicPartition, int]) -> None:
        """Record a consumer group's next offsets to read (durable, like :meth:`append`)."""
        self._offsets.commit(group, offsets)

    def committed(self, group: str, topic: str) -> dict[int, int]:
        """The group's committed next offsets for the topic's partitions."""
        return self._offsets.committed(group, topic)

    def list_groups(self) -> list[str]:
        """Groups with members (a state file) or committed offsets, sorted."""
        return sorted(set(list_group_names(self.root)) | set(self._offsets.groups()))

    def describe_group(self, group: str) -> GroupDescription:
        """Live members, their partitions, and every partition's committed offset and lag."""
        state = GroupCoordinator(self.root, group, lambda _topic: None).state()
        committed_topics = self._offsets.groups().get(group, set())
        if state is None and not committed_topics:
            raise UnknownGroupError(group)
        now = _now_ms()
        members: list[GroupMember] = []
        owners: dict[TopicPartition, str] = {}
        topics = set(committed_topics)
        generation = None
        moving = False
        if state is not None:
            generation = state.generation
            live = {name: m for name, m in state.members.items() if m.deadline_ms >= now}
            for tp, own in state.partitions.items():
                if own.owner in live:
                    owners[tp] = own.owner
                    moving = moving or own.next is not None
            for name, m in sorted(live.items()):
                topics.update(m.topics)
                assigned = tuple(sorted(tp for tp, owner in owners.items() if owner == name))
                members.append(GroupMember(name, m.client, assigned, m.deadline_ms - now))
        status = "empty" if not members else "rebalancing" if moving else "stable"
        progress = partition_progress(self, group, topics, owners)
        return GroupDescription(group, status, generation, tuple(members), tuple(progress))

    # -- cleaning ---------------------------------------------------------------------

    def compact(self, topic: str) -> CompactionResult:
        """Run one compaction (compacted topics) and/or retention pass now."""
        result = self.clean(topic)
        assert result is not None
        return result

    def clean(
        self, topic: str, *, holds: Mapping[int, int] | None = None, only_if_due: bool = False
    ) -> CompactionResult | None:
        """One cleaning pass over the topic's partitions (:class:`log.cleaner.CleansItself`).

        ``holds``: per partition, the offset nothing at or after which is removed.
        ``only_if_due``: skip partitions where a pass could remove nothing new
        (:func:`log.file.compaction.cleaning_due`); ``None`` when every one was skipped.
        """
        spec = self._open_topic(topic).spec
        now = _now_ms()
        before_records = after_records = before_bytes = after_bytes = 0
        ran = False
        for number in range(spec.partitions):
            segments = self._partition(topic, number).segments
            hold = (holds or {}).get(number)
            if only_if_due and not cleaning_due(segments, now, hold=hold):
                continue
            done = clean_partition(segments, spec, now, hold=hold)
            ran = True
            before_records += done.records_before
            after_records += done.records_after
            before_bytes += done.bytes_before
            after_bytes += done.bytes_after
        if not ran and only_if_due:
            return None
        return CompactionResult(topic, before_records, after_records, before_bytes, after_bytes)

    def usage(self, topic: str) -> TopicUsage:
        """Bytes on disk and dirty bytes of the topic (:class:`log.cleaner.ReportsUsage`)."""
        spec = self._open_topic(topic).spec
        size = closed = dirty = 0
        for number in range(spec.partitions):
            part = partition_usage(self._partition(topic, number).segments)
            size, closed, dirty = size + part.size, closed + part.closed, dirty + part.dirty
        return TopicUsage(topic, size, closed, dirty if spec.compacted else 0)

    def close(self) -> None:
        """Release writer locks and files. Idempotent."""
        with self._lock:
            for opened in self._topics.values():
                opened.close()
            self._topics.clear()
