"""The file backend's partition map (:mod:`log.shards`) and the lock that orders appends against a seal.

Layout in a topic's directory::

    <topic>/shards.json   the map (absent until the first split or merge; replaced whole,
                          ``core.durable_files``)
    <topic>/shards.lock   ``flock``: shared around every append batch, exclusive while a
                          split or merge seals partitions and writes the map
    <topic>/shards.admin.lock  ``flock``: one split or merge at a time (held from reading
                          the map to writing it; appends do not take it)

Every append batch of a (non-internal) topic takes the lock shared, looks at the map
file (one ``stat``: the cached map is re-read only when its inode, size or mtime
changed) and appends to the partition the map says, all before releasing the lock. A
split takes the lock exclusively, so no append is in flight while it reads the sealed
partition's end offset and writes the new map; every append after it sees the new map.
So no record lands in a partition after its seal. The children's directories are
created (and fsynced) before the exclusive lock is taken, under the admin lock that keeps
other splits away, so appends wait only for the end offsets and the map's write.

Threads of one process share one descriptor: the first thread in takes the shared lock,
the last one out drops it (``flock`` belongs to the open file, not the thread).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import orjson

from core.durable_files import fsync_directory, replace_file
from log.file.partition_segments import create_partition_directory
from log.shards import ShardError, ShardMap

MAP_NAME = "shards.json"
LOCK_NAME = "shards.lock"
ADMIN_LOCK_NAME = "shards.admin.lock"


class TopicShards:
    """One process's view of a topic's partition map, and its side of the append lock."""

    def __init__(self, topic_dir: Path, topic: str) -> None:
        self.topic = topic
        self.directory = topic_dir
        self.map_path = topic_dir / MAP_NAME
        self._map_name = str(self.map_path)  # stat at every append: no pathlib on that path
        self._lock_path = topic_dir / LOCK_NAME
        self._guard = threading.Lock()
        self._fd: int | None = None
        self._holders = 0
        self._cached: tuple[tuple[int, int, int], ShardMap] | None = None

    def current(self) -> ShardMap | None:
        """The map as the file holds it now (``None``: never split); one ``stat`` when unchanged."""
        try:
            st = os.stat(self._map_name)
        except FileNotFoundError:
            return None
        stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
        cached = self._cached
        if cached is not None and cached[0] == stamp:
            return cached[1]
        try:
            found = ShardMap.from_json(orjson.loads(self.map_path.read_bytes()))
        except FileNotFoundError:
            return None
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            msg = f"damaged partition map {self.map_path}: {exc}; restore it from a backup"
            raise ShardError(msg) from None
        self._cached = (stamp, found)
        return found

    @contextlib.contextmanager
    def appending(self) -> Iterator[ShardMap | None]:
        """Hold the append lock shared (no seal meanwhile) and give the map to route by."""
        with self._guard:
            if self._holders == 0:
                if self._fd is None:
                    self._fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o644)
                fcntl.flock(self._fd, fcntl.LOCK_SH)
            self._holders += 1
        try:
            yield self.current()
        finally:
            with self._guard:
                self._holders -= 1
                if self._holders == 0 and self._fd is not None:
                    fcntl.flock(self._fd, fcntl.LOCK_UN)

    @contextlib.contextmanager
    def changing(self) -> Iterator[ShardMap | None]:
        """Hold the admin lock (no other split or merge of the topic) and give the map; appends go on."""
        fd = os.open(self.directory / ADMIN_LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield self.current()
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def sealing(self) -> Iterator[None]:
        """Hold the append lock exclusively: no append of any process is in flight (inside :meth:`changing`)."""
        fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def create_children(self, numbers: list[int]) -> None:
        """Create the empty partition directories of new children (an orphan left by a crash is replaced)."""
        for number in numbers:
            directory = self.directory / str(number)
            if directory.exists():
                # Only a split that crashed before writing its map leaves one (the map names no such partition).
                shutil.rmtree(directory)
            create_partition_directory(directory)
            fsync_directory(directory)
        fsync_directory(self.directory)

    def write(self, shards: ShardMap) -> None:
        """Replace the map file durably (the new partitions' directories exist already)."""
        replace_file(self.map_path, orjson.dumps(shards.to_json(), option=orjson.OPT_INDENT_2), mode=0o644)
        self._cached = None

    def close(self) -> None:
        """Drop the lock descriptor (idempotent; only when no append holds it)."""
        with self._guard:
            if self._fd is not None and self._holders == 0:
                os.close(self._fd)
                self._fd = None
