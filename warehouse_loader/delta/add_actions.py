"""The ``add`` action of each live data file of a Delta table, as its log states it.

delta-rs lists live files (``file_uris``) and their flattened statistics, but not the actions
themselves (their ``stats`` text, ``deletionVector`` descriptor, tags): a merge-on-read commit
restates a file's add action with a new deletion vector and must remove the old one by its
exact descriptor. This reads them from the newest checkpoint (``_last_checkpoint``) and the
JSON commits after it, keeping the last ``add`` of each path, and caches the result per table
so the next micro-batch reads only the commits made since.
"""

from __future__ import annotations

from typing import Any

import orjson

from warehouse_loader.delta.table_files import TableFiles

LOG_DIR = "_delta_log"
_CACHE: dict[str, tuple[int, dict[str, dict[str, Any]]]] = {}


def _checkpoint_adds(files: TableFiles) -> tuple[int, dict[str, dict[str, Any]]]:
    """(checkpoint version or -1, add actions by path) from the newest checkpoint."""
    try:
        pointer = orjson.loads(files.read(f"{LOG_DIR}/_last_checkpoint"))
    except FileNotFoundError:
        return -1, {}
    version = int(pointer["version"])
    parts = int(pointer.get("parts") or 0)
    names = (
        [f"{version:020d}.checkpoint.{i:010d}.{parts:010d}.parquet" for i in range(1, parts + 1)]
        if parts
        else [f"{version:020d}.checkpoint.parquet"]
    )
    adds: dict[str, dict[str, Any]] = {}
    for name in names:
        for row in files.parquet(f"{LOG_DIR}/{name}", ["add"]).column("add").to_pylist():
            if row is not None:
                adds[row["path"]] = _clean(row)
    return version, adds


def _clean(action: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint row as its JSON action: maps as objects, absent fields dropped."""
    out = {}
    for key, given in action.items():
        value = dict(given) if key in ("partitionValues", "tags") and isinstance(given, list) else given
        if isinstance(value, dict):
            value = {k: v for k, v in value.items() if v is not None}
        if value is not None:
            out[key] = value
    return out


def current_adds(files: TableFiles, version: int) -> dict[str, dict[str, Any]]:
    """The last ``add`` action of every path added up to ``version`` (paths as the log spells them).

    From the cached state when it is at or after the newest checkpoint, else from the
    checkpoint; a JSON entry that log cleanup removed meanwhile means a reload from the checkpoint.
    """
    key = files.location.uri
    cached = _CACHE.get(key)
    checkpoint = _checkpoint_version(files)
    if cached is not None and checkpoint <= cached[0] <= version:
        start, adds = cached[0], dict(cached[1])
    else:
        start, adds = _checkpoint_adds(files)
    try:
        _apply_entries(files, start, version, adds)
    except FileNotFoundError:
        start, adds = _checkpoint_adds(files)
        _apply_entries(files, start, version, adds)
    _CACHE[key] = (version, adds)
    return adds


def _checkpoint_version(files: TableFiles) -> int:
    try:
        return int(orjson.loads(files.read(f"{LOG_DIR}/_last_checkpoint"))["version"])
    except FileNotFoundError:
        return -1


def _apply_entries(files: TableFiles, start: int, version: int, adds: dict[str, dict[str, Any]]) -> None:
    """Apply the ``add`` actions of entries ``start + 1`` .. ``version`` to ``adds``."""
    for number in range(start + 1, version + 1):
        for line in files.read(f"{LOG_DIR}/{number:020d}.json").splitlines():
            if line.strip():
                action = orjson.loads(line)
                if "add" in action:
                    adds[action["add"]["path"]] = action["add"]


def forget(files: TableFiles) -> None:
    """Drop the cached actions of a table (after a failed commit, or in tests)."""
    _CACHE.pop(files.location.uri, None)
