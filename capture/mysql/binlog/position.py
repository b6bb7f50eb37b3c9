"""Binlog positions and GTIDs as value objects.

A :class:`BinlogPosition` is a file and a byte offset in it; positions of one server order
by the file's sequence number, then the offset. :meth:`BinlogPosition.sequence` packs one
into a single ordered integer (file number in the high bits, offset in the low 32: a binlog
file never exceeds 1 GiB, ``max_binlog_size``), which is what the log's
``(commit_lsn, txn_index)`` order takes as a transaction's commit position.

A MariaDB GTID is ``domain-server-sequence``; a :class:`GtidPosition` holds the last GTID of
each replication domain (MariaDB's ``gtid_current_pos`` / ``@slave_connect_state`` format).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import total_ordering

from core.errors import PermanentError

_FILE_NUMBER = re.compile(r"\.(\d+)$")
_OFFSET_BITS = 32
_MAX_OFFSET = (1 << _OFFSET_BITS) - 1


class BinlogPositionError(PermanentError):
    """A binlog position or GTID that cannot be parsed."""


@total_ordering
@dataclass(frozen=True)
class BinlogPosition:
    """A byte offset in one binlog file (``mysql-bin.000042:1337``)."""

    file: str
    offset: int

    @property
    def file_number(self) -> int:
        """The file's sequence number (``000042`` -> 42)."""
        match = _FILE_NUMBER.search(self.file)
        if match is None:
            msg = f"binlog file name {self.file!r} has no sequence number suffix"
            raise BinlogPositionError(msg)
        return int(match.group(1))

    def ordinal(self) -> int:
        """The log's order of this position (:class:`log.position.Position`): :meth:`sequence`."""
        return self.sequence()

    def sequence(self) -> int:
        """One integer ordering positions of a server: ``file_number << 32 | offset``."""
        if not 0 <= self.offset <= _MAX_OFFSET:
            msg = f"binlog offset {self.offset} of {self.file} is outside 0..2^32-1"
            raise BinlogPositionError(msg)
        return self.file_number << _OFFSET_BITS | self.offset

    @classmethod
    def parse(cls, text: str) -> BinlogPosition:
        """``file:offset`` -> position."""
        file, _, offset = text.rpartition(":")
        if not file or not offset.isdigit():
            msg = f"binlog position {text!r} is not FILE:OFFSET"
            raise BinlogPositionError(msg)
        return cls(file, int(offset))

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, BinlogPosition):
            return NotImplemented
        return (self.file_number, self.offset) < (other.file_number, other.offset)

    def __str__(self) -> str:
        return f"{self.file}:{self.offset}"


@dataclass(frozen=True, order=True)
class Gtid:
    """One MariaDB GTID: ``domain-server-sequence`` (ordered within a domain by ``sequence``)."""

    domain: int
    server: int
    sequence: int

    @classmethod
    def parse(cls, text: str) -> Gtid:
        """``0-1-42`` -> GTID."""
        parts = text.strip().split("-")
        if len(parts) != 3 or not all(p.isdigit() for p in parts):
            msg = f"GTID {text!r} is not DOMAIN-SERVER-SEQUENCE (MariaDB)"
            raise BinlogPositionError(msg)
        return cls(int(parts[0]), int(parts[1]), int(parts[2]))

    def __str__(self) -> str:
        return f"{self.domain}-{self.server}-{self.sequence}"


@dataclass(frozen=True)
class GtidPosition:
    """The last GTID of each domain: where a MariaDB replica resumes (``@slave_connect_state``)."""

    gtids: tuple[Gtid, ...] = ()

    @classmethod
    def parse(cls, text: str) -> GtidPosition:
        """``0-1-42,1-1-7`` (MariaDB's ``gtid_current_pos``) -> position; empty text: nothing yet."""
        gtids = [Gtid.parse(part) for part in text.split(",") if part.strip()]
        domains = [g.domain for g in gtids]
        if len(set(domains)) != len(domains):
            msg = f"GTID position {text!r} names a domain twice"
            raise BinlogPositionError(msg)
        return cls(tuple(sorted(gtids)))

    def advanced(self, gtid: Gtid) -> GtidPosition:
        """This position with ``gtid`` as its domain's last."""
        kept = [g for g in self.gtids if g.domain != gtid.domain]
        return GtidPosition(tuple(sorted([*kept, gtid])))

    def __str__(self) -> str:
        return ",".join(str(g) for g in self.gtids)
