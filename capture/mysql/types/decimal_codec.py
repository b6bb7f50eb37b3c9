"""MySQL's binary DECIMAL format (``decimal2bin``) -> the value's plain text, and Debezium's forms of it.

A DECIMAL(p, s) is stored big-endian in groups of 9 digits (4 bytes), the leftover digits of
the integer and fraction parts in 1-4 bytes; the first bit is the sign (set: non-negative),
and a negative value has every bit inverted.
"""

from __future__ import annotations

import base64

_DIGITS_PER_GROUP = 9
_BYTES_FOR_DIGITS = (0, 1, 1, 2, 2, 3, 3, 4, 4, 4)


def decimal_size(precision: int, scale: int) -> int:
    """Bytes a DECIMAL(precision, scale) takes in a row image."""
    integral = precision - scale
    return (
        integral // _DIGITS_PER_GROUP * 4
        + _BYTES_FOR_DIGITS[integral % _DIGITS_PER_GROUP]
        + scale // _DIGITS_PER_GROUP * 4
        + _BYTES_FOR_DIGITS[scale % _DIGITS_PER_GROUP]
    )


def decode_decimal(data: bytes, precision: int, scale: int) -> str:
    """The plain text of a binary DECIMAL (``-12.50``; ``0.00`` for zero, never ``-0.00``)."""
    negative = not data[0] & 0x80
    raw = bytearray(data)
    raw[0] ^= 0x80
    if negative:
        raw = bytearray(b ^ 0xFF for b in raw)
    integral = precision - scale
    lead = _BYTES_FOR_DIGITS[integral % _DIGITS_PER_GROUP]
    pos = lead
    whole = int.from_bytes(raw[:lead], "big") if lead else 0
    for _ in range(integral // _DIGITS_PER_GROUP):
        whole = whole * 1_000_000_000 + int.from_bytes(raw[pos : pos + 4], "big")
        pos += 4
    fraction = ""
    for _ in range(scale // _DIGITS_PER_GROUP):
        fraction += f"{int.from_bytes(raw[pos : pos + 4], 'big'):09d}"
        pos += 4
    trail_digits = scale % _DIGITS_PER_GROUP
    if trail_digits:
        size = _BYTES_FOR_DIGITS[trail_digits]
        fraction += f"{int.from_bytes(raw[pos : pos + size], 'big'):0{trail_digits}d}"
    text = f"{whole}.{fraction}" if scale else str(whole)
    if negative and (whole or fraction.strip("0")):
        text = "-" + text
    return text


def precise_bytes(text: str) -> str:
    """Debezium's ``precise`` JSON: base64 of the unscaled value's two's-complement bytes (Java BigInteger)."""
    unscaled = int(text.replace(".", ""))
    length = (unscaled + (unscaled < 0)).bit_length() // 8 + 1
    return base64.b64encode(unscaled.to_bytes(length, "big", signed=True)).decode()
