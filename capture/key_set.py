"""The keys a re-snapshot read, per topic: in memory while few, spilled to an SQLite file beyond that.

A resync compares every key the log holds live with the keys the source still has
(:func:`capture.resync.vanished_key_deletes`). Held as Python bytes, 100M keys take
gigabytes; a :class:`KeySet` keeps up to ``spill_at`` keys in a set (small tables stay
fast) and moves them all to a ``WITHOUT ROWID`` table in ``path`` once there are more,
so memory stays at SQLite's page cache (``CACHE_KIB``) whatever the table's size.

The file is scratch: written without journal or fsync, since a crash restarts the
re-snapshot with a new slot and an empty key set (:meth:`KeySet.__init__` removes a
stale file); :func:`remove_key_set` deletes it once the resync request is cleared.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterable, Sequence
from pathlib import Path

KEY_SET_FILE = "resync_keys.sqlite"
#: SQLite's page cache for the spilled set (the bound on its memory), KiB.
CACHE_KIB = 16 * 1024
#: Keys per ``IN (...)`` lookup: one prepared statement reused for every full chunk.
_LOOKUP_CHUNK = 500


def key_set_path(state_dir: Path) -> Path:
    """Where a source's resync key set is spilled (its capture state directory)."""
    return state_dir / KEY_SET_FILE


def remove_key_set(state_dir: Path) -> None:
    """Delete a spilled key set (idempotent)."""
    with contextlib.suppress(FileNotFoundError):
        key_set_path(state_dir).unlink()


class KeySet:
    """A set of keys per topic; :meth:`present` answers membership for a batch of keys."""

    #: Keys kept in memory (all topics together) before the set spills to disk.
    SPILL_AT = 200_000

    def __init__(self, path: Path, *, spill_at: int | None = None) -> None:
        self._path = path
        self._spill_at = self.SPILL_AT if spill_at is None else spill_at
        self._memory: dict[str, set[bytes]] = {}
        self._topic_ids: dict[str, int] = {}
        self._count = 0
        self._db: sqlite3.Connection | None = None
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # left by an interrupted resync: that snapshot is read again from the start

    @property
    def spilled(self) -> bool:
        """Whether the keys live in the SQLite file."""
        return self._db is not None

    def topics(self) -> list[str]:
        """Every topic added, even with no keys (an empty table: each live key is gone), in order added."""
        return list(self._topic_ids)

    def add(self, topic: str, keys: Iterable[bytes]) -> None:
        """Add ``keys`` of ``topic`` (registering the topic even when there are none)."""
        topic_id = self._topic_ids.setdefault(topic, len(self._topic_ids))
        if self._db is None:
            held = self._memory.setdefault(topic, set())
            before = len(held)
            held.update(keys)
            self._count += len(held) - before
            if self._count > self._spill_at:
                self._spill()
            return
        # Sorted, the inserts touch neighbouring B-tree pages (fewer cache misses).
        self._insert([(topic_id, key) for key in sorted(keys)])

    def present(self, topic: str, keys: Sequence[bytes]) -> set[bytes]:
        """Those of ``keys`` that are in the set for ``topic``."""
        if self._db is None:
            held = self._memory.get(topic)
            return set() if not held else {key for key in keys if key in held}
        topic_id = self._topic_ids.get(topic)
        if topic_id is None:
            return set()
        found: set[bytes] = set()
        unique = list(set(keys))
        for start in range(0, len(unique), _LOOKUP_CHUNK):
            chunk = unique[start : start + _LOOKUP_CHUNK]
            marks = ",".join("?" * len(chunk))
            rows = self._db.execute(f"SELECT key FROM keys WHERE topic = ? AND key IN ({marks})", (topic_id, *chunk))
            found.update(row[0] for row in rows)
        return found

    def close(self) -> None:
        """Release the file (it stays until :func:`remove_key_set`) and the memory. Idempotent."""
        if self._db is not None:
            self._db.close()
            self._db = None
        self._memory.clear()

    def __enter__(self) -> KeySet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _spill(self) -> None:
        self._path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self._path, isolation_level=None)
        # Scratch data: no journal, no fsync (a crash restarts the re-snapshot with an empty set).
        db.execute("PRAGMA journal_mode = OFF")
        db.execute("PRAGMA synchronous = OFF")
        db.execute(f"PRAGMA cache_size = -{CACHE_KIB}")
        db.execute("PRAGMA temp_store = FILE")
        db.execute(
            "CREATE TABLE keys (topic INTEGER NOT NULL, key BLOB NOT NULL, PRIMARY KEY (topic, key)) WITHOUT ROWID"
        )
        self._db = db
        memory, self._memory = self._memory, {}
        for topic, keys in memory.items():
            topic_id = self._topic_ids[topic]
            self._insert([(topic_id, key) for key in sorted(keys)])
            keys.clear()

    def _insert(self, rows: list[tuple[int, bytes]]) -> None:
        assert self._db is not None
        if not rows:
            return
        # One transaction per batch (autocommit per row would cost a statement journal each).
        self._db.execute("BEGIN")
        self._db.executemany("INSERT OR IGNORE INTO keys (topic, key) VALUES (?, ?)", rows)
        self._db.execute("COMMIT")
