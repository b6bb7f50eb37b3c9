"""PostgreSQL text values -> Debezium JSON values: the converters of every non-temporal type.

A converter takes one column's text value (never NULL) and returns its JSON value in the
form its :class:`log.row_types.LogicalType` says; :mod:`capture.postgres.types.typemap` picks one per
column. Decisions where Debezium's table is silent are listed in that module's docstring
and repeated where they are implemented.
"""

from __future__ import annotations

import base64
import re
import struct
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from typing import Any, Final

import orjson

from capture.errors import TypeMappingError, UnrepresentableValueError
from log.pg_types import MONEY_FRACTION_DIGITS, Oid
from log.row_types import LogicalKind, LogicalType

#: A converter: one column's text value -> its JSON value. Never receives NULL.
Converter = Callable[[str], Any]

_FLOAT_SPECIAL: Final = {"NaN": "NaN", "Infinity": "Infinity", "-Infinity": "-Infinity"}
# Debezium's SpecialValueDecimal.toString() prints the enum constant's name.
_NUMERIC_SPECIAL_STRING: Final = {"NaN": "NAN", "Infinity": "POSITIVE_INFINITY", "-Infinity": "NEGATIVE_INFINITY"}
_PRECISE_SPECIAL: Final = (
    "numeric value {} cannot be expressed with decimal_handling_mode 'precise' "
    "(Debezium fails such records too); set decimal_handling_mode to 'string' or 'double'"
)


def identity(text: str) -> str:
    """The text as it is (text types, json, uuid, enums, ranges, unmapped types)."""
    return text


def boolean(text: str) -> bool:
    """``bool``."""
    return text == "t"


def float_or_special(text: str) -> float | str:
    """``real``/``double precision`` (and ``numeric`` in ``double`` mode)."""
    # JSON has no NaN/Infinity; these strings are what Debezium's JSON converter prints.
    special = _FLOAT_SPECIAL.get(text)
    return special if special is not None else float(text)


def boolean_bit(text: str) -> bool:
    """``bit(1)`` -> BOOLEAN."""
    return text == "1"


def bits_base64(text: str) -> str:
    """``bit(n>1)``/``varbit``: io.debezium.data.Bits, little-endian, sized by the content (bit i = char len-1-i)."""
    value = int(text, 2) if text else 0
    return base64.b64encode(value.to_bytes((value.bit_length() + 7) // 8, "little")).decode()


def bytea_base64(text: str) -> str:
    """``bytea`` in ``base64`` mode."""
    return base64.b64encode(bytes.fromhex(text[2:])).decode()


def bytea_hex(text: str) -> str:
    """``bytea`` in ``hex`` mode."""
    # bytea_output=hex prints lowercase hex after "\x": already the hex mode's value.
    return text[2:]


def point(text: str) -> dict[str, Any]:
    """``point`` -> io.debezium.data.geometry.Point."""
    # "two FLOAT64 fields, (x,y)"; Debezium also fills `wkb` (little-endian WKB Point) and leaves `srid` null.
    x_text, y_text = text.strip("()").split(",")
    x, y = float(x_text), float(y_text)
    wkb = struct.pack("<BIdd", 1, 1, x, y)
    return {"x": x, "y": y, "wkb": base64.b64encode(wkb).decode(), "srid": None}


def hstore(text: str) -> str:
    """``hstore`` -> a JSON object's text (hstore.handling.mode=json: ``{"key" : "val"}``)."""
    return orjson.dumps(_parse_hstore(text)).decode()


_HSTORE_TOKEN = re.compile(r'"((?:[^"\\]|\\.)*)"|(NULL)')


def _parse_hstore(text: str) -> dict[str, str | None]:
    tokens = [None if null else re.sub(r"\\(.)", r"\1", quoted) for quoted, null in _HSTORE_TOKEN.findall(text)]
    result: dict[str, str | None] = {}
    for index in range(0, len(tokens) - 1, 2):
        result[str(tokens[index])] = tokens[index + 1]
    return result


# -- decimals -------------------------------------------------------------------------------------


def _unscaled_base64(unscaled: int) -> str:
    """Kafka Connect ``Decimal`` bytes: ``BigInteger.toByteArray()`` (minimal big-endian two's complement)."""
    length = (unscaled + (unscaled < 0)).bit_length() // 8 + 1
    return base64.b64encode(unscaled.to_bytes(length, "big", signed=True)).decode()


def decimal_string(text: str) -> str:
    """``numeric`` in ``string`` mode: PostgreSQL's plain text; NaN/infinities by Debezium's names."""
    special = _NUMERIC_SPECIAL_STRING.get(text)
    return special if special is not None else text


def _refuse_special(text: str) -> None:
    if text in _NUMERIC_SPECIAL_STRING:
        raise UnrepresentableValueError(_PRECISE_SPECIAL.format(text))


def decimal_variable(text: str) -> dict[str, Any]:
    """Unconstrained ``numeric`` in ``precise`` mode: io.debezium.data.VariableScaleDecimal."""
    # "`scale` ... and `value` ... in an unscaled form"; Debezium strips trailing zeros first and
    # never uses a negative scale.
    _refuse_special(text)
    value = Decimal(text).normalize()
    exponent = value.as_tuple().exponent
    value_scale = max(0, -exponent) if isinstance(exponent, int) else 0
    unscaled = int(value.scaleb(value_scale))
    return {"scale": value_scale, "value": _unscaled_base64(unscaled)}


def decimal_converter(logical: LogicalType) -> Converter:
    """The ``numeric`` converter for the column's logical type (the decimal handling mode chose it)."""
    if logical.kind is LogicalKind.DECIMAL:
        return decimal_string
    if logical.kind is LogicalKind.DOUBLE:
        return float_or_special
    if logical.kind is LogicalKind.DECIMAL_VARIABLE or logical.scale is None:
        return decimal_variable
    column_scale = logical.scale

    def to_fixed(text: str) -> str:
        _refuse_special(text)
        quantum = Decimal(1).scaleb(-column_scale)
        unscaled = int(Decimal(text).quantize(quantum).scaleb(column_scale))
        return _unscaled_base64(unscaled)

    return to_fixed


def _money(text: str) -> Decimal:
    # lc_monetary=C prints "$1,234.56" and "-$0.01".
    negative = text.startswith("-") or text.startswith("(")
    digits = "".join(char for char in text if char.isdigit() or char == ".")
    try:
        value = Decimal(digits).quantize(Decimal("0.01"))
    except InvalidOperation as exc:
        msg = f"cannot parse money value {text!r}; pin lc_monetary=C on the replication session"
        raise TypeMappingError(msg, type_oid=Oid.MONEY) from exc
    return -value if negative else value


def _money_string(text: str) -> str:
    return str(_money(text))


def _money_double(text: str) -> float:
    return float(_money(text))


def _money_base64(text: str) -> str:
    return _unscaled_base64(int(_money(text).scaleb(MONEY_FRACTION_DIGITS)))


def money_converter(logical: LogicalType) -> Converter:
    """The ``money`` converter for the column's logical type: a decimal of scale ``MONEY_FRACTION_DIGITS``."""
    # "MONEY[(M[,D])] ... The `scale` schema parameter is determined by the money.fraction.digits".
    if logical.kind is LogicalKind.DECIMAL:
        return _money_string
    if logical.kind is LogicalKind.DOUBLE:
        return _money_double
    return _money_base64


# -- arrays ---------------------------------------------------------------------------------------


def _parse_array(text: str) -> list[Any]:
    """Parse a PostgreSQL array literal (any dimension) into nested lists of ``str | None``."""
    if text.startswith("["):  # explicit bounds "[0:1]={...}": bounds are dropped
        text = text[text.index("=") + 1 :]
    pos = 0
    length = len(text)

    def parse_level() -> list[Any]:
        nonlocal pos
        items: list[Any] = []
        pos += 1  # "{"
        while pos < length:
            char = text[pos]
            if char == "}":
                pos += 1
                return items
            if char in ", ":
                pos += 1
            elif char == "{":
                items.append(parse_level())
            elif char == '"':
                pos += 1
                chunk: list[str] = []
                while text[pos] != '"':
                    if text[pos] == "\\":
                        pos += 1
                    chunk.append(text[pos])
                    pos += 1
                pos += 1
                items.append("".join(chunk))
            else:
                end = pos
                while text[end] not in ",}":
                    end += 1
                token = text[pos:end].strip()
                items.append(None if token == "NULL" else token)
                pos = end
        msg = f"unterminated array literal {text!r}"
        raise ValueError(msg)

    return parse_level()


def array_converter(element: Converter) -> Converter:
    """An array literal -> nested lists of ``element``'s values (NULL elements stay None)."""

    def convert_items(items: list[Any]) -> list[Any]:
        return [
            None if item is None else convert_items(item) if isinstance(item, list) else element(item) for item in items
        ]

    def convert(text: str) -> list[Any]:
        return convert_items(_parse_array(text))

    return convert
