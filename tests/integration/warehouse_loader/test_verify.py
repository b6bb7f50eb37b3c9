"""``headwater verify`` and the AUTO CDC options through the real pipeline (Postgres, capture, log, Spark, Delta).

Verify must find the key of a row changed behind Headwater's back (written straight into
the Delta table) and of a row deleted in the source while its table was out of the
publication (a change no slot ever saw), re-verify a row changed after its snapshot
instead of reporting it, exit 1 from the command line, and show in the quality report.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest
import yaml
from harness.table_formats import overwrite_rows

from capture.runner import run_capture
from core.config import load_config
from log.factory import open_log
from operations.verify import verify_table
from warehouse_loader.delta.table import open_delta
from warehouse_loader.formats import format_of
from warehouse_loader.load_job import run_loads, table_path
from warehouse_loader.quality_report import run_and_report
from warehouse_loader.query import query_warehouse

ITEMS = """
CREATE TABLE items (
    id int PRIMARY KEY, email text, balance numeric(10,2), score float8, ratio real, created timestamptz,
    born date, flag boolean, code char(3), blob bytea, doc jsonb, at_ms timestamp(3), tags text[]
);
"""
ACCOUNTS = """
CREATE TABLE accounts (
    id int PRIMARY KEY, owner text, note text, is_deleted boolean NOT NULL DEFAULT false, version int
);
ALTER TABLE accounts REPLICA IDENTITY FULL;
"""


def project(
    tmp_path: Path, pg_database, unique_name, tables: dict, sql: str, source_tables: list[str], fmt: str = "delta"
):
    name = unique_name("src")
    with pg_database.connect() as conn:
        conn.execute(sql)
        conn.execute(f"CREATE PUBLICATION headwater_{name} FOR TABLE {', '.join(source_tables)}")
    document = {
        "project": "verify",
        "home": str(tmp_path / "home"),
        "log": {"partitions": 2, "file": {"fsync": "never"}},
        "sources": {name: {"dsn": pg_database.dsn, "tables": source_tables, "heartbeat_interval_s": 1}},
        "warehouse": {
            "format": fmt,
            "tables": {t: {**spec, "from": f"{name}.{spec['from']}"} for t, spec in tables.items()},
        },
    }
    path = tmp_path / "headwater.yaml"
    path.write_text(yaml.safe_dump(document))
    return load_config(path), name


def run_pipeline(spark, config) -> None:
    run_capture(config, (), until_caught_up=True)
    log = open_log(config)
    try:
        run_loads(spark, config, log, (), available_now=True)
    finally:
        log.close()


def fill_items(pg_database, count: int) -> None:
    created = datetime(2024, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)
    with pg_database.connect() as conn, conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO items VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
            [
                (
                    i,
                    None if i % 7 == 0 else f"user{i}@example.com",
                    Decimal(i) / 4,
                    i / 3,
                    i / 8,
                    created,
                    datetime(1990, 1, 1 + i % 28).date(),
                    i % 2 == 0,
                    "ab",
                    bytes([i % 256, 0, 255]),
                    f'{{"n": {i}, "s": "x"}}',
                    datetime(2024, 1, 1, 0, 0, i % 60, (i % 1000) * 1000),
                    ["a", str(i)],
                )
                for i in range(1, count + 1)
            ],
        )


@pytest.mark.parametrize("table_format", ["delta", "iceberg"])
def test_verify_finds_what_no_slot_saw_and_re_verifies_what_changed_after_its_snapshot(
    tmp_path, pg_database, unique_name, spark, table_format
):
    tables = {"cur": {"from": "public.items"}}
    config, _ = project(tmp_path, pg_database, unique_name, tables, ITEMS, ["public.items"], table_format)
    fill_items(pg_database, 300)
    run_pipeline(spark, config)

    equal = verify_table(config, "cur", spark=spark, timeout_s=60)
    assert equal.equal, equal.lines()
    assert (equal.source_rows, equal.warehouse_rows, equal.differences) == (300, 300, [])
    assert equal.not_compared == ["tags"]  # an array has no exact common text form: said, not hidden

    # A row updated after verify's snapshot (capture and load then pass it): the warehouse's
    # newer row differs from the snapshot, so it is compared again at a new point, not reported.
    def change_after_snapshot(line: str) -> None:
        if "waiting" in line and not changed:
            pg_database.execute("UPDATE items SET email = 'late@example.com' WHERE id = 5")
            changed.append(line)

    changed: list[str] = []
    settled = verify_table(config, "cur", spark=spark, load=True, timeout_s=120, say=change_after_snapshot)
    assert changed and settled.equal and settled.rounds == 2, settled.lines()

    # Behind Headwater's back: one row written straight into the table ...
    stored = format_of(config, "cur").open(table_path(config, "cur"))
    assert stored is not None
    rows = stored.select("SELECT * FROM target")
    at = rows.schema.get_field_index("email")
    emails = ["tampered" if r["id"] == 7 else r["email"] for r in rows.select(["id", "email"]).to_pylist()]
    overwrite_rows(config, "cur", rows.set_column(at, rows.schema.field(at), pa.array(emails, pa.string())))
    # ... and one deleted in the source while its table was out of the publication.
    publication = f"headwater_{next(iter(config.sources))}"
    pg_database.execute(f"ALTER PUBLICATION {publication} DROP TABLE items")
    pg_database.execute("DELETE FROM items WHERE id = 9")
    pg_database.execute(f"ALTER PUBLICATION {publication} ADD TABLE items")
    run_pipeline(spark, config)

    found = verify_table(config, "cur", spark=spark, timeout_s=60)
    assert not found.equal
    assert [(d.key, d.kind) for d in found.differences] == [
        ("id=7", "differs"),
        ("id=9", "only in the warehouse"),
    ], found.lines()
    assert found.differences[0].columns == [("email", None, "tampered")]  # id 7 % 7 == 0: a null email
    assert found.source_rows == 299 and found.warehouse_rows == 300

    # The command line: the keys and what differs on stdout, exit 1.
    command = [sys.executable, "-m", "headwater.cli", "--config", str(config.config_path), "verify", "cur"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=os.environ | {"CI": "1"})
    assert done.returncode == 1, done.stderr
    assert "id=7: email: source None, warehouse 'tampered'" in done.stdout
    assert "id=9: only in the warehouse" in done.stdout
    assert "error: cur differs from its source: 2 key(s) differ" in done.stderr

    # The quality report's line (the last recorded verify of each table).
    log = open_log(config)
    try:
        _, report = run_and_report(config, log, ())
    finally:
        log.close()
    html = report.read_text()
    assert "Verified against the source" in html and "2 keys differ" in html and "id=9" in html


@pytest.mark.parametrize("table_format", ["delta", "iceberg"])
def test_auto_cdc_options_through_the_real_loader(tmp_path, pg_database, unique_name, spark, table_format):
    tables = {
        # soft deletes, a dropped flag column, nulls that keep the note
        "accounts_cur": {
            "from": "public.accounts",
            "apply_as_deletes": "is_deleted",
            "except_column_list": ["is_deleted"],
            "ignore_null_updates_column_list": ["note"],
        },
        # the source's own version column orders changes (deletes carry it under REPLICA IDENTITY FULL)
        "accounts_hist": {
            "from": "public.accounts",
            "mode": "scd2",
            "sequence_by": "version",
            "apply_as_truncates": False,
            "track_history_except_column_list": ["note"],
        },
    }
    config, _ = project(tmp_path, pg_database, unique_name, tables, ACCOUNTS, ["public.accounts"], table_format)
    pg_database.execute(
        "INSERT INTO accounts (id, owner, note, version) VALUES (1, 'ann', 'vip', 1), (2, 'bob', 'new', 1), "
        "(3, 'cy', NULL, 1)"
    )
    run_pipeline(spark, config)
    pg_database.execute("UPDATE accounts SET note = NULL, owner = 'ann2', version = 2 WHERE id = 1")
    pg_database.execute("UPDATE accounts SET note = 'seen', version = 2 WHERE id = 2")
    pg_database.execute("UPDATE accounts SET is_deleted = true, version = 2 WHERE id = 3")
    pg_database.execute("DELETE FROM accounts WHERE id = 2")
    run_pipeline(spark, config)

    current = query_warehouse(config, "SELECT * FROM accounts_cur ORDER BY id").to_pylist()
    assert [(r["id"], r["owner"], r["note"]) for r in current] == [(1, "ann2", "vip")]  # 2 deleted, 3 soft-deleted
    assert "is_deleted" not in current[0]
    history = query_warehouse(
        config, 'SELECT id, owner, note, "__START_AT" AS s, "__END_AT" AS e FROM accounts_hist ORDER BY id, s'
    ).to_pylist()
    assert [tuple(r.values()) for r in history] == [
        (1, "ann", "vip", 1, 2),
        (1, "ann2", None, 2, None),
        # The delete carries version 2 too (its before image): on the tie the source's later change wins.
        (2, "bob", "new", 1, 2),
        (3, "cy", None, 1, 2),  # no apply_as_deletes here: is_deleted is a tracked column
        (3, "cy", None, 2, None),
    ]


def test_verify_while_the_pipeline_runs_and_the_source_keeps_changing(tmp_path, pg_database, unique_name):
    """``headwater run --follow`` streams while a writer keeps updating: verify waits for the running
    loader (it loads nothing itself), compares at its snapshot and finds the table equal."""
    config, _ = project(tmp_path, pg_database, unique_name, {"cur": {"from": "public.items"}}, ITEMS, ["public.items"])
    fill_items(pg_database, 2000)
    base = [sys.executable, "-m", "headwater.cli", "--config", str(config.config_path)]
    env = os.environ | {"CI": "1", "PYTHONUNBUFFERED": "1"}
    out = (tmp_path / "run.log").open("w")
    pipeline = subprocess.Popen([*base, "run", "--follow"], stdout=out, stderr=subprocess.STDOUT, env=env)
    stop = threading.Event()
    written: list[int] = []

    def write() -> None:  # ~10 single-row updates a second, a seeded key each
        chooser = random.Random(23)
        with pg_database.connect() as conn:
            conn.autocommit = True
            while not stop.is_set():
                key = chooser.randrange(1, 2001)
                conn.execute("UPDATE items SET balance = balance + 1, email = %s WHERE id = %s", (f"w{key}@x", key))
                written.append(key)
                stop.wait(0.1)

    writer = threading.Thread(target=write)
    try:
        deadline = time.monotonic() + 300
        location = table_path(config, "cur")
        while (table := open_delta(location)) is None or table.to_pyarrow_table().num_rows != 2000:
            assert pipeline.poll() is None, (tmp_path / "run.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "run --follow did not load the snapshot in 300 s"
            time.sleep(1)
        writer.start()
        time.sleep(3)  # changes in flight: captured, not all loaded yet
        done = subprocess.run([*base, "verify", "cur", "--timeout", "180"], capture_output=True, text=True, env=env)
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout.splitlines()[-1] == "equal", done.stdout
        assert "rows: source 2,000, warehouse 2,000" in done.stdout
        assert "waiting for the table to be loaded past it" in done.stderr
        assert pipeline.poll() is None and len(written) > 20  # it ran against a live pipeline under writes
    finally:
        stop.set()
        if writer.is_alive():
            writer.join()
        pipeline.send_signal(signal.SIGTERM)
        try:
            pipeline.wait(timeout=120)
        except subprocess.TimeoutExpired:
            pipeline.kill()
            raise
        out.close()
