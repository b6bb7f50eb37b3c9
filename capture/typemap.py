"""Text-format column values -> Debezium JSON values, and the logical type each one decodes back to.

Input is what pgoutput sends in text mode, printed by a session pinned to
``TimeZone=UTC, DateStyle=ISO, IntervalStyle=postgres, extra_float_digits=3,
bytea_output=hex, lc_monetary=C`` (DESIGN section 8). Output follows the Debezium
PostgreSQL connector's "Data type mappings" (documentation/.../connectors/postgresql.adoc)
for each mode of :class:`core.config.TypesConfig`, as the Kafka JSON converter
would print it. Converters are built once per (type oid, typmod, modes) — once per
Relation message — so decoding a row is one function call per column.

Decisions where Debezium's table is silent or JSON cannot carry the value
(each repeated where it is implemented):

* real/double NaN and +-Infinity -> the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``:
  what the Kafka JSON converter (Jackson, ``QUOTE_NON_NUMERIC_NUMBERS`` on by default)
  prints for Java's ``Double.NaN``/infinities. JSON has no NaN; orjson would print null.
* numeric NaN: the doc says "the connector encodes NaN as either Double.NaN or the string
  constant NAN" (``double`` / ``string`` modes). ``precise`` cannot represent it: Debezium
  fails the record ("Got a special value (NaN/Infinity) for Decimal type ... set decimal
  handling mode to 'string'"); we raise :class:`UnrepresentableValueError` so the agent
  quarantines the record instead of dropping it.
* timestamp +-infinity: the doc says "converted to timestamps with value
  9223372036825200000 in case of positive infinity or -9223372036832400000 in case of
  negative infinity" (pgjdbc's ``PGStatement.DATE_POSITIVE_INFINITY``); we use these in
  every precision. timestamptz +-infinity -> ``"infinity"``/``"-infinity"`` (Debezium's
  ``PostgresValueConverter`` passes those strings through). date +-infinity is not
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

import base64
import enum
import re
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any, Final, Protocol

import orjson

import native
from capture.pgoutput import UNCHANGED_TOAST, NonUtf8Text, TupleValue
from capture.type_registry import TypeKind, TypeRegistry
from core.config import TypesConfig
from core.errors import PermanentError

if TYPE_CHECKING:
    from native._speedups import RowEncoder

#: A converter: one column's text value -> its JSON value. Never receives NULL.
Converter = Callable[[str], Any]


class TypeMappingError(PermanentError):
    """A column value could not be converted; the record belongs in quarantine, not in the log."""

    def __init__(self, message: str, *, column: str | None = None, type_oid: int | None = None) -> None:
        where = f"column {column!r}: " if column else ""
        super().__init__(f"{where}{message}")
        self.column = column
        self.type_oid = type_oid


class UnrepresentableValueError(TypeMappingError):
    """The value exists in PostgreSQL but the configured mode cannot express it (NaN in ``precise``)."""


class Oid(enum.IntEnum):
    """Built-in type oids (PostgreSQL ``pg_type.dat``)."""

    BOOL = 16
    BYTEA = 17
    CHAR = 18
    NAME = 19
    INT8 = 20
    INT2 = 21
    INT4 = 23
    TEXT = 25
    OID = 26
    JSON = 114
    XML = 142
    POINT = 600
    CIDR = 650
    FLOAT4 = 700
    FLOAT8 = 701
    MACADDR8 = 774
    MONEY = 790
    MACADDR = 829
    INET = 869
    BPCHAR = 1042
    VARCHAR = 1043
    DATE = 1082
    TIME = 1083
    TIMESTAMP = 1114
    TIMESTAMPTZ = 1184
    INTERVAL = 1186
    TIMETZ = 1266
    BIT = 1560
    VARBIT = 1562
    NUMERIC = 1700
    UUID = 2950
    TSVECTOR = 3614
    JSONB = 3802
    INT4RANGE = 3904
    NUMRANGE = 3906
    TSRANGE = 3908
    TSTZRANGE = 3910
    DATERANGE = 3912
    INT8RANGE = 3926


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


# ---------------------------------------------------------------------------------------------
# Constants from the Debezium documentation (quoted in the module docstring).

TIMESTAMP_POSITIVE_INFINITY: Final = 9223372036825200000
TIMESTAMP_NEGATIVE_INFINITY: Final = -9223372036832400000
DATE_POSITIVE_INFINITY: Final = 2**31 - 1
DATE_NEGATIVE_INFINITY: Final = -(2**31)
MONEY_FRACTION_DIGITS: Final = 2
_MICROS_PER_DAY: Final = 86_400_000_000
_MICROS_PER_MONTH: Final = 2_629_800_000_000  # 365.25 / 12 days
_FLOAT_SPECIAL: Final = {"NaN": "NaN", "Infinity": "Infinity", "-Infinity": "-Infinity"}
# Debezium's SpecialValueDecimal.toString() prints the enum constant's name.
_NUMERIC_SPECIAL_STRING: Final = {"NaN": "NAN", "Infinity": "POSITIVE_INFINITY", "-Infinity": "NEGATIVE_INFINITY"}

_STRING_OIDS: Final = frozenset(
    {
        Oid.TEXT,
        Oid.VARCHAR,
        Oid.BPCHAR,
        Oid.CHAR,
        Oid.NAME,
        Oid.XML,
        Oid.CIDR,
        Oid.INET,
        Oid.MACADDR,
        Oid.MACADDR8,
        Oid.TSVECTOR,
        Oid.INT4RANGE,
        Oid.INT8RANGE,
        Oid.NUMRANGE,
        Oid.TSRANGE,
        Oid.TSTZRANGE,
        Oid.DATERANGE,
    }
)


# ---------------------------------------------------------------------------------------------
# Calendar arithmetic without datetime: PostgreSQL dates span 4713 BC .. 5874897 AD.


def _days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (astronomical year: 1 BC = 0)."""
    year -= month <= 2
    era = year // 400
    yoe = year - era * 400
    doy = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    return era * 146097 + yoe * 365 + yoe // 4 - yoe // 100 + doy - 719468


def _civil_from_days(days: int) -> tuple[int, int, int]:
    days += 719468
    era = days // 146097
    doe = days - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day = doy - (153 * mp + 2) // 5 + 1
    month = mp + 3 if mp < 10 else mp - 9
    return yoe + era * 400 + (month <= 2), month, day


def _parse_date(text: str) -> int:
    """``YYYY-MM-DD[ BC]`` -> days since epoch."""
    bc = text.endswith(" BC")
    if bc:
        text = text[:-3]
    year_text, month_text, day_text = text.split("-")
    year = int(year_text)
    if bc:
        year = 1 - year
    return _days_from_civil(year, int(month_text), int(day_text))


def _parse_time_us(text: str) -> int:
    """``HH:MM:SS[.ffffff]`` -> microseconds past midnight (``24:00:00`` allowed)."""
    hours, minutes, seconds = text.split(":")
    whole, _, fraction = seconds.partition(".")
    micros = int(fraction.ljust(6, "0")) if fraction else 0
    return ((int(hours) * 60 + int(minutes)) * 60 + int(whole)) * 1_000_000 + micros


def _split_offset(text: str) -> tuple[str, int]:
    """Split ``...+HH[:MM[:SS]]`` into the rest and the offset in seconds."""
    for index in range(len(text) - 1, 0, -1):
        char = text[index]
        if char in "+-":
            sign = -1 if char == "-" else 1
            parts = text[index + 1 :].split(":")
            seconds = int(parts[0]) * 3600
            if len(parts) > 1:
                seconds += int(parts[1]) * 60
            if len(parts) > 2:
                seconds += int(parts[2])
            return text[:index], sign * seconds
    msg = f"no UTC offset in {text!r}"
    raise ValueError(msg)


def _parse_timestamp_us(text: str) -> int:
    """``YYYY-MM-DD HH:MM:SS[.ffffff][ BC]`` (no offset) -> microseconds since epoch."""
    if len(text) >= 19 and text[10] == " " and text[4] == "-" and text[-1].isdigit():
        # The common form (AD, four-digit year), sliced by position: one call per captured value.
        fraction = text[20:26]
        micros = int(fraction.ljust(6, "0")) if fraction else 0
        days = _days_from_civil(int(text[0:4]), int(text[5:7]), int(text[8:10]))
        seconds = (int(text[11:13]) * 60 + int(text[14:16])) * 60 + int(text[17:19])
        return days * _MICROS_PER_DAY + seconds * 1_000_000 + micros
    bc = text.endswith(" BC")
    if bc:
        text = text[:-3]
    date_text, _, time_text = text.partition(" ")
    year_text, month_text, day_text = date_text.split("-")
    year = int(year_text)
    if bc:
        year = 1 - year
    return _days_from_civil(year, int(month_text), int(day_text)) * _MICROS_PER_DAY + _parse_time_us(time_text)


def _format_fraction(micros: int, width: int | None) -> str:
    """Java ``DateTimeFormatter`` fractions: exactly ``width`` digits, or (``None``) as few as needed, none for 0."""
    if width is None:
        return f".{micros:06d}".rstrip("0") if micros else ""
    if width == 0:
        return ""
    return "." + f"{micros:06d}"[:width].ljust(width, "0")


def _format_year(year: int) -> str:
    """ISO-8601 years as java.time prints them: 4 digits, '+' beyond 9999, '-' before year 0."""
    if 0 <= year <= 9999:
        return f"{year:04d}"
    return f"+{year}" if year > 0 else f"-{-year:04d}"


def _format_utc(micros: int, width: int | None) -> str:
    days, in_day = divmod(micros, _MICROS_PER_DAY)
    year, month, day = _civil_from_days(days)
    seconds, fraction = divmod(in_day, 1_000_000)
    minutes, second = divmod(seconds, 60)
    hour, minute = divmod(minutes, 60)
    return (
        f"{_format_year(year)}-{month:02d}-{day:02d}T{hour:02d}:{minute:02d}:{second:02d}"
        f"{_format_fraction(fraction, width)}Z"
    )


# ---------------------------------------------------------------------------------------------
# Scalar converters.


def _identity(text: str) -> str:
    return text


def _boolean(text: str) -> bool:
    return text == "t"


def _float(text: str) -> float | str:
    # JSON has no NaN/Infinity; these strings are what Debezium's JSON converter prints.
    special = _FLOAT_SPECIAL.get(text)
    return special if special is not None else float(text)


def _bit_converter(typmod: int) -> tuple[Converter, LogicalType]:
    # "BIT(1) -> BOOLEAN"; "BIT( > 1), BIT VARYING[(M)] -> BYTES io.debezium.data.Bits ... the bits in
    # little-endian form ... sized based on the content" (bit i = character len-1-i).
    if typmod == 1:
        return _boolean_bit, LogicalType(LogicalKind.BOOLEAN)
    return _bits_base64, LogicalType(LogicalKind.BITS)


def _boolean_bit(text: str) -> bool:
    return text == "1"


def _bits_base64(text: str) -> str:
    value = int(text, 2) if text else 0
    return base64.b64encode(value.to_bytes((value.bit_length() + 7) // 8, "little")).decode()


def _bytea_base64(text: str) -> str:
    return base64.b64encode(bytes.fromhex(text[2:])).decode()


def _bytea_hex(text: str) -> str:
    # bytea_output=hex prints lowercase hex after "\x": already the hex mode's value.
    return text[2:]


def _point(text: str) -> dict[str, Any]:
    # "POINT -> STRUCT io.debezium.data.geometry.Point ... two FLOAT64 fields, (x,y)"; Debezium also
    # fills `wkb` (little-endian WKB Point) and leaves `srid` null.
    x_text, y_text = text.strip("()").split(",")
    x, y = float(x_text), float(y_text)
    wkb = struct.pack("<BIdd", 1, 1, x, y)
    return {"x": x, "y": y, "wkb": base64.b64encode(wkb).decode(), "srid": None}


_INTERVAL_PART = re.compile(
    r"(?P<number>[+-]?\d+) (?P<unit>years?|mons?|days?)"
    r"|(?P<sign>[+-])?(?P<h>\d+):(?P<m>\d+):(?P<s>\d+)(?:\.(?P<f>\d+))?"
)


def _interval_us(text: str) -> int:
    """IntervalStyle=postgres text (``1 year 2 mons -3 days +04:05:06.5``) -> microseconds."""
    total = 0
    for match in _INTERVAL_PART.finditer(text):
        unit = match.group("unit")
        if unit is not None:
            number = int(match.group("number"))
            if unit.startswith("year"):
                total += number * 12 * _MICROS_PER_MONTH
            elif unit.startswith("mon"):
                total += number * _MICROS_PER_MONTH
            else:
                total += number * _MICROS_PER_DAY
        else:
            fraction = match.group("f") or ""
            micros = ((int(match.group("h")) * 60 + int(match.group("m"))) * 60 + int(match.group("s"))) * 1_000_000 + (
                int(fraction[:6].ljust(6, "0")) if fraction else 0
            )
            total += -micros if match.group("sign") == "-" else micros
    return total


def _date(text: str) -> int:
    if text == "infinity":
        return DATE_POSITIVE_INFINITY
    if text == "-infinity":
        return DATE_NEGATIVE_INFINITY
    return _parse_date(text)


def _time_micros(text: str) -> int:
    return _parse_time_us(text)


def _time_millis(text: str) -> int:
    return _parse_time_us(text) // 1000


def _timestamp_micros(text: str) -> int:
    if text == "infinity":
        return TIMESTAMP_POSITIVE_INFINITY
    if text == "-infinity":
        return TIMESTAMP_NEGATIVE_INFINITY
    return _parse_timestamp_us(text)


def _timestamp_millis(text: str) -> int:
    if text == "infinity":
        return TIMESTAMP_POSITIVE_INFINITY
    if text == "-infinity":
        return TIMESTAMP_NEGATIVE_INFINITY
    return _parse_timestamp_us(text) // 1000


def _timestamptz_converter(typmod: int) -> Converter:
    # io.debezium.time.ZonedTimestamp: ISO_OFFSET_DATE_TIME in UTC ("Z"), the fraction padded to the
    # column's precision (unconstrained timestamptz has precision 6); precision 0 prints no fraction.
    width = 6 if typmod < 0 else typmod
    converter = _TIMESTAMPTZ_BY_WIDTH.get(width)
    if converter is None:
        converter = _TIMESTAMPTZ_BY_WIDTH[width] = _timestamptz_of_width(width)
    return converter


#: One converter per fraction width (0..6), so the native encoder knows them by identity.
_TIMESTAMPTZ_BY_WIDTH: dict[int, Converter] = {}


def _timestamptz_of_width(width: int) -> Converter:

    def convert(text: str) -> str:
        if text[-3:] == "+00" and text[10:11] == " " and text[4:5] == "-":
            # Already UTC (capture sessions pin TimeZone=UTC), AD, four-digit year: only the
            # separator, the fraction's width and the zone designator differ.
            fraction = text[20:-3]
            tail = "." + fraction.ljust(6, "0")[:width] if width else ""
            return f"{text[:10]}T{text[11:19]}{tail}Z"
        if text in ("infinity", "-infinity"):
            return text
        era = ""
        if text.endswith(" BC"):  # the era follows the offset: "0044-03-15 12:00:00+00 BC"
            text, era = text[:-3], " BC"
        rest, offset = _split_offset(text)
        return _format_utc(_parse_timestamp_us(rest + era) - offset * 1_000_000, width)

    return convert


def _timetz(text: str) -> str:
    # io.debezium.time.ZonedTime: ISO_OFFSET_TIME after shifting to UTC; fraction as short as possible.
    rest, offset = _split_offset(text)
    micros = (_parse_time_us(rest) - offset * 1_000_000) % _MICROS_PER_DAY
    seconds, fraction = divmod(micros, 1_000_000)
    minutes, second = divmod(seconds, 60)
    hour, minute = divmod(minutes, 60)
    return f"{hour:02d}:{minute:02d}:{second:02d}{_format_fraction(fraction, None)}Z"


def _hstore(text: str) -> str:
    # hstore.handling.mode=json (default): "io.debezium.data.Json ... {"key" : "val"}".
    return orjson.dumps(_parse_hstore(text)).decode()


_HSTORE_TOKEN = re.compile(r'"((?:[^"\\]|\\.)*)"|(NULL)')


def _parse_hstore(text: str) -> dict[str, str | None]:
    tokens = [None if null else re.sub(r"\\(.)", r"\1", quoted) for quoted, null in _HSTORE_TOKEN.findall(text)]
    result: dict[str, str | None] = {}
    for index in range(0, len(tokens) - 1, 2):
        result[str(tokens[index])] = tokens[index + 1]
    return result


# ---------------------------------------------------------------------------------------------
# Decimals.


def _unscaled_base64(unscaled: int) -> str:
    """Kafka Connect ``Decimal`` bytes: ``BigInteger.toByteArray()`` (minimal big-endian two's complement)."""
    length = (unscaled + (unscaled < 0)).bit_length() // 8 + 1
    return base64.b64encode(unscaled.to_bytes(length, "big", signed=True)).decode()


def _numeric_typmod(typmod: int) -> tuple[int, int] | None:
    if typmod < 4:
        return None
    packed = typmod - 4
    scale = packed & 0x7FF
    if scale & 0x400:  # PostgreSQL 15 allows negative scales (11-bit two's complement)
        scale -= 0x800
    return (packed >> 16) & 0xFFFF, scale


def _decimal_string(text: str) -> str:
    special = _NUMERIC_SPECIAL_STRING.get(text)
    return special if special is not None else text


def _special_decimal(text: str) -> bool:
    return text in _NUMERIC_SPECIAL_STRING


def _decimal_converter(
    mode: str, typmod_pair: tuple[int, int] | None, fixed_scale: int | None = None
) -> tuple[Converter, LogicalType]:
    precision, scale = typmod_pair if typmod_pair is not None else (None, fixed_scale)
    if mode == "string":
        return _decimal_string, LogicalType(LogicalKind.DECIMAL, precision, scale)
    if mode == "double":

        def to_double(text: str) -> float | str:
            special = _FLOAT_SPECIAL.get(text)
            return special if special is not None else float(text)

        return to_double, LogicalType(LogicalKind.DOUBLE)

    if scale is not None:
        column_scale = scale

        def to_fixed(text: str) -> str:
            if _special_decimal(text):
                raise UnrepresentableValueError(_PRECISE_SPECIAL.format(text))
            quantum = Decimal(1).scaleb(-column_scale)
            unscaled = int(Decimal(text).quantize(quantum).scaleb(column_scale))
            return _unscaled_base64(unscaled)

        return to_fixed, LogicalType(LogicalKind.DECIMAL_BASE64, precision, scale)

    def to_variable(text: str) -> dict[str, Any]:
        # "io.debezium.data.VariableScaleDecimal ... `scale` ... and `value` ... in an unscaled form";
        # Debezium strips trailing zeros first and never uses a negative scale.
        if _special_decimal(text):
            raise UnrepresentableValueError(_PRECISE_SPECIAL.format(text))
        value = Decimal(text).normalize()
        exponent = value.as_tuple().exponent
        value_scale = max(0, -exponent) if isinstance(exponent, int) else 0
        unscaled = int(value.scaleb(value_scale))
        return {"scale": value_scale, "value": _unscaled_base64(unscaled)}

    return to_variable, LogicalType(LogicalKind.DECIMAL_VARIABLE)


_PRECISE_SPECIAL: Final = (
    "numeric value {} cannot be expressed with decimal_handling_mode 'precise' "
    "(Debezium fails such records too); set decimal_handling_mode to 'string' or 'double'"
)


def _money_converter(mode: str) -> tuple[Converter, LogicalType]:
    # "MONEY[(M[,D])] ... The `scale` schema parameter is determined by the money.fraction.digits"
    # (default 2). lc_monetary=C prints "$1,234.56" and "-$0.01".
    def parse(text: str) -> Decimal:
        negative = text.startswith("-") or text.startswith("(")
        digits = "".join(char for char in text if char.isdigit() or char == ".")
        try:
            value = Decimal(digits).quantize(Decimal("0.01"))
        except InvalidOperation as exc:
            msg = f"cannot parse money value {text!r}; pin lc_monetary=C on the replication session"
            raise TypeMappingError(msg, type_oid=Oid.MONEY) from exc
        return -value if negative else value

    if mode == "string":
        return (lambda text: str(parse(text))), LogicalType(LogicalKind.DECIMAL, None, MONEY_FRACTION_DIGITS)
    if mode == "double":
        return (lambda text: float(parse(text))), LogicalType(LogicalKind.DOUBLE)
    return (
        lambda text: _unscaled_base64(int(parse(text).scaleb(MONEY_FRACTION_DIGITS))),
        LogicalType(LogicalKind.DECIMAL_BASE64, None, MONEY_FRACTION_DIGITS),
    )


# ---------------------------------------------------------------------------------------------
# Arrays.


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


def _array_converter(element: Converter) -> Converter:
    def convert_items(items: list[Any]) -> list[Any]:
        return [
            None if item is None else convert_items(item) if isinstance(item, list) else element(item) for item in items
        ]

    def convert(text: str) -> list[Any]:
        return convert_items(_parse_array(text))

    return convert


# ---------------------------------------------------------------------------------------------
# The per-column factory.

_SCALARS: Final[Mapping[int, tuple[Converter, LogicalType]]] = {
    Oid.BOOL: (_boolean, LogicalType(LogicalKind.BOOLEAN)),
    Oid.INT2: (int, LogicalType(LogicalKind.INT16)),
    Oid.INT4: (int, LogicalType(LogicalKind.INT32)),
    Oid.INT8: (int, LogicalType(LogicalKind.INT64)),
    Oid.OID: (int, LogicalType(LogicalKind.INT64)),
    Oid.FLOAT4: (_float, LogicalType(LogicalKind.FLOAT)),
    Oid.FLOAT8: (_float, LogicalType(LogicalKind.DOUBLE)),
    Oid.JSON: (_identity, LogicalType(LogicalKind.JSON)),
    Oid.JSONB: (_identity, LogicalType(LogicalKind.JSON)),
    Oid.UUID: (_identity, LogicalType(LogicalKind.UUID)),
    Oid.POINT: (_point, LogicalType(LogicalKind.POINT)),
    Oid.INTERVAL: (_interval_us, LogicalType(LogicalKind.INTERVAL_US)),
    Oid.DATE: (_date, LogicalType(LogicalKind.DATE)),
    Oid.TIMETZ: (_timetz, LogicalType(LogicalKind.TIMETZ_STRING)),
}
_STRING: Final = (_identity, LogicalType(LogicalKind.STRING))
# Extension types found by name (their oids differ per database), as Debezium's TypeRegistry does.
_STRING_EXTENSIONS: Final = frozenset({"citext", "ltree", "isbn", "isbn13", "ean13", "issn", "upc", "lquery"})


def column_converter(
    type_oid: int, typmod: int, modes: TypesConfig, registry: TypeRegistry | None = None
) -> tuple[Converter, LogicalType]:
    """The converter and logical type of one column; build once per Relation, call once per value."""
    registry = registry if registry is not None else TypeRegistry()
    return _column_converter(type_oid, typmod, modes, registry, depth=0)


def logical_type(type_oid: int, typmod: int, modes: TypesConfig, registry: TypeRegistry | None = None) -> LogicalType:
    """What the JSON value of such a column decodes back to (for Spark/Arrow readers)."""
    return column_converter(type_oid, typmod, modes, registry)[1]


def _column_converter(
    type_oid: int, typmod: int, modes: TypesConfig, registry: TypeRegistry, depth: int
) -> tuple[Converter, LogicalType]:
    if depth > 16:
        msg = f"type {type_oid} nests too deeply (a domain or array cycle?)"
        raise TypeMappingError(msg, type_oid=type_oid)
    type_oid, typmod = registry.resolve_domain(type_oid, typmod)
    scalar = _SCALARS.get(type_oid)
    if scalar is not None:
        return scalar
    if type_oid in _STRING_OIDS:
        return _STRING
    if type_oid == Oid.NUMERIC:
        return _decimal_converter(modes.decimal_handling_mode, _numeric_typmod(typmod))
    if type_oid == Oid.MONEY:
        return _money_converter(modes.decimal_handling_mode)
    if type_oid == Oid.BYTEA:
        if modes.binary_handling_mode == "hex":
            return _bytea_hex, LogicalType(LogicalKind.BYTES_HEX)
        return _bytea_base64, LogicalType(LogicalKind.BYTES_BASE64)
    if type_oid in (Oid.BIT, Oid.VARBIT):
        return _bit_converter(typmod)
    if type_oid in (Oid.TIME, Oid.TIMESTAMP):
        return _temporal_converter(type_oid, typmod, modes.time_precision_mode)
    if type_oid == Oid.TIMESTAMPTZ:
        return _timestamptz_converter(typmod), LogicalType(LogicalKind.TIMESTAMPTZ_STRING)

    element_oid = registry.element_oid(type_oid)
    if element_oid:
        element, element_type = _column_converter(element_oid, typmod, modes, registry, depth + 1)
        return _array_converter(element), LogicalType(LogicalKind.ARRAY, element=element_type)

    pg_type = registry.get(type_oid)
    if pg_type is not None:
        if pg_type.kind is TypeKind.ENUM:
            return _identity, LogicalType(LogicalKind.ENUM)
        if pg_type.name == "hstore":
            return _hstore, LogicalType(LogicalKind.JSON)
        if pg_type.name in _STRING_EXTENSIONS or pg_type.kind in (TypeKind.RANGE, TypeKind.MULTIRANGE):
            return _STRING
    # Unknown or unmapped (composite, tsquery, geometric types but point ...): the text, unchanged.
    return _STRING


def _temporal_converter(type_oid: int, typmod: int, mode: str) -> tuple[Converter, LogicalType]:
    # adaptive: "TIME(1), TIME(2), TIME(3) -> INT32 io.debezium.time.Time ... milliseconds past midnight";
    # "TIME(4..6) -> MicroTime"; "TIMESTAMP(1..3) -> io.debezium.time.Timestamp (milliseconds)";
    # "TIMESTAMP(4..6), TIMESTAMP -> MicroTimestamp". Precision 0 counts as <= 3 (JdbcValueConverters),
    # and an unconstrained TIME is precision 6, like TIMESTAMP. connect: always milliseconds.
    millis = mode == "connect" or 0 <= typmod <= 3
    if type_oid == Oid.TIME:
        if millis:
            return _time_millis, LogicalType(LogicalKind.TIME_MS)
        return _time_micros, LogicalType(LogicalKind.TIME_US)
    if millis:
        return _timestamp_millis, LogicalType(LogicalKind.TIMESTAMP_MS)
    return _timestamp_micros, LogicalType(LogicalKind.TIMESTAMP_US)


def _null_or_not_text(value: TupleValue) -> Any:
    if value is None:
        return None
    msg = "not a text value"  # unchanged TOAST or binary: RowConverter.convert handles both
    raise TypeError(msg)


# Native kinds of native/_speedups.c (K_*): converters the extension reproduces for the
# common text forms; any other value of such a column, and every other converter, runs in Python.
_NATIVE_PYTHON: Final = 0
_NATIVE_KINDS: Final[Mapping[Any, int]] = {
    int: 1,
    _identity: 2,
    _boolean: 3,
    _decimal_string: 4,
    _timestamp_micros: 5,
    _timestamp_millis: 6,
    _date: 8,
    _bytea_base64: 9,
    _bytea_hex: 10,
}
_NATIVE_TIMESTAMPTZ: Final = 7


def _native_kind(converter: Converter) -> tuple[int, int]:
    """The extension's kind and parameter for ``converter`` (``_NATIVE_PYTHON``: call it)."""
    kind = _NATIVE_KINDS.get(converter)
    if kind is not None:
        return kind, 0
    for width, known in _TIMESTAMPTZ_BY_WIDTH.items():
        if known is converter:
            return _NATIVE_TIMESTAMPTZ, width
    return _NATIVE_PYTHON, 0


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
        plan = [_native_kind(converter) for _, converter in self._plan]
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
    """A :data:`capture.events.RowDecoder` over a :class:`RowConverter` for text-mode tuples.

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
