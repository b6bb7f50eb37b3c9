"""The PostgreSQL sink: each batch applied to the replica tables and its checkpoints saved, in one transaction.

Per batch, in the log's order: every change of a key folds into the key's last one (an
upsert of its row image, or a delete), and those are written per table by one
``INSERT ... SELECT ... FROM unnest(...) ON CONFLICT (key) DO UPDATE`` / ``DELETE ... USING
unnest(...)``, each column's values one array parameter (:mod:`sinks.postgres.arrays`).
A truncate removes the rows older than it by the source's order
(:mod:`sinks.postgres.truncates`: it sits in one partition, the rows in all). Logical messages
are not rows (skipped). The same transaction creates or evolves the replica tables
(:mod:`sinks.postgres.tables`) and saves the checkpoints (:mod:`sinks.postgres.offsets`), so
a batch is in the replica with its offsets or not at all: **exactly once**, with each key's
changes in the source's order. A source transaction that changed keys of several partitions
may show in several target transactions. BEGIN, a batch's statements, its offsets' update and
COMMIT go to the server in one pipeline, one round trip (a fenced checkpoint fails in the server,
which then runs nothing more of it), and there is no staging table for the commit to empty.

A batch the database refuses for its data (a value that does not fit, a constraint of the
replica) is tried again after re-reading the schema records; if it still fails, each record
is applied under a savepoint and those that fail alone are poison records (dead letter). A
lost connection is retried with backoff.
"""

from __future__ import annotations

import contextlib
import operator
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

import orjson
import psycopg
from psycopg import sql
from psycopg.adapt import Transformer
from psycopg.pq import TransactionStatus

from core.config import ProjectConfig
from core.sink_config import PostgresOptions, TransformConfig
from log.base import Log, TopicPartition
from log.consumer import Checkpoint
from log.topics import sink_group
from native import speedups
from sinks.base import Guarantee, Reject
from sinks.errors import TargetUnavailableError
from sinks.postgres.arrays import column_arrays, unnested
from sinks.postgres.offsets import PostgresOffsets
from sinks.postgres.tables import ReplicaTable, ReplicaTables
from sinks.postgres.truncates import INDEX_COLUMN, LSN_COLUMN, Truncates
from sinks.records import Rejection, SinkRecord

_UPSERT_OPS = frozenset({"c", "u", "r"})
#: SQLSTATE classes of errors about the data (22: data exception, 23: integrity constraint).
_DATA_ERRORS = ("22", "23")
#: A batch whose every op is one of these folds by key in one pass of C (:meth:`PostgresSink._folded`).
_FOLDABLE = re.compile("[curd]*")
_TOPIC = operator.itemgetter(0)
_KEY = operator.itemgetter(4)
_VALUE = operator.itemgetter(5)


class ParsedBatch(list[SinkRecord]):
    """A batch read ahead (:meth:`PostgresSink.prepare`, on the reading thread): each event's op, parsed on demand.

    With the extension, the ops come from ``native.speedups.event_ops`` and the upserts of a table whose
    columns it can write become array literals from ``copy_text`` and ``copy_arrays``, never parsed in Python; without
    it (or for an event it cannot read exactly) every event is parsed here, as its twin.
    """

    #: Each record's op: one character from the extension (``" "`` for none), else the event's ``op``.
    ops: Sequence[Any]
    #: True when the ops came from the extension (its COPY text may then be used).
    native: bool
    _events: list[dict[str, Any] | None]

    def event(self, index: int) -> dict[str, Any]:
        """The event of record ``index``, parsed once; an upsert's row image holds its position."""
        event = self._events[index]
        if event is None:
            event = self._events[index] = _parsed_event(self[index].value)
        return event


class PostgresSink:
    """Keeps replica tables in a PostgreSQL database (see the module docstring)."""

    guarantee = Guarantee(
        "exactly once (offsets committed in the rows' transaction)", "not needed: nothing is applied twice"
    )

    def __init__(
        self, name: str, options: PostgresOptions, transform: TransformConfig, config: ProjectConfig, log: Log
    ) -> None:
        self.name = name
        self.options = options
        self._group = sink_group(name)
        self._offsets = PostgresOffsets(options.schema_)
        self._truncates = Truncates(options.schema_)
        self._tables = ReplicaTables(name, options, transform.fields, config, log)
        self._conn: Any = None
        #: Claims and reads of checkpoints happen while the consumer polls, on the reading thread, maybe while a
        #: batch is being written: on a connection of their own, never inside the batch's transaction.
        self._claims: Any = None
        #: Statement texts by (what, replica, columns, types, key): built once per shape of a replica.
        self._statements: dict[tuple[Any, ...], bytes] = {}

    # -- connection and checkpoints -------------------------------------------------------------

    def open(self) -> None:
        """Connect and create the offsets table; :class:`TargetUnavailableError` when the database does not answer."""
        if self._conn is not None and not self._conn.closed:
            return
        try:
            self._conn = psycopg.connect(self.options.dsn.get_secret_value(), autocommit=True, connect_timeout=10)
            with self._conn.transaction():
                self._conn.execute(
                    sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self.options.schema_))
                )
                self._offsets.create(self._conn)
                self._truncates.create(self._conn)
        except psycopg.OperationalError as exc:
            self._conn = None
            raise TargetUnavailableError(self.name, f"postgres: {_first_line(exc)}") from None

    def _connected(self) -> Any:
        if self._conn is None or self._conn.closed:
            self.open()
        return self._conn

    def _bookkeeping(self, action: Any) -> Any:
        """``action(connection)`` on the claims connection; a lost one is dropped alone (a batch may be in flight)."""
        try:
            if self._claims is None or self._claims.closed:
                self._claims = psycopg.connect(self.options.dsn.get_secret_value(), autocommit=True, connect_timeout=10)
            return action(self._claims)
        except psycopg.OperationalError as exc:
            claims, self._claims = self._claims, None
            if claims is not None:
                with contextlib.suppress(psycopg.Error):
                    claims.close()
            raise TargetUnavailableError(self.name, f"postgres: {_first_line(exc)}") from None

    def claim(self, group: str, owners: Mapping[TopicPartition, str]) -> dict[TopicPartition, int]:
        """Claim partitions in the target's offsets table; return the stored next offsets."""
        claimed: dict[TopicPartition, int] = self._bookkeeping(lambda conn: self._offsets.claim(conn, group, owners))
        return claimed

    def stored(self, group: str, partition: TopicPartition) -> int | None:
        """The next offset the target holds for ``partition``."""
        stored: int | None = self._bookkeeping(lambda conn: self._offsets.stored(conn, group, partition))
        return stored

    def rewind(self, group: str, offsets: Mapping[TopicPartition, int]) -> None:
        """Store ``offsets`` as the next ones and void every claim (``headwater sinks replay``)."""
        self._bookkeeping(lambda conn: self._offsets.rewind(conn, group, offsets))

    def _guarded(self, action: Any) -> Any:
        try:
            return action()
        except psycopg.OperationalError as exc:
            self._drop()
            raise TargetUnavailableError(self.name, f"postgres: {_first_line(exc)}") from None

    # -- delivery -------------------------------------------------------------------------------

    def prepare(self, records: list[SinkRecord]) -> list[SinkRecord]:
        """``records`` with each event's op read (no connection needed; see :class:`ParsedBatch`)."""
        batch = ParsedBatch(records)
        ops = speedups.event_ops([r.value for r in records]) if speedups is not None else None
        if ops is not None and b"?" not in ops:
            batch.ops, batch.native, batch._events = ops.decode("ascii"), True, [None] * len(records)
        else:  # every event parsed here, as the twin (one the extension cannot read raises here, as before)
            batch._events = [_parsed_event(r.value) for r in records]
            batch.ops, batch.native = [event.get("op") for event in batch._events], False  # type: ignore[union-attr]
        return batch

    def deliver(
        self, records: Sequence[SinkRecord], checkpoints: Mapping[TopicPartition, Checkpoint], reject: Reject
    ) -> None:
        """Apply ``records`` and save ``checkpoints`` in one transaction (see the module docstring)."""
        batch = records if isinstance(records, ParsedBatch) else cast(ParsedBatch, self.prepare(list(records)))
        for isolate in (False, False, True):
            try:
                self._guarded(lambda isolate=isolate: self._transaction(batch, checkpoints, reject, isolate=isolate))
                return
            except psycopg.Error as exc:
                self._tables.forget()
                if not _about_data(exc) or isolate:
                    raise TargetUnavailableError(self.name, f"postgres: {_first_line(exc)}") from None
                # The schema may have changed under the batch: read it again before isolating records.
                conn = self._connected()
                for topic in {r.topic for r in batch}:
                    with conn.transaction():
                        self._tables.refresh(conn, topic)

    def _transaction(
        self,
        batch: ParsedBatch,
        checkpoints: Mapping[TopicPartition, Checkpoint],
        reject: Reject,
        *,
        isolate: bool,
    ) -> None:
        conn = self._connected()
        try:
            if not isolate:
                # One round trip: BEGIN, the statements, the offsets' update and COMMIT in one pipeline. A
                # fenced save fails in the server (sinks.postgres.offsets), which then runs nothing more.
                with conn.pipeline():
                    conn.execute(b"BEGIN")
                    self._apply(conn, batch, range(len(batch)))
                    reject([])
                    self._offsets.save(conn, self._group, checkpoints)
                    conn.execute(b"COMMIT")
                return
            rejected: list[Rejection] = []
            with conn.transaction():
                for index, record in enumerate(batch):
                    try:
                        with conn.transaction():  # a savepoint
                            self._apply(conn, batch, [index])
                    except psycopg.Error as exc:
                        self._tables.forget()  # DDL made under the savepoint went with it
                        if not _about_data(exc):
                            raise
                        rejected.append(Rejection(record, f"postgres refused the row: {_first_line(exc)}"))
                reject(rejected)  # durable in the dead-letter topic before the batch counts as done
                self._offsets.save(conn, self._group, checkpoints)
        except BaseException as exc:
            self._tables.forget()
            if conn.info.transaction_status in (TransactionStatus.INTRANS, TransactionStatus.INERROR):
                with contextlib.suppress(psycopg.Error):  # a lost connection is dropped by the caller
                    conn.rollback()  # the pipeline's transaction, failed or cut short before its COMMIT
            fenced = self._offsets.refused(exc, self._group, checkpoints) if isinstance(exc, psycopg.Error) else None
            if fenced is not None:
                raise fenced from None
            raise

    def _apply(self, conn: Any, batch: ParsedBatch, indexes: Iterable[int]) -> None:
        """Fold the records at ``indexes`` by key (last change wins) and write them, a truncate in its place."""
        folded = self._folded(batch, indexes)
        if folded is not None:
            self._write(conn, batch, *folded)
            return
        pending: dict[str, dict[bytes, tuple[str, int]]] = {}
        topic: str | None = None
        latest: dict[bytes, tuple[str, int]] = {}
        ops = batch.ops
        for index in indexes:
            record, op = batch[index], ops[index]
            if op == "t":
                self._flush(conn, batch, pending)
                pending, topic = {}, None
                table = self._tables.get(conn, record.topic, ())
                self._truncates.apply(conn.execute, table.identifier, table.qualified, _position(batch.event(index)))
                continue
            if record.topic != topic:  # one lookup per run of a topic's records, not per record
                topic = record.topic
                latest = pending.setdefault(topic, {})
            if op in _UPSERT_OPS:
                latest[record.key or b"null"] = ("u", index)
            elif op == "d":
                latest[record.key or b"null"] = ("d", index)
        self._flush(conn, batch, pending)

    @staticmethod
    def _folded(batch: ParsedBatch, indexes: Iterable[int]) -> tuple[str, list[int], list[int]] | None:
        """The usual whole batch folded without a Python loop per record: its topic, upserts and deletes.

        For a batch of one topic whose every record has a key and an op the extension read as a
        change (``c``, ``u``, ``r``, ``d``: no truncate, no message): each key's last change, in the
        order the keys first appear, exactly as :meth:`_apply`'s loop folds it. None otherwise.
        """
        if not batch.native or not isinstance(indexes, range) or len(indexes) != len(batch) or not batch:
            return None
        ops = cast(str, batch.ops)
        if _FOLDABLE.fullmatch(ops) is None:
            return None
        topics = set(map(_TOPIC, batch))
        keys = list(map(_KEY, batch))
        if len(topics) != 1 or None in keys or b"" in keys:
            return None
        last = dict(zip(keys, range(len(batch)), strict=True))  # a key's last index, in its first one's place
        if "d" not in ops:
            return topics.pop(), list(last.values()), []
        return (
            topics.pop(),
            [index for index in last.values() if ops[index] != "d"],
            [index for index in last.values() if ops[index] == "d"],
        )

    def _flush(self, conn: Any, batch: ParsedBatch, pending: Mapping[str, Mapping[bytes, tuple[str, int]]]) -> None:
        for topic, latest in pending.items():
            upserts = [index for op, index in latest.values() if op == "u"]
            deletes = [index for op, index in latest.values() if op == "d"]
            self._write(conn, batch, topic, upserts, deletes)

    def _write(self, conn: Any, batch: ParsedBatch, topic: str, upserts: Sequence[int], deletes: Sequence[int]) -> None:
        """Write one topic's folded changes: the deletes, then the upserts."""
        native = self._native_arrays(conn, batch, topic, upserts)
        arrays: list[str] | None = None
        if native is not None:
            table, arrays = native
        else:
            rows = [batch.event(index)["after"] for index in upserts]  # holding its position (_parsed_event)
            columns = set().union(*rows)  # every row's column names
            table = self._tables.get(conn, topic, sorted(columns))
            if rows:
                arrays = self._arrays(conn, rows, list(table.types), table)
        if deletes:
            keys = [orjson.loads(batch[index].key or b"{}") for index in deletes]
            self._delete(conn, table, self._arrays(conn, keys, table.key, table))
        if arrays is not None:
            self._upsert(conn, table, arrays)

    @staticmethod
    def _arrays(conn: Any, rows: Sequence[dict[str, Any]], columns: Sequence[str], table: ReplicaTable) -> list[str]:
        """``rows``' values of ``columns`` as array literals, by their converters and psycopg's dumpers."""
        return column_arrays(rows, columns, table.converters, Transformer.from_context(conn), conn.info.encoding)

    def _native_arrays(
        self, conn: Any, batch: ParsedBatch, topic: str, upserts: Sequence[int]
    ) -> tuple[ReplicaTable, list[str]] | None:
        """The topic's table and its upserts' array literals from the extension, or None for the Python twin."""
        if not upserts or not batch.native or speedups is None or conn.info.encoding != "utf-8":
            return None
        table = self._tables.get(conn, topic, ())
        if table.native is None:
            return None
        # every record an upsert of its own key: the indexes are the batch's, in order
        values = list(map(_VALUE, batch)) if len(upserts) == len(batch) else [batch[index].value for index in upserts]
        text: bytes | None = speedups.copy_text(values, *table.native)
        arrays = None if text is None else speedups.copy_arrays(text, len(table.native[0]))
        return None if arrays is None else (table, arrays)

    def _statement(self, conn: Any, key: tuple[Any, ...], build: Any) -> bytes:
        """The text of ``build()`` for ``key`` (a replica's shape), composed once."""
        text = self._statements.get(key)
        if text is None:
            if len(self._statements) >= 1024:  # shapes of replicas evolved many times add up
                self._statements.clear()
            text = self._statements[key] = build().as_bytes(conn)
        return text

    def _upsert(self, conn: Any, table: ReplicaTable, arrays: Sequence[str]) -> None:
        columns = list(table.types)

        def build() -> sql.Composed:
            listed = sql.SQL(", ").join(sql.Identifier(c) for c in columns)
            values = [c for c in columns if c not in table.key]
            action = (
                sql.SQL("DO UPDATE SET ")
                + sql.SQL(", ").join(sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(c)) for c in values)
                if values
                else sql.SQL("DO NOTHING")
            )
            source, typed = unnested(columns, table.types)
            # An upsert older than the table's last truncate is not applied: the source had removed that row.
            return sql.SQL("INSERT INTO {} ({}) SELECT {} FROM {} WHERE {} ON CONFLICT ({}) {}").format(
                table.identifier,
                listed,
                typed,
                source,
                self._truncates.newer_than_last(table.qualified),
                sql.SQL(", ").join(sql.Identifier(k) for k in table.key),
                action,
            )

        shape = ("upsert", table.qualified, *columns, "|", *table.types.values(), "|", *table.key)
        conn.execute(self._statement(conn, shape, build), arrays)

    def _delete(self, conn: Any, table: ReplicaTable, arrays: Sequence[str]) -> None:
        def build() -> sql.Composed:
            source, typed = unnested(table.key, table.types)
            return sql.SQL("DELETE FROM {} t USING (SELECT {} FROM {}) k ({}) WHERE {}").format(
                table.identifier,
                typed,
                source,
                sql.SQL(", ").join(sql.Identifier(k) for k in table.key),
                sql.SQL(" AND ").join(sql.SQL("t.{0} = k.{0}").format(sql.Identifier(k)) for k in table.key),
            )

        shape = ("delete", table.qualified, *table.key, "|", *(table.types[k] for k in table.key))
        conn.execute(self._statement(conn, shape, build), arrays)

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        claims, self._claims = self._claims, None
        self._statements.clear()
        for each in (conn, claims):
            if each is not None:
                with contextlib.suppress(psycopg.Error):
                    each.close()

    def close(self) -> None:
        """Close the connection."""
        self._drop()


def _parsed_event(value: bytes) -> dict[str, Any]:
    """An event parsed; an upsert's row image (the sink's own copy) takes the position in place."""
    event: dict[str, Any] = orjson.loads(value)
    if event.get("op") in _UPSERT_OPS:
        row = event["after"] = event.get("after") or {}
        row[LSN_COLUMN], row[INDEX_COLUMN] = _position(event)
    return event


def _position(event: Mapping[str, Any]) -> tuple[int, int]:
    """A change's source position: its transaction's commit LSN and its index within it."""
    source = event.get("source") or {}
    return int(source.get("commit_lsn", 0)), int(source.get("txn_index", 0))


def _about_data(exc: psycopg.Error) -> bool:
    state = getattr(exc, "sqlstate", None) or ""
    return state.startswith(_DATA_ERRORS)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
