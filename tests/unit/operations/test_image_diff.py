"""The chunked comparison of source row images with a table: every kind of difference, across chunk borders."""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from decimal import Decimal

import pyarrow as pa  # type: ignore[import-untyped]  # no stubs

from operations import image_diff
from operations.image_diff import compare_images, key_texts
from operations.table_diff import DiffTarget
from warehouse_loader.location import TableLocation

SCHEMA = pa.schema(
    [
        ("k", pa.string()),
        ("n", pa.int32()),
        ("__hw_seq", pa.string()),
        ("amount", pa.decimal128(10, 2)),
        ("ratio", pa.float64()),
        ("name", pa.string()),
    ]
)


class Table:
    """A stored table's version over an Arrow table (what :class:`StoredTable` gives the comparison)."""

    def __init__(self, rows: pa.Table) -> None:
        self.rows = rows

    def schema(self) -> pa.Schema:
        return self.rows.schema

    def register(self, con, name: str) -> None:
        con.register(name, self.rows)


class Read:
    """Source rows as event values (here: the images pickled, so a NaN stays one), in key order."""

    def __init__(self, rows: list[dict]) -> None:
        self.rows = rows
        self.point, self.label, self.table = 1, "binlog.000001:4", "db.t"

    def values(self, chunk_rows: int) -> Iterator[list[bytes]]:
        for at in range(0, len(self.rows), chunk_rows):
            yield [pickle.dumps(row) for row in self.rows[at : at + chunk_rows]]


class Decoder:
    """The images as the loader's reader types them: ratio a double, amount a decimal text."""

    def images(self, values: list[bytes]) -> pa.Table:
        rows = [pickle.loads(v) for v in values]
        return pa.table(
            {
                "k": pa.array([r["k"] for r in rows], pa.string()),
                "n": pa.array([r["n"] for r in rows], pa.int64()),
                "amount": pa.array([Decimal(r["amount"]) for r in rows], pa.decimal128(12, 3)),
                "ratio": pa.array([r["ratio"] for r in rows], pa.float64()),
                "name": pa.array([r["name"] for r in rows], pa.string()),
            }
        )


def source(count: int) -> list[dict]:
    return [
        {"k": f"a{i:03d}", "n": i, "amount": f"{i}.25", "ratio": float("nan") if i == 3 else i / 3, "name": None}
        for i in range(count)
    ]


def warehouse(rows: list[dict]) -> Table:
    def column(name: str, kind: pa.DataType) -> pa.Array:
        if name == "__hw_seq":
            return pa.array(["0" * 16 + "." + "0" * 16] * len(rows), kind)
        if name == "amount":
            return pa.array([Decimal(r["amount"]) for r in rows], kind)
        return pa.array([r[name] for r in rows], kind)

    return Table(pa.table({f.name: column(f.name, f.type) for f in SCHEMA}, schema=SCHEMA))


def target() -> DiffTarget:
    return DiffTarget("t", "b", "topic", "src", "", "", "db.t", ("k", "n"), key_texts(("k", "n")), [], [], "")


def test_every_difference_is_found_by_key_and_nothing_else(monkeypatch) -> None:
    monkeypatch.setattr(image_diff, "CHUNK_ROWS", 7)  # several chunks, differences on their borders
    rows = source(40)
    stored = [dict(r) for r in rows]
    stored[6]["name"] = "tampered"  # last row of the first chunk
    stored[7]["amount"] = "7.5"  # first row of the second
    del stored[20]  # missing in the warehouse
    stored.append({"k": "a020x", "n": 99, "amount": "1", "ratio": 0.5, "name": "ghost"})  # only in the warehouse
    found = compare_images(Read(rows), Decoder(), TableLocation("/nowhere"), warehouse(stored), target())  # type: ignore[arg-type]
    assert (found.source_rows, found.warehouse_rows, found.chunks, found.not_compared) == (40, 40, 6, [])
    assert [d.describe() for _, d in sorted(found.differences.items())] == [
        "k=a006, n=6: name: source None, warehouse 'tampered'",
        "k=a007, n=7: amount: source '7.25', warehouse '7.50'",
        "k=a020, n=20: missing in the warehouse",
        "k=a020x, n=99: only in the warehouse",
    ]
    assert found.differing_chunks == 3  # the NaN of a003 equals itself


def test_later_rounds_compare_only_the_keys_asked_for() -> None:
    rows = source(10)
    stored = [dict(r) for r in rows]
    stored[1]["name"] = "x"
    stored[2]["name"] = "y"
    pending = {"a002\x1e2"}
    found = compare_images(Read(rows), Decoder(), TableLocation("/nowhere"), warehouse(stored), target(), pending)  # type: ignore[arg-type]
    assert list(found.differences) == ["a002\x1e2"]


def test_a_column_without_an_exact_form_in_the_table_type_is_not_compared() -> None:
    rows = source(5)
    rows[1]["amount"] = "1.125"  # three decimals: the table's decimal(10, 2) cannot hold it exactly
    found = compare_images(Read(rows), Decoder(), TableLocation("/nowhere"), warehouse(source(5)), target())  # type: ignore[arg-type]
    assert found.not_compared == ["amount"] and found.differences == {}


def test_a_column_refused_in_a_later_chunk_is_not_reported_from_earlier_ones(monkeypatch) -> None:
    monkeypatch.setattr(image_diff, "CHUNK_ROWS", 4)
    rows = source(12)
    stored = [dict(r) for r in rows]
    stored[0]["amount"] = "9"  # differs in the first chunk ...
    stored[2]["amount"], stored[2]["name"] = "9", "z"
    rows[10]["amount"] = "1.125"  # ... but the third cannot be cast: the column is not compared at all
    found = compare_images(Read(rows), Decoder(), TableLocation("/nowhere"), warehouse(stored), target())  # type: ignore[arg-type]
    assert found.not_compared == ["amount"]
    assert [d.describe() for d in found.differences.values()] == ["k=a002, n=2: name: source None, warehouse 'z'"]
