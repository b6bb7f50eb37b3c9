"""A MySQL source through the real CLI: add (prerequisites), capture, log tail, show, status, metrics, verify."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import orjson
from harness.cli import run_headwater
from prometheus_client import CollectorRegistry, generate_latest

from core.config import load_config
from operations.pipeline_metrics import PipelineCollector, Scope
from operations.scaffold import init_project

PASSWORD_VAR = "HW_MYSQL_CAPTURE_PW"


def headwater(config: Path, *args: str, password: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    return run_headwater(config, *args, env={PASSWORD_VAR: password}, ok=ok)


def source_metrics(config: Path) -> dict[str, float]:
    """The source gauges one /metrics scrape shows for source ``shop`` (name -> value)."""
    collector = PipelineCollector(load_config(config), Scope(sources=("shop",)))
    return {
        family.name: sample.value
        for family in collector.collect()
        for sample in family.samples
        if sample.labels.get("source") == "shop"
    }


def test_a_mysql_source_from_add_to_remove(mariadb_database, unique_name, tmp_path: Path, monkeypatch) -> None:
    db, server = mariadb_database.name, mariadb_database.server
    user, password = unique_name("cap"), "s3cret-pw"
    mariadb_database.script(
        "CREATE TABLE customers (id INT PRIMARY KEY, name VARCHAR(20))",
        "CREATE TABLE orders (id INT PRIMARY KEY, customer INT, total DECIMAL(8,2))",
        "INSERT INTO customers VALUES (1, 'ann'), (2, 'bob')",
        "INSERT INTO orders VALUES (10, 1, 9.99)",
        f"CREATE USER '{user}'@'127.0.0.1' IDENTIFIED BY '{password}'",
        f"GRANT SELECT ON `{db}`.* TO '{user}'@'127.0.0.1'",
    )
    init_project(tmp_path)
    config = tmp_path / "headwater.yaml"
    dsn = f"mysql://{user}:${{{PASSWORD_VAR}}}@{server.host}:{server.port}/{db}"
    add = ("source", "add", "shop", "--kind", "mysql", "--dsn", dsn, "--tables", f"{db}.customers,{db}.orders", "--yes")
    try:
        refused = headwater(config, *add, password=password, ok=False)
        assert refused.returncode != 0
        assert refused.stderr.strip().splitlines() == [
            f"error: source shop: {user} may not read the binlog position: GRANT BINLOG MONITOR ON *.* TO {user}"
        ]
        assert "shop" not in load_config(config).sources
        mariadb_database.script(f"GRANT REPLICATION SLAVE, BINLOG MONITOR ON *.* TO '{user}'@'127.0.0.1'")
        added = headwater(config, *add, password=password)
        assert "registered MySQL source shop" in added.stdout
        assert "kind: mysql" in config.read_text() and password not in config.read_text()

        headwater(config, "capture", "shop", "--until-caught-up", password=password)
        mariadb_database.script(
            "INSERT INTO customers VALUES (3, 'cy')",
            "UPDATE customers SET name = 'ANN' WHERE id = 1",
            "DELETE FROM orders WHERE id = 10",
        )
        headwater(config, "capture", "shop", "--until-caught-up", password=password)
        tail = headwater(config, "log", "tail", f"shop.{db}.customers", "--from-beginning", "--json", password=password)
        events = [orjson.loads(line)["value"] for line in tail.stdout.splitlines()]
        assert sorted((e["op"], e["after"]["id"]) for e in events) == [("c", 3), ("r", 1), ("r", 2), ("u", 1)]
        assert all(e["source"]["connector"] == "mysql" and e["source"]["db"] == db for e in events)

        shown = orjson.loads(headwater(config, "source", "show", "shop", "--json", password=password).stdout)
        assert shown["kind"] == "mysql" and password not in orjson.dumps(shown).decode()
        status = orjson.loads(headwater(config, "status", "--json", password=password).stdout)
        (row,) = [s for s in status["sources"] if s["source"] == "shop"]
        assert row["position"].startswith("binlog.") and "error" not in row
        # Caught up: the saved position is the server's end; what the server keeps before it is listed.
        assert row["binlog_end"] == row["position"] and row["lag_bytes"] == 0 and row["lag_seconds"] == 0
        assert row["binlog_status"] == "present" and row["oldest_binlog"].startswith("binlog.")
        assert row["binlog_headroom_files"] >= 0 and row["last_commit"].endswith("Z")
        assert row["active"] is False  # no capture holds the source's lease now
        human = headwater(config, "status", password=password)
        assert "shop" in human.stdout and password not in human.stdout + human.stderr
        assert f"source shop: binlog end {row['binlog_end']}; 0 B behind; oldest binlog kept" in human.stdout

        # /metrics: up from the kind's own login, the binlog's lag and headroom, no PostgreSQL slot gauges.
        monkeypatch.setenv(PASSWORD_VAR, password)
        gauges = source_metrics(config)
        assert gauges.pop("headwater_capture_last_commit_timestamp_seconds") > time.time() - 600
        assert gauges == {
            "headwater_source_up": 1.0,
            "headwater_capture_lag_bytes": 0.0,
            "headwater_capture_lag_seconds": 0.0,
            "headwater_binlog_headroom_bytes": float(row["binlog_headroom_bytes"]),
            "headwater_binlog_position_purged": 0.0,
        }
        # Changes not captured yet: lag in bytes up to the server's end (across a file switch).
        mariadb_database.script("INSERT INTO customers VALUES (4, 'di')", "FLUSH BINARY LOGS")
        mariadb_database.script("INSERT INTO customers VALUES (5, 'ed')")
        # MariaDB writes the new file's Binlog_checkpoint event when it gets to it, after FLUSH BINARY
        # LOGS returned: the end may still move by it between two reads, so they are taken until the
        # end stands still (status and /metrics must then agree).
        deadline = time.monotonic() + 30
        while True:
            behind = orjson.loads(headwater(config, "status", "--json", password=password).stdout)
            (late,) = [s for s in behind["sources"] if s["source"] == "shop"]
            scraped_lag = source_metrics(config)["headwater_capture_lag_bytes"]
            again = orjson.loads(headwater(config, "status", "--json", password=password).stdout)
            (still,) = [s for s in again["sources"] if s["source"] == "shop"]
            if still["binlog_end"] == late["binlog_end"] or time.monotonic() > deadline:
                break
        assert late["position"] == row["position"] and late["binlog_end"] != row["binlog_end"]
        assert late["lag_bytes"] > 0 and late["lag_seconds"] >= 0
        assert scraped_lag == late["lag_bytes"]
        headwater(config, "capture", "shop", "--until-caught-up", password=password)
        assert source_metrics(config)["headwater_capture_lag_bytes"] == 0
        registry = CollectorRegistry()
        registry.register(PipelineCollector(load_config(config), Scope(sources=("shop",))))
        scraped = generate_latest(registry).decode()
        assert 'headwater_binlog_headroom_bytes{source="shop"}' in scraped and password not in scraped
        monkeypatch.setenv(PASSWORD_VAR, "wrong")
        assert source_metrics(config) == {"headwater_source_up": 0.0}
        config.write_text(
            config.read_text().replace(
                "warehouse:\n  tables: {}", f"warehouse:\n  tables:\n    customers_now: {{from: shop.{db}.customers}}"
            )
        )
        verify = headwater(config, "verify", "customers_now", password=password, ok=False)
        assert verify.returncode != 0
        assert verify.stderr.strip().splitlines() == [
            "error: table 'customers_now' is not loaded yet; run 'headwater load customers_now --available-now'"
        ]

        removed = headwater(config, "source", "remove", "shop", "--yes", password=password)
        assert "removed source shop" in removed.stdout
        assert "shop" not in load_config(config).sources
    finally:
        mariadb_database.script(f"DROP USER '{user}'@'127.0.0.1'")


def test_a_whole_database_with_column_settings_and_filters_through_the_cli(mariadb_database, tmp_path: Path) -> None:
    """``source add --schemas``, then columns, filters and skipped operations added by hand: capture applies them."""
    db = mariadb_database
    db.script(
        "CREATE TABLE t (id INT PRIMARY KEY, secret VARCHAR(20), region VARCHAR(4) COLLATE utf8mb4_bin, n INT)",
        "INSERT INTO t VALUES (1, 'pw1', 'eu', 1), (2, 'pw2', 'us', 2), (3, 'pw3', 'eu', 3)",
    )
    init_project(tmp_path)
    config = tmp_path / "headwater.yaml"
    headwater(
        config, "source", "add", "shop", "--kind", "mysql", "--dsn", db.dsn, "--schemas", db.name, "--yes", password=""
    )
    assert load_config(config).sources["shop"].schemas == (db.name,)
    text = config.read_text().replace(
        f"    schemas: [{db.name}]\n",
        f"    schemas: [{db.name}]\n"
        f"    columns: {{exclude: [{db.name}.t.secret]}}\n"
        f"    filters: {{{db.name}.t: \"region = 'eu'\"}}\n"
        "    skipped_operations: [d]\n",
    )
    config.write_text(text)
    headwater(config, "capture", "shop", "--until-caught-up", password="")
    db.script(
        "UPDATE t SET n = n + 10",
        "DELETE FROM t WHERE id = 3",
        "INSERT INTO t VALUES (4, 'pw4', 'eu', 4)",
        "CREATE TABLE later (id INT PRIMARY KEY)",  # in the database captured whole: captured from its CREATE
        "INSERT INTO later VALUES (7)",
    )
    headwater(config, "capture", "shop", "--until-caught-up", password="")
    tail = headwater(config, "log", "tail", f"shop.{db.name}.t", "--from-beginning", "--json", password="")
    events = [orjson.loads(line)["value"] for line in tail.stdout.splitlines()]
    assert sorted((e["op"], e["after"]["id"], e["after"]["n"]) for e in events if e) == [
        ("c", 4, 4),
        ("r", 1, 1),
        ("r", 3, 3),
        ("u", 1, 11),
        ("u", 3, 13),
    ]
    assert "pw" not in tail.stdout and all("secret" not in e["after"] for e in events if e)
    later = headwater(config, "log", "tail", f"shop.{db.name}.later", "--from-beginning", "--json", password="")
    assert [orjson.loads(line)["value"]["after"] for line in later.stdout.splitlines()] == [{"id": 7}]

    config.write_text(
        config.read_text().replace("    skipped_operations: [d]\n", f"    signal_table: {db.name}.signals\n")
    )
    refused = headwater(config, "capture", "shop", "--until-caught-up", password="", ok=False)
    assert refused.returncode != 0
    assert refused.stderr.strip().splitlines() == [
        f"error: sources.shop.signal_table: {db.name}.signals does not exist; a signal table has the columns id, "
        "type and data"
    ]


def test_an_old_config_with_max_transaction_bytes_still_captures_a_larger_transaction_spilled(
    mariadb_database, tmp_path: Path
) -> None:
    """``max_transaction_bytes`` once stopped capture at a larger transaction; now it is accepted with a warning.

    The transaction spills past ``spill_threshold_bytes`` (1 MiB here) instead, and lands whole.
    """
    db = mariadb_database.name
    mariadb_database.script(
        "CREATE TABLE t (id INT PRIMARY KEY, label VARCHAR(100))",
        "INSERT INTO t SELECT seq, CONCAT('a label of about forty bytes, row ', seq) FROM seq_1_to_30000",
    )
    init_project(tmp_path)
    config = tmp_path / "headwater.yaml"
    source = (
        f"sources:\n  shop:\n    kind: mysql\n    dsn: {mariadb_database.dsn}\n    tables: [{db}.t]\n"
        "    snapshot: never\n    transactions: true\n    spill_threshold_bytes: 1048576\n"
        "    max_transaction_bytes: 1048576\n"
    )
    config.write_text(config.read_text().replace("sources: {}", source))
    headwater(config, "capture", "shop", "--until-caught-up", password="")
    mariadb_database.execute("UPDATE t SET label = CONCAT(label, '!')")  # ~2.6 MB of row events: past the old bound
    mariadb_database.execute("INSERT INTO t VALUES (30001, 'after')")
    done = headwater(config, "capture", "shop", "--until-caught-up", password="")
    warnings = [line for line in done.stderr.splitlines() if "max_transaction_bytes" in line]
    assert len(warnings) == 1 and "is no longer used" in warnings[0] and "Traceback" not in done.stderr, done.stderr
    assert not list((tmp_path / ".headwater" / "capture" / "shop" / "spill").glob("*.spill"))
    tail = ("log", "tail", f"shop.{db}.t", "--from-beginning", "--json")
    events = [orjson.loads(line)["value"] for line in headwater(config, *tail, password="").stdout.splitlines()]
    # log tail reads partition after partition: compare what each key got, not the interleaving
    assert sorted((e["after"]["id"], e["op"]) for e in events) == [(i, "u") for i in range(1, 30001)] + [(30001, "c")]
