"""The logical type of a column (what its JSON value in the log decodes back to).

The logical type of every recorded column in every mode, and the values written for it,
are checked in ``tests/unit/capture/test_typemap.py``.
"""

from __future__ import annotations

import pytest

from core.source_config import TypesConfig
from log.pg_types import Oid, PgType, TypeKind, TypeNestingError, TypeRegistry, logical_type
from log.row_types import LogicalKind, LogicalType

STRING = TypesConfig()
PRECISE = TypesConfig(decimal_handling_mode="precise", time_precision_mode="connect", binary_handling_mode="hex")


def test_logical_type_function_and_value_object() -> None:
    assert logical_type(Oid.NUMERIC, (12 << 16 | 3) + 4, STRING) == LogicalType(LogicalKind.DECIMAL, 12, 3)
    assert str(logical_type(Oid.TIMESTAMP, 6, STRING)) == "timestamp_us"
    assert str(logical_type(1115, -1, PRECISE)) == "array<timestamp_ms>"
    assert str(logical_type(99999, -1, STRING)) == "string"  # unknown oid: its text


def test_enums_domains_and_arrays_resolve_through_the_registry() -> None:
    types = TypeRegistry(
        [
            PgType(50010, "public", "mood", TypeKind.ENUM, enum_labels=("sad", "happy")),
            PgType(50011, "public", "_mood", element_oid=50010),
            PgType(50012, "public", "price", TypeKind.DOMAIN, base_oid=Oid.NUMERIC, base_typmod=(8 << 16 | 2) + 4),
        ]
    )
    assert str(logical_type(50011, -1, STRING, types)) == "array<enum>"
    assert logical_type(50012, -1, PRECISE, types) == LogicalType(LogicalKind.DECIMAL_BASE64, 8, 2)
    assert str(logical_type(50011, -1, STRING)) == "string"  # without the registry: its text


def test_an_array_cycle_is_refused() -> None:
    types = TypeRegistry([PgType(50020, "public", "_loop", element_oid=50020)])
    with pytest.raises(TypeNestingError, match="nests too deeply"):
        logical_type(50020, -1, STRING, types)
