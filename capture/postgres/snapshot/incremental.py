"""Ad-hoc incremental snapshots while streaming goes on (Netflix DBLog watermarks): the agent's side.

``headwater snapshot NAME --tables T,...`` writes a request file under
``<home>/capture/<source>/incremental-requests/`` (:mod:`capture.postgres.snapshot.incremental_request`); the
source's capture agent (running now, or the next one started) moves it into
``incremental.json`` and reads each table in primary-key order, one chunk of
:data:`CHUNK_ROWS` rows at a time:

1. write a LOW watermark (a :mod:`capture.postgres.streaming.markers` message ``snapshot-window-open <id>``),
2. ``SELECT`` the next chunk (``WHERE key > last key ORDER BY key LIMIT n``) into memory,
3. write a HIGH watermark (``snapshot-window-close <id>``, same id).

Invariants:

* From the moment the chunk is buffered until the HIGH watermark arrives in the
  stream, every key that a streamed change (or quarantined change) of that table
  touches is removed from the buffer, and a truncate empties it. Each of these
  changes is at least as new as the row read, so what remains at HIGH is exactly
  the rows no change between LOW and HIGH touched. (Removing keys already from buffer
  time, not only from LOW, also covers transactions committed before LOW that the
  ``SELECT`` did not see yet.)
* The remaining rows are emitted as ``op: r`` with ``source.snapshot = "incremental"``
  at the HIGH watermark's commit LSN (``txn_index`` 0..n-1; the watermark transaction
  has no other event), so they sort after every change they may include and before
  every change committed after HIGH: they never overwrite a newer change.
* Resume point: a table's last key is saved only after the chunk's rows are appended
  (the agent calls :meth:`IncrementalSnapshotter.flushed` after each append), so after a
  crash the chunk in flight is read again with fresh watermarks (its rows may be
  written twice, at two sequences: harmless, the later one is newer). A watermark
  re-sent by the slot with an id not in flight is ignored.

Limits (honest):

* One chunk in flight at a time, read on the agent's own SQL connection between two
  polls of the stream. A chunk is a bounded index range scan (1024 rows; 50,000 for a
  re-read after a schema change, :data:`SCHEMA_CHUNK_ROWS`), so the stream waits for
  that scan only; the stream is never paused for a whole table.
  Under sustained traffic chunks are opened only when the stream goes quiet for a
  poll interval (as heartbeats are).
* Tables need a primary key (the chunk order and the event key); others are refused.
* A table that is not in the source's publication is skipped with a warning: its
  changes would not be streamed, so the window could not be kept correct.
* The window is conservative: a key changed by a transaction that streams after the
  chunk was buffered but committed before LOW is left out of the chunk even when the
  ``SELECT`` saw that change. The log still holds the key's latest image (that change),
  so it converges; only its ``op: r`` event is missing.
* If a commit record is already decoded but the committing backend has not yet left
  Postgres' proc array when the chunk's ``SELECT`` takes its snapshot (a window of
  microseconds before LOW), the ``SELECT`` can miss that already-streamed change and
  emit the older row at HIGH. Debezium's incremental snapshot shares this gap.

(Over 500 lines by a few: the watermark protocol, its chunk reads and the reconciling
re-read's key set are one algorithm whose correctness argument reads top to bottom.)
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from capture.incremental_queue import IncrementalQueue, IncrementalSnapshotError, TableProgress
from capture.key_set import KeySet
from capture.postgres.catalog import primary_key_lookup, relation_from_catalog
from capture.postgres.decoding.pgoutput_messages import LogicalMessage
from capture.postgres.events.builder import EventBuilder
from capture.postgres.identifiers import TableName
from capture.postgres.registration.row_filters import condition_sql
from capture.postgres.snapshot.copy_text import parse_copy_text
from capture.postgres.snapshot.reread_columns import streamed_columns
from capture.postgres.snapshot.resync import vanished_key_deletes
from capture.postgres.streaming.markers import WINDOW_CLOSE, WINDOW_OPEN, emit_marker, marker_of
from capture.postgres.streaming.transactions import Change, Transaction
from capture.records import OutRecord, SchemaRecord
from capture.resync import DELETE_INDEX_BASE
from capture.tuples import TupleData
from log.base import Log
from log.envelope import SnapshotMarker
from log.sequence import Sequence as Seq
from log.topics import quarantine_topic

logger = logging.getLogger(__name__)

#: Rows per chunk: small enough that reading one barely delays the stream.
CHUNK_ROWS = 1024
#: Rows per chunk of a re-read after a schema change: a whole table at one chunk per stream poll
#: (1,024-row chunks: minutes per million rows); one index range scan of tens of milliseconds.
SCHEMA_CHUNK_ROWS = 50_000
#: The prefix of the request ids of re-reads after schema changes (``schema:<topic>:v<version>``).
SCHEMA_REQUEST = "schema:"
#: Where a reconciling re-read keeps the keys it saw once they no longer fit in memory (scratch).
RECONCILE_KEYS_FILE = "reread_keys.sqlite"


def reread_topics(requests: Iterable[str]) -> frozenset[str]:
    """The topics of the schema changes' re-reads among request ids (``schema:<topic>:v<version>``)."""
    return frozenset(r[len(SCHEMA_REQUEST) :].rsplit(":", 1)[0] for r in requests if r.startswith(SCHEMA_REQUEST))


@dataclass
class _Chunk:
    """A chunk read but not yet emitted: waits for its HIGH watermark in the stream."""

    id: str
    oid: int
    topic: str
    rows: dict[bytes | None, TupleData]  # by event key, in key order
    last_key: list[str] | None  # None: the table has no rows past the previous chunk
    last_of_table: bool
    opened: bool = False  # LOW watermark seen in the stream


class IncrementalSnapshotter(IncrementalQueue):
    """The agent's side of incremental snapshots (see the module docstring).

    The agent calls :meth:`poll` between stream polls, :meth:`on_transaction` for each
    committed transaction (after building its records), :meth:`flushed` after each
    append and :meth:`reset` when the replication connection was lost.
    """

    def __init__(
        self,
        state_dir: Path,
        publication: str,
        *,
        chunk_rows: int = CHUNK_ROWS,
        filters: Mapping[str, str] | None = None,
        log: Log | None = None,
    ) -> None:
        super().__init__(state_dir)
        self._log = log  # read to find the keys a reconciling re-read deletes
        #: A reconciling table in progress: the keys its chunks read and the stream changed since its first chunk.
        self._seen: KeySet | None = None
        self._seen_for: TableProgress | None = None
        self._publication = publication
        self._filters = dict(filters or {})  # the source's row filters, by schema.table
        self._chunk_rows = chunk_rows
        self._chunk: _Chunk | None = None
        self.chunks_emitted = 0
        self.rows_emitted = 0
        self.keys_dropped = 0  # buffered rows left out because a change in the window touched them

    def request_once(self, table: str, request: str, *, reconcile: bool = False, oid: int | None = None) -> bool:
        """Queue a snapshot of ``table`` unless request ``request`` is queued already; True when queued now.

        Schema changes ask with an id of their own (topic and schema version): a transaction
        re-sent after a crash asks again, and the table is read once. ``reconcile``: see
        :class:`TableProgress`.
        """
        if any(t.request == request for t in self._state.tables):
            return False
        self._state.tables.append(TableProgress(table, request, reconcile=reconcile, oid=oid))
        self._state.save()
        return True

    # -- reading chunks ------------------------------------------------------------------

    def poll(self, conn: psycopg.Connection[Any], builder: EventBuilder) -> list[SchemaRecord]:
        """Pick up requests; with no chunk in flight, read the next one between two watermarks.

        Returns schema records of tables the builder had not seen yet (append them first).
        """
        self._take_requests()
        schemas: list[SchemaRecord] = []
        while self._chunk is None and self._staged is None and self._state.tables and not self._state.paused:
            progress = self._state.tables[0]
            try:
                self._chunk = self._read_chunk(conn, builder, progress, schemas)
            except psycopg.OperationalError:
                raise  # the connection is gone: the agent reconnects, the chunk is read again
            except (IncrementalSnapshotError, psycopg.Error) as exc:
                self._skip_first(exc)
        return schemas

    def _read_chunk(
        self, conn: psycopg.Connection[Any], builder: EventBuilder, progress: TableProgress, schemas: list[SchemaRecord]
    ) -> _Chunk:
        table = TableName.parse(progress.table)
        if progress.oid is not None:  # its name now (renamed since the request: still the same table)
            row = conn.execute(
                "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE c.oid = %s",
                (progress.oid,),
            ).fetchone()
            if row is not None:
                table = TableName(str(row[0]), str(row[1]))
        published = conn.execute(
            "SELECT 1 FROM pg_publication_tables WHERE pubname = %s AND schemaname = %s AND tablename = %s",
            (self._publication, table.schema, table.name),
        ).fetchone()
        if published is None:
            msg = f"table {table} is not in publication {self._publication!r}, so its changes are not streamed"
            raise IncrementalSnapshotError(msg, table=str(table))
        relation = relation_from_catalog(conn, table.identifier.as_string(conn))
        key = primary_key_lookup(conn)(relation)
        if not key:
            msg = f"table {table} has no primary key, which incremental snapshots need for chunking"
            raise IncrementalSnapshotError(msg, table=str(table))
        try:
            builder.topic_of(relation.oid)
        except KeyError:
            schema = builder.relation(relation)
            if schema is not None:
                schemas.append(schema)
        # The stream's shape when it lags the catalog (capture.postgres.snapshot.reread_columns).
        streamed = streamed_columns(conn, builder, relation) if progress.request.startswith(SCHEMA_REQUEST) else None
        columns = streamed if streamed and set(key) <= set(streamed) else [c.name for c in relation.columns]
        key_positions = [columns.index(name) for name in key]
        # A re-read after a schema change reads the whole table: larger chunks (one per stream poll).
        schema_change = progress.request.startswith(SCHEMA_REQUEST)
        chunk_rows = max(self._chunk_rows, SCHEMA_CHUNK_ROWS) if schema_change else self._chunk_rows
        key_sql = sql.SQL(", ").join(sql.Identifier(name) for name in key)
        where: sql.Composable = sql.SQL("true")
        if progress.last_key is not None:
            # Untyped literals: Postgres reads the key's text back with the column's own type.
            where = sql.SQL("({}) > ({})").format(
                key_sql, sql.SQL(", ").join(sql.Literal(v) for v in progress.last_key)
            )
        # The source's row filter and the request's condition (checked by capture.postgres.registration.row_filters).
        condition = condition_sql(self._filters.get(f"{table.schema}.{table.name}"), progress.condition)
        if condition is not None:
            where = sql.SQL("{} AND {}").format(where, condition)
        query = sql.SQL("COPY (SELECT {} FROM {} WHERE {} ORDER BY {} LIMIT {}) TO STDOUT").format(
            sql.SQL(", ").join(sql.Identifier(c) for c in columns),
            table.identifier,
            where,
            key_sql,
            sql.Literal(chunk_rows),
        )
        chunk_id = secrets.token_hex(8)
        emit_marker(conn, WINDOW_OPEN, token=chunk_id, transactional=True)
        with conn.cursor().copy(query) as copy:
            data = b"".join(bytes(block) for block in copy)
        emit_marker(conn, WINDOW_CLOSE, token=chunk_id, transactional=True)
        rows = parse_copy_text(data)
        # Sequence 0: only the keys are used now; the rows are encoded again at HIGH.
        records = builder.snapshot_records(relation.oid, rows, Seq(0, 0), marker=SnapshotMarker.INCREMENTAL)
        if progress.reconcile:
            self._reconciled(progress).add(builder.topic_of(relation.oid), [r.key for r in records if r.key])
        # COPY text rows hold only str (None for NULL, which a key column never is).
        last_key = [str(rows[-1][i]) for i in key_positions] if rows else None
        return _Chunk(
            id=chunk_id,
            oid=relation.oid,
            topic=builder.topic_of(relation.oid),
            rows={record.key: row for record, row in zip(records, rows, strict=True)},
            last_key=last_key,
            last_of_table=len(rows) < chunk_rows,
        )

    # -- the stream side -----------------------------------------------------------------

    def _reconciled(self, progress: TableProgress) -> KeySet:
        """The keys seen by the reconciling re-read of ``progress`` (a fresh set at its first chunk)."""
        if self._seen is None or self._seen_for is not progress:
            self._drop_seen()
            self._seen, self._seen_for = KeySet(self._state_dir / RECONCILE_KEYS_FILE), progress
        return self._seen

    def _drop_seen(self) -> None:
        if self._seen is not None:
            self._seen.close()
            (self._state_dir / RECONCILE_KEYS_FILE).unlink(missing_ok=True)
        self._seen, self._seen_for = None, None

    def on_transaction(
        self,
        txn: Transaction,
        records: Sequence[OutRecord],
        builder: EventBuilder,
        changes: Sequence[Change] | None = None,
    ) -> list[OutRecord]:
        """Drop buffered keys the transaction changed; at the HIGH watermark, return the chunk's events.

        A transaction built in pieces calls this once per piece: ``records`` built from ``changes``.
        """
        seen = self._seen
        if seen is not None:
            # A key the stream changed after a reconciling re-read began is current in the log.
            for topic in seen.topics():
                seen.add(topic, [r.key for r in records if r.topic == topic and r.key is not None])
        chunk = self._chunk
        if chunk is None:
            return []
        quarantine = quarantine_topic(chunk.topic)
        rows = chunk.rows
        for record in records:
            if record.topic in (chunk.topic, quarantine):
                if record.key is None:
                    self.keys_dropped += len(rows)
                    rows.clear()  # a truncate (or a change without key): nothing buffered is current
                elif rows.pop(record.key, None) is not None:
                    self.keys_dropped += 1
        for change in txn.changes if changes is None else changes:
            marker = marker_of(change) if isinstance(change, LogicalMessage) else None
            if marker is None or marker[1] != chunk.id:
                continue
            if marker[0] == WINDOW_OPEN:
                chunk.opened = True
            elif marker[0] == WINDOW_CLOSE:
                return self._close(chunk, txn, builder)
        return []

    def _close(self, chunk: _Chunk, txn: Transaction, builder: EventBuilder) -> list[OutRecord]:
        out = builder.snapshot_records(
            chunk.oid,
            list(chunk.rows.values()),
            Seq(txn.commit_lsn.value, 0),
            marker=SnapshotMarker.INCREMENTAL,
            ts_us=txn.commit_ts_us,
        )
        progress = self._state.tables[0]
        self._staged = (progress, chunk.last_key, chunk.last_of_table)
        self._chunk = None
        self.chunks_emitted += 1
        self.rows_emitted += len(out)
        if chunk.last_of_table and progress.reconcile and self._seen is not None and self._log is not None:
            # Keys the log holds live that neither a chunk read nor the stream changed since the first
            # chunk: rows that left the table with no change in the stream. Deleted after the rows.
            out.extend(
                vanished_key_deletes(
                    self._log,
                    chunk.topic,
                    self._seen,
                    commit_lsn=txn.commit_lsn.value,
                    first_index=DELETE_INDEX_BASE,
                    ts_us=txn.commit_ts_us,
                    marker=SnapshotMarker.INCREMENTAL,
                )
            )
        return out

    def _table_done(self, progress: TableProgress) -> None:
        if progress is self._seen_for:
            self._drop_seen()
