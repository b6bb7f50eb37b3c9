"""The built-in SCD2 invariant checks: they pass on a loaded table and name the keys of a broken one."""

from __future__ import annotations

import sys
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

sys.path.insert(0, str(Path(__file__).parent))
from test_auto_cdc_options import log_changes

from core.config import parse_config
from core.warehouse_config import TableConfig
from log.sequence import Sequence
from warehouse_loader.changes import END_AT, START_AT
from warehouse_loader.delta_writer import write_batch
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


def project(tmp_path: Path):
    raw = {
        "project": "p",
        "home": str(tmp_path / "home"),
        "warehouse": {
            "tables": {"hist": {"from": "s.public.users", "mode": "scd2"}, "cur": {"from": "s.public.users"}}
        },
    }
    return parse_config(raw, tmp_path / "headwater.yaml")


def loaded(tmp_path: Path):
    config = project(tmp_path)
    path = table_path(config, "hist")
    for batch_id, rows in enumerate([STREAM, LATE]):
        write_batch(
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


def test_every_scd2_table_gets_the_blocking_invariants_and_they_pass(tmp_path: Path) -> None:
    config, _ = loaded(tmp_path)
    assert select_tables(config) == ["hist"]  # no quality: suite needed; SCD1 tables get none
    assert [name for name, entry in table_checks(config, "hist") if entry.blocking] == NAMES
    results = outcomes(config)
    assert [name for name, e in results.items() if e.success] == NAMES


def test_a_broken_scd2_table_fails_each_invariant_naming_the_key(tmp_path: Path) -> None:
    config, path = loaded(tmp_path)

    def reopen(key: int, start: int) -> None:
        predicate = f'"userId" = {key} AND "{START_AT}" = \'{Sequence(start, 0).sortable()}\''
        DeltaTable(str(path)).update(updates={f'"{END_AT}"': "NULL"}, predicate=predicate)

    reopen(1, 3)  # key 1: its first version reopened, so two are open and they overlap
    reopen(3, 1)  # key 3: closed by the truncate at 2
    reopen(5, 6)  # key 5: closed by its delete at 7, which arrived first (a tombstone)
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


def test_an_appended_overlapping_version_is_caught(tmp_path: Path) -> None:
    config, path = loaded(tmp_path)
    rows = DeltaTable(str(path)).to_pyarrow_table()
    key2 = rows.filter(pa.compute.equal(rows.column("userId"), 2)).slice(0, 1)
    write_deltalake(str(path), key2, mode="append")  # the same version twice
    failed = {name for name, e in outcomes(config).items() if not e.success}
    assert "scd2_no_overlapping_versions" in failed
