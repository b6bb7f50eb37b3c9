"""Binlog events -> whole transactions, each with the shape its tables had when it was written.

A transaction is an event group: MariaDB's GTID event (or a ``BEGIN`` query) opens it, TABLE_MAP
and row events fill it, an XID event (or a ``COMMIT`` query, for non-transactional tables) closes
it. A GTID flagged standalone holds one statement (DDL, ``TRUNCATE``) and no BEGIN/COMMIT. Only
committed groups reach the binlog, so every group read is a committed transaction; it is handed
on whole, never in parts, and its commit position (the end of its last event) orders it.

Row images are decoded with the TABLE_MAP that precedes them in the same group (the table's
shape at that point, whatever DDL came after), through a decoder cached per distinct shape.

Memory (:mod:`capture.spill`): with a :class:`~capture.spill.SpillDirectory`, the decoded changes
the open transaction holds are counted against its budget (an estimate from each row event's
binlog bytes, :func:`decoded_size`). Once the budget is reached, every later row event of the
transaction goes to its spill file undecoded, as the raw event (tagged with the index of its
table's decoder in :class:`SpilledRows`), so its held changes all come before its spilled
ones. :meth:`Transaction.items` hands a committed transaction's changes and statements out in
binlog order, decoding the spilled row events again a spill batch at a time: what the
transaction holds in memory is bounded by the threshold, not by its size. The spill file is
removed once the transaction's events are built (:meth:`Transaction.release`), when the
session ends (:meth:`TransactionAssembler.discard`), and at every session start.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from capture.mysql.binlog.client import RawEvent
from capture.mysql.binlog.event_types import EventType
from capture.mysql.binlog.events import (
    FormatDescription,
    MariaGtid,
    Query,
    Rows,
    TableMap,
    Xid,
    parse_event,
    parse_header,
)
from capture.mysql.binlog.position import BinlogPosition, Gtid
from capture.mysql.binlog.rows import RowDecoder
from capture.mysql.binlog.table_map import TableShape
from capture.spill import SpillDirectory, SpillFile

_TRUNCATE = re.compile(r"^\s*TRUNCATE\s+(?:TABLE\s+)?((?:`[^`]+`|\w+)(?:\s*\.\s*(?:`[^`]+`|\w+))?)\s*;?\s*$", re.I)


#: Statements that live inside a transaction and change no table: nothing to record.
_IN_TRANSACTION = ("SAVEPOINT", "ROLLBACK TO", "RELEASE SAVEPOINT")


def _unquote(name: str) -> str:
    return name.strip().strip("`")


def truncated_table(query: Query) -> tuple[str, str] | None:
    """``(database, table)`` of a ``TRUNCATE`` statement, or None for any other statement."""
    match = _TRUNCATE.match(query.sql)
    if match is None:
        return None
    parts = [_unquote(p) for p in re.split(r"\s*\.\s*(?=`|\w)", match.group(1), maxsplit=1)]
    return (parts[0], parts[1]) if len(parts) == 2 else (query.schema, parts[0])


#: Estimated memory of the changes decoded from a row event of ``n`` binlog bytes holding ``rows``
#: rows: ``4n + 400 rows``. It errs high: an update of a 4-column row (bigint, int, 40-byte text,
#: datetime; ~130 binlog bytes) holds 572 bytes decoded (its RowChange, image lists and values,
#: measured with tracemalloc), estimated ~920.
_DECODED_PER_BYTE = 4
_DECODED_PER_ROW = 400


def decoded_size(event_bytes: int, rows: int) -> int:
    """Estimated memory of ``rows`` changes decoded from a row event of ``event_bytes`` binlog bytes."""
    return _DECODED_PER_BYTE * event_bytes + _DECODED_PER_ROW * rows


@dataclass(frozen=True, slots=True)
class RowChange:
    """One row change: its table's shape then, the images as Debezium values, where it is in the binlog."""

    shape: TableShape
    op: str
    before: list[Any] | None
    after: list[Any] | None
    #: Start offset of its row event and its index in that event (Debezium's ``pos`` and ``row``).
    event_start: int
    row: int
    #: The row event's server id and time (seconds): Debezium's ``server_id`` and ``ts_ms``.
    server_id: int
    timestamp: int


@dataclass(frozen=True, slots=True)
class Statement:
    """A statement of the group (DDL or TRUNCATE), with where it starts, its server id and time."""

    query: Query
    event_start: int
    truncated: tuple[str, str] | None
    server_id: int
    timestamp: int


class SpilledRows:
    """A transaction's row events past the memory budget: raw events in a spill file, decoded again on reading.

    Each spilled event is tagged with the index of its decoder in ``decoders`` (the TABLE_MAP
    in force when it was read: a few per transaction, held in memory).
    """

    def __init__(self, file: SpillFile, *, mariadb: bool) -> None:
        self.file = file
        self.mariadb = mariadb
        self.decoders: list[RowDecoder] = []
        self._index: dict[int, int] = {}

    def add(self, raw: RawEvent, decoder: RowDecoder) -> None:
        """Spill one row event of ``decoder``'s table."""
        tag = self._index.get(id(decoder))
        if tag is None:
            tag = self._index[id(decoder)] = len(self.decoders)
            self.decoders.append(decoder)
        self.file.add(raw.header.end_position - raw.header.size, tag, raw.data)

    def pieces(self) -> Iterator[list[RowChange]]:
        """The spilled changes decoded again, in order, one spill batch (about 1 MiB of events) at a time."""
        decoders, mariadb = self.decoders, self.mariadb
        for batch in self.file.read():
            piece: list[RowChange] = []
            for spilled in batch:
                decoder = decoders[spilled.tag]
                header = parse_header(spilled.payload)
                event = parse_event(spilled.payload, header, mariadb=mariadb)
                assert isinstance(event, Rows)
                start, server, when = spilled.position, header.server_id, header.timestamp
                piece.extend(
                    RowChange(decoder.shape, event.op, before, after, start, row, server, when)
                    for row, (before, after) in enumerate(decoder.decode(event))
                )
            yield piece


@dataclass
class Transaction:
    """One committed event group: its held changes, then (past the memory budget) its spilled ones."""

    gtid: Gtid | None
    server_id: int
    timestamp: int
    file: str
    changes: list[RowChange] = field(default_factory=list)
    statements: list[Statement] = field(default_factory=list)
    #: The position after its last event: where a reader that has it resumes; orders transactions.
    commit: BinlogPosition | None = None
    #: The changes after ``changes``, on disk (None: every change is in ``changes``).
    spilled: SpilledRows | None = None

    def shapes(self) -> list[TableShape]:
        """Each distinct table shape (by identity) its changes have, held and spilled."""
        found = {id(c.shape): c.shape for c in self.changes}
        if self.spilled is not None:
            found.update((id(d.shape), d.shape) for d in self.spilled.decoders)
        return list(found.values())

    def items(self) -> Iterator[RowChange | Statement]:
        """Its row changes and statements in binlog order (spilled changes decoded a piece at a time)."""
        statements = self.statements
        if not statements and self.spilled is None:
            yield from self.changes
            return
        at = 0
        for piece in self.change_lists():
            for change in piece:
                while at < len(statements) and statements[at].event_start < change.event_start:
                    yield statements[at]
                    at += 1
                yield change
        yield from statements[at:]

    def change_lists(self) -> Iterator[list[RowChange]]:
        """Its row changes in binlog order: the held ones, then the spilled ones a spill batch at a time."""
        yield self.changes
        if self.spilled is not None:
            yield from self.spilled.pieces()

    def release(self) -> None:
        """Remove the spill file (the transaction is in the log, or will be read again). Idempotent."""
        if self.spilled is not None:
            self.spilled.file.remove()


class TransactionAssembler:
    """Feeds raw events in binlog order; :meth:`feed` returns each transaction when it is complete.

    ``wanted(database, table)`` says which tables' rows are kept (others are skipped before
    their images are decoded). ``decoder(shape)`` builds the row decoder of a shape. With
    ``spill``, the open transaction's changes past its budget go to a spill file (see the
    module docstring); without, a transaction is held whole.
    """

    def __init__(
        self,
        wanted: Callable[[str, str], bool],
        decoder: Callable[[TableShape], RowDecoder],
        *,
        spill: SpillDirectory | None = None,
    ) -> None:
        self._wanted = wanted
        self._decoder = decoder
        self._spill = spill
        #: Estimated memory of the open transaction's held changes (counted in the spill budget).
        self._held = 0
        self._decoders: dict[int, RowDecoder | None] = {}
        self._by_shape: dict[TableShape, RowDecoder] = {}
        self._open: Transaction | None = None
        self._standalone = False
        self.mariadb = True
        self.file = ""
        #: Where the stream stands: after the last complete transaction (or a non-transaction event).
        self.position: BinlogPosition | None = None

    @property
    def idle(self) -> bool:
        """No transaction is half read."""
        return self._open is None

    def _shape_decoder(self, shape: TableShape) -> RowDecoder | None:
        if not self._wanted(shape.schema, shape.table):
            return None
        # Table ids change with every reopen of the table; equal shapes share a decoder.
        key = TableShape(0, shape.schema, shape.table, shape.columns, shape.primary_key)
        decoder = self._by_shape.get(key)
        if decoder is None:
            decoder = self._by_shape[key] = self._decoder(shape)
        return decoder

    def _begin(self, raw: RawEvent, gtid: Gtid | None) -> Transaction:
        self.discard()  # a group left open (a dump that restarted mid-group) is read again whole
        self._open = Transaction(gtid, raw.header.server_id, raw.header.timestamp, self.file)
        return self._open

    def _release_budget(self) -> None:
        if self._spill is not None:
            self._spill.budget.release(self._held)
        self._held = 0

    def _commit(self, raw: RawEvent) -> Transaction | None:
        done, self._open, self._standalone = self._open, None, False
        self._release_budget()
        self.position = raw.next_position
        if done is not None:
            done.commit = raw.next_position
        return done

    def discard(self) -> None:
        """Drop the open transaction, if any, and remove its spill file (the session ended). Idempotent."""
        if self._open is not None:
            self._open.release()
            self._open = None
        self._release_budget()

    def feed(self, raw: RawEvent) -> Transaction | None:
        """Take the next event; a transaction when this event completed one."""
        header = raw.header
        kind = header.type
        if kind == EventType.ROTATE:
            self.file = raw.next_position.file
            if self._open is None:
                self.position = raw.next_position
            return None
        event = parse_event(raw.data, header, mariadb=self.mariadb)
        if isinstance(event, Rows):
            decoder = self._decoders.get(event.table_id)
            if decoder is not None and self._open is not None:
                self._rows(raw, event, decoder, self._open)
            return None
        if isinstance(event, TableMap):
            self._decoders[event.shape.table_id] = self._shape_decoder(event.shape)
            return None
        if isinstance(event, Xid):
            return self._commit(raw)
        if isinstance(event, MariaGtid):
            self._begin(raw, event.gtid)
            self._standalone = event.standalone
            return None
        if isinstance(event, Query):
            return self._query(raw, event)
        if isinstance(event, FormatDescription):
            self.mariadb = "mariadb" in event.server_version.lower()
            return None
        if self._open is None and header.end_position:
            self.position = raw.next_position
        return None

    def _rows(self, raw: RawEvent, event: Rows, decoder: RowDecoder, transaction: Transaction) -> None:
        """One row event of a captured table: its changes held, or spilled past the budget."""
        header = raw.header
        spill = self._spill
        if transaction.spilled is not None:
            transaction.spilled.add(raw, decoder)  # a transaction that started spilling keeps spilling
            return
        if spill is not None and spill.budget.should_spill(self._held):
            transaction.spilled = SpilledRows(spill.new_file(f"binlog-{self.file}"), mariadb=self.mariadb)
            transaction.spilled.add(raw, decoder)
            return
        start = header.end_position - header.size
        server, when = header.server_id, header.timestamp
        changes = transaction.changes
        before_count = len(changes)
        changes.extend(
            RowChange(decoder.shape, event.op, before, after, start, row, server, when)
            for row, (before, after) in enumerate(decoder.decode(event))
        )
        if spill is not None:
            size = decoded_size(header.size, len(changes) - before_count)
            self._held += size
            spill.budget.hold(size)

    def _query(self, raw: RawEvent, query: Query) -> Transaction | None:
        statement = query.sql.strip().upper()
        if statement == "BEGIN":
            if self._open is None:
                self._begin(raw, None)
            return None
        if statement == "COMMIT":
            return self._commit(raw)
        if statement.startswith(_IN_TRANSACTION):
            return None
        was_open = self._open is not None
        transaction = self._open or self._begin(raw, None)
        start = raw.header.end_position - raw.header.size
        transaction.statements.append(
            Statement(query, start, truncated_table(query), raw.header.server_id, raw.header.timestamp)
        )
        if self._standalone or not was_open:
            # DDL commits implicitly: its group is this statement alone.
            return self._commit(raw)
        return None
