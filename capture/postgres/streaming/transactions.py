"""Assemble pgoutput messages into committed transactions, in commit order.

pgoutput sends a normal transaction as Begin, changes, Commit. With protocol 2 and
``streaming 'on'``, a large transaction arrives early in Stream Start..Stop blocks,
interleaved with other transactions, and ends with Stream Commit (keep it) or
Stream Abort (drop it, or drop one subtransaction). Only committed transactions leave
this module, so an aborted transaction never reaches the log.

Non-transactional logical messages (heartbeats among them) are delivered on their
own, outside any transaction.

Each change keeps the WAL position it was sent at (the XLogData ``wal_start``), which
becomes the event's ``source.lsn``.

Memory (:mod:`capture.spill`): with a :class:`~capture.spill.SpillDirectory`, the changes the
open transactions hold are counted against its budget (an estimate of each decoded change's
memory from its pgoutput message). Once the budget is exceeded, every later change of a
transaction that grows goes to that transaction's spill file as its pgoutput bytes (tagged
with the subtransaction's xid; Relations with 0, so a subtransaction's abort never drops
them); a transaction that started spilling keeps spilling, so its held changes all come
before its spilled ones. :meth:`Transaction.pieces` hands a committed transaction's changes
out in order, a bounded piece at a time, decoding the spilled ones again.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TypeAlias, cast

from capture.postgres.decoding.pgoutput import MessageType, PgoutputDecoder
from capture.postgres.decoding.pgoutput_messages import (
    Begin,
    Commit,
    Delete,
    Insert,
    LogicalMessage,
    Origin,
    PgoutputMessage,
    Relation,
    StreamAbort,
    StreamCommit,
    StreamStart,
    StreamStop,
    Truncate,
    Type,
    Update,
)
from capture.spill import SpillDirectory, SpillFile
from log.sequence import Lsn

Change: TypeAlias = Insert | Update | Delete | Truncate | LogicalMessage | Relation

#: Estimated memory of a change decoded from a pgoutput message of ``n`` bytes: ``2n + 240``
#: (measured with tracemalloc: a 104-byte update of 4 columns holds 402 bytes decoded, a
#: 20-byte one 164, a 2,019-byte one 2,213), plus its LSN's slot in the list.
_DECODED_PER_BYTE = 2
_DECODED_OVERHEAD = 240
#: The estimate for a change fed without its message bytes (tests, recorded streams).
_UNKNOWN_SIZE = 400
#: A streamed change is held with its (sub)transaction's xid in an entry of its own, a 3-tuple:
#: ~113 bytes more than a change of an open transaction (tracemalloc, a 112-byte streamed update:
#: 581 bytes held, 468 estimated without it; issue 31).
_STREAMED_ENTRY = 112
_SPILLED_ROW_TYPES = frozenset({MessageType.INSERT.value, MessageType.UPDATE.value, MessageType.DELETE.value})


def decoded_size(payload_bytes: int, count: int = 1) -> int:
    """Estimated memory of ``count`` changes decoded from ``payload_bytes`` of pgoutput messages."""
    return _DECODED_PER_BYTE * payload_bytes + _DECODED_OVERHEAD * count


class SpilledChanges:
    """A transaction's changes past the memory budget: pgoutput messages in a spill file.

    ``streamed`` says whether they were sent inside Stream Start..Stop blocks (their messages
    then carry an xid, :class:`capture.postgres.decoding.pgoutput.PgoutputDecoder` must know); ``aborted`` holds
    the subtransactions aborted since, whose changes :meth:`pieces` leaves out.
    """

    def __init__(self, file: SpillFile, *, streamed: bool) -> None:
        self.file = file
        self.streamed = streamed
        self.aborted: set[int] = set()

    def pieces(self, size: int) -> Iterator[tuple[list[Change], list[int]]]:
        """The spilled changes decoded again, in order, at most ``size`` at a time."""
        decoder = PgoutputDecoder(protocol_version=2)
        decoder.in_stream = self.streamed
        decode = decoder.decode
        for batch in self.file.read(frozenset(self.aborted)):
            for at in range(0, len(batch), size):
                part = batch[at : at + size]
                yield [cast(Change, decode(c.payload)) for c in part], [c.position for c in part]


@dataclass
class Transaction:
    """A committed transaction: its changes in order, and the Relations seen inside it.

    ``lsns[i]`` is the WAL position of ``changes[i]`` (0 where it is not known). ``origin`` is
    the replication origin a replayed transaction came through (pgoutput's Origin message),
    ``origin_lsn`` its commit LSN there (None when pgoutput does not send it: streamed ones).
    """

    xid: int
    commit_lsn: Lsn
    end_lsn: Lsn
    commit_ts_us: int
    changes: list[Change] = field(default_factory=list)
    lsns: list[int] = field(default_factory=list)
    origin: str | None = None
    origin_lsn: int | None = None
    #: The changes after ``changes``, on disk (None: every change is in ``changes``).
    spilled: SpilledChanges | None = None

    def pieces(self, size: int) -> Iterator[tuple[list[Change], list[int]]]:
        """Every change with its LSN, in order, at most ``size`` at a time: the held ones, then the spilled ones."""
        changes = self.changes
        lsns = self.lsns if len(self.lsns) == len(changes) else [0] * len(changes)  # 0: position not known
        if len(changes) <= size and self.spilled is None:
            yield changes, lsns  # the common case: the whole transaction at once, no copy
            return
        for at in range(0, len(changes), size):
            yield changes[at : at + size], lsns[at : at + size]
        if self.spilled is not None:
            yield from self.spilled.pieces(size)

    def release(self) -> None:
        """Remove the spill file (the transaction is in the log, or will be re-sent). Idempotent."""
        if self.spilled is not None:
            self.spilled.file.remove()

    @property
    def transaction_id(self) -> str:
        """Debezium's transaction id of a PostgreSQL transaction: ``<xid>:<commit LSN>``."""
        return f"{self.xid}:{self.commit_lsn.value}"

    @property
    def commit_ordinal(self) -> int:
        """The commit's place in the log's order (:meth:`log.sequence.Lsn.ordinal`)."""
        return self.commit_lsn.ordinal()


@dataclass(frozen=True)
class Holding:
    """What an assembler holds now: said when a session ends with transactions open (a reconnect drops them)."""

    #: Open transactions: the one between Begin and Commit, and the streamed ones not yet ended.
    transactions: int
    #: Their changes in memory, and those changes' estimated memory (the spill budget's count).
    changes: int
    estimated_bytes: int
    #: Their changes in spill files, and the bytes of those files.
    spilled_changes: int
    spilled_bytes: int

    def __str__(self) -> str:
        return (
            f"{self.transactions} open transaction(s): {self.changes} changes in memory "
            f"(~{self.estimated_bytes / 2**20:.1f} MiB estimated), {self.spilled_changes} spilled "
            f"({self.spilled_bytes / 2**20:.1f} MiB on disk)"
        )


@dataclass(frozen=True)
class LooseMessage:
    """A non-transactional logical message; ``lsn`` is where it was written."""

    message: LogicalMessage


Assembled: TypeAlias = Transaction | LooseMessage

_ROW_CHANGES = frozenset({Insert, Update, Delete})


class TransactionAssembler:
    """Feed messages in stream order; get committed transactions back in commit order.

    Relation messages are kept in order with the changes (a Relation precedes the
    first change that uses it), so the consumer updates its relation cache exactly
    where the table's shape changed. With ``spill`` the held changes are bounded (see the
    module docstring): give :meth:`feed` each message's bytes, and a committed transaction
    must be released (:meth:`Transaction.release`) once its events are built.
    """

    def __init__(self, spill: SpillDirectory | None = None) -> None:
        self._open: Transaction | None = None
        self._open_held = 0
        # Streamed transactions by top-level xid: (xid of the (sub)transaction, change, lsn).
        self._streamed: dict[int, list[tuple[int | None, Change, int]]] = {}
        self._streamed_held: dict[int, int] = {}
        self._streamed_spills: dict[int, SpilledChanges] = {}
        self._stream_xid: int | None = None
        self._stream_origins: dict[int, Origin] = {}
        self._spill = spill
        #: True while the transaction being fed (open or streamed) sends its changes to its spill file.
        self.spilling = False

    def open_lists(self) -> tuple[list[Change], list[int]] | None:
        """The change and LSN lists :meth:`feed` appends a row change to now, if it only appends.

        That is inside an open transaction that is not streamed and not spilling; the agent's
        native loop (``take_changes``) appends decoded changes there directly, as feed would,
        then reports them with :meth:`took`.
        """
        if self._stream_xid is None and self._open is not None and not self.spilling:
            return self._open.changes, self._open.lsns
        return None

    def took(self, count: int, payload_bytes: int) -> None:
        """``count`` changes of ``payload_bytes`` pgoutput bytes were appended to :meth:`open_lists`."""
        if self._spill is not None and self._open is not None:
            self._hold_open(self._open, decoded_size(payload_bytes, count))

    def spill_raw(self, payload: bytes, lsn: int) -> bool:
        """Take a row change of a spilling transaction as its bytes, undecoded; False when it is not one.

        Call it only while :attr:`spilling`; a message it refuses goes to :meth:`feed`.
        """
        if not payload or payload[0] not in _SPILLED_ROW_TYPES:
            return False
        if self._stream_xid is None:
            assert self._open is not None and self._open.spilled is not None
            self._open.spilled.file.add(lsn, 0, payload)
            return True
        spilled = self._streamed_spills[self._stream_xid]
        spilled.file.add(lsn, int.from_bytes(payload[1:5], "big"), payload)  # the (sub)transaction's xid
        return True

    def feed(self, message: PgoutputMessage, lsn: int = 0, payload: bytes | None = None) -> Assembled | None:
        """Consume one message sent at WAL position ``lsn`` (its bytes: ``payload``).

        Returns a committed transaction, or a loose (non-transactional) message, or None.
        """
        if type(message) in _ROW_CHANGES:  # the common case first: one set lookup per change
            opened = self._open
            if self._stream_xid is None and opened is not None and not self.spilling:
                opened.changes.append(message)  # type: ignore[arg-type]
                opened.lsns.append(lsn)
                if self._spill is not None:
                    self._hold_open(opened, _size(payload))
            else:
                self._add(cast(Change, message), lsn, payload)
            return None
        if isinstance(message, Begin):
            self._open = Transaction(message.xid, message.final_lsn, message.final_lsn, message.commit_ts_us)
            self._open_held = 0
            self.spilling = False
            return None
        if isinstance(message, Commit):
            done = self._require_open()
            done.commit_lsn, done.end_lsn, done.commit_ts_us = message.commit_lsn, message.end_lsn, message.commit_ts_us
            self._open = None
            self._release(self._open_held)
            self._open_held = 0
            self.spilling = False
            return done
        if isinstance(message, StreamStart):
            self._stream_xid = message.xid
            self._streamed.setdefault(message.xid, [])
            self.spilling = message.xid in self._streamed_spills
            return None
        if isinstance(message, StreamStop):
            self._stream_xid = None
            self.spilling = False
            return None
        if isinstance(message, StreamCommit):
            changes = self._streamed.pop(message.xid, [])
            origin = self._stream_origins.pop(message.xid, None)
            self._release(self._streamed_held.pop(message.xid, 0))
            return Transaction(
                message.xid,
                message.commit_lsn,
                message.end_lsn,
                message.commit_ts_us,
                [change for _, change, _ in changes],
                [at for _, _, at in changes],
                *_origin(origin),
                spilled=self._streamed_spills.pop(message.xid, None),
            )
        if isinstance(message, StreamAbort):
            if message.subxid == message.xid:
                self._streamed.pop(message.xid, None)
                self._stream_origins.pop(message.xid, None)
                self._release(self._streamed_held.pop(message.xid, 0))
                spilled = self._streamed_spills.pop(message.xid, None)
                if spilled is not None:
                    spilled.file.remove()
            elif message.xid in self._streamed:
                # Relations stay: pgoutput counts a Relation sent inside a streamed transaction
                # as sent for the whole transaction and does not send it again.
                kept = [
                    entry
                    for entry in self._streamed[message.xid]
                    if entry[0] != message.subxid or isinstance(entry[1], Relation)
                ]
                self._streamed[message.xid] = kept
                if message.xid in self._streamed_spills:
                    self._streamed_spills[message.xid].aborted.add(message.subxid)
            return None
        if isinstance(message, Origin):
            if self._stream_xid is not None:
                self._stream_origins[self._stream_xid] = message
            elif self._open is not None:
                self._open.origin, self._open.origin_lsn = _origin(message)
            return None
        if isinstance(message, Type):
            return None
        if isinstance(message, LogicalMessage) and not message.transactional:
            return LooseMessage(message)
        if isinstance(message, Truncate | Relation | LogicalMessage):
            self._add(message, lsn, payload)
            return None
        msg = f"unexpected pgoutput message {message!r}"
        raise ValueError(msg)

    def holding(self) -> Holding:
        """The open transactions' changes, in memory and spilled (see :class:`Holding`)."""
        spills = list(self._streamed_spills.values())
        changes = sum(len(entries) for entries in self._streamed.values())
        if self._open is not None:
            changes += len(self._open.changes)
            if self._open.spilled is not None:
                spills.append(self._open.spilled)
        return Holding(
            transactions=len(self._streamed) + (self._open is not None),
            changes=changes,
            estimated_bytes=self._open_held + sum(self._streamed_held.values()),
            spilled_changes=sum(spilled.file.count for spilled in spills),
            spilled_bytes=sum(spilled.file.size for spilled in spills),
        )

    def discard(self) -> None:
        """Drop every open transaction and its spill file (the session ended; the slot re-sends them)."""
        if self._open is not None:
            self._open.release()
            self._open = None
        self._open_held = 0
        for spilled in self._streamed_spills.values():
            spilled.file.remove()
        self._streamed_spills.clear()
        self._streamed.clear()
        self._streamed_held.clear()
        if self._spill is not None:
            self._spill.budget.held = 0
        self.spilling = False

    def _add(self, change: Change, lsn: int, payload: bytes | None) -> None:
        xid = self._stream_xid
        if xid is not None:
            spilled = self._streamed_spills.get(xid)
            if spilled is not None:
                # Tag 0 keeps a Relation through a subtransaction's abort (see StreamAbort).
                tag = 0 if isinstance(change, Relation) else (change.xid or xid)
                spilled.file.add(lsn, tag, _required(payload))
                return
            self._streamed[xid].append((change.xid, change, lsn))
            if self._spill is not None:
                size = _size(payload) + _STREAMED_ENTRY
                own = self._streamed_held[xid] = self._streamed_held.get(xid, 0) + size
                self._spill.budget.hold(size)
                if self._spill.budget.should_spill(own):
                    self._streamed_spills[xid] = SpilledChanges(self._spill.new_file(f"{xid}"), streamed=True)
                    self.spilling = True
        elif self._open is not None:
            if self._open.spilled is not None:
                self._open.spilled.file.add(lsn, 0, _required(payload))
                return
            self._open.changes.append(change)
            self._open.lsns.append(lsn)
            if self._spill is not None:
                self._hold_open(self._open, _size(payload))
        else:
            # pgoutput sends Relations from its change callbacks, so they too are
            # always inside a transaction or a stream block.
            msg = f"pgoutput {type(change).__name__} outside a transaction"
            raise ValueError(msg)

    def _hold_open(self, opened: Transaction, size: int) -> None:
        assert self._spill is not None
        self._open_held += size
        budget = self._spill.budget
        budget.hold(size)
        if opened.spilled is None and budget.should_spill(self._open_held):
            opened.spilled = SpilledChanges(self._spill.new_file(f"{opened.xid}"), streamed=False)
            self.spilling = True

    def _release(self, size: int) -> None:
        if self._spill is not None:
            self._spill.budget.release(size)

    def _require_open(self) -> Transaction:
        if self._open is None:
            msg = "pgoutput Commit without Begin"
            raise ValueError(msg)
        return self._open


def _size(payload: bytes | None) -> int:
    return _UNKNOWN_SIZE if payload is None else decoded_size(len(payload))


def _required(payload: bytes | None) -> bytes:
    if payload is None:
        msg = "a spilling transaction needs each message's bytes: feed(message, lsn, payload)"
        raise ValueError(msg)
    return payload


def _origin(message: Origin | None) -> tuple[str | None, int | None]:
    """(name, LSN at the origin) of an Origin message; an unset LSN (0: streamed transactions) is None."""
    if message is None:
        return None, None
    return message.name, message.commit_lsn.value or None
