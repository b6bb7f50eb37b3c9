"""The PostgreSQL sink's native rows and its Python twin write the same replica, equal to the source.

A table of every column kind the extension writes itself (integers, boolean, text with tabs,
newlines, backslashes and non-ASCII, uuid, an enum, timetz, date, timestamp(3) and timestamp(6),
nulls) is captured, then replicated by two sinks of one project: one with the extension, one with
``HEADWATER_NATIVE=0``. Inserts, updates and deletes, twice; both replicas equal the source
column by column as PostgreSQL prints them, and the extension answers every one of the table's
events (so the first sink did take the native path).
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from log.factory import open_log
from native import speedups

KINDS = """
CREATE TYPE mood AS ENUM ('calm', 'tab\tbed', 'ünï');
CREATE TABLE kinds (
    id int PRIMARY KEY, small smallint, big bigint, flag boolean, body text, ident uuid, feeling mood,
    at_tz timetz, day date, at_ms timestamp(3), at_us timestamp(6)
);
"""
COLUMNS = "id, small, big, flag, body, ident, feeling, at_tz, day, at_ms, at_us"
TEXTS = ["plain", "tab\there", "new\nline", "back\\slash", "quote \" ' and /", "ünïcödé 😀 \u2028", "\x01\x7f", ""]


def _write(conn: psycopg.Connection[Any], first: int, count: int) -> None:
    feelings = ["calm", "tab\tbed", "ünï", None]
    for i in range(first, first + count):
        conn.execute(
            f"INSERT INTO kinds ({COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
            (
                i,
                None if i % 5 == 0 else (i % 65535) - 32767,
                -(2**62) + i if i % 2 else 2**62 - i,
                None if i % 3 == 0 else i % 2 == 0,
                None if i % 7 == 0 else TEXTS[i % len(TEXTS)] * (1 + i % 3),
                f"00000000-0000-0000-0000-{i:012d}",
                feelings[i % 4],
                "10:11:12.5+02" if i % 2 else None,
                ["0001-01-01", "1969-12-31", "2024-02-29", "9999-12-31"][i % 4],
                ["1969-12-31 23:59:59.999", "2024-02-29 12:00", "0001-01-01 00:00:00.001", "9999-12-31 23:59"][i % 4],
                ["1970-01-01 00:00:00.000001", "1969-12-31 23:59:59.999999", "2000-01-01 00:00:00", None][i % 4],
            ),
        )


def _rows(dsn: str, schema: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        # timetz as the log holds it (Debezium's ZonedTime is in UTC)
        casts = ", ".join(
            "(at_tz AT TIME ZONE 'UTC')::text" if c == "at_tz" else f"{c}::text" for c in COLUMNS.split(", ")
        )
        return conn.execute(f"SELECT {casts} FROM {schema}.kinds ORDER BY id").fetchall()


def test_native_rows_and_the_twin_write_the_same_replica_equal_to_the_source(
    pipeline: Any, pg_server: Any, unique_name: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    if speedups is None:
        pytest.skip("the extension is not built (HEADWATER_NATIVE=0 or no compiler): only the twin runs")
    target_db = unique_name("replica")
    pg_server.create_database(target_db)
    target = pg_server.dsn(target_db)
    try:
        pipeline.sinks = {
            name: {
                "kind": "postgres",
                "from": f"{pipeline.name}.public.kinds",
                "batch_size": 40,
                "options": {"dsn": target, "schema": name},
            }
            for name in ("fast", "twin")
        }
        pipeline.setup(extra_tables=KINDS, tables=("public.kinds",))
        source = psycopg.connect(pipeline.dsn, autocommit=True)
        _write(source, 0, 120)
        for round_ in range(2):
            if round_:
                with source.transaction():  # updates of every kind, deletes, new rows
                    source.execute(
                        "UPDATE kinds SET body = body || E'\\t\\\\x', big = -big, day = day + 1 WHERE id % 4 = 1"
                    )
                    source.execute("UPDATE kinds SET at_us = at_us + interval '1 microsecond' WHERE id % 4 = 2")
                    source.execute("DELETE FROM kinds WHERE id % 9 = 0")
                    _write(source, 1000, 30)
            pipeline.cli("capture", "--until-caught-up")
            pipeline.cli("sinks", "run", "fast", "--until-caught-up")
            with monkeypatch.context() as env:
                env.setenv("HEADWATER_NATIVE", "0")
                pipeline.cli("sinks", "run", "twin", "--until-caught-up")
            expected = _rows(pipeline.dsn, "public")
            assert _rows(target, "fast") == expected, f"round {round_}: the native rows differ from the source"
            assert _rows(target, "twin") == expected, f"round {round_}: the twin's rows differ from the source"
        source.close()

        # Every event of the table is one the extension writes (no fallback to the twin).
        from core.config import load_config

        log = open_log(load_config(pipeline.config))
        try:
            topic = f"{pipeline.name}.public.kinds"
            values: list[bytes] = []
            for partition in range(3):
                offset = 0
                while chunk := log.read(topic, partition, offset):
                    values += [r.value for r in chunk if r.value]
                    offset = chunk[-1].offset + 1
        finally:
            log.close()
        ops = speedups.event_ops(values)
        upserts = [v for v, op in zip(values, ops, strict=True) if chr(op) in "cur"]
        assert len(upserts) >= 200 and b"?" not in ops
        names = [c.encode() for c in COLUMNS.split(", ")] + [b"__hw_commit_lsn", b"__hw_txn_index"]
        assert speedups.copy_text(upserts, names, b"iiiiiiiidtTLX") is not None
    finally:
        pg_server.drop_database(target_db)
