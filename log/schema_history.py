"""A table topic's schema versions read as a history: renames placed in the source's order, re-reads.

Capture writes each version of a table's shape to ``_headwater.schemas``
(:mod:`log.table_schemas`). A version that followed a DDL says how it came about, in ``change``::

    "change": {"at": [commit_lsn, txn_index] | null,   # where the new shape starts
               "renamed": {"<new name>": "<old name>"}, # same column (attnum), new name
               "reread": "<why>",                       # the rows are read again (op r)
               "table_renamed_from": "<schema.table>"}

``at`` is a boundary in the source's total order: every record of the topic at a sequence
below it was written under the earlier versions, every record at or above it under this one
or later. So a reader maps a renamed column's old name to its current name in exactly the
records below the rename's ``at`` (:meth:`SchemaHistory.renames`), and a warehouse places the
new values a re-read finds at the DDL's position (:meth:`SchemaHistory.reread_points`).

Contract for readers: a rename is never claimed without ``at`` (capture reads such a table
again instead), and every version keeps every earlier version's records readable.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from log.sequence import Sequence as Seq


@dataclass(frozen=True, slots=True)
class Rename:
    """Column ``old`` is called ``new`` in every record at or after ``at``."""

    old: str
    new: str
    at: Seq


@dataclass(frozen=True, slots=True)
class SchemaHistory:
    """The schema records of one topic, oldest version first."""

    versions: tuple[Mapping[str, Any], ...]

    @classmethod
    def of(cls, records: Sequence[Mapping[str, Any]]) -> SchemaHistory:
        """The history of a topic's records (any order)."""
        return cls(tuple(sorted(records, key=lambda record: int(record.get("version", 0)))))

    @property
    def latest(self) -> Mapping[str, Any] | None:
        """The latest version (None: no record)."""
        return self.versions[-1] if self.versions else None

    def latest_names(self) -> tuple[str, ...]:
        """The columns of the latest version, in order."""
        latest = self.latest
        return () if latest is None else tuple(str(c["name"]) for c in latest.get("columns", ()))

    def renames(self) -> tuple[Rename, ...]:
        """Every placed rename, oldest first (apply them in this order to map an old record's names)."""
        found = []
        for record in self.versions:
            change = record.get("change") or {}
            at = change.get("at")
            if at is None:
                continue
            for new, old in (change.get("renamed") or {}).items():
                found.append(Rename(str(old), str(new), Seq(int(at[0]), int(at[1]))))
        return tuple(found)

    def renamed_away(self) -> frozenset[str]:
        """Names that live on under another name (renamed) and are not a column of the latest version."""
        live = set(self.latest_names())
        return frozenset(r.old for r in self.renames() if r.old not in live)

    def current_name(self, name: str, at: Seq) -> str:
        """What column ``name`` of a record at ``at`` is called now."""
        for rename in self.renames():
            if at < rename.at and name == rename.old:
                name = rename.new
        return name

    def reread_points(self) -> tuple[Seq, ...]:
        """Where each placed schema change that read the table again starts, ascending."""
        points = set()
        for record in self.versions:
            change = record.get("change") or {}
            if change.get("reread") and change.get("at") is not None:
                points.add(Seq(int(change["at"][0]), int(change["at"][1])))
        return tuple(sorted(points))

    def gone(self, name: str) -> tuple[str, str | None] | None:
        """For a column the latest version lacks: ``(how, new name)``, how being ``renamed`` or ``dropped``.

        None when the latest version has the column, or no version ever had it.
        """
        if name in self.latest_names():
            return None
        for rename in reversed(self.renames()):
            if rename.old == name:
                return "renamed", self._final_name(rename.new)
        if any(str(c["name"]) == name for record in self.versions for c in record.get("columns", ())):
            return "dropped", None
        return None

    def _final_name(self, name: str) -> str:
        for rename in self.renames():
            if rename.old == name:
                name = rename.new
        return name
