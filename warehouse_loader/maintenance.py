"""Table maintenance policy: when a warehouse table is compacted, checkpointed and vacuumed; format-neutral.

A streamed table commits every second: each commit adds files and a log entry, and every
file a MERGE rewrote stays on disk until something removes it. Maintenance keeps the
table's shape near that of a freshly written table:

* **compaction** rewrites small files into files of ``target_file_size``;
* **checkpoints** fold the log into one file, so opening the table reads a checkpoint
  plus at most ``checkpoint_interval`` entries (Iceberg: the manifest list into one manifest
  per content);
* **expiry** removes what no version inside ``retention_s`` needs: files that later
  versions replaced (vacuum) and log entries older than that (old versions).

What each table format does for these is its :class:`TableMaintainer` (Delta:
:mod:`warehouse_loader.delta.maintenance`; Iceberg: :mod:`warehouse_loader.iceberg.maintenance`,
which rewrites data files and folds position deletes, rewrites the manifest list as its
checkpoint, expires snapshots and removes orphan files). What is decided here is the same for
every format: :func:`plan` reads a table's :class:`TableShape` and the settings
(:class:`core.warehouse_config.MaintenanceConfig`) and says what to run.

What must never be removed (the retention rule, :func:`effective_retention_s`):

* **the current version**, whatever its age: expiry removes only files a *later* version
  no longer references, and log entries older than the newest checkpoint;
* **what a reader holds**: ``headwater verify`` reads one version for several rounds and
  a daily backfill reads the versions it rebuilds before committing; each holds the
  table's reader lease (:mod:`core.table_leases`), and expiry skips a table
  while any reader holds it. Compaction and expiry run under the table's commit lease,
  the one the loader and backfills commit under, so they never race a commit;
* **time travel**: versions younger than ``retention_s``, and never less than
  :data:`RETENTION_FLOOR_S`, which covers readers that take no lease (``query``, the
  quality report, Dagster's metadata) and loads from the log (a ``reprocess`` builds a
  new table version from the log and switches readers to it; it needs nothing of the old
  version's history, and a version being built is not current, so it is not maintained
  until it is).
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from core.warehouse_config import MaintenanceConfig

#: Expiry never removes anything younger than this (seconds), whatever ``retention_s`` says:
#: readers that take no lease (``query``, quality, Dagster) read one version for seconds.
RETENTION_FLOOR_S = 3600.0
#: Overrides :data:`RETENTION_FLOOR_S` (seconds): for tests that watch vacuum work, and operators
#: who know every reader of their tables.
RETENTION_FLOOR_ENV = "HEADWATER_RETENTION_FLOOR_S"


@dataclass(frozen=True, slots=True)
class TableShape:
    """What maintenance looks at: a table's files, its log since the last checkpoint, its last maintenance."""

    version: int
    files: int
    bytes: int
    #: Files (and their bytes) below half the target file size: what compaction would rewrite.
    small_files: int
    small_bytes: int
    #: Log entries written after the newest checkpoint (Iceberg, which has no log: manifests of the
    #: current snapshot beyond one per content, what its checkpoint, a manifest rewrite, removes).
    commits_since_checkpoint: int
    #: Rows in the files, and those of them deletion vectors (or delete files) remove.
    rows: int = 0
    deleted_rows: int = 0
    last_compaction: dt.datetime | None = None
    last_vacuum: dt.datetime | None = None

    @property
    def deleted_share(self) -> float:
        """Share of the rows in the files that are removed (merge-on-read garbage every reader skips)."""
        return self.deleted_rows / self.rows if self.rows else 0.0

    @property
    def dirty_ratio(self) -> float:
        """Share of the table that compaction would clean: bytes in small files (two or more) plus removed rows."""
        small = self.small_bytes / self.bytes if self.bytes and self.small_files >= 2 else 0.0
        return min(1.0, small + self.deleted_share)


@dataclass(frozen=True, slots=True)
class Plan:
    """What one maintenance pass of a table runs, and why (``reasons``: one phrase per task)."""

    compact: bool = False
    checkpoint: bool = False
    expire: bool = False
    reasons: tuple[str, ...] = field(default=())

    @property
    def idle(self) -> bool:
        """Nothing to run."""
        return not (self.compact or self.checkpoint or self.expire)


@dataclass(frozen=True, slots=True)
class Done:
    """What a maintenance pass did to one table (the part that a format reports)."""

    table: str
    compacted_files: int = 0
    written_files: int = 0
    rewritten_bytes: int = 0
    checkpointed: bool = False
    vacuumed_files: int = 0
    vacuumed_bytes: int = 0
    expired_log_entries: int = 0
    #: Why expiry was put off (a reader holds the table), or None.
    deferred: str | None = None

    @property
    def idle(self) -> bool:
        """Nothing was done (and nothing put off)."""
        return self.describe().endswith(": nothing to do")

    def describe(self) -> str:
        """One line for the stage's log."""
        parts = []
        if self.compacted_files:
            parts.append(
                f"compacted {self.compacted_files} files into {self.written_files} ({self.rewritten_bytes:,} B)"
            )
        if self.checkpointed:
            parts.append("checkpointed")
        if self.vacuumed_files or self.expired_log_entries:
            parts.append(
                f"vacuumed {self.vacuumed_files} files ({self.vacuumed_bytes:,} B), "
                f"expired {self.expired_log_entries} log entries"
            )
        if self.deferred:
            parts.append(f"expiry deferred: {self.deferred}")
        return f"{self.table}: {', '.join(parts) if parts else 'nothing to do'}"


class TableMaintainer(Protocol):
    """One table format's maintenance operations on one table.

    Contract: each operation is atomic for readers (a reader sees the table before or after
    it, with the same rows either way) and safe to kill at any point (a killed compaction
    leaves unreferenced files that a later vacuum removes once older than the retention).
    The caller holds the table's commit lease around :meth:`compact` and :meth:`expire`.
    """

    def shape(self, small_below: int) -> TableShape | None:
        """The table's shape (None: no table yet); files under ``small_below`` bytes count as small."""
        ...

    def compact(self, target_file_size: int, small_below: int, purge_share: float) -> tuple[int, int, int]:
        """Pack files under ``small_below`` bytes; rewrite files with ``purge_share`` of their rows removed.

        Returns (files removed, files added, bytes written); files come out near ``target_file_size``.
        """
        ...

    def checkpoint(self) -> bool:
        """Fold the log into a checkpoint at the current version; False when there was nothing to fold."""
        ...

    def expire(self, retention_s: float) -> tuple[int, int, int]:
        """Remove replaced files and log entries older than ``retention_s``: (files, bytes, log entries)."""
        ...


def effective_retention_s(settings: MaintenanceConfig) -> float:
    """How far back versions stay readable: ``retention_s``, never under :data:`RETENTION_FLOOR_S`."""
    floor = float(os.environ.get(RETENTION_FLOOR_ENV, RETENTION_FLOOR_S))
    return max(settings.retention_s, floor)


def small_file_size(settings: MaintenanceConfig) -> int:
    """Files below this many bytes (a sixteenth of the target) are small: compaction packs them.

    Not half the target: a table smaller than the target would then be one small file and be
    rewritten whole at every compaction, which is the copy-on-write cost this avoids. A
    packed file still under the size is packed again with later ones (a row is rewritten a
    few times until its file is large enough to be left alone).
    """
    return settings.target_file_size // 16


def pack(sizes: Mapping[str, int], chosen: Iterable[str], target_file_size: int) -> list[list[str]]:
    """The ``chosen`` files (``sizes``: bytes by path), smallest first, in bins of up to ``target_file_size`` bytes.

    Compaction writes one file per bin; a file larger than the target is a bin of its own.
    """
    bins: list[list[str]] = [[]]
    for path in sorted(chosen, key=lambda each: sizes[each]):
        if bins[-1] and sum(sizes[p] for p in bins[-1]) + sizes[path] > target_file_size:
            bins.append([])
        bins[-1].append(path)
    return bins if bins[0] else []


def plan(shape: TableShape, settings: MaintenanceConfig, now: dt.datetime) -> Plan:
    """What to run on a table of ``shape`` now (pure: unit-tested without a table).

    * compact when ``compact_min_small_files`` files are small, or when at least two are
      and they hold ``compact_dirty_ratio`` of the bytes, or when ``compact_dirty_ratio`` of the
      rows are removed ones (merge-on-read: each commit restates the deletion vectors of the
      files it touches, so their size is a per-batch cost; compaction rewrites those files);
    * checkpoint after ``checkpoint_interval`` commits since the last checkpoint, and
      after a compaction (run last, so the checkpoint covers its commit; the caller also
      checkpoints after a vacuum that removed something);
    * expire once per ``interval_s`` (at least once an hour), so what the retention lets go
      is freed within an interval of growing old.
    """
    reasons = []
    every = min(settings.interval_s, 3600.0)
    compact = shape.small_files >= settings.compact_min_small_files or (
        shape.small_files >= 2 and shape.dirty_ratio >= settings.compact_dirty_ratio
    )
    expire = shape.last_vacuum is None or (now - shape.last_vacuum).total_seconds() >= every
    compact = compact or shape.deleted_share >= settings.compact_dirty_ratio
    if compact:
        reasons.append(
            f"{shape.small_files} small files, {shape.deleted_share:.0%} of rows removed ({shape.bytes:,} B)"
        )
    # Also after a compaction (the caller checkpoints after a vacuum that removed something).
    checkpoint = compact or shape.commits_since_checkpoint >= settings.checkpoint_interval
    if checkpoint and not compact:
        reasons.append(f"{shape.commits_since_checkpoint} commits since the last checkpoint")
    if expire:
        reasons.append("expiry due")
    return Plan(compact=compact, checkpoint=checkpoint, expire=expire, reasons=tuple(reasons))


#: The loader compacts a merge-on-read table itself once deletion vectors remove this share of
#: the rows in its files (:class:`BuriedRows`); the maintenance stage's own threshold,
#: ``compact_dirty_ratio``, is lower and normally acts first.
BURIED_SHARE = 0.5
#: ... and looks after its batches changed this share of the table's live rows since it last
#: looked: a look reads the table's file list (Iceberg: its delete files), too much for every
#: batch of a trickle, and a share of at most this many removed rows is added in between.
LOOK_EVERY_SHARE = 0.2
#: ... and never before this many changes: fewer cannot bury enough rows to matter.
LOOK_AFTER_CHANGES = 20_000


class BuriedRows:
    """The loader's own compaction when removed rows pile up in a merge-on-read table.

    A merge-on-read batch reads, for each key it changes, every version of that key still in
    the files, removed ones included, and sorts them out by the deletion vectors (Iceberg:
    position deletes): its memory and time grow with the removed versions. Where nothing
    compacts in between (``headwater load`` over a backlog with no ``maintain`` stage beside
    it, or batches burying rows faster than the stage's ``interval_s``) each batch would cost
    more than the one before. After its commits (:meth:`after_commit`, with the table's commit
    lease held) the loader therefore looks at the table's shape once its batches changed
    :data:`LOOK_EVERY_SHARE` of the live rows (and at least :data:`LOOK_AFTER_CHANGES`), and
    compacts when removed rows reach :data:`BURIED_SHARE` of all: a batch then reads at most
    about two versions per live row.
    """

    def __init__(self, maintainer: TableMaintainer, settings: MaintenanceConfig) -> None:
        self._maintainer = maintainer
        self._settings = settings
        self._live: int | None = None
        self._since = 0

    def after_commit(self, changes: int) -> tuple[int, int, int] | None:
        """Count a committed batch of ``changes`` rows; compact when due. What compaction did, or None."""
        self._since += changes
        if self._since < max(LOOK_AFTER_CHANGES, (self._live or 0) * LOOK_EVERY_SHARE):
            return None
        small_below = small_file_size(self._settings)
        shape = self._maintainer.shape(small_below)
        if shape is None:
            return None
        self._live, self._since = shape.rows - shape.deleted_rows, 0
        if shape.deleted_share < BURIED_SHARE:
            return None
        return self._maintainer.compact(
            self._settings.target_file_size, small_below, self._settings.compact_dirty_ratio
        )


class PiledFiles:
    """The loader's own compaction when its commits pile up files between maintenance passes.

    A merge-on-read Iceberg batch adds a data file and a position-delete file; a batch of new
    keys adds a data file either way. Every query and the next batch's plan open and merge all
    of them, so between the stage's passes read time grows with the batches since the last one
    (issue 34: 9x a fresh table's 20 batches after a pass). After each commit (:meth:`after_commit`,
    with the table's commit lease held) the loader counts the live files the commit reports
    (:attr:`~warehouse_loader.table_format.WriteResult.files`, from metadata it already holds),
    and once they are ``compact_min_small_files`` more than after its last compaction (the
    stage's own threshold) it compacts: the small files packed, files with
    ``compact_dirty_ratio`` of their rows removed rewritten, the other deletes carried in one
    file. What the stage would do at its next pass, done when the table's state asks, not the
    clock. A format that reports no file count (Delta) is left to :class:`BuriedRows` and the stage.
    """

    def __init__(self, maintainer: TableMaintainer, settings: MaintenanceConfig) -> None:
        self._maintainer = maintainer
        self._settings = settings
        #: Live files after the last compaction (or at the first commit seen), None before.
        self._base: int | None = None

    def after_commit(self, files: int | None) -> tuple[int, int, int] | None:
        """Count a commit that left ``files`` live files; compact when due. What compaction did, or None."""
        if files is None:
            return None
        if self._base is None or files < self._base:  # first look, or another writer compacted
            self._base = files
        if files - self._base < self._settings.compact_min_small_files:
            return None
        done = self._maintainer.compact(
            self._settings.target_file_size, small_file_size(self._settings), self._settings.compact_dirty_ratio
        )
        removed, added, _ = done
        # Files compaction left alone (large ones, or none) are the new base: never looked at again each batch.
        self._base = files - removed + added
        return done
