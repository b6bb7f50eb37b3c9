"""What capture writes of one MySQL table shape: its topic, columns, masks, key, row filter and skipped operations.

The source's settings (``columns``, ``keys``, ``filters``, ``skipped_operations``) applied to a
table as the binlog (or the catalog, for a snapshot) describes it. One plan per distinct shape,
built when the shape is first seen, so a setting capture cannot apply to it is refused in one
line before any of its rows is written:

* a column left out (``columns.exclude``/``include``) is never converted: the row decoder steps
  over it (:func:`capture.mysql.types.values.skip_reader`), unless the table's row filter reads it;
* a masked column's value is masked before it leaves the plan (:mod:`capture.column_policy`),
  through its text (text columns, integers, DECIMAL in ``string`` mode; other types are refused);
  its schema record column is ``string`` with ``masked`` set;
* the record key is the configured key (``sources.<name>.keys``), else the primary key; its
  columns must be captured, and a masked one must be hashed (other masks merge keys);
* the row filter (:mod:`capture.mysql.row_filter`) keeps a row whose condition holds; an update
  is kept as an update when both images pass, as a create when only the new one does, as a
  delete when only the old one does (PostgreSQL's publication row filters do the same);
* skipped operations are dropped after the filter (a key-changing update is one ``u``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from capture.column_policy import ColumnMask, ColumnPolicy, ColumnShape
from capture.errors import ColumnSettingError, ConfiguredKeyError, KeyColumnExcludedError
from capture.mysql.binlog.table_map import ColumnShape as BinlogColumn
from capture.mysql.binlog.table_map import ColumnType, TableShape
from capture.mysql.row_filter import RowFilter, RowFilterError, compile_filter
from capture.mysql.settings import MySqlSource
from capture.mysql.types.charsets import Charsets
from capture.mysql.types.values import TypeModes
from core.source_config import ColumnsConfig, column_table
from log.topics import table_topic

_TEXT = (ColumnType.VARCHAR, ColumnType.VAR_STRING, ColumnType.STRING, ColumnType.BLOB)
_INTEGERS = (ColumnType.TINY, ColumnType.SHORT, ColumnType.INT24, ColumnType.LONG, ColumnType.LONGLONG)


@dataclass(frozen=True)
class TablePlan:
    """One table shape as capture writes it (see the module docstring)."""

    shape: TableShape
    topic: str
    #: Every column's name, in the shape's order.
    names: tuple[str, ...]
    #: Positions of the columns written, in column order.
    kept: tuple[int, ...]
    #: Positions of the record key's columns (configured order, else the primary key's).
    key: tuple[int, ...]
    key_source: str
    masks: Mapping[int, ColumnMask] = field(default_factory=dict)
    #: How a masked column's value becomes the text its mask reads.
    mask_text: Mapping[int, Callable[[Any], str]] = field(default_factory=dict)
    row_filter: RowFilter | None = None
    #: Positions the row decoder steps over (not written, not read by the filter).
    skip: frozenset[int] = frozenset()
    skipped_operations: frozenset[str] = frozenset()

    @cached_property
    def whole(self) -> bool:
        """Every column written as decoded (no column left out, none masked; computed once: every image reads it)."""
        return len(self.kept) == len(self.names) and not self.masks

    @cached_property
    def key_names(self) -> tuple[str, ...]:
        """The record key's column names (computed once: every event's key reads them)."""
        return tuple(self.names[i] for i in self.key)

    def image(self, row: Sequence[Any]) -> dict[str, Any]:
        """The row image written for a decoded row (every column of the shape, in order)."""
        if self.whole:
            return dict(zip(self.names, row, strict=True))
        masks, names = self.masks, self.names
        return {names[i]: self._masked(i, row[i]) if i in masks else row[i] for i in self.kept}

    def kept_image(self, values: Sequence[Any]) -> dict[str, Any]:
        """The row image written for the values of the kept columns only (a snapshot reads just those)."""
        names = self.names
        if not self.masks:
            return {names[i]: v for i, v in zip(self.kept, values, strict=True)}
        return {names[i]: self._masked(i, v) if i in self.masks else v for i, v in zip(self.kept, values, strict=True)}

    def _masked(self, position: int, value: Any) -> Any:
        return None if value is None else self.masks[position].mask(self.mask_text[position](value))


class TablePlanner:
    """Builds (and caches, per shape object) the plans of one source's tables."""

    def __init__(
        self,
        source: str,
        modes: TypeModes,
        *,
        columns: ColumnsConfig | None = None,
        keys: Mapping[str, Sequence[str]] | None = None,
        filters: Mapping[str, str] | None = None,
        skipped_operations: Sequence[str] = (),
        collation_name: Callable[[int | None], str] = lambda _c: "utf8mb4_general_ci",
        max_bytes: Callable[[int | None], int] = lambda _c: 4,
    ) -> None:
        self.source = source
        self.modes = modes
        self._columns = columns or ColumnsConfig()
        self._policy = ColumnPolicy(self._columns)
        self._keys = dict(keys or {})
        self._filters = dict(filters or {})
        self._skipped = frozenset(skipped_operations)
        self._collation_name = collation_name
        self._max_bytes = max_bytes
        self._plans: dict[int, TablePlan] = {}

    def plan(self, shape: TableShape) -> TablePlan:
        """The plan of ``shape`` (built once per shape object)."""
        found = self._plans.get(id(shape))
        if found is None or found.shape is not shape:
            found = self._plans[id(shape)] = self._build(shape)
        return found

    def _build(self, shape: TableShape) -> TablePlan:
        table = f"{shape.schema}.{shape.table}"
        names = tuple(c.name for c in shape.columns)
        rules = self._policy.rules(table, [ColumnShape(c.name, self._char_length(c)) for c in shape.columns])
        kept = tuple(rules.keep)
        mask_text = {i: self._mask_text(table, shape.columns[i]) for i in rules.masks}
        key, key_source = self._key(table, shape, kept)
        rules.check_masked_key(self.source, table, names, key)
        row_filter = None
        condition = self._filters.get(table)
        if condition is not None:
            try:
                row_filter = compile_filter(condition, shape.columns, self.modes, self._collation_name)
            except RowFilterError as exc:
                raise ColumnSettingError(self.source, f"filters.{table}", str(exc), table=table) from None
        read = set(kept) | (row_filter.columns if row_filter is not None else set())
        return TablePlan(
            shape=shape,
            topic=table_topic(self.source, shape.schema, shape.table),
            names=names,
            kept=kept,
            key=key,
            key_source=key_source,
            masks=dict(rules.masks),
            mask_text=mask_text,
            row_filter=row_filter,
            skip=frozenset(i for i in range(len(names)) if i not in read),
            skipped_operations=self._skipped,
        )

    def _char_length(self, column: BinlogColumn) -> int:
        """A CHAR(n)/VARCHAR(n) column's n (a hash mask is cut to it, as Debezium cuts it), else 0."""
        if column.type in (ColumnType.VARCHAR, ColumnType.VAR_STRING, ColumnType.STRING) and not column.is_binary:
            return column.meta // max(1, self._max_bytes(column.collation))
        return 0

    def _mask_text(self, table: str, column: BinlogColumn) -> Callable[[Any], str]:
        kind = column.type
        if (kind in _TEXT and not column.is_binary) or kind in (ColumnType.ENUM, ColumnType.SET):
            return str
        if kind in _INTEGERS and not (
            kind == ColumnType.LONGLONG and column.unsigned and self.modes.bigint_unsigned == "precise"
        ):
            if kind == ColumnType.LONGLONG and column.unsigned:
                return lambda v: str(v + (1 << 64) if v < 0 else v)  # the server's text, not the Java long
            return str
        if kind == ColumnType.NEWDECIMAL and self.modes.decimal == "string":
            return str
        raise ColumnSettingError(
            self.source,
            "columns.mask",
            f"{table}.{column.name} is a {kind.name.lower()} column; masks of MySQL sources apply to text, integer "
            "and DECIMAL (decimal_handling_mode string) columns; exclude the column instead",
            table=table,
        )

    def _key(self, table: str, shape: TableShape, kept: tuple[int, ...]) -> tuple[tuple[int, ...], str]:
        names = tuple(c.name for c in shape.columns)
        configured = self._keys.get(table)
        if configured is not None:
            missing = [c for c in configured if c not in names]
            if missing:
                raise ConfiguredKeyError(self.source, table, f"has no column {missing[0]!r}")
            positions, source = tuple(sorted(names.index(c) for c in configured)), "configured"
        else:
            positions, source = tuple(shape.primary_key), "primary_key" if shape.primary_key else "none"
        dropped = [names[i] for i in positions if i not in kept]
        if dropped:
            listed = any(column_table(c) == table for c in self._columns.include)
            raise KeyColumnExcludedError(self.source, table, dropped, setting="include" if listed else "exclude")
        return positions, source


def planner_of(source: MySqlSource, charsets: Callable[[], Charsets]) -> TablePlanner:
    """The planner of ``source``'s settings; ``charsets`` gives the server's (read once capture connects)."""
    return TablePlanner(
        source.name,
        source.modes,
        columns=source.columns,
        keys=source.keys,
        filters=source.filters,
        skipped_operations=source.skipped_operations,
        collation_name=lambda c: charsets().collation_name(c),
        max_bytes=lambda c: charsets().max_bytes(c),
    )
