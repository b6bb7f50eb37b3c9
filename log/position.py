"""Positions in a source's history: each source kind's own value object, opaque to the log.

A position (PostgreSQL: :class:`log.sequence.Lsn`; another kind: its own) is made, parsed,
printed, compared and acknowledged only by the kind it belongs to; stages never look inside
one. What the log orders a source's events by is the :class:`log.sequence.Sequence` each event
carries (``source.commit_lsn`` and ``source.txn_index`` in its envelope): a kind encodes the
position of an event's commit as :meth:`Position.ordinal`, a non-negative int64, and the
event's place in its commit as the index.

Contract every kind keeps: ``a < b`` exactly when ``a.ordinal() < b.ordinal()`` (the encoding
keeps the kind's own order), and a commit's events get indexes ``0, 1, ...`` in the order the
source committed them, so ``Sequence(ordinal, index)`` is the source's total order. Snapshot
rows carry the snapshot point's ordinal and sort before everything streamed after it. The
PostgreSQL kind's ordinal is the LSN itself, so events written before kinds existed sort
exactly as they did.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Position(Protocol):
    """A place in one source's history (see the module docstring)."""

    def __lt__(self, other: Any, /) -> bool:
        """Earlier in the source's history (positions of one kind only)."""
        ...

    def __str__(self) -> str:
        """As the source's own tools print it (PostgreSQL: ``16/B374D848``)."""
        ...

    def ordinal(self) -> int:
        """The non-negative int64 the log orders this position by (keeps the kind's order)."""
        ...
