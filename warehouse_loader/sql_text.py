"""SQL text the SCD planners, the Delta writer, the backfill and queries build: identifiers, literals, key conditions.

One dialect serves DuckDB (planning, reading Delta files) and DataFusion (delta-rs MERGE
predicates): both fold unquoted identifiers to lower case, so every column name is quoted.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from warehouse_loader.errors import ChangeBatchError


def quote(name: str) -> str:
    """Quote an identifier for DuckDB / DataFusion SQL (both are case-folding otherwise)."""
    return '"' + name.replace('"', '""') + '"'


def sql_literal(value: Any) -> str:
    """A sequence value as a SQL literal (strings and integers)."""
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    msg = f"truncate needs a string or integer sequence column, got {type(value).__name__}"
    raise ChangeBatchError(msg)


def sql_list(values: Sequence[str]) -> str:
    """A DuckDB list literal of strings (DDL and SET take no prepared parameters)."""
    return "[" + ", ".join("'" + v.replace("'", "''") + "'" for v in values) + "]"


def key_match(keys: Sequence[str], left: str, right: str) -> str:
    """``left.k = right.k AND ...`` over the key columns: rows of two aliases with the same key."""
    return " AND ".join(f"{left}.{quote(k)} = {right}.{quote(k)}" for k in keys)


def column_list(names: Sequence[str], alias: str | None = None) -> str:
    """``alias.a, alias.b`` (quoted; without ``alias`` the bare names)."""
    prefix = f"{alias}." if alias else ""
    return ", ".join(prefix + quote(n) for n in names)
