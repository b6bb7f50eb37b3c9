"""A table's Dagster metadata reads that table only.

The recorder of a ``--follow`` stage records every table every 30 s; when each table's
metadata computed the status of every table, one record of N tables read N x N tables
(31 tables: 961 table reads every 30 s, a third of a core for an idle pipeline). Another
table's damage must not stop this table's metadata either.
"""

from datetime import UTC, datetime

import pyarrow as pa
from deltalake import write_deltalake

from core.config import load_config
from dagster_project.metadata import table_metadata
from log.factory import open_log

STAMP = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def test_a_tables_metadata_never_reads_another_table(tmp_path):
    (tmp_path / "headwater.yaml").write_text(
        "project: p\nwarehouse:\n  tables:\n"
        "    good: {from: shop.public.good, mode: scd1}\n"
        "    broken: {from: shop.public.broken, mode: scd1}\n"
    )
    warehouse = tmp_path / ".headwater" / "warehouse"
    rows = pa.table({"id": [1, 2, 3], "__hw_commit_ts": pa.array([STAMP] * 3, pa.timestamp("us", "UTC"))})
    write_deltalake(str(warehouse / "good"), rows)
    write_deltalake(str(warehouse / "broken"), rows)
    for commit in (warehouse / "broken" / "_delta_log").glob("*.json"):
        commit.write_text("{not json")  # any read of this table fails
    config = load_config(tmp_path / "headwater.yaml")
    log = open_log(config)
    try:
        metadata = table_metadata(config, log, "good")
    finally:
        log.close()
    assert metadata["dagster/row_count"] == 3
    assert metadata["warehouse/last_commit"] == STAMP.isoformat()
