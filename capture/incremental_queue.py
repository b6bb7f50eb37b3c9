"""The queue of ad-hoc incremental snapshots of one source, for every source kind.

``headwater snapshot NAME --tables T,...`` (or Dagster) writes a request file under
``<home>/capture/<source>/incremental-requests/`` (:func:`write_request`); the source's capture
agent, running now or started later, moves it into ``incremental.json`` (:class:`IncrementalState`)
and reads the tables chunk by chunk between watermarks. How a kind reads a chunk and keeps it
exact is its own (PostgreSQL: :mod:`capture.postgres.snapshot.incremental`, logical-message
watermarks; MySQL/MariaDB: :mod:`capture.mysql.incremental`, binlog positions); this module
holds what they share: the state file, the request files and the queue's operations that the
signal table (:mod:`capture.signals`) orders.

Resume point: a table's ``last_key`` is saved only after the chunk ending at it is durable in
the log (:meth:`IncrementalQueue.flushed`), so after a crash the chunk in flight is read again.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from capture.errors import CaptureError
from core.durable_files import replace_json
from core.errors import PermanentError
from log.sequence import Sequence as Seq

logger = logging.getLogger(__name__)

REQUESTS_DIR = "incremental-requests"
STATE_FILE = "incremental.json"
#: How often the agent looks for new request files.
REQUEST_POLL_S = 1.0


class IncrementalSnapshotError(CaptureError, PermanentError):
    """An incremental snapshot cannot be requested or run for a table."""


@dataclass(frozen=True)
class SnapshotTable:
    """A table to snapshot, and the condition its rows must meet besides the source's filter (None: none)."""

    table: str
    condition: str | None = None


@dataclass
class TableProgress:
    """One table of a request; ``last_key`` is the text of the last key emitted (None: none yet)."""

    table: str
    request: str
    last_key: list[str] | None = None
    condition: str | None = None
    #: Also delete keys the log holds live that the table lost with no change in the stream (a partition
    #: detached); read from its first chunk again after a restart (the keys seen are not kept).
    reconcile: bool = False
    #: The table's oid (re-reads after schema changes): read under its name then, renamed or not.
    oid: int | None = None


@dataclass
class IncrementalState:
    """Queued tables of incremental snapshots, the first one in progress; stored as JSON.

    ``paused`` (a ``pause-snapshot`` signal) keeps chunks from being read; ``last_signal`` is
    the position of the last signal carried out (:mod:`capture.signals`).
    """

    path: Path
    tables: list[TableProgress] = field(default_factory=list)
    paused: bool = False
    last_signal: Seq | None = None

    @classmethod
    def load(cls, path: Path) -> IncrementalState:
        """Read the state file (missing: nothing queued)."""
        if not path.exists():
            return cls(path)
        data = orjson.loads(path.read_bytes())
        tables = [
            TableProgress(
                t["table"],
                t["request"],
                None if t.get("reconcile") else t.get("last_key"),  # its seen keys are gone: read it all again
                t.get("condition"),
                bool(t.get("reconcile")),
                t.get("oid"),
            )
            for t in data["tables"]
        ]
        last = data.get("last_signal")
        return cls(path, tables, bool(data.get("paused")), None if last is None else Seq(int(last[0]), int(last[1])))

    def save(self) -> None:
        """Write atomically."""
        tables = []
        for t in self.tables:
            table: dict[str, Any] = {"table": t.table, "request": t.request, "last_key": t.last_key}
            if t.condition is not None:
                table["condition"] = t.condition
            if t.reconcile:
                table["reconcile"] = True
            if t.oid is not None:
                table["oid"] = t.oid
            tables.append(table)
        body: dict[str, Any] = {"tables": tables}  # what is not set stays out (the file of earlier versions)
        if self.paused:
            body["paused"] = True
        if self.last_signal is not None:
            body["last_signal"] = [self.last_signal.commit_lsn, self.last_signal.txn_index]
        replace_json(self.path, body)


def write_request(state_dir: Path, tables: Sequence[str]) -> str:
    """Record a request to snapshot ``tables`` (canonical names); return its id.

    The source's capture agent picks it up within :data:`REQUEST_POLL_S` when it runs, else at
    its next start.
    """
    request_id = f"{time.time_ns():020d}-{secrets.token_hex(4)}"
    replace_json(state_dir / REQUESTS_DIR / f"{request_id}.json", {"id": request_id, "tables": list(tables)})
    return request_id


def request_done(state_dir: Path, request_id: str) -> bool:
    """True once an agent took request ``request_id`` and emitted (durably) every chunk of its tables."""
    if (state_dir / REQUESTS_DIR / f"{request_id}.json").exists():
        return False
    return all(t.request != request_id for t in IncrementalState.load(state_dir / STATE_FILE).tables)


class IncrementalQueue:
    """The agent's queue of tables to snapshot: requests taken, signals' orders, progress saved.

    A kind's snapshotter extends it with a chunk in flight (``_chunk``) and the progress of the
    chunk emitted last (``_staged``: table, its last key, whether the table is done), saved by
    :meth:`flushed` once the agent's append returned.
    """

    def __init__(self, state_dir: Path) -> None:
        self._requests = state_dir / REQUESTS_DIR
        self._state_dir = state_dir
        self._state = IncrementalState.load(state_dir / STATE_FILE)
        self._chunk: object | None = None
        self._staged: tuple[TableProgress, list[str] | None, bool] | None = None
        self._next_request_check = 0.0

    @property
    def pending(self) -> bool:
        """True while a chunk is in flight, or (unless paused) a table is queued or a request file waits."""
        if self._chunk or self._staged:
            return True
        if self._state.paused:
            return False
        return bool(self._state.tables or (self._requests.is_dir() and any(self._requests.glob("*.json"))))

    @property
    def last_signal(self) -> Seq | None:
        """The position of the last signal carried out (None: none yet)."""
        return self._state.last_signal

    def carrying_out(self, sequence: Seq | None) -> None:
        """The signal at ``sequence`` is being carried out: saved with the state it changes or by :meth:`signal_done`.

        None (or the position before) when carrying it out failed: it is carried out when sent again.
        """
        self._state.last_signal = sequence

    def signal_done(self) -> None:
        """Save that the signal being carried out was (a crash before leaves it to be carried out again)."""
        self._state.save()

    def request(self, tables: Sequence[SnapshotTable], request: str) -> None:
        """Queue incremental snapshots of ``tables`` (``execute-snapshot``)."""
        self._state.tables.extend(TableProgress(t.table, request, condition=t.condition) for t in tables)
        self._state.save()

    def queued(self) -> list[tuple[str, str]]:
        """``(table, request id)`` of every table queued or in progress, in order."""
        return [(t.table, t.request) for t in self._state.tables]

    def stop(self, tables: Sequence[str] | None) -> str:
        """Drop ``tables`` (None: all) from the queue, the chunk in flight with them; what was dropped."""
        dropped = self._drop([t for t in self._state.tables if tables is None or t.table in tables])
        return ", ".join(t.table for t in dropped) if dropped else "nothing queued"

    def drop_requests(self, requests: Collection[str]) -> bool:
        """Drop the tables queued by ``requests`` (ids), the chunk in flight with them; True when any was."""
        return bool(self._drop([t for t in self._state.tables if t.request in requests]))

    def _drop(self, dropped: list[TableProgress]) -> list[TableProgress]:
        queued = self._state.tables
        if not dropped:
            return dropped
        if queued[0] in dropped:
            self.reset()  # the chunk in flight belongs to the first table
        self._state.tables = [t for t in queued if t not in dropped]
        self._state.save()
        return dropped

    def pause(self, paused: bool) -> None:
        """Stop reading chunks (the one in flight still completes), or go on."""
        self._state.paused = paused
        self._state.save()

    def reset(self) -> None:
        """Forget the chunk in flight and unsaved progress (the chunk is read again later)."""
        self._chunk = None
        self._staged = None

    def _take_requests(self, *, now: float | None = None, force: bool = False) -> None:
        """Move request files into the state, at most every :data:`REQUEST_POLL_S` (``force``: now)."""
        now = time.monotonic() if now is None else now
        if now < self._next_request_check and not force:
            return
        self._next_request_check = now + REQUEST_POLL_S
        if not self._requests.is_dir():
            return
        files = sorted(self._requests.glob("*.json"))
        if not files:
            return
        for path in files:
            body = orjson.loads(path.read_bytes())
            self._state.tables.extend(TableProgress(table, str(body["id"])) for table in body["tables"])
        # Saved before the request files go: a crash in between repeats a request, never loses one.
        self._state.save()
        for path in files:
            path.unlink()

    def _skip_first(self, reason: object) -> None:
        """The first table cannot be snapshotted: drop it from the queue with a warning."""
        progress = self._state.tables.pop(0)
        self._state.save()
        logger.warning("incremental snapshot of %s: %s; skipping the table", progress.table, reason)

    def _table_done(self, progress: TableProgress) -> None:
        """Hook: the last chunk of ``progress`` is durable (before the state is saved)."""

    def flushed(self) -> None:
        """The agent appended everything pending: the chunk emitted last is durable, save its progress."""
        if self._staged is None:
            return
        progress, last_key, done = self._staged
        self._staged = None
        if done:
            self._state.tables.remove(progress)
            self._table_done(progress)
            logger.info("incremental snapshot of %s (request %s) done", progress.table, progress.request)
        else:
            progress.last_key = last_key
        self._state.save()
