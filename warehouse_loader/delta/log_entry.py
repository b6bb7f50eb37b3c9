"""Hand-written Delta log entries: a data file and its add action, and one atomic commit.

What delta-rs's Python API cannot express (an add action carrying a deletion vector, a
remove naming one) is committed here, as the protocol writes it: one JSON line per action
in ``_delta_log/<version>.json``, created with ``link`` from a fsynced staging file so
the entry appears whole or not at all and an existing version is never overwritten
(put-if-absent on a local filesystem). After every :data:`CHECKPOINT_INTERVAL` versions a
checkpoint is written, as delta-rs does after its own commits.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]
import pyarrow.parquet as pq  # type: ignore[import-untyped]
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError

from warehouse_loader.delta import add_actions

#: ``engineInfo`` of the entries written here.
ENGINE = "headwater merge-on-read"
#: delta-rs's default: a checkpoint every this many commits (it writes them after its own commits).
CHECKPOINT_INTERVAL = 100


def write_data_file(table_dir: Path, rows: pa.Table, *, data_change: bool = True) -> dict[str, Any]:
    """Write ``rows`` as a new data file of the table; its add action (record count, null counts, integer bounds)."""
    name = f"part-00000-{uuid.uuid4()}-c000.hw.zstd.parquet"
    path = table_dir / name
    pq.write_table(rows, path, compression="zstd")
    with path.open("rb") as handle:
        os.fsync(handle.fileno())
    stats: dict[str, Any] = {"numRecords": rows.num_rows, "nullCount": {}, "minValues": {}, "maxValues": {}}
    for field in rows.schema:
        column = rows.column(field.name)
        if pa.types.is_nested(field.type):
            continue
        stats["nullCount"][field.name] = column.null_count
        if pa.types.is_integer(field.type) and column.null_count < rows.num_rows:
            bounds = pc.min_max(column)
            stats["minValues"][field.name] = bounds["min"].as_py()
            stats["maxValues"][field.name] = bounds["max"].as_py()
    return {
        "path": name,
        "partitionValues": {},
        "size": path.stat().st_size,
        "modificationTime": int(time.time() * 1000),
        "dataChange": data_change,
        "stats": orjson.dumps(stats).decode(),
    }


def commit(
    table_dir: Path,
    number: int,
    actions: list[dict[str, Any]],
    *,
    operation: str,
    metrics: dict[str, int],
    metadata: dict[str, str],
    transaction: tuple[str, int] | None = None,
) -> None:
    """Write log entry ``number`` (``actions`` after a commitInfo and the app ``transaction``) atomically.

    Raises :class:`~deltalake.exceptions.CommitFailedError` when the entry exists (another writer won).
    """
    now = int(time.time() * 1000)
    info = {
        "timestamp": now,
        "operation": operation,
        "operationParameters": {"mode": "merge-on-read"},
        "operationMetrics": metrics,
        "engineInfo": ENGINE,
        "isBlindAppend": False,
        **metadata,
    }
    lines: list[dict[str, Any]] = [{"commitInfo": info}]
    if transaction is not None:
        lines.append({"txn": {"appId": transaction[0], "version": transaction[1], "lastUpdated": now}})
    lines.extend(actions)
    log_dir = table_dir / "_delta_log"
    staged = log_dir / f".{number:020d}.json.{uuid.uuid4().hex}.tmp"
    with staged.open("wb") as handle:
        handle.write(b"\n".join(orjson.dumps(line) for line in lines) + b"\n")
        handle.flush()
        os.fsync(handle.fileno())
    try:
        os.link(staged, log_dir / f"{number:020d}.json")  # fails when the version exists: put-if-absent
    except FileExistsError:
        add_actions.forget(table_dir)
        msg = f"Version {number} already exists (another writer committed first)"
        raise CommitFailedError(msg) from None
    finally:
        staged.unlink(missing_ok=True)
    fd = os.open(log_dir, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    if number % CHECKPOINT_INTERVAL == 0:
        DeltaTable(str(table_dir)).create_checkpoint()
