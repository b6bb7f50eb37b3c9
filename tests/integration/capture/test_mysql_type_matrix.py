"""The MySQL type matrix against Debezium's MySQL connector, in each handling mode (issue 29).

One MariaDB 10.11 (reporting the version Debezium 3.6.3's MySQL connector accepts, see
``harness/debezium_mysql.py``), one table with a column of every type
(``harness/mysql_type_matrix.py``): three rows (typical values, bounds and zero dates, NULLs) are
inserted, updated and one deleted while three Debezium engines stream the binlog, each in other
modes. Headwater's decoder reads the same binlog range; every row image must equal Debezium's,
column by column, except the differences listed in :data:`DELIBERATE` (``docs/mysql-types.md``).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import orjson
import pymysql
import pytest
from harness import mysql_type_matrix as matrix
from harness.debezium_mysql import MySqlModes, log_mark, mysql_connector_properties, wait_streaming
from harness.mariadb import DEBEZIUM_VERSION_STRING, start_mariadb_server
from harness.mysql_binlog_range import decode_range
from harness.topics import read_topic

from capture.mysql.agent import MySqlAgent
from capture.mysql.binlog.client import ServerAddress
from capture.mysql.binlog.position import BinlogPosition
from capture.mysql.settings import MySqlSource
from capture.mysql.types.values import TypeModes
from core.log_config import LogConfig
from log.file.backend import FileLog

MODES = (
    MySqlModes(),  # Debezium's defaults
    MySqlModes("string", "connect", "precise", "hex"),
    MySqlModes("double", "adaptive_time_microseconds", "precise", "base64-url-safe"),
)
DATABASE, TABLE = "types", "matrix"
#: Row changes the workload makes: 3 inserts, 3 updates, 1 delete.
CHANGES = 7

#: Differences on purpose: column -> why. A zero date in a NOT NULL column is an invalid value the
#: row holds; Debezium writes the column's DEFAULT there (a value the row does not hold), Headwater
#: writes 0 (the epoch), as Debezium's documentation says it should.
#: Columns of the matrix the native decoder writes in every mode, at least (the others: BIT(n), GEOMETRY,
#: JSON, other character sets, DECIMAL/BIGINT UNSIGNED in precise mode).
NATIVE_COLUMNS = 30
DELIBERATE = {"d_nn": "zero date in a NOT NULL column: Debezium writes the DEFAULT, Headwater the epoch (0)"}


def headwater_modes(modes: MySqlModes) -> TypeModes:
    return TypeModes(modes.decimal, modes.time, modes.bigint, "base64" if modes.binary == "bytes" else modes.binary)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def changes(debezium: Any) -> dict[str, tuple[list[Any], list[Any]]]:
    server, stop = start_mariadb_server(version=DEBEZIUM_VERSION_STRING)
    try:
        conn = pymysql.connect(**server.connect_args(), autocommit=True)
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE {DATABASE}")
            cur.execute(f"USE {DATABASE}")
            cur.execute(matrix.create_table(TABLE))
        work = Path(tempfile.mkdtemp(prefix="hw-dbz-mysql-"))
        engines = []
        mark = log_mark(debezium)
        for i, modes in enumerate(MODES):
            name = f"mysql_matrix_{i}"
            properties = mysql_connector_properties(
                name=name,
                host=server.host,
                port=server.port,
                user=server.admin,
                password=server.password,
                database=DATABASE,
                tables=(TABLE,),
                server_id=6000 + i,
                topic_prefix=f"m{i}",
                modes=modes,
                work_dir=work,
                snapshot_mode="no_data",
            )
            engines.append(debezium.engine(name, properties))
        # Each engine reads the binlog from where its (empty) snapshot ended: wait until all stream.
        wait_streaming(debezium, len(engines), since=mark)
        with conn.cursor() as cur:
            cur.execute("SHOW MASTER STATUS")
            file, offset = cur.fetchone()[:2]
            cur.execute("SET SESSION sql_mode = ''")  # zero dates and an invalid ENUM value, as lax servers take them
            for statement in matrix.insert_rows(TABLE) + matrix.change_rows(TABLE):
                cur.execute(statement)
        address = ServerAddress(server.host, server.port, server.admin, server.password)
        out = {}
        for modes, engine in zip(MODES, engines, strict=True):
            engine.wait_for(lambda records: sum(r["value"] is not None for r in records) >= CHANGES, 120, "changes")
            theirs = [
                (r["value"]["op"], r["value"]["before"], r["value"]["after"]) for r in engine.records() if r["value"]
            ]
            ours = decode_range(address, BinlogPosition(file, offset), headwater_modes(modes), DATABASE, TABLE)
            out[modes.label] = (ours, theirs)
            native = decode_range(
                address, BinlogPosition(file, offset), headwater_modes(modes), DATABASE, TABLE, native_only=True
            )
            out[f"native {modes.label}"] = (native, theirs)
            engine.stop()
        # The initial snapshot of the final rows: Headwater's agent and Debezium's, in each mode.
        for i, modes in enumerate(MODES):
            name = f"mysql_matrix_snapshot_{i}"
            properties = mysql_connector_properties(
                name=name,
                host=server.host,
                port=server.port,
                user=server.admin,
                password=server.password,
                database=DATABASE,
                tables=(TABLE,),
                server_id=6100 + i,
                topic_prefix=f"s{i}",
                modes=modes,
                work_dir=work,
                snapshot_mode="initial",
            )
            engine = debezium.engine(name, properties)
            engine.wait_for(
                lambda records: any(r["value"] and r["value"]["source"]["snapshot"] == "last" for r in records),
                120,
                "snapshot",
            )
            theirs = [(r["value"]["op"], None, r["value"]["after"]) for r in engine.records() if r["value"]]
            engine.stop()
            out[f"snapshot {modes.label}"] = (snapshot_rows(server, headwater_modes(modes), work / f"hw{i}"), theirs)
        return out
    finally:
        stop()


def snapshot_rows(server: Any, modes: TypeModes, home: Path) -> list[Any]:
    """Headwater's initial snapshot of the matrix table: ``("r", None, after)`` per row, in key order."""
    log = FileLog(home / "log")
    source = MySqlSource.from_dsn("hw", server.dsn(DATABASE), (TABLE,), modes=modes)
    MySqlAgent(source, log, LogConfig(), home / "state").run(until_caught_up=True)
    events = [orjson.loads(r.value) for r in read_topic(log, f"hw.{DATABASE}.{TABLE}") if r.value is not None]
    return sorted((("r", None, e["after"]) for e in events if e["op"] == "r"), key=lambda e: e[2]["id"])


@pytest.mark.parametrize("kind", ["stream", "native", "snapshot"])
@pytest.mark.parametrize("modes", MODES, ids=lambda m: m.label)
def test_every_type_equals_debezium_but_for_the_deliberate(
    changes: dict[str, tuple[list[Any], list[Any]]], modes: MySqlModes, kind: str
) -> None:
    # native: the columns the extension writes (native/binlog_rows.c), decoded by it, the others left out.
    ours, theirs = changes[modes.label if kind == "stream" else f"{kind} {modes.label}"]
    theirs = theirs if kind != "snapshot" else sorted(theirs, key=lambda e: e[2]["id"])
    expected = ["c", "c", "c", "u", "u", "u", "d"] if kind != "snapshot" else ["r", "r"]
    assert [op for op, _, _ in theirs] == expected
    assert [op for op, _, _ in ours] == [op for op, _, _ in theirs]
    differences = []
    for index, ((_, our_before, our_after), (_, their_before, their_after)) in enumerate(
        zip(ours, theirs, strict=True)
    ):
        for side, mine, debeziums in (("before", our_before, their_before), ("after", our_after, their_after)):
            assert (mine is None) == (debeziums is None), (index, side)
            if mine is None:
                continue
            if kind == "native":
                assert len(mine) >= NATIVE_COLUMNS and set(mine) < set(debeziums), (index, side, sorted(mine))
            else:
                assert set(mine) == set(debeziums), (index, side, set(mine) ^ set(debeziums))
            differences += [
                f"change {index} {side} {column}: ours {mine[column]!r}, Debezium {debeziums[column]!r}"
                for column in mine
                if mine[column] != debeziums[column] and column not in DELIBERATE
            ]
    assert not differences, "\n".join(differences)


def test_the_deliberate_differences_still_differ(changes: dict[str, tuple[list[Any], list[Any]]]) -> None:
    # An allow-list entry Debezium no longer needs must go: the zero date row is change 1 (id 2).
    ours, theirs = changes[MODES[0].label]
    assert ours[1][2]["d_nn"] == 0
    assert theirs[1][2]["d_nn"] != 0


def test_the_matrix_has_every_type_family() -> None:
    kinds = " ".join(kind for _, kind in matrix.COLUMNS).upper()
    for family in (
        "TINYINT UNSIGNED",
        "BIGINT UNSIGNED",
        "DECIMAL",
        "FLOAT",
        "DOUBLE",
        "BIT(1)",
        "BIT(64)",
        "BOOLEAN",
        "CHARACTER SET LATIN1",
        "CHARACTER SET UCS2",
        "BINARY(",
        "BLOB",
        "ENUM(",
        "SET(",
        "JSON",
        "DATE",
        "TIME(6)",
        "DATETIME(6)",
        "TIMESTAMP(6)",
        "YEAR",
        "GEOMETRY",
        "POINT",
        "VIRTUAL",
        "STORED",
    ):
        assert family in kinds, family
