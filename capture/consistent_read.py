"""Reading a source table at one consistent point as the events capture writes: what ``headwater verify`` compares.

A capability of a source kind (:class:`ConsistentReads`), tested for by its callers: a kind whose
warehouse tables are verified from the events' own row images offers it (MySQL/MariaDB); the
PostgreSQL kind's verify hashes rows in SQL instead (:mod:`operations.verify`).

Contract of a :class:`ConsistentRead`:

* ``point`` is the source's position ordinal (:meth:`log.position.Position.ordinal`) such that the
  read sees exactly the changes whose ``commit_lsn`` is at or below it: every change whose
  sequence sorts at or after ``Sequence(point + 1, 0)`` committed after the read's view;
* :meth:`ConsistentRead.values` yields the table's rows (as capture writes them: its columns,
  masks, key and row filter applied) as the values of ``op: "r"`` change events, in chunks of at
  most ``chunk_rows``, every one read inside the same view; the caller decodes them as the log's
  readers do, so what it compares is what a load of those events would write.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Protocol, runtime_checkable

from core.config import ProjectConfig


class ConsistentRead(Protocol):
    """One source table inside one consistent view (see the module docstring)."""

    #: The position ordinal the view holds exactly.
    point: int
    #: The point as the kind prints it (``binlog.000003:4711``).
    label: str
    #: The source table as the kind names it (``shop.customers``).
    table: str

    def values(self, chunk_rows: int) -> Iterator[list[bytes]]:
        """The rows' event values, a chunk at a time (the read is not restartable: iterate once)."""


@runtime_checkable
class ConsistentReads(Protocol):
    """A source kind that reads its tables at a consistent point and knows how far capture has read."""

    def consistent_read(self, config: ProjectConfig, name: str, topic: str) -> AbstractContextManager[ConsistentRead]:
        """The source table of ``topic`` at a new consistent point, until the context ends."""

    def captured_to(self, config: ProjectConfig, name: str) -> int | None:
        """The position ordinal up to which the log holds every change of source ``name`` (None: not known yet)."""
