"""Capture controls (issue 21) against real Postgres and the real file log: messages and markers,
transaction boundaries, skipped operations, row filters, column settings checked at start, signals."""

from __future__ import annotations

import base64
import logging
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest
import yaml
from harness.topics import read_topic, topic_values

from capture.errors import ColumnSettingError, ConfiguredKeyError, PublicationError
from capture.postgres.agent import CaptureAgent
from capture.postgres.catalog import typemap_decoders
from capture.postgres.streaming.markers import MARKER_PREFIX
from capture.resync import ResyncRequest
from core.log_config import LogConfig
from core.source_config import ColumnsConfig, MaskConfig, SourceConfig
from log.file.backend import FileLog


def make_source(pg_server, name: str, *setup: str) -> str:
    dsn = pg_server.create_database(name)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE items (id int PRIMARY KEY, label text, price numeric(10,2));"
            "CREATE TABLE notes (id int PRIMARY KEY, body text);"
            "INSERT INTO items SELECT g, 'item ' || g, g FROM generate_series(1, 20) g;"
            "CREATE TABLE signals (id varchar(64) PRIMARY KEY, type varchar(32) NOT NULL, data varchar(2048));"
            f"CREATE PUBLICATION headwater_{name} FOR TABLE items, notes, signals;"
        )
        for statement in setup:
            conn.execute(statement)
    return dsn


def agent(dsn: str, name: str, log: FileLog, home: Path, **settings: Any) -> CaptureAgent:
    source = SourceConfig(dsn=dsn, tables=("public.items", "public.notes", "public.signals"), **settings)
    return CaptureAgent(
        name, source, log, LogConfig(partitions=2), typemap_decoders(source.types), state_dir=home / "capture" / name
    )


def in_order(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Events of several partitions in the source's order."""
    return sorted(events, key=lambda e: (e["source"]["commit_lsn"], e["source"]["txn_index"]))


def sql(dsn: str, *statements: str, transaction: bool = False) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        if transaction:
            with conn.transaction():
                for statement in statements:
                    conn.execute(statement)
        else:
            for statement in statements:
                conn.execute(statement)


def test_messages_are_captured_and_markers_are_not(pg_server, unique_name, tmp_path):
    name = unique_name("msg")
    dsn = make_source(pg_server, name)
    log = FileLog(tmp_path / "log")
    # Another consumer's slot on the same database sees every logical message.
    sql(dsn, f"SELECT pg_create_logical_replication_slot('{name}_other', 'test_decoding')")
    agent(dsn, name, log, tmp_path, heartbeat_interval_s=0.2).run(until_caught_up=True)
    sql(
        dsn,
        "INSERT INTO items VALUES (100, 'x', 1)",
        "SELECT pg_logical_emit_message(true, 'app.txn', 'in a transaction')",
        transaction=True,
    )
    sql(dsn, "SELECT pg_logical_emit_message(false, 'app.now', '\\x00ff'::bytea)")
    agent(dsn, name, log, tmp_path, heartbeat_interval_s=0.2).run(until_caught_up=True)

    messages = in_order(topic_values(log, f"{name}.message"))
    assert [(m["op"], m["message"]["prefix"], m["message"]["content"]) for m in messages] == [
        ("m", "app.txn", base64.b64encode(b"in a transaction").decode()),  # binary_handling_mode base64
        ("m", "app.now", "AP8="),
    ]
    loose = messages[1]
    assert loose["transaction"] is None and loose["source"]["txId"] is None
    assert loose["source"]["commit_lsn"] == loose["source"]["lsn"] and loose["source"]["txn_index"] == 0
    # What every other slot received from Headwater: markers under the one prefix, nothing else.
    changes = [
        row[0] for row in _rows(dsn, f"SELECT data FROM pg_logical_slot_get_changes('{name}_other', NULL, NULL)")
    ]
    ours = [c for c in changes if c.startswith("message:") and "app." not in c]
    assert ours and all(f"prefix: {MARKER_PREFIX}," in c for c in ours), ours
    assert sum("content:caught-up " in c for c in ours) == 2
    sql(dsn, f"SELECT pg_drop_replication_slot('{name}_other')")
    log.close()


def _rows(dsn: str, query: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(query).fetchall()


#: The fields and their order in the BEGIN/END records Debezium 3.6.3 wrote (provide.transaction.metadata):
#: {"status": "BEGIN", "id": "732:26406224", "event_count": null, "data_collections": null, "ts_ms": ...}
#: {"status": "END", "id": ..., "event_count": 4, "data_collections": [{"data_collection": "public.a",
#: "event_count": 1}, ...], "ts_ms": ...}, keyed {"id": ...}.
DEBEZIUM_TRANSACTION_FIELDS = ["status", "id", "event_count", "data_collections", "ts_ms"]


def test_transaction_boundaries_in_debeziums_format(pg_server, unique_name, tmp_path):
    name = unique_name("txn")
    dsn = make_source(pg_server, name)
    log = FileLog(tmp_path / "log")
    agent(dsn, name, log, tmp_path, transactions=True).run(until_caught_up=True)
    sql(
        dsn,
        "INSERT INTO items VALUES (101, 'a', 1), (102, 'b', 2)",
        "INSERT INTO notes VALUES (1, 'note')",
        "UPDATE items SET label = 'changed' WHERE id = 101",
        "SELECT pg_logical_emit_message(true, 'app', 'hello')",
        "DELETE FROM notes WHERE id = 1",
        transaction=True,
    )
    sql(dsn, "UPDATE items SET label = 'solo' WHERE id = 5")
    agent(dsn, name, log, tmp_path, transactions=True).run(until_caught_up=True)

    boundaries = read_topic(log, f"{name}.transaction")
    assert len(boundaries) == 4, "snapshot rows have no transaction; each streamed transaction has BEGIN and END"
    values = [orjson.loads(r.value) for r in boundaries]
    assert all(list(v) == DEBEZIUM_TRANSACTION_FIELDS for v in values)
    # Per transaction (the id is the key: a transaction's records share a partition), BEGIN then END.
    by_id: dict[str, list[dict[str, Any]]] = {}
    for value in values:
        by_id.setdefault(value["id"], []).append(value)
    assert all([v["status"] for v in pair] == ["BEGIN", "END"] for pair in by_id.values())
    (begin, end), (_, solo) = sorted(by_id.values(), key=lambda pair: -pair[1]["event_count"])
    assert begin["event_count"] is None and begin["data_collections"] is None
    assert all(orjson.loads(r.key) == {"id": orjson.loads(r.value)["id"]} for r in boundaries)
    assert begin["ts_ms"] == end["ts_ms"]
    assert end["data_collections"] == [
        {"data_collection": "public.items", "event_count": 3},
        {"data_collection": "public.notes", "event_count": 2},
        {"data_collection": "message", "event_count": 1},
    ]
    assert end["event_count"] == 6
    # Every event of the transaction references it (tombstones carry no value).
    xid, commit = (int(part) for part in begin["id"].split(":"))
    events = [
        e
        for topic in (f"{name}.public.items", f"{name}.public.notes")
        for e in topic_values(log, topic)
        if e["source"]["commit_lsn"] == commit
    ]
    assert len(events) == 5 and all(e["transaction"]["id"] == begin["id"] for e in events)
    assert all(e["source"]["txId"] == xid for e in events)
    assert sorted(e["transaction"]["total_order"] for e in events) == [1, 2, 3, 4, 6]
    (message,) = topic_values(log, f"{name}.message")
    assert message["transaction"] == {"id": begin["id"], "total_order": 5, "data_collection_order": 1}
    per_table = Counter((e["source"]["table"], e["transaction"]["data_collection_order"]) for e in events)
    assert per_table == {("items", 1): 1, ("items", 2): 1, ("items", 3): 1, ("notes", 1): 1, ("notes", 2): 1}
    assert solo["data_collections"] == [{"data_collection": "public.items", "event_count": 1}]
    log.close()


def test_skipped_operations(pg_server, unique_name, tmp_path):
    name = unique_name("skip")
    dsn = make_source(pg_server, name)
    log = FileLog(tmp_path / "log")
    run = agent(dsn, name, log, tmp_path, skipped_operations=("u", "t"))
    run.run(until_caught_up=True)
    sql(
        dsn,
        "INSERT INTO items VALUES (200, 'new', 1)",
        "UPDATE items SET label = 'changed'",
        "UPDATE items SET id = 201 WHERE id = 200",  # an update, skipped whole (as Debezium skips it)
        "DELETE FROM items WHERE id = 1",
        "TRUNCATE notes",
    )
    agent(dsn, name, log, tmp_path, skipped_operations=("u", "t")).run(until_caught_up=True)
    ops = Counter(e["op"] for e in topic_values(log, f"{name}.public.items"))
    assert ops == {"r": 20, "c": 1, "d": 1}
    assert f"{name}.public.notes" not in log.list_topics() or not topic_values(log, f"{name}.public.notes")
    log.close()


def test_row_filters_apply_to_snapshots_and_streaming(pg_server, unique_name, tmp_path):
    name = unique_name("flt")
    dsn = make_source(pg_server, name, "ALTER TABLE notes REPLICA IDENTITY FULL")
    log = FileLog(tmp_path / "log")
    filters = {"public.items": "id % 2 = 0", "public.notes": "body <> 'secret'"}
    agent(dsn, name, log, tmp_path, filters=filters).run(until_caught_up=True)
    items = f"{name}.public.items"
    assert sorted(e["after"]["id"] for e in topic_values(log, items)) == list(range(2, 21, 2))
    sql(
        dsn,
        "INSERT INTO items VALUES (31, 'odd', 1), (32, 'even', 1)",
        "UPDATE items SET id = 34 WHERE id = 33 - 2",  # 31 -> 34: moves into the filter, arrives as an insert
        "UPDATE items SET id = 35 WHERE id = 2",  # leaves the filter: arrives as a delete
        "INSERT INTO notes VALUES (1, 'public'), (2, 'secret')",
    )
    agent(dsn, name, log, tmp_path, filters=filters).run(until_caught_up=True)
    streamed = [
        (e["op"], (e["after"] or e["before"])["id"]) for e in in_order(topic_values(log, items)) if e["op"] != "r"
    ]
    assert streamed == [("c", 32), ("c", 34), ("d", 2)]
    assert [e["after"]["body"] for e in topic_values(log, f"{name}.public.notes")] == ["public"]
    rowfilter = _rows(
        dsn, f"SELECT rowfilter FROM pg_publication_tables WHERE pubname = 'headwater_{name}' AND tablename = 'items'"
    )
    assert rowfilter == [("((id % 2) = 0)",)]
    # A resync's re-snapshot reads only the rows the filter holds for too.
    ResyncRequest.new(tmp_path / "capture" / name, "test").save()
    agent(dsn, name, log, tmp_path, filters=filters).run(until_caught_up=True)
    reads = [e for e in topic_values(log, items) if e["op"] == "r"]
    point = max(e["source"]["commit_lsn"] for e in reads)
    assert sorted(e["after"]["id"] for e in reads if e["source"]["commit_lsn"] == point) == [*range(4, 21, 2), 32, 34]
    log.close()


def test_a_filter_on_a_column_outside_the_replica_identity_is_refused(pg_server, unique_name, tmp_path):
    """PostgreSQL would refuse every UPDATE of the table: the filter is refused and the publication left alone."""
    name = unique_name("fri")
    dsn = make_source(pg_server, name)
    log = FileLog(tmp_path / "log")
    with pytest.raises(ColumnSettingError) as refused:
        agent(dsn, name, log, tmp_path, filters={"public.items": "price > 5"}).run(until_caught_up=True)
    message = str(refused.value)
    assert message.startswith(f"sources.{name}.filters.public.items: the filter uses column 'price'")
    assert "\n" not in message and "REPLICA IDENTITY FULL" in message
    sql(dsn, "UPDATE items SET label = 'still updatable'")
    with pytest.raises(ColumnSettingError, match=r"filters\.public\.items: .* is not a row filter: syntax error"):
        agent(dsn, name, log, tmp_path, filters={"public.items": "id >"}).run(until_caught_up=True)
    for condition, problem in [
        ("id > 1); DROP TABLE notes; --", "a '\\)' closes a parenthesis that was not opened"),
        ("id > 1; DROP TABLE notes", "';' is not allowed in a condition"),
        ("id > 1 -- and more", "comments are not allowed"),
    ]:
        with pytest.raises(ColumnSettingError, match=rf"filters\.public\.items: {problem}"):
            agent(dsn, name, log, tmp_path, filters={"public.items": condition}).run(until_caught_up=True)
    assert _rows(dsn, "SELECT count(*) FROM notes") == [(0,)]
    assert not (tmp_path / "log").exists() or not log.list_topics(), "nothing was read from the slot"
    log.close()


@pytest.mark.parametrize(
    ("settings", "field", "problem"),
    [
        (
            {"columns": ColumnsConfig(mask={"public.items.nope": MaskConfig(replace="*")})},
            "columns.mask",
            "no column 'nope'",
        ),
        ({"columns": ColumnsConfig(exclude=("public.gone.x",))}, "columns.exclude", "no table public.gone"),
        ({"keys": {"public.items": ("label", "nope")}}, "keys.public.items", "no column 'nope'"),
        ({"signal_table": "public.notes"}, "signal_table", "no column 'type'"),
    ],
)
def test_settings_naming_what_the_database_lacks_are_refused_in_one_line(
    pg_server, unique_name, tmp_path, settings, field, problem
):
    name = unique_name("bad")
    dsn = make_source(pg_server, name)
    log = FileLog(tmp_path / "log")
    with pytest.raises((ColumnSettingError, ConfiguredKeyError)) as refused:
        agent(dsn, name, log, tmp_path, **settings).run(until_caught_up=True)
    assert str(refused.value).startswith(f"sources.{name}.{field}: ") and problem in str(refused.value)
    assert "\n" not in str(refused.value)
    assert not log.list_topics()
    log.close()


def test_a_source_without_its_publication_is_refused_in_one_line_before_any_slot(pg_server, unique_name, tmp_path):
    """Configured by hand, never registered: the snapshot would read no table and report success."""
    name = unique_name("nopub")
    dsn = make_source(pg_server, name, f"DROP PUBLICATION headwater_{name}")
    log = FileLog(tmp_path / "log")
    with pytest.raises(PublicationError) as refused:
        agent(dsn, name, log, tmp_path).run(until_caught_up=True)
    message = str(refused.value)
    assert message.startswith(f"source {name}: publication headwater_{name} does not exist"), message
    assert (
        f'CREATE PUBLICATION "headwater_{name}" FOR TABLE "public"."items", "public"."notes"' in message
        and "\n" not in message
    )
    assert _rows(dsn, "SELECT count(*) FROM pg_replication_slots WHERE database = current_database()") == [(0,)]
    assert not (tmp_path / "log").exists() or not log.list_topics()
    log.close()


@contextmanager
def following(run: CaptureAgent) -> Iterator[None]:
    """The agent streaming in a thread (until the block ends)."""
    errors: list[BaseException] = []

    def target() -> None:
        try:
            run.run(until_caught_up=False)
        except BaseException as exc:  # re-raised below
            errors.append(exc)

    thread = threading.Thread(target=target, name="capture-under-test")
    thread.start()
    try:
        yield
    finally:
        run.stop()
        thread.join(60)
    if errors:
        raise errors[0]


def wait_for(what: str, check: Callable[[], bool], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_signals_while_capture_streams(pg_server, unique_name, tmp_path, caplog):
    name = unique_name("sig")
    dsn = make_source(pg_server, name, "INSERT INTO notes SELECT g, 'note ' || g FROM generate_series(1, 30) g")
    log = FileLog(tmp_path / "log")
    settings = {"signal_table": "public.signals", "filters": {"public.items": "id <= 15"}}
    agent(dsn, name, log, tmp_path, **settings).run(until_caught_up=True)
    items, notes = f"{name}.public.items", f"{name}.public.notes"

    def incremental(topic: str) -> list[int]:
        return sorted(e["after"]["id"] for e in topic_values(log, topic) if e["source"]["snapshot"] == "incremental")

    def signal(ident: str, kind: str, data: str | None) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO signals VALUES (%s, %s, %s)", (ident, kind, data))

    caplog.set_level(logging.INFO, logger="capture.signals")  # the orders are carried out there
    run = agent(dsn, name, log, tmp_path, **settings)
    with following(run):
        signal("s1", "log", '{"message": "hello from SQL"}')
        signal("s2", "bogus", "{}")
        signal("s3", "execute-snapshot", "not json")
        signal("s4", "execute-snapshot", '{"data-collections": ["public.nope"]}')
        signal(
            "s5",
            "execute-snapshot",
            '{"data-collections": ["public.items", "public.notes"], "type": "incremental",'
            ' "additional-conditions": [{"data-collection": "public.notes", "filter": "id > 25"}]}',
        )
        wait_for("the incremental snapshots", lambda: incremental(notes) == [26, 27, 28, 29, 30])
        assert incremental(items) == list(range(1, 16)), "the source's filter holds for incremental snapshots"
        signal("s6", "pause-snapshot", None)
        signal("s7", "execute-snapshot", '{"data-collections": ["public.notes"]}')
        signal("s8", "log", '{"message": "after the pause"}')
        wait_for("the log signal after the pause", lambda: "after the pause" in caplog.text)
        time.sleep(1.5)
        assert len(incremental(notes)) == 5, "paused: nothing read"
        signal("s9", "resume-snapshot", None)
        wait_for("the snapshot after resume", lambda: len(incremental(notes)) == 35)
        signal("s10", "execute-snapshot", '{"data-collections": ["public.notes"], "additional-conditions":'
               ' [{"data-collection": "public.notes", "filter": "id > 0) OR (true"}]}')  # fmt: skip
        wait_for("the written-back refusals", lambda: len(_refusals(dsn)) == 4)
        sql(dsn, "INSERT INTO items VALUES (5000, 'streamed meanwhile', 1)")  # filtered out: id > 15
        sql(dsn, "INSERT INTO items VALUES (0, 'streamed meanwhile', 1)")
        wait_for(
            "a change streamed after the signals", lambda: 0 in [e["after"]["id"] for e in topic_values(log, items)]
        )
    refusals = _refusals(dsn)
    assert any("'s2' ('bogus') refused: unknown signal type 'bogus'" in r for r in refusals)
    assert any("'s3' ('execute-snapshot') refused: its data 'not json' is not JSON" in r for r in refusals)
    assert any("'s4'" in r and "public.nope" in r and "not captured" in r for r in refusals)
    assert any("'s10'" in r and "closes a parenthesis" in r for r in refusals)
    assert "signal s1: hello from SQL" in caplog.text
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 4 and all("\n" not in w for w in warnings)
    # The signals themselves are captured like the other tables, and none is carried out twice on restart.
    assert len(topic_values(log, f"{name}.public.signals")) >= 10
    before = len(topic_values(log, notes))
    agent(dsn, name, log, tmp_path, **settings).run(until_caught_up=True)
    assert len(topic_values(log, notes)) == before
    log.close()


def _refusals(dsn: str) -> list[str]:
    rows = _rows(dsn, "SELECT data FROM signals WHERE type = 'log' AND id LIKE 'headwater-%'")
    return [orjson.loads(data)["message"] for (data,) in rows]


def test_the_cli_refuses_bad_settings_in_one_line_and_loses_nothing(pg_server, unique_name, tmp_path):
    """Through the real CLI: each refusal is one ``error:`` line, exit 3, and the changes made meanwhile
    are all captured once the setting is fixed (the slot kept them)."""
    name = unique_name("cli")
    dsn = make_source(pg_server, name)
    good = {"dsn": dsn, "tables": ["public.items", "public.notes"], "heartbeat_interval_s": 1}

    def capture(**settings: Any) -> subprocess.CompletedProcess[str]:
        config = tmp_path / "headwater.yaml"
        config.write_text(yaml.safe_dump({"project": "cli", "sources": {name: {**good, **settings}}}))
        return subprocess.run(
            [sys.executable, "-m", "headwater", "--config", str(config), "capture", "--until-caught-up"],
            capture_output=True,
            text=True,
            timeout=300,
            stdin=subprocess.DEVNULL,
        )

    assert capture().returncode == 0
    sql(dsn, "INSERT INTO items VALUES (300, 'meanwhile', 1)", "UPDATE items SET label = 'meanwhile' WHERE id = 1")
    refusals = {
        "columns.mask": capture(columns={"mask": {"public.items.nope": {"replace": "*"}}}),
        "keys.public.items": capture(keys={"public.items": ["nope"]}),
        "filters.public.items": capture(filters={"public.items": "id >"}),
    }
    for field, result in refusals.items():
        assert result.returncode == 3, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: sources.{name}.{field}: "), result.stderr
    assert capture().returncode == 0
    log = FileLog(tmp_path / ".headwater" / "log")
    streamed = [e for e in topic_values(log, f"{name}.public.items") if e["op"] != "r"]
    assert sorted((e["op"], e["after"]["id"]) for e in streamed) == [("c", 300), ("u", 1)]
    log.close()


def test_a_role_that_cannot_alter_the_publication_gets_the_statement_for_its_owner(pg_server, unique_name, tmp_path):
    name, role = unique_name("own"), unique_name("capture")
    dsn = make_source(pg_server, name)
    sql(
        dsn,
        f"CREATE ROLE {role} LOGIN REPLICATION PASSWORD 'pw'",
        f"GRANT SELECT ON items, notes, signals TO {role}",
    )
    role_dsn = psycopg.conninfo.make_conninfo(dsn, user=role, password="pw")
    log = FileLog(tmp_path / "log")
    filters = {"public.items": "id <= 5"}
    try:
        with pytest.raises(PublicationError) as refused:
            agent(role_dsn, name, log, tmp_path, filters=filters).run(until_caught_up=True)
        message = str(refused.value)
        assert "\n" not in message and "its owner can run: " in message, message
        statement = message.split("its owner can run: ", 1)[1]
        assert statement.endswith("WHERE (id <= 5)")
        sql(dsn, *statement.split("; "), transaction=True)  # the owner runs it
        agent(role_dsn, name, log, tmp_path, filters=filters).run(until_caught_up=True)
        assert sorted(e["after"]["id"] for e in topic_values(log, f"{name}.public.items")) == [1, 2, 3, 4, 5]
        # The configured condition changed since: the publication's filter is not the configured one any more.
        with pytest.raises(PublicationError, match=r"its owner can run: .*WHERE \(id <= 3\)$"):
            agent(role_dsn, name, log, tmp_path, filters={"public.items": "id <= 3"}).run(until_caught_up=True)
    finally:
        log.close()
        sql(dsn, f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{role}'")
        sql(dsn, f"DROP OWNED BY {role}")
        pg_server.execute(f"DROP ROLE IF EXISTS {role}")
