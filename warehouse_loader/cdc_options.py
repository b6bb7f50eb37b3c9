"""A warehouse table's AUTO CDC options applied to a change batch before planning.

The options of ``warehouse.tables.<name>`` (:class:`core.warehouse_config.TableConfig`), with the
semantics of Databricks AUTO CDC (``create_auto_cdc_flow`` / ``AUTO CDC INTO``) and of
Apache Spark's open-source AUTO CDC flow (``pyspark.pipelines.create_auto_cdc_flow``):

* ``sequence_by``: a row-image column orders the changes instead of the source's
  ``(commit_lsn, txn_index)``; it must never be null (a delete's ``before`` image holds it
  only under ``REPLICA IDENTITY FULL``, or when a feed carries it). Ties on (key,
  sequence) are one change delivered twice.
* ``column_list`` / ``except_column_list``: the row-image columns the table keeps. The
  keys, the ``sequence_by`` column and Headwater's ``__hw_*`` columns are always kept
  (the MERGE needs them); a name the batch does not have is an error, as in Spark.
* ``apply_as_deletes``: a SQL boolean expression over the row image (DuckDB dialect,
  evaluated before ``column_list`` applies, so it may read a column the table leaves
  out). An upsert where it holds is a delete (a soft delete). A source delete is a delete
  whatever the expression: Headwater's input is a change log, whose deletes carry no
  flag to test.
* ``apply_as_truncates``: on (the default), a source ``TRUNCATE`` removes every row with a
  lower sequence (SCD1) or closes every version spanning it (SCD2, a Headwater extension;
  AUTO CDC applies truncates to SCD1 only); off, truncates are ignored.
* ``ignore_null_updates`` (every value column) or its column lists: a null in an update
  keeps the value the key had. As in Spark's AUTO CDC, a value is inherited from the
  latest earlier change of the key (by sequence, whatever the arrival order) that set it
  non-null, since the key's last delete; the table remembers where each inherited value
  came from (:data:`warehouse_loader.changes.INHERITED`), so a late change that sets the
  column in between replaces the inherited value.
* ``track_history_columns`` / ``track_history_except_column_list`` (SCD2): a change that
  alters only untracked columns updates the current version in place.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import duckdb
import pyarrow as pa  # type: ignore[import-untyped]  # no stubs
import pyarrow.compute as pc  # type: ignore[import-untyped]

from core.warehouse_config import TableConfig
from warehouse_loader.changes import DELETE_OP, INHERITED, METADATA_COLUMNS, OP, SEQ, TRUNCATE_OP, UPSERT_OPS
from warehouse_loader.errors import ChangeBatchError
from warehouse_loader.scd import duckdb_tables


@dataclass(frozen=True, slots=True)
class PlanOptions:
    """The options the SCD planners take, resolved against one change batch."""

    sequence_by: str = SEQ
    ignore_null_columns: tuple[str, ...] = ()
    track_history_columns: tuple[str, ...] | None = None
    track_history_except_columns: tuple[str, ...] | None = None
    #: Sequences (``__hw_seq``) where schema changes that read the table again start (SCD2 places
    #: a value such a re-read finds changed there: :func:`warehouse_loader.scd2.plan_scd2`).
    reread_points: tuple[str, ...] = ()


def prepare_changes(
    changes: pa.Table, keys: Sequence[str], config: TableConfig, *, reread_points: Sequence[str] = ()
) -> tuple[pa.Table, PlanOptions]:
    """``changes`` with the table's options applied (deletes marked, truncates, columns), and the planner options.

    ``reread_points``: where the input topic's schema changes that read the table again start
    (``Sequence.sortable()``); used only when changes are ordered by the source's sequence.
    """
    sequence_by = config.sequence_by or SEQ
    if not config.apply_as_truncates and changes.num_rows:
        changes = changes.filter(pc.not_equal(changes.column(OP), TRUNCATE_OP))
    if config.apply_as_deletes is not None and changes.num_rows:
        changes = _mark_deletes(changes, config.apply_as_deletes)
    if sequence_by != SEQ:
        _check_sequence(changes, keys, sequence_by)
    fixed = {*keys, sequence_by, *METADATA_COLUMNS, INHERITED}
    values = [name for name in changes.column_names if name not in fixed]
    kept = _selected(values, config.column_list, config.except_column_list, keys, "column_list")
    if len(kept) != len(values):
        changes = changes.select([name for name in changes.column_names if name in fixed or name in kept])
    ignored: list[str] = []
    if config.ignore_null_updates:
        ignored = kept
    elif config.ignore_null_updates_column_list or config.ignore_null_updates_except_column_list:
        ignored = _selected(
            kept,
            config.ignore_null_updates_column_list,
            config.ignore_null_updates_except_column_list,
            keys,
            "ignore_null_updates_column_list",
        )
    return changes, PlanOptions(
        sequence_by=sequence_by,
        ignore_null_columns=tuple(ignored),
        track_history_columns=config.track_history_columns,
        track_history_except_columns=config.track_history_except_column_list,
        reread_points=tuple(reread_points) if sequence_by == SEQ else (),
    )


def _selected(
    names: Sequence[str],
    include: Sequence[str] | None,
    exclude: Sequence[str] | None,
    keys: Sequence[str],
    option: str,
) -> list[str]:
    """``names`` narrowed by an include or exclude list; a listed name that is not among them is an error."""
    listed = include if include is not None else exclude
    if listed is None:
        return list(names)
    which = option if include is not None else option.replace("column_list", "except_column_list")
    named_keys = [c for c in listed if c in keys]
    if named_keys:
        msg = f"{which} names key column(s) {', '.join(named_keys)}; keys are always kept"
        raise ChangeBatchError(msg)
    unknown = [c for c in listed if c not in names]
    if unknown:
        msg = f"{which} names {', '.join(unknown)}, not among the columns {', '.join(names) or '(none)'}"
        raise ChangeBatchError(msg)
    if include is not None:
        return [c for c in names if c in include]
    return [c for c in names if c not in listed]


def _mark_deletes(changes: pa.Table, condition: str) -> pa.Table:
    """Upserts where ``condition`` holds become deletes (``__hw_op = 'd'``); a null result is false."""
    try:
        with duckdb_tables(changes=changes) as con:
            mask = con.sql(f"SELECT coalesce(({condition}), false) AS d FROM changes").to_arrow_table().column("d")
    except duckdb.Error as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        msg = f"apply_as_deletes {condition!r} cannot be evaluated on the change batch: {first}"
        raise ChangeBatchError(msg) from None
    ops = changes.column(OP)
    soft = pc.and_(pc.is_in(ops, pa.array(list(UPSERT_OPS))), mask)
    position = changes.schema.get_field_index(OP)
    return changes.set_column(position, changes.schema.field(OP), pc.if_else(soft, DELETE_OP, ops))


def _check_sequence(changes: pa.Table, keys: Sequence[str], sequence_by: str) -> None:
    """A custom sequence must be in every change; a delete lacks it when its image holds only the key."""
    if sequence_by not in changes.column_names or not changes.num_rows:
        return
    nulls = changes.filter(pc.is_null(changes.column(sequence_by)))
    if not nulls.num_rows:
        return
    first = nulls.slice(0, 1).to_pylist()[0]
    key = ", ".join(f"{k}={first.get(k)!r}" for k in keys)
    if first[OP] == DELETE_OP:
        msg = (
            f"the delete of ({key}) has no value of sequence_by column {sequence_by!r}: a delete's image holds "
            "only the key unless the source table has REPLICA IDENTITY FULL; set that, or remove sequence_by"
        )
    else:
        msg = f"the change of ({key}) has a null sequence_by column {sequence_by!r}: every change needs a sequence"
    raise ChangeBatchError(msg)
