"""Iceberg tables read by an engine nobody here wrote (DuckDB's iceberg extension), local and on S3 (moto).

A random change stream (inserts, updates, deletes, a truncate, late and duplicate changes) is
loaded in micro-batches through the Iceberg writer; three readers must agree on every row:
pyiceberg's own scan, Headwater's DuckDB-by-field-ID read, and DuckDB 1.5.5's ``iceberg_scan``
of the metadata file in another process (:mod:`harness.iceberg_reader`). The SCD1 table must
equal the stream's latest image per key; the SCD2 table must equal the Delta writer's table for
the same batches. No Spark, no Postgres: the writer and the readers are what is checked.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness.auto_cdc_examples import KEYS, batches, changes, expected_scd1, stream
from harness.iceberg_reader import three_reads

from core.warehouse_config import TableConfig
from warehouse_loader.changes import END_AT, START_AT
from warehouse_loader.delta import writer as delta_writer
from warehouse_loader.iceberg import writer
from warehouse_loader.iceberg.catalog import embedded_catalog
from warehouse_loader.iceberg.scan import TableFiles
from warehouse_loader.iceberg.schema import rename_column
from warehouse_loader.iceberg.table_ref import IcebergTableRef
from warehouse_loader.location import TableLocation

pytestmark = pytest.mark.integration

SCD1 = TableConfig.model_validate({"from": "f", "mode": "scd1"})
SCD2 = TableConfig.model_validate({"from": "f", "mode": "scd2"})


def scd2_view(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return sorted((r["userId"], r["name"], r["city"], r[START_AT], r[END_AT]) for r in rows)


@pytest.fixture(scope="module")
def s3() -> Iterator[Any]:
    from harness.moto import serve

    yield from serve("icewh")


def place(tmp_path: Path, where: str, s3: Any, name: str) -> tuple[IcebergTableRef, dict[str, str] | None]:
    if where == "local":
        return IcebergTableRef(embedded_catalog(tmp_path), TableLocation(str(tmp_path / "warehouse")), name), None
    from harness.moto import warehouse_options

    options = warehouse_options(s3)
    location = TableLocation(f"s3://icewh/{tmp_path.name}", tuple(sorted(options.items())))
    return IcebergTableRef(embedded_catalog(tmp_path), location, name), options


@pytest.mark.parametrize("mode", ["copy-on-write", "merge-on-read"])
@pytest.mark.parametrize("where", ["local", "s3"])
def test_three_readers_agree_and_scd1_equals_the_stream(
    tmp_path: Path, where: str, mode: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    s3 = request.getfixturevalue("s3") if where == "s3" else None
    monkeypatch.setattr(writer, "MERGE_ON_READ_MAX_SHARE", float("inf"))  # every batch as position deletes
    events = stream(seed=7)
    ref, storage = place(tmp_path, where, s3, "users")
    for batch_id, batch in enumerate(batches(events)):
        writer.write_batch(
            ref, batch, table="users", batch_id=batch_id, keys=KEYS, config=SCD1, merge_on_read=mode == "merge-on-read"
        )
    pyiceberg_rows, headwater_rows, duckdb_rows = three_reads(ref, storage)
    assert pyiceberg_rows == headwater_rows == duckdb_rows
    assert sorted((r["userId"], r["name"], r["city"]) for r in duckdb_rows) == expected_scd1(events)
    table = ref.load()
    assert table is not None
    assert bool(TableFiles.of(table).deletes) == (mode == "merge-on-read")
    # Compaction folds the deletes into the data files; every reader still sees the same rows.
    from warehouse_loader.iceberg.maintenance import IcebergMaintainer

    IcebergMaintainer(ref).compact(64 << 20, 4 << 20, 0.0)  # every file with a removed row is rewritten
    compacted = ref.load()
    assert compacted is not None and not TableFiles.of(compacted).deletes
    assert three_reads(ref, storage) == [duckdb_rows] * 3


@pytest.mark.parametrize("where", ["local", "s3"])
def test_three_readers_agree_and_scd2_equals_the_delta_table(
    tmp_path: Path, where: str, request: pytest.FixtureRequest
) -> None:
    s3 = request.getfixturevalue("s3") if where == "s3" else None
    events = stream(seed=11, count=300)
    ref, storage = place(tmp_path, where, s3, "users_hist")
    delta_path = tmp_path / "delta_hist"
    for batch_id, batch in enumerate(batches(events, size=45)):
        writer.write_batch(ref, batch, table="h", batch_id=batch_id, keys=KEYS, config=SCD2)
        delta_writer.write_batch(delta_path, batch, table="h", batch_id=batch_id, keys=KEYS, config=SCD2)
    pyiceberg_rows, headwater_rows, duckdb_rows = three_reads(ref, storage)
    assert pyiceberg_rows == headwater_rows == duckdb_rows
    from deltalake import DeltaTable

    assert scd2_view(duckdb_rows) == scd2_view(DeltaTable(str(delta_path)).to_pyarrow_table().to_pylist())


def test_a_renamed_column_reads_under_its_new_name_in_every_reader(tmp_path: Path) -> None:
    ref, _ = place(tmp_path, "local", None, "users")
    writer.write_batch(ref, changes([(1, "a", "x", "INSERT", 1)]), table="users", batch_id=0, keys=KEYS, config=SCD1)
    table = ref.load()
    assert table is not None
    with table.transaction() as tx:
        rename_column(tx, "city", "town")
    more = changes([(2, "b", "y", "INSERT", 2)]).rename_columns(
        ["userId", "name", "town", *changes([]).column_names[3:]]
    )
    writer.write_batch(ref, more, table="users", batch_id=1, keys=KEYS, config=SCD1)
    reads = three_reads(ref)
    assert reads[0] == reads[1] == reads[2]
    assert sorted((r["userId"], r["town"]) for r in reads[2]) == [(1, "x"), (2, "y")]


@pytest.mark.parametrize("mode", ["copy-on-write", "merge-on-read"])
def test_merged_manifests_and_the_loaders_compactions_read_alike_in_every_reader(
    tmp_path: Path, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 34: commits that merge manifests and the loader's compactions between them, as DuckDB reads them."""
    from core.warehouse_config import MaintenanceConfig
    from warehouse_loader.iceberg.maintenance import IcebergMaintainer
    from warehouse_loader.maintenance import PiledFiles

    monkeypatch.setattr(writer, "MERGE_ON_READ_MAX_SHARE", float("inf"))
    events = stream(seed=5, count=400, keys=150)
    ref, _ = place(tmp_path, "local", None, "users")
    piled = PiledFiles(IcebergMaintainer(ref), MaintenanceConfig())
    for batch_id, batch in enumerate(batches(events, size=10)):
        result = writer.write_batch(
            ref, batch, table="users", batch_id=batch_id, keys=KEYS, config=SCD1, merge_on_read=mode == "merge-on-read"
        )
        piled.after_commit(result.files)
        if batch_id % 13 == 12:  # between compactions too, not only right after one
            reads = three_reads(ref)
            assert reads[0] == reads[1] == reads[2]
    pyiceberg_rows, headwater_rows, duckdb_rows = three_reads(ref)
    assert pyiceberg_rows == headwater_rows == duckdb_rows
    assert sorted((r["userId"], r["name"], r["city"]) for r in duckdb_rows) == expected_scd1(events)
    table = ref.load()
    assert table is not None and table.current_snapshot() is not None
    assert len(table.current_snapshot().manifests(table.io)) <= 2  # type: ignore[union-attr]
