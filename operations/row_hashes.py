r"""One canonical text per value, as PostgreSQL SQL and as DuckDB SQL, so both sides hash a row alike.

``headwater verify`` hashes the source table in Postgres and the Delta table in DuckDB.

A column's warehouse form follows from its Postgres type and the source's type modes
(:func:`log.pg_types.logical_type`) and shows in the Delta table's Arrow type; the
canonical text is the one both engines can produce exactly:

* integers, booleans (``true``/``false``), text-like types (``char(n)`` padded as its
  output is), uuid, json, enums: their text;
* floating point: the shortest round-trip text (Postgres ``extra_float_digits=1``;
  DuckDB's, with ``1.0`` written ``1`` and ``NaN``/``Infinity`` spelled as Postgres does);
* numerics stored as decimals: the text at the warehouse column's scale; stored as
  strings: the source's text;
* dates ``YYYY-MM-DD``; timestamps (with or without time zone) as Postgres' ISO output
  in UTC (``2026-01-01 00:00:01.5+00``), which DuckDB's cast writes alike; times stored
  as milliseconds or microseconds past midnight: that number;
* bytea stored as binary: lower-case hex.

Other kinds (intervals, timetz, bits, points, arrays, ranges stored as structs) are not
compared; :func:`canonical_columns` names them so the report can say so. A null is
``\N``; columns are joined with the ASCII record separator. A row's hash and a key's
bucket are the first 60 bits of an MD5, an integer both engines compute.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]  # no stubs

from core.source_config import TypesConfig
from log.pg_types import Oid, logical_type, numeric_typmod
from log.row_types import LogicalKind
from warehouse_loader.sql_text import quote

_TEXT_KINDS = (LogicalKind.STRING, LogicalKind.JSON, LogicalKind.UUID, LogicalKind.ENUM)


@dataclass(frozen=True, slots=True)
class Canonical:
    """A column's canonical text in both dialects."""

    name: str
    pg: str
    duck: str
    #: An integer column: its value itself can pick a bucket (cheaper than hashing its text).
    integer: bool = False


def _pg_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def canonical(name: str, type_oid: int, typmod: int, modes: TypesConfig, stored: pa.DataType) -> Canonical | None:
    """The canonical text of column ``name`` (Postgres ``type_oid``/``typmod``, warehouse type ``stored``), or None."""
    kind = logical_type(type_oid, typmod, modes).kind
    pg, duck = _pg_ident(name), quote(name)
    if kind is LogicalKind.BOOLEAN and type_oid == Oid.BOOL:
        return Canonical(name, f"{pg}::text", f"CAST({duck} AS VARCHAR)")
    if kind in (LogicalKind.INT16, LogicalKind.INT32, LogicalKind.INT64) and pa.types.is_integer(stored):
        return Canonical(name, f"{pg}::text", f"CAST({duck} AS VARCHAR)", integer=True)
    if kind in _TEXT_KINDS and _is_string(stored):
        if type_oid == Oid.BPCHAR and typmod > 4:  # its text drops the padding its output keeps
            return Canonical(name, f"rpad({pg}::text, {typmod - 4})", duck)
        return Canonical(name, f"{pg}::text", duck)
    if kind in (LogicalKind.FLOAT, LogicalKind.DOUBLE) and pa.types.is_floating(stored):
        source = f"{pg}::text" if type_oid in (Oid.FLOAT4, Oid.FLOAT8) else f"{pg}::float8::text"
        # Postgres writes a whole float without ".0"; DuckDB keeps it (a cast, cheaper than a regexp).
        duck_text = (
            f"CASE WHEN isnan({duck}) THEN 'NaN' WHEN {duck} = 'inf' THEN 'Infinity' "
            f"WHEN {duck} = '-inf' THEN '-Infinity' WHEN {duck} = trunc({duck}) AND abs({duck}) < 1e15 "
            f"THEN CAST(CAST({duck} AS BIGINT) AS VARCHAR) ELSE CAST({duck} AS VARCHAR) END"
        )
        return Canonical(name, source, duck_text)
    if pa.types.is_decimal(stored):
        same = type_oid == Oid.NUMERIC and numeric_typmod(typmod) == (stored.precision, stored.scale)
        source = f"{pg}::text" if same else f"{pg}::numeric({stored.precision},{stored.scale})::text"
        return Canonical(name, source, f"CAST({duck} AS VARCHAR)")
    if kind is LogicalKind.DECIMAL and _is_string(stored):
        return Canonical(name, f"{pg}::text", duck)
    if kind is LogicalKind.DATE and pa.types.is_date(stored):
        return Canonical(name, f"{pg}::text", f"CAST({duck} AS VARCHAR)")
    if pa.types.is_timestamp(stored) and type_oid in (Oid.TIMESTAMP, Oid.TIMESTAMPTZ):
        # Postgres' ISO output in UTC (the connection's settings), which DuckDB's cast writes alike.
        return Canonical(name, f"{pg}::text", f"CAST({duck} AS VARCHAR)")
    if kind in (LogicalKind.TIME_MS, LogicalKind.TIME_US) and pa.types.is_integer(stored):
        scale = 1000 if kind is LogicalKind.TIME_MS else 1000000
        return Canonical(name, f"(extract(epoch from {pg}) * {scale})::bigint::text", f"CAST({duck} AS VARCHAR)")
    if kind in (LogicalKind.BYTES_BASE64, LogicalKind.BYTES_HEX) and pa.types.is_binary(stored):
        return Canonical(name, f"encode({pg}, 'hex')", f"lower(hex({duck}))")
    return None


def _is_string(kind: pa.DataType) -> bool:
    return bool(pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind))


def canonical_columns(
    columns: Sequence[Mapping[str, Any]], stored: pa.Schema, modes: TypesConfig
) -> tuple[list[Canonical], list[str]]:
    """The compared columns (source columns the warehouse table holds, in source order) and those not compared."""
    compared: list[Canonical] = []
    skipped: list[str] = []
    for column in columns:
        name = column["name"]
        if name not in stored.names:
            continue
        found = canonical(name, int(column["type_oid"]), int(column.get("typmod", -1)), modes, stored.field(name).type)
        if found is None:
            skipped.append(name)
        else:
            compared.append(found)
    return compared, skipped


def _joined(parts: Sequence[str], chr30: str) -> str:
    # One concat_ws call (no intermediate strings); every part is non-null, so none is skipped.
    if not parts:
        return "''"
    return f"concat_ws({chr30}, " + ", ".join(f"coalesce({part}, '\\N')" for part in parts) + ")"


def text_sql(columns: Sequence[Canonical], dialect: str) -> str:
    """SQL: the canonical text of ``columns`` joined (dialect ``pg`` or ``duck``)."""
    parts = [c.pg if dialect == "pg" else c.duck for c in columns]
    return _joined(parts, "chr(30)")


def bucket_sql(keys: Sequence[Canonical], dialect: str, buckets: int) -> str:
    """SQL: a key's bucket in ``[0, buckets)``, alike in both dialects.

    A single integer key is its own hash (its value modulo ``buckets``); any other key
    hashes its canonical text.
    """
    if len(keys) == 1 and keys[0].integer:
        column = _pg_ident(keys[0].name) if dialect == "pg" else quote(keys[0].name)
        as_int = f"{column}::bigint" if dialect == "pg" else f"CAST({column} AS BIGINT)"
        return f"((({as_int} % {buckets}) + {buckets}) % {buckets})"
    return f"({hash60(text_sql(keys, dialect), dialect)} % {buckets})"


def range_bucket_sql(key: Canonical, dialect: str, low: int, width: int) -> str:
    """SQL: a single integer key's range bucket ``(key - low) // width``, alike in both dialects.

    The caller makes ``low`` the smallest key of both sides, so both operands are
    non-negative and Postgres' truncating ``/`` is DuckDB's ``//``; neighbouring keys share a
    bucket, so the rows of a bucket are one index range of the source.
    """
    if dialect == "pg":
        return f"(({_pg_ident(key.name)}::bigint - ({low})::bigint) / {width})"
    return f"((CAST({quote(key.name)} AS BIGINT) - ({low})::BIGINT) // {width})"


def hash60(text_sql_expr: str, dialect: str) -> str:
    """SQL: the first 60 bits of the MD5 of a text, as a non-negative bigint."""
    digest = f"substr(md5({text_sql_expr}), 1, 15)"
    if dialect == "pg":
        return f"('x' || {digest})::bit(60)::bigint"
    return f"('0x' || {digest})::BIGINT"
