"""Ignore-null updates as SQL: which earlier change a null column inherits its value from.

A column listed under ``ignore_null_updates`` takes, at each change of a key, the value of
the change with the highest *authored* sequence among the key's changes up to it since its
last delete: a change authors the columns it sets non-null (at its own sequence); a stored
row authors its columns at its sequence except those it inherited, which keep the sequence
recorded in :data:`~warehouse_loader.changes.INHERITED`. So the result does not depend on
the order changes arrive in (the property Apache Spark's AUTO CDC suites check by shuffling
a change stream into micro-batches).
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa  # type: ignore[import-untyped]  # no stubs

from warehouse_loader.changes import INHERITED
from warehouse_loader.sql_text import quote


def duck_type(kind: pa.DataType) -> str:
    """The DuckDB type a sequence value read back from JSON is cast to."""
    if pa.types.is_integer(kind):
        return "BIGINT"
    if pa.types.is_timestamp(kind):
        return "TIMESTAMPTZ" if kind.tz else "TIMESTAMP"
    if pa.types.is_date(kind):
        return "DATE"
    if pa.types.is_floating(kind):
        return "DOUBLE"
    if pa.types.is_decimal(kind):
        return f"DECIMAL({kind.precision}, {kind.scale})"
    return "VARCHAR"


def authored(column: str, alias: str, at: str, seq_type: pa.DataType, *, remembered: bool) -> str:
    """SQL: the sequence ``alias``'s value of ``column`` was authored at (null when the value is null).

    ``at``: the row's own sequence expression; ``remembered``: the row has an
    :data:`INHERITED` column (a stored row of a table loaded with the option).
    """
    own = at
    if remembered:
        path = "$." + '"' + column.replace('"', '\\"') + '"'
        recorded = f"TRY_CAST(json_extract_string({alias}.{quote(INHERITED)}, '{path}') AS {duck_type(seq_type)})"
        own = f"coalesce({recorded}, {at})"
    return f"CASE WHEN {alias}.{quote(column)} IS NOT NULL THEN {own} END"


def inherited_json(columns: Sequence[str], authored_names: Sequence[str], at: str) -> str:
    """SQL: the :data:`INHERITED` object of a row whose column ``i`` was authored at ``authored_names[i]``.

    A column authored before the row's own sequence ``at`` was inherited; null when none was.
    """
    if not columns:
        return "NULL"
    entries = ", ".join(
        f"CASE WHEN {a} < {at} THEN to_json({_text(c)}) || ':' || to_json({a}) END"
        for c, a in zip(columns, authored_names, strict=True)
    )
    return f"nullif('{{' || concat_ws(',', {entries}) || '}}', '{{}}')"


def _text(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"
