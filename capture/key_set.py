"""A resync's scratch data: the keys its re-snapshot read, and the log's keys it did not read.

A resync compares every key the log holds live with the keys the source still has
(:func:`capture.resync.vanished_key_deletes`). Held as Python objects, 100M keys take
gigabytes, so both sides live in memory only while small:

* a :class:`KeySet` keeps up to ``spill_at`` keys in a set (small tables stay fast) and
  moves them all to a ``WITHOUT ROWID`` table in ``path`` once there are more;
* a :class:`Candidates` keeps, per key the log holds but the re-snapshot did not read,
  the latest event's sequence and raw value while that event is live (a key whose
  latest event is a delete is dropped at once), up to ``spill_bytes``, then in a table
  of the same file.

Memory stays at SQLite's page cache (``CACHE_KIB``) plus the thresholds, whatever the
table's size or delete history. The file is scratch: written without journal or fsync,
since a crash restarts the re-snapshot with a new slot and an empty key set
(:meth:`KeySet.__init__` removes a stale file); :func:`remove_key_set` deletes it once
the resync request is cleared.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path

KEY_SET_FILE = "resync_keys.sqlite"
#: SQLite's page cache for the spilled set (the bound on its memory), KiB.
CACHE_KIB = 16 * 1024
#: Keys per ``IN (...)`` lookup: one prepared statement reused for every full chunk.
_LOOKUP_CHUNK = 500

#: A candidate's latest live event: ``(commit_lsn, txn_index, value)``, the value as the log holds it.
Latest = tuple[int, int, bytes]


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
        self._spilled = False
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # left by an interrupted resync: that snapshot is read again from the start

    @property
    def spilled(self) -> bool:
        """Whether the keys live in the SQLite file."""
        return self._spilled

    def topics(self) -> list[str]:
        """Every topic added, even with no keys (an empty table: each live key is gone), in order added."""
        return list(self._topic_ids)

    def add(self, topic: str, keys: Iterable[bytes]) -> None:
        """Add ``keys`` of ``topic`` (registering the topic even when there are none)."""
        topic_id = self._topic_ids.setdefault(topic, len(self._topic_ids))
        if not self._spilled:
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
        if not self._spilled:
            held = self._memory.get(topic)
            return set() if not held else {key for key in keys if key in held}
        topic_id = self._topic_ids.get(topic)
        if topic_id is None:
            return set()
        found: set[bytes] = set()
        unique = list(set(keys))
        db = self.database()
        for start in range(0, len(unique), _LOOKUP_CHUNK):
            chunk = unique[start : start + _LOOKUP_CHUNK]
            marks = ",".join("?" * len(chunk))
            rows = db.execute(f"SELECT key FROM keys WHERE topic = ? AND key IN ({marks})", (topic_id, *chunk))
            found.update(row[0] for row in rows)
        return found

    def database(self) -> sqlite3.Connection:
        """The scratch file, opened (and created) on first use; :class:`Candidates` spill into it too."""
        if self._db is None:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self._path, isolation_level=None)
            # Scratch data: no journal, no fsync (a crash restarts the re-snapshot with an empty set).
            db.execute("PRAGMA journal_mode = OFF")
            db.execute("PRAGMA synchronous = OFF")
            db.execute(f"PRAGMA cache_size = -{CACHE_KIB}")
            db.execute("PRAGMA temp_store = FILE")
            self._db = db
        return self._db

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
        self.database().execute(
            "CREATE TABLE keys (topic INTEGER NOT NULL, key BLOB NOT NULL, PRIMARY KEY (topic, key)) WITHOUT ROWID"
        )
        self._spilled = True
        memory, self._memory = self._memory, {}
        for topic, keys in memory.items():
            topic_id = self._topic_ids[topic]
            self._insert([(topic_id, key) for key in sorted(keys)])
            keys.clear()

    def _insert(self, rows: list[tuple[int, bytes]]) -> None:
        if not rows:
            return
        db = self.database()
        # One transaction per batch (autocommit per row would cost a statement journal each).
        db.execute("BEGIN")
        db.executemany("INSERT OR IGNORE INTO keys (topic, key) VALUES (?, ?)", rows)
        db.execute("COMMIT")


class Candidates:
    """Per key of one topic that the re-snapshot did not read: its latest event, while that is live.

    Fed in log order, one read batch at a time (:meth:`update`): a key's later event
    replaces its earlier one, a delete or tombstone drops the key (nothing to reconcile).
    Held in memory up to ``spill_bytes`` (an estimate of the dict's size), then in a
    table of ``keys``' scratch file, emptied again by :meth:`close`.
    """

    #: Estimated bytes of held candidates before they move to the scratch file.
    SPILL_BYTES = 64 * 1024 * 1024
    #: What a held entry costs beyond its key and value: two bytes objects, a tuple, two ints, a dict slot.
    ENTRY_OVERHEAD = 256

    def __init__(self, keys: KeySet, *, spill_bytes: int | None = None) -> None:
        self._keys = keys
        self._spill_bytes = self.SPILL_BYTES if spill_bytes is None else spill_bytes
        self._memory: dict[bytes, Latest] = {}
        self._held_bytes = 0
        self._db: sqlite3.Connection | None = None

    @property
    def spilled(self) -> bool:
        """Whether the candidates live in the scratch file."""
        return self._db is not None

    def update(self, changes: Mapping[bytes, Latest | None]) -> None:
        """Apply one read batch's last event per key: ``None`` for a delete or tombstone, else the live event."""
        if self._db is not None:
            self._write(self._db, changes)
            return
        memory = self._memory
        for key, latest in changes.items():
            old = memory.pop(key, None)
            if old is not None:
                self._held_bytes -= self._size(key, old)
            if latest is not None:
                memory[key] = latest
                self._held_bytes += self._size(key, latest)
        if self._held_bytes > self._spill_bytes:
            self._spill()

    def live(self, since: tuple[int, int] | None = None) -> Iterator[tuple[bytes, bytes]]:
        """``(key, value)`` of every candidate whose event is at or after ``since`` (a truncate), by key."""
        if self._db is None:
            for key in sorted(self._memory):
                lsn, index, value = self._memory[key]
                if since is None or (lsn, index) >= since:
                    yield key, value
            return
        lsn, index = since if since is not None else (0, 0)
        cursor = self._db.execute(
            "SELECT key, value FROM candidates WHERE (commit_lsn, txn_index) >= (?, ?) ORDER BY key", (lsn, index)
        )
        try:
            yield from cursor
        finally:
            cursor.close()  # (a reader that stops early) before close() drops the table

    def close(self) -> None:
        """Forget every candidate (the scratch file's table is dropped). Idempotent."""
        self._memory.clear()
        self._held_bytes = 0
        if self._db is not None:
            with contextlib.suppress(sqlite3.ProgrammingError):  # the key set closed the file first
                self._db.execute("DROP TABLE IF EXISTS candidates")
            self._db = None

    @classmethod
    def _size(cls, key: bytes, latest: Latest) -> int:
        return len(key) + len(latest[2]) + cls.ENTRY_OVERHEAD

    def _spill(self) -> None:
        db = self._keys.database()
        # Sequences are LSNs and txn indexes: below 2**63, so they fit SQLite's signed integers.
        db.execute("DROP TABLE IF EXISTS candidates")
        db.execute(
            "CREATE TABLE candidates (key BLOB NOT NULL PRIMARY KEY, commit_lsn INTEGER NOT NULL, "
            "txn_index INTEGER NOT NULL, value BLOB NOT NULL) WITHOUT ROWID"
        )
        self._db = db
        memory, self._memory = self._memory, {}
        self._held_bytes = 0
        self._write(db, memory)

    @staticmethod
    def _write(db: sqlite3.Connection, changes: Mapping[bytes, Latest | None]) -> None:
        gone = [(key,) for key, latest in changes.items() if latest is None]
        kept = sorted((key, *latest) for key, latest in changes.items() if latest is not None)
        db.execute("BEGIN")
        if gone:
            db.executemany("DELETE FROM candidates WHERE key = ?", gone)
        if kept:
            db.executemany(
                "INSERT OR REPLACE INTO candidates (key, commit_lsn, txn_index, value) VALUES (?, ?, ?, ?)", kept
            )
        db.execute("COMMIT")
