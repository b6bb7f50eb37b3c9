r"""COPY text format: rows as text tuples, and the pieces the native snapshot pass encodes.

``COPY ... TO STDOUT`` in text format prints the same text pgoutput sends (one type map
decodes both): tab-separated fields, ``\N`` for NULL, backslash escapes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import overload

from capture.tuples import NonUtf8Text, TupleData

#: COPY text per piece of the native snapshot pass (~35k rows of a narrow table, ~18 MB of records
#: before compression): two pieces per COPY block, one per encoder thread; each piece is one append
#: (one fsync) per partition, so larger pieces mean fewer fsyncs.
PIECE_BYTES = 2 << 20


def is_utf8(data: bytes) -> bool:
    """Whether ``data`` is valid UTF-8 (COPY text of a SQL_ASCII database may not be)."""
    if data.isascii():
        return True
    try:
        data.decode()
    except UnicodeDecodeError:
        return False
    return True


_UNESCAPE = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\"}


def _unescape(field: str) -> str:
    # COPY text format: backslash escapes (octal/hex forms do not occur for valid UTF-8 text).
    out = []
    i = 0
    while i < len(field):
        char = field[i]
        if char == "\\" and i + 1 < len(field):
            out.append(_UNESCAPE.get(field[i + 1], field[i + 1]))
            i += 2
            continue
        out.append(char)
        i += 1
    return "".join(out)


def _copy_field(raw: bytes) -> str | bytes | None:
    if raw == b"\\N":
        return None
    text = raw.decode("utf-8", "surrogateescape")
    text = _unescape(text) if "\\" in text else text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return NonUtf8Text(text.encode("utf-8", "surrogateescape"))
    return text


def parse_copy_text(data: bytes) -> list[TupleData]:
    r"""Rows of COPY text format (complete lines only) as text tuples; ``\\N`` is NULL."""
    rows: list[TupleData] = []
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:  # not UTF-8 (SQL_ASCII database): such fields stay bytes, for quarantine
        return [tuple(_copy_field(f) for f in line.split(b"\t")) for line in data.split(b"\n") if line]
    for line in text.split("\n"):
        if not line:
            continue
        rows.append(tuple(None if f == "\\N" else (_unescape(f) if "\\" in f else f) for f in line.split("\t")))
    return rows


class CopyRows(Sequence[TupleData]):
    """Complete lines of COPY text as rows, parsed (:func:`parse_copy_text`) when first indexed.

    The event builder reads ``data`` itself where it can (native code), so most snapshot rows
    never become Python tuples.
    """

    __slots__ = ("_rows", "blank", "data", "pieces")

    def __init__(self, data: bytes, pieces: list[tuple[int, int, int]] | None = None, blank: bool = True) -> None:
        self.data = data
        self._rows: list[TupleData] | None = None
        #: :func:`copy_pieces` of ``data`` and whether a line is empty, when the reader knows them (native reads).
        self.pieces = pieces
        self.blank = blank

    def native_pieces(self) -> list[tuple[int, int, int]] | None:
        """The :func:`copy_pieces` of ``data`` when it can take the native pass (:func:`encodable`), else None."""
        if self.pieces is None:
            return copy_pieces(self.data) if encodable(self.data) else None
        return None if self.blank or not is_utf8(self.data) else self.pieces

    def _parsed(self) -> list[TupleData]:
        if self._rows is None:
            self._rows = parse_copy_text(self.data)
        return self._rows

    def __len__(self) -> int:
        data = self.data
        if self._rows is not None or data.startswith(b"\n") or b"\n\n" in data:
            return len(self._parsed())  # empty lines are no rows
        return data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)

    @overload
    def __getitem__(self, index: int) -> TupleData: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[TupleData]: ...
    def __getitem__(self, index: int | slice) -> TupleData | Sequence[TupleData]:
        return self._parsed()[index]


def encodable(data: bytes) -> bool:
    """Whether COPY text can go through the native pass (UTF-8 and without empty lines).

    The native pass is :func:`capture.postgres.snapshot.native_pass.encode_piece`. Not UTF-8 (a SQL_ASCII
    database) or empty lines (no row): :meth:`capture.postgres.events.builder.EventBuilder.snapshot_records`.
    """
    if data.startswith(b"\n") or b"\n\n" in data:
        return False
    return is_utf8(data)


def copy_pieces(data: bytes, target: int | None = None) -> list[tuple[int, int, int]]:
    """``(start, end, rows)`` of consecutive pieces of ``data`` (:func:`encodable`), cut after a newline."""
    target = target or PIECE_BYTES
    pieces = []
    start, size = 0, len(data)
    while start < size:
        end = size if start + target >= size else (data.find(b"\n", start + target - 1) + 1 or size)
        rows = data.count(b"\n", start, end) + (0 if data[end - 1] == 0x0A else 1)
        pieces.append((start, end, rows))
        start = end
    return pieces
