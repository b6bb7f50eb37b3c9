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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeAlias, cast

from capture.pgoutput_messages import (
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
from log.sequence import Lsn

Change: TypeAlias = Insert | Update | Delete | Truncate | LogicalMessage | Relation


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
    where the table's shape changed.
    """

    def __init__(self) -> None:
        self._open: Transaction | None = None
        # Streamed transactions by top-level xid: (xid of the (sub)transaction, change, lsn).
        self._streamed: dict[int, list[tuple[int | None, Change, int]]] = {}
        self._stream_xid: int | None = None
        self._stream_origins: dict[int, Origin] = {}

    def open_lists(self) -> tuple[list[Change], list[int]] | None:
        """The change and LSN lists :meth:`feed` appends a row change to now, if it only appends.

        That is inside an open transaction that is not streamed; the agent's native loop
        (``take_changes``) appends decoded changes there directly, as feed would.
        """
        if self._stream_xid is None and self._open is not None:
            return self._open.changes, self._open.lsns
        return None

    def feed(self, message: PgoutputMessage, lsn: int = 0) -> Assembled | None:
        """Consume one message sent at WAL position ``lsn``; return a committed transaction or a loose message."""
        if type(message) in _ROW_CHANGES:  # the common case first: one set lookup per change
            if self._stream_xid is None and self._open is not None:
                self._open.changes.append(message)  # type: ignore[arg-type]
                self._open.lsns.append(lsn)
            else:
                self._add(cast(Change, message), lsn)
            return None
        if isinstance(message, Begin):
            self._open = Transaction(message.xid, message.final_lsn, message.final_lsn, message.commit_ts_us)
            return None
        if isinstance(message, Commit):
            done = self._require_open()
            done.commit_lsn, done.end_lsn, done.commit_ts_us = message.commit_lsn, message.end_lsn, message.commit_ts_us
            self._open = None
            return done
        if isinstance(message, StreamStart):
            self._stream_xid = message.xid
            self._streamed.setdefault(message.xid, [])
            return None
        if isinstance(message, StreamStop):
            self._stream_xid = None
            return None
        if isinstance(message, StreamCommit):
            changes = self._streamed.pop(message.xid, [])
            origin = self._stream_origins.pop(message.xid, None)
            return Transaction(
                message.xid,
                message.commit_lsn,
                message.end_lsn,
                message.commit_ts_us,
                [change for _, change, _ in changes],
                [at for _, _, at in changes],
                *_origin(origin),
            )
        if isinstance(message, StreamAbort):
            if message.subxid == message.xid:
                self._streamed.pop(message.xid, None)
                self._stream_origins.pop(message.xid, None)
            elif message.xid in self._streamed:
                # Relations stay: pgoutput counts a Relation sent inside a streamed transaction
                # as sent for the whole transaction and does not send it again.
                kept = [
                    entry
                    for entry in self._streamed[message.xid]
                    if entry[0] != message.subxid or isinstance(entry[1], Relation)
                ]
                self._streamed[message.xid] = kept
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
            self._add(message, lsn)
            return None
        msg = f"unexpected pgoutput message {message!r}"
        raise ValueError(msg)

    def _add(self, change: Change, lsn: int) -> None:
        if self._stream_xid is not None:
            self._streamed[self._stream_xid].append((change.xid, change, lsn))
        elif self._open is not None:
            self._open.changes.append(change)
            self._open.lsns.append(lsn)
        else:
            # pgoutput sends Relations from its change callbacks, so they too are
            # always inside a transaction or a stream block.
            msg = f"pgoutput {type(change).__name__} outside a transaction"
            raise ValueError(msg)

    def _require_open(self) -> Transaction:
        if self._open is None:
            msg = "pgoutput Commit without Begin"
            raise ValueError(msg)
        return self._open


def _origin(message: Origin | None) -> tuple[str | None, int | None]:
    """(name, LSN at the origin) of an Origin message; an unset LSN (0: streamed transactions) is None."""
    if message is None:
        return None, None
    return message.name, message.commit_lsn.value or None
