"""Rows of one relation: text tuples -> JSON row images, by the type map's converter per column.

:class:`RowConverter` is built once per Relation message (:func:`capture.typemap.column_converter`
per column) and converts each tuple with one call per column; :class:`TextRowDecoder` is the
event builder's :data:`capture.relations.RowDecoder` over it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import orjson

import native
from capture.errors import TypeMappingError
from capture.pgoutput_messages import UNCHANGED_TOAST, NonUtf8Text, TupleValue
from capture.typemap import column_converter, native_kind
from core.config import TypesConfig
from log.row_types import LogicalType, TypeRegistry

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
    """

    __slots__ = ("_plan", "logical_types", "names")

    def __init__(self, columns: Sequence[ColumnLike], modes: TypesConfig, registry: TypeRegistry | None = None) -> None:
        registry = registry if registry is not None else TypeRegistry()
        built = [column_converter(column.type_oid, column.atttypmod, modes, registry) for column in columns]
        self.names: tuple[str, ...] = tuple(column.name for column in columns)
        self.logical_types: tuple[LogicalType, ...] = tuple(logical for _, logical in built)
        self._plan = tuple(zip(self.names, (converter for converter, _ in built), strict=True))

    def convert(self, values: Sequence[TupleValue]) -> dict[str, Any]:
        """Column name -> JSON value, in column order; unchanged-TOAST columns omitted."""
        if len(values) != len(self._plan):
            msg = f"tuple has {len(values)} columns but the relation has {len(self._plan)}"
            raise TypeMappingError(msg)
        row: dict[str, Any] = {}
        for (name, converter), value in zip(self._plan, values, strict=True):
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
                return {
                    name: converter(value) if value.__class__ is str else _null_or_not_text(value)  # type: ignore[arg-type]
                    for (name, converter), value in zip(self._plan, values, strict=True)
                }
            except (TypeMappingError, ValueError, TypeError, IndexError, ArithmeticError):
                pass  # convert() gives the result without unchanged TOAST, or the error naming the column
        return self.convert(values)

    def unchanged(self, values: Sequence[TupleValue]) -> tuple[str, ...]:
        """Names of the columns whose TOASTed value was not sent (unchanged)."""
        return tuple(name for (name, _), value in zip(self._plan, values, strict=True) if value is UNCHANGED_TOAST)

    def native_encoder(self, keep: Sequence[int], key_columns: Sequence[int]) -> RowEncoder | None:
        """The extension's encoder of this relation's text tuples, or None without the extension.

        ``encode(values)`` gives ``orjson.dumps`` of the image restricted to the ``keep`` columns
        (:meth:`convert_text`, then the keep filter) and the key object of ``key_columns``, byte
        for byte, or None where this Python path must decide (unchanged TOAST, errors).
        """
        if native.speedups is None:
            return None
        kept = set(keep)
        plan = [native_kind(converter) for _, converter in self._plan]
        return native.speedups.RowEncoder(  # type: ignore[no-any-return]
            tuple(kind for kind, _ in plan),
            tuple(param for _, param in plan),
            tuple(i in kept for i in range(len(self._plan))),
            tuple(orjson.dumps(name) + b":" for name, _ in self._plan),
            tuple(converter for _, converter in self._plan),
            tuple(key_columns),
            orjson.dumps,
            UNCHANGED_TOAST,
        )


class TextRowDecoder:
    """A :data:`capture.relations.RowDecoder` over a :class:`RowConverter` for text-mode tuples.

    Every column in column order; columns whose TOASTed value was not sent hold
    :data:`UNCHANGED_TOAST` (the event builder fills them). ``converter`` lets the event
    builder use the native encoder of the same conversion.
    """

    __slots__ = ("_convert", "_names", "converter")

    def __init__(self, converter: RowConverter) -> None:
        self.converter = converter
        self._names = converter.names
        self._convert = converter.convert_text  # the stream and COPY send text, never binary

    def __call__(self, row: Sequence[TupleValue]) -> dict[str, Any]:
        """The row image of one tuple (unchanged-TOAST columns hold the placeholder)."""
        values = self._convert(row)
        names = self._names
        if len(values) == len(names):
            return values
        return {name: values.get(name, UNCHANGED_TOAST) for name in names}
