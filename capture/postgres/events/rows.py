"""Rows of one relation: text tuples -> JSON row images, by the type map's converter per column.

:class:`RowConverter` is built once per Relation message (:func:`capture.postgres.types.typemap.column_converter`
per column) and converts each tuple with one call per column; :class:`TextRowDecoder` is the
event builder's :data:`capture.postgres.events.relations.RowDecoder` over it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import orjson

import native
from capture.column_policy import ColumnMask, ColumnRules
from capture.errors import TypeMappingError
from capture.postgres.types.converters import Converter
from capture.postgres.types.native_names import native_type_name
from capture.postgres.types.typemap import column_converter, native_kind
from capture.tuples import UNCHANGED_TOAST, NonUtf8Text, TupleValue
from core.source_config import TypesConfig
from log.pg_types import TypeRegistry, logical_type
from log.row_types import LogicalType

if TYPE_CHECKING:
    from native._speedups import RowEncoder


class ColumnLike(Protocol):
    """The part of a pgoutput ``RelationColumn`` the row converter needs."""

    @property
    def name(self) -> str:
        """Column name."""

    @property
    def type_oid(self) -> int:
        """``pg_attribute.atttypid``."""

    @property
    def atttypmod(self) -> int:
        """``pg_attribute.atttypmod`` (-1 when unconstrained)."""


def _null_or_not_text(value: TupleValue) -> Any:
    if value is None:
        return None
    msg = "not a text value"  # unchanged TOAST or binary: RowConverter.convert handles both
    raise TypeError(msg)


class RowConverter:
    """Converts the tuples of one Relation; build it when the Relation message arrives.

    Invariant: ``convert`` never returns :data:`UNCHANGED_TOAST`; such columns are left out
    of the result (and listed by :meth:`unchanged`) so a placeholder can never reach the log.
    A converter restricted by column rules (:meth:`restricted`) never converts a column left
    out, and masks a masked column's text instead of converting it.
    """

    __slots__ = ("_masks", "_plan", "_positions", "kept_names", "logical_types", "names", "native_types", "read_types")

    def __init__(self, columns: Sequence[ColumnLike], modes: TypesConfig, registry: TypeRegistry | None = None) -> None:
        registry = registry if registry is not None else TypeRegistry()
        built = [column_converter(column.type_oid, column.atttypmod, modes, registry) for column in columns]
        self.names: tuple[str, ...] = tuple(column.name for column in columns)
        #: The names of the columns a row image holds (all of them unless restricted).
        self.kept_names: tuple[str, ...] = self.names
        self.logical_types: tuple[LogicalType, ...] = tuple(logical for _, logical in built)
        #: The logical types readers read the columns by (recorded in schema records): typed without the
        #: source's ``pg_type``, as readers of records that name only oids always have, so both read alike.
        self.read_types: tuple[LogicalType, ...] = tuple(
            logical_type(column.type_oid, column.atttypmod, modes) for column in columns
        )
        #: Each column's type as PostgreSQL names it (``numeric(10,2)``, ``public.mood``).
        self.native_types: tuple[str, ...] = tuple(
            native_type_name(column.type_oid, column.atttypmod, registry) for column in columns
        )
        self._plan: tuple[tuple[str, Converter], ...] = tuple(
            zip(self.names, (converter for converter, _ in built), strict=True)
        )
        # Restricted: the positions converted (None: every column) and the masks by position.
        self._positions: tuple[int, ...] | None = None
        self._masks: Mapping[int, ColumnMask] = {}

    def restricted(self, rules: ColumnRules) -> RowConverter:
        """This converter for the columns ``rules`` keep, masked ones masked (:mod:`capture.column_policy`)."""
        if len(rules.keep) == len(self.names) and not rules.masks:
            return self
        other = object.__new__(RowConverter)
        other.names, other.logical_types = self.names, self.logical_types
        other.read_types, other.native_types = self.read_types, self.native_types
        other.kept_names = tuple(self.names[i] for i in rules.keep)
        other._plan = tuple(
            (name, rules.masks[i].mask if i in rules.masks else converter)
            for i, (name, converter) in enumerate(self._plan)
        )
        other._positions = None if len(rules.keep) == len(self.names) else tuple(rules.keep)
        other._masks = rules.masks
        return other

    def _columns(self, values: Sequence[TupleValue]) -> Iterator[tuple[str, Converter, TupleValue]]:
        plan = self._plan
        if self._positions is None:
            return ((name, converter, value) for (name, converter), value in zip(plan, values, strict=True))
        return ((plan[i][0], plan[i][1], values[i]) for i in self._positions)

    def convert(self, values: Sequence[TupleValue]) -> dict[str, Any]:
        """Column name -> JSON value, in column order; unchanged-TOAST columns omitted."""
        if len(values) != len(self._plan):
            msg = f"tuple has {len(values)} columns but the relation has {len(self._plan)}"
            raise TypeMappingError(msg)
        row: dict[str, Any] = {}
        masked = {self._plan[i][0] for i in self._masks}
        for name, converter, value in self._columns(values):
            if value is None:
                row[name] = None
            elif value.__class__ is str:
                try:
                    row[name] = converter(value)  # type: ignore[arg-type]
                except TypeMappingError as exc:
                    raise type(exc)(str(exc), column=name, type_oid=exc.type_oid) from exc
                except (ValueError, IndexError, ArithmeticError) as exc:
                    msg = f"cannot convert {value!r}: {exc}"
                    raise TypeMappingError(msg, column=name) from exc
            elif value is UNCHANGED_TOAST:
                continue
            elif isinstance(value, NonUtf8Text):
                if name in masked:  # masked, never quoted: its bytes are masked as text
                    row[name] = converter(bytes(value).decode("utf-8", "replace"))
                    continue
                msg = f"{bytes(value)[:32]!r} is not UTF-8 text (SQL_ASCII database?); the raw bytes are kept here"
                raise TypeMappingError(msg, column=name)
            else:
                msg = "binary-format tuple values are not supported; stream without the 'binary' option"
                raise TypeMappingError(msg, column=name)
        return row

    def convert_text(self, values: Sequence[TupleValue]) -> dict[str, Any]:
        """:meth:`convert` for tuples of a text-mode stream (every value ``str``, ``None`` or unchanged TOAST).

        The hot path of capture: one comprehension when no value is an unchanged TOAST;
        otherwise, and on any conversion error, :meth:`convert` gives the result or the error.
        """
        if len(values) == len(self._plan):
            try:
                if self._positions is None:
                    return {
                        name: converter(value) if value.__class__ is str else _null_or_not_text(value)  # type: ignore[arg-type]
                        for (name, converter), value in zip(self._plan, values, strict=True)
                    }
                return {
                    name: converter(value) if value.__class__ is str else _null_or_not_text(value)  # type: ignore[arg-type]
                    for name, converter, value in self._columns(values)
                }
            except (TypeMappingError, ValueError, TypeError, IndexError, ArithmeticError):
                pass  # convert() gives the result without unchanged TOAST, or the error naming the column
        return self.convert(values)

    def unchanged(self, values: Sequence[TupleValue]) -> tuple[str, ...]:
        """Names of the columns whose TOASTed value was not sent (unchanged)."""
        return tuple(name for name, _, value in self._columns(values) if value is UNCHANGED_TOAST)

    def native_encoder(self, keep: Sequence[int], key_columns: Sequence[int]) -> RowEncoder | None:
        """The extension's encoder of this relation's text tuples, or None without the extension.

        ``encode(values)`` gives ``orjson.dumps`` of the image restricted to the ``keep`` columns
        (:meth:`convert_text`, then the keep filter) and the key object of ``key_columns``, byte
        for byte, or None where this Python path must decide (unchanged TOAST, errors). Columns
        not kept are never converted; masked ones are masked (natively where the mask is).
        """
        if native.speedups is None:
            return None
        kept = set(keep)
        masks = self._masks
        plan = [
            (masks[i].native_kind, masks[i].native_param) if i in masks else native_kind(converter)
            for i, (_, converter) in enumerate(self._plan)
        ]
        return native.speedups.RowEncoder(  # type: ignore[no-any-return]
            tuple(kind for kind, _ in plan),
            tuple(param for _, param in plan),
            tuple(i in kept for i in range(len(self._plan))),
            tuple(orjson.dumps(name) + b":" for name, _ in self._plan),
            tuple(converter for _, converter in self._plan),
            tuple(key_columns),
            orjson.dumps,
            UNCHANGED_TOAST,
            tuple(masks[i].native_blob if i in masks else None for i in range(len(self._plan))),
        )


class TextRowDecoder:
    """A :data:`capture.postgres.events.relations.RowDecoder` over a :class:`RowConverter` for text-mode tuples.

    Every column kept, in column order; columns whose TOASTed value was not sent hold
    :data:`UNCHANGED_TOAST` (the event builder fills them). ``converter`` lets the event
    builder use the native encoder of the same conversion.
    """

    __slots__ = ("_convert", "_names", "converter")

    def __init__(self, converter: RowConverter) -> None:
        self.converter = converter
        self._names = converter.kept_names
        self._convert = converter.convert_text  # the stream and COPY send text, never binary

    def __call__(self, row: Sequence[TupleValue]) -> dict[str, Any]:
        """The row image of one tuple (unchanged-TOAST columns hold the placeholder)."""
        values = self._convert(row)
        names = self._names
        if len(values) == len(names):
            return values
        return {name: values.get(name, UNCHANGED_TOAST) for name in names}
