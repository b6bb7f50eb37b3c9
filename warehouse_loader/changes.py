"""The change batch: the Arrow table every SCD function and the Delta writer take as input.

One row per change, flattened from its change event (``log.envelope``):

* the key columns (the topic key / replica identity), non-null except on truncates;
* ``__hw_seq``: ``Sequence.sortable()`` of ``(commit_lsn, txn_index)``, a fixed-width string
  that sorts like the source's total order (any sortable column may replace it, see
  ``sequence_by``);
* ``__hw_op``: the Debezium op code, ``c`` ``u`` ``r`` (row image = ``after``), ``d`` (key
  from ``before``/the record key, other columns null) or ``t`` (truncate, keys null);
* ``__hw_commit_ts``: the source commit time, ``timestamp[us, UTC]``;
* the row image columns.

Rows may arrive in any order and may repeat (duplicate delivery): the SCD functions order
by the sequence column, so the table's row order carries no meaning.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]  # no stubs

from log.envelope import ChangeEvent, Op
from warehouse_loader.errors import ChangeBatchError

SEQ = "__hw_seq"
OP = "__hw_op"
COMMIT_TS = "__hw_commit_ts"
START_AT = "__START_AT"
END_AT = "__END_AT"
#: Columns Headwater adds to every warehouse row.
METADATA_COLUMNS = (SEQ, OP, COMMIT_TS)
#: Tables with ``ignore_null_updates``: a JSON object naming each column whose value the row
#: inherited from an earlier change, with that change's sequence (null when none).
INHERITED = "__hw_inherited"
COMMIT_TS_TYPE = pa.timestamp("us", tz="UTC")

#: Ops whose row image becomes (a version of) the row.
UPSERT_OPS = (Op.CREATE.value, Op.UPDATE.value, Op.READ.value)
DELETE_OP = Op.DELETE.value
#: A snapshot read: an upsert whose row may equal the key's current one (a re-read after a schema change).
READ_OP = Op.READ.value
TRUNCATE_OP = Op.TRUNCATE.value
_KNOWN_OPS = frozenset((*UPSERT_OPS, DELETE_OP, TRUNCATE_OP))


def check_changes(changes: pa.Table, keys: Sequence[str], sequence_by: str = SEQ) -> None:
    """Raise :class:`ChangeBatchError` unless ``changes`` follows the change-batch contract.

    Cheap: column presence, op codes and non-null sequences; vectorised, no row loop.
    """
    if not keys:
        msg = "a warehouse table needs key columns; set the feed's 'key' or give the source table a primary key"
        raise ChangeBatchError(msg)
    missing = [name for name in (*keys, sequence_by, OP) if name not in changes.column_names]
    if missing:
        msg = f"change batch lacks column(s) {', '.join(missing)}; columns present: {', '.join(changes.column_names)}"
        raise ChangeBatchError(msg)
    if changes.num_rows == 0:
        return
    if changes.column(sequence_by).null_count:
        msg = f"change batch has null {sequence_by}: every change needs a sequence (Databricks AUTO CDC rule)"
        raise ChangeBatchError(msg)
    ops = set(changes.column(OP).unique().to_pylist())
    unknown = ops - _KNOWN_OPS
    if unknown:
        msg = f"change batch has op code(s) {sorted(map(str, unknown))}; expected c, u, r, d or t"
        raise ChangeBatchError(msg)


def changes_from_events(
    events: Iterable[ChangeEvent], keys: Sequence[str], schema: pa.Schema | None = None
) -> pa.Table:
    """Flatten decoded change events into a change batch (tests and small batches; not the hot path).

    Logical messages (``m``) are skipped: they carry no row. Types are inferred unless
    ``schema`` (row columns and keys; metadata is added) is given.
    """
    rows: list[dict[str, Any]] = []
    for event in events:
        if event.op is Op.MESSAGE:
            continue
        image = event.before if event.op is Op.DELETE else event.after
        row: dict[str, Any] = {}
        if event.op is Op.TRUNCATE:
            row.update(dict.fromkeys(keys))
        elif image is not None:
            row.update(image)
        row[SEQ] = event.sequence.sortable()
        row[OP] = event.op.value
        row[COMMIT_TS] = event.source.ts_us
        rows.append(row)
    names: list[str] = list(keys)
    for row in rows:
        names.extend(name for name in row if name not in names)
    data = {name: [row.get(name) for row in rows] for name in names if name not in (COMMIT_TS,)}
    if schema is None:
        table = pa.table(data) if rows else pa.table({name: pa.array([], pa.null()) for name in data})
    else:
        fields = [schema.field(name) if name in schema.names else pa.field(name, pa.string()) for name in data]
        table = pa.table({name: pa.array(data[name], fields[i].type) for i, name in enumerate(data)})
    ts = pa.array([row[COMMIT_TS] for row in rows], pa.int64()).cast(COMMIT_TS_TYPE)
    return table.append_column(COMMIT_TS, ts)
