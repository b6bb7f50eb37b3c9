"""Change envelopes -> their columns, the images left as JSON text: the bulk read's envelope pass.

The bulk path (:mod:`spark_log.source_batches`) needs, of each value, ``op``, seven
``source`` fields and the two row images. Parsing the whole envelope with ``pyarrow.json``
spends most of its time on fields nobody reads; :func:`scan_envelopes` reads the values
once, returns ``op`` and the source fields as Arrow columns and the images as two streams
of JSON documents (one per value, ``{}`` where the image is null or absent), which
``pyarrow.json`` then parses with the images' typed schema only.

It takes a batch only when it reads every value exactly as the whole-envelope parse would:
each value one JSON object (RFC 8259, valid UTF-8, first byte ``{``, last byte ``}``),
unescaped keys, no field it reads given twice, ``op`` and the source strings unescaped
strings or null, the source numbers integers of at most 18 digits or null (``commit_lsn`` and
``txn_index`` not negative), ``source`` an
object or null, the images objects or null, and each value an envelope (``op``,
``before`` or ``after`` not null). Otherwise it answers ``None`` and the caller builds the
batch as before, which also raises as before. The extension (``native``) does it
in C; :func:`_scan_envelopes_python` is its twin and defines the result
(``tests/unit/spark_log/test_envelope_scanner.py``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Final, NamedTuple

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]  # no stubs

import native

_STRING_FIELDS: Final = ("op", "snapshot", "db", "schema", "table")
_INT_FIELDS: Final = ("commit_lsn", "txn_index", "ts_us")
_MAX_DEPTH: Final = 200
_SEQ_WIDTH: Final = 33


class ScannedEnvelopes(NamedTuple):
    """The columns of ``count`` envelopes; validity bitmaps are Arrow's (bit i: row i is not null).

    Strings: validity, int32 offsets, data. Integers: validity, int64 values (0 where null).
    Images: validity and the documents, one per row. ``seq``: the string
    ``Sequence(commit_lsn, txn_index).sortable()``, null unless both are present, in
    33-byte slots (a null row's slot holds zeros).
    """

    op_validity: bytes
    op_offsets: bytes
    op_data: bytes
    snapshot_validity: bytes
    snapshot_offsets: bytes
    snapshot_data: bytes
    db_validity: bytes
    db_offsets: bytes
    db_data: bytes
    schema_validity: bytes
    schema_offsets: bytes
    schema_data: bytes
    table_validity: bytes
    table_offsets: bytes
    table_data: bytes
    commit_lsn_validity: bytes
    commit_lsn: bytes
    txn_index_validity: bytes
    txn_index: bytes
    ts_us_validity: bytes
    ts_us: bytes
    before_validity: bytes
    before_documents: bytes
    after_validity: bytes
    after_documents: bytes
    seq_validity: bytes
    seq_offsets: bytes
    seq_data: bytes

    def string(self, name: str) -> pa.Array:
        """The string column ``name`` (one of op, snapshot, db, schema, table, seq)."""
        validity, offsets, data = (getattr(self, f"{name}{part}") for part in ("_validity", "_offsets", "_data"))
        count = len(offsets) // 4 - 1
        buffers = [pa.py_buffer(validity), pa.py_buffer(offsets), pa.py_buffer(data)]
        return pa.Array.from_buffers(pa.string(), count, buffers)

    def integer(self, name: str) -> pa.Array:
        """The int64 column ``name`` (one of commit_lsn, txn_index, ts_us)."""
        values = getattr(self, name)
        buffers = [pa.py_buffer(getattr(self, f"{name}_validity")), pa.py_buffer(values)]
        return pa.Array.from_buffers(pa.int64(), len(values) // 8, buffers)

    def image_validity(self, side: str) -> pa.Array:
        """Boolean array: the ``side`` (before/after) image of each row is present."""
        validity = getattr(self, f"{side}_validity")
        count = len(self.op_offsets) // 4 - 1
        return pa.Array.from_buffers(pa.bool_(), count, [None, pa.py_buffer(validity)])


def scan_envelopes(values: pa.Array) -> ScannedEnvelopes | None:
    """The envelope columns of ``values`` (a binary array without nulls), or ``None`` (module docstring)."""
    buffers = values.buffers()
    offsets = buffers[1] if buffers[1] is not None else pa.py_buffer(np.zeros(1, np.int32).tobytes())
    data = buffers[2] if buffers[2] is not None else pa.py_buffer(b"")
    if _native is not None:
        scanned = _native.scan_envelopes(offsets, data, values.offset, len(values))
        return None if scanned is None else ScannedEnvelopes(*scanned)
    return _scan_envelopes_python(offsets, data, values.offset, len(values))


_native = native.speedups


class _NotTaken(Exception):
    """The value is not read exactly: the batch goes the way it went before."""


_WS: Final = b" \t\n\r"
_NUMBER: Final = re.compile(rb"-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")
_ESCAPE: Final = re.compile(rb'\\(?:["\\/bfnrt]|u([0-9a-fA-F]{4}))')


class _Scanner:
    """Reads one value; positions are indexes into ``text``."""

    def __init__(self, text: bytes) -> None:
        self.text = text
        self.pos = 0

    def ws(self) -> None:
        text, pos = self.text, self.pos
        while pos < len(text) and text[pos] in _WS:
            pos += 1
        self.pos = pos

    def peek(self) -> int:
        if self.pos >= len(self.text):
            raise _NotTaken
        return self.text[self.pos]

    def expect(self, char: bytes) -> None:
        self.ws()
        if self.peek() != char[0]:
            raise _NotTaken
        self.pos += 1

    def string(self) -> tuple[bytes, bool]:
        """The string at ``pos`` (its quote): raw content and whether it has escapes."""
        text = self.text
        pos = self.pos + 1
        start = pos
        escaped = False
        while True:
            if pos >= len(text):
                raise _NotTaken
            char = text[pos]
            if char == 0x22:
                break
            if char < 0x20:
                raise _NotTaken
            if char == 0x5C:
                escaped = True
                match = _ESCAPE.match(text, pos)
                if match is None:
                    raise _NotTaken
                pos = match.end()
                if match.group(1) is not None:
                    point = int(match.group(1), 16)
                    if 0xDC00 <= point <= 0xDFFF:
                        raise _NotTaken
                    if 0xD800 <= point <= 0xDBFF:
                        low = _ESCAPE.match(text, pos)
                        if low is None or low.group(1) is None or not 0xDC00 <= int(low.group(1), 16) <= 0xDFFF:
                            raise _NotTaken
                        pos = low.end()
                continue
            pos += 1
        raw = text[start:pos]
        try:
            raw.decode("utf-8")  # strict: no overlong forms, no surrogates
        except UnicodeDecodeError:
            raise _NotTaken from None
        self.pos = pos + 1
        return raw, escaped

    def number(self) -> int | None:
        """The number at ``pos``: its value if a plain integer of at most 18 digits, else ``None``."""
        match = _NUMBER.match(self.text, self.pos)
        if match is None:
            raise _NotTaken
        self.pos = match.end()
        digits = match.group(0).lstrip(b"-")
        if match.group(1) is not None or match.group(2) is not None or len(digits) > 18:
            return None
        return int(match.group(0))

    def literal(self, word: bytes) -> None:
        if not self.text.startswith(word, self.pos):
            raise _NotTaken
        self.pos += len(word)

    def skip(self, depth: int) -> None:
        """Check and pass over any value (whitespace before it skipped)."""
        self.ws()
        char = self.peek()
        if char == 0x22:
            self.string()
        elif char in b"{[":
            if depth >= _MAX_DEPTH:
                raise _NotTaken
            close = 0x7D if char == 0x7B else 0x5D
            self.pos += 1
            self.ws()
            if self.peek() == close:
                self.pos += 1
                return
            while True:
                if char == 0x7B:
                    self.ws()
                    if self.peek() != 0x22:
                        raise _NotTaken
                    self.string()
                    self.expect(b":")
                self.skip(depth + 1)
                self.ws()
                after = self.peek()
                self.pos += 1
                if after == 0x2C:
                    continue
                if after == close:
                    return
                raise _NotTaken
        elif char == 0x74:
            self.literal(b"true")
        elif char == 0x66:
            self.literal(b"false")
        elif char == 0x6E:
            self.literal(b"null")
        else:
            self.number()

    def object(self, read_member: Callable[[bytes], None]) -> None:
        """An object at ``pos``: each member's unescaped key handed to ``read_member`` at its value."""
        self.pos += 1
        self.ws()
        if self.peek() == 0x7D:
            self.pos += 1
            return
        while True:
            self.ws()
            if self.peek() != 0x22:
                raise _NotTaken
            key, escaped = self.string()
            if escaped:
                raise _NotTaken
            self.expect(b":")
            self.ws()
            self.peek()
            read_member(key)
            self.ws()
            after = self.peek()
            self.pos += 1
            if after == 0x2C:
                continue
            if after == 0x7D:
                return
            raise _NotTaken


class _MemberReader:
    """Reads the members of one envelope (and of its source) into ``row``."""

    def __init__(self, scanner: _Scanner) -> None:
        self.scanner = scanner
        self.row: dict[str, object] = {}
        self.seen: set[bytes] = set()

    def __call__(self, key: bytes) -> None:
        s = self.scanner
        if key in (b"op", b"source", b"before", b"after"):
            if key in self.seen:
                raise _NotTaken
            self.seen.add(key)
        if key == b"op":
            self.row["op"] = self.string()
        elif key == b"source":
            if s.peek() == 0x6E:
                s.literal(b"null")
            elif s.peek() == 0x7B:
                s.object(_SourceReader(self))
            else:
                raise _NotTaken
        elif key in (b"before", b"after"):
            if s.peek() == 0x6E:
                s.literal(b"null")
            elif s.peek() == 0x7B:
                start = s.pos
                s.skip(1)
                self.row[key.decode()] = s.text[start : s.pos]
            else:
                raise _NotTaken
        else:
            s.skip(1)

    def string(self) -> bytes | None:
        s = self.scanner
        if s.peek() == 0x6E:
            s.literal(b"null")
            return None
        if s.peek() != 0x22:
            raise _NotTaken
        raw, escaped = s.string()
        if escaped:
            raise _NotTaken
        return raw


class _SourceReader:
    def __init__(self, envelope: _MemberReader) -> None:
        self.envelope = envelope
        self.seen: set[bytes] = set()

    def __call__(self, key: bytes) -> None:
        s = self.envelope.scanner
        name = key.decode()
        if name not in _STRING_FIELDS[1:] and name not in _INT_FIELDS:
            s.skip(2)
            return
        if key in self.seen:
            raise _NotTaken
        self.seen.add(key)
        if name in _INT_FIELDS:
            if s.peek() == 0x6E:
                s.literal(b"null")
                return
            value = s.number()
            if value is None:
                raise _NotTaken
            self.envelope.row[name] = value
        else:
            self.envelope.row[name] = self.envelope.string()


def _scan_value(text: bytes) -> dict[str, object]:
    if len(text) < 2 or text[0] != 0x7B or text[-1] != 0x7D:
        raise _NotTaken
    scanner = _Scanner(text)
    reader = _MemberReader(scanner)
    scanner.object(reader)
    if scanner.pos != len(text):
        raise _NotTaken
    row = reader.row
    if row.get("op") is None and "before" not in row and "after" not in row:
        raise _NotTaken
    return row


def _bitmap(valid: list[bool]) -> bytes:
    return np.packbits(np.array(valid, np.bool_), bitorder="little").tobytes()


def _scan_envelopes_python(offsets: pa.Buffer, data: pa.Buffer, first: int, count: int) -> ScannedEnvelopes | None:
    bounds = np.frombuffer(offsets, np.int32)
    if first < 0 or count < 0 or len(bounds) - first < count + 1:
        msg = "scan_envelopes: the offsets do not cover the values"
        raise ValueError(msg)
    raw = data.to_pybytes()
    rows: list[dict[str, object]] = []
    for i in range(first, first + count):
        lo, hi = int(bounds[i]), int(bounds[i + 1])
        if lo < 0 or hi < lo or hi > len(raw):
            msg = "scan_envelopes: a value's offsets lie outside the data"
            raise ValueError(msg)
        try:
            rows.append(_scan_value(raw[lo:hi]))
        except _NotTaken:
            return None
    parts: list[bytes] = []
    for name in _STRING_FIELDS:
        column = [row.get(name) for row in rows]
        texts = [b"" if item is None else item for item in column]
        assert all(isinstance(item, bytes) for item in texts)
        lengths = np.array([len(item) for item in texts], np.int64)  # type: ignore[arg-type]
        if lengths.sum() > (1 << 31) - 1:
            return None
        bounds_out = np.zeros(count + 1, np.int32)
        np.cumsum(lengths, out=bounds_out[1:])
        parts += [_bitmap([item is not None for item in column]), bounds_out.tobytes(), b"".join(texts)]  # type: ignore[arg-type]
    for name in _INT_FIELDS:
        column = [row.get(name) for row in rows]
        parts += [
            _bitmap([item is not None for item in column]),
            np.array([0 if item is None else item for item in column], np.int64).tobytes(),
        ]
    for side in ("before", "after"):
        images = [row.get(side) for row in rows]
        parts += [_bitmap([item is not None for item in images]), b"".join(b"{}" if i is None else i for i in images)]  # type: ignore[misc]
    lsns = [row.get("commit_lsn") for row in rows]
    indexes = [row.get("txn_index") for row in rows]
    valid = [lsn is not None and index is not None for lsn, index in zip(lsns, indexes, strict=True)]
    seqs = []
    for ok, lsn, index in zip(valid, lsns, indexes, strict=True):
        if ok and (lsn < 0 or index < 0):  # type: ignore[operator]
            return None
        seqs.append(f"{lsn if ok else 0:016x}.{index if ok else 0:016x}".encode())
    bounds_seq = np.arange(count + 1, dtype=np.int32) * np.int32(_SEQ_WIDTH)
    parts += [_bitmap(valid), bounds_seq.tobytes(), b"".join(seqs)]
    return ScannedEnvelopes(*parts)
