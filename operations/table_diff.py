"""One source table against its warehouse table inside one snapshot: per-bucket hashes, then the differing rows.

Level 1 hashes every row's canonical text (:mod:`operations.row_hashes`) on both sides, in
Postgres and in DuckDB over the table's files, and sums the hashes per key bucket
with a row count; level 2 reads the rows of the buckets that differ, on both sides, and
compares them per key and column. :func:`changed_since` tells which differing keys the
warehouse changed at or after a sequence (they are compared again later, not reported).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import duckdb
import psycopg
import pyarrow as pa  # type: ignore[import-untyped]  # no stubs

from operations.row_hashes import Canonical, bucket_sql, hash60, range_bucket_sql, text_sql
from warehouse_loader.changes import DELETE_OP, OP, SEQ, TRUNCATE_OP
from warehouse_loader.duckdb_connection import duckdb_connection
from warehouse_loader.location import TableLocation
from warehouse_loader.sql_text import quote
from warehouse_loader.table_format import StoredTable

#: Rows per key-hash bucket the first level aims at.
ROWS_PER_BUCKET = 64


@dataclass(frozen=True)
class Difference:
    """One key whose row differs: ``kind`` is ``differs``, ``missing in the warehouse`` or ``only in the warehouse``."""

    key: str
    kind: str
    columns: list[tuple[str, str | None, str | None]] = field(default_factory=list)

    def describe(self) -> str:
        """One line: the key, and what differs (column: source value vs warehouse value)."""
        if self.kind != "differs":
            return f"{self.key}: {self.kind}"
        parts = [f"{name}: source {src!r}, warehouse {wh!r}" for name, src, wh in self.columns]
        return f"{self.key}: " + "; ".join(parts)


@dataclass
class DiffTarget:
    """A warehouse table, its source table and how to read both."""

    name: str
    build: str
    topic: str
    source: str
    slot: str
    dsn: str
    relation: str  # quoted schema.table
    keys: tuple[str, ...]
    key_text: list[Canonical]
    columns: list[Canonical]
    not_compared: list[str]
    sequence_by: str


@dataclass
class _Rows:
    """Rows of one side by key text: canonical column texts, raw key values, warehouse sequence."""

    values: dict[str, tuple[str | None, ...]] = field(default_factory=dict)
    raw_keys: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    seqs: dict[str, Any] = field(default_factory=dict)


def quoted(name: str) -> str:
    """A Postgres identifier, quoted."""
    return '"' + name.replace('"', '""') + '"'


#: Above this many differing range buckets, level 2 scans the source once instead of one index range each.
MAX_RANGES = 512


@dataclass(frozen=True)
class _Buckets:
    """How level 1 groups keys: SQL per dialect, and for range buckets the source's range of each."""

    pg: str
    duck: str
    low: int | None = None
    width: int = 1

    def where(self, target: DiffTarget, differing: list[int], dialect: str) -> str:
        """The rows of ``differing``: key ranges of a single integer key, else the bucket expression.

        Key ranges let the source read index ranges and DuckDB prune by the files' statistics.
        """
        if self.low is None or len(differing) > MAX_RANGES:
            expression = self.pg if dialect == "pg" else self.duck
            return f"{expression} IN ({', '.join(map(str, differing))})"
        column = quoted(target.keys[0])
        ranges = [(self.low + b * self.width, self.low + (b + 1) * self.width) for b in differing]
        return " OR ".join(f"({column} >= {lo} AND {column} < {hi})" for lo, hi in ranges)


def _buckets(conn: psycopg.Connection[Any], target: DiffTarget, duck_range: tuple[Any, Any], count: int) -> _Buckets:
    """Range buckets for a single integer key the source indexes (level 2 then reads index ranges), else hashes."""
    key = target.key_text
    if len(key) == 1 and key[0].integer and _indexed(conn, target):
        column = quoted(target.keys[0])
        src = conn.execute(f"SELECT min({column}), max({column}) FROM ONLY {target.relation}").fetchone()  # type: ignore[arg-type]
        ends = [v for v in (*duck_range, *(src or ())) if v is not None]
        if ends:
            low, high = int(min(ends)), int(max(ends))
            if high - low < 1 << 62:  # (key - low) stays a bigint
                width = max(1, -(-(high - low + 1) // count))
                return _Buckets(
                    range_bucket_sql(key[0], "pg", low, width), range_bucket_sql(key[0], "duck", low, width), low, width
                )
    return _Buckets(bucket_sql(key, "pg", count), bucket_sql(key, "duck", count))


def _indexed(conn: psycopg.Connection[Any], target: DiffTarget) -> bool:
    """Whether a btree index of the source table leads with the (single) key column."""
    found = conn.execute(
        "SELECT EXISTS (SELECT 1 FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
        "AND a.attnum = i.indkey[0] JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_am m ON m.oid = c.relam "
        "WHERE i.indrelid = %s::regclass AND a.attname = %s AND m.amname = 'btree' AND i.indpred IS NULL)",
        (target.relation, target.keys[0]),
    ).fetchone()
    return bool(found and found[0])


def compare_all(
    conn: psycopg.Connection[Any],
    where: TableLocation,
    stored: StoredTable,
    target: DiffTarget,
    timings: dict[str, float],
) -> tuple[tuple[int, int, int, int], dict[str, Difference]]:
    """Level 1 over every row, level 2 over the differing buckets; ``(counts, differences)``.

    ``stored`` is the table at ``where``; ``timings`` gets the seconds of the level-1 scans.
    """
    with _duck(where, stored) as duck:
        single = len(target.keys) == 1 and target.key_text[0].integer
        column = quote(target.keys[0])
        stats = f"count(*), min({column}), max({column})" if single else "count(*), NULL, NULL"
        counted, low, high = duck.sql(f"SELECT {stats} FROM target").fetchall()[0]
        warehouse_rows = int(counted)
        count = max(1, min(1 << 20, warehouse_rows // ROWS_PER_BUCKET))
        buckets = _buckets(conn, target, (low, high), count)
        hash_pg = hash60(text_sql([*target.key_text, *target.columns], "pg"), "pg")
        hash_duck = hash60(text_sql([*target.key_text, *target.columns], "duck"), "duck")
        level1 = "SELECT {b} AS b, count(*) AS n, sum({h}) AS s FROM {t} GROUP BY 1"
        # Both sides at once: Postgres scans in its own process, DuckDB without the GIL.
        with ThreadPoolExecutor(1) as pool:
            query = level1.format(b=buckets.pg, h=hash_pg, t=f"ONLY {target.relation}")
            source_rows_future = pool.submit(_fetch, conn, query, timings)
            start = time.perf_counter()
            warehouse = {
                int(b): (int(n), int(s))
                for b, n, s in duck.sql(level1.format(b=buckets.duck, h=hash_duck, t="target")).fetchall()
            }
            timings["warehouse"] = time.perf_counter() - start
            source = {int(b): (int(n), int(s)) for b, n, s in source_rows_future.result()}
        differing = sorted(b for b in source.keys() | warehouse.keys() if source.get(b) != warehouse.get(b))
        source_rows = sum(n for n, _ in source.values())
        if not differing:
            return (source_rows, warehouse_rows, count, 0), {}
        with ThreadPoolExecutor(1) as pool:
            src_future = pool.submit(_source_rows, conn, target, buckets.where(target, differing, "pg"))
            wh = _warehouse_rows(duck, target, buckets.where(target, differing, "duck"))
            src = src_future.result()
    return (source_rows, warehouse_rows, count, len(differing)), _diff(target, src, wh)


def compare_keys(
    conn: psycopg.Connection[Any], where: TableLocation, stored: StoredTable, target: DiffTarget, keys: Iterable[str]
) -> dict[str, Difference]:
    """The given keys (key texts) compared again, by key on both sides."""
    wanted = sorted(keys)
    with _duck(where, stored) as duck:
        duck.register("wanted", pa.table({"k": pa.array(wanted, pa.string())}))
        key_duck = text_sql(target.key_text, "duck")
        wh = _warehouse_rows(duck, target, f"{key_duck} IN (SELECT k FROM wanted)")
    src = _source_rows(conn, target, f"{text_sql(target.key_text, 'pg')} = ANY(%(keys)s)", {"keys": wanted})
    return _diff(target, src, wh, only=set(wanted))


def _fetch(conn: psycopg.Connection[Any], query: str, timings: dict[str, float] | None = None) -> list[tuple[Any, ...]]:
    start = time.perf_counter()
    rows = conn.execute(query).fetchall()  # type: ignore[arg-type]  # built from quoted identifiers
    if timings is not None:
        timings["source"] = time.perf_counter() - start
    return rows


def _source_rows(
    conn: psycopg.Connection[Any], target: DiffTarget, where: str, params: Mapping[str, Any] | None = None
) -> _Rows:
    key = text_sql(target.key_text, "pg")
    values = ", ".join(c.pg for c in target.columns) or "NULL"
    raw = ", ".join(quoted(k) for k in target.keys)
    query = f"SELECT {key}, {raw}, {values} FROM ONLY {target.relation} WHERE {where}"
    rows = _Rows()
    width = len(target.keys)
    for record in conn.execute(query, params or None).fetchall():  # type: ignore[arg-type]
        rows.values[record[0]] = tuple(record[1 + width :])
        rows.raw_keys[record[0]] = tuple(record[1 : 1 + width])
    return rows


def _warehouse_rows(duck: duckdb.DuckDBPyConnection, target: DiffTarget, where: str) -> _Rows:
    key = text_sql(target.key_text, "duck")
    values = ", ".join(c.duck for c in target.columns) or "NULL"
    query = f'SELECT {key}, "{SEQ}", {values} FROM target WHERE {where}'
    rows = _Rows()
    for record in duck.sql(query).fetchall():
        rows.values[record[0]] = tuple(record[2:])
        rows.seqs[record[0]] = record[1]
    return rows


def shown_key(target: DiffTarget, key: str) -> str:
    """A key text as ``name=value, ...``."""
    return ", ".join(f"{name}={value}" for name, value in zip(target.keys, key.split(chr(30)), strict=False))


def _diff(target: DiffTarget, src: _Rows, wh: _Rows, only: set[str] | None = None) -> dict[str, Difference]:
    """Differences by key text; each names its key as ``name=value``."""
    found: dict[str, Difference] = {}
    names = [c.name for c in target.columns] or ["(none)"]
    for key in sorted(src.values.keys() | wh.values.keys()):
        if only is not None and key not in only:
            continue
        if key not in wh.values:
            found[key] = Difference(shown_key(target, key), "missing in the warehouse")
        elif key not in src.values:
            found[key] = Difference(shown_key(target, key), "only in the warehouse")
        elif src.values[key] != wh.values[key]:
            columns = [(n, a, b) for n, a, b in zip(names, src.values[key], wh.values[key], strict=True) if a != b]
            found[key] = Difference(shown_key(target, key), "differs", columns)
    return found


def changed_since(  # noqa: PLR0917  (the table, its tombstones, the target, what to re-check, from when)
    where: TableLocation,
    stored: StoredTable,
    side: StoredTable | None,
    target: DiffTarget,
    found: Mapping[str, Difference],
    threshold: str,
) -> set[str]:
    """Keys of ``found`` the warehouse changed at or after the snapshot (row or delete sequence >= ``threshold``)."""
    if not found:
        return set()
    keys = pa.table({"k": pa.array(sorted(found), pa.string())})
    key_duck = text_sql(target.key_text, "duck")
    newer: set[str] = set()
    with _duck(where, stored) as duck:
        duck.register("wanted", keys)
        for (key,) in duck.sql(
            f"SELECT {key_duck} FROM target WHERE \"{SEQ}\" >= '{threshold}' AND {key_duck} IN (SELECT k FROM wanted)"
        ).fetchall():
            newer.add(key)
    if side is None or target.sequence_by != SEQ:
        return newer
    with _duck(where, side) as duck:
        duck.register("wanted", keys)
        truncated = duck.sql(
            f"SELECT count(*) FROM target WHERE \"{OP}\" = '{TRUNCATE_OP}' AND \"{SEQ}\" >= '{threshold}'"
        ).fetchall()[0][0]
        if truncated:
            return set(found)
        for (key,) in duck.sql(
            f"SELECT {key_duck} FROM target WHERE \"{OP}\" = '{DELETE_OP}' AND \"{SEQ}\" >= '{threshold}' "
            f"AND {key_duck} IN (SELECT k FROM wanted)"
        ).fetchall():
            newer.add(key)
    return newer


@contextmanager
def _duck(where: TableLocation, table: StoredTable) -> Iterator[duckdb.DuckDBPyConnection]:
    """A DuckDB connection (UTC) with ``target`` bound to one version of a table (stored at ``where``)."""
    con = duckdb_connection([where])
    try:
        table.register(con, "target")
        yield con
    finally:
        con.close()
