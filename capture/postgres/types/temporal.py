"""PostgreSQL date/time text -> Debezium's temporal JSON values, with calendar arithmetic of its own.

Input is what a capture session prints (``TimeZone=UTC, DateStyle=ISO, IntervalStyle=postgres``,
:func:`capture.postgres.streaming.connection.pinned_options`). No ``datetime``: PostgreSQL dates span 4713 BC .. 5874897
AD. The infinities follow the decisions in :mod:`capture.postgres.types.typemap`'s docstring.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Final

TIMESTAMP_POSITIVE_INFINITY: Final = 9223372036825200000
TIMESTAMP_NEGATIVE_INFINITY: Final = -9223372036832400000
DATE_POSITIVE_INFINITY: Final = 2**31 - 1
DATE_NEGATIVE_INFINITY: Final = -(2**31)
_MICROS_PER_DAY: Final = 86_400_000_000
_MICROS_PER_MONTH: Final = 2_629_800_000_000  # 365.25 / 12 days


# -- calendar arithmetic --------------------------------------------------------------------------


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


# -- converters -----------------------------------------------------------------------------------


def date_days(text: str) -> int:
    """``date`` -> days since 1970-01-01 (io.debezium.time.Date); +-infinity are the INT32 extremes."""
    if text == "infinity":
        return DATE_POSITIVE_INFINITY
    if text == "-infinity":
        return DATE_NEGATIVE_INFINITY
    return _parse_date(text)


def time_micros(text: str) -> int:
    """``time`` -> microseconds past midnight (io.debezium.time.MicroTime)."""
    return _parse_time_us(text)


def time_millis(text: str) -> int:
    """``time`` -> milliseconds past midnight (io.debezium.time.Time)."""
    return _parse_time_us(text) // 1000


def timestamp_micros(text: str) -> int:
    """``timestamp`` -> microseconds since epoch (io.debezium.time.MicroTimestamp)."""
    if text == "infinity":
        return TIMESTAMP_POSITIVE_INFINITY
    if text == "-infinity":
        return TIMESTAMP_NEGATIVE_INFINITY
    return _parse_timestamp_us(text)


def timestamp_millis(text: str) -> int:
    """``timestamp`` -> milliseconds since epoch (io.debezium.time.Timestamp).

    +-infinity are Debezium's constants in milliseconds (divided by 1000, as Debezium 3.6 prints them).
    """
    if text == "infinity":
        return TIMESTAMP_POSITIVE_INFINITY // 1000
    if text == "-infinity":
        return TIMESTAMP_NEGATIVE_INFINITY // 1000
    return _parse_timestamp_us(text) // 1000


def timestamptz_converter(typmod: int) -> Callable[[str], str]:
    """The ``timestamptz`` converter of a column's precision (one object per precision)."""
    # io.debezium.time.ZonedTimestamp: ISO_OFFSET_DATE_TIME in UTC ("Z"), the fraction padded to the
    # column's precision (unconstrained timestamptz has precision 6); precision 0 prints no fraction.
    width = 6 if typmod < 0 else typmod
    converter = TIMESTAMPTZ_BY_WIDTH.get(width)
    if converter is None:
        converter = TIMESTAMPTZ_BY_WIDTH[width] = _timestamptz_of_width(width)
    return converter


#: One converter per fraction width (0..6), so the native encoder knows them by identity.
TIMESTAMPTZ_BY_WIDTH: dict[int, Callable[[str], str]] = {}


def _timestamptz_of_width(width: int) -> Callable[[str], str]:
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


def timetz_utc(text: str) -> str:
    """``timetz`` -> ISO-8601 time in UTC (io.debezium.time.ZonedTime)."""
    # io.debezium.time.ZonedTime: ISO_OFFSET_TIME after shifting to UTC; fraction as short as possible.
    rest, offset = _split_offset(text)
    micros = (_parse_time_us(rest) - offset * 1_000_000) % _MICROS_PER_DAY
    seconds, fraction = divmod(micros, 1_000_000)
    minutes, second = divmod(seconds, 60)
    hour, minute = divmod(minutes, 60)
    return f"{hour:02d}:{minute:02d}:{second:02d}{_format_fraction(fraction, None)}Z"


_INTERVAL_PART = re.compile(
    r"(?P<number>[+-]?\d+) (?P<unit>years?|mons?|days?)"
    r"|(?P<sign>[+-])?(?P<h>\d+):(?P<m>\d+):(?P<s>\d+)(?:\.(?P<f>\d+))?"
)


def interval_micros(text: str) -> int:
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
