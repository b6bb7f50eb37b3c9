"""``headwater run --until-caught-up``: every SCD1 table equals its source afterwards.

The workload (seeded) includes primary-key changes, updates that leave a TOASTed column
unchanged, deletes and a TRUNCATE; each round runs the real CLI (capture, feeds, loads
in one command) and compares the SCD1 table with Postgres by a checksum over every column.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys

import yaml
from harness.items_workload import COLUMNS, SCHEMA, Workload, canonical, source_rows

from core.config import load_config
from warehouse_loader.load_job import table_path
from warehouse_loader.query import run_query


def checksum(rows: list[str]) -> str:
    return hashlib.sha256("\n".join(sorted(rows)).encode()).hexdigest()


def run_pipeline(config_path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "headwater", "--config", str(config_path), "run", "--until-caught-up"],
        capture_output=True,
        text=True,
        timeout=900,
    )


def test_run_until_caught_up_leaves_scd1_equal_to_the_source(pg_database, unique_name, tmp_path):
    name = unique_name("run")
    conn = pg_database.connect()
    conn.execute(SCHEMA)
    workload = Workload(conn, seed=8)
    with conn.transaction():
        for _ in range(60):
            workload.insert(workload.new_key())
    conn.execute(f"CREATE PUBLICATION headwater_{name} FOR TABLE items")
    topic = f"{name}.public.items"
    config_path = tmp_path / "headwater.yaml"
    config_path.write_text(
        yaml.safe_dump(
            {
                "project": "run_exact",
                "log": {"partitions": 3},
                "sources": {name: {"dsn": pg_database.dsn, "tables": ["public.items"], "heartbeat_interval_s": 1}},
                "warehouse": {"tables": {"items": {"from": topic, "mode": "scd1"}}},
            }
        )
    )
    config = load_config(config_path)

    def warehouse() -> list[str]:
        result = run_query(f"SELECT {COLUMNS} FROM items", {"items": table_path(config, "items")})
        return [canonical(tuple(row.values())) for row in result.to_pylist()]

    first = run_pipeline(config_path)  # initial snapshot + load
    assert first.returncode == 0, first.stderr[-3000:]
    assert checksum(warehouse()) == checksum(source_rows(pg_database))

    workload.transactions(40)  # key changes, TOAST-unchanged updates, deletes, re-inserts
    workload.truncate()
    workload.transactions(30)
    second = run_pipeline(config_path)
    assert second.returncode == 0, second.stderr[-3000:]
    expected, actual = source_rows(pg_database), warehouse()
    assert len(actual) == len(expected)
    assert checksum(actual) == checksum(expected)
