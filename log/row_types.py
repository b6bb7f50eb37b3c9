"""Row-image value types: what each column's JSON value in the log decodes back to, for any source kind.

A column's :class:`LogicalType` says the form of its JSON values (``int64``, ``decimal(10,2)`` as a
string, ``timestamp_us`` ...); readers of the log (Spark, Arrow) decode by it, and every source
kind writes its values in that form. This module is the contract between the two.

Schema records (:mod:`log.table_schemas`) carry each column's logical type in Debezium's schema
vocabulary, the Kafka Connect schema Debezium gives a field (:func:`connect_schema`: a literal
type such as ``int64``, ``string``, ``bytes``, ``struct``, ``array``, a semantic name such as
``io.debezium.time.MicroTimestamp`` or ``org.apache.kafka.connect.data.Decimal``, and
parameters such as ``scale``), beside the source's native type name. Where Debezium's
vocabulary cannot say what a JSON value holds (a decimal written as a string keeps its
precision and scale here; bytes written as hex), the name is in the ``headwater.`` namespace.

How PostgreSQL's types map to these (and how schema records that name only PostgreSQL type oids
are read) is :mod:`log.pg_types`.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final


class LogicalKind(enum.StrEnum):
    """How a JSON value must be read back into a typed column (Spark / Arrow)."""

    BOOLEAN = "boolean"
    INT16 = "int16"
    INT32 = "int32"
    INT64 = "int64"
    FLOAT = "float"  # float32; may also be the strings "NaN", "Infinity", "-Infinity"
    DOUBLE = "double"  # float64; ditto
    STRING = "string"
    JSON = "json"  # a string holding a JSON document
    UUID = "uuid"  # a string
    ENUM = "enum"  # a string
    DECIMAL = "decimal"  # decimal as a plain string; "NAN"/"POSITIVE_INFINITY"/"NEGATIVE_INFINITY" possible
    DECIMAL_BASE64 = "decimal_base64"  # base64 big-endian two's-complement unscaled value at `scale`
    DECIMAL_VARIABLE = "decimal_variable"  # {"scale": int, "value": base64 unscaled}
    BYTES_BASE64 = "bytes_base64"
    BYTES_HEX = "bytes_hex"
    BITS = "bits"  # base64, little-endian bit order (io.debezium.data.Bits)
    DATE = "date"  # int days since 1970-01-01
    TIME_MS = "time_ms"  # int milliseconds past midnight
    TIME_US = "time_us"  # int microseconds past midnight
    TIMESTAMP_MS = "timestamp_ms"  # int milliseconds since epoch, no time zone
    TIMESTAMP_US = "timestamp_us"  # int microseconds since epoch, no time zone
    TIMESTAMPTZ_STRING = "timestamptz_string"  # ISO-8601 in UTC ("...Z") or "infinity"/"-infinity"
    TIMETZ_STRING = "timetz_string"  # ISO-8601 time in UTC ("HH:MM:SS[.f]Z")
    INTERVAL_US = "interval_us"  # int microseconds (months = 30.4375 days)
    POINT = "point"  # {"x": double, "y": double, "wkb": base64, "srid": null}
    ARRAY = "array"


@dataclass(frozen=True, slots=True)
class LogicalType:
    """A column's logical type under a set of modes; ``str()`` gives e.g. ``decimal(10,2)``, ``array<int32>``."""

    kind: LogicalKind
    precision: int | None = None
    scale: int | None = None
    element: LogicalType | None = None

    def __str__(self) -> str:
        if self.kind is LogicalKind.ARRAY and self.element is not None:
            return f"array<{self.element}>"
        if self.precision is not None:
            return f"{self.kind.value}({self.precision},{self.scale or 0})"
        if self.scale is not None:
            return f"{self.kind.value}(scale={self.scale})"
        return self.kind.value


#: ``(literal type, semantic name)`` of each kind in Debezium's schema vocabulary (Kafka Connect).
_CONNECT: Final[Mapping[LogicalKind, tuple[str, str | None]]] = {
    LogicalKind.BOOLEAN: ("boolean", None),
    LogicalKind.INT16: ("int16", None),
    LogicalKind.INT32: ("int32", None),
    LogicalKind.INT64: ("int64", None),
    LogicalKind.FLOAT: ("float32", None),
    LogicalKind.DOUBLE: ("float64", None),
    LogicalKind.STRING: ("string", None),
    LogicalKind.JSON: ("string", "io.debezium.data.Json"),
    LogicalKind.UUID: ("string", "io.debezium.data.Uuid"),
    LogicalKind.ENUM: ("string", "io.debezium.data.Enum"),
    LogicalKind.DECIMAL: ("string", "headwater.data.DecimalString"),
    LogicalKind.DECIMAL_BASE64: ("bytes", "org.apache.kafka.connect.data.Decimal"),
    LogicalKind.DECIMAL_VARIABLE: ("struct", "io.debezium.data.VariableScaleDecimal"),
    LogicalKind.BYTES_BASE64: ("bytes", None),
    LogicalKind.BYTES_HEX: ("string", "headwater.data.HexBytes"),
    LogicalKind.BITS: ("bytes", "io.debezium.data.Bits"),
    LogicalKind.DATE: ("int32", "io.debezium.time.Date"),
    LogicalKind.TIME_MS: ("int32", "io.debezium.time.Time"),
    LogicalKind.TIME_US: ("int64", "io.debezium.time.MicroTime"),
    LogicalKind.TIMESTAMP_MS: ("int64", "io.debezium.time.Timestamp"),
    LogicalKind.TIMESTAMP_US: ("int64", "io.debezium.time.MicroTimestamp"),
    LogicalKind.TIMESTAMPTZ_STRING: ("string", "io.debezium.time.ZonedTimestamp"),
    LogicalKind.TIMETZ_STRING: ("string", "io.debezium.time.ZonedTime"),
    LogicalKind.INTERVAL_US: ("int64", "io.debezium.time.MicroDuration"),
    LogicalKind.POINT: ("struct", "io.debezium.data.geometry.Point"),
    LogicalKind.ARRAY: ("array", None),
}
_KINDS: Final[Mapping[tuple[str, str | None], LogicalKind]] = {form: kind for kind, form in _CONNECT.items()}
_SCALE, _PRECISION = "scale", "connect.decimal.precision"


class UnknownLogicalTypeError(ValueError):
    """A schema names a type this version of Headwater cannot read (written by a newer one, or damaged)."""


def connect_schema(logical: LogicalType) -> dict[str, Any]:
    """``logical`` in Debezium's schema vocabulary: ``{"type", "name"?, "parameters"?, "items"?}``."""
    literal, name = _CONNECT[logical.kind]
    schema: dict[str, Any] = {"type": literal}
    if name is not None:
        schema["name"] = name
    parameters = {}
    if logical.scale is not None:
        parameters[_SCALE] = str(logical.scale)
    if logical.precision is not None:
        parameters[_PRECISION] = str(logical.precision)
    if parameters:
        schema["parameters"] = parameters
    if logical.kind is LogicalKind.ARRAY and logical.element is not None:
        schema["items"] = connect_schema(logical.element)
    return schema


def from_connect_schema(schema: Mapping[str, Any]) -> LogicalType:
    """Inverse of :func:`connect_schema` (an unknown form raises :class:`UnknownLogicalTypeError`)."""
    kind = _KINDS.get((str(schema.get("type")), schema.get("name")))
    if kind is None:
        msg = f"unknown logical type {dict(schema)!r}"
        raise UnknownLogicalTypeError(msg)
    parameters = schema.get("parameters") or {}
    scale = int(parameters[_SCALE]) if _SCALE in parameters else None
    precision = int(parameters[_PRECISION]) if _PRECISION in parameters else None
    element = from_connect_schema(schema["items"]) if kind is LogicalKind.ARRAY and "items" in schema else None
    return LogicalType(kind, precision, scale, element)
