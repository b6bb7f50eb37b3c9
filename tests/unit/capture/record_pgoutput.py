"""Record raw pgoutput bytes for the decoder unit tests (run by hand; needs the PostgreSQL server binaries).

    .venv/bin/python tests/unit/capture/record_pgoutput.py

Starts a throwaway server (EmbeddedPostgres, as ``nobody`` when run as root) in an
unusual time zone with ``logical_decoding_work_mem=64kB``, runs the scripted workload
below, and peeks the slot (never consuming it) with ``pg_logical_slot_peek_binary_changes``:

* ``data/pgoutput_v2.jsonl``: ``proto_version 2, streaming on, messages true`` (whole workload)
* ``data/pgoutput_v1.jsonl``: ``proto_version 1, messages true`` (whole workload; nothing streamed)
* ``data/pgoutput_v1_binary.jsonl``: ``proto_version 1, binary true`` up to the end of the
  all-types phase, so ``'b'`` tuple values come from a real server.
* ``data/phases.json``: the LSN at which each workload phase ended.
* ``data/types.json``: the non-built-in types (``load_type_registry``), for the type mapper.

Each line is ``{"lsn": "0/16B3748", "xid": 731, "data": "<hex>"}``. The peek session is
pinned as the capture agent pins its replication session (capture/postgres/streaming/connection.py), so text
values are printed in UTC / ISO / hex. Re-recording changes xids, oids and LSNs: tests
must look them up in the recording, not hard-code them.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from capture.postgres.catalog import load_type_registry  # noqa: E402
from operations.embedded_postgres import EmbeddedPostgres  # noqa: E402

DATA = Path(__file__).resolve().parent / "data"
PIN = (
    "SET TimeZone = 'UTC'; SET DateStyle = 'ISO'; SET IntervalStyle = 'postgres'; "
    "SET extra_float_digits = 3; SET bytea_output = 'hex'; SET lc_monetary = 'C'"
)
STREAM_ROWS = 800

SCHEMA = """
CREATE EXTENSION hstore;
CREATE EXTENSION citext;
CREATE EXTENSION ltree;
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE DOMAIN posint AS integer CHECK (VALUE > 0);
CREATE DOMAIN price AS numeric(10, 2);
CREATE TABLE all_types (
    id int PRIMARY KEY,
    c_int2 int2, c_int4 int4, c_int8 int8, c_oid oid,
    c_num numeric, c_num_10_2 numeric(10, 2), c_num_5 numeric(5),
    c_real real, c_double double precision,
    c_bool boolean, c_text text, c_varchar varchar(20), c_char char(5),
    c_bytea bytea,
    c_date date, c_time time, c_time3 time(3), c_time0 time(0), c_timetz timetz,
    c_ts timestamp, c_ts3 timestamp(3), c_ts0 timestamp(0), c_tstz timestamptz, c_tstz3 timestamptz(3),
    c_interval interval, c_uuid uuid, c_json json, c_jsonb jsonb,
    c_int_arr int[], c_text_arr text[], c_int_arr2 int[][], c_num_arr numeric(6, 2)[], c_date_arr date[],
    c_mood mood, c_mood_arr mood[], c_money money,
    c_inet inet, c_cidr cidr, c_macaddr macaddr, c_macaddr8 macaddr8,
    c_point point, c_posint posint, c_price price,
    c_int4range int4range, c_int8range int8range, c_numrange numrange,
    c_tsrange tsrange, c_tstzrange tstzrange, c_daterange daterange,
    c_bit1 bit(1), c_bit8 bit(8), c_varbit varbit,
    c_xml xml, c_tsvector tsvector, c_hstore hstore, c_citext citext, c_ltree ltree
);
CREATE TABLE toast_default (id int PRIMARY KEY, big text, n int);
CREATE TABLE toast_full (id int PRIMARY KEY, big text, n int);
ALTER TABLE toast_full REPLICA IDENTITY FULL;
CREATE TABLE no_key (a int, b text);
CREATE TABLE evolving (id int PRIMARY KEY, a int, b text);
CREATE TABLE big (id int PRIMARY KEY, payload text);
CREATE PUBLICATION pub FOR ALL TABLES;
"""

ALL_TYPES_ROWS = [
    # 1: ordinary values
    """INSERT INTO all_types VALUES (1,
        -32768, 2147483647, -9223372036854775808, 4294967295,
        12345.678900, -12345678.91, 99999,
        1.1, 3.141592653589793,
        true, E'h\\u00e9llo "w\\u00f6rld"\\n', 'abc', 'ab',
        '\\xdeadbeef00',
        '2024-02-29', '13:45:56.123456', '13:45:56.7894', '13:45:56.6', '13:45:56.5+05:30',
        '2024-02-29 13:45:56.123456', '2024-02-29 13:45:56.789', '2024-02-29 13:45:56.4',
        '2024-02-29 13:45:56.123456+01', '2024-02-29 13:45:56.7+00',
        '1 year 2 mons 3 days 04:05:06.789', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11',
        '{"b": 1, "a": [1, 2]}', '{"b": 1, "a": [1, 2]}',
        '{1,NULL,3}', '{"a b","with \\"quote\\"",NULL,"NULL","","back\\\\slash"}', '{{1,2},{3,4}}',
        '{1.5,-2.25}', '{2024-01-01,NULL}',
        'happy', '{sad,happy}', 1234.56,
        '192.168.0.1/24', '10.0.0.0/8', '08:00:2b:01:02:03', '08:00:2b:01:02:03:04:05',
        '(1.5,-2)', 7, 19.99,
        '[1,10)', '(,100]', '(1.5,2.5]',
        '[2024-01-01 00:00,2024-01-02 00:00)', '[2024-01-01 00:00+00,)', '[2024-01-01,2024-02-01)',
        B'1', B'10000001', B'101',
        '<a>1</a>', 'a fat cat', '"k"=>"v", "n"=>NULL', 'MiXeD', 'Top.Science')""",
    # 2: special values, part one
    """INSERT INTO all_types (id, c_int2, c_num, c_num_10_2, c_real, c_double, c_bool, c_text, c_bytea,
        c_date, c_time, c_timetz, c_ts, c_ts3, c_tstz, c_interval, c_int_arr, c_text_arr, c_money, c_bit8,
        c_int4range, c_jsonb, c_point)
        VALUES (2, 0, 'NaN', 'NaN', 'NaN', 'Infinity', false, '', '\\x',
        'infinity', '24:00:00', '00:00:00-03:30', 'infinity', 'infinity', 'infinity', '-1 days +02:03:00',
        '{}', '{}', -0.01, B'00000000', 'empty', '"just a string"', '(0,0)')""",
    # 3: special values, part two
    """INSERT INTO all_types (id, c_num, c_real, c_double, c_date, c_ts, c_ts3, c_tstz, c_interval, c_int_arr,
        c_money, c_varbit)
        VALUES (3, '-Infinity', '-Infinity', 'NaN', '-infinity', '-infinity', '-infinity', '-infinity',
        '-1 years -2 mons +3 days -04:05:06.5', '{NULL}', 0, B'')""",
    # 4: before the common era, and numbers that need care
    """INSERT INTO all_types (id, c_num, c_num_10_2, c_date, c_ts, c_tstz, c_interval, c_real, c_double)
        VALUES (4, 0.000000012300, 0.10, '0001-01-01 BC', '0044-03-15 12:00:00 BC',
        '1969-12-31 23:59:59.999999+00', '00:00:00.000001', 1e-45, -0.0)""",
    # 5: all NULL
    "INSERT INTO all_types (id) VALUES (5)",
]


def main() -> None:
    """Start Postgres, run the workload, write the recordings."""
    DATA.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="hw-record-") as tmp:
        server = EmbeddedPostgres(
            Path(tmp) / "pg",
            timezone="Pacific/Chatham",
            settings={"logical_decoding_work_mem": "64kB", "fsync": "off"},
        )
        with server:
            dsn = server.dsn()
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(SCHEMA)
                conn.execute("SELECT pg_create_logical_replication_slot('rec', 'pgoutput')")
                phases = run_workload(conn)
                types = [pg_type.to_json() for pg_type in load_type_registry(conn)]
                (DATA / "types.json").write_text(json.dumps(types, indent=1) + "\n")
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(PIN)
                write(conn, "pgoutput_v2.jsonl", "'proto_version','2','streaming','on','messages','true'", None)
                write(conn, "pgoutput_v1.jsonl", "'proto_version','1','messages','true'", None)
                write(conn, "pgoutput_v1_binary.jsonl", "'proto_version','1','binary','true'", phases["all_types"])
            (DATA / "phases.json").write_text(json.dumps(phases, indent=2) + "\n")


def lsn(conn: psycopg.Connection[Any]) -> str:
    row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
    assert row is not None
    return str(row[0])


def run_workload(conn: psycopg.Connection[Any]) -> dict[str, str]:
    phases: dict[str, str] = {}
    for statement in ALL_TYPES_ROWS:
        conn.execute(statement)
    phases["all_types"] = lsn(conn)

    big = "SELECT string_agg(md5(i::text), '') FROM generate_series(1, 400) AS i"  # 12.8 kB: TOASTed
    for table in ("toast_default", "toast_full"):
        conn.execute(f"INSERT INTO {table} VALUES (1, ({big}), 1)")
        conn.execute(f"UPDATE {table} SET n = 2 WHERE id = 1")  # big unchanged: 'u'
        conn.execute(f"UPDATE {table} SET id = 10 WHERE id = 1")  # key changed: old key tuple
        conn.execute(f"DELETE FROM {table} WHERE id = 10")
    conn.execute("INSERT INTO no_key VALUES (1, 'x')")
    phases["toast"] = lsn(conn)

    with conn.transaction():
        conn.execute("INSERT INTO no_key VALUES (2, 'y')")
        conn.execute("SELECT pg_logical_emit_message(true, 'hw.txn', 'in a transaction')")
    conn.execute("SELECT pg_logical_emit_message(false, 'hw.now', '\\x00ff'::bytea)")
    phases["messages"] = lsn(conn)

    conn.execute("TRUNCATE no_key")
    conn.execute("TRUNCATE toast_default, toast_full RESTART IDENTITY CASCADE")
    phases["truncate"] = lsn(conn)

    conn.execute("INSERT INTO evolving VALUES (1, 1, 'one')")
    conn.execute("ALTER TABLE evolving ADD COLUMN c text")
    conn.execute("INSERT INTO evolving VALUES (2, 2, 'two', 'added')")
    conn.execute("ALTER TABLE evolving DROP COLUMN b")
    conn.execute("INSERT INTO evolving VALUES (3, 3, 'dropped b')")
    conn.execute("ALTER TABLE evolving RENAME COLUMN a TO a_renamed")
    conn.execute("INSERT INTO evolving VALUES (4, 4, 'renamed a')")
    phases["ddl"] = lsn(conn)

    conn.execute("SELECT pg_replication_origin_create('upstream')")
    conn.execute("SELECT pg_replication_origin_session_setup('upstream')")
    with conn.transaction():
        conn.execute("SELECT pg_replication_origin_xact_setup('0/ABCDEF', '2024-01-01 00:00:00+00')")
        conn.execute("INSERT INTO no_key VALUES (3, 'from upstream')")
    conn.execute("SELECT pg_replication_origin_session_reset()")
    phases["origin"] = lsn(conn)

    rows = f"SELECT i, repeat('p', 20) FROM generate_series({{0}}, {{0}} + {STREAM_ROWS} - 1) AS i"
    with conn.transaction():  # streamed, committed; a streamed subtransaction rolls back inside it
        conn.execute(f"INSERT INTO big {rows.format(1)}")
        conn.execute("SAVEPOINT s1")
        conn.execute(f"INSERT INTO big {rows.format(100_000)}")
        conn.execute("ROLLBACK TO SAVEPOINT s1")
        conn.execute("INSERT INTO big VALUES (0, 'after rollback to savepoint')")
    phases["streamed_commit"] = lsn(conn)
    conn.execute("BEGIN")
    conn.execute(f"INSERT INTO big {rows.format(200_000)}")
    conn.execute("ROLLBACK")
    conn.execute("INSERT INTO no_key VALUES (4, 'last')")
    phases["streamed_abort"] = lsn(conn)
    return phases


def write(conn: psycopg.Connection[Any], name: str, options: str, upto: str | None) -> None:
    upto_sql = "NULL" if upto is None else f"'{upto}'::pg_lsn"
    rows = conn.execute(
        f"SELECT lsn::text, xid::text::bigint, data FROM "
        f"pg_logical_slot_peek_binary_changes('rec', {upto_sql}, NULL, 'publication_names', 'pub', {options})"
    ).fetchall()
    with (DATA / name).open("w") as out:
        for row_lsn, xid, data in rows:
            out.write(json.dumps({"lsn": row_lsn, "xid": xid, "data": bytes(data).hex()}) + "\n")
    print(f"{name}: {len(rows)} messages, {(DATA / name).stat().st_size} bytes")


if __name__ == "__main__":
    main()
