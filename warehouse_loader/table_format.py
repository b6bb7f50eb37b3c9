"""The table-format interface: how a warehouse table is written, read and kept (``warehouse.format``).

A table format (Delta today, :mod:`warehouse_loader.delta`) stores the tables the SCD planners
(:mod:`warehouse_loader.scd1`, :mod:`warehouse_loader.scd2`, :mod:`warehouse_loader.cdc_options`,
all format-free, on Arrow) plan. The loader, backfills, queries, quality, verify, status,
reprocess, metrics and Dagster reach a table only through this interface; they ask
:mod:`warehouse_loader.formats` for the format of a table.

Contract every format keeps (the Delta format's is the test suite):

* **Exactly once.** :meth:`TableFormat.write_batch` applies one micro-batch of changes
  (:mod:`warehouse_loader.changes`) as one atomic commit carrying ``(table, batch_id)``;
  a batch at or below :meth:`TableFormat.committed_batch` of ``table`` is skipped, so a replay
  after a crash writes nothing twice. A commit that loses a race with another writer is
  planned again on the winner's version, never lost (:class:`warehouse_loader.errors.CommitConflictError`).
* **Remembered deletes.** Deletes and truncates that outlive their rows (a late event must
  not resurrect a deleted key) are kept beside the table; :meth:`TableFormat.tombstones`
  opens them as a table of rows ``keys..., <sequence>, __hw_op`` (``d`` or ``t``).
* **Schema evolution.** A new batch column is added; a table column the batch lacks stays
  (null in new rows); a type that cannot be cast safely is refused before anything is
  committed (:mod:`warehouse_loader.schema_evolution`). A column the source renamed or widened
  is renamed or widened by :meth:`TableFormat.evolve` (what changes is decided for every format
  by :func:`warehouse_loader.schema_evolution.table_changes`).
* **Key.** Every commit records the key columns the rows were merged on
  (:meth:`TableFormat.loaded_key`), so a load on another key is refused.
* **Scan.** :meth:`StoredTable.register` exposes one version of the table to DuckDB as a
  relation (query, verify, quality, status, Dagster all read through it), Arrow out.
* **History and versions.** A table's versions only grow (:meth:`StoredTable.version`,
  :meth:`StoredTable.history`); ``reprocess`` builds version N+1 at a new location and switches
  readers to it (:mod:`spark_log.versions`), :meth:`TableFormat.remove` drops an old one.
* **Maintenance, size and freshness**: :meth:`TableFormat.maintainer` (its shape, compaction,
  checkpoint, expiry; when each runs is :mod:`warehouse_loader.maintenance`, format-free),
  :meth:`StoredTable.size_bytes`; freshness is ``max(__hw_commit_ts)`` read through the scan.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import duckdb
import pyarrow as pa  # type: ignore[import-untyped]  # no stubs

from core.warehouse_config import TableConfig
from warehouse_loader.location import TableLocation
from warehouse_loader.maintenance import TableMaintainer
from warehouse_loader.scd2 import Scd2Actions
from warehouse_loader.schema_evolution import TableChanges

if TYPE_CHECKING:
    from core.config import ProjectConfig


@dataclass(frozen=True, slots=True)
class WriteResult:
    """What one write did. ``skipped``: the batch was already committed."""

    table: str
    batch_id: int
    skipped: bool
    version: int | None = None
    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    #: Live data and delete files of the table after the commit (None: the format does not say).
    files: int | None = None


class StoredTable(Protocol):
    """One warehouse table as it was when opened (one version)."""

    location: TableLocation

    def version(self) -> int:
        """The table's version (grows by one or more with every commit)."""

    def schema(self) -> pa.Schema:
        """The Arrow schema of this version."""

    def register(self, con: duckdb.DuckDBPyConnection, name: str) -> None:
        """Make ``name`` a relation of ``con`` over this version's rows (an empty table when it has none).

        ``con`` must be able to read the table's store: make it with
        :func:`warehouse_loader.duckdb_connection.duckdb_connection` and this table's location.
        Connections share their process's database: create only what is private to ``con``
        (``con.register``, ``CREATE TEMP VIEW``/``TABLE``), never a plain ``CREATE VIEW``.
        """

    def select(self, sql: str, **tables: pa.Table) -> pa.Table:
        """Run ``sql`` (DuckDB) with ``target`` bound to this version and ``tables`` by name; Arrow out."""

    def history(self, limit: int) -> list[Mapping[str, Any]]:
        """The last ``limit`` commits, newest first: ``version``, ``timestamp`` (ms) and the commit's metadata."""

    def size_bytes(self) -> int:
        """Bytes of the data files of this version."""


class TableFormat(Protocol):
    """One open table format (see the module docstring). ``name`` is the value of ``warehouse.format``."""

    name: str
    #: What an unset ``warehouse.merge_on_read`` means for this format's tables.
    merge_on_read_default: bool

    def open(self, location: TableLocation) -> StoredTable | None:
        """The table at ``location`` at its latest version, or None when there is none (yet)."""

    def exists(self, location: TableLocation) -> bool:
        """True when a table of this format is at ``location``."""

    def write_batch(
        self,
        location: TableLocation,
        changes: pa.Table,
        *,
        table: str,
        batch_id: int,
        keys: Sequence[str],
        config: TableConfig,
        reread_points: Sequence[str] = (),
        merge_on_read: bool = False,
    ) -> WriteResult:
        """Apply one micro-batch to table ``table`` (its AUTO CDC options first), exactly once per ``batch_id``.

        ``reread_points``: where the input's schema changes that read the table again start
        (``Sequence.sortable()``): SCD2 places the values such a re-read finds changed there.
        ``merge_on_read``: replaced rows may be marked removed (Delta: deletion vectors; Iceberg:
        position deletes) instead of rewriting the files that hold them; every reader of the
        format's own (and the format's other readers) must then leave them out.
        """

    def evolve(self, location: TableLocation, changes: TableChanges, *, keys: Sequence[str]) -> bool:
        """Rename and widen columns as ``changes`` says (in the table and its tombstones); True when anything changed.

        Every row keeps its values (a renamed column's under the new name, a widened one cast);
        readers see the table before or after, never between; ``keys`` (the key after the change)
        is recorded as every commit records it. Called before a load's first micro-batch.
        """

    def committed_batch(self, location: TableLocation, table: str) -> int | None:
        """The highest batch id of ``table`` committed at ``location`` (None: no table, no batch)."""

    def commit_scd2(
        self,
        location: TableLocation,
        target: StoredTable | None,
        actions: Scd2Actions,
        *,
        keys: Sequence[str],
        table: str,
        batch_id: int,
        metadata: Mapping[str, str] | None = None,
    ) -> WriteResult:
        """Commit planned SCD2 ``actions`` as one atomic version (backfills rebuild days this way)."""

    def tombstones(self, location: TableLocation) -> StoredTable | None:
        """The remembered deletes and truncates of the table at ``location`` (None: none yet)."""

    def loaded_key(self, location: TableLocation) -> tuple[str, ...] | None:
        """The key the latest commit merged on (None: no table, or a commit that names none)."""

    def recorded_key(self, location: TableLocation, *, commits: int = 100) -> tuple[str, ...] | None:
        """The key named by the latest of the last ``commits`` commits that names one."""

    def remove(self, location: TableLocation) -> None:
        """Delete the table at ``location`` and everything beside it (a no-op when nothing is there)."""

    def check_store(self, root: TableLocation) -> None:
        """Fail in one line when the warehouse's store under ``root`` refuses or cannot be reached; writes nothing."""

    def maintainer(self, location: TableLocation, *, tombstones: bool = False) -> TableMaintainer:
        """Compaction, checkpoints and expiry of the table at ``location`` (when each runs: the policy module).

        ``tombstones``: of the table of its remembered deletes (:meth:`tombstones`) instead.
        """


@runtime_checkable
class ProjectFormat(Protocol):
    """A format whose tables need the project's settings (Iceberg: its catalog); the factory binds them.

    :func:`warehouse_loader.formats.format_of` returns ``fmt.for_project(config)`` for such a format.
    """

    def for_project(self, config: ProjectConfig) -> TableFormat:
        """This format configured for the project ``config``."""
