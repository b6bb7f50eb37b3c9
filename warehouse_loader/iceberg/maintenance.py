"""Maintenance of one Iceberg table: the Iceberg side of :mod:`warehouse_loader.maintenance`.

Every micro-batch adds a snapshot, a manifest or two and data files (and, merge-on-read, a
position-delete file); copy-on-write batches leave the files they replaced to older snapshots.
pyiceberg 0.12 expires snapshots (metadata only) and does nothing else, so
:class:`IcebergMaintainer` does the rest:

* **compact**: the small data files (under ``small_below``, when two or more) and the files
  position deletes removed ``purge_share`` of the rows from are rewritten without the removed
  rows, one file per bin of up to the target size (:func:`warehouse_loader.maintenance.pack`),
  in one snapshot (``headwater.maintenance = compact``) that changes no row. The position
  deletes of the files left alone are carried into one new delete file and every old delete
  file is removed with it, so deletes never outlive their data file and never pile up. It
  commits as ``overwrite`` (pyiceberg cannot write ``replace``).
* **checkpoint**: the manifest list rewritten into one manifest per content
  (:mod:`warehouse_loader.iceberg.manifests`) once it has grown: what a Delta checkpoint is to
  its log. ``commits_since_checkpoint`` in the shape is the number of manifests such a rewrite
  would remove.
* **expire**: snapshots older than the retention are dropped from the metadata, except the
  current one and the one that was current at the cutoff (so every version committed inside
  the retention stays readable, Delta's rule); then files under the table's ``data/`` and
  ``metadata/`` that no remaining snapshot and no metadata file in the log references, and
  that are older than the retention, are deleted: files later snapshots replaced, files of
  expired snapshots, and files a killed writer left uncommitted (a file a writer is about to
  commit is young, and the caller holds the commit lease).

Every snapshot made here carries the table's recorded key forward (``headwater.key``): the
key check of the next load finds it even after expiry drops the loader's snapshots. The
batch marker is a table property, which no snapshot changes. A commit that loses the
catalog's compare-and-swap to another writer changes nothing; the next pass tries again.
"""

from __future__ import annotations

import datetime as dt
import time
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

import orjson
import pyarrow as pa  # type: ignore[import-untyped]

from warehouse_loader.iceberg.commit import KEY_SUMMARY, read_files, reading, recorded_key
from warehouse_loader.iceberg.manifests import extra_manifests, rewrite_manifests
from warehouse_loader.iceberg.row_delta import row_delta, write_position_deletes
from warehouse_loader.iceberg.scan import TableFiles
from warehouse_loader.iceberg.table_ref import IcebergTableRef
from warehouse_loader.location import storage_error
from warehouse_loader.maintenance import TableShape, pack
from warehouse_loader.sql_text import sql_list

if TYPE_CHECKING:
    from pyiceberg.manifest import DataFile
    from pyiceberg.table import Table, Transaction

#: Summary key of a snapshot made by maintenance (its value names the task).
MAINTENANCE_SUMMARY = "headwater.maintenance"
#: pyiceberg's target file size property: set this high for a bin, so a bin is one file.
_TARGET_SIZE_PROPERTY = "write.target-file-size-bytes"


class IcebergMaintainer:
    """:class:`warehouse_loader.maintenance.TableMaintainer` for the Iceberg table ``ref`` (or its side table)."""

    def __init__(self, ref: IcebergTableRef) -> None:
        self.ref = ref

    def _marks(self, table: Table, task: str) -> dict[str, str]:
        marks = {MAINTENANCE_SUMMARY: task}
        key = recorded_key(table)  # found through the parents: carried forward before expiry drops them
        if key is not None:
            marks[KEY_SUMMARY] = orjson.dumps(list(key)).decode()
        return marks

    def shape(self, small_below: int) -> TableShape | None:
        """Data files, bytes (delete files too), small files, removed rows of the current snapshot; extra manifests."""
        table = self.ref.load()
        if table is None:
            return None
        files = TableFiles.of(table)
        deletes = delete_files(table)
        sizes = [f.file_size_in_bytes for f in files.files.values()]
        small = [size for size in sizes if size < small_below]
        current = table.current_snapshot()
        return TableShape(
            version=0 if current is None else int(current.sequence_number or 0),
            files=len(sizes),
            bytes=sum(sizes) + sum(f.file_size_in_bytes for f in deletes),
            small_files=len(small),
            small_bytes=sum(small),
            commits_since_checkpoint=extra_manifests(table),
            rows=sum(f.record_count for f in files.files.values()),
            deleted_rows=sum(self._removed(files, deletes).values()),
        )

    def _positions(self, deletes: Sequence[DataFile], paths: Sequence[str]) -> pa.Table:
        """``file_path, pos`` of each row the delete files ``deletes`` remove from the data files ``paths``, once."""
        if not deletes or not paths:
            return pa.table({"file_path": pa.array([], pa.string()), "pos": pa.array([], pa.int64())})
        with reading(self.ref, live=pa.table({"file_path": pa.array(sorted(paths), pa.string())})) as con:
            source = f"read_parquet({sql_list(sorted(d.file_path for d in deletes))})"
            return con.sql(
                f"SELECT DISTINCT d.file_path, d.pos FROM {source} d SEMI JOIN live USING (file_path)"
            ).to_arrow_table()

    def _removed(self, files: TableFiles, deletes: Sequence[DataFile]) -> Counter[str]:
        """Removed rows per live data file (deletes naming a file no longer live are not counted)."""
        return Counter(self._positions(deletes, list(files.files)).column("file_path").to_pylist())

    def compact(self, target_file_size: int, small_below: int, purge_share: float) -> tuple[int, int, int]:
        """Rewrite the small data files, and those with ``purge_share`` of their rows removed, without removed rows.

        One snapshot: the chosen data files and every delete file go; files of up to
        ``target_file_size`` and one delete file holding the deletes of the files left alone come.
        Returns (files removed, files added, bytes written), delete files counted.
        """
        from pyiceberg.exceptions import CommitFailedException
        from pyiceberg.io.pyarrow import _dataframe_to_data_files

        table = self.ref.load()
        if table is None:
            return 0, 0, 0
        files = TableFiles.of(table)
        deletes = delete_files(table)
        sizes = {path: f.file_size_in_bytes for path, f in files.files.items()}
        removed_rows = self._removed(files, deletes)
        small = [path for path, size in sizes.items() if size < small_below]
        heavy = [path for path, n in removed_rows.items() if n >= purge_share * max(1, files.files[path].record_count)]
        bins = pack(sizes, set((small if len(small) >= 2 else []) + heavy), target_file_size)
        if not bins:
            return 0, 0, 0
        chosen = [path for paths in bins for path in paths]
        tx = table.transaction()
        one_file = tx.table_metadata.model_copy(
            update={"properties": {**tx.table_metadata.properties, _TARGET_SIZE_PROPERTY: str(1 << 62)}}
        )
        try:
            added: list[DataFile] = []
            for paths in bins:
                rows = read_files(self.ref, files, paths)  # live rows only: the deletes are applied
                if rows.num_rows:
                    added.extend(_dataframe_to_data_files(table_metadata=one_file, df=rows, io=tx._table.io))
            kept = [path for path in removed_rows if path not in set(chosen)]
            carried = write_position_deletes(tx, self._positions(deletes, kept)) if kept else None
            gone = [*(files.files[path] for path in chosen), *deletes]
            row_delta(
                tx,
                added=added,
                deletes=[carried] if carried else [],
                removed=gone,
                properties=self._marks(table, "compact"),
            )
            tx.commit_transaction()
        except CommitFailedException:
            return 0, 0, 0  # another writer committed first: the next pass compacts again
        except OSError as exc:
            raise storage_error(exc, self.ref.location) from None
        written = [*added, *([carried] if carried else [])]
        return len(gone), len(written), sum(f.file_size_in_bytes for f in written)

    def checkpoint(self) -> bool:
        """Rewrite the manifest list into one manifest per content when it has grown (False: nothing to fold)."""
        from pyiceberg.exceptions import CommitFailedException

        table = self.ref.load()
        if table is None or extra_manifests(table) == 0:
            return False
        tx: Transaction = table.transaction()
        try:
            rewrite_manifests(tx, self._marks(table, "checkpoint"))
            tx.commit_transaction()
        except CommitFailedException:
            return False
        except OSError as exc:
            raise storage_error(exc, self.ref.location) from None
        return True

    def expire(self, retention_s: float) -> tuple[int, int, int]:
        """Expire snapshots older than ``retention_s``, delete files nothing references: (files, bytes, snapshots)."""
        from pyiceberg.exceptions import CommitFailedException

        cutoff = time.time() - retention_s
        expired = 0
        table = self.ref.load()
        if table is None:
            return 0, 0, 0
        doomed = expired_snapshots(table, cutoff)
        if doomed:
            try:
                table.maintenance.expire_snapshots().by_ids(doomed).commit()
                expired = len(doomed)
            except CommitFailedException:
                pass  # another writer committed first: expired on the next pass
        files, freed = self._remove_orphans(dt.datetime.fromtimestamp(cutoff, dt.UTC))
        return files, freed, expired

    def _remove_orphans(self, older_than: dt.datetime) -> tuple[int, int]:
        """Delete files under ``data/`` and ``metadata/`` nothing references and older than ``older_than``."""
        import pyarrow.fs as pafs  # type: ignore[import-untyped]

        table = self.ref.load()
        if table is None:
            return 0, 0
        keep = referenced_files(table)
        fs, root = self.ref.location.filesystem()
        removed, freed = 0, 0
        try:
            for sub in ("data", "metadata"):  # the side table's directory, _hw_tombstones/, is neither
                listing = fs.get_file_info(pafs.FileSelector(f"{root}/{sub}", recursive=True, allow_not_found=True))
                for info in listing:
                    if info.type != pafs.FileType.File or _plain(info.path) in keep:
                        continue
                    mtime = info.mtime
                    if mtime is None or mtime.replace(tzinfo=mtime.tzinfo or dt.UTC) >= older_than:
                        continue  # young: a writer may be about to commit it
                    fs.delete_file(info.path)
                    removed, freed = removed + 1, freed + (info.size or 0)
        except OSError as exc:
            raise storage_error(exc, self.ref.location) from None
        return removed, freed


def delete_files(table: Table) -> list[DataFile]:
    """Every live position-delete file of the current snapshot (also those naming no live data file any more)."""
    from pyiceberg.manifest import ManifestContent

    current = table.current_snapshot()
    if current is None:
        return []
    return [
        entry.data_file
        for manifest in current.manifests(table.io)
        if manifest.content == ManifestContent.DELETES
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True)
    ]


def expired_snapshots(table: Table, cutoff_s: float) -> list[int]:
    """IDs of the snapshots committed before ``cutoff_s`` (Unix time) that no version inside the retention needs.

    Kept: the current snapshot, the newest one before the cutoff (it was current then, so it is
    the version a reader at the cutoff sees) and those a branch or tag names.
    """
    cutoff_ms = cutoff_s * 1000
    old = sorted((s for s in table.snapshots() if s.timestamp_ms < cutoff_ms), key=lambda s: s.timestamp_ms)
    current = table.current_snapshot()
    kept = {ref.snapshot_id for ref in table.metadata.refs.values()}
    kept |= {old[-1].snapshot_id} if old else set()
    kept |= {current.snapshot_id} if current is not None else set()
    return [s.snapshot_id for s in old if s.snapshot_id not in kept]


def referenced_files(table: Table) -> set[str]:
    """Every file the table's metadata references: metadata files in the log, manifest lists, manifests, live files."""
    io = table.io
    keep = {table.metadata_location, *(entry.metadata_file for entry in table.metadata.metadata_log)}
    for snapshot in table.snapshots():
        keep.add(snapshot.manifest_list)
        for manifest in snapshot.manifests(io):
            if manifest.manifest_path in keep:
                continue  # shared with a snapshot already read
            keep.add(manifest.manifest_path)
            for entry in manifest.fetch_manifest_entry(io, discard_deleted=True):
                keep.add(entry.data_file.file_path)
    return {_plain(path) for path in keep}


def _plain(path: str) -> str:
    """A path as the filesystem lists it, without scheme or leading ``/`` (compared, never opened)."""
    return (path.split("://", 1)[1] if "://" in path else path).lstrip("/")
