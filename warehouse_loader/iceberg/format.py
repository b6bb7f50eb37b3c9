"""The Iceberg table format (``warehouse.format: iceberg``): pyiceberg tables in a catalog, DuckDB scans.

A table at ``<warehouse>/<build>`` is ``<namespace>.<build>`` in the project's catalog
(:mod:`warehouse_loader.iceberg.catalog`, embedded SQLite by default), its files under that
location; remembered deletes and truncates are the table ``<build>__hw_tombstones``
(:mod:`warehouse_loader.iceberg.table_ref`). Writes are :mod:`warehouse_loader.iceberg.writer`
(one snapshot per micro-batch carrying ``(table, batch_id)``); a version is a snapshot
(:class:`IcebergVersion`, numbered by its sequence number). The format needs the project's
config (catalog, namespace): :func:`warehouse_loader.formats.format_of` binds it
(:meth:`IcebergFormat.for_project`). Maintenance is :mod:`warehouse_loader.iceberg.maintenance`.

Merge-on-read is asked per write (``warehouse.merge_on_read``, unset: copy-on-write, this
format's default, :attr:`IcebergFormat.merge_on_read_default`); it applies to SCD1 tables.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import duckdb
import pyarrow as pa  # type: ignore[import-untyped]

from core.warehouse_config import TableConfig
from warehouse_loader.iceberg import writer
from warehouse_loader.iceberg.catalog import CatalogSpec, catalog_spec, embedded_catalog
from warehouse_loader.iceberg.commit import committed_batch, reading, recorded_key
from warehouse_loader.iceberg.maintenance import IcebergMaintainer
from warehouse_loader.iceberg.scan import TableFiles, arrow_schema
from warehouse_loader.iceberg.schema import apply_changes, source_changes
from warehouse_loader.iceberg.table_ref import IcebergTableRef
from warehouse_loader.location import TableLocation, storage_error
from warehouse_loader.scd2 import Scd2Actions
from warehouse_loader.schema_evolution import TableChanges
from warehouse_loader.table_format import StoredTable, WriteResult

if TYPE_CHECKING:
    from pyiceberg.table import Table

    from core.config import ProjectConfig


class IcebergVersion:
    """One snapshot of an Iceberg table (the :class:`~warehouse_loader.table_format.StoredTable` of the format)."""

    def __init__(self, location: TableLocation, ref: IcebergTableRef, table: Table) -> None:
        self.location = location
        self.ref = ref
        #: The pyiceberg table at this snapshot (Iceberg code only).
        self.table = table
        self._files: TableFiles | None = None

    @property
    def files(self) -> TableFiles:
        """The snapshot's live data files and their position deletes (planned once)."""
        if self._files is None:
            self._files = TableFiles.of(self.table)
        return self._files

    def version(self) -> int:
        """The current snapshot's sequence number (0: no snapshot yet)."""
        current = self.table.current_snapshot()
        return 0 if current is None else int(current.sequence_number or 0)

    def schema(self) -> pa.Schema:
        """The Arrow schema of the table's current schema."""
        return arrow_schema(self.table.schema())

    def register(self, con: duckdb.DuckDBPyConnection, name: str) -> None:
        """``name``: a view over this snapshot's live rows (or an empty table)."""
        self.files.register(con, name)

    def select(self, sql: str, **tables: pa.Table) -> pa.Table:
        """``sql`` over ``target`` (this snapshot) and ``tables``, by DuckDB."""
        with reading(self.ref, **tables) as con:
            self.files.register(con, "target")
            return con.sql(sql).to_arrow_table()

    def history(self, limit: int) -> list[Mapping[str, Any]]:
        """The last ``limit`` snapshots, newest first: ``version``, ``timestamp`` (ms), ``operation``, the summary."""
        snapshots = sorted(self.table.snapshots(), key=lambda s: s.sequence_number or 0, reverse=True)[:limit]
        return [
            {
                "version": s.sequence_number,
                "timestamp": s.timestamp_ms,
                "snapshot_id": s.snapshot_id,
                "operation": None if s.summary is None else s.summary.operation.value,
                **({} if s.summary is None else dict(s.summary.additional_properties)),
            }
            for s in snapshots
        ]

    def size_bytes(self) -> int:
        """Bytes of the snapshot's live data files and delete files."""
        files = self.files
        return sum(f.file_size_in_bytes for f in (*files.files.values(), *files.delete_files.values()))


class IcebergFormat:
    """Apache Iceberg through pyiceberg (see the module docstring)."""

    name = "iceberg"
    #: Copy-on-write unless asked: every Iceberg reader reads such a table without applying
    #: deletes, and a batch's snapshot holds only whole files (issue 30's decision).
    merge_on_read_default = False

    def __init__(self, catalog: CatalogSpec | None = None) -> None:
        #: None until bound to a project (:meth:`for_project`): each table then uses the embedded
        #: catalog beside its warehouse (``<warehouse>/../iceberg``), as a project with defaults does.
        self.catalog = catalog

    def for_project(self, config: ProjectConfig) -> IcebergFormat:
        """This format with the project's catalog (``warehouse.iceberg``)."""
        return IcebergFormat(catalog_spec(config))

    def ref(self, location: TableLocation) -> IcebergTableRef:
        """The table at ``location``: build name = its last segment, warehouse = the rest."""
        root = TableLocation(location.uri.rstrip("/").rsplit("/", 1)[0], location.options)
        catalog = self.catalog
        if catalog is None:
            if root.is_remote:
                msg = f"{location}: an Iceberg table on an object store needs the project's catalog settings"
                raise ValueError(msg)
            catalog = embedded_catalog(root.path.parent)
        return IcebergTableRef(catalog, root, location.name)

    def _version(self, location: TableLocation, ref: IcebergTableRef) -> IcebergVersion | None:
        table = ref.load()
        return None if table is None else IcebergVersion(location, ref, table)

    def open(self, location: TableLocation) -> IcebergVersion | None:
        """The current snapshot of the table at ``location``, or None."""
        return self._version(location, self.ref(location))

    def exists(self, location: TableLocation) -> bool:
        """True when the catalog has the table at ``location``."""
        return self.ref(location).load() is not None

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
        """One snapshot (SCD1 or SCD2), exactly once per ``(table, batch_id)``; SCD1 merge-on-read when asked."""
        return writer.write_batch(
            self.ref(location),
            changes,
            table=table,
            batch_id=batch_id,
            keys=keys,
            config=config,
            merge_on_read=merge_on_read,
            reread_points=reread_points,
        )

    def evolve(self, location: TableLocation, changes: TableChanges, *, keys: Sequence[str]) -> bool:
        """Rename, widen, add columns in metadata (the table, then its tombstones: no additions); no file rewritten.

        Both tables are checked before either changes: a widening Iceberg cannot do in place is
        refused (:func:`warehouse_loader.iceberg.schema.source_changes`). The key needs no record
        here: the next snapshot records it, and a renamed key column is mapped by its history.
        """
        ref = self.ref(location)
        plans = []
        side = dataclasses.replace(changes, adds={})
        for each, wanted in ((ref, changes), (ref.tombstones, side)):
            target = each.load()
            if target is not None:
                needed = source_changes(location.name, target, wanted)
                if needed:
                    plans.append((target, needed))
        for target, needed in plans:
            apply_changes(location.name, target, needed)
        return bool(plans)

    def committed_batch(self, location: TableLocation, table: str) -> int | None:
        """The batch recorded in the table property ``headwater.batch.<table>``."""
        return committed_batch(self.ref(location).load(), table)

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
        """New tombstones, then one snapshot replacing the files of the versions ``actions`` touch."""
        if target is not None and not isinstance(target, IcebergVersion):
            msg = f"{target.location} was not opened as an Iceberg table"
            raise TypeError(msg)
        files = None if target is None else target.files
        return writer.commit_scd2(
            self.ref(location), files, actions, keys=keys, table=table, batch_id=batch_id, metadata=metadata
        )

    def tombstones(self, location: TableLocation) -> IcebergVersion | None:
        """The table ``<build>__hw_tombstones`` (files under ``<location>/_hw_tombstones``)."""
        side = self.ref(location).tombstones
        return self._version(side.location, side)

    def loaded_key(self, location: TableLocation) -> tuple[str, ...] | None:
        """The key the latest Headwater snapshot names."""
        return recorded_key(self.ref(location).load())

    def recorded_key(self, location: TableLocation, *, commits: int = 100) -> tuple[str, ...] | None:
        """The key the latest snapshot naming one names (maintenance carries it forward)."""
        return recorded_key(self.ref(location).load())

    def remove(self, location: TableLocation) -> None:
        """Drop the table and its tombstone table from the catalog and delete their files."""
        from pyiceberg.exceptions import NoSuchTableError

        ref = self.ref(location)
        catalog = ref.open_catalog()
        for each in (ref.tombstones, ref):
            with contextlib.suppress(NoSuchTableError):  # never created, or dropped by an earlier attempt
                catalog.drop_table(each.identifier)
        location.remove()

    def check_store(self, root: TableLocation) -> None:
        """Open the catalog (a PostgreSQL or REST one answers) and list the store under the root."""
        self.ref(root / "_headwater_probe").open_catalog()
        if root.is_remote:
            import pyarrow.fs as pafs  # type: ignore[import-untyped]

            fs, inside = root.filesystem()
            try:
                fs.get_file_info(pafs.FileSelector(inside, allow_not_found=True))
            except OSError as exc:
                raise storage_error(exc, root) from None

    def maintainer(self, location: TableLocation, *, tombstones: bool = False) -> IcebergMaintainer:
        """Compaction (position deletes folded), manifest rewrites, snapshot expiry and orphan removal.

        ``tombstones``: of the table ``<build>__hw_tombstones`` beside it, found through the
        main table's reference (its location ``<location>/_hw_tombstones`` alone would name
        another table).
        """
        ref = self.ref(location)
        return IcebergMaintainer(ref.tombstones if tombstones else ref)
