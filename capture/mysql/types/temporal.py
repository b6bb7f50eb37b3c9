"""MySQL temporal values: the binlog's packed formats, and Debezium's numbers and strings for them.

Binlog formats (MySQL 5.6+ "2" types, MariaDB's default ``mysql56_temporal_format``):
DATE 3 bytes little-endian (day 5 bits, month 4, year 15); DATETIME2 5 bytes big-endian
(offset 2^39: year*13+month 17 bits, day 5, hour 5, minute 6, second 6) plus 0-3 bytes of
fraction; TIMESTAMP2 4 bytes big-endian seconds since the epoch (UTC) plus the fraction;
TIME2 3 bytes big-endian offset 2^23 (hour 10 bits, minute 6, second 6) plus the fraction,
negative times in two's complement over integer part and fraction together.

A DATETIME is a wall-clock reading without a zone: Debezium writes it as if it were UTC. A
TIMESTAMP is an instant: the binlog holds it in UTC already, so the server's time zone never
enters streaming (the snapshot reads it in a UTC session for the same reason).
"""

from __future__ import annotations

import calendar
import datetime as dt

_DATETIMEF_INT_OFS = 0x8000000000
_TIMEF_INT_OFS = 0x800000
_TIMEF_OFS = 0x800000000000
_MICROS = 1_000_000
_EPOCH_ORDINAL = dt.date(1970, 1, 1).toordinal()


def fraction_bytes(fsp: int) -> int:
    """Bytes of a temporal value's fractional part for ``fsp`` digits."""
    return (fsp + 1) // 2


def read_fraction(data: bytes, pos: int, fsp: int) -> int:
    """The fractional part in microseconds."""
    size = (fsp + 1) // 2
    if not size:
        return 0
    value = int.from_bytes(data[pos : pos + size], "big")
    return value * (10_000 if size == 1 else 100 if size == 2 else 1)


def days_since_epoch(year: int, month: int, day: int) -> int | None:
    """Days from 1970-01-01, or None for a date with a zero or impossible part (``0000-00-00``)."""
    if year == 0 or month == 0 or day == 0:
        return None
    try:
        return dt.date(year, month, day).toordinal() - _EPOCH_ORDINAL
    except ValueError:
        return None


def unpack_date(data: bytes, pos: int) -> int | None:
    """A binlog DATE -> days since the epoch (None for zero dates)."""
    value = data[pos] | data[pos + 1] << 8 | data[pos + 2] << 16
    return days_since_epoch(value >> 9, (value >> 5) & 15, value & 31)


def micros_since_epoch(  # noqa: PLR0917 (a wall-clock reading's seven fields, in their natural order)
    year: int, month: int, day: int, hour: int, minute: int, second: int, micro: int
) -> int | None:
    """Microseconds from 1970-01-01 00:00 of a wall-clock reading taken as UTC (None for zero dates)."""
    days = days_since_epoch(year, month, day)
    if days is None:
        return None
    return ((days * 24 + hour) * 60 + minute) * 60 * _MICROS + second * _MICROS + micro


def unpack_datetime2(data: bytes, pos: int, fsp: int) -> int | None:
    """A binlog DATETIME2 -> microseconds since the epoch as if UTC (None for zero dates)."""
    packed = int.from_bytes(data[pos : pos + 5], "big") - _DATETIMEF_INT_OFS
    ymd = packed >> 17
    hms = packed & 0x1FFFF
    year_month = ymd >> 5
    return micros_since_epoch(
        year_month // 13,
        year_month % 13,
        ymd & 31,
        hms >> 12,
        (hms >> 6) & 63,
        hms & 63,
        read_fraction(data, pos + 5, fsp),
    )


def unpack_timestamp2(data: bytes, pos: int, fsp: int) -> int:
    """A binlog TIMESTAMP2 -> microseconds since the epoch (UTC); 0 is MySQL's zero timestamp."""
    return int.from_bytes(data[pos : pos + 4], "big") * _MICROS + read_fraction(data, pos + 4, fsp)


def unpack_time2(data: bytes, pos: int, fsp: int) -> int:
    """A binlog TIME2 -> signed microseconds (``-838:59:59`` .. ``838:59:59``)."""
    if fsp in (5, 6):
        packed = int.from_bytes(data[pos : pos + 6], "big") - _TIMEF_OFS
    else:
        integral = int.from_bytes(data[pos : pos + 3], "big") - _TIMEF_INT_OFS
        if fsp in (1, 2):
            frac = data[pos + 3]
            if integral < 0 and frac:
                integral += 1
                frac -= 0x100
            packed = (integral << 24) + frac * 10_000
        elif fsp in (3, 4):
            frac = int.from_bytes(data[pos + 3 : pos + 5], "big")
            if integral < 0 and frac:
                integral += 1
                frac -= 0x10000
            packed = (integral << 24) + frac * 100
        else:
            packed = integral << 24
    sign = -1 if packed < 0 else 1
    packed = abs(packed)
    hms = packed >> 24
    micro = packed & 0xFFFFFF
    return sign * ((((hms >> 12) & 0x3FF) * 3600 + ((hms >> 6) & 63) * 60 + (hms & 63)) * _MICROS + micro)


_EPOCH = dt.datetime(1970, 1, 1)  # noqa: DTZ001 (naive on purpose: only its UTC reading is formatted)


def zoned_timestamp(micros: int, fsp: int) -> str:
    """Debezium's ``ZonedTimestamp`` text of an instant: ISO-8601 in UTC with the column's fractional digits."""
    seconds, micro = divmod(micros, _MICROS)
    text = (_EPOCH + dt.timedelta(seconds=seconds)).isoformat(timespec="seconds")
    if fsp:
        return f"{text}.{micro:06d}"[: 20 + fsp] + "Z"
    return text + "Z"


def utc_micros(value: dt.datetime) -> int:
    """An aware or UTC-naive datetime -> microseconds since the epoch."""
    if value.tzinfo is not None:
        value = value.astimezone(dt.UTC).replace(tzinfo=None)
    return calendar.timegm(value.timetuple()) * _MICROS + value.microsecond
