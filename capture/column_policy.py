"""Which columns capture keeps, and how it masks some (``sources.<name>.columns``).

A column left out (``exclude``, or not in a table's ``include`` list) is never converted, so
no error can quote its value; a masked column's text is masked before anything else sees it
(converters, quarantine records, errors). Masks, as Debezium's column mappers define them:

* ``hash``: the lowercase hex digest of the salt's UTF-8 bytes followed by the value's bytes:
  its UTF-8 text (``version: 2``, Debezium's ``column.mask.hash.v2``) or Java's serialization
  of the String (``version: 1``, ``column.mask.hash``: ``ObjectOutputStream`` header, then
  ``TC_STRING`` + 2-byte length or ``TC_LONGSTRING`` + 8-byte length, then modified UTF-8).
  The digest is cut to the length of a ``varchar(n)``/``char(n)`` column, as Debezium cuts it
  to the column length. Checked against Debezium 3.6.3 (``tests/unit/capture/test_column_policy.py``).
* ``truncate``: the first N characters (Debezium's ``column.truncate.to.N.chars`` counts
  UTF-16 units and can split a surrogate pair; here characters are code points).
* ``replace``: a fixed string (Debezium's ``column.mask.with.N.chars`` writes N asterisks).

NULL stays NULL. Debezium masks character columns only and passes other types through
unmasked; here any column is masked through its text form, and its schema record says
``string``, so readers decode the masked string. Source-neutral: a kind describes each column
by name and declared character length (:class:`ColumnShape`) and hands over text values
(:mod:`capture.tuples`).
The native row encoder (``native/column_masks.c``) computes the SHA-256 masks, truncation and
replacement itself, byte for byte as this module does; other hash algorithms run here.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from capture.errors import BadRecordError, ColumnSettingError
from capture.tuples import NonUtf8Text, TupleValue
from core.source_config import ColumnsConfig, MaskConfig

# Native kinds of the masks (native/_speedups.c K_MASK_*; 0 is K_PYTHON: call the Python mask).
_K_PYTHON, _K_REPLACE, _K_TRUNCATE, _K_SHA256 = 0, 11, 12, 13


def _java_serialized(text: str) -> bytes:
    """``ObjectOutputStream.writeObject(text)``: stream header, TC_STRING/TC_LONGSTRING, modified UTF-8."""
    if text.isascii() and "\0" not in text:
        body = text.encode()
    else:
        out = bytearray()
        for char in text:
            code = ord(char)
            # Java strings are UTF-16: a character beyond U+FFFF is two surrogates, 3 bytes each.
            units = (code,) if code < 0x10000 else (0xD800 + (code - 0x10000 >> 10), 0xDC00 + (code & 0x3FF))
            for unit in units:
                if 0 < unit < 0x80:
                    out.append(unit)
                elif unit < 0x800:  # NUL included: modified UTF-8 writes it as C0 80
                    out += bytes((0xC0 | unit >> 6, 0x80 | unit & 0x3F))
                else:
                    out += bytes((0xE0 | unit >> 12, 0x80 | unit >> 6 & 0x3F, 0x80 | unit & 0x3F))
        body = bytes(out)
    size = len(body)
    head = b"\x74" + size.to_bytes(2, "big") if size <= 0xFFFF else b"\x7c" + size.to_bytes(8, "big")
    return b"\xac\xed\x00\x05" + head + body


@dataclass(frozen=True)
class ColumnMask:
    """One column's mask, built for its type: the Python mask and the native encoder's form of it."""

    kind: str
    mask: Callable[[str], str]
    native_kind: int
    native_param: int
    native_blob: bytes | None
    #: What this hash mask's output looks like (lowercase hex of its length).
    digest_form: re.Pattern[str] = re.compile("")

    def conform(self, value: Any) -> Any:
        """A filled-in value (an unchanged TOAST value taken from an earlier image) in this mask's form.

        An image written before the mask was configured holds the raw value: a string not in the
        mask's form is masked now (exact for text columns, whose JSON value is their text); a
        value of another JSON type cannot be, and raises :class:`UnresolvedToastError`'s parent,
        so the change goes to quarantine (without that value) instead of into the log.
        """
        if value is None:
            return None
        if not isinstance(value, str):
            msg = f"an earlier image holds an unmasked {type(value).__name__} for a masked column"
            raise BadRecordError(msg)
        if self.kind == "hash":
            return value if self.digest_form.fullmatch(value) else self.mask(value)
        return self.mask(value)  # truncate and replace give their own output back unchanged

    def raw(self, value: TupleValue) -> TupleValue:
        """The masked text of a tuple value as received (NULL and unchanged TOAST stay as they are)."""
        if isinstance(value, NonUtf8Text):
            return self.mask(bytes(value).decode("utf-8", "replace"))
        return self.mask(value) if isinstance(value, str) else value


@dataclass(frozen=True, slots=True)
class ColumnShape:
    """What masks need of a column: its name, and the declared length of a char(n)/varchar(n) column (else 0)."""

    name: str
    char_length: int = 0


def column_mask(config: MaskConfig, char_length: int = 0) -> ColumnMask:
    """The mask of a column (a hash is cut to a char(n)/varchar(n) column's ``char_length``)."""
    if config.kind == "replace":
        replacement = str(config.replace)
        return ColumnMask("replace", lambda _text: replacement, _K_REPLACE, 0, orjson.dumps(replacement))
    if config.kind == "truncate":
        keep = int(config.truncate or 0)
        return ColumnMask("truncate", lambda text: text[:keep], _K_TRUNCATE, keep, None)
    assert config.hash is not None and config.salt is not None
    salt = config.salt.get_secret_value().encode()
    version = config.version
    length = char_length
    algorithm = config.hash
    to_bytes: Callable[[str], bytes] = _java_serialized if version == 1 else str.encode

    def hashed(text: str) -> str:
        digest = hashlib.new(algorithm, salt + to_bytes(text)).hexdigest()
        return digest[:length] if length > 0 else digest

    size = hashlib.new(algorithm).digest_size * 2
    form = re.compile(f"[0-9a-f]{{{min(length, size) if length > 0 else size}}}")
    if algorithm == "sha256":
        return ColumnMask("hash", hashed, _K_SHA256, version | min(length, 64) << 2, salt, form)
    return ColumnMask("hash", hashed, _K_PYTHON, 0, None, form)


@dataclass(frozen=True)
class ColumnRules:
    """A table's column rules: the positions kept (column order) and the masks by position."""

    keep: list[int]
    masks: Mapping[int, ColumnMask]

    def conform_filled(self, names: Sequence[str], image: dict[str, Any], filled: Sequence[str]) -> dict[str, Any]:
        """``image`` with its masked columns among ``filled`` (unchanged TOAST values filled in) in mask form."""
        for i, mask in self.masks.items():
            if names[i] in filled:
                image[names[i]] = mask.conform(image[names[i]])
        return image

    def check_masked_key(self, source: str, table: str, names: Sequence[str], key: Sequence[int]) -> None:
        """Refuse a truncate or replace mask on a key column of ``table`` (it would merge rows; a hash keeps keys)."""
        merged = [names[i] for i in key if i in self.masks and self.masks[i].kind != "hash"]
        if merged:
            mask = self.masks[names.index(merged[0])].kind
            raise ColumnSettingError(
                source,
                "columns.mask",
                f"{table}.{merged[0]} is part of the key of {table} and a {mask} mask would merge "
                f"distinct keys; mask it with a hash, or give the table another key in sources.{source}.keys",
                table=table,
            )

    def raw_image(self, names: Sequence[str], row: Sequence[TupleValue]) -> list[tuple[str, TupleValue]]:
        """(name, value) of the kept columns of a tuple as received, masked ones masked."""
        masks = self.masks
        return [(names[i], masks[i].raw(row[i]) if i in masks else row[i]) for i in self.keep if i < len(row)]


class ColumnPolicy:
    """The column rules of every table of a source (``columns`` plus extra ``excluded`` names)."""

    def __init__(self, columns: ColumnsConfig | None = None, *, excluded: Sequence[str] = ()) -> None:
        self._columns = columns or ColumnsConfig()
        self._excluded = set(self._columns.exclude) | set(excluded)

    def rules(self, table: str, columns: Sequence[ColumnShape]) -> ColumnRules:
        """The rules of the columns of ``table`` (``schema.table``), in column order."""
        keep: list[int] = []
        masks: dict[int, ColumnMask] = {}
        for i, column in enumerate(columns):
            name = f"{table}.{column.name}"
            if name in self._excluded or not self._columns.captures(table, column.name):
                continue
            keep.append(i)
            config = self._columns.mask.get(name)
            if config is not None:
                masks[i] = column_mask(config, column.char_length)
        return ColumnRules(keep, masks)

    def named_columns(self) -> dict[str, list[tuple[str, str]]]:
        """Per ``schema.table``: the (setting, column) pairs the config names, to check they exist."""
        named: dict[str, list[tuple[str, str]]] = {}
        for setting, names in (
            ("include", self._columns.include),
            ("exclude", self._columns.exclude),
            ("mask", tuple(self._columns.mask)),
        ):
            for name in names:
                schema, table, column = name.split(".", 2)
                named.setdefault(f"{schema}.{table}", []).append((setting, column))
        return named
