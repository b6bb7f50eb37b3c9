"""The log's total order of a source's events (:class:`Sequence`), and PostgreSQL's position (:class:`Lsn`).

Positions are each source kind's own (:mod:`log.position`); :class:`Lsn` is the PostgreSQL kind's,
kept here because every record written before kinds existed carries it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import total_ordering

_LSN_TEXT = re.compile(r"^([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})$")


@total_ordering
@dataclass(frozen=True, slots=True)
class Lsn:
    """A PostgreSQL WAL position (64-bit), printed as Postgres prints it: ``16/B374D848``."""

    value: int

    def __post_init__(self) -> None:
        if not 0 <= self.value < 1 << 64:
            msg = f"LSN out of range: {self.value}"
            raise ValueError(msg)

    @classmethod
    def parse(cls, text: str) -> Lsn:
        """Parse Postgres' ``XXX/XXX`` form."""
        match = _LSN_TEXT.match(text.strip())
        if not match:
            msg = f"not an LSN: {text!r} (expected the form 16/B374D848)"
            raise ValueError(msg)
        return cls((int(match.group(1), 16) << 32) | int(match.group(2), 16))

    def __str__(self) -> str:
        return f"{self.value >> 32:X}/{self.value & 0xFFFFFFFF:X}"

    def __int__(self) -> int:
        return self.value

    def ordinal(self) -> int:
        """The LSN itself: the log orders PostgreSQL events by their commit LSN (:mod:`log.position`)."""
        return self.value

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Lsn):
            return NotImplemented
        return self.value < other.value


@total_ordering
@dataclass(frozen=True, slots=True)
class Sequence:
    """The total order of a source's events: ``(commit_lsn, txn_index)``.

    ``commit_lsn`` is the :meth:`~log.position.Position.ordinal` of the event's commit (for
    PostgreSQL the commit LSN, hence the name, which the envelope keeps), ``txn_index`` its place
    in the commit. Snapshot rows carry the snapshot point's ordinal and sort before every
    streamed change committed after it. Everything downstream applies a change only when its
    sequence is newer than what it already holds.
    """

    commit_lsn: int
    txn_index: int

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Sequence):
            return NotImplemented
        return (self.commit_lsn, self.txn_index) < (other.commit_lsn, other.txn_index)

    def sortable(self) -> str:
        """A fixed-width string that sorts like the sequence (the ``__hw_seq`` column)."""
        return f"{self.commit_lsn:016x}.{self.txn_index:016x}"

    @classmethod
    def from_sortable(cls, text: str) -> Sequence:
        """Inverse of :meth:`sortable`."""
        lsn, _, index = text.partition(".")
        return cls(int(lsn, 16), int(index, 16))
