"""One canonical text per row, whatever the table, so a Postgres table and a warehouse table compare.

:func:`canonical_row` turns a row of Python values as psycopg returns them (``Decimal``,
aware ``datetime``, lists, dicts) or as DuckDB/Arrow returns a warehouse table (``Decimal``
or decimal strings, aware ``datetime``, lists, JSON text) into one text, equal for equal
values; :func:`row_diff` says which rows one multiset has that the other lacks.
(:func:`harness.items_workload.canonical` does the same for the ``items`` table only.)
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections import Counter
from collections.abc import Iterable, Sequence
from decimal import Decimal
from typing import Any

import orjson

#: Text longer than this is compared by length and digest (TOASTed values are kilobytes).
LONG_TEXT = 64


def canonical_value(value: Any) -> Any:
    """A comparable, printable form of one value (``repr`` of it is stable)."""
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, Decimal):
        return str(value)  # keeps the scale: 12.30 stays 12.30, as the decimal strings do
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        if len(value) > LONG_TEXT:
            return (len(value), hashlib.sha1(value.encode()).hexdigest()[:16])
        return value
    if isinstance(value, dt.datetime):
        assert value.tzinfo is not None, f"naive timestamp {value!r}"
        return value.astimezone(dt.UTC).isoformat()
    if isinstance(value, dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, bytes | bytearray | memoryview):
        return ("bytes", hashlib.sha1(bytes(value)).hexdigest())
    if isinstance(value, list | tuple):
        return tuple(canonical_value(item) for item in value)
    if isinstance(value, dict):
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    msg = f"no canonical form for {type(value).__name__}: {value!r}"
    raise TypeError(msg)


def canonical_row(row: Sequence[Any]) -> str:
    """One text per row, the same for a Postgres row and a warehouse row with equal values."""
    return repr(tuple(canonical_value(value) for value in row))


def checksum(rows: Iterable[str]) -> str:
    """Order-independent digest of canonical rows (duplicates count)."""
    return hashlib.sha256("\n".join(sorted(rows)).encode()).hexdigest()


def row_diff(expected: Iterable[str], actual: Iterable[str]) -> tuple[list[str], list[str]]:
    """``(missing, extra)``: rows ``expected`` has more often than ``actual``, and the reverse."""
    want, have = Counter(expected), Counter(actual)
    return sorted((want - have).elements()), sorted((have - want).elements())
