"""Headwater's read of an Iceberg table with position deletes equals pyiceberg's scan, keep-masks or anti-join.

Four data files of several row groups each; random position deletes committed in three
snapshots (one delete file naming several data files, two delete files on one data file, a
file left without deletes), written by Headwater's own merge-on-read commit
(:mod:`warehouse_loader.iceberg.row_delta`). Each row's ``id`` says where it was written
(file * 10,000 + position), so a row shifted against its mask shows as a wrong id, not only a
wrong count. An embedded SQLite catalog in tmp_path: no service.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from warehouse_loader.duckdb_connection import duckdb_connection
from warehouse_loader.iceberg import scan
from warehouse_loader.iceberg.row_delta import row_delta, write_position_deletes

ROWS = (1000, 700, 1300, 400)  # rows per data file; row groups of 128 rows
SPREAD = 10_000


def build(tmp_path: Path) -> Any:
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("t", uri=f"sqlite:///{tmp_path / 'catalog.db'}", warehouse=f"file://{tmp_path}")
    catalog.create_namespace("ns")
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("v", pa.string())])
    table = catalog.create_table(
        "ns.t", schema=schema, properties={"write.parquet.row-group-limit": "128", "format-version": "2"}
    )
    for at, rows in enumerate(ROWS):
        ids = at * SPREAD + np.arange(rows)
        table.append(pa.table({"id": pa.array(ids, pa.int64()), "v": [f"r{i}" for i in ids]}, schema=schema))
    table = catalog.load_table("ns.t")
    paths = {task.file.record_count: task.file.file_path for task in table.scan().plan_files()}
    files = [paths[rows] for rows in ROWS]
    rng = np.random.default_rng(34)

    def deletes(picks: list[tuple[int, int]]) -> None:
        positions = {
            "file_path": [files[at] for at, n in picks for _ in range(n)],
            "pos": [int(p) for at, n in picks for p in rng.choice(ROWS[at], n, replace=False)],
        }
        tx = table.transaction()
        written = write_position_deletes(tx, pa.table(positions))
        assert written is not None
        row_delta(tx, deletes=[written], properties={})
        tx.commit_transaction()

    deletes([(0, 90), (1, 60)])  # one delete file naming two data files
    table = catalog.load_table("ns.t")
    deletes([(0, 40), (2, 200)])  # file 0 gets a second delete file (repeats allowed)
    table = catalog.load_table("ns.t")
    deletes([(2, 1), (0, 1)])
    return catalog.load_table("ns.t")


def headwater(table: Any, sql: str, **options: bool) -> list[dict[str, Any]]:
    con = duckdb_connection()
    try:
        scan.TableFiles.of(table).register(con, "target", **options)
        return con.sql(sql).to_arrow_table().to_pylist()
    finally:
        con.close()


@pytest.mark.parametrize("positional", [True, False], ids=["beside-keep-masks", "anti-joined"])
def test_random_position_deletes_read_exactly_as_pyiceberg_reads_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, positional: bool
) -> None:
    monkeypatch.setattr(scan, "POSITIONAL_FILES", 32 if positional else 0)
    table = build(tmp_path)
    files = scan.TableFiles.of(table)
    assert len(files.delete_files) == 3
    masks = files._keep_masks(sorted(files.files))
    # A delete file may be planned for a data file it names no row of (path bounds): read plainly.
    assert (masks is not None and len(masks) == 3) == positional, masks
    con = duckdb_connection()
    files.register(con, "target")
    plan = con.sql("EXPLAIN SELECT * FROM target").fetchall()[0][1]
    con.close()
    assert ("POSITIONAL" in plan.upper()) == positional, plan

    theirs = sorted(table.scan().to_arrow().to_pylist(), key=lambda r: r["id"])
    assert len(theirs) < sum(ROWS) - 300, "too few rows removed: the case tests nothing"
    assert sorted(headwater(table, "SELECT * FROM target"), key=lambda r: r["id"]) == theirs
    # Filters over the view must not reach a file read beside its mask (rows would shift).
    for condition in ["id % 7 = 3", "v LIKE 'r2%'", f"id BETWEEN 500 AND {2 * SPREAD + 300}", "id = 129"]:
        mine = headwater(table, f"SELECT * FROM target WHERE {condition}")
        expected = [r for r in theirs if r["id"] in {m["id"] for m in mine}]
        assert sorted(mine, key=lambda r: r["id"]) == expected
        assert len(mine) == len(headwater(table, f"SELECT id FROM target WHERE {condition}")), condition
        con = duckdb_connection()
        con.register("theirs", pa.Table.from_pylist(theirs))
        wanted = con.sql(f"SELECT count(*) FROM theirs WHERE {condition}").fetchall()[0][0]
        con.close()
        assert len(mine) == wanted, condition
    # Each row's file and position are its own (the writer's merge-on-read deletes by them).
    placed = headwater(table, "SELECT id, filename, file_row_number FROM target", filename=True, positions=True)
    by_path = {files.local_path(path): at for at, path in enumerate(sorted(files.files, key=_written_order(files)))}
    assert all(r["id"] == by_path[r["filename"]] * SPREAD + r["file_row_number"] for r in placed)
    assert len(placed) == len(theirs)


def _written_order(files: scan.TableFiles) -> Any:
    """Sort key of a data file path: the order :func:`build` wrote them in (told apart by row count)."""
    return lambda path: ROWS.index(files.files[path].record_count)
