"""The pgoutput messages as frozen value objects (a tuple's values are :mod:`capture.tuples`).

What :class:`capture.postgres.decoding.pgoutput.PgoutputDecoder` makes of each message of a replication
stream (PostgreSQL 15 docs, "55.9. Logical Replication Message Formats"); LSNs are
:class:`log.sequence.Lsn`, timestamps Unix-epoch microseconds.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TypeAlias

from capture.tuples import TupleData
from log.sequence import Lsn


class ReplicaIdentity(enum.StrEnum):
    """``pg_class.relreplident``: which old-row columns Update/Delete carry."""

    DEFAULT = "d"
    NOTHING = "n"
    FULL = "f"
    INDEX = "i"


@dataclass(frozen=True, slots=True)
class Begin:
    """Start of a (non-streamed) transaction; its changes follow, then :class:`Commit`."""

    final_lsn: Lsn
    commit_ts_us: int
    xid: int


@dataclass(frozen=True, slots=True)
class Commit:
    """End of a transaction. ``end_lsn`` is the position to acknowledge once everything before it is stored."""

    flags: int
    commit_lsn: Lsn
    end_lsn: Lsn
    commit_ts_us: int


@dataclass(frozen=True, slots=True)
class Origin:
    """The transaction was replayed from another node (replication origin)."""

    commit_lsn: Lsn
    name: str


@dataclass(frozen=True, slots=True)
class RelationColumn:
    """One column of a :class:`Relation`; ``key`` marks replica-identity columns."""

    key: bool
    name: str
    type_oid: int
    atttypmod: int


@dataclass(frozen=True, slots=True)
class Relation:
    """A table's shape, sent before the first change to it and again after any change to its definition.

    Invariant: a change message refers to the most recent Relation with its oid.
    """

    oid: int
    namespace: str
    name: str
    replica_identity: ReplicaIdentity
    columns: tuple[RelationColumn, ...]
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class Type:
    """A non-built-in data type used by a following Relation (enum, domain, composite ...)."""

    oid: int
    namespace: str
    name: str
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class Insert:
    """A new row."""

    relation_oid: int
    new: TupleData
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class Update:
    """A changed row.

    ``old`` is the key columns (``old_is_key``: REPLICA IDENTITY DEFAULT/INDEX, only when
    the key changed) or the full old row (REPLICA IDENTITY FULL), else ``None``.
    In ``new``, TOASTed columns that did not change are :data:`UNCHANGED_TOAST`.
    """

    relation_oid: int
    old: TupleData | None
    new: TupleData
    old_is_key: bool = False
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class Delete:
    """A deleted row: its key columns (``old_is_key``) or, with REPLICA IDENTITY FULL, the whole old row."""

    relation_oid: int
    old: TupleData
    old_is_key: bool
    xid: int | None = None


class TruncateOption(enum.IntFlag):
    """Options of a TRUNCATE statement."""

    NONE = 0
    CASCADE = 1
    RESTART_IDENTITY = 2


@dataclass(frozen=True, slots=True)
class Truncate:
    """One TRUNCATE statement over one or more relations."""

    options: TruncateOption
    relation_oids: tuple[int, ...]
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class LogicalMessage:
    """``pg_logical_emit_message``. Non-transactional ones arrive outside any Begin/Commit."""

    transactional: bool
    lsn: Lsn
    prefix: str
    content: bytes
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class StreamStart:
    """Start of one block of a streamed (in-progress) transaction; protocol 2."""

    xid: int
    first_segment: bool


@dataclass(frozen=True, slots=True)
class StreamStop:
    """End of the current stream block; the transaction may continue in a later block."""


@dataclass(frozen=True, slots=True)
class StreamCommit:
    """A streamed transaction committed: everything streamed for ``xid`` is now durable in the source."""

    xid: int
    flags: int
    commit_lsn: Lsn
    end_lsn: Lsn
    commit_ts_us: int


@dataclass(frozen=True, slots=True)
class StreamAbort:
    """A streamed transaction (``subxid == xid``) or one of its subtransactions rolled back: drop its changes."""

    xid: int
    subxid: int


PgoutputMessage: TypeAlias = (
    Begin
    | Commit
    | Origin
    | Relation
    | Type
    | Insert
    | Update
    | Delete
    | Truncate
    | LogicalMessage
    | StreamStart
    | StreamStop
    | StreamCommit
    | StreamAbort
)
