"""The Delta table format (``warehouse.format: delta``, the default): delta-rs tables, DuckDB scans.

Writes are :mod:`warehouse_loader.delta.writer` (one MERGE per micro-batch with the Delta app
transaction ``(table, batch_id)``); remembered deletes and truncates live in the Delta table
``<table>/_hw_tombstones`` beside the data (the ``_`` prefix hides it from Delta readers and
vacuum); a version is a Delta version (:class:`warehouse_loader.delta.table.DeltaVersion`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pyarrow as pa  # type: ignore[import-untyped]  # no stubs
from deltalake import DeltaTable

from core.warehouse_config import TableConfig
from warehouse_loader.delta import evolution, writer
from warehouse_loader.delta.maintenance import DeltaMaintainer
from warehouse_loader.delta.table import DeltaVersion, delta_exists, open_version
from warehouse_loader.location import TableLocation, storage_error
from warehouse_loader.scd2 import Scd2Actions
from warehouse_loader.schema_evolution import TableChanges
from warehouse_loader.table_format import StoredTable, WriteResult


def _delta(target: StoredTable | None) -> DeltaTable | None:
    if target is None:
        return None
    if not isinstance(target, DeltaVersion):
        msg = f"{target.location} was not opened as a Delta table"
        raise TypeError(msg)
    return target.delta


class DeltaFormat:
    """Delta Lake through delta-rs (see the module docstring)."""

    name = "delta"
    #: Merge-on-read unless asked otherwise: deletion vectors once a local table passes 1 MiB (issue 34).
    merge_on_read_default = True

    def open(self, location: TableLocation) -> DeltaVersion | None:
        """The latest version of the Delta table at ``location``, or None."""
        return open_version(location)

    def exists(self, location: TableLocation) -> bool:
        """True when a Delta table is at ``location``."""
        return delta_exists(location)

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
        """One MERGE (SCD1 or SCD2), exactly once per ``(table, batch_id)``; merge-on-read past 1 MiB when asked."""
        return writer.write_batch(
            location,
            changes,
            table=table,
            batch_id=batch_id,
            keys=keys,
            config=config,
            reread_points=reread_points,
            merge_on_read=merge_on_read,
        )

    def evolve(self, location: TableLocation, changes: TableChanges, *, keys: Sequence[str]) -> bool:
        """One rewrite of the table (and of its tombstones) with the columns renamed or cast (:mod:`.evolution`)."""
        return evolution.evolve(location, changes, keys=keys)

    def committed_batch(self, location: TableLocation, table: str) -> int | None:
        """The Delta app transaction version of ``table``."""
        return writer.committed_batch(location, table)

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
        """New tombstones, then one MERGE on ``(keys, __START_AT)`` (or the table's creation)."""
        return writer.commit_scd2(
            location,
            _delta(target),
            actions,
            keys=keys,
            table=table,
            batch_id=batch_id,
            metadata=dict(metadata) if metadata is not None else None,
        )

    def tombstones(self, location: TableLocation) -> DeltaVersion | None:
        """The Delta table ``_hw_tombstones`` beside the data."""
        return open_version(location / writer.TOMBSTONES_DIR)

    def loaded_key(self, location: TableLocation) -> tuple[str, ...] | None:
        """The key the latest commit's metadata names."""
        return writer.loaded_key(location)

    def recorded_key(self, location: TableLocation, *, commits: int = 100) -> tuple[str, ...] | None:
        """The key the latest of the last ``commits`` commits names."""
        return writer.recorded_key(location, commits=commits)

    def remove(self, location: TableLocation) -> None:
        """Delete the table's directory (or object store prefix), tombstones included."""
        location.remove()

    def check_store(self, root: TableLocation) -> None:
        """A LIST under the root through delta-rs's store client: the bucket and the credentials are both checked."""
        if not root.is_remote:
            return  # a local warehouse is always fine: its directories are created on first write
        try:
            DeltaTable.is_deltatable(f"{root.uri}/_headwater_probe", storage_options=root.storage_options)
        except OSError as exc:
            raise storage_error(exc, root) from None

    def maintainer(self, location: TableLocation, *, tombstones: bool = False) -> DeltaMaintainer:
        """Compaction, checkpoints, vacuum and log expiry by delta-rs and Headwater's log entries.

        ``tombstones``: of the Delta table ``_hw_tombstones`` beside the data.
        """
        return DeltaMaintainer(location / writer.TOMBSTONES_DIR if tombstones else location)
