"""Planning a snapshot: each table in chunks of heap pages, which chunks are done, and progress.

A chunk is a ``ctid`` range (a TID range scan since PG 14). It is recorded as done in the
state file only after its events are appended (fsynced), so a restart reads again exactly
the chunks that may be missing from the log.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from core.durable_files import replace_json

#: Heap pages per chunk (8 KiB pages: about 8 MiB of table per COPY).
CHUNK_PAGES = 1024


@dataclass(frozen=True)
class Chunk:
    """Pages ``[first_page, last_page)`` of one table; ``last_page=None`` means to the end.

    ``condition`` is the table's row filter (:mod:`capture.postgres.registration.row_filters`): only rows
    meeting it are read.
    """

    schema: str
    name: str
    number: int
    first_page: int
    last_page: int | None
    condition: str | None = None

    @property
    def id(self) -> str:
        """Stable identity in the state file."""
        return f"{self.schema}.{self.name}#{self.number}"


@dataclass
class SnapshotState:
    """Progress of a source's snapshot, stored as JSON beside the log."""

    path: Path
    consistent_lsn: int | None = None
    done_chunks: set[str] = field(default_factory=set)
    completed: bool = False

    @classmethod
    def load(cls, path: Path) -> SnapshotState:
        """Read the state file (a missing file is a snapshot never started)."""
        if not path.exists():
            return cls(path)
        data = json.loads(path.read_text())
        return cls(path, data.get("consistent_lsn"), set(data.get("done_chunks", [])), bool(data.get("completed")))

    def save(self) -> None:
        """Write atomically and durably (:func:`core.durable_files.replace_json`)."""
        body = {
            "consistent_lsn": self.consistent_lsn,
            "done_chunks": sorted(self.done_chunks),
            "completed": self.completed,
        }
        replace_json(self.path, body)


def plan_chunks(
    conn: psycopg.Connection[Any], schema: str, name: str, oid: int, condition: str | None = None
) -> list[Chunk]:
    """Split a table into page-range chunks (``relpages`` is an estimate: the last chunk is open-ended)."""
    row = conn.execute("SELECT relpages FROM pg_class WHERE oid = %s", (oid,)).fetchone()
    pages = max(int(row[0]) if row else 0, 0)
    chunks = []
    first = 0
    number = 0
    while first + CHUNK_PAGES < pages:
        chunks.append(Chunk(schema, name, number, first, first + CHUNK_PAGES, condition))
        first += CHUNK_PAGES
        number += 1
    chunks.append(Chunk(schema, name, number, first, None, condition))
    return chunks
