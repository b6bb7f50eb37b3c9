"""Queries over tables a delta-rs MERGE rewrote (their files store strings as string_view)."""

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from warehouse_loader.query import run_query


def test_filters_and_self_joins_work_on_merge_rewritten_files(tmp_path):
    path = tmp_path / "customers"
    write_deltalake(str(path), pa.table({"id": [1, 2, 3], "country": ["NZ", "FR", "NZ"]}))
    source = pa.table({"id": [2, 4], "country": ["DE", "JP"]})
    (
        DeltaTable(str(path))
        .merge(source, predicate="t.id = s.id", source_alias="s", target_alias="t")
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .execute()
    )
    tables = {"customers": path}
    rows = run_query("SELECT id FROM customers WHERE country = 'NZ' ORDER BY id", tables).to_pylist()
    assert rows == [{"id": 1}, {"id": 3}]
    joined = run_query(
        "SELECT a.id FROM customers a JOIN customers b ON a.country = b.country AND a.id < b.id", tables
    ).to_pylist()
    assert joined == [{"id": 1}]


def test_added_column_is_null_in_older_files(tmp_path):
    path = tmp_path / "t"
    write_deltalake(str(path), pa.table({"id": [1]}))
    write_deltalake(str(path), pa.table({"id": [2], "extra": ["x"]}), mode="append", schema_mode="merge")
    rows = run_query("SELECT id, extra FROM t ORDER BY id", {"t": path}).to_pylist()
    assert rows == [{"id": 1, "extra": None}, {"id": 2, "extra": "x"}]


def test_query_cannot_read_other_files(tmp_path):
    path = tmp_path / "t"
    write_deltalake(str(path), pa.table({"id": [1]}))
    (tmp_path / "secret.csv").write_text("a\n1\n")
    import pytest

    from warehouse_loader.errors import QueryError

    with pytest.raises(QueryError):
        run_query(f"SELECT * FROM read_csv('{tmp_path / 'secret.csv'}')", {"t": path})
