"""Where an unchanged TOAST value comes from: the old row, the latest image of its key, or the log.

pgoutput does not send a TOASTed value that an update left unchanged. The event builder
fills it from the old row image (REPLICA IDENTITY FULL), else from :class:`ImageCache` (the
latest after-image per key, kept without reading the log back), else from the log itself
(:class:`LogImages`, after a restart or when the key fell out of the cache).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeAlias

import orjson

from capture.errors import UnresolvedToastError
from capture.position import read_between
from capture.tuples import UNCHANGED_TOAST
from log.base import Log
from log.partitioner import partition_for
from log.shards import shard_map_of

#: ``(topic, key, before)``: the key's latest stored after-image among records whose sequence
#: ``(commit_lsn, txn_index)`` is below ``before`` (the change being built), or None.
PreviousImage: TypeAlias = Callable[[str, bytes, tuple[int, int]], Mapping[str, Any] | None]

#: Records read per step backwards through a partition.
_STEP = 1024


class ImageCache:
    """Latest after-image JSON per (topic, key), and the TOAST filling that reads it.

    Parsed only when needed (orjson round-trips every value it printed). Two generations
    bound it to ``size`` entries at O(1) per change: when the young one is half full it
    becomes the old one and the old one goes; ``previous_image`` (the log) covers what fell
    out. Keyed by ``<topic> NUL <key>`` bytes: no tuple per entry for the collector to traverse.
    ``images``, ``old`` and ``half`` are shared with the extension's event loop, which
    remembers images itself.
    """

    __slots__ = ("_previous_image", "half", "images", "old")

    def __init__(self, size: int, previous_image: PreviousImage | None = None) -> None:
        self.images: dict[bytes, bytes] = {}
        self.old: dict[bytes, bytes] = {}
        self.half = size // 2
        self._previous_image = previous_image

    def rotate(self) -> None:
        """Make the young generation the old one once it is half full."""
        if len(self.images) >= self.half:
            self.old, self.images = self.images, {}

    def remember(self, topic: str, key: bytes | None, after: bytes | None) -> None:
        """Keep ``after`` as the key's latest image (None: the key was deleted)."""
        if key is None or self.half <= 0:
            return
        slot = b"%b\x00%b" % (topic.encode(), key)
        if after is None:
            self.images.pop(slot, None)
            self.old.pop(slot, None)
            return
        self.images[slot] = after
        self.rotate()

    def remembered(self, topic: str, key: bytes) -> dict[str, Any] | None:
        """The key's latest image, if the cache holds it."""
        slot = b"%b\x00%b" % (topic.encode(), key)
        image = self.images.get(slot)
        if image is None:
            image = self.old.get(slot)
        return None if image is None else orjson.loads(image)  # type: ignore[no-any-return]

    def fill(
        self,
        topic: str,
        after: dict[str, Any],
        before: Mapping[str, Any] | None,
        key: bytes | None,
        sequence: tuple[int, int],
    ) -> dict[str, Any]:
        """``after`` with its unchanged TOAST values filled in; :class:`UnresolvedToastError` if one is unknown."""
        previous: Mapping[str, Any] | None = before
        if previous is None or any(previous.get(n) is UNCHANGED_TOAST for n in after):
            looked_up: Mapping[str, Any] | None = self.remembered(topic, key) if key else None
            if looked_up is None and self._previous_image and key:
                # Only records older than this change: after a crash mid-flush the log may
                # already hold this very change (a key change's delete of the old key).
                looked_up = self._previous_image(topic, key, sequence)
            previous = looked_up if looked_up is not None else previous
        filled = dict(after)
        for name, value in after.items():
            if value is UNCHANGED_TOAST:
                if previous is None or name not in previous or previous[name] is UNCHANGED_TOAST:
                    raise UnresolvedToastError(topic, name)
                filled[name] = previous[name]
        return filled


class LogImages:
    """A key's latest after-image stored before a sequence, read from the log (a :data:`PreviousImage`).

    Rare (a cache miss, e.g. right after a restart): the key's partition is scanned backwards.
    """

    def __init__(self, log: Log, partitions: Callable[[str], int]) -> None:
        self._log = log
        self._partitions = partitions

    def __call__(self, topic: str, key: bytes, before: tuple[int, int]) -> dict[str, Any] | None:
        """The key's latest after-image among records of ``topic`` whose sequence is below ``before``.

        Records at or after ``before`` are skipped: a crash between the per-partition appends
        of one flush can leave this very change (say a key change's delete of the old key) or
        later ones in the log already, and taking those for the previous image loses the
        unchanged TOAST value.
        """
        log = self._log
        if topic not in log.list_topics():
            return None
        # A split topic (log.shards) holds the key in a chain of partitions: newest first.
        shards = shard_map_of(log, topic)
        chain = [partition_for(key, self._partitions(topic))] if shards is None else shards.chain(key)
        for partition in reversed(chain):
            found = self._scan(topic, partition, key, before)
            if found is not None:
                return found[0]
        return None

    def _scan(
        self, topic: str, partition: int, key: bytes, before: tuple[int, int]
    ) -> tuple[dict[str, Any] | None] | None:
        """``(after image,)`` of the key's latest event before ``before`` in one partition; ``None`` if none."""
        log = self._log
        end = log.end_offset(topic, partition)
        start = log.beginning_offset(topic, partition)
        while end > start:
            first = max(start, end - _STEP)
            for record in reversed(read_between(log, topic, partition, first, end)):
                if record.key != key or record.value is None:
                    continue  # another key, or a tombstone (its delete event comes right before it)
                value = orjson.loads(record.value)
                source = value.get("source") or {}
                if "commit_lsn" in source and (int(source["commit_lsn"]), int(source["txn_index"])) >= before:
                    continue
                after = value.get("after")
                return (after if isinstance(after, dict) else None,)
            end = first
        return None
