"""MySQL row filters on decoded rows: MySQL's semantics where capture accepts a condition, one-line refusals elsewhere.

Every expected value is what MariaDB 10.11 returned for the same condition over the same row (each
refused arithmetic on an UNSIGNED or YEAR column errs there with a negative result: "BIGINT UNSIGNED
value is out of range"); the integration tests compare the snapshot's server-side WHERE with
streamed rows.
"""

from __future__ import annotations

from decimal import Decimal

import pytest

from capture.mysql.binlog.table_map import ColumnShape, ColumnType
from capture.mysql.row_filter import FilterOverflowError, RowFilterError, compile_filter
from capture.mysql.types.values import TypeModes

BIN, CI = 46, 45  # utf8mb4_bin, utf8mb4_general_ci
COLLATIONS = {BIN: "utf8mb4_bin", CI: "utf8mb4_general_ci"}
COLUMNS = (
    ColumnShape("id", ColumnType.LONG),
    ColumnShape("u", ColumnType.LONG, unsigned=True),
    ColumnShape("amount", ColumnType.NEWDECIMAL, precision=65, scale=20),
    ColumnShape("code", ColumnType.VARCHAR, meta=80, collation=BIN),
    ColumnShape("name", ColumnType.VARCHAR, meta=80, collation=CI),
    ColumnShape("ratio", ColumnType.DOUBLE, meta=8),
    ColumnShape("born", ColumnType.YEAR),
    ColumnShape("big", ColumnType.LONGLONG),
)


def keeps(condition: str, **values: object) -> bool:
    row = [values.get(c.name) for c in COLUMNS]
    compiled = compile_filter(condition, COLUMNS, TypeModes(), lambda c: COLLATIONS[c or CI])
    return compiled.keeps(row)


@pytest.mark.parametrize(
    ("condition", "values", "kept"),
    [
        ("id % 2 = 0", {"id": 4}, True),
        ("id % 3 = -1", {"id": -7}, True),  # MOD takes the dividend's sign
        ("id DIV 2 = -3", {"id": -7}, True),  # DIV truncates toward zero
        ("id % 0 IS NULL", {"id": 5}, True),
        ("id > 1 OR id IS NULL", {}, True),
        ("big = 18446744073709551616", {"big": 1}, False),  # past BIGINT UNSIGNED: a DECIMAL literal
        ("big < 18446744073709551615", {"big": (1 << 63) - 1}, True),
        ("NOT (id > 1)", {}, False),  # NOT NULL is NULL: not kept
        ("id NOT IN (1, NULL)", {"id": 2}, False),  # NULL in the list: unknown
        ("id BETWEEN 2 AND 4", {"id": 4}, True),
        ("id <=> NULL", {}, True),
        ("code = 'ab'", {"code": "ab  "}, True),  # utf8mb4_bin is PAD SPACE
        ("code = 'ab'", {"code": "AB"}, False),
        ("name COLLATE utf8mb4_bin IN ('x', 'y')", {"name": "y"}, True),
        ("ratio = 0.1", {"ratio": 0.1}, True),
        ("u % 2 = 1", {"u": 3}, True),
        ("u % -2 = 1", {"u": 3}, True),
        ("-u < 0", {"u": 3}, True),  # unary minus is signed, also of an UNSIGNED column
        ("born = 2024", {"born": 2024}, True),
        # 41 significant digits: Python's default context (28 digits) would round the sum.
        (
            "amount + 1 = 12345678901234567890.12345678901234567891",
            {"amount": "12345678901234567889.12345678901234567891"},
            True,
        ),
        ("amount * 2 > amount", {"amount": str(Decimal("0.00000000000000000001"))}, True),
    ],
)
def test_conditions_evaluate_as_mysql_does(condition: str, values: dict[str, object], kept: bool) -> None:
    assert keeps(condition, **values) is kept


@pytest.mark.parametrize(
    ("condition", "problem"),
    [
        ("name = 'x'", "text of collation utf8mb4_general_ci is compared"),
        ("code > 'a'", "filters compare text only by =, <>, <=> and IN"),
        ("u - 5 > 0", "'-' on an UNSIGNED column"),
        ("born - 2000 > 0", "'-' on an UNSIGNED column"),
        ("(u % 2) * 3 = 3", "'*' on an UNSIGNED column"),
        ("amount * amount > 1", "more than 30 decimals"),
        ("id = '1'", "text is compared with a number"),
        ("id / 2 = 1", "use DIV"),
        ("upper(code) = 'X'", "functions (upper(...)) are not supported"),
        ("id + 9223372036854775808 > 0", "'+' on an UNSIGNED column"),  # an unsigned literal
        ("missing = 1", "there is no column 'missing'"),
        ("id > 1 -- more", "comments are not allowed"),
        ("id >", "the condition ends too early"),
    ],
)
def test_what_capture_cannot_evaluate_exactly_is_refused_in_one_line(condition: str, problem: str) -> None:
    with pytest.raises(RowFilterError) as refused:
        keeps(condition)
    assert problem in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize("condition", ["big + 1 > big", "big * 2 > 0", "-big > 0"])
def test_arithmetic_past_bigints_range_stops_capture_as_the_server_errs(condition: str) -> None:
    """MariaDB: "BIGINT value is out of range" (1690) for the same row; capture stops in one line."""
    with pytest.raises(FilterOverflowError) as stopped:
        keeps(condition, big=-(1 << 63) if condition.startswith("-") else (1 << 63) - 1)
    assert "outside BIGINT's range" in str(stopped.value)
