"""``headwater verify`` of a SCD1 table loaded from a MySQL/MariaDB source (real MariaDB, capture, log, Spark, Delta).

Through the CLI a table of many column types is captured, loaded and verified equal. Then rows
are changed behind the pipeline's back (one in the warehouse table itself; in the source, a
delete, an update and an insert written with ``sql_log_bin = 0``, which no binlog reader sees):
verify reports exactly those keys and exits 1. Writes in the source after verify's consistent
point, captured and loaded while it runs, are compared again at a new point, never reported.
"""

from __future__ import annotations

import subprocess
from datetime import datetime
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
from harness.cli import run_headwater
from harness.table_formats import overwrite_rows

from capture.runner import run_capture
from core.config import load_config
from log.factory import open_log
from operations.scaffold import init_project
from operations.verify import verify_table
from warehouse_loader.formats import format_of
from warehouse_loader.load_job import run_loads, table_path

ITEMS = (
    "CREATE TABLE items (id INT PRIMARY KEY, small SMALLINT, big BIGINT UNSIGNED, amount DECIMAL(12,3), "
    "name VARCHAR(40), at DATETIME(6), born DATE, doc JSON, data BLOB, size ENUM('s','m','l'), ratio DOUBLE)"
)
ROWS = 240
NAMES = ["Zoë", "Ærøskøbing", "東京", "naïve café", "plain", None]


def headwater(config: Path, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    return run_headwater(config, *args, ok=ok)


def fill(db, count: int) -> None:
    with db.connect() as conn, conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO items VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
            [
                (
                    i,
                    -i if i % 2 else i,
                    2**63 + i,
                    Decimal(i) / 8,
                    None if NAMES[i % 6] is None else f"{NAMES[i % 6]} {i}",
                    datetime(2024, 3, 1, 12, 0, i % 60, (i * 1237) % 1_000_000),
                    datetime(1990, 1, 1 + i % 28).date(),
                    f'{{"n": {i}, "s": "ü"}}',
                    bytes([i % 256, 0, 255]),
                    "sml"[i % 3],
                    i / 3,
                )
                for i in range(1, count + 1)
            ],
        )


def unlogged(db, *statements: str) -> None:
    """Statements no binlog reader sees: changes behind the pipeline's back."""
    with db.connect() as conn, conn.cursor() as cur:
        cur.execute("SET SESSION sql_log_bin = 0")
        for statement in statements:
            cur.execute(statement)


def test_verify_a_mysql_table_through_the_cli(mariadb_database, tmp_path: Path, spark) -> None:
    db = mariadb_database
    db.script(ITEMS)
    fill(db, ROWS)
    init_project(tmp_path)
    config = tmp_path / "headwater.yaml"
    headwater(
        config, "source", "add", "shop", "--kind", "mysql", "--dsn", db.dsn, "--tables", f"{db.name}.items", "--yes"
    )
    config.write_text(
        config.read_text().replace(
            "warehouse:\n  tables: {}", f"warehouse:\n  tables:\n    items_now: {{from: shop.{db.name}.items}}"
        )
    )
    headwater(config, "capture", "shop", "--until-caught-up")
    headwater(config, "load", "--available-now")

    equal = headwater(config, "verify", "items_now")
    lines = equal.stdout.strip().splitlines()
    assert lines[-1] == "equal", equal.stdout
    assert lines[0].startswith(f"items_now: source {db.name}.items at binlog position "), lines[0]
    assert f"rows: source {ROWS}, warehouse {ROWS}; 0 of 1 key buckets differ" in lines[0], lines[0]
    assert len(lines) == 2, lines  # every column compared: no "not compared" line

    # Behind the pipeline's back: one row written straight into the table ...
    project = load_config(config)
    stored = format_of(project, "items_now").open(table_path(project, "items_now"))
    assert stored is not None
    rows = stored.select("SELECT * FROM target")
    at = rows.schema.get_field_index("name")
    names = ["tampered" if r["id"] == 7 else r["name"] for r in rows.select(["id", "name"]).to_pylist()]
    overwrite_rows(project, "items_now", rows.set_column(at, rows.schema.field(at), pa.array(names, pa.string())))
    # ... and three source changes no binlog holds.
    unlogged(
        db,
        "DELETE FROM items WHERE id = 11",
        "UPDATE items SET amount = 2.25, doc = '{\"n\": 0}' WHERE id = 12",
        f"INSERT INTO items (id, name) VALUES ({ROWS + 100}, 'ghost ✓')",
    )
    differs = headwater(config, "verify", "items_now", ok=False)
    assert differs.returncode == 1, differs.stderr
    expected = [
        "id=11: only in the warehouse",
        "id=12: amount: source '2.250', warehouse '1.500'; "
        'doc: source \'{"n": 0}\', warehouse \'{"n": 12, "s": "ü"}\'',
        "id=340: missing in the warehouse",
        "id=7: name: source 'Ærøskøbing 7', warehouse 'tampered'",
        "4 key(s) differ",
    ]
    assert differs.stdout.strip().splitlines()[1:] == expected, differs.stdout

    # Written while verify runs, after its point, then captured and loaded: compared again, not reported.
    def change_after_point(line: str) -> None:
        if "waiting" in line and not changed:
            changed.append(line)
            db.script(
                "UPDATE items SET name = 'late ✓' WHERE id = 5",
                "DELETE FROM items WHERE id = 3",
                "INSERT INTO items (id, name) VALUES (2000, 'new')",
            )
            run_capture(project, (), until_caught_up=True)
            log = open_log(project)
            try:
                run_loads(spark, project, log, (), available_now=True)
            finally:
                log.close()

    changed: list[str] = []
    settled = verify_table(project, "items_now", spark=spark, load=True, timeout_s=120, say=change_after_point)
    assert changed and settled.rounds == 2, settled.lines()
    assert [d.describe() for d in settled.differences] == expected[:-1], settled.lines()
    assert settled.unsettled == [] and settled.not_compared == []


def test_verify_applies_the_source_column_settings_as_capture_does(mariadb_database, tmp_path: Path) -> None:
    """Excluded and masked columns, a row filter and a configured key: the source is read as capture writes it."""
    db = mariadb_database
    db.script(
        "CREATE TABLE t (id INT PRIMARY KEY, code VARCHAR(8) NOT NULL, secret VARCHAR(20), email VARCHAR(40), "
        "region VARCHAR(4) COLLATE utf8mb4_bin, UNIQUE KEY (code))",
        *[
            f"INSERT INTO t VALUES ({i}, 'c{i:03d}', 'pw{i}', 'user{i}@example.com', '{'eu' if i % 3 else 'us'}')"
            for i in range(1, 61)
        ],
    )
    init_project(tmp_path)
    config = tmp_path / "headwater.yaml"
    headwater(config, "source", "add", "shop", "--kind", "mysql", "--dsn", db.dsn, "--tables", f"{db.name}.t", "--yes")
    text = (
        config.read_text()
        .replace(
            f"    tables: [{db.name}.t]\n",
            f"    tables: [{db.name}.t]\n"
            f"    columns: {{exclude: [{db.name}.t.secret], mask: {{{db.name}.t.email: {{truncate: 4}}}}}}\n"
            f"    filters: {{{db.name}.t: \"region = 'eu'\"}}\n"
            f"    keys: {{{db.name}.t: [code]}}\n",
        )
        .replace("warehouse:\n  tables: {}", f"warehouse:\n  tables:\n    t_now: {{from: shop.{db.name}.t}}")
    )
    config.write_text(text)
    headwater(config, "capture", "shop", "--until-caught-up")
    headwater(config, "load", "--available-now")

    equal = headwater(config, "verify", "t_now")
    lines = equal.stdout.strip().splitlines()
    assert lines[-1] == "equal" and "rows: source 40, warehouse 40" in lines[0], equal.stdout
    unlogged(db, "UPDATE t SET email = 'other@example.com' WHERE id = 2", "UPDATE t SET secret = 'x' WHERE id = 4")
    differs = headwater(config, "verify", "t_now", ok=False)
    assert differs.stdout.strip().splitlines()[1:] == [
        "code=c002: email: source 'othe', warehouse 'user'",
        "1 key(s) differ",
    ], differs.stdout
