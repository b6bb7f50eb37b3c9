"""``source resync`` of a MySQL source converges the log to the source, also across SIGKILLs of capture.

Real MariaDB (a server of this module's own: the tests purge its binlogs). While capture is
stopped, rows are deleted, updated and inserted; the binlog holding that is purged (or, in the
kill tests, the resync is simply requested); then ``source resync`` and capture again. The
log's compacted state must equal the source exactly: the keys deleted meanwhile end with a
reconciling delete (``before``: the last image the log held) plus tombstone, each exactly
once, after everything the log held before and before everything streamed afterwards. Through
the CLI, a SCD1 table loaded before the gap equals the source after the resync too (without the
deletes it keeps the 56 vanished rows).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pymysql
import pytest
from harness.cli import run_headwater
from harness.mariadb import purge_binlogs, start_mariadb_server
from harness.topics import read_topic

from capture.key_set import KEY_SET_FILE, KeySet
from capture.mysql.agent import MySqlAgent
from capture.mysql.resync import request_resync
from capture.mysql.settings import MySqlSource
from capture.resync import REQUEST_FILE
from core.config import load_config
from core.leases import lease
from core.log_config import LogConfig
from log.file.backend import FileLog
from log.topics import table_topic
from operations.scaffold import init_project

ROOT = Path(__file__).resolve().parents[3]
CHILD = ROOT / "tests" / "harness" / "mysql_capture_child.py"
PASSWORD_VAR = "HW_MYSQL_RESYNC_PW"
#: Each table, its columns and key column.
TABLES = {"t": "id INT PRIMARY KEY, v VARCHAR(40)", "e": "k INT PRIMARY KEY, note VARCHAR(20)"}
KEYS = {"t": "id", "e": "k"}


@pytest.fixture(scope="module")
def server() -> Iterator[Any]:
    server, stop = start_mariadb_server()
    try:
        yield server
    finally:
        stop()


def execute(server: Any, db: str, *statements: str) -> None:
    with pymysql.connect(**server.connect_args(db), autocommit=True) as conn, conn.cursor() as cur:
        for statement in statements:
            cur.execute(statement)


def create(server: Any, db: str, rows: int) -> None:
    """Database ``db``: ``t`` with ``rows`` rows, ``e`` with five (all deleted while capture is stopped)."""
    execute(server, "", f"CREATE DATABASE {db}")
    execute(
        server,
        db,
        *(f"CREATE TABLE {table} ({columns})" for table, columns in TABLES.items()),
        f"INSERT INTO t SELECT seq, 'initial' FROM seq_1_to_{rows}",
        "INSERT INTO e SELECT seq, 'e' FROM seq_1_to_5",
    )


def change_while_stopped(server: Any, db: str, rows: int) -> set[int]:
    """Deletes (snapshot and streamed rows), updates and inserts; returns the ids of ``t`` deleted."""
    execute(
        server,
        db,
        f"INSERT INTO t SELECT seq, 'while stopped' FROM seq_{rows + 1}_to_{rows + 50}",
        "UPDATE t SET v = 'updated while stopped' WHERE id BETWEEN 11 AND 40",
        "DELETE FROM t WHERE id BETWEEN 1 AND 5 OR id BETWEEN 100 AND 149 OR id = 12",
        "DELETE FROM t WHERE id = 60",
        "INSERT INTO t VALUES (60, 'deleted and inserted again')",
        "DELETE FROM e",
    )
    return set(range(1, 6)) | set(range(100, 150)) | {12}


def source_rows(server: Any, db: str, table: str) -> dict[int, dict[str, Any]]:
    connection = pymysql.connect(**server.connect_args(db), cursorclass=pymysql.cursors.DictCursor)
    with connection as conn, conn.cursor() as cur:
        cur.execute(f"SELECT * FROM {table}")
        return {row[KEYS[table]]: dict(row) for row in cur.fetchall()}


def table_events(home: Path, topic: str) -> list[tuple[int, bytes, dict[str, Any] | None]]:
    """``(offset, key, event or None for a tombstone)`` of every record of ``topic``."""
    with FileLog(home / "log") as log:
        return [(r.offset, r.key, None if r.value is None else orjson.loads(r.value)) for r in read_topic(log, topic)]


def sequence(event: dict[str, Any]) -> tuple[int, int]:
    return event["source"]["commit_lsn"], event["source"]["txn_index"]


def live_state(records: list[tuple[int, bytes, dict[str, Any] | None]], key: str) -> dict[int, dict[str, Any]]:
    """The table the log defines: its events in sequence order (a truncate empties it), deleted keys left out."""
    latest: dict[int, dict[str, Any]] = {}
    for event in sorted((e for _, _, e in records if e is not None), key=sequence):
        if event["op"] == "t":
            latest.clear()
            continue
        image = event["after"] if event["op"] != "d" else event["before"]
        latest[image[key]] = event
    return {k: e["after"] for k, e in latest.items() if e["op"] != "d"}


def reconciling_deletes(records: list[tuple[int, bytes, dict[str, Any] | None]]) -> list[dict[str, Any]]:
    return [e for _, _, e in records if e is not None and e["op"] == "d" and e["source"]["snapshot"] == "true"]


def assert_converged(
    server: Any, db: str, home: Path, source: str, *, vanished: dict[str, set[int]], before: dict[str, list[Any]]
) -> None:
    """The log equals the source; exactly the vanished keys got one reconciling delete each, placed right."""
    for table, key in KEYS.items():
        records = table_events(home, f"{source}.{db}.{table}")
        assert live_state(records, key) == source_rows(server, db, table), f"{table}: the log is not the source"
        events = [e for _, _, e in records if e is not None]
        assert len({sequence(e) for e in events}) == len(events), f"{table}: two events at one sequence"
        deletes = reconciling_deletes(records)
        counted = Counter(d["before"][key] for d in deletes)
        assert set(counted) == vanished[table] and set(counted.values()) <= {1}, f"{table}: deletes {counted}"
        # ``before`` is the last image the log held for the key before the resync.
        last_before: dict[int, dict[str, Any]] = {}
        for event in before[table]:
            if event is not None and event["op"] != "d":
                last_before[event["after"][key]] = event["after"]
        assert all(d["before"] == last_before[d["before"][key]] for d in deletes)
        # After everything the log held before the resync, and each delete directly followed by its tombstone.
        old = max(sequence(e) for e in before[table] if e is not None)
        assert all(sequence(d) > old for d in deletes)
        by_offset = {(k, offset): e for offset, k, e in records}
        for offset, k, event in records:
            if event is not None and event in deletes:
                assert (k, offset + 1) in by_offset and by_offset[(k, offset + 1)] is None, "delete without tombstone"


def headwater(config: Path, *args: str, password: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    return run_headwater(config, *args, env={PASSWORD_VAR: password}, ok=ok)


def loaded(config: Path, password: str) -> dict[int, dict[str, Any]]:
    """The warehouse table ``t_now`` by id."""
    rows = orjson.loads(
        headwater(config, "query", "SELECT id, v FROM t_now", "--format", "json", password=password).stdout
    )
    return {row["id"]: row for row in rows}


def test_resync_after_a_purged_binlog_deletes_the_rows_gone_meanwhile(server, tmp_path: Path, monkeypatch) -> None:
    db, name, rows = "purged", "shop", 300
    create(server, db, rows)
    init_project(tmp_path)
    config = tmp_path / "headwater.yaml"
    dsn = f"mysql://{server.admin}:${{{PASSWORD_VAR}}}@{server.host}:{server.port}/{db}"
    password = server.password
    add = ("source", "add", name, "--kind", "mysql", "--dsn", dsn, "--tables", f"{db}.t,{db}.e", "--yes")
    headwater(config, *add, password=password)
    monkeypatch.setenv(PASSWORD_VAR, password)
    home = load_config(config).home_dir
    headwater(config, "capture", name, "--until-caught-up", password=password)
    # Streamed before the gap: an update and a delete the log holds as such.
    execute(server, db, "UPDATE t SET v = 'streamed' WHERE id <= 20", "DELETE FROM t WHERE id = 250")
    headwater(config, "capture", name, "--until-caught-up", password=password)
    # A warehouse table loaded before the gap holds the rows that vanish in it.
    config.write_text(
        config.read_text().replace(
            "warehouse:\n  tables: {}", f"warehouse:\n  tables:\n    t_now: {{from: {name}.{db}.t, mode: scd1}}"
        )
    )
    headwater(config, "load", "--available-now", password=password)
    assert loaded(config, password) == source_rows(server, db, "t")

    vanished = change_while_stopped(server, db, rows)
    purge_binlogs(server)
    failed = headwater(config, "capture", name, "--until-caught-up", password=password, ok=False)
    assert failed.returncode != 0 and f"headwater source resync {name}" in failed.stderr, failed.stderr
    before = {table: [e for _, _, e in table_events(home, f"{name}.{db}.{table}")] for table in TABLES}

    refused = headwater(config, "source", "resync", name, password=password, ok=False)
    assert refused.returncode != 0 and "pass --yes" in refused.stderr, refused.stderr
    capturing = lease(home, "capture", name)
    assert capturing.try_acquire()
    try:
        busy = headwater(config, "source", "resync", name, "--yes", password=password, ok=False)
    finally:
        capturing.release()
    assert busy.returncode != 0 and f"source {name} is being captured by pid {os.getpid()}" in busy.stderr, busy.stderr
    assert not (home / "capture" / name / REQUEST_FILE).exists()
    resync = headwater(config, "source", "resync", name, "--yes", password=password)
    assert f"source {name}: positions forgotten (the binlog was read up to " in resync.stdout
    assert "writes deletes for the rows removed meanwhile" in resync.stdout and password not in resync.stdout
    headwater(config, "capture", name, "--until-caught-up", password=password)
    # Streamed after the resync: sorts after its deletes.
    execute(server, db, "UPDATE t SET v = 'after resync' WHERE id = 41", "DELETE FROM t WHERE id = 42")
    execute(server, db, "INSERT INTO e VALUES (3, 'back')")
    headwater(config, "capture", name, "--until-caught-up", password=password)

    headwater(config, "load", "--available-now", password=password)
    assert loaded(config, password) == source_rows(server, db, "t"), "the loaded table is not the source"
    assert_converged(server, db, home, name, vanished={"t": vanished, "e": set(range(1, 6))}, before=before)
    records = table_events(home, f"{name}.{db}.t")
    deletes = reconciling_deletes(records)
    streamed_after = [e for _, _, e in records if e is not None and e["source"]["snapshot"] == "false"]
    streamed_after = [e for e in streamed_after if e["after"] is not None and e["after"]["v"] == "after resync"]
    assert streamed_after and all(sequence(d) < sequence(streamed_after[0]) for d in deletes)
    assert {d["source"]["connector"] for d in deletes} == {"mysql"} and {d["after"] for d in deletes} == {None}
    state_dir = home / "capture" / name
    assert not (state_dir / REQUEST_FILE).exists() and not (state_dir / KEY_SET_FILE).exists()


def capture_in_process(server: Any, db: str, home: Path, source: str) -> None:
    settings = MySqlSource.from_dsn(source, server.dsn(db), tuple(TABLES))
    with FileLog(home / "log") as log:
        MySqlAgent(settings, log, LogConfig(), home / "capture" / source).run(until_caught_up=True)


@pytest.mark.parametrize("kill_at", ["snapshot", "deletes", "clear", "save"])
def test_resync_killed_midway_converges_on_the_rerun(server, tmp_path: Path, kill_at: str, monkeypatch) -> None:
    db, source, rows = f"killed_{kill_at}", "k", 400
    create(server, db, rows)
    home = tmp_path / "home"
    capture_in_process(server, db, home, source)
    execute(server, db, "UPDATE t SET v = 'streamed' WHERE id <= 20", "DELETE FROM t WHERE id = 250")
    capture_in_process(server, db, home, source)
    vanished = change_while_stopped(server, db, rows)
    # A mass delete too, so the deletes go in several batches.
    execute(server, db, "DELETE FROM t WHERE id BETWEEN 301 AND 400")
    vanished |= set(range(301, 401))
    before = {table: [e for _, _, e in table_events(home, f"{source}.{db}.{table}")] for table in TABLES}
    state_dir = home / "capture" / source
    request_resync(state_dir, "test", None)

    tables = ",".join(f"{db}.{table}" for table in TABLES)
    killed = subprocess.run(
        [sys.executable, str(CHILD), source, server.dsn(db), tables, str(home), kill_at],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert killed.returncode == -9, f"not killed at {kill_at}: {killed.returncode} {killed.stderr[-2000:]}"
    assert (state_dir / REQUEST_FILE).exists() == (kill_at != "save")
    if kill_at == "deletes":
        partial = reconciling_deletes(table_events(home, f"{source}.{db}.t"))
        assert 0 < len(partial) < len(vanished), "not killed in the middle of the deletes"

    # The rerun (its keys spill to the on-disk set, as a table past KeySet.SPILL_AT would).
    spilled = []
    spill = KeySet._spill
    monkeypatch.setattr(KeySet, "SPILL_AT", 50)
    monkeypatch.setattr(KeySet, "_spill", lambda self: (spilled.append(self), spill(self)))
    capture_in_process(server, db, home, source)
    assert (len(spilled) == 1) == (kill_at != "save"), "the key set did not spill"
    execute(server, db, "UPDATE t SET v = 'after resync' WHERE id = 41", "DELETE FROM t WHERE id = 42")
    capture_in_process(server, db, home, source)
    assert_converged(server, db, home, source, vanished={"t": vanished, "e": set(range(1, 6))}, before=before)
    assert not (state_dir / REQUEST_FILE).exists() and not (state_dir / KEY_SET_FILE).exists()


def test_a_first_snapshot_writes_no_deletes(server, tmp_path: Path) -> None:
    """Only a requested resync reconciles: a first snapshot into a log holding the topic's history does not."""
    db, source = "first", "f"
    create(server, db, 30)
    home = tmp_path / "home"
    capture_in_process(server, db, home, source)
    execute(server, db, "DELETE FROM t WHERE id <= 10")
    # The positions lost without a resync request (as an operator deleting the state by hand would).
    for path in (home / "capture" / source).iterdir():
        if path.is_file():
            path.unlink()
    capture_in_process(server, db, home, source)
    assert reconciling_deletes(table_events(home, f"{source}.{db}.t")) == []


def purged_gap_then_resync(server: Any, config: Path, name: str, password: str, db: str, *changes: str) -> None:
    """Capture stopped: ``changes`` in ``db``, the binlog purged, ``source resync``, capture."""
    execute(server, db, *changes)
    purge_binlogs(server)
    failed = headwater(config, "capture", name, "--until-caught-up", password=password, ok=False)
    assert failed.returncode != 0 and f"headwater source resync {name}" in failed.stderr, failed.stderr
    headwater(config, "source", "resync", name, "--yes", password=password)


def registered(server: Any, tmp_path: Path, name: str, db: str, *scope: str) -> tuple[Path, str, Path]:
    """A project with source ``name`` (``scope``: ``--tables ...`` or ``--schemas ...``), captured once."""
    init_project(tmp_path)
    config = tmp_path / "headwater.yaml"
    dsn = f"mysql://{server.admin}:${{{PASSWORD_VAR}}}@{server.host}:{server.port}/{db}"
    password = server.password
    headwater(config, "source", "add", name, "--kind", "mysql", "--dsn", dsn, *scope, "--yes", password=password)
    headwater(config, "capture", name, "--until-caught-up", password=password)
    return config, password, load_config(config, strict_env=False).home_dir


@pytest.mark.parametrize("scope", ["tables", "schemas"])
def test_resync_deletes_the_rows_of_a_table_dropped_meanwhile(server, tmp_path: Path, scope: str) -> None:
    """A captured table dropped (or renamed away) while the binlog was gone holds no rows: its keys are deleted."""
    db, name = f"dropped_{scope}", f"d{scope[0]}"
    create(server, db, 40)
    execute(
        server,
        db,
        "CREATE TABLE g (id INT PRIMARY KEY, v VARCHAR(40))",
        "INSERT INTO g SELECT seq, 'g' FROM seq_1_to_7",
    )
    execute(server, db, "CREATE TABLE h (id INT, v VARCHAR(40))", "INSERT INTO h SELECT seq, 'h' FROM seq_1_to_3")
    listed = ("--tables", f"{db}.t,{db}.e,{db}.g,{db}.h") if scope == "tables" else ("--schemas", db)
    config, password, home = registered(server, tmp_path, name, db, *listed)
    execute(server, db, "DELETE FROM g WHERE id = 7")  # streamed: the log holds it deleted already
    headwater(config, "capture", name, "--until-caught-up", password=password)
    renamed = ["RENAME TABLE e TO e_new"] if scope == "schemas" else []
    purged_gap_then_resync(
        server, config, name, password, db, "DROP TABLE g", "DROP TABLE h", *renamed, "DELETE FROM t WHERE id <= 3"
    )
    headwater(config, "capture", name, "--until-caught-up", password=password)
    execute(server, db, "INSERT INTO t VALUES (1, 'after resync')")
    headwater(config, "capture", name, "--until-caught-up", password=password)

    assert live_state(table_events(home, f"{name}.{db}.t"), "id") == source_rows(server, db, "t")
    gone = table_events(home, f"{name}.{db}.g")
    assert live_state(gone, "id") == {}, "the dropped table's rows are live in the log"
    assert Counter(e["before"]["id"] for e in reconciling_deletes(gone)) == Counter(range(1, 7))
    # The keyless table's rows have no key to delete: a truncate after all of them empties it.
    keyless = [e for _, _, e in table_events(home, f"{name}.{db}.h") if e is not None]
    last = max(keyless, key=sequence)
    assert last["op"] == "t" and last["source"]["snapshot"] == "true" and len(keyless) == 4, keyless
    if scope == "schemas":
        assert live_state(table_events(home, f"{name}.{db}.e"), "k") == {}, "the renamed-away name is live"
        KEYS["e_new"] = "k"
        try:
            assert live_state(table_events(home, f"{name}.{db}.e_new"), "k") == source_rows(server, db, "e_new")
        finally:
            del KEYS["e_new"]
    else:
        assert live_state(table_events(home, f"{name}.{db}.e"), "k") == source_rows(server, db, "e")


def test_resync_refuses_a_keyless_table(server, tmp_path: Path) -> None:
    """A keyless table's deleted rows cannot be found: the resync refuses in one line, appending nothing."""
    db, name = "keyless", "nk"
    create(server, db, 20)
    execute(server, db, "CREATE TABLE n (id INT, v VARCHAR(40))", "INSERT INTO n SELECT seq, 'n' FROM seq_1_to_5")
    config, password, home = registered(server, tmp_path, name, db, "--tables", f"{db}.t,{db}.n")
    purged_gap_then_resync(server, config, name, password, db, "DELETE FROM n WHERE id <= 2")
    before = {t: table_events(home, f"{name}.{db}.{t}") for t in ("t", "n")}
    refused = headwater(config, "capture", name, "--until-caught-up", password=password, ok=False)
    lines = [line for line in refused.stderr.splitlines() if "no primary key" in line]
    assert refused.returncode != 0 and len(lines) == 1, refused.stderr
    assert f"table {db}.n has no primary key and no configured key" in lines[0]
    assert f"sources.{name}.keys" in lines[0] and f"'headwater capture {name}' again" in lines[0]
    assert {t: table_events(home, f"{name}.{db}.{t}") for t in ("t", "n")} == before, "the refusal appended"
    assert (home / "capture" / name / REQUEST_FILE).exists(), "the resync is no longer requested"

    # With a configured key the resync proceeds and both tables converge: n's keyless events (rows 1
    # and 2 among them, deleted meanwhile) are emptied by one truncate before its re-snapshot.
    text = config.read_text()
    config.write_text(text.replace("snapshot: initial", f"keys: {{{db}.n: [id]}}\n    snapshot: initial", 1))
    headwater(config, "capture", name, "--until-caught-up", password=password)
    assert live_state(table_events(home, f"{name}.{db}.t"), "id") == source_rows(server, db, "t")
    n_live = live_state(table_events(home, f"{name}.{db}.n"), "id")
    assert n_live == {i: {"id": i, "v": "n"} for i in (3, 4, 5)}, n_live
    n_events = [e for _, _, e in table_events(home, f"{name}.{db}.n") if e is not None]
    assert [e["op"] for e in n_events].count("t") == 1, [e["op"] for e in n_events]
    assert not (home / "capture" / name / REQUEST_FILE).exists()


def test_resync_refuses_a_table_hidden_from_the_capture_user(server, tmp_path: Path) -> None:
    """A table the capture user lost SELECT on looks dropped in information_schema: refused, no row deleted."""
    db, name, user, password = "hidden", "hd", "hw_hidden", "hidden-pw"
    # Its topic is hd.hidden.g_1 (made Kafka-safe): the server is asked for the events' name, g$1.
    g, g_topic = "g$1", table_topic(name, db, "g$1")
    create(server, db, 20)
    execute(
        server,
        db,
        "CREATE TABLE `g$1` (id INT PRIMARY KEY, v VARCHAR(40))",
        "INSERT INTO `g$1` SELECT seq, 'g' FROM seq_1_to_6",
    )
    execute(
        server,
        "",
        f"CREATE USER '{user}'@'127.0.0.1' IDENTIFIED BY '{password}'",
        f"GRANT REPLICATION SLAVE, BINLOG MONITOR ON *.* TO '{user}'@'127.0.0.1'",
        *(f"GRANT SELECT ON `{db}`.`{table}` TO '{user}'@'127.0.0.1'" for table in ("t", "e", g)),
    )
    init_project(tmp_path)
    config = tmp_path / "headwater.yaml"
    dsn = f"mysql://{user}:${{{PASSWORD_VAR}}}@{server.host}:{server.port}/{db}"
    headwater(
        config,
        "source",
        "add",
        name,
        "--kind",
        "mysql",
        "--dsn",
        dsn,
        "--tables",
        f"{db}.t,{db}.e,{db}.{g}",
        "--yes",
        password=password,
    )
    headwater(config, "capture", name, "--until-caught-up", password=password)
    home = load_config(config, strict_env=False).home_dir
    execute(server, "", f"REVOKE SELECT ON `{db}`.`{g}` FROM '{user}'@'127.0.0.1'")
    purged_gap_then_resync(server, config, name, password, db, "DELETE FROM t WHERE id <= 3")
    refused = headwater(config, "capture", name, "--until-caught-up", password=password, ok=False)
    lines = [line for line in refused.stderr.splitlines() if "cannot tell whether it was dropped" in line]
    assert refused.returncode != 0 and len(lines) == 1, refused.stderr
    assert f"table {db}.{g}" in lines[0] and "grant the capture user SELECT" in lines[0], lines[0]
    assert password not in refused.stderr
    gone = table_events(home, g_topic)
    assert reconciling_deletes(gone) == [] and len(live_state(gone, "id")) == 6, "a hidden table's rows were deleted"
    assert (home / "capture" / name / REQUEST_FILE).exists(), "the resync is no longer requested"

    # The privilege back, the resync completes and every table equals the source.
    execute(server, "", f"GRANT SELECT ON `{db}`.`{g}` TO '{user}'@'127.0.0.1'")
    headwater(config, "capture", name, "--until-caught-up", password=password)
    assert live_state(table_events(home, f"{name}.{db}.t"), "id") == source_rows(server, db, "t")
    assert set(live_state(table_events(home, g_topic), "id")) == set(range(1, 7))  # g was not changed
    assert not (home / "capture" / name / REQUEST_FILE).exists()
