"""A table format of Parquet files in a directory (``format: parquet_dir``), copy-on-write, for tests.

Version N of a table is ``<table>/_versions/<N>.json`` (written with ``O_EXCL``, so of two writers
racing for a version one wins and the other gets :class:`~warehouse_loader.errors.CommitConflictError`)
naming ``rows-<N>.parquet`` (the whole table) and ``tombstones-<N>.parquet`` (remembered deletes and
truncates: rows ``keys..., <sequence>, __hw_op``), the batch id each app committed last, the key the
rows were merged on and the commit's metadata. Each batch is planned by the format-free SCD planners
and applied by their in-memory twins (``apply_scd1``, ``apply_scd2``): every version rewrites the
whole table, which is fine for a test's few rows and nothing else.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from core.warehouse_config import TableConfig
from warehouse_loader.cdc_options import prepare_changes
from warehouse_loader.changes import DELETE_OP, OP, TRUNCATE_OP
from warehouse_loader.duckdb_connection import duckdb_connection
from warehouse_loader.errors import CommitConflictError
from warehouse_loader.location import TableLocation
from warehouse_loader.maintenance import TableShape
from warehouse_loader.scd1 import Scd1State, apply_scd1, empty_tombstones, plan_scd1
from warehouse_loader.scd2 import Scd2Actions, Scd2State, apply_scd2, plan_scd2
from warehouse_loader.sql_text import quote
from warehouse_loader.table_format import WriteResult

VERSIONS = "_versions"


def _manifests(directory: Path) -> list[int]:
    found = directory / VERSIONS
    return sorted(int(p.stem) for p in found.glob("*.json")) if found.is_dir() else []


class ParquetVersion:
    """One version of a Parquet-directory table (its :class:`~warehouse_loader.table_format.StoredTable`)."""

    def __init__(self, location: TableLocation, manifest: Mapping[str, Any], rows: str) -> None:
        self.location = location
        self.manifest = manifest
        self._file = location.path / rows

    def version(self) -> int:
        return int(self.manifest["version"])

    def schema(self) -> pa.Schema:
        return pq.read_schema(self._file)

    def rows(self) -> pa.Table:
        return pq.read_table(self._file)

    def register(self, con: duckdb.DuckDBPyConnection, name: str) -> None:
        con.execute(f"CREATE TEMP VIEW {quote(name)} AS SELECT * FROM read_parquet('{self._file}')")

    def select(self, sql: str, **tables: pa.Table) -> pa.Table:
        con = duckdb_connection([self.location])
        try:
            self.register(con, "target")
            for name, table in tables.items():
                con.register(name, table)
            return con.sql(sql).to_arrow_table()
        finally:
            con.close()

    def history(self, limit: int) -> list[Mapping[str, Any]]:
        directory = self.location.path / VERSIONS
        return [json.loads((directory / f"{n}.json").read_text()) for n in reversed(_manifests(self.location.path))][
            :limit
        ]

    def size_bytes(self) -> int:
        return self._file.stat().st_size


class ParquetDirectoryFormat:
    """The ``parquet_dir`` format (see the module docstring). Local directories only."""

    name = "parquet_dir"
    #: Copy-on-write only: ``merge_on_read`` has nothing to change.
    merge_on_read_default = False

    def latest(self, location: TableLocation) -> dict[str, Any] | None:
        """The manifest of the table's latest version (None: no table yet)."""
        found = _manifests(location.path)
        return json.loads((location.path / VERSIONS / f"{found[-1]}.json").read_text()) if found else None

    def open(self, location: TableLocation) -> ParquetVersion | None:
        manifest = self.latest(location)
        return None if manifest is None else ParquetVersion(location, manifest, manifest["rows"])

    def exists(self, location: TableLocation) -> bool:
        return bool(_manifests(location.path))

    def tombstones(self, location: TableLocation) -> ParquetVersion | None:
        manifest = self.latest(location)
        if manifest is None or manifest["tombstones"] is None:
            return None
        return ParquetVersion(location, manifest, manifest["tombstones"])

    def committed_batch(self, location: TableLocation, table: str) -> int | None:
        manifest = self.latest(location)
        return None if manifest is None else manifest["batches"].get(table)

    def loaded_key(self, location: TableLocation) -> tuple[str, ...] | None:
        manifest = self.latest(location)
        return None if manifest is None or manifest["key"] is None else tuple(manifest["key"])

    def recorded_key(self, location: TableLocation, *, commits: int = 100) -> tuple[str, ...] | None:
        return self.loaded_key(location)

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
        """Plan the batch against the whole stored table and commit the result as the next version.

        ``merge_on_read`` changes nothing: every version is rewritten whole (copy-on-write).
        """
        changes, options = prepare_changes(changes, keys, config, reread_points=reread_points)
        manifest = self.latest(location)
        if manifest is not None and manifest["batches"].get(table, -1) >= batch_id:
            return WriteResult(table, batch_id, skipped=True, version=int(manifest["version"]))
        stored = self.open(location)
        side = self.tombstones(location)
        marks = side.rows() if side is not None else None
        seq = options.sequence_by
        if config.mode == "scd1":
            tombs = empty_tombstones(changes, keys, seq)
            truncated = None
            if marks is not None:
                tombs = marks.filter(pc.equal(marks.column(OP), DELETE_OP)).select([*keys, seq])
                truncated = pc.max(marks.filter(pc.equal(marks.column(OP), TRUNCATE_OP)).column(seq)).as_py()
            rows = stored.rows() if stored is not None else changes.slice(0, 0)
            actions = plan_scd1(
                changes,
                keys,
                tombstones=tombs,
                truncated_through=truncated,
                sequence_by=seq,
                ignore_null_columns=options.ignore_null_columns,
                existing=rows if options.ignore_null_columns else None,
            )
            state = apply_scd1(Scd1State(rows, tombs, truncated), actions, keys)
            new_rows, new_marks = state.rows, _marks(state.tombstones, state.truncated_through, keys, seq)
        else:
            truncates = ()
            tombs = None
            if marks is not None:
                tombs = marks.filter(pc.equal(marks.column(OP), DELETE_OP)).select([*keys, seq])
                truncates = tuple(marks.filter(pc.equal(marks.column(OP), TRUNCATE_OP)).column(seq).to_pylist())
            rows = stored.rows() if stored is not None else None
            actions = plan_scd2(
                changes,
                keys,
                rows,
                tombstones=tombs,
                truncates=truncates,
                track_history_columns=options.track_history_columns,
                sequence_by=seq,
                track_history_except_columns=options.track_history_except_columns,
                ignore_null_columns=options.ignore_null_columns,
                reread_points=options.reread_points,
            )
            return self.commit_scd2(location, stored, actions, keys=keys, table=table, batch_id=batch_id)
        return self._commit(location, manifest, new_rows, new_marks, table=table, batch_id=batch_id, keys=keys)

    def commit_scd2(
        self,
        location: TableLocation,
        target: Any,
        actions: Scd2Actions,
        *,
        keys: Sequence[str],
        table: str,
        batch_id: int,
        metadata: Mapping[str, str] | None = None,
    ) -> WriteResult:
        manifest = self.latest(location)
        side = self.tombstones(location)
        marks = side.rows() if side is not None else None
        seq = actions.sequence_by
        rows = target.rows() if target is not None else actions.versions.slice(0, 0)
        tombs = actions.tombstones.slice(0, 0)
        truncates: tuple[Any, ...] = ()
        if marks is not None:
            tombs = marks.filter(pc.equal(marks.column(OP), DELETE_OP)).select([*keys, seq]).cast(tombs.schema)
            truncates = tuple(marks.filter(pc.equal(marks.column(OP), TRUNCATE_OP)).column(seq).to_pylist())
        state = apply_scd2(Scd2State(rows, tombs, truncates), actions, keys)
        latest = max(state.truncates) if state.truncates else None
        new_marks = _marks(state.tombstones, latest, keys, seq, all_truncates=state.truncates)
        return self._commit(
            location, manifest, state.rows, new_marks, table=table, batch_id=batch_id, keys=keys, metadata=metadata
        )

    def _commit(
        self,
        location: TableLocation,
        manifest: Mapping[str, Any] | None,
        rows: pa.Table,
        marks: pa.Table,
        *,
        table: str,
        batch_id: int,
        keys: Sequence[str],
        metadata: Mapping[str, str] | None = None,
    ) -> WriteResult:
        directory = location.path
        (directory / VERSIONS).mkdir(parents=True, exist_ok=True)
        version = 0 if manifest is None else int(manifest["version"]) + 1
        pq.write_table(rows, directory / f"rows-{version}.parquet")
        pq.write_table(marks, directory / f"tombstones-{version}.parquet")
        batches = dict(manifest["batches"]) if manifest is not None else {}
        batches[table] = batch_id
        body = {
            "version": version,
            "timestamp": int(time.time() * 1000),
            "rows": f"rows-{version}.parquet",
            "tombstones": f"tombstones-{version}.parquet",
            "batches": batches,
            "key": list(keys),
            "metadata": dict(metadata or {}),
        }
        try:
            fd = os.open(directory / VERSIONS / f"{version}.json", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            raise CommitConflictError(table, batch_id, f"version {version} was committed by another writer") from None
        with os.fdopen(fd, "w") as handle:
            json.dump(body, handle)
            handle.flush()
            os.fsync(handle.fileno())
        return WriteResult(table, batch_id, skipped=False, version=version, inserted=rows.num_rows)

    def remove(self, location: TableLocation) -> None:
        shutil.rmtree(location.path, ignore_errors=True)

    def check_store(self, root: TableLocation) -> None:
        if root.is_remote:
            msg = f"the parquet_dir format keeps tables on a local disk, not at {root}"
            raise CommitConflictError("warehouse", 0, msg)

    def maintainer(self, location: TableLocation, *, tombstones: bool = False) -> ParquetMaintainer:
        """Expiry of replaced versions' files; nothing to compact or checkpoint (one file per version).

        ``tombstones``: the remembered deletes live in the table's own versions, so there is no
        second table to maintain.
        """
        return ParquetMaintainer(self, location, active=not tombstones)


class ParquetMaintainer:
    """The ``parquet_dir`` format's :class:`~warehouse_loader.maintenance.TableMaintainer`."""

    def __init__(self, fmt: ParquetDirectoryFormat, location: TableLocation, *, active: bool) -> None:
        self._format = fmt
        self._location = location
        self._active = active

    def _files(self) -> list[Path]:
        return sorted(self._location.path.glob("*.parquet"))

    def shape(self, small_below: int) -> TableShape | None:
        latest = self._format.latest(self._location) if self._active else None
        if latest is None:
            return None
        files = [self._location.path / latest["rows"]]
        size = sum(f.stat().st_size for f in files)
        return TableShape(int(latest["version"]), 1, size, 0, 0, 0, rows=pq.read_metadata(files[0]).num_rows)

    def compact(self, target_file_size: int, small_below: int, purge_share: float) -> tuple[int, int, int]:
        return (0, 0, 0)  # a version is one file already

    def checkpoint(self) -> bool:
        return False  # no log to fold

    def expire(self, retention_s: float) -> tuple[int, int, int]:
        """Remove the Parquet files of replaced versions older than ``retention_s``."""
        latest = self._format.latest(self._location) if self._active else None
        if latest is None:
            return (0, 0, 0)
        keep = {latest["rows"], latest["tombstones"]}
        cutoff = time.time() - retention_s
        removed, freed = 0, 0
        for file in self._files():
            stat = file.stat()
            if file.name not in keep and stat.st_mtime < cutoff:
                file.unlink()
                removed, freed = removed + 1, freed + stat.st_size
        return (removed, freed, 0)


def _marks(
    tombstones: pa.Table, truncated: Any, keys: Sequence[str], seq: str, *, all_truncates: Sequence[Any] = ()
) -> pa.Table:
    """Remembered deletes (``d``) and truncates (``t``, null keys) as one table."""
    deletes = tombstones.select([*keys, seq]).append_column(
        OP, pa.array([DELETE_OP] * tombstones.num_rows, pa.string())
    )
    values = list(all_truncates) or ([] if truncated is None else [truncated])
    if not values:
        return deletes
    cut = {name: pa.nulls(len(values), deletes.schema.field(name).type) for name in keys}
    cut[seq] = pa.array(values, deletes.schema.field(seq).type)
    cut[OP] = pa.array([TRUNCATE_OP] * len(values), pa.string())
    return pa.concat_tables([deletes, pa.table(cut, schema=deletes.schema)])
