"""Per-source settings on a MySQL source (issue 29): the cases whose mechanism differs from PostgreSQL's.

PostgreSQL applies row filters in its publication; MySQL capture evaluates them on decoded binlog
rows (``capture.mysql.row_filter``) and puts them in the snapshot's ``WHERE``: both must agree. Column
settings, keys and skipped operations go through the MySQL table plan. One MariaDB server per worker
(``mariadb_database``); each test its own database, agent and file log.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest
from harness import mysql_type_matrix as matrix
from harness.topics import read_topic, topic_values

from capture.errors import ColumnSettingError, KeyColumnExcludedError
from capture.mysql.agent import MySqlAgent
from capture.mysql.settings import MySqlSource
from core.log_config import LogConfig
from core.source_config import ColumnsConfig, MaskConfig
from log.file.backend import FileLog
from log.table_schemas import latest_schemas

SETUP = (
    "CREATE TABLE items (id INT PRIMARY KEY, label VARCHAR(40) COLLATE utf8mb4_bin, price DECIMAL(10,2), "
    "secret VARCHAR(20), email VARCHAR(40))",
    "CREATE TABLE notes (id INT PRIMARY KEY, body TEXT)",
    "INSERT INTO items SELECT seq, CONCAT('item ', seq), seq, CONCAT('s', seq), CONCAT('u', seq, '@x') "
    "FROM seq_1_to_20",
)


def agent(db: Any, log: FileLog, home: Path, **settings: Any) -> MySqlAgent:
    tables = settings.pop("tables", (f"{db.name}.items", f"{db.name}.notes"))
    source = MySqlSource.from_dsn("src", db.dsn, tables, **settings)
    return MySqlAgent(source, log, LogConfig(partitions=2), home / "capture" / "src")


def in_order(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(events, key=lambda e: (e["source"]["commit_lsn"], e["source"]["txn_index"]))


def test_row_filters_apply_to_the_snapshot_and_to_streamed_rows(mariadb_database, tmp_path: Path) -> None:
    db = mariadb_database
    db.script(*SETUP)
    log = FileLog(tmp_path / "log")
    filters = {f"{db.name}.items": "id % 2 = 0 AND label <> 'item 4'", f"{db.name}.notes": "body IS NOT NULL"}
    agent(db, log, tmp_path, filters=filters).run(until_caught_up=True)
    items = f"src.{db.name}.items"
    assert sorted(e["after"]["id"] for e in topic_values(log, items)) == [2, *range(6, 21, 2)]
    db.script(
        "INSERT INTO items (id, label) VALUES (31, 'odd'), (32, 'even')",
        "UPDATE items SET id = 34 WHERE id = 31",  # moves into the filter: a create
        "UPDATE items SET id = 35 WHERE id = 2",  # leaves it: a delete
        "UPDATE items SET label = 'item 4' WHERE id = 6",  # leaves it by its text: a delete
        "UPDATE items SET price = 99 WHERE id = 8",  # stays in: an update
        "UPDATE items SET price = 99 WHERE id = 9",  # never in: nothing
        "INSERT INTO notes VALUES (1, 'kept'), (2, NULL)",
    )
    agent(db, log, tmp_path, filters=filters).run(until_caught_up=True)
    streamed = [
        (e["op"], (e["after"] or e["before"])["id"]) for e in in_order(topic_values(log, items)) if e["op"] != "r"
    ]
    assert streamed == [("c", 32), ("c", 34), ("d", 2), ("d", 6), ("u", 8)]
    assert [e["after"]["id"] for e in topic_values(log, f"src.{db.name}.notes")] == [1]


@pytest.mark.parametrize(
    ("condition", "problem"),
    [
        # The column's collation as the server reports it; the rest of the grammar: tests/unit (row_filter).
        ("secret = 'x'", "text of collation utf8mb4_general_ci is compared"),
        ("id > 1; DROP TABLE notes", "';' is not allowed"),
    ],
)
def test_a_filter_capture_cannot_evaluate_exactly_is_refused_in_one_line(
    mariadb_database, tmp_path: Path, condition: str, problem: str
) -> None:
    db = mariadb_database
    db.script(*SETUP)
    log = FileLog(tmp_path / "log")
    with pytest.raises(ColumnSettingError) as refused:
        agent(db, log, tmp_path, filters={f"{db.name}.items": condition}).run(until_caught_up=True)
    message = str(refused.value)
    assert message.startswith(f"sources.src.filters.{db.name}.items: ") and problem in message
    assert "\n" not in message
    assert db.execute("SELECT COUNT(*) FROM notes") == [(0,)]
    assert not log.list_topics(), "nothing was read"


def test_the_collate_fix_the_refusal_names_is_evaluated_as_the_server_does(mariadb_database, tmp_path: Path) -> None:
    """utf8mb4_bin is PAD SPACE: case counts, trailing spaces do not; the server's own WHERE agrees."""
    db = mariadb_database
    db.script(*SETUP, "UPDATE items SET secret = 'S1 ' WHERE id = 1", "UPDATE items SET secret = 's1  ' WHERE id = 2")
    log = FileLog(tmp_path / "log")
    filters = {f"{db.name}.items": "secret COLLATE utf8mb4_bin IN ('s1', 's3')"}
    agent(db, log, tmp_path, filters=filters).run(until_caught_up=True)
    db.script("UPDATE items SET secret = 's1 ' WHERE id = 1", "UPDATE items SET secret = 'S3' WHERE id = 3")
    agent(db, log, tmp_path, filters=filters).run(until_caught_up=True)
    events = in_order(topic_values(log, f"src.{db.name}.items"))
    by_server = {r[0] for r in db.execute(f"SELECT id FROM items WHERE {filters[f'{db.name}.items']}")}
    assert [(e["op"], (e["after"] or e["before"])["id"]) for e in events] == [("r", 2), ("r", 3), ("c", 1), ("d", 3)]
    assert by_server == {1, 2}


def test_columns_keys_and_skipped_operations(mariadb_database, tmp_path: Path) -> None:
    db = mariadb_database
    db.script(*SETUP)
    log = FileLog(tmp_path / "log")
    t = f"{db.name}.items"
    settings: dict[str, Any] = {
        "columns": ColumnsConfig(
            exclude=(f"{t}.secret",),
            mask={
                f"{t}.email": MaskConfig(hash="sha256", salt="pepper"),
                f"{t}.label": MaskConfig(truncate=3),
                f"{t}.price": MaskConfig(replace="***"),
            },
        ),
        "keys": {t: ("email", "id")},
        "skipped_operations": ("u", "t"),
    }
    agent(db, log, tmp_path, **settings).run(until_caught_up=True)
    db.script(
        "INSERT INTO items VALUES (50, 'fifty', 5.5, 'hidden', 'f@x')",
        "UPDATE items SET label = 'changed'",
        "DELETE FROM items WHERE id = 1",
        "TRUNCATE notes",
    )
    agent(db, log, tmp_path, **settings).run(until_caught_up=True)
    topic = f"src.{db.name}.items"
    events = topic_values(log, topic)
    assert Counter(e["op"] for e in events) == {"r": 20, "c": 1, "d": 1}
    created = next(e for e in events if e["op"] == "c")["after"]
    digest = hashlib.sha256(b"pepperf@x").hexdigest()[:40]
    assert created == {"id": 50, "label": "fif", "price": "***", "email": digest}
    raw = b"".join(r.value or b"" for r in read_topic(log, topic))
    assert b"hidden" not in raw and b"f@x" not in raw and b"fifty" not in raw
    keys = [orjson.loads(r.key) for r in read_topic(log, topic) if r.value is not None]
    assert all(list(k) == ["id", "email"] for k in keys)  # the configured key, in column order
    schema = latest_schemas(log, topic)[topic]
    assert schema["key"] == ["id", "email"] and schema["key_source"] == "configured"
    columns = {c["name"]: c for c in schema["columns"]}
    assert "secret" not in columns and columns["price"]["masked"] == "replace"
    assert columns["price"]["logical"] == {"type": "string"}
    assert f"src.{db.name}.notes" not in log.list_topics(), "the truncate was skipped"


@pytest.mark.parametrize(
    ("settings", "error", "start"),
    [
        (lambda t: {"keys": {t: ("nope",)}}, ColumnSettingError, "sources.src.keys.{t}: {t} has no column 'nope'"),
        (
            lambda t: {"columns": ColumnsConfig(exclude=(f"{t}.id",))},
            KeyColumnExcludedError,
            "sources.src.columns.exclude: {t}.id is part of the key",
        ),
        (
            lambda t: {"columns": ColumnsConfig(mask={f"{t}.id": MaskConfig(replace="x")})},
            ColumnSettingError,
            "sources.src.columns.mask: {t}.id is part of the key",
        ),
        (
            lambda t: {"columns": ColumnsConfig(exclude=(f"{t}_gone.x",))},
            ColumnSettingError,
            "sources.src.columns.exclude: there is no table {t}_gone",
        ),
    ],
    ids=["unknown key column", "key excluded", "key masked", "no such table"],
)
def test_settings_capture_cannot_apply_are_refused_before_anything_is_read(
    mariadb_database, tmp_path: Path, settings: Any, error: type[Exception], start: str
) -> None:
    db = mariadb_database
    db.script(*SETUP)
    table = f"{db.name}.items"
    log = FileLog(tmp_path / "log")
    with pytest.raises(error) as refused:
        agent(db, log, tmp_path, **settings(table)).run(until_caught_up=True)
    assert str(refused.value).startswith(start.format(t=table)) and "\n" not in str(refused.value)
    assert not log.list_topics()


def test_a_database_captured_whole_picks_up_new_tables(mariadb_database, tmp_path: Path) -> None:
    db = mariadb_database
    db.script(*SETUP)
    log = FileLog(tmp_path / "log")
    agent(db, log, tmp_path, tables=(), databases=(db.name,)).run(until_caught_up=True)
    db.script("CREATE TABLE later (id INT PRIMARY KEY, v INT)", "INSERT INTO later VALUES (1, 10)")
    agent(db, log, tmp_path, tables=(), databases=(db.name,)).run(until_caught_up=True)
    assert len(topic_values(log, f"src.{db.name}.items")) == 20
    assert [e["after"] for e in topic_values(log, f"src.{db.name}.later")] == [{"id": 1, "v": 10}]
    assert f"src.{db.name}.later" in latest_schemas(log, f"src.{db.name}.later")


def test_columns_left_out_are_stepped_over_in_binlog_rows_of_every_type(mariadb_database, tmp_path: Path) -> None:
    """The row decoder skips excluded columns by their encoded size: the kept ones must decode as without it."""
    db = mariadb_database
    db.script(matrix.create_table())
    table = f"{db.name}.matrix"
    names = [name for name, _ in matrix.COLUMNS]
    halves = {
        "even": ColumnsConfig(exclude=tuple(f"{table}.{n}" for i, n in enumerate(names) if i % 2 == 0 and n != "id")),
        "odd": ColumnsConfig(exclude=tuple(f"{table}.{n}" for i, n in enumerate(names) if i % 2 == 1)),
        "all": ColumnsConfig(),
    }
    logs = {half: FileLog(tmp_path / half / "log") for half in halves}

    def run(half: str) -> None:
        source = MySqlSource.from_dsn("src", db.dsn, (table,), snapshot="never", columns=halves[half])
        MySqlAgent(source, logs[half], LogConfig(partitions=1), tmp_path / half / "capture").run(until_caught_up=True)

    for half in halves:
        run(half)  # each starts streaming at the binlog's end now
    # Zero dates and an invalid ENUM value, as lax servers take them (as the type matrix writes them).
    db.script("SET SESSION sql_mode = ''", *matrix.insert_rows(), *matrix.change_rows())
    for half in halves:
        run(half)
    images = {
        half: [(e["op"], e["before"], e["after"]) for e in topic_values(logs[half], f"src.{table}")] for half in halves
    }
    assert Counter(op for op, _, _ in images["all"]) == {"c": 3, "u": 3, "d": 1}
    for half in ("even", "odd"):
        kept = set(names) - {c.rpartition(".")[2] for c in halves[half].exclude}
        expected = [
            (
                op,
                *(
                    None if image is None else {k: v for k, v in image.items() if k in kept}
                    for image in (before, after)
                ),
            )
            for op, before, after in images["all"]
        ]
        assert images[half] == expected, half
