"""The invariants every SCD2 table keeps, as columns a Great Expectations suite checks.

Per key, the versions ``[__START_AT, __END_AT)`` (``__END_AT`` null: open, the current one):

* ``overlapping_versions``: no two versions overlap (nor start at the same sequence);
* ``open_versions``: at most one version is open;
* ``open_after_delete``: no version is open after a delete of the key or a truncate: a
  remembered delete (the format's tombstones, Delta's ``_hw_tombstones``) or truncate with a
  higher sequence than the open version's start means the key is gone.

:func:`invariant_rows` returns the table's rows with one column per invariant, null where
the row keeps it and the row's key (as text) where it breaks it, so the built-in
``expect_column_values_to_be_null`` expectations (:mod:`warehouse_loader.quality`) report
the keys as their unexpected values. One DuckDB pass over the table's current files.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa  # type: ignore[import-untyped]  # no stubs

from core.config import ExpectationConfig
from warehouse_loader.changes import DELETE_OP, END_AT, OP, START_AT, TRUNCATE_OP
from warehouse_loader.duckdb_connection import duckdb_connection
from warehouse_loader.formats import DEFAULT_FORMAT, table_format
from warehouse_loader.location import TableLocation
from warehouse_loader.sql_text import column_list, key_match, quote
from warehouse_loader.table_format import StoredTable, TableFormat

#: Check name -> (the column holding the breaking keys, what the invariant says).
INVARIANTS = {
    "scd2_no_overlapping_versions": (
        "__hw_check_overlapping_versions",
        "no two versions of a key overlap in [__START_AT, __END_AT)",
    ),
    "scd2_one_open_version_per_key": ("__hw_check_open_versions", "at most one open version (__END_AT null) per key"),
    "scd2_no_open_version_after_delete": (
        "__hw_check_open_after_delete",
        "no open version for a key deleted (or truncated) after it opened",
    ),
}
CHECK_COLUMNS = tuple(column for column, _ in INVARIANTS.values())


def invariant_checks() -> list[tuple[str, ExpectationConfig]]:
    """The built-in blocking expectations, named: each invariant's column must be all null."""
    return [
        (
            name,
            ExpectationConfig.model_validate(
                {"expect": "expect_column_values_to_be_null", "column": column, "blocking": True}
            ),
        )
        for name, (column, _) in INVARIANTS.items()
    ]


def invariant_rows(path: TableLocation, keys: Sequence[str], fmt: TableFormat | None = None) -> pa.Table:
    """The SCD2 table at ``path`` (of format ``fmt``, default Delta) with the :data:`CHECK_COLUMNS` added."""
    fmt = fmt or table_format(DEFAULT_FORMAT)
    target = fmt.open(path)
    if target is None:
        msg = f"no {fmt.name} table at {path}"
        raise FileNotFoundError(msg)
    side = fmt.tombstones(path)
    sa, ea, op = quote(START_AT), quote(END_AT), quote(OP)
    k = column_list(keys)
    key_text = " || ', ' || ".join(f"'{name}=' || coalesce(CAST(t.{quote(name)} AS VARCHAR), 'NULL')" for name in keys)
    overlap, open_count, after_delete = (quote(column) for column in CHECK_COLUMNS)
    removed = "false"
    if side is not None:
        removed = (
            f"EXISTS (SELECT 1 FROM side d WHERE d.{op} = '{DELETE_OP}' AND {key_match(keys, 'd', 't')} "
            f"AND d.{quote(_sequence_column(side, keys))} > t.{sa}) "
            f"OR EXISTS (SELECT 1 FROM side d WHERE d.{op} = '{TRUNCATE_OP}' "
            f"AND d.{quote(_sequence_column(side, keys))} > t.{sa})"
        )
    sql = f"""
        SELECT * EXCLUDE (__next, __open),
            CASE WHEN __next IS NOT NULL AND (t.{ea} IS NULL OR __next < t.{ea}) THEN {key_text} END AS {overlap},
            CASE WHEN t.{ea} IS NULL AND __open > 1 THEN {key_text} END AS {open_count},
            CASE WHEN t.{ea} IS NULL AND ({removed}) THEN {key_text} END AS {after_delete}
        FROM (
            SELECT *, lead({sa}) OVER (PARTITION BY {k} ORDER BY {sa}) AS __next,
                count(*) FILTER (WHERE {ea} IS NULL) OVER (PARTITION BY {k}) AS __open
            FROM target
        ) t
    """
    con = duckdb_connection([path])
    try:
        target.register(con, "target")
        if side is not None:
            side.register(con, "side")
        return con.sql(sql).to_arrow_table()
    finally:
        con.close()


def _sequence_column(side: StoredTable, keys: Sequence[str]) -> str:
    """The tombstone table's sequence column: the one that is neither a key nor the op."""
    names = [str(f.name) for f in side.schema() if f.name not in (*keys, OP)]
    return names[0]
