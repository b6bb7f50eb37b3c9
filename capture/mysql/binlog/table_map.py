"""TABLE_MAP events: a table's shape as the binlog writes it before each of its row events.

With ``binlog_row_metadata=FULL`` (MariaDB >= 10.5, MySQL >= 8.0.1) every TABLE_MAP carries,
besides the column types and their type metadata, the column names, signedness, character
sets, ENUM/SET values, geometry types and the primary key ("optional metadata"). A row event
is therefore decoded with the shape its table had when the row was written, whatever DDL
came later, across restarts, without a schema history of parsed DDL.

Layout (MySQL ``Table_map_log_event``): table id (6 bytes), flags (2), schema (1-byte length,
name, NUL), table (same), column count (length-encoded), one type byte per column, type
metadata (length-encoded size, then per type), the nullable bitmap, then optional metadata
as type/length/value fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from core.errors import PermanentError


class ColumnType(IntEnum):
    """Binlog column type codes (``enum_field_types``)."""

    DECIMAL = 0
    TINY = 1
    SHORT = 2
    LONG = 3
    FLOAT = 4
    DOUBLE = 5
    NULL = 6
    TIMESTAMP = 7
    LONGLONG = 8
    INT24 = 9
    DATE = 10
    TIME = 11
    DATETIME = 12
    YEAR = 13
    NEWDATE = 14
    VARCHAR = 15
    BIT = 16
    TIMESTAMP2 = 17
    DATETIME2 = 18
    TIME2 = 19
    JSON = 245
    NEWDECIMAL = 246
    ENUM = 247
    SET = 248
    TINY_BLOB = 249
    MEDIUM_BLOB = 250
    LONG_BLOB = 251
    BLOB = 252
    VAR_STRING = 253
    STRING = 254
    GEOMETRY = 255


#: Collation id of the ``binary`` character set: a string column with it holds bytes.
BINARY_COLLATION = 63

_NUMERIC = frozenset(
    {
        ColumnType.TINY,
        ColumnType.SHORT,
        ColumnType.INT24,
        ColumnType.LONG,
        ColumnType.LONGLONG,
        ColumnType.NEWDECIMAL,
        ColumnType.FLOAT,
        ColumnType.DOUBLE,
        ColumnType.DECIMAL,
        ColumnType.YEAR,
    }
)
#: Types whose metadata is one byte: FLOAT/DOUBLE size, BLOB length-prefix size, temporal fractional digits.
_ONE_BYTE_META = frozenset(
    {
        ColumnType.FLOAT,
        ColumnType.DOUBLE,
        ColumnType.BLOB,
        ColumnType.GEOMETRY,
        ColumnType.JSON,
        ColumnType.TIMESTAMP2,
        ColumnType.DATETIME2,
        ColumnType.TIME2,
    }
)
_CHARACTER = frozenset({ColumnType.STRING, ColumnType.VAR_STRING, ColumnType.VARCHAR, ColumnType.BLOB})


class _Optional(IntEnum):
    SIGNEDNESS = 1
    DEFAULT_CHARSET = 2
    COLUMN_CHARSET = 3
    COLUMN_NAME = 4
    SET_STR_VALUE = 5
    ENUM_STR_VALUE = 6
    GEOMETRY_TYPE = 7
    SIMPLE_PRIMARY_KEY = 8
    PRIMARY_KEY_WITH_PREFIX = 9
    ENUM_AND_SET_DEFAULT_CHARSET = 10
    ENUM_AND_SET_COLUMN_CHARSET = 11
    COLUMN_VISIBILITY = 12


class TableMapError(PermanentError):
    """A TABLE_MAP event capture cannot use (no column names: the server's binlog_row_metadata is not FULL)."""


@dataclass(frozen=True)
class ColumnShape:
    """One column as the binlog describes it.

    ``type`` is the real type (a CHAR/ENUM/SET column's ``STRING`` resolved from its
    metadata). ``meta``: VARCHAR/CHAR max byte length, BLOB/GEOMETRY/JSON length-prefix size,
    FLOAT/DOUBLE size, temporal fractional digits, ENUM/SET storage size; ``precision`` and
    ``scale`` for DECIMAL, ``bits`` for BIT.
    """

    name: str
    type: ColumnType
    meta: int = 0
    nullable: bool = True
    unsigned: bool = False
    collation: int | None = None
    precision: int = 0
    scale: int = 0
    bits: int = 0
    enum_values: tuple[bytes, ...] = ()
    set_values: tuple[bytes, ...] = ()
    geometry_type: int | None = None
    visible: bool = True

    @property
    def is_binary(self) -> bool:
        """A character-typed column with the ``binary`` character set (BINARY, VARBINARY, BLOB)."""
        return self.type in _CHARACTER and self.collation == BINARY_COLLATION


@dataclass(frozen=True)
class TableShape:
    """A table as one TABLE_MAP event describes it."""

    table_id: int
    schema: str
    table: str
    columns: tuple[ColumnShape, ...]
    primary_key: tuple[int, ...] = ()

    @property
    def key_names(self) -> tuple[str, ...]:
        """The primary key's column names, in key order."""
        return tuple(self.columns[i].name for i in self.primary_key)


def _lenenc(data: bytes, pos: int) -> tuple[int, int]:
    """A length-encoded integer at ``pos``: (value, next position)."""
    first = data[pos]
    if first < 0xFB:
        return first, pos + 1
    if first == 0xFC:
        return int.from_bytes(data[pos + 1 : pos + 3], "little"), pos + 3
    if first == 0xFD:
        return int.from_bytes(data[pos + 1 : pos + 4], "little"), pos + 4
    return int.from_bytes(data[pos + 1 : pos + 9], "little"), pos + 9


def read_lenenc(data: bytes, pos: int) -> tuple[int, int]:
    """A length-encoded integer of the MySQL protocol: (value, next position)."""
    return _lenenc(data, pos)


def _type_metadata(types: list[int], data: bytes) -> list[tuple[int, int, int]]:
    """Per column: (real type, meta, extra) from the metadata block (see module docstring)."""
    out: list[tuple[int, int, int]] = []
    pos = 0
    for code in types:
        meta = extra = 0
        real = code
        if code in _ONE_BYTE_META:
            meta = data[pos]
            pos += 1
        elif code in (ColumnType.VARCHAR, ColumnType.VAR_STRING):
            meta = int.from_bytes(data[pos : pos + 2], "little")
            pos += 2
        elif code == ColumnType.NEWDECIMAL:
            meta, extra = data[pos], data[pos + 1]  # precision, scale
            pos += 2
        elif code == ColumnType.BIT:
            meta = data[pos + 1] * 8 + data[pos]  # bytes * 8 + leftover bits
            pos += 2
        elif code in (ColumnType.STRING, ColumnType.ENUM, ColumnType.SET):
            byte0, byte1 = data[pos], data[pos + 1]
            pos += 2
            if byte0 & 0x30 != 0x30:
                # CHAR longer than 255 bytes: two length bits live in the type byte.
                meta = byte1 | (((byte0 & 0x30) ^ 0x30) << 4)
                real = byte0 | 0x30
            else:
                real, meta = byte0, byte1
        out.append((real, meta, extra))
    return out


def _bits(data: bytes, count: int) -> list[bool]:
    """``count`` flags from a bitmap, most significant bit of each byte first (optional metadata)."""
    return [bool(data[i // 8] & (0x80 >> (i % 8))) for i in range(count)]


def _strings(data: bytes) -> list[str]:
    out, pos = [], 0
    while pos < len(data):
        length, pos = _lenenc(data, pos)
        out.append(data[pos : pos + length].decode("utf-8", "surrogateescape"))
        pos += length
    return out


def _string_lists(data: bytes) -> list[tuple[bytes, ...]]:
    out, pos = [], 0
    while pos < len(data):
        count, pos = _lenenc(data, pos)
        values = []
        for _ in range(count):
            length, pos = _lenenc(data, pos)
            values.append(data[pos : pos + length])
            pos += length
        out.append(tuple(values))
    return out


def _ints(data: bytes) -> list[int]:
    out, pos = [], 0
    while pos < len(data):
        value, pos = _lenenc(data, pos)
        out.append(value)
    return out


def _charsets(data: bytes, count: int, default_first: bool) -> list[int]:
    """Collation per column of a charset field: default + exceptions, or one per column."""
    values = _ints(data)
    if not default_first:
        return values
    collations = [values[0]] * count
    for i in range(1, len(values) - 1, 2):
        collations[values[i]] = values[i + 1]
    return collations


def parse_table_map(body: bytes, *, mariadb: bool, table_id_size: int = 6) -> TableShape:
    """A TABLE_MAP event's body (after the common header, without the checksum) -> its shape.

    ``mariadb``: MariaDB counts GEOMETRY columns among the character columns of the charset
    fields (with the ``binary`` collation); MySQL does not.
    """
    table_id = int.from_bytes(body[:table_id_size], "little")
    pos = table_id_size + 2
    schema_len = body[pos]
    schema = body[pos + 1 : pos + 1 + schema_len].decode("utf-8", "surrogateescape")
    pos += 2 + schema_len
    table_len = body[pos]
    table = body[pos + 1 : pos + 1 + table_len].decode("utf-8", "surrogateescape")
    pos += 2 + table_len
    count, pos = _lenenc(body, pos)
    types = list(body[pos : pos + count])
    pos += count
    meta_size, pos = _lenenc(body, pos)
    metadata = _type_metadata(types, body[pos : pos + meta_size])
    pos += meta_size
    nullable = [bool(body[pos + i // 8] & (1 << (i % 8))) for i in range(count)]
    pos += (count + 7) // 8

    real_types = [ColumnType(real) if real in ColumnType._value2member_map_ else real for real, _, _ in metadata]
    numeric = [i for i, t in enumerate(real_types) if t in _NUMERIC]
    character_types = _CHARACTER | {ColumnType.GEOMETRY} if mariadb else _CHARACTER
    character = [i for i, t in enumerate(real_types) if t in character_types]
    enum_set = [i for i, t in enumerate(real_types) if t in (ColumnType.ENUM, ColumnType.SET)]
    enums = [i for i, t in enumerate(real_types) if t == ColumnType.ENUM]
    sets = [i for i, t in enumerate(real_types) if t == ColumnType.SET]
    geometries = [i for i, t in enumerate(real_types) if t == ColumnType.GEOMETRY]

    names: list[str] | None = None
    unsigned = [False] * count
    collation: list[int | None] = [None] * count
    enum_values: dict[int, tuple[bytes, ...]] = {}
    set_values: dict[int, tuple[bytes, ...]] = {}
    geometry: dict[int, int] = {}
    visible = [True] * count
    primary_key: list[int] = []
    enum_set_collations: list[int] = []
    raw_enum: list[tuple[bytes, ...]] = []
    raw_set: list[tuple[bytes, ...]] = []
    while pos < len(body):
        kind = body[pos]
        length, pos = _lenenc(body, pos + 1)
        value = body[pos : pos + length]
        pos += length
        if kind == _Optional.SIGNEDNESS:
            for flag, index in zip(_bits(value, len(numeric)), numeric, strict=True):
                unsigned[index] = flag
        elif kind in (_Optional.DEFAULT_CHARSET, _Optional.COLUMN_CHARSET):
            for index, coll in zip(
                character, _charsets(value, len(character), kind == _Optional.DEFAULT_CHARSET), strict=True
            ):
                collation[index] = coll
        elif kind in (_Optional.ENUM_AND_SET_DEFAULT_CHARSET, _Optional.ENUM_AND_SET_COLUMN_CHARSET):
            enum_set_collations = _charsets(value, len(enum_set), kind == _Optional.ENUM_AND_SET_DEFAULT_CHARSET)
        elif kind == _Optional.COLUMN_NAME:
            names = _strings(value)
        elif kind == _Optional.ENUM_STR_VALUE:
            raw_enum = _string_lists(value)
        elif kind == _Optional.SET_STR_VALUE:
            raw_set = _string_lists(value)
        elif kind == _Optional.GEOMETRY_TYPE:
            geometry = dict(zip(geometries, _ints(value), strict=True))
        elif kind == _Optional.SIMPLE_PRIMARY_KEY:
            primary_key = _ints(value)
        elif kind == _Optional.PRIMARY_KEY_WITH_PREFIX:
            primary_key = _ints(value)[::2]
        elif kind == _Optional.COLUMN_VISIBILITY:
            visible = _bits(value, count)
    if names is None:
        msg = (
            f"the binlog's TABLE_MAP of {schema}.{table} has no column names: "
            "set binlog_row_metadata=FULL on the server (SET GLOBAL binlog_row_metadata = FULL, and in its config file)"
        )
        raise TableMapError(msg)
    # ENUM/SET labels stay bytes here: they are text in the column's collation, decoded with it.
    enum_values = dict(zip(enums, raw_enum, strict=False))
    set_values = dict(zip(sets, raw_set, strict=False))
    for index, coll in zip(enum_set, enum_set_collations, strict=False):
        collation[index] = coll

    columns = []
    for i, (real, meta, extra) in enumerate(metadata):
        column_type = ColumnType(real)
        columns.append(
            ColumnShape(
                name=names[i],
                type=column_type,
                meta=meta,
                nullable=nullable[i],
                unsigned=unsigned[i],
                collation=collation[i],
                precision=meta if column_type == ColumnType.NEWDECIMAL else 0,
                scale=extra,
                bits=meta if column_type == ColumnType.BIT else 0,
                enum_values=enum_values.get(i, ()),
                set_values=set_values.get(i, ()),
                geometry_type=geometry.get(i),
                visible=visible[i],
            )
        )
    return TableShape(
        table_id=table_id,
        schema=schema,
        table=table,
        columns=tuple(columns),
        primary_key=tuple(primary_key),
    )
