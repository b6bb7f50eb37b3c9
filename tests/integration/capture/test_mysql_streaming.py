"""MySQL capture streaming into the log, event by event against Debezium's MySQL connector (issue 29).

One MariaDB (reporting the version Debezium 3.6.3's MySQL connector accepts), a Debezium engine
streaming it, and Headwater's MySQL agent writing a file log. The workload: multi-row and
multi-table transactions, updates (one changing the primary key), deletes, a keyless table, a
DDL sequence mid-stream (add, modify, rename, drop a column) and a TRUNCATE. After each DDL step
the table rebuilt from the log equals the source table. Every event equals Debezium's in topic
(up to the prefix), key, op, images and the binlog fields of ``source``; the differences are the
listed ones (:data:`DIFFERENT_SOURCE_FIELDS`).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import orjson
import pymysql
import pytest
from harness.debezium_mysql import MySqlModes, log_mark, mysql_connector_properties, wait_streaming
from harness.mariadb import DEBEZIUM_VERSION_STRING, start_mariadb_server
from harness.topics import read_topic

from capture.mysql.agent import MySqlAgent
from capture.mysql.settings import MySqlSource
from capture.mysql.types.values import TypeModes
from core.log_config import LogConfig
from log.file.backend import FileLog
from log.table_schemas import latest_schemas

DATABASE = "shop"
#: ``source`` fields written differently on purpose: Headwater's version string; the MariaDB GTID
#: (Debezium's MySQL connector does not parse MariaDB GTIDs and writes null); Headwater's sequence;
#: ``snapshot`` "false" and ``schema`` null, which every Headwater kind writes (``log.envelope``;
#: Debezium's MySQL connector writes snapshot null and no schema).
DIFFERENT_SOURCE_FIELDS = {"version", "name", "gtid", "commit_lsn", "txn_index", "snapshot", "schema"}

SETUP = (
    "CREATE TABLE customers (id INT PRIMARY KEY, name VARCHAR(40), tier INT)",
    "CREATE TABLE orders (id BIGINT PRIMARY KEY, customer_id INT, total DECIMAL(10,2), note TEXT)",
    "CREATE TABLE audit (happened VARCHAR(40))",
)
WORKLOAD: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "rows",
        (
            "INSERT INTO customers VALUES (1, 'ann', 1), (2, 'bob', 2), (3, 'cy', 3)",
            "BEGIN",
            "INSERT INTO orders VALUES (10, 1, 5.50, 'first'), (11, 2, 7.25, NULL)",
            "UPDATE customers SET tier = tier + 1 WHERE id <= 2",
            "INSERT INTO audit VALUES ('orders placed')",
            "COMMIT",
            "UPDATE customers SET id = 30 WHERE id = 3",
            "DELETE FROM orders WHERE id = 11",
        ),
    ),
    (
        "add column",
        ("ALTER TABLE customers ADD COLUMN email VARCHAR(60)", "UPDATE customers SET email = CONCAT(name, '@x')"),
    ),
    (
        "modify column",
        (
            "ALTER TABLE customers MODIFY COLUMN tier BIGINT",
            "INSERT INTO customers VALUES (4, 'di', 5000000000, 'd@x')",
        ),
    ),
    (
        "rename column",
        ("ALTER TABLE customers RENAME COLUMN name TO full_name", "UPDATE customers SET full_name = UPPER(full_name)"),
    ),
    ("drop column", ("ALTER TABLE customers DROP COLUMN email", "INSERT INTO customers VALUES (5, 'ed', 1)")),
    ("truncate", ("TRUNCATE TABLE orders", "INSERT INTO orders VALUES (12, 4, 1.00, 'after truncate')")),
)


def log_state(log: FileLog, topic: str) -> dict[str, dict[str, Any]]:
    """The table the log defines: the latest image per key (a truncate empties it), in the latest schema's columns."""
    rows: dict[str, dict[str, Any]] = {}
    records = sorted(
        (r for r in read_topic(log, topic) if r.value is not None),
        key=lambda r: (orjson.loads(r.value)["source"]["commit_lsn"], orjson.loads(r.value)["source"]["txn_index"]),
    )
    for record in records:
        event = orjson.loads(record.value)
        if event["op"] == "t":
            rows.clear()
        elif event["op"] == "d":
            rows.pop(record.key.decode(), None)
        else:
            rows[record.key.decode()] = event["after"]
    columns = [c["name"] for c in latest_schemas(log, topic)[topic]["columns"]]
    # A row untouched since a column was dropped still has it in its last image: the schema says it is gone.
    return {key: {c: image.get(c) for c in columns} for key, image in rows.items()}


def source_rows(cur: Any, table: str) -> dict[str, dict[str, Any]]:
    cur.execute(f"SELECT * FROM {table}")
    names = [d[0] for d in cur.description]
    out = {}
    for row in cur.fetchall():
        image = {n: (format(v, "f") if hasattr(v, "as_tuple") else v) for n, v in zip(names, row, strict=True)}
        out[orjson.dumps({"id": image["id"]}).decode()] = image
    return out


@pytest.fixture(scope="module")
def run(debezium: Any) -> dict[str, Any]:
    server, stop = start_mariadb_server(version=DEBEZIUM_VERSION_STRING)
    try:
        conn = pymysql.connect(**server.connect_args(), autocommit=True)
        cur = conn.cursor()
        cur.execute(f"CREATE DATABASE {DATABASE}")
        cur.execute(f"USE {DATABASE}")
        for statement in SETUP:
            cur.execute(statement)
        home = Path(tempfile.mkdtemp(prefix="hw-mysql-stream-"))
        log = FileLog(home / "log")
        modes = TypeModes(decimal="string")
        source = MySqlSource.from_dsn(
            "shop", server.dsn(DATABASE), ("customers", "orders", "audit"), modes=modes, transactions=True
        )
        agent = MySqlAgent(source, log, LogConfig(), home / "capture" / "shop")
        agent.run(until_caught_up=True)  # the first run records where the binlog ends: streaming starts there
        properties = mysql_connector_properties(
            name="mysql_stream",
            host=server.host,
            port=server.port,
            user=server.admin,
            password=server.password,
            database=DATABASE,
            tables=("customers", "orders", "audit"),
            server_id=6200,
            topic_prefix="shop",
            modes=MySqlModes(decimal="string"),
            work_dir=home,
            snapshot_mode="no_data",
        )
        mark = log_mark(debezium)
        engine = debezium.engine("mysql_stream", properties)
        wait_streaming(debezium, 1, since=mark)
        equal_after: dict[str, tuple[Any, Any]] = {}
        for step, statements in WORKLOAD:
            for statement in statements:
                cur.execute(statement)
            agent.run(until_caught_up=True)
            equal_after[step] = (log_state(log, "shop.shop.customers"), source_rows(cur, "customers"))
        cur.execute("INSERT INTO audit VALUES ('end')")
        engine.wait_for(
            lambda rs: any(r["value"] and (r["value"].get("after") or {}).get("happened") == "end" for r in rs),
            120,
            "the end marker",
        )
        agent.run(until_caught_up=True)
        theirs = [r for r in engine.records() if r["topic"].count(".") == 2]
        engine.stop()
        ours = []
        for topic in ("shop.shop.customers", "shop.shop.orders", "shop.shop.audit"):
            for record in read_topic(log, topic):
                ours.append(
                    {
                        "topic": topic,
                        "key": None if record.key is None else orjson.loads(record.key),
                        "value": None if record.value is None else orjson.loads(record.value),
                    }
                )
        boundaries = [orjson.loads(r.value) for r in read_topic(log, "shop.transaction")]
        return {"ours": ours, "theirs": theirs, "equal_after": equal_after, "boundaries": boundaries}
    finally:
        stop()


def _order(records: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """Events in binlog order (position, row), tombstones right after their delete."""
    out = []
    last = None
    for record in records:
        if record["value"] is None:
            out.append((*last[:3], 1, record["topic"].split(".", 1)[1], record))
            continue
        source = record["value"]["source"]
        last = (source["file"], source["pos"], source["row"])
        out.append((*last, 0, record["topic"].split(".", 1)[1], record))
    return sorted(out, key=lambda item: item[:4])


@pytest.mark.parametrize("step", [step for step, _ in WORKLOAD])
def test_the_table_from_the_log_equals_the_source_after_each_step(run: dict[str, Any], step: str) -> None:
    from_log, in_source = run["equal_after"][step]
    assert from_log == in_source


def test_every_event_equals_debeziums_but_for_the_listed_source_fields(run: dict[str, Any]) -> None:
    ours, theirs = _order(run["ours"]), _order(run["theirs"])
    assert [(o[4], o[5]["key"]) for o in ours] == [(t[4], t[5]["key"]) for t in theirs]
    for mine, debeziums in zip(ours, theirs, strict=True):
        a, b = mine[5]["value"], debeziums[5]["value"]
        assert (a is None) == (b is None), mine
        if a is None:
            continue
        assert (a["op"], a["before"], a["after"]) == (b["op"], b["before"], b["after"]), mine[:4]
        same = {k: v for k, v in a["source"].items() if k not in DIFFERENT_SOURCE_FIELDS}
        assert same == {k: v for k, v in b["source"].items() if k in same}, mine[:4]
        assert set(b["source"]) - set(a["source"]) == set(), mine[:4]


def test_transactions_are_kept_whole_and_ordered(run: dict[str, Any]) -> None:
    events = [r["value"] for r in run["ours"] if r["value"] is not None]
    by_txn: dict[str, list[dict[str, Any]]] = {}
    for event in events:
        by_txn.setdefault(event["transaction"]["id"], []).append(event)
    multi = [group for group in by_txn.values() if len({e["source"]["table"] for e in group}) == 3]
    assert len(multi) == 1, "the BEGIN..COMMIT over three tables is one transaction"
    (group,) = multi
    assert sorted(e["source"]["txn_index"] for e in group) == list(range(len(group)))
    assert len({e["source"]["commit_lsn"] for e in group}) == 1
    assert sorted(e["transaction"]["total_order"] for e in group) == list(range(1, len(group) + 1))
    txn_id = group[0]["transaction"]["id"]
    begin, end = [b for b in run["boundaries"] if b["id"] == txn_id]
    assert (begin["status"], end["status"]) == ("BEGIN", "END")
    assert end["event_count"] == len(group)
    assert {c["data_collection"] for c in end["data_collections"]} == {"shop.customers", "shop.orders", "shop.audit"}
