"""The MySQL/MariaDB type matrix: a table with a column of every type, and rows of edge values.

Used by the conformance test (Headwater's values vs Debezium's MySQL connector, in each handling
mode) and documented in ``docs/mysql-types.md``. ``ROWS`` run under ``sql_mode=''`` so the zero
dates and the invalid ENUM value a lax server accepts are in the binlog too.
"""

from __future__ import annotations

COLUMNS: tuple[tuple[str, str], ...] = (
    ("id", "INT NOT NULL PRIMARY KEY"),
    ("i8", "TINYINT"),
    ("u8", "TINYINT UNSIGNED"),
    ("flag", "BOOLEAN"),
    ("i16", "SMALLINT"),
    ("u16", "SMALLINT UNSIGNED"),
    ("i24", "MEDIUMINT"),
    ("u24", "MEDIUMINT UNSIGNED"),
    ("i32", "INT"),
    ("u32", "INT UNSIGNED"),
    ("i64", "BIGINT"),
    ("u64", "BIGINT UNSIGNED"),
    ("dec_small", "DECIMAL(10,2)"),
    ("dec_big", "DECIMAL(65,30)"),
    ("dec_int", "DECIMAL(5,0)"),
    ("num", "NUMERIC(20,5)"),
    ("f32", "FLOAT"),
    ("f64", "DOUBLE"),
    ("bit1", "BIT(1)"),
    ("bit7", "BIT(7)"),
    ("bit64", "BIT(64)"),
    ("ch", "CHAR(10)"),
    ("vc", "VARCHAR(100)"),
    ("ttext", "TINYTEXT"),
    ("txt", "TEXT"),
    ("mtext", "MEDIUMTEXT"),
    ("ltext", "LONGTEXT"),
    ("latin1", "VARCHAR(20) CHARACTER SET latin1"),
    ("cp1251", "VARCHAR(20) CHARACTER SET cp1251"),
    ("ucs2", "VARCHAR(20) CHARACTER SET ucs2"),
    ("utf16", "VARCHAR(20) CHARACTER SET utf16"),
    ("gbk", "VARCHAR(20) CHARACTER SET gbk"),
    ("utf8mb3", "VARCHAR(20) CHARACTER SET utf8mb3"),
    ("bin8", "BINARY(8)"),
    ("vbin", "VARBINARY(20)"),
    ("tblob", "TINYBLOB"),
    ("blb", "BLOB"),
    ("mblob", "MEDIUMBLOB"),
    ("lblob", "LONGBLOB"),
    ("size", "ENUM('small','medium','large')"),
    ("tags", "SET('a','b','c','d')"),
    ("doc", "JSON"),
    ("d", "DATE"),
    ("d_nn", "DATE NOT NULL DEFAULT '2000-01-01'"),
    ("t0", "TIME"),
    ("t6", "TIME(6)"),
    ("dt0", "DATETIME"),
    ("dt3", "DATETIME(3)"),
    ("dt6", "DATETIME(6)"),
    ("ts0", "TIMESTAMP NULL"),
    ("ts3", "TIMESTAMP(3) NULL"),
    ("ts6", "TIMESTAMP(6) NULL"),
    ("yr", "YEAR"),
    ("geo", "GEOMETRY"),
    ("pt", "POINT"),
    ("line", "LINESTRING"),
    ("poly", "POLYGON"),
    ("mpt", "MULTIPOINT"),
    ("gcoll", "GEOMETRYCOLLECTION"),
    ("gen_virtual", "INT AS (i32 * 2) VIRTUAL"),
    ("gen_stored", "VARCHAR(110) AS (CONCAT(vc, '!')) STORED"),
)

#: Columns written by the rows (generated columns are computed by the server).
WRITTEN = tuple(name for name, kind in COLUMNS if " AS (" not in kind)


def create_table(name: str = "matrix") -> str:
    """``CREATE TABLE`` of the matrix."""
    return f"CREATE TABLE {name} ({', '.join(f'{column} {kind}' for column, kind in COLUMNS)})"


_TYPICAL = {
    "id": "1",
    "i8": "-5",
    "u8": "250",
    "flag": "TRUE",
    "i16": "-1234",
    "u16": "65000",
    "i24": "-8000000",
    "u24": "16000000",
    "i32": "-2000000000",
    "u32": "4000000000",
    "i64": "-9000000000000000000",
    "u64": "18000000000000000000",
    "dec_small": "1234.50",
    "dec_big": "-12345678901234567890123456789012345.123456789012345678901234567890",
    "dec_int": "-12345",
    "num": "0.00001",
    "f32": "1.1",
    "f64": "2.718281828459045",
    "bit1": "b'1'",
    "bit7": "b'1010101'",
    "bit64": "b'1000000000000000000000000000000000000000000000000000000000000001'",
    "ch": "'abc'",
    "vc": "'héllo wörld 🐳'",
    "ttext": "'tiny'",
    "txt": "'some text'",
    "mtext": "REPEAT('m', 300)",
    "ltext": "REPEAT('🐳', 70000)",
    "latin1": "'café £5'",
    "cp1251": "'Привет'",
    "ucs2": "'ÆØÅ ucs2'",
    "utf16": "'utf16 𝄞'",
    "gbk": "'中文字符'",
    "utf8mb3": "'mb3 ü'",
    "bin8": "X'0102'",
    "vbin": "X'00FF10'",
    "tblob": "X'DEADBEEF'",
    "blb": "'blob text'",
    "mblob": "REPEAT(X'00', 300)",
    "lblob": "REPEAT(X'AB', 70000)",
    "size": "'medium'",
    "tags": "'a,c'",
    "doc": '\'{"k": [1, 2.5, "x"], "n": null}\'',
    "d": "'2026-03-04'",
    "d_nn": "'1969-07-20'",
    "t0": "'12:34:56'",
    "t6": "'-12:34:56.789012'",
    "dt0": "'2026-01-01 10:00:00'",
    "dt3": "'2026-01-01 10:00:00.5'",
    "dt6": "'1900-02-28 23:59:59.999999'",
    "ts0": "'2026-01-01 00:00:00'",
    "ts3": "'2026-07-01 12:00:00.123'",
    "ts6": "'2026-01-01 00:00:00.000001'",
    "yr": "2026",
    "geo": "ST_GeomFromText('POINT(1 2)', 4326)",
    "pt": "ST_GeomFromText('POINT(-71.06 42.36)')",
    "line": "ST_GeomFromText('LINESTRING(0 0, 1 1, 2 1)')",
    "poly": "ST_GeomFromText('POLYGON((0 0, 4 0, 4 4, 0 4, 0 0))')",
    "mpt": "ST_GeomFromText('MULTIPOINT(1 1, 2 2)')",
    "gcoll": "ST_GeomFromText('GEOMETRYCOLLECTION(POINT(1 1), LINESTRING(0 0, 1 1))')",
}

_EXTREMES = {
    **{name: "NULL" for name in WRITTEN},
    "id": "2",
    "i8": "-128",
    "u8": "255",
    "flag": "FALSE",
    "i16": "-32768",
    "u16": "65535",
    "i24": "-8388608",
    "u24": "16777215",
    "i32": "-2147483648",
    "u32": "4294967295",
    "i64": "-9223372036854775808",
    "u64": "18446744073709551615",
    "dec_small": "-99999999.99",
    "dec_big": "0",
    "dec_int": "99999",
    "num": "-0.00000",
    "f32": "-3.4e38",
    "f64": "1e-300",
    "bit1": "b'0'",
    "bit7": "b'1111111'",
    "bit64": "b'1111111111111111111111111111111111111111111111111111111111111111'",
    "ch": "''",
    "vc": "''",
    "bin8": "X'0000000000000000'",
    "vbin": "''",
    "size": "'bogus'",
    "tags": "''",
    "d": "'0000-00-00'",
    "d_nn": "'0000-00-00'",
    "t0": "'-838:59:59'",
    "t6": "'838:59:59.000000'",
    "dt0": "'0000-00-00 00:00:00'",
    "dt3": "'1000-01-01 00:00:00.000'",
    "dt6": "'9999-12-31 23:59:59.999999'",
    "ts0": "'1970-01-01 00:00:01'",
    "ts3": "'0000-00-00 00:00:00'",
    "ts6": "'2038-01-19 03:14:07.999999'",
    "yr": "1901",
}

_NULLS = {**{name: "NULL" for name in WRITTEN}, "id": "3", "d_nn": "'2000-01-01'"}


def insert_rows(name: str = "matrix") -> list[str]:
    """The three rows: typical values, extremes (zero dates, bounds, an invalid ENUM), all NULL."""
    columns = ", ".join(WRITTEN)
    return [
        f"INSERT INTO {name} ({columns}) VALUES ({', '.join(row[c] for c in WRITTEN)})"
        for row in (_TYPICAL, _EXTREMES, _NULLS)
    ]


def change_rows(name: str = "matrix") -> list[str]:
    """An update of every row (one column), a delete of one."""
    return [
        f"UPDATE {name} SET i32 = COALESCE(i32, 0) + 1, vc = CONCAT(COALESCE(vc, ''), '+')",
        f"DELETE FROM {name} WHERE id = 3",
    ]
