"""Delta tables a writer keeps open from one batch to its next, reading only the commits made since.

Opening a Delta table reads its log from the last checkpoint: up to a hundred JSON commits
(delta-rs checkpoints every 100). A streaming load writes each of its tables once per
micro-batch, each batch a commit, and it opened the table afresh every batch: of a one-row
batch's CPU, that was ~7 of 24 ms (SCD1) and ~8 of 46 ms (SCD2) (bench/RESULTS.md). The
writer now puts a table it wrote to back here (:func:`keep`) and takes it at its next batch
(:func:`take`), brought to the latest version with ``update_incremental``: its own commits,
and any that another process (``maintain``'s compactions) made meanwhile.

A kept table goes to one caller at a time (taken out, put back after a successful write),
and only while the commit file of its version is still the file it was kept with (inode,
size and modification time): a table deleted and created again (``reprocess``) is opened
afresh, as is one whose update fails. Local tables only: that check is a ``stat``.
"""

from __future__ import annotations

import os
import threading

from deltalake import DeltaTable
from deltalake.exceptions import DeltaError

from warehouse_loader.delta.table import open_delta
from warehouse_loader.location import TableLocation

#: A local table's URI -> the kept table and the identity of its version's commit file.
_KEPT: dict[str, tuple[DeltaTable, tuple[int, int, int]]] = {}
_LOCK = threading.Lock()


def _identity(location: TableLocation, table: DeltaTable) -> tuple[int, int, int] | None:
    """Inode, size and modification time of the commit file of ``table``'s version (None: not there)."""
    try:
        stat = os.stat(location.path / "_delta_log" / f"{table.version():020d}.json")
    except OSError:
        return None
    return stat.st_ino, stat.st_size, stat.st_mtime_ns


def take(location: TableLocation) -> DeltaTable | None:
    """The Delta table at ``location`` at its latest version, or None when there is none (yet)."""
    if not location.is_remote:
        with _LOCK:
            kept = _KEPT.pop(location.uri, None)
        if kept is not None:
            table, identity = kept
            if _identity(location, table) == identity:
                try:
                    table.update_incremental()
                except (DeltaError, OSError):
                    pass  # opened afresh below
                else:
                    return table
    return open_delta(location)


def keep(location: TableLocation, table: DeltaTable | None) -> None:
    """Keep ``table`` (taken from :func:`take`, written without error) for the next :func:`take` of ``location``."""
    if table is None or location.is_remote:
        return
    identity = _identity(location, table)
    if identity is not None:
        with _LOCK:
            _KEPT[location.uri] = (table, identity)
