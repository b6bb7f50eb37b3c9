"""A batch's rows as one array literal per column, the parameters of the ``unnest`` its statements read.

Each value is the text ``COPY`` would have read for it (the column's converter, then psycopg's text
dump), put in the literal as a quoted element (quotes and backslashes escaped; a null is ``NULL``).
PostgreSQL reads every element with the column type's input function, as ``COPY`` does, so a value
arrives exactly as it did through ``COPY``. ``unnest`` flattens nested arrays, so an array column's
literal is a ``text[]`` of the arrays' texts, cast per row (:func:`unnested`).

``native.speedups.copy_arrays`` gives the same literals from the extension's ``COPY`` text
(tests/unit/native/test_sink_rows.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from psycopg import sql
from psycopg.abc import Transformer
from psycopg.adapt import PyFormat

from sinks.postgres.columns import Convert, copy_rows

#: The name of the relation the statements read the arrays as (``unnest(...) AS s(...)``).
ALIAS = "s"


def column_arrays(
    rows: Iterable[Mapping[str, Any]],
    columns: Sequence[str],
    converters: Mapping[str, Convert],
    transformer: Transformer,
    encoding: str,
) -> list[str]:
    """One array literal per column of ``rows`` (a missing or null value is ``NULL``); at least one row."""
    formats = [PyFormat.TEXT] * len(columns)
    dumped = [transformer.dump_sequence(values, formats) for values in copy_rows(rows, columns, converters)]
    return [_literal(texts, encoding) for texts in zip(*dumped, strict=True)]


def _literal(texts: Iterable[Any], encoding: str) -> str:
    elements = (
        "NULL" if text is None else '"' + bytes(text).decode(encoding).replace("\\", "\\\\").replace('"', '\\"') + '"'
        for text in texts
    )
    return "{" + ",".join(elements) + "}"


def unnested(columns: Sequence[str], types: Mapping[str, str]) -> tuple[sql.Composable, sql.Composable]:
    """``unnest(%s::type[], ...) AS s(columns)`` of one array parameter per column, and its columns as typed values.

    An array column's parameter is ``text[]`` and its value cast: ``unnest`` would flatten a nested array.
    """
    arrays: list[sql.Composable] = []
    values: list[sql.Composable] = []
    for column in columns:
        name, type_name = sql.Identifier(column), types[column]
        if type_name.endswith("[]"):
            arrays.append(sql.SQL("%s::text[]"))
            values.append(sql.SQL("{}.{}::{}").format(sql.Identifier(ALIAS), name, sql.SQL(type_name)))
        else:
            arrays.append(sql.SQL("%s::{}[]").format(sql.SQL(type_name)))
            values.append(sql.SQL("{}.{}").format(sql.Identifier(ALIAS), name))
    source = sql.SQL("unnest({}) AS {}({})").format(
        sql.SQL(", ").join(arrays),
        sql.Identifier(ALIAS),
        sql.SQL(", ").join(sql.Identifier(c) for c in columns),
    )
    return source, sql.SQL(", ").join(values)
