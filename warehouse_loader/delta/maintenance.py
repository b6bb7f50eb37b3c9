"""Maintenance of one Delta table with delta-rs: the Delta side of :mod:`warehouse_loader.maintenance`.

* **compact**: the small files, and the files deletion vectors removed a share of rows from,
  are rewritten without the removed rows, in bins of the target size, in one commit that
  removes them and adds the new files (``dataChange: false``: streaming readers of the table
  see no new data), locally and on S3 (:mod:`warehouse_loader.delta.table_files`). On another
  object store delta-rs's ``optimize.compact`` packs small files (it keeps deletion vectors
  exact when it rewrites a file: tested).
* **checkpoint**: ``create_checkpoint`` (delta-rs also writes one by itself every
  ``delta.checkpointInterval`` commits, 100 by default, in the committing process).
* **expire**: the table's ``delta.logRetentionDuration`` and
  ``delta.deletedFileRetentionDuration`` are set to the retention (one metadata commit,
  when they differ), then a *full* ``vacuum`` removes every file no version inside the
  retention references and older than it (files that later versions replaced, and files a
  killed writer left without committing them), and the log files of versions older than
  the retention go, keeping the checkpoint the oldest retained version starts from
  (:meth:`DeltaMaintainer._expire_log`; delta-rs's own log cleanup is turned off). Files
  under ``_``-prefixed directories (``_hw_tombstones``, ``_delta_log``) are never vacuumed
  by delta-rs.

Every commit made here carries the table's recorded key (``headwater.key``), as the
loader's do, so the key check of the next load still finds it in the latest commit.
"""

from __future__ import annotations

import math
import posixpath
import time
from collections import Counter
from typing import Any

import orjson
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.fs as pafs  # type: ignore[import-untyped]
from deltalake import CommitProperties, DeltaTable

from warehouse_loader.delta import add_actions, log_entry
from warehouse_loader.delta.deletion_vectors import DV_DIR, referenced_files
from warehouse_loader.delta.merge_on_read import conform
from warehouse_loader.delta.scan import deleted_rows
from warehouse_loader.delta.table import open_delta
from warehouse_loader.delta.table_files import TableFiles, table_files
from warehouse_loader.delta.writer import KEY_METADATA, recorded_key
from warehouse_loader.duckdb_connection import duckdb_connection
from warehouse_loader.location import TableLocation, storage_error
from warehouse_loader.maintenance import TableShape, pack
from warehouse_loader.sql_text import sql_list

#: What marks a commit as maintenance (custom commit metadata).
MAINTENANCE_METADATA = "headwater.maintenance"
LOG_DIR = "_delta_log"
#: Arrow bytes a compaction holds at a time, in one batch of rows that becomes one Parquet row group
#: of the new file; rows per batch within these bounds. Small row groups cost file size, large ones
#: memory: rewriting 4M rows of ~410 bytes peaked at 1,968 MiB as one table, 848 MiB at this size
#: (a 7 % larger file), 545 MiB at 122,880 rows (21 % larger).
COMPACTION_BATCH_BYTES = 128 << 20
COMPACTION_BATCH_ROWS = (122_880, 1 << 20)


class DeltaMaintainer:
    """:class:`warehouse_loader.maintenance.TableMaintainer` for the Delta table at ``location``."""

    def __init__(self, location: TableLocation) -> None:
        self.location = location
        #: The table's files where Headwater writes them itself (local, S3), else None (delta-rs does).
        self.files = table_files(location)

    def _open(self) -> DeltaTable | None:
        return open_delta(self.location)

    def _commit(self, task: str) -> CommitProperties:
        custom = {MAINTENANCE_METADATA: task}
        key = recorded_key(self.location)
        if key is not None:
            custom[KEY_METADATA] = orjson.dumps(list(key)).decode()
        return CommitProperties(custom_metadata=custom)

    def shape(self, small_below: int) -> TableShape | None:
        """Files, bytes and small files of the current version; log entries since the newest checkpoint."""
        table = self._open()
        if table is None:
            return None
        files = table.get_add_actions(flatten=True)
        sizes = files.column("size_bytes").to_pylist()
        small = [size for size in sizes if size < small_below]
        checkpointed = self._last_checkpoint()
        version = table.version()
        return TableShape(
            version=version,
            files=len(sizes),
            bytes=int(sum(sizes)),
            small_files=len(small),
            small_bytes=int(sum(small)),
            commits_since_checkpoint=version - (checkpointed if checkpointed is not None else -1),
            rows=int(sum(n or 0 for n in files.column("num_records").to_pylist())),
            deleted_rows=self._removed_rows(table, version, [str(p) for p in files.column("path").to_pylist()]),
        )

    def _removed_rows(self, table: DeltaTable, version: int, paths: list[str]) -> int:
        """Rows deletion vectors remove from the current files ``paths``.

        The sum of the vectors' cardinalities (every descriptor records it) from the log
        alone: the loader asks after its merge-on-read batches (:class:`~warehouse_loader.maintenance.BuriedRows`),
        and delta-rs would read every vector. On another object store through delta-rs.
        """
        if self.files is not None:
            adds = add_actions.current_adds(self.files, version)
            if all(path in adds for path in paths):
                vectors = [adds[path].get("deletionVector") or {} for path in paths]
                if all("cardinality" in vector for vector in vectors if vector):
                    return sum(int(vector["cardinality"]) for vector in vectors if vector)
        gone = deleted_rows(table)
        return 0 if gone is None else gone.num_rows

    def _last_checkpoint(self) -> int | None:
        """The version of the newest checkpoint (``_delta_log/_last_checkpoint``), or None."""
        fs, root = self.location.filesystem()
        try:
            with fs.open_input_stream(posixpath.join(root, LOG_DIR, "_last_checkpoint")) as stream:
                return int(orjson.loads(stream.read())["version"])
        except FileNotFoundError:
            return None
        except OSError as exc:
            if "not found" in str(exc).lower() or "no such file" in str(exc).lower():
                return None
            raise storage_error(exc, self.location) from None

    def compact(self, target_file_size: int, small_below: int, purge_share: float) -> tuple[int, int, int]:
        """Rewrite the small files, and files with ``purge_share`` of their rows removed, into files of the target size.

        A local or S3 table is rewritten here, in one commit (``OPTIMIZE``, ``dataChange: false``): only
        the chosen files, so a table's large files are not rewritten with its small ones (delta-rs's
        bin-packing takes every file below the target size, and never a large file whatever its
        deletion vector holds). On another object store delta-rs's ``optimize.compact`` packs the small files.
        """
        table = self._open()
        if table is None:
            return 0, 0, 0
        if self.files is None:
            metrics = table.optimize.compact(target_size=target_file_size, commit_properties=self._commit("compact"))
            added = orjson.loads(metrics.get("filesAdded", "{}"))
            removed, written = int(metrics.get("numFilesRemoved", 0)), int(metrics.get("numFilesAdded", 0))
            return removed, written, int(added.get("totalSize", 0))
        files = table.get_add_actions(flatten=True)
        sizes = dict(zip(files.column("path").to_pylist(), files.column("size_bytes").to_pylist(), strict=True))
        physical = dict(zip(files.column("path").to_pylist(), files.column("num_records").to_pylist(), strict=True))
        gone = deleted_rows(table)
        removed_per_file = Counter(
            self.files.relative(uri) for uri in ([] if gone is None else gone.column("__hw_file").to_pylist())
        )
        small = [path for path, size in sizes.items() if size < small_below]
        heavy = [path for path, count in removed_per_file.items() if count >= purge_share * (physical.get(path) or 1)]
        bins = pack(sizes, set((small if len(small) >= 2 else []) + heavy), target_file_size)
        return self._rewrite(table, bins, gone) if bins else (0, 0, 0)

    def _rewrite(self, table: DeltaTable, bins: list[list[str]], gone: pa.Table | None) -> tuple[int, int, int]:
        """One commit replacing each bin of files by one file of their rows (removed rows left out)."""
        store = self.files
        assert store is not None, "a rewrite on a store without conditional writes (compact() says so)"
        current = add_actions.current_adds(store, table.version())
        schema = pa.schema(table.schema().to_arrow())
        gone = (
            gone
            if gone is not None
            else pa.table({"__hw_file": pa.array([], pa.string()), "pos": pa.array([], pa.int64())})
        )
        now = int(time.time() * 1000)
        actions: list[dict[str, Any]] = []
        written = 0
        con = duckdb_connection([self.location])
        try:
            con.register("gone", gone)
            for paths in bins:
                uris = [store.uri(path) for path in paths]
                options = "filename = '__hw_file', file_row_number = true, union_by_name = true"
                # Streamed: one batch of rows in memory at a time, whatever the bin's size (the whole
                # bin as one Arrow table peaked at ~1.25 GB rewriting 1M rows of ~450 bytes).
                reader = con.sql(
                    f"SELECT t.* EXCLUDE (__hw_file, file_row_number) FROM read_parquet({sql_list(uris)}, {options}) t "
                    "ANTI JOIN gone g ON g.__hw_file = t.__hw_file AND g.pos = t.file_row_number"
                ).to_arrow_reader(_batch_rows(store, paths))
                added = log_entry.write_data_file_batches(
                    store,
                    schema,
                    (conform(pa.Table.from_batches([batch]), schema) for batch in reader),
                    data_change=False,
                )
                for path in paths:
                    old = current[path]
                    remove = {
                        "path": old["path"],
                        "deletionTimestamp": now,
                        "dataChange": False,
                        "extendedFileMetadata": True,
                        "partitionValues": old.get("partitionValues", {}),
                        "size": old["size"],
                        "deletionVector": old.get("deletionVector"),
                    }
                    actions.append({"remove": {k: v for k, v in remove.items() if v is not None}})
                if added is not None:
                    actions.append({"add": added})
                    written += int(added["size"])
        finally:
            con.close()
        metadata = self._commit("compact").custom_metadata or {}
        removed = sum(len(paths) for paths in bins)
        added_files = sum(1 for action in actions if "add" in action)
        metrics = {"numFilesRemoved": removed, "numFilesAdded": added_files}
        log_entry.commit(store, table.version() + 1, actions, operation="OPTIMIZE", metrics=metrics, metadata=metadata)
        return removed, added_files, written

    def checkpoint(self) -> bool:
        """A checkpoint at the current version (False: no table)."""
        table = self._open()
        if table is None:
            return False
        table.create_checkpoint()
        return True

    def expire(self, retention_s: float) -> tuple[int, int, int]:
        """Full vacuum and log cleanup past ``retention_s``; deletion vector files no kept version uses."""
        table = self._open()
        if table is None:
            return 0, 0, 0
        interval = f"interval {math.ceil(retention_s)} seconds"
        wanted = {
            "delta.logRetentionDuration": interval,
            "delta.deletedFileRetentionDuration": interval,
            # delta-rs's own cleanup (after its checkpoints) can leave versions inside the
            # retention unreadable: :meth:`_expire_log` keeps what they need instead.
            "delta.enableExpiredLogCleanup": "false",
        }
        configured = table.metadata().configuration
        if any(configured.get(name) != value for name, value in wanted.items()):
            table.alter.set_table_properties(wanted, commit_properties=self._commit("retention"))
            table = self._open()
            assert table is not None
        # delta-rs's vacuum counts whole hours: round up (keeps more); under an hour (a floor
        # lowered on purpose) keep the files of every version committed inside the retention.
        hours = math.ceil(retention_s / 3600) if retention_s >= 3600 else 0
        keep = None if hours else self._versions_since(table, time.time() - retention_s)
        options: dict[str, Any] = {"retention_hours": hours, "enforce_retention_duration": False, "full": True}
        doomed = table.vacuum(dry_run=True, keep_versions=keep, **options)
        # It also lists files an earlier vacuum removed (their tombstones stay until log cleanup):
        # vacuum only when a listed file is still there, as an empty vacuum still commits twice.
        present, freed = self._sizes(doomed)
        removed = (
            []
            if not present
            else table.vacuum(dry_run=False, keep_versions=keep, commit_properties=self._commit("vacuum"), **options)
        )
        expired = self._expire_log(retention_s)
        files, dv_bytes = self._collect_deletion_vectors(retention_s)
        return (present if removed else 0) + files, freed + dv_bytes, expired

    def _expire_log(self, retention_s: float) -> int:
        """Remove the log files no version inside ``retention_s`` needs; how many JSON entries went.

        The protocol's metadata cleanup: the cutoff commit is the newest one older than the
        retention (by file time), the cutoff checkpoint the newest checkpoint at or before it;
        every log file of an earlier version goes. Every version from the cutoff checkpoint on
        stays readable (that checkpoint plus the entries after it). delta-rs's
        ``cleanup_metadata`` deletes by age alone, which left versions inside the retention
        without a checkpoint to start from (measured: ``No files in log segment``).
        """
        fs, root = self.location.filesystem()
        log_dir = posixpath.join(root, LOG_DIR)
        infos = [
            i
            for i in fs.get_file_info(pafs.FileSelector(log_dir, allow_not_found=True))
            if i.type == pafs.FileType.File
        ]
        cutoff = time.time() - retention_s
        versions: dict[int, list[pafs.FileInfo]] = {}
        commits, checkpoints = {}, set()
        for info in infos:
            head = info.base_name.split(".", 1)[0]
            if not head.isdigit() or len(head) != 20:
                continue  # _last_checkpoint, staging files
            number = int(head)
            versions.setdefault(number, []).append(info)
            if info.base_name.endswith(".json"):
                commits[number] = info.mtime.timestamp() if info.mtime is not None else time.time()
            elif ".checkpoint." in info.base_name and info.base_name.endswith(".parquet"):
                checkpoints.add(number)
        old = [number for number, at in commits.items() if at <= cutoff]
        if not old:
            return 0
        usable = [number for number in checkpoints if number <= max(old)]
        if not usable:
            return 0
        keep_from = max(usable)
        doomed = [info for number, files in versions.items() if number < keep_from for info in files]
        for info in doomed:
            fs.delete_file(info.path)
        return sum(1 for info in doomed if info.base_name.endswith(".json"))

    def _collect_deletion_vectors(self, retention_s: float) -> tuple[int, int]:
        """Remove deletion vector files (``_hw_dv/``) no version left in the log uses, older than ``retention_s``.

        delta-rs's vacuum skips ``_``-prefixed directories; run after :meth:`_expire_log`, so
        the log holds exactly the versions still readable.
        """
        if self.files is None:
            return 0, 0
        stored = [
            info
            for info in self.files.listing(DV_DIR)
            if info.base_name.startswith("deletion_vector_") and info.base_name.endswith(".bin")
        ]
        if not stored:
            return 0, 0
        used = referenced_files(self.files)
        cutoff = time.time() - retention_s
        removed, freed = 0, 0
        for info in stored:
            written = info.mtime.timestamp() if info.mtime is not None else time.time()
            if info.base_name not in used and written < cutoff:
                self.files.delete(f"{DV_DIR}/{info.base_name}")
                removed, freed = removed + 1, freed + int(info.size or 0)
        return removed, freed

    @staticmethod
    def _versions_since(table: DeltaTable, since_s: float) -> list[int]:
        """Versions committed at or after ``since_s`` (Unix time), newest first, and the one before them.

        The one before is the version that was current at ``since_s``: readable until then.
        """
        kept: list[int] = []
        for commit in table.history(10_000):
            kept.append(int(commit["version"]))
            if commit.get("timestamp", 0) / 1000 < since_s:
                break
        return kept

    def _sizes(self, relative: list[str]) -> tuple[int, int]:
        """How many of the files at ``relative`` paths (as vacuum lists them) are there, and their bytes."""
        if not relative:
            return 0, 0
        fs, root = self.location.filesystem()
        infos = fs.get_file_info([posixpath.join(root, path) for path in set(relative)])
        present = [info.size or 0 for info in infos if info.type == pafs.FileType.File]
        return len(present), int(sum(present))


def _batch_rows(store: TableFiles, paths: list[str]) -> int:
    """Rows per compaction batch for these files: :data:`COMPACTION_BATCH_BYTES` at their mean uncompressed width."""
    rows = width = 0
    for path in paths:
        footer = store.metadata(path)
        rows += footer.num_rows
        width += sum(footer.row_group(i).total_byte_size for i in range(footer.num_row_groups))
    low, high = COMPACTION_BATCH_ROWS
    return max(low, min(high, COMPACTION_BATCH_BYTES * rows // max(1, width)))
