"""Every replica column type reaches PostgreSQL through the sink's ``unnest`` arrays exactly as through ``COPY``.

The values are what the columns' converters give (sinks/postgres/columns.py); each type's values,
NULLs and awkward text among them, are written by psycopg's ``COPY`` into one table and by the
sink's statement shape (``INSERT ... SELECT ... FROM unnest(...)``, sinks/postgres/arrays.py) into
another, and the two are compared as the server prints them.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

import pytest
from psycopg import sql
from psycopg.adapt import Transformer

from sinks.postgres.arrays import column_arrays, unnested
from sinks.postgres.columns import same

_AWKWARD = [
    "",
    "NULL",
    "null",
    'q"uote',
    "back\\slash\\",
    "\\N",
    "tab\there, new\nline, cr\r, \x08\x0b\x0c and \x01",
    "{braces,commas}",
    "  spaced  ",
    "é ü 😀 \u2028",
]
_ZONE = dt.timezone(dt.timedelta(hours=5, minutes=30))

#: (SQL type, values as the columns' converters give them); None is added to each.
CASES: list[tuple[str, list[Any]]] = [
    ("boolean", [True, False]),
    ("smallint", [-32768, 0, 32767]),
    ("integer", [-(2**31), 2**31 - 1]),
    ("bigint", [-(2**63), 2**63 - 1]),
    ("real", [1.5, float("nan"), float("inf"), float("-inf"), 3.4028235e38, 1e-45, -0.0]),
    ("double precision", [0.1, float("nan"), float("-inf"), 1e308, 5e-324, -0.0]),
    ("numeric", [Decimal("NaN"), Decimal("1.10"), Decimal("-0.000001"), Decimal("1234567890123456789.0123456789")]),
    ("numeric(10,2)", [Decimal("1.005"), Decimal("12345678.99"), Decimal("-0.5")]),
    ("text", _AWKWARD),
    ("uuid", ["a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"]),
    ("bytea", [b"", b"\x00\\\"'\xff", bytes(range(256))]),
    ("date", [dt.date(1, 1, 1), dt.date(1970, 1, 1), dt.date(9999, 12, 31)]),
    ("time", [dt.time(0), dt.time(23, 59, 59, 999999)]),
    ("timetz", ["12:00:00+05:30", "00:00:01.5-08"]),
    ("timestamp", [dt.datetime(1, 1, 1), dt.datetime(9999, 12, 31, 23, 59, 59, 999999)]),
    ("timestamptz", [dt.datetime(2024, 2, 29, 12, 30, 1, 5, tzinfo=_ZONE), "infinity", "-infinity"]),
    ("interval", [dt.timedelta(days=-1, microseconds=1), dt.timedelta(days=999999), dt.timedelta(0)]),
    ("point", ["(1.5,-2.0)", "(nan,inf)"]),
    ("json", ['{"a": "b\\"c", "u": "é"}', "[1, 2.50, null]", '"NULL"']),
    ("jsonb", ['{"b": 1, "a": [null, "x\\\\y"]}', "{}"]),
    ("text", ["enum-like"]),
    ("integer[]", [[1, None, 3], [], [[1, 2], [3, 4]]]),
    ("text[]", [_AWKWARD, [None], ["NULL", ""]]),
    ("numeric[]", [[Decimal("1.10"), None, Decimal("NaN")]]),
    ("timestamptz[]", [[dt.datetime(2024, 1, 1, tzinfo=_ZONE), None]]),
    ("bytea[]", [[b"\x00\x01", None, b"\\"]]),
    ("date[]", [[dt.date(2020, 2, 29)]]),
]


def _printed(conn: Any, table: str) -> list[tuple[Any, ...]]:
    return conn.execute(sql.SQL("SELECT n, v::text FROM {} ORDER BY n").format(sql.Identifier(table))).fetchall()


@pytest.mark.parametrize(("type_name", "values"), CASES, ids=[f"{t}-{i}" for i, (t, _) in enumerate(CASES)])
def test_unnest_arrays_write_what_copy_writes(pg_database: Any, type_name: str, values: list[Any]) -> None:
    rows = [{"n": n, "v": value} for n, value in enumerate([*values, None])]
    columns, types = ["n", "v"], {"n": "integer", "v": type_name}
    with pg_database.connect() as conn:
        conn.execute("SET TimeZone = 'America/St_Johns'")
        for table in ("via_copy", "via_unnest"):
            conn.execute(
                sql.SQL("CREATE TABLE {} (n integer PRIMARY KEY, v {})").format(
                    sql.Identifier(table), sql.SQL(type_name)
                )
            )
        with conn.cursor().copy("COPY via_copy (n, v) FROM STDIN") as copy:
            for row in rows:
                copy.write_row((row["n"], row["v"]))
        arrays = column_arrays(rows, columns, {"n": same, "v": same}, Transformer.from_context(conn), "utf-8")
        source, typed = unnested(columns, types)
        conn.execute(sql.SQL("INSERT INTO via_unnest (n, v) SELECT {} FROM {}").format(typed, source), arrays)
        assert _printed(conn, "via_unnest") == _printed(conn, "via_copy")
        assert len(_printed(conn, "via_copy")) == len(rows)
