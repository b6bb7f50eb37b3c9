"""``run_query`` over real Delta tables and the output formats."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from warehouse_loader.errors import QueryError, UnknownTableError
from warehouse_loader.query import format_result, run_query


@pytest.fixture
def tables(tmp_path: Path) -> dict[str, Path]:
    customers = pa.table(
        {
            "id": pa.array([1, 2, 3], pa.int64()),
            "country": ["MX", "MX", "PT"],
            "__hw_commit_ts": pa.array([datetime(2024, 1, 1, tzinfo=UTC)] * 3, pa.timestamp("us", tz="UTC")),
        }
    )
    write_deltalake(str(tmp_path / "customers"), customers)
    return {"customers": tmp_path / "customers", "orders": tmp_path / "orders"}  # orders: not loaded yet


def test_query_by_table_name(tables: dict[str, Path]) -> None:
    result = run_query("SELECT country, count(*) AS n FROM customers GROUP BY country ORDER BY country", tables)
    assert result.to_pylist() == [{"country": "MX", "n": 2}, {"country": "PT", "n": 1}]


def test_unknown_table_lists_known_tables(tables: dict[str, Path]) -> None:
    with pytest.raises(UnknownTableError, match=r"unknown table 'nope'; known tables: customers"):
        run_query("SELECT * FROM nope", tables)
    with pytest.raises(UnknownTableError, match="known tables: customers"):
        run_query("SELECT * FROM orders", tables)


def test_query_is_read_only(tables: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(QueryError):
        run_query(f"COPY (SELECT * FROM customers) TO '{tmp_path / 'out.csv'}'", tables)
    assert not (tmp_path / "out.csv").exists()
    with pytest.raises(QueryError):
        run_query("SET enable_external_access = true", tables)


def test_bad_sql_is_one_line_error(tables: dict[str, Path]) -> None:
    with pytest.raises(QueryError) as info:
        run_query("SELEC 1", tables)
    assert "\n" not in str(info.value)


def test_formats(tables: dict[str, Path]) -> None:
    result = run_query("SELECT id, country, __hw_commit_ts FROM customers ORDER BY id LIMIT 2", tables)
    rows = json.loads(format_result(result, "json"))
    assert rows == [
        {"id": 1, "country": "MX", "__hw_commit_ts": "2024-01-01T00:00:00Z"},
        {"id": 2, "country": "MX", "__hw_commit_ts": "2024-01-01T00:00:00Z"},
    ]
    csv_text = format_result(result, "csv")
    assert csv_text.splitlines()[0] == "id,country,__hw_commit_ts"
    assert csv_text.splitlines()[1].startswith("1,MX,2024-01-01T00:00:00")
    text = format_result(result, "table")
    assert "country" in text and "(2 rows)" in text
    assert json.loads(format_result(result.slice(0, 0), "json")) == []
