"""Character sets: a server's collation ids -> the Python codec that decodes their bytes.

Row images carry a string column's bytes in its character set; the TABLE_MAP names the
column's collation by id. Ids differ between MySQL and MariaDB versions, so the map is read
from the server (``information_schema.COLLATIONS``) when capture connects. A character set
without an exact Python codec is refused in one line naming the column: decoding it some
other way would write wrong text.
"""

from __future__ import annotations

import codecs
import operator
from collections.abc import Callable, Iterable
from typing import Any

from core.errors import PermanentError

#: MySQL/MariaDB character set -> Python codec (``binary`` has none: its values are bytes).
_CODECS: dict[str, str] = {
    "utf8mb4": "utf-8",
    "utf8mb3": "utf-8",
    "utf8": "utf-8",
    "ascii": "ascii",
    "latin1": "cp1252",
    "latin2": "iso8859-2",
    "latin5": "iso8859-9",
    "latin7": "iso8859-13",
    "cp1250": "cp1250",
    "cp1251": "cp1251",
    "cp1256": "cp1256",
    "cp1257": "cp1257",
    "cp850": "cp850",
    "cp852": "cp852",
    "cp866": "cp866",
    "koi8r": "koi8-r",
    "koi8u": "koi8-u",
    "greek": "iso8859-7",
    "hebrew": "iso8859-8",
    "ucs2": "utf-16-be",
    "utf16": "utf-16-be",
    "utf16le": "utf-16-le",
    "utf32": "utf-32-be",
    "sjis": "shift_jis",
    "cp932": "cp932",
    "ujis": "euc_jp",
    "eucjpms": "euc_jp",
    "euckr": "euc_kr",
    "gb2312": "gb2312",
    "gbk": "gbk",
    "gb18030": "gb18030",
    "big5": "big5",
    "tis620": "tis-620",
    "macroman": "mac-roman",
    "macce": "mac-latin2",
}

#: MySQL's latin1 is cp1252 with the five bytes cp1252 leaves undefined mapped to C1 controls.
_LATIN1_GAPS = {0x81: "\x81", 0x8D: "\x8d", 0x8F: "\x8f", 0x90: "\x90", 0x9D: "\x9d"}


class CharsetError(PermanentError):
    """A column's character set has no exact decoder here."""


def _latin1(data: bytes) -> str:
    try:
        return data.decode("cp1252")
    except UnicodeDecodeError:
        return "".join(_LATIN1_GAPS.get(b) or bytes([b]).decode("cp1252") for b in data)


#: Bytes per character at most, of the character sets whose characters take more than one.
_MAX_BYTES = {
    "utf8mb4": 4, "utf8mb3": 3, "utf8": 3, "ucs2": 2, "utf16": 4, "utf16le": 4, "utf32": 4, "sjis": 2, "cp932": 2,
    "ujis": 3, "eucjpms": 3, "euckr": 2, "gb2312": 2, "gbk": 2, "gb18030": 4, "big5": 2,
}  # fmt: skip


class Charsets:
    """Collation id -> character set name (and collation name), as one server defines them."""

    def __init__(self, collations: Iterable[tuple[int, str] | tuple[int, str, str]]) -> None:
        # MariaDB lists some collations (UCA 14.0.0 aliases) without an id: the binlog never names those.
        self._charset = {int(row[0]): str(row[1]) for row in collations if row[0] is not None}
        self._collation = {int(row[0]): str(row[2]) for row in collations if row[0] is not None and len(row) > 2}

    def collation_name(self, collation: int | None) -> str:
        """The name of collation ``collation`` (``utf8mb4_bin`` ...; ``binary`` for 63, unknown: the charset's)."""
        if collation is None:
            return "utf8mb4_general_ci"
        return self._collation.get(collation) or f"{self.charset(collation)}_?"

    def max_bytes(self, collation: int | None) -> int:
        """Bytes one character of ``collation``'s character set takes at most."""
        return 4 if collation is None else _MAX_BYTES.get(self.charset(collation), 1)

    def charset(self, collation: int) -> str:
        """The character set of ``collation`` (``binary`` for 63)."""
        name = self._charset.get(collation)
        if name is None:
            msg = f"collation id {collation} is unknown to the server's information_schema.COLLATIONS"
            raise CharsetError(msg)
        return name

    def decoder(self, collation: int | None, where: str) -> Callable[[bytes], str]:
        """A function decoding one value of ``collation`` (utf8mb4 when the binlog gave none)."""
        name = "utf8mb4" if collation is None else self.charset(collation)
        if name == "latin1":
            return _latin1
        codec = _CODECS.get(name)
        if codec is None:
            msg = f"{where}: character set {name} has no exact decoder in Headwater; convert the column to utf8mb4"
            raise CharsetError(msg)
        codecs.lookup(codec)
        return operator.methodcaller("decode", codec)


def server_charsets(conn: Any) -> Charsets:
    """The collations of the server ``conn`` is connected to (``information_schema.COLLATIONS``)."""
    with conn.cursor() as cur:
        cur.execute("SELECT ID, CHARACTER_SET_NAME, COLLATION_NAME FROM information_schema.COLLATIONS")
        return Charsets(cur.fetchall())
