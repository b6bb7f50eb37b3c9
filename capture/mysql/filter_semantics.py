"""The operations of MySQL row filters, as MySQL does them (:mod:`capture.mysql.row_filter` compiles into these).

Each operation checks its operands when the condition is compiled (a comparison capture cannot
make exactly is refused in one line, :class:`RowFilterError`) and returns a :class:`Node` whose
``eval`` computes the value of one row: numbers (``int``/``Decimal``, ``float`` for doubles), text
with its collation (:class:`Text`), ``None`` for NULL; truth values are 1 and 0, as in MySQL.
"""

from __future__ import annotations

import base64
import decimal
import re
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from capture.mysql.binlog.table_map import ColumnShape, ColumnType
from capture.mysql.types.values import TypeModes
from core.errors import PermanentError


class RowFilterError(PermanentError):
    """A condition capture cannot evaluate exactly (the message says what to write instead)."""


class FilterOverflowError(PermanentError):
    """An arithmetic result outside BIGINT's range: MySQL refuses the row's statement, so capture stops."""


#: What a compiled condition is called with: the row's values as decoded (Debezium form), column order.
Row = Sequence[Any]
Eval = Callable[[Row], Any]

#: BIGINT's range: signed, as all integer arithmetic a filter may do is (UNSIGNED operands allow only %).
_INT64 = (-(1 << 63), (1 << 63) - 1)
#: MySQL's largest DECIMAL scale: a product with more decimals is rounded by the server, so refused here.
_MAX_SCALE = 30
#: Digits Python keeps in DECIMAL arithmetic: exact for sums and products of 65-digit DECIMALs.
_EXACT = decimal.Context(prec=200, traps=[decimal.InvalidOperation, decimal.Inexact])


@dataclass(frozen=True)
class Text:
    """A text value with the collation it compares by (None: a literal, which takes the other side's)."""

    value: str
    collation: str | None


# -- values: a decoded column value -> what the condition compares ---------------------------------------


class Kind:
    """What a node's values are: numbers, doubles, text, or opaque (a column usable only in IS NULL)."""

    NUMBER = "number"
    DOUBLE = "double"
    TEXT = "text"
    OPAQUE = "opaque"  # usable only in IS [NOT] NULL


@dataclass(frozen=True)
class Column:
    """A column as conditions read it: its position, kind, and how a decoded value becomes a compared one."""

    index: int
    kind: str
    convert: Callable[[Any], Any]
    collation: str | None = None
    describe: str = ""
    #: An UNSIGNED integer: MySQL's arithmetic on it is unsigned (a negative result is an error).
    unsigned: bool = False
    #: Digits after the point (DECIMAL).
    scale: int = 0


def _precise_decimal(scale: int) -> Callable[[Any], Decimal]:
    def convert(text: Any) -> Decimal:
        unscaled = int.from_bytes(base64.b64decode(text), "big", signed=True)
        return Decimal(unscaled).scaleb(-scale)

    return convert


def _float32(value: Any) -> float:
    # The decoded FLOAT is the shortest decimal of its 32-bit value; MySQL compares the 32-bit value itself.
    return float(struct.unpack("<f", struct.pack("<f", value))[0])


def column(index: int, column: ColumnShape, modes: TypeModes, collation_name: Callable[[int | None], str]) -> Column:
    """How conditions read the column at ``index`` whose values capture decodes in ``modes``."""
    kind = column.type
    native = f"{column.name} ({kind.name.lower()})"
    if kind == ColumnType.YEAR:  # the server's YEAR field is an unsigned TINYINT
        return Column(index, Kind.NUMBER, int, unsigned=True)
    if kind in (ColumnType.TINY, ColumnType.SHORT, ColumnType.INT24, ColumnType.LONG):
        return Column(index, Kind.NUMBER, int, unsigned=column.unsigned)
    if kind == ColumnType.LONGLONG:
        if column.unsigned and modes.bigint_unsigned == "precise":
            return Column(index, Kind.NUMBER, lambda v: int(_precise_decimal(0)(v)), unsigned=True)
        if column.unsigned:
            return Column(index, Kind.NUMBER, lambda v: v + (1 << 64) if v < 0 else v, unsigned=True)
        return Column(index, Kind.NUMBER, int)
    if kind == ColumnType.BIT and column.bits == 1:
        return Column(index, Kind.NUMBER, int)
    if kind == ColumnType.NEWDECIMAL and modes.decimal != "double":
        if modes.decimal == "precise":
            return Column(index, Kind.NUMBER, _precise_decimal(column.scale), scale=column.scale)
        return Column(index, Kind.NUMBER, Decimal, scale=column.scale)
    if kind == ColumnType.FLOAT:
        return Column(index, Kind.DOUBLE, _float32)
    if kind == ColumnType.DOUBLE:
        return Column(index, Kind.DOUBLE, float)
    text_kinds = (ColumnType.VARCHAR, ColumnType.VAR_STRING, ColumnType.STRING, ColumnType.BLOB)
    if (kind in text_kinds and not column.is_binary) or kind in (ColumnType.ENUM, ColumnType.SET):
        return Column(index, Kind.TEXT, str, collation_name(column.collation), native)
    why = "decimal_handling_mode double writes it rounded" if kind == ColumnType.NEWDECIMAL else "its type"
    return Column(index, Kind.OPAQUE, lambda v: v, describe=f"{native}: {why}")


@dataclass
class Node:
    """A compiled (sub)expression: its kind and ``eval(row)``."""

    kind: str
    eval: Eval
    literal: bool = False
    collation: str | None = None
    #: Why a column's values cannot be compared (an opaque column), for the error.
    opaque: str = ""
    #: Computed from an UNSIGNED integer (MySQL's arithmetic is then unsigned).
    unsigned: bool = False
    #: Digits after the point of a number.
    scale: int = 0


def column_node(column: Column) -> Node:
    """The node reading ``column``'s value (text with its collation)."""
    index, convert = column.index, column.convert
    if column.kind == Kind.TEXT:
        collation = column.collation

        def text(row: Row) -> Any:
            value = row[index]
            return None if value is None else Text(value, collation)

        return Node(Kind.TEXT, text, collation=collation)

    def value(row: Row) -> Any:
        raw = row[index]
        return None if raw is None else convert(raw)

    return Node(column.kind, value, opaque=column.describe, unsigned=column.unsigned, scale=column.scale)


def recollate(value: Any, collation: str) -> Any:
    """``value COLLATE collation``."""
    return None if value is None else Text(value.value, collation)


# -- semantics -------------------------------------------------------------------------------------------


def not_(value: Any) -> Any:
    """SQL's NOT (NULL stays NULL)."""
    return None if value is None else int(not value)


def neg(value: Any) -> Any:
    """Unary minus (NULL stays NULL)."""
    return None if value is None else _checked(-value)


def _checked(value: Any) -> Any:
    if isinstance(value, int) and not _INT64[0] <= value <= _INT64[1]:
        msg = f"a filter's arithmetic gave {value}, outside BIGINT's range (MySQL refuses such a statement)"
        raise FilterOverflowError(msg)
    return value


def truth(node: Node) -> None:
    """Refuse ``node`` as a truth value unless it is a number."""
    if node.kind in (Kind.TEXT, Kind.OPAQUE):
        msg = (
            f"{_described(node)} is used as a truth value; compare it instead"
            if node.kind == Kind.OPAQUE
            else "text is used as a truth value (MySQL would read it as a number); compare it instead"
        )
        raise RowFilterError(msg)


def _described(node: Node) -> str:
    return f"column {node.opaque}" if node.opaque else "a value"


def numeric(node: Node, op: str) -> None:
    """Refuse ``node`` as an operand of arithmetic ``op`` unless it is a number."""
    if node.kind == Kind.OPAQUE:
        msg = f"{_described(node)} cannot be used with {op!r} in a filter (only IS [NOT] NULL)"
        raise RowFilterError(msg)
    if node.kind == Kind.TEXT:
        msg = f"{op!r} on text is not supported in a filter (MySQL would convert the text to a number)"
        raise RowFilterError(msg)


def logic(op: str, left: Node, right: Node) -> Node:
    """``left AND right`` / ``left OR right`` (``op``: ``and``, ``or``), three-valued."""
    truth(left)
    truth(right)
    f, g = left.eval, right.eval
    if op == "and":

        def conjunction(row: Row) -> Any:
            a = f(row)
            if a is not None and not a:
                return 0
            b = g(row)
            if b is not None and not b:
                return 0
            return None if a is None or b is None else 1

        return Node(Kind.NUMBER, conjunction)

    def disjunction(row: Row) -> Any:
        a = f(row)
        if a:
            return 1
        b = g(row)
        if b:
            return 1
        return None if a is None or b is None else 0

    return Node(Kind.NUMBER, disjunction)


def arithmetic(op: str, left: Node, right: Node) -> Node:
    """``left op right`` for ``+ - * % DIV`` with MySQL's results (NULL on division by zero).

    Refused where the server's result is not Python's: arithmetic other than ``%`` on an UNSIGNED
    column (the server's is unsigned and errs below zero), and a product with more than 30 decimals
    (the server rounds it). DECIMALs are added and multiplied exactly (the server's 65 digits).
    """
    numeric(left, op)
    numeric(right, op)
    unsigned = left.unsigned or right.unsigned
    if unsigned and op != "%":
        msg = (
            f"{op!r} on an UNSIGNED column (or an integer above 9223372036854775807) is not supported in a filter "
            "(MySQL's arithmetic is then unsigned); compare the column itself"
        )
        raise RowFilterError(msg)
    scale = {"*": left.scale + right.scale, "DIV": 0}.get(op, max(left.scale, right.scale))
    if scale > _MAX_SCALE:
        msg = f"{op!r} gives more than {_MAX_SCALE} decimals, which MySQL rounds; compare fewer decimals"
        raise RowFilterError(msg)
    f, g = left.eval, right.eval
    double = Kind.DOUBLE in (left.kind, right.kind)
    kind = Kind.DOUBLE if double else Kind.NUMBER

    def apply(row: Row) -> Any:
        a, b = f(row), g(row)
        if a is None or b is None:
            return None
        if double:
            return _apply(float(a), float(b))
        with decimal.localcontext(_EXACT):
            return _apply(a, b)

    def _apply(a: Any, b: Any) -> Any:
        if op == "+":
            return _checked(a + b)
        if op == "-":
            return _checked(a - b)
        if op == "*":
            return _checked(a * b)
        if b == 0:
            return None  # MySQL: x % 0 and x DIV 0 are NULL
        if op == "DIV":
            quotient = abs(a) // abs(b)
            return _checked(int(quotient if (a < 0) == (b < 0) else -quotient))
        # MOD: the sign of the dividend (Decimal's % already is; int's and float's follow the divisor).
        if isinstance(a, Decimal) or isinstance(b, Decimal):
            return Decimal(a) % Decimal(b)
        remainder = abs(a) % abs(b)
        return -remainder if a < 0 else remainder

    return Node(kind, apply, unsigned=unsigned, scale=scale)


_PAD_SPACE_FREE = re.compile(r"(_nopad_|_0900_|^binary$)")


def _binary_collation(collation: str | None) -> bool:
    return collation is not None and (collation.endswith("_bin") or collation == "binary")


def _text_key(value: Text, collation: str) -> str:
    # PAD SPACE collations compare as if the shorter value were padded with spaces: for equality,
    # trailing spaces do not count (NO PAD ones, and MySQL 8's _0900_ ones, compare every character).
    return value.value if _PAD_SPACE_FREE.search(collation) else value.value.rstrip(" ")


def _text_comparable(op: str, left: Node, right: Node) -> str:
    """The collation a text comparison uses; refused unless it is a binary one and ``op`` an equality."""
    collation = left.collation or right.collation
    if left.collation and right.collation and left.collation != right.collation:
        msg = f"text of two collations ({left.collation}, {right.collation}) is compared; COLLATE one side"
        raise RowFilterError(msg)
    if collation is None:
        msg = "two text literals are compared; compare a column"
        raise RowFilterError(msg)
    if op not in ("=", "<>", "!=", "<=>"):
        msg = f"text is compared with {op!r}; filters compare text only by =, <>, <=> and IN"
        raise RowFilterError(msg)
    if not _binary_collation(collation):
        msg = (
            f"text of collation {collation} is compared, whose rules only the server knows; "
            f"compare under a binary collation, e.g. col COLLATE {collation.split('_')[0]}_bin = 'x'"
        )
        raise RowFilterError(msg)
    return collation


def compare(op: str, left: Node, right: Node) -> Node:
    """``left op right`` for ``= <> != < <= > >= <=>``; refused where capture cannot compare as MySQL."""
    for node in (left, right):
        if node.kind == Kind.OPAQUE:
            msg = f"{_described(node)} cannot be compared in a filter (only IS [NOT] NULL)"
            raise RowFilterError(msg)
    kinds = {left.kind, right.kind} - {"null"}
    if Kind.TEXT in kinds and kinds != {Kind.TEXT}:
        msg = "text is compared with a number (MySQL would convert the text to a number); compare like with like"
        raise RowFilterError(msg)
    f, g = left.eval, right.eval
    if kinds == {Kind.TEXT}:
        collation = _text_comparable(op, left, right)

        def key(value: Any) -> Any:
            return None if value is None else _text_key(value, collation)

        f0, g0 = f, g
        f, g = (lambda row: key(f0(row))), (lambda row: key(g0(row)))
    elif Kind.DOUBLE in kinds:
        f1, g1 = f, g
        f = lambda row: None if (v := f1(row)) is None else float(v)  # noqa: E731
        g = lambda row: None if (v := g1(row)) is None else float(v)  # noqa: E731
    compare = _COMPARISONS[op]
    if op == "<=>":
        return Node(Kind.NUMBER, lambda row: int(f(row) == g(row)))

    def apply(row: Row) -> Any:
        a = f(row)
        if a is None:
            return None
        b = g(row)
        return None if b is None else int(compare(a, b))

    return Node(Kind.NUMBER, apply)


_COMPARISONS: dict[str, Callable[[Any, Any], bool]] = {
    "=": lambda a, b: a == b,
    "<=>": lambda a, b: a == b,
    "<>": lambda a, b: a != b,
    "!=": lambda a, b: a != b,
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
}


def in_list(left: Node, items: list[Node], negated: bool) -> Node:
    """``left [NOT] IN (items)``, three-valued."""
    tests = [compare("=", left, item) for item in items]
    evals = [t.eval for t in tests]

    def member(row: Row) -> Any:
        unknown = False
        for test in evals:
            result = test(row)
            if result:
                return 0 if negated else 1
            unknown = unknown or result is None
        return None if unknown else (1 if negated else 0)

    return Node(Kind.NUMBER, member)


def negation(node: Node) -> Node:
    """``NOT node``."""
    truth(node)
    inner = node.eval
    return Node(Kind.NUMBER, lambda row: not_(inner(row)))


def is_null(node: Node, negated: bool) -> Node:
    """``node IS [NOT] NULL`` (any column)."""
    inner = node.eval
    return Node(Kind.NUMBER, lambda row: int((inner(row) is None) != negated))


def minus(node: Node) -> Node:
    """``-node``."""
    numeric(node, "-")
    inner = node.eval  # signed, also of an UNSIGNED column (the server's -x is; out of BIGINT's range it stops)
    return Node(node.kind, lambda row: neg(inner(row)), scale=node.scale)


def constant(kind: str, value: Any) -> Node:
    """A literal (an integer past BIGINT's signed range is the server's BIGINT UNSIGNED, then DECIMAL)."""
    scale = -int(value.as_tuple().exponent) if isinstance(value, Decimal) else 0
    unsigned = isinstance(value, int) and value > _INT64[1]
    if unsigned and value > (1 << 64) - 1:
        value, unsigned = Decimal(value), False
    return Node(kind, lambda _row: value, literal=True, scale=max(0, scale), unsigned=unsigned)


def collated(node: Node, collation: str) -> Node:
    """``node COLLATE collation``."""
    inner = node.eval
    return Node(Kind.TEXT, lambda row: recollate(inner(row), collation), collation=collation)
