"""The built-in SCD2 invariant checks: they pass on a loaded table and name the keys of a broken one.

Every case runs on both table formats (``table_format``: Delta, Iceberg).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pyarrow as pa
from harness.table_formats import TableFormat, overwrite_rows

sys.path.insert(0, str(Path(__file__).parent))
from test_auto_cdc_options import log_changes

from core.config import parse_config
from core.warehouse_config import TableConfig
from log.sequence import Sequence
from warehouse_loader.changes import END_AT, START_AT
from warehouse_loader.formats import format_of
from warehouse_loader.load_job import table_path
from warehouse_loader.quality import run_quality, select_tables, table_checks
from warehouse_loader.quality_report import render_report

STREAM = [
    (3, "c", "x", "INSERT", 1),
    (None, None, None, "TRUNCATE", 2),
    (1, "a", "x", "INSERT", 3),
    (1, "a2", "x", "UPDATE", 4),
    (2, "b", "x", "INSERT", 3),
    (2, None, None, "DELETE", 5),
    (5, None, None, "DELETE", 7),  # before the key's insert: remembered as a tombstone
]
LATE = [(5, "e", "x", "INSERT", 6)]
NAMES = ["scd2_no_overlapping_versions", "scd2_one_open_version_per_key", "scd2_no_open_version_after_delete"]


def project(tmp_path: Path, fmt: TableFormat):
    raw = {
        "project": "p",
        "home": str(tmp_path / "home"),
        "warehouse": {
            "format": fmt.name,
            "tables": {"hist": {"from": "s.public.users", "mode": "scd2"}, "cur": {"from": "s.public.users"}},
        },
    }
    return parse_config(raw, tmp_path / "headwater.yaml")


def loaded(tmp_path: Path, fmt: TableFormat):
    config = project(tmp_path, fmt)
    path = table_path(config, "hist")
    for batch_id, rows in enumerate([STREAM, LATE]):
        format_of(config, "hist").write_batch(
            path,
            log_changes(rows),
            table="hist",
            batch_id=batch_id,
            keys=["userId"],
            config=TableConfig.model_validate({"from": "x", "mode": "scd2"}),
        )
    return config, path


def outcomes(config) -> dict:
    (table,) = run_quality(config, record=False).tables
    return {e.name: e for e in table.expectations}


def stored_rows(config) -> pa.Table:
    stored = format_of(config, "hist").open(table_path(config, "hist"))
    assert stored is not None
    return stored.select("SELECT * FROM target")


def test_every_scd2_table_gets_the_blocking_invariants_and_they_pass(table_format: TableFormat, tmp_path: Path) -> None:
    config, _ = loaded(tmp_path, table_format)
    assert select_tables(config) == ["hist"]  # no quality: suite needed; SCD1 tables get none
    assert [name for name, entry in table_checks(config, "hist") if entry.blocking] == NAMES
    results = outcomes(config)
    assert [name for name, e in results.items() if e.success] == NAMES


def test_a_broken_scd2_table_fails_each_invariant_naming_the_key(table_format: TableFormat, tmp_path: Path) -> None:
    config, _ = loaded(tmp_path, table_format)
    rows = stored_rows(config)
    # key 1: its first version reopened, so two are open and they overlap; key 3: closed by the
    # truncate at 2; key 5: closed by its delete at 7, which arrived first (a tombstone).
    reopened = {(key, Sequence(start, 0).sortable()) for key, start in ((1, 3), (3, 1), (5, 6))}
    ends = [
        None if (r["userId"], r[START_AT]) in reopened else r[END_AT]
        for r in rows.select(["userId", START_AT, END_AT]).to_pylist()
    ]
    at = rows.schema.get_field_index(END_AT)
    overwrite_rows(
        config, "hist", rows.set_column(at, rows.schema.field(at), pa.array(ends, rows.schema.field(at).type))
    )
    results = outcomes(config)
    failed = {name: sorted(e.samples) or e.error for name, e in results.items() if not e.success}
    assert failed == {
        "scd2_no_overlapping_versions": ["userId=1"],
        "scd2_one_open_version_per_key": ["userId=1", "userId=1"],
        "scd2_no_open_version_after_delete": ["userId=3", "userId=5"],
    }
    run = run_quality(config, record=False)
    assert run.failed_blocking == [f"hist.{name}" for name in NAMES]
    html = render_report("p", run.as_json(), [run.as_json()], {})
    assert "__hw_check_open_after_delete" in html and "userId=5" in html


def test_an_appended_overlapping_version_is_caught(table_format: TableFormat, tmp_path: Path) -> None:
    config, _ = loaded(tmp_path, table_format)
    rows = stored_rows(config)
    key2 = rows.filter(pa.compute.equal(rows.column("userId"), 2)).slice(0, 1)
    overwrite_rows(config, "hist", pa.concat_tables([rows, key2]))  # the same version twice
    failed = {name for name, e in outcomes(config).items() if not e.success}
    assert "scd2_no_overlapping_versions" in failed
