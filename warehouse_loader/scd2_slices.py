"""What SCD2 planning reads from a stored table, in any format: versions a truncate spans, remembered deletes.

The SCD2 planner (:func:`warehouse_loader.scd2.plan_scd2`) works on Arrow; these read the slices
of a table it needs through :class:`~warehouse_loader.table_format.StoredTable` (DuckDB over one
version), so every format's writer and the daily backfill plan the same versions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa  # type: ignore[import-untyped]  # no stubs

from warehouse_loader.cdc_options import PlanOptions
from warehouse_loader.changes import DELETE_OP, END_AT, OP, START_AT, TRUNCATE_OP
from warehouse_loader.scd2 import Scd2Actions, plan_scd2, scd2_truncate_span, truncate_sequences
from warehouse_loader.sql_text import column_list, key_match, quote

if TYPE_CHECKING:
    from warehouse_loader.table_format import StoredTable


def spanning_versions(target: StoredTable, changes: pa.Table, keys: Sequence[str], sequence_by: str) -> pa.Table | None:
    """Keys, ``__START_AT`` and ``__END_AT`` of the versions spanning a truncate of ``changes`` (None: no truncate).

    What :func:`warehouse_loader.scd2.scd2_window` takes as ``existing``: a truncate closes such versions
    of every key, not only of the batch's.
    """
    truncates = truncate_sequences(changes, sequence_by)
    if not truncates:
        return None
    return target.select(
        f"SELECT {column_list(keys, 't')}, t.{quote(START_AT)}, t.{quote(END_AT)} "
        f"FROM target t WHERE {scd2_truncate_span(truncates, 't')}",
    )


def plan_with_remembered(
    tombstones: StoredTable | None,
    changes: pa.Table,
    keys: Sequence[str],
    existing: pa.Table | None,
    window: pa.Table,
    *,
    options: PlanOptions,
) -> Scd2Actions:
    """:func:`~warehouse_loader.scd2.plan_scd2` with the deletes and truncates ``tombstones`` remembers.

    ``tombstones`` is the table's :meth:`~warehouse_loader.table_format.TableFormat.tombstones`;
    ``window`` as :func:`~warehouse_loader.scd2.scd2_window` returns it: the remembered deletes
    of its keys from their ``__min_seq`` on are read, and every remembered truncate.
    """
    remembered_deletes, remembered_truncates = _remembered(tombstones, window, keys, options.sequence_by)
    return plan_scd2(
        changes,
        keys,
        existing,
        tombstones=remembered_deletes,
        truncates=remembered_truncates,
        track_history_columns=options.track_history_columns,
        sequence_by=options.sequence_by,
        track_history_except_columns=options.track_history_except_columns,
        ignore_null_columns=options.ignore_null_columns,
        reread_points=options.reread_points,
    )


def _remembered(
    side: StoredTable | None, window: pa.Table, keys: Sequence[str], sequence_by: str
) -> tuple[pa.Table | None, tuple[Any, ...]]:
    """Remembered deletes of the window's keys from their ``__min_seq`` on, and every remembered truncate."""
    if side is None:
        return None, ()
    seq = quote(sequence_by)
    tombs = side.select(
        f"SELECT {column_list(keys, 't')}, t.{seq} FROM target t JOIN win w ON {key_match(keys, 't', 'w')} "
        f"WHERE t.{quote(OP)} = '{DELETE_OP}' AND t.{seq} >= w.__min_seq",
        win=window,
    )
    truncs = side.select(f"SELECT DISTINCT {seq} AS v FROM target WHERE {quote(OP)} = '{TRUNCATE_OP}'")
    return tombs, tuple(sorted(truncs.column("v").to_pylist()))
