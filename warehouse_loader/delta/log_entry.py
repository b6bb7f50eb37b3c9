"""Hand-written Delta log entries: a data file and its add action, and one atomic commit.

What delta-rs's Python API cannot express (an add action carrying a deletion vector, a
remove naming one) is committed here, as the protocol writes it: one JSON line per action
in ``_delta_log/<version>.json``, created by :meth:`~warehouse_loader.delta.table_files.TableFiles.create`
(put-if-absent: ``link`` from a fsynced staging file locally, a conditional ``PutObject`` on
S3), so the entry appears whole or not at all and an existing version is never overwritten.
After every :data:`CHECKPOINT_INTERVAL` versions a checkpoint is written, as delta-rs does
after its own commits.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from typing import Any

import orjson
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]
import pyarrow.parquet as pq  # type: ignore[import-untyped]
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError

from warehouse_loader.delta import add_actions
from warehouse_loader.delta.table_files import TableFiles

#: ``engineInfo`` of the entries written here.
ENGINE = "headwater merge-on-read"
#: delta-rs's default: a checkpoint every this many commits (it writes them after its own commits).
CHECKPOINT_INTERVAL = 100


def write_data_file(files: TableFiles, rows: pa.Table, *, data_change: bool = True) -> dict[str, Any]:
    """Write ``rows`` (at least one) as a new data file; its add action (record count, null counts, integer bounds)."""
    added = write_data_file_batches(files, rows.schema, [rows], data_change=data_change)
    assert added is not None, "a data file of no rows"
    return added


def write_data_file_batches(
    files: TableFiles, schema: pa.Schema, batches: Iterable[pa.Table | pa.RecordBatch], *, data_change: bool = True
) -> dict[str, Any] | None:
    """:func:`write_data_file` for rows that arrive in batches: one row group per batch, one batch held at a time.

    None (and no file) when the batches hold no row. The file is durable before its add action is returned.
    """
    name = f"part-00000-{uuid.uuid4()}-c000.hw.zstd.parquet"
    stats = _Stats(schema)
    with files.output(name) as stream:
        with pq.ParquetWriter(stream, schema, compression="zstd") as writer:
            for batch in batches:
                if batch.num_rows:
                    writer.write(batch)
                    stats.add(batch)
        size = stream.tell()
    if stats.rows == 0:
        files.delete(name)
        return None
    return {
        "path": name,
        "partitionValues": {},
        "size": size,
        "modificationTime": int(time.time() * 1000),
        "dataChange": data_change,
        "stats": stats.json(),
    }


class _Stats:
    """An add action's statistics, gathered over one or more pieces of a file's rows."""

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema
        self.rows = 0
        self.nulls: dict[str, int] = {f.name: 0 for f in schema if not pa.types.is_nested(f.type)}
        self.low: dict[str, Any] = {}
        self.high: dict[str, Any] = {}

    def add(self, rows: pa.Table | pa.RecordBatch) -> None:
        self.rows += rows.num_rows
        for field in self.schema:
            if pa.types.is_nested(field.type):
                continue
            column = rows.column(field.name)
            self.nulls[field.name] += column.null_count
            if pa.types.is_integer(field.type) and column.null_count < rows.num_rows:
                bounds = pc.min_max(column)
                low, high = bounds["min"].as_py(), bounds["max"].as_py()
                self.low[field.name] = min(low, self.low.get(field.name, low))
                self.high[field.name] = max(high, self.high.get(field.name, high))

    def json(self) -> str:
        stats = {"numRecords": self.rows, "nullCount": self.nulls, "minValues": self.low, "maxValues": self.high}
        return orjson.dumps(stats).decode()


def commit(
    files: TableFiles,
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
        "txnId": str(uuid.uuid4()),  # makes the entry's bytes ours alone (TableFiles.create on S3)
        **metadata,
    }
    lines: list[dict[str, Any]] = [{"commitInfo": info}]
    if transaction is not None:
        lines.append({"txn": {"appId": transaction[0], "version": transaction[1], "lastUpdated": now}})
    lines.extend(actions)
    entry = b"\n".join(orjson.dumps(line) for line in lines) + b"\n"
    if not files.create(f"{add_actions.LOG_DIR}/{number:020d}.json", entry):
        add_actions.forget(files)
        msg = f"Version {number} already exists (another writer committed first)"
        raise CommitFailedError(msg)
    if number % CHECKPOINT_INTERVAL == 0:
        DeltaTable(files.location.uri, storage_options=files.location.storage_options).create_checkpoint()
