"""The warehouse's table formats as the SCD suites see them: write a batch, read the rows back.

One suite runs on every format through :class:`TableFormat` (the ``table_format`` fixture
parametrises it): the same change batches, the same expected tables. A table is named by a
path ``<dir>/<name>``: Delta keeps it there; Iceberg registers ``<name>`` in an embedded SQLite
catalog under ``<dir>/iceberg`` with its files at the same path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest


@dataclass(frozen=True)
class TableFormat:
    """One table format's writer and readers, by table path."""

    name: str
    where: Callable[[Path], Any]
    write_batch: Callable[..., Any]
    write_scd1: Callable[..., Any]
    write_scd2: Callable[..., Any]
    committed_batch: Callable[[Any, str], int | None]
    rows: Callable[[Any], pa.Table]
    tombstones: Callable[[Any], pa.Table]
    #: How many commits the table (or its tombstones, ``side=True``) has: a replay must add none.
    commits: Callable[..., int]
    #: Make the main table's next commits fail with an I/O error (the side table's still succeed).
    break_main_commit: Callable[[pytest.MonkeyPatch], None]

    def __str__(self) -> str:
        return self.name


def _delta() -> TableFormat:
    from deltalake import DeltaTable

    from warehouse_loader.delta import writer as delta_writer

    def commits(path: Path, *, side: bool = False) -> int:
        return DeltaTable(str(path / delta_writer.TOMBSTONES_DIR if side else path)).version() + 1

    def break_main(patch: pytest.MonkeyPatch) -> None:
        patch.setattr(DeltaTable, "merge", lambda *_, **__: (_ for _ in ()).throw(OSError("disk gone")))

    return TableFormat(
        name="delta",
        where=lambda path: path,
        write_batch=delta_writer.write_batch,
        write_scd1=delta_writer.write_scd1,
        write_scd2=delta_writer.write_scd2,
        committed_batch=delta_writer.committed_batch,
        rows=lambda path: DeltaTable(str(path)).to_pyarrow_table(),
        tombstones=lambda path: DeltaTable(str(path / delta_writer.TOMBSTONES_DIR)).to_pyarrow_table(),
        commits=commits,
        break_main_commit=break_main,
    )


def _iceberg(write_mode: str = "copy-on-write") -> TableFormat:
    from pyiceberg.table import Transaction

    from warehouse_loader.iceberg import writer
    from warehouse_loader.iceberg.catalog import embedded_catalog
    from warehouse_loader.iceberg.commit import committed_batch, read_files
    from warehouse_loader.iceberg.scan import TableFiles
    from warehouse_loader.iceberg.table_ref import TOMBSTONES_SUFFIX, IcebergTableRef
    from warehouse_loader.location import TableLocation

    def where(path: Path) -> IcebergTableRef:
        return IcebergTableRef(embedded_catalog(path.parent), TableLocation(str(path.parent)), path.name)

    def rows(ref: IcebergTableRef) -> pa.Table:
        table = ref.load()
        assert table is not None, f"no Iceberg table {ref}"
        files = TableFiles.of(table)
        return read_files(ref, files, list(files.files))

    def commits(ref: IcebergTableRef, *, side: bool = False) -> int:
        table = (ref.tombstones if side else ref).load()
        return 0 if table is None else len(table.snapshots())

    def break_main(patch: pytest.MonkeyPatch) -> None:
        real = Transaction.commit_transaction

        def commit(self: Transaction) -> Any:
            if not self.table_metadata.location.endswith("_hw_tombstones") and TOMBSTONES_SUFFIX not in str(self):
                raise OSError("disk gone")
            return real(self)

        patch.setattr(Transaction, "commit_transaction", commit)

    if write_mode == "merge-on-read":
        # Every SCD1 batch as deletes + new rows, however large its share of the table: the
        # suite's tables are tiny, so the share rule would rewrite them all.
        writer.MERGE_ON_READ_MAX_SHARE = float("inf")

    merge_on_read = write_mode == "merge-on-read"

    def write_batch(*args: Any, **kwargs: Any) -> Any:
        return writer.write_batch(*args, merge_on_read=merge_on_read, **kwargs)

    def write_scd1(*args: Any, **kwargs: Any) -> Any:
        return writer.write_scd1(*args, merge_on_read=merge_on_read, **kwargs)

    return TableFormat(
        name="iceberg" if write_mode == "copy-on-write" else f"iceberg-{write_mode}",
        where=where,
        write_batch=write_batch,
        write_scd1=write_scd1,
        write_scd2=writer.write_scd2,
        committed_batch=lambda ref, app: committed_batch(ref.load(), app),
        rows=rows,
        tombstones=lambda ref: rows(ref.tombstones),
        commits=commits,
        break_main_commit=break_main,
    )


FORMATS = {"delta": _delta, "iceberg": _iceberg, "iceberg-mor": lambda: _iceberg("merge-on-read")}


def table_format(name: str) -> TableFormat:
    """The format called ``name``: ``delta``, ``iceberg`` or ``iceberg-mor`` (SCD1 merge-on-read)."""
    return FORMATS[name]()


def overwrite_rows(config: Any, name: str, rows: pa.Table) -> None:
    """Replace every row of warehouse table ``name`` with ``rows``, as a careless outside writer would.

    For tests that break a table on purpose (the SCD2 invariant checks must catch it).
    """
    from warehouse_loader.formats import format_of
    from warehouse_loader.load_job import table_path

    fmt = format_of(config, name)
    location = table_path(config, name)
    if fmt.name == "delta":
        from deltalake import write_deltalake

        write_deltalake(location.uri, rows, mode="overwrite", storage_options=location.storage_options)
        return
    stored = fmt.open(location)
    assert stored is not None
    table = stored.table  # type: ignore[attr-defined]  # IcebergVersion
    table.overwrite(rows.cast(table.schema().as_arrow()))
