"""Iceberg catalogs: the embedded SQLite one and a PostgreSQL one, with writers racing in two processes.

Two processes load 12 micro-batches each into ONE Iceberg table at the same moment, through
the catalog's compare-and-swap: every batch of both lands exactly once (conflicts are planned
again on the winner's snapshot), on SQLite and on a real PostgreSQL (the session's server; the
catalog's tables are pyiceberg's ``iceberg_tables``/``iceberg_namespace_properties``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from warehouse_loader.iceberg.catalog import CatalogSpec, embedded_catalog
from warehouse_loader.iceberg.commit import committed_batch
from warehouse_loader.iceberg.scan import TableFiles
from warehouse_loader.iceberg.table_ref import IcebergTableRef
from warehouse_loader.location import TableLocation

pytestmark = pytest.mark.integration

BATCHES = 12


def race(spec: CatalogSpec, warehouse: Path) -> int:
    """Two writer processes, ``BATCHES`` batches each into one table; the conflicts they re-planned."""
    script = textwrap.dedent(
        f"""
        import json, sys, time
        sys.path.insert(0, {str(Path(__file__).parents[2])!r})
        from harness.auto_cdc_examples import changes
        from core.warehouse_config import TableConfig
        from warehouse_loader.errors import CommitConflictError
        from warehouse_loader.iceberg import writer
        from warehouse_loader.iceberg.catalog import CatalogSpec
        from warehouse_loader.iceberg.table_ref import IcebergTableRef
        from warehouse_loader.location import TableLocation

        number, start_at = int(sys.argv[1]), float(sys.argv[2])
        ref = IcebergTableRef(CatalogSpec("sql", sys.argv[3]), TableLocation({str(warehouse)!r}), "users")
        config = TableConfig.model_validate({{"from": "f"}})
        conflicts = 0
        real = writer.write_scd1

        def counting(*args, **kwargs):
            global conflicts
            try:
                return real(*args, **kwargs)
            except CommitConflictError:
                conflicts += 1
                raise

        writer.write_scd1 = counting
        while time.time() < start_at:
            time.sleep(0.001)
        for batch in range({BATCHES}):
            rows = changes([(number * 1000 + batch, f"w{{number}}", f"b{{batch}}", "INSERT", batch + 1),
                            (7, f"w{{number}}", f"b{{batch}}", "UPDATE", 100 * batch + number)])
            writer.write_batch(ref, rows, table=f"writer{{number}}", batch_id=batch, keys=["userId"], config=config)
        print(json.dumps({{"conflicts": conflicts}}))
        """
    )
    start_at = time.time() + 6  # both have imported pyiceberg by then
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(n), str(start_at), spec.uri],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for n in (1, 2)
    ]
    outputs = [w.communicate(timeout=300) for w in writers]
    for writer, (_, err) in zip(writers, outputs, strict=True):
        assert writer.returncode == 0, err.decode()[-3000:]
    return sum(json.loads(out.decode().splitlines()[-1])["conflicts"] for out, _ in outputs)


@pytest.mark.parametrize("catalog", ["sqlite", "postgresql"])
def test_two_writers_racing_on_one_table_both_land_every_batch(
    catalog: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if catalog == "postgresql":
        database: Any = request.getfixturevalue("pg_database")
        spec = CatalogSpec("sql", database.dsn)
    else:
        spec = embedded_catalog(tmp_path)
    conflicts = race(spec, tmp_path / "warehouse")
    ref = IcebergTableRef(spec, TableLocation(str(tmp_path / "warehouse")), "users")
    table = ref.load()
    assert table is not None
    files = TableFiles.of(table)
    from warehouse_loader.iceberg.commit import read_files

    rows = read_files(ref, files, list(files.files)).to_pylist()
    keys = sorted(r["userId"] for r in rows)
    assert keys == sorted([7, *(w * 1000 + b for w in (1, 2) for b in range(BATCHES))])  # one row per key
    last = max((100 * b + w, w) for w in (1, 2) for b in range(BATCHES))
    assert next(r["name"] for r in rows if r["userId"] == 7) == f"w{last[1]}"  # the newest change of key 7 won
    assert committed_batch(table, "writer1") == committed_batch(table, "writer2") == BATCHES - 1
    headwater = [s for s in table.snapshots() if s.summary and "headwater.batch_id" in s.summary.additional_properties]
    assert len(headwater) == 2 * BATCHES  # no batch committed twice
    print(f"\n{catalog}: 2 writers x {BATCHES} batches on one Iceberg table: {conflicts} conflicts re-planned")
