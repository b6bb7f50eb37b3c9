"""JSON values of one column -> one Arrow array of the column's Spark type (see ``source_schema``).

Column-wise and pure: each function takes the column's values across a batch of records
and returns an array of exactly the Arrow type Spark expects (``to_arrow_schema`` of the
declared schema), trying one vectorised Arrow conversion first and falling back to a
per-value Python path only when the batch holds special values (NaN text, infinities,
values of an older column type). A value that fits neither raises :class:`BadValue`
with its index, so the caller can name the record; nothing is turned into null silently
except what the type cannot hold by definition (NaN in a DECIMAL).

The bulk path (:func:`wire_type`, :func:`decode_wire`) starts from an Arrow array that a
whole batch's JSON was parsed into (``pyarrow.json``): for values of the column's regular
JSON type it gives exactly what :func:`decode_values` gives; anything irregular makes the
parse or a cast fail, and the caller then decodes the batch per value instead.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import datetime as dt
from collections.abc import Callable, Sequence
from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation
from typing import Any, Final

import orjson
import pyarrow as pa  # type: ignore[import-untyped]  # no stubs
import pyarrow.compute as pc  # type: ignore[import-untyped]

from log.row_types import LogicalKind, LogicalType

# Spark's timestamp and date range: years 0001..9999. Postgres' ±infinity sentinels and
# dates beyond it are clamped to its ends (Spark cannot print or cast beyond them).
MIN_TIMESTAMP_US: Final = -62_135_596_800_000_000  # 0001-01-01T00:00:00Z
MAX_TIMESTAMP_US: Final = 253_402_300_799_999_999  # 9999-12-31T23:59:59.999999Z
MIN_DATE_DAYS: Final = -719_162
MAX_DATE_DAYS: Final = 2_932_896
_DAY_US: Final = 86_400_000_000
_EPOCH: Final = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_FLOAT_SPECIAL: Final = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}
_DECIMAL_SPECIAL: Final = frozenset({"NAN", "POSITIVE_INFINITY", "NEGATIVE_INFINITY", "NaN", "Infinity", "-Infinity"})
_ARROW_ERRORS: Final = (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError, TypeError)


class BadValue(ValueError):
    """Value ``index`` of the column does not fit the column's type."""

    def __init__(self, index: int, value: Any, expected: str, reason: str) -> None:
        super().__init__(f"value {index} ({value!r}) is not a {expected}: {reason}")
        self.index = index
        self.value = value
        self.expected = expected
        self.reason = reason


def decode_values(values: Sequence[Any], logical: LogicalType, target: pa.DataType) -> pa.Array:
    """Decode one column's JSON values (``None`` = null) into an array of type ``target``."""
    kind = logical.kind
    if kind in (LogicalKind.DECIMAL, LogicalKind.DECIMAL_BASE64, LogicalKind.DECIMAL_VARIABLE):
        return _decimals(values, logical, target)
    if pa.types.is_string(target):
        return _strings(values)
    decoder = _DECODERS.get(kind)
    if decoder is not None:
        return decoder(values, logical, target)
    if kind is LogicalKind.ARRAY and logical.element is not None:
        return _lists(values, logical.element, target)
    return _strings(values)


def _per_value(values: Sequence[Any], convert: Callable[[Any], Any], target: pa.DataType, expected: str) -> pa.Array:
    out: list[Any] = []
    for index, value in enumerate(values):
        if value is None:
            out.append(None)
            continue
        try:
            out.append(convert(value))
        except (ValueError, TypeError, ArithmeticError, KeyError, binascii.Error) as exc:
            raise BadValue(index, value, expected, str(exc) or type(exc).__name__) from None
    try:
        return pa.array(out, target)
    except _ARROW_ERRORS as exc:
        index = _first_rejected(out, target)
        raise BadValue(index, values[index], expected, str(exc)) from None


def _first_rejected(values: Sequence[Any], target: pa.DataType) -> int:
    for index, value in enumerate(values):
        try:
            pa.array([value], target)
        except _ARROW_ERRORS:
            return index
    return 0


def _strings(values: Sequence[Any]) -> pa.Array:
    try:
        return pa.array(values, pa.string())
    except _ARROW_ERRORS:
        # A type the schema record cannot name (enum array, domain over int ...) or a column
        # whose type changed: keep the value's JSON text rather than lose it.
        return pa.array(
            [v if v is None or isinstance(v, str) else orjson.dumps(v).decode() for v in values], pa.string()
        )


def _exact(values: Sequence[Any], logical: LogicalType, target: pa.DataType) -> pa.Array:
    try:
        return pa.array(values, target)
    except _ARROW_ERRORS:
        convert: Callable[[Any], Any] = _to_bool if pa.types.is_boolean(target) else _to_int
        return _per_value(values, convert, target, str(target))


def _to_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if value in ("t", "true", 1, 0, "f", "false"):
        return value in ("t", "true", 1)
    msg = "not a boolean"
    raise ValueError(msg)


def _to_int(value: Any) -> int:
    if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
        msg = "not an integer"
        raise ValueError(msg)
    return int(value)


def _floats(values: Sequence[Any], logical: LogicalType, target: pa.DataType) -> pa.Array:
    try:
        return pa.array(values, target)
    except _ARROW_ERRORS:
        # "NaN"/"Infinity"/"-Infinity" are how the JSON converter prints IEEE specials.
        return _per_value(values, lambda v: _FLOAT_SPECIAL[v] if isinstance(v, str) else float(v), target, "number")


def _decimals(values: Sequence[Any], logical: LogicalType, target: pa.DataType) -> pa.Array:
    kind = logical.kind
    if kind is LogicalKind.DECIMAL:
        try:
            exact = pa.array(values, pa.string())
            return exact if pa.types.is_string(target) else exact.cast(target)
        except _ARROW_ERRORS:
            pass  # specials, excess scale, numbers of an older column type: per value below
    scale = logical.scale or 0
    if pa.types.is_string(target):
        return _per_value(values, lambda v: _decimal_text(_to_decimal(v, kind, scale)), target, "decimal")
    quantum = Decimal(1).scaleb(-target.scale)
    limit = target.precision

    def fit(value: Any) -> Decimal | None:
        number = _to_decimal(value, kind, scale)
        if number is None:
            return None
        rounded = number.quantize(quantum, rounding=ROUND_HALF_EVEN)
        if len(rounded.as_tuple().digits) > limit:
            msg = f"more than {limit} digits"
            raise ValueError(msg)
        return rounded

    return _per_value(values, fit, target, f"decimal({target.precision},{target.scale})")


def _to_decimal(value: Any, kind: LogicalKind, scale: int) -> Decimal | None:
    if kind is LogicalKind.DECIMAL_BASE64 and isinstance(value, str):
        return Decimal(int.from_bytes(base64.b64decode(value, validate=True), "big", signed=True)).scaleb(-scale)
    if isinstance(value, dict):  # io.debezium.data.VariableScaleDecimal
        unscaled = int.from_bytes(base64.b64decode(value["value"], validate=True), "big", signed=True)
        return Decimal(unscaled).scaleb(-int(value["scale"]))
    if isinstance(value, str) and value in _DECIMAL_SPECIAL:
        return None  # NaN / ±Infinity: a DECIMAL cannot hold them (documented)
    if isinstance(value, bool):
        msg = "a boolean"
        raise ValueError(msg)
    try:
        return Decimal(str(value))
    except InvalidOperation:
        msg = "not a number"
        raise ValueError(msg) from None


def _decimal_text(value: Decimal | None) -> str | None:
    return None if value is None else format(value, "f")


def _base64(values: Sequence[Any], logical: LogicalType, target: pa.DataType) -> pa.Array:
    return _per_value(values, lambda v: base64.b64decode(v, validate=True), target, "base64 string")


def _hex(values: Sequence[Any], logical: LogicalType, target: pa.DataType) -> pa.Array:
    return _per_value(values, bytes.fromhex, target, "hex string")


def _clamp(numbers: pa.Array, low: int, high: int) -> pa.Array:
    low_scalar, high_scalar = pa.scalar(low, pa.int64()), pa.scalar(high, pa.int64())
    # skip_nulls=False: a null stays null instead of taking the bound.
    lowered = pc.min_element_wise(numbers, high_scalar, skip_nulls=False)
    return pc.max_element_wise(lowered, low_scalar, skip_nulls=False)


def _dates(values: Sequence[Any], logical: LogicalType, target: pa.DataType) -> pa.Array:
    return _dates_of(_ints(values, "date (days since 1970-01-01)"), logical, target)


def _ints(values: Sequence[Any], expected: str) -> pa.Array:
    try:
        return pa.array(values, pa.int64())
    except _ARROW_ERRORS:
        return _per_value(values, _to_int, pa.int64(), expected)


def _dates_of(numbers: pa.Array, logical: LogicalType, target: pa.DataType) -> pa.Array:
    return _clamp(numbers, MIN_DATE_DAYS, MAX_DATE_DAYS).cast(pa.int32()).cast(target)


def _times(values: Sequence[Any], logical: LogicalType, target: pa.DataType) -> pa.Array:
    return _times_of(_ints(values, "time of day"), logical, target)


def _times_of(numbers: pa.Array, logical: LogicalType, target: pa.DataType) -> pa.Array:
    # 24:00:00 is a valid Postgres time; Arrow/Spark times stop one tick before it.
    per_us = 1000 if logical.kind is LogicalKind.TIME_MS else 1
    ticks = _clamp(numbers, 0, _DAY_US // per_us - 1)
    micros = pc.multiply(ticks, pa.scalar(per_us, pa.int64())) if per_us != 1 else ticks
    if pa.types.is_integer(target):  # the default Spark type: microseconds past midnight
        return micros.cast(target)
    return pc.multiply(micros, pa.scalar(1000, pa.int64())).cast(pa.time64("ns")).cast(target)


def _timestamps(values: Sequence[Any], logical: LogicalType, target: pa.DataType) -> pa.Array:
    return _timestamps_of(_ints(values, "epoch timestamp"), logical, target)


def _timestamps_of(numbers: pa.Array, logical: LogicalType, target: pa.DataType) -> pa.Array:
    per_us = 1000 if logical.kind is LogicalKind.TIMESTAMP_MS else 1
    ticks = _clamp(numbers, MIN_TIMESTAMP_US // per_us, MAX_TIMESTAMP_US // per_us)
    micros = pc.multiply(ticks, pa.scalar(per_us, pa.int64())) if per_us != 1 else ticks
    return micros.cast(target)


def _timestamptz(values: Sequence[Any], logical: LogicalType, target: pa.DataType) -> pa.Array:
    try:
        return pa.array(values, pa.string()).cast(target)
    except _ARROW_ERRORS:
        micros = _per_value(values, _timestamptz_micros, pa.int64(), "ISO-8601 timestamp")
        return micros.cast(target)


def _timestamptz_micros(text: str) -> int:
    # ±infinity, BC years ("-0044-...") and years past 9999 ("+10000-...") lie outside Spark's range.
    if text == "infinity" or text.startswith("+"):
        return MAX_TIMESTAMP_US
    if text == "-infinity" or text.startswith("-"):
        return MIN_TIMESTAMP_US
    moment = dt.datetime.fromisoformat(text)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return (moment - _EPOCH) // dt.timedelta(microseconds=1)


def _points(values: Sequence[Any], logical: LogicalType, target: pa.DataType) -> pa.Array:
    for index, value in enumerate(values):
        if value is not None and not isinstance(value, dict):
            raise BadValue(index, value, "point", "expected an object with x and y")
    xs = pa.array([None if v is None else v.get("x") for v in values], pa.float64())
    ys = pa.array([None if v is None else v.get("y") for v in values], pa.float64())
    mask = pa.array([v is None for v in values], pa.bool_())
    return pa.StructArray.from_arrays([xs, ys], fields=list(target), mask=mask)


def _flatten(items: list[Any], out: list[Any]) -> None:
    for item in items:
        if isinstance(item, list):
            _flatten(item, out)
        else:
            out.append(item)


def _lists(values: Sequence[Any], element: LogicalType, target: pa.DataType) -> pa.Array:
    offsets = [0]
    flat: list[Any] = []
    nulls: list[bool] = []
    for index, value in enumerate(values):
        if value is None:
            nulls.append(True)
        elif isinstance(value, list):
            nulls.append(False)
            _flatten(value, flat)
        else:
            raise BadValue(index, value, str(target), "expected a JSON array")
        offsets.append(len(flat))
    try:
        children = decode_values(flat, element, target.value_type)
    except BadValue as exc:
        row = bisect.bisect_right(offsets, exc.index) - 1
        raise BadValue(row, values[row], exc.expected, f"element {exc.value!r}: {exc.reason}") from None
    return pa.ListArray.from_arrays(
        pa.array(offsets, pa.int32()), children, type=target, mask=pa.array(nulls, pa.bool_())
    )


_Decoder = Callable[[Sequence[Any], LogicalType, pa.DataType], pa.Array]
_DECODERS: Final[dict[LogicalKind, _Decoder]] = {
    LogicalKind.BOOLEAN: _exact,
    LogicalKind.INT16: _exact,
    LogicalKind.INT32: _exact,
    LogicalKind.INT64: _exact,
    LogicalKind.INTERVAL_US: _exact,
    LogicalKind.FLOAT: _floats,
    LogicalKind.DOUBLE: _floats,
    LogicalKind.BYTES_BASE64: _base64,
    LogicalKind.BITS: _base64,
    LogicalKind.BYTES_HEX: _hex,
    LogicalKind.DATE: _dates,
    LogicalKind.TIME_MS: _times,
    LogicalKind.TIME_US: _times,
    LogicalKind.TIMESTAMP_MS: _timestamps,
    LogicalKind.TIMESTAMP_US: _timestamps,
    LogicalKind.TIMESTAMPTZ_STRING: _timestamptz,
    LogicalKind.POINT: _points,
}


# --------------------------------------------------------------------------- bulk path

_INTEGER_KINDS: Final = frozenset({LogicalKind.INT16, LogicalKind.INT32, LogicalKind.INT64, LogicalKind.INTERVAL_US})
_FROM_INTS: Final[dict[LogicalKind, Callable[[pa.Array, LogicalType, pa.DataType], pa.Array]]] = {
    LogicalKind.DATE: _dates_of,
    LogicalKind.TIME_MS: _times_of,
    LogicalKind.TIME_US: _times_of,
    LogicalKind.TIMESTAMP_MS: _timestamps_of,
    LogicalKind.TIMESTAMP_US: _timestamps_of,
}
#: Kinds whose text values are decoded per value (no Arrow kernel for base64/hex).
_PER_VALUE_TEXT: Final = frozenset(
    {LogicalKind.DECIMAL_BASE64, LogicalKind.BYTES_BASE64, LogicalKind.BITS, LogicalKind.BYTES_HEX}
)
_VARIABLE_DECIMAL_WIRE: Final = pa.struct([("scale", pa.int64()), ("value", pa.string())])


def wire_type(logical: LogicalType, target: pa.DataType) -> pa.DataType | None:
    """The Arrow type a column's regular JSON values parse into in bulk; ``None``: per value only."""
    kind = logical.kind
    if kind is LogicalKind.DECIMAL or kind in _PER_VALUE_TEXT:
        return pa.string()
    if kind is LogicalKind.DECIMAL_VARIABLE:
        return _VARIABLE_DECIMAL_WIRE
    if pa.types.is_string(target):
        return pa.string()
    if kind is LogicalKind.BOOLEAN:
        return pa.bool_()
    if kind in _INTEGER_KINDS or kind in _FROM_INTS:
        return pa.int64()
    if kind in (LogicalKind.FLOAT, LogicalKind.DOUBLE):
        return pa.float64()
    if kind is LogicalKind.TIMESTAMPTZ_STRING:
        return pa.string()
    if kind is LogicalKind.POINT:
        return pa.struct([("x", pa.float64()), ("y", pa.float64())])
    return None  # arrays (nested, flattened per value) and kinds without a bulk form


def decode_wire(array: pa.Array, logical: LogicalType, target: pa.DataType) -> pa.Array:
    """Decode a column parsed as :func:`wire_type` into ``target``, as :func:`decode_values` would.

    Raises (``BadValue`` or an Arrow error) where the per-value path must decide instead.
    """
    kind = logical.kind
    if kind is LogicalKind.DECIMAL:
        return array if pa.types.is_string(target) else array.cast(target)
    if kind in _PER_VALUE_TEXT or kind is LogicalKind.DECIMAL_VARIABLE:
        return decode_values(array.to_pylist(), logical, target)
    if pa.types.is_string(target):
        return array
    from_ints = _FROM_INTS.get(kind)
    if from_ints is not None:
        return from_ints(array, logical, target)
    if kind is LogicalKind.POINT:
        x, y = array.flatten()
        return pa.StructArray.from_arrays([x, y], fields=list(target), mask=array.is_null())
    return array if array.type == target else array.cast(target)
