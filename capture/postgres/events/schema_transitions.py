"""What a table's new shape means for the rows it already had: renames, and whether they must be read again.

PostgreSQL writes no row change for a constant default added in place, a rename or a table
rewrite, so the stream alone cannot say what the existing rows hold after such a DDL. This
module compares a topic's last schema record with the table's catalog state
(:mod:`capture.postgres.catalog_state`) and decides, as pure data:

* ``renamed``: columns whose ``attnum`` is unchanged but whose name changed (new -> old).
  Nothing about the rows changes: readers of the log map the old name to the new one in
  records written before the change (:mod:`log.schema_history`), so no row is read again.
* ``reread``: why the table's rows must be read again (an incremental snapshot while
  streaming goes on), or None. Every row that existed then holds a value the stream never
  carried when a column was added with a default (``attmissingval``, or a volatile default
  and a rewrite), when the table was rewritten (``ALTER COLUMN ... TYPE [USING]``,
  ``VACUUM FULL``, ``CLUSTER``; a type change that rewrote nothing keeps every value), when a
  partition was attached or detached, or when a column comes back under the name of a
  column dropped earlier (readers still hold that column's old values).

The catalog is read after the Relation message that announced the shape, so a later DDL may
already show in it (always so when capture was stopped across several DDLs: the stream replays
the first one's Relation while the catalog holds the last one's state). The catalog then
describes a later state, so it is trusted only where it cannot belong to one
(:func:`_columns_at_relation`):

* column numbers: each of the Relation's columns takes the number its name had in the previous
  record, or has in the catalog now; the result must be unambiguous (a name with two different
  numbers is not), distinct, ascending in the Relation's order (pgoutput sends columns by
  number) and leave no live column of the catalog below the highest number used unaccounted
  for (that column existed then under a name the Relation does not show). Otherwise column
  numbers are unknown: no rename is claimed and the rows are read again (values stay exact;
  the old name keeps its history as a dropped column);
* storage: when the catalog's storage is the previous record's, nothing was rewritten in
  between; when it differs, the rewrite (or a partition attached or detached) may belong to
  this DDL or a later one. The rows are read again, and the version records the previous
  storage (``SchemaChange.storage``): the storage it shows is not known to be this version's,
  so the next version still finds the change and reads the rows again too.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from capture.postgres.catalog_state import CatalogColumn, CatalogTable
from capture.postgres.decoding.pgoutput_messages import Relation

#: Why a table whose storage changed with the same columns and types is read again. A TRUNCATE is
#: such a change too, but the stream carries it (no row is left to read): see ``Relations.truncated``.
REWRITTEN = "the table was rewritten (ALTER COLUMN ... TYPE ... USING, VACUUM FULL, CLUSTER or TRUNCATE)"


@dataclass(frozen=True, slots=True)
class SchemaChange:
    """How a new schema version relates to the previous one (see the module docstring)."""

    attnums: Mapping[str, int] = field(default_factory=dict)
    renamed: Mapping[str, str] = field(default_factory=dict)
    reread: str | None = None
    partitions_dropped: bool = False
    #: The storage the version records (None: the catalog's); see the module docstring.
    storage: str | None = None


#: Why a table is read again when its storage changed while the catalog was already past the
#: Relation being recorded (capture stopped across several DDLs): which DDL changed it is unknown.
STORAGE_CHANGED_LATER = (
    "the table's storage changed while capture was not streaming it (a rewrite, or partitions changed)"
)


def schema_change(
    previous: Mapping[str, Any] | None,
    table: CatalogTable | None,
    relation: Relation,
    *,
    names_seen: Collection[str] = (),
) -> SchemaChange:
    """The change from ``previous`` (the topic's last schema record, None: first) to ``relation``'s shape.

    ``table`` is the catalog state read after the Relation (None: the table is gone already);
    ``names_seen``: every column name of the topic's earlier versions.
    """
    consistent = table is not None and table.matches(relation)
    attnums = {c.name: c.attnum for c in table.columns} if consistent and table is not None else {}
    if previous is None or table is None:
        return SchemaChange(attnums=attnums)
    before = list(previous.get("columns", ()))
    before_names = {str(c["name"]) for c in before}
    numbered = bool(before) and all("attnum" in c for c in before)
    by_attnum = {int(c["attnum"]): str(c["name"]) for c in before} if numbered else {}
    current = [c.name for c in relation.columns]
    old_storage = previous.get("storage")
    columns: tuple[CatalogColumn, ...] = table.columns
    if not consistent:
        inferred = _columns_at_relation(by_attnum, table, relation) if numbered else None
        if inferred is None:
            changed = set(current) != before_names or old_storage not in (None, table.storage)
            reason = "the table changed again before capture read its catalog" if changed else None
            return SchemaChange(attnums=attnums, reread=reason)
        columns, attnums = inferred, {c.name: c.attnum for c in inferred}
        if old_storage is not None and old_storage != table.storage:
            return _storage_changed_later(columns, by_attnum, old_storage, table.storage, attnums)
    renamed: dict[str, str] = {}
    added = []
    for column in columns:
        if numbered:
            old = by_attnum.get(column.attnum)
            if old is None:
                added.append(column)
            elif old != column.name:
                renamed[column.name] = old
        elif column.name not in before_names:
            added.append(column)
    reasons = []
    if not numbered and added and before_names - set(current):
        reasons.append("columns were renamed or replaced (the previous schema has no column numbers)")
    if old_storage is not None and old_storage != table.storage:
        reasons.append(_rewrite_reason(before, old_storage, table, renamed))
    for column in added:
        if column.filled:
            reasons.append(f"column {column.name!r} was added with a default")
        elif column.name in names_seen or column.name in before_names:
            reasons.append(f"column {column.name!r} was added under the name of an earlier column")
    dropped_partitions = _partitions_dropped(old_storage, table.storage)
    return SchemaChange(
        attnums=attnums,
        renamed=renamed,
        reread="; ".join(reasons) or None,
        partitions_dropped=dropped_partitions,
    )


def _rewrite_reason(
    before: list[Mapping[str, Any]], old_storage: object, table: CatalogTable, renamed: Mapping[str, str]
) -> str:
    """Why the storage changed, as far as the catalog can tell."""
    types = {str(c["name"]): (int(c["type_oid"]), int(c["typmod"])) for c in before}
    retyped = [
        c.name
        for c in table.columns
        if (old := types.get(renamed.get(c.name, c.name))) is not None and old != (c.type_oid, c.typmod)
    ]
    if retyped:
        return f"column {retyped[0]!r} changed type and the table was rewritten"
    if ("," in table.storage or ":" in table.storage) and _leaves(old_storage) != _leaves(table.storage):
        return "the table was rewritten or its partitions changed"
    return REWRITTEN  # for a partitioned table: the same partitions, rewritten (TRUNCATE among others)


def _partitions_dropped(old: object, new: str) -> bool:
    """True when a leaf partition of the old storage is no longer one (detached or dropped)."""
    if not isinstance(old, str) or ":" not in old:
        return False
    return bool(_leaves(old) - _leaves(new))


def _leaves(storage: object) -> frozenset[str]:
    """The leaf partitions (oids) of a partitioned table's storage (``oid:relfilenode,...``); else empty."""
    if not isinstance(storage, str) or ":" not in storage:
        return frozenset()
    return frozenset(part.split(":", 1)[0] for part in storage.split(",") if part)


def _columns_at_relation(
    by_attnum: Mapping[int, str], table: CatalogTable, relation: Relation
) -> tuple[CatalogColumn, ...] | None:
    """The Relation's columns with their numbers, when the catalog shows a later state (None: not certain).

    ``by_attnum``: the previous record's column names by number. A column's ``filled`` is the
    catalog's when the number is still live there (a default's ``attmissingval`` stays until a rewrite).
    """
    before = {name: attnum for attnum, name in by_attnum.items()}
    now = {c.name: c.attnum for c in table.columns}
    live = {c.attnum: c for c in table.columns}
    found = []
    gone_since = False  # a column kept by its earlier number that the catalog no longer has
    for column in relation.columns:
        then, later = before.get(column.name), now.get(column.name)
        if then is not None and later is not None and then != later:
            return None  # the name moved between two columns: which one the Relation shows is unknown
        attnum = then if then is not None else later
        if attnum is None:
            return None  # named so only between the previous record and the catalog
        gone_since = gone_since or attnum not in live
        filled = live[attnum].filled if attnum in live and live[attnum].name == column.name else False
        found.append(CatalogColumn(attnum, column.name, column.type_oid, column.atttypmod, filled, column.key))
    numbers = [c.attnum for c in found]
    if any(a >= b for a, b in pairwise(numbers)):
        return None  # pgoutput sends columns by number: the names do not fit this order
    # A live column the Relation does not show must be newer than every column known then (else it
    # existed then under a name the Relation does not show); and when a column is kept by a number the
    # catalog dropped since, none may be left (it could be that column, renamed after a drop).
    unmatched = [attnum for attnum in live if attnum not in numbers]
    top = max([*numbers, *by_attnum], default=0)
    if any(attnum <= top for attnum in unmatched) or (gone_since and unmatched):
        return None
    return tuple(found)


def _storage_changed_later(
    columns: tuple[CatalogColumn, ...],
    by_attnum: Mapping[int, str],
    old_storage: str,
    storage: str,
    attnums: Mapping[str, int],
) -> SchemaChange:
    """A version whose storage is unknown (changed, maybe by a later DDL): renames kept, rows read again."""
    renamed = {c.name: by_attnum[c.attnum] for c in columns if by_attnum.get(c.attnum, c.name) != c.name}
    return SchemaChange(
        attnums=attnums,
        renamed=renamed,
        reread=STORAGE_CHANGED_LATER,
        partitions_dropped=_partitions_dropped(old_storage, storage),
        storage=old_storage,
    )
