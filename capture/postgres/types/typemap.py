"""The type map: which converter turns a column's text values into the JSON values of its logical type.

:func:`log.pg_types.logical_type` decides what a column's values decode back to (the log's
contract); :func:`column_converter` picks the converter (:mod:`capture.postgres.types.converters`,
:mod:`capture.postgres.types.temporal`) that writes them so. Input is what pgoutput and COPY send in text
mode, printed by a session pinned to ``TimeZone=UTC, DateStyle=ISO, IntervalStyle=postgres,
extra_float_digits=3, bytea_output=hex, lc_monetary=C`` (:func:`capture.postgres.streaming.connection.pinned_options`).
Output follows the Debezium PostgreSQL connector's "Data type mappings" for each mode of
:class:`core.config.TypesConfig`, as the Kafka JSON converter would print it. Converters are
picked once per (type oid, typmod, modes) — once per Relation message — so decoding a row is
one function call per column.

Decisions where Debezium's table is silent or JSON cannot carry the value
(each repeated where it is implemented):

* real/double NaN and +-Infinity -> the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``:
  what the Kafka JSON converter (Jackson, ``QUOTE_NON_NUMERIC_NUMBERS`` on by default)
  prints for Java's ``Double.NaN``/infinities. JSON has no NaN; orjson would print null.
* numeric NaN: the doc says "the connector encodes NaN as either Double.NaN or the string
  constant NAN" (``double`` / ``string`` modes). ``precise`` cannot represent it: Debezium 3.6.3
  logs "Got a special value (NaN/Infinity) for Decimal type ... set decimal handling mode to
  'string'" and writes the column as null (seen in the conformance suite); we raise
  :class:`UnrepresentableValueError` so the agent quarantines the record instead.
* timestamp +-infinity: the doc says "converted to timestamps with value
  9223372036825200000 in case of positive infinity or -9223372036832400000 in case of
  negative infinity" (pgjdbc's ``PGStatement.DATE_POSITIVE_INFINITY``): microsecond
  precisions print them, millisecond precisions print them divided by 1000, as Debezium 3.6.3
  does (tests/integration/capture/test_debezium_conformance.py compares). timestamptz
  +-infinity -> ``"infinity"``/``"-infinity"`` (Debezium's ``PostgresValueConverter`` passes
  those strings through). date +-infinity is not
  documented; ``io.debezium.time.Date`` is INT32, so we use 2147483647 / -2147483648.
* interval: ``io.debezium.time.MicroDuration`` (interval.handling.mode=numeric, the
  default): "the approximate number of microseconds ... using the 365.25 / 12.0 formula
  for days per month average"; computed exactly in integers (one month = 2629800 s).
* money: a decimal with ``money.fraction.digits`` = 2 (Debezium's default) in every mode;
  ``string`` mode prints it plain with two decimals (``"-0.01"``).
* numeric in ``string`` mode: PostgreSQL's own plain text (Java's ``BigDecimal.toString``
  would switch to E-notation below 1e-6; the plain form is what SQL and Spark parse).
* types Debezium does not map (composite, tsquery, interval[] ...): their text, as strings.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from capture.errors import TypeMappingError
from capture.postgres.types import converters, temporal
from capture.postgres.types.converters import Converter
from core.source_config import TypesConfig
from log.pg_types import Oid, TypeNestingError, TypeRegistry, logical_type
from log.row_types import LogicalKind, LogicalType

#: Types with one converter whatever the modes and typmod.
_BY_OID: Final[Mapping[int, Converter]] = {
    Oid.BOOL: converters.boolean,
    Oid.INT2: int,
    Oid.INT4: int,
    Oid.INT8: int,
    Oid.OID: int,
    Oid.FLOAT4: converters.float_or_special,
    Oid.FLOAT8: converters.float_or_special,
    Oid.JSON: converters.identity,
    Oid.JSONB: converters.identity,
    Oid.UUID: converters.identity,
    Oid.POINT: converters.point,
    Oid.INTERVAL: temporal.interval_micros,
    Oid.DATE: temporal.date_days,
    Oid.TIMETZ: temporal.timetz_utc,
}
#: Every other type's converter follows from its logical kind alone.
_BY_KIND: Final[Mapping[LogicalKind, Converter]] = {
    LogicalKind.STRING: converters.identity,
    LogicalKind.ENUM: converters.identity,
    LogicalKind.JSON: converters.hstore,  # json and jsonb are in _BY_OID: hstore is the other JSON type
    LogicalKind.BYTES_HEX: converters.bytea_hex,
    LogicalKind.BYTES_BASE64: converters.bytea_base64,
    LogicalKind.BOOLEAN: converters.boolean_bit,  # bool is in _BY_OID: bit(1) is the other BOOLEAN type
    LogicalKind.BITS: converters.bits_base64,
    LogicalKind.TIME_MS: temporal.time_millis,
    LogicalKind.TIME_US: temporal.time_micros,
    LogicalKind.TIMESTAMP_MS: temporal.timestamp_millis,
    LogicalKind.TIMESTAMP_US: temporal.timestamp_micros,
}


def column_converter(
    type_oid: int, typmod: int, modes: TypesConfig, registry: TypeRegistry | None = None
) -> tuple[Converter, LogicalType]:
    """The converter and logical type of one column; build once per Relation, call once per value."""
    registry = registry if registry is not None else TypeRegistry()
    try:
        logical = logical_type(type_oid, typmod, modes, registry)
    except TypeNestingError as exc:
        raise TypeMappingError(str(exc), type_oid=exc.type_oid) from None
    return _converter(type_oid, typmod, logical, registry), logical


def _converter(type_oid: int, typmod: int, logical: LogicalType, registry: TypeRegistry) -> Converter:
    type_oid, typmod = registry.resolve_domain(type_oid, typmod)
    if logical.kind is LogicalKind.ARRAY and logical.element is not None:
        element = _converter(registry.element_oid(type_oid), typmod, logical.element, registry)
        return converters.array_converter(element)
    fixed = _BY_OID.get(type_oid)
    if fixed is not None:
        return fixed
    if type_oid == Oid.NUMERIC:
        return converters.decimal_converter(logical)
    if type_oid == Oid.MONEY:
        return converters.money_converter(logical)
    if type_oid == Oid.TIMESTAMPTZ:
        return temporal.timestamptz_converter(typmod)
    return _BY_KIND[logical.kind]


# Native kinds of native/_speedups.c (K_*): converters the extension reproduces for the
# common text forms; any other value of such a column, and every other converter, runs in Python.
NATIVE_PYTHON: Final = 0
_NATIVE_KINDS: Final[Mapping[Converter, int]] = {
    int: 1,
    converters.identity: 2,
    converters.boolean: 3,
    converters.decimal_string: 4,
    temporal.timestamp_micros: 5,
    temporal.timestamp_millis: 6,
    temporal.date_days: 8,
    converters.bytea_base64: 9,
    converters.bytea_hex: 10,
}
_NATIVE_TIMESTAMPTZ: Final = 7


def native_kind(converter: Converter) -> tuple[int, int]:
    """The extension's kind and parameter for ``converter`` (``NATIVE_PYTHON``: call it)."""
    kind = _NATIVE_KINDS.get(converter)
    if kind is not None:
        return kind, 0
    for width, known in temporal.TIMESTAMPTZ_BY_WIDTH.items():
        if known is converter:
            return _NATIVE_TIMESTAMPTZ, width
    return NATIVE_PYTHON, 0
