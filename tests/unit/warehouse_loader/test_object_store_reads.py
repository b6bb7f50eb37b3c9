"""Reads DuckDB makes through the object-store filesystem: whole, at their offset, retried, thread by thread."""

from __future__ import annotations

import time
from collections.abc import Callable

import duckdb
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from warehouse_loader import object_store
from warehouse_loader.duckdb_connection import store_failed
from warehouse_loader.errors import WarehouseUnreachableError
from warehouse_loader.location import storage_error
from warehouse_loader.object_store import read_fully


class Sized:
    """A store file (pyarrow's ``read_at`` and ``size``) returning at most ``most`` bytes a read, as a
    ranged GET cut short does; each read first waits ``wait_s`` (the GIL released, as a store's does)."""

    def __init__(self, data: bytes, most: int, wait_s: float = 0.0) -> None:
        self._data, self._most, self._wait_s, self._at = data, most, wait_s, 0

    def size(self) -> int:
        return len(self._data)

    # pyarrow's file also reads at one position it keeps for all callers: what reads went
    # through before positions were kept per thread.
    def seek(self, offset: int, whence: int = 0) -> int:
        self._at = {0: offset, 1: self._at + offset, 2: len(self._data) + offset}[whence]
        return self._at

    def tell(self) -> int:
        return self._at

    def read(self, length: int = -1) -> bytes:
        if self._wait_s:
            time.sleep(self._wait_s)
        asked = len(self._data) - self._at if length is None or length < 0 else length
        out = self._data[self._at : self._at + min(asked, self._most)]
        self._at += len(out)
        return out

    def read_at(self, length: int, offset: int) -> bytes:
        if self._wait_s:
            time.sleep(self._wait_s)
        return self._data[offset : offset + min(length, self._most)]

    def close(self) -> None:
        pass

    @property
    def closed(self) -> bool:
        return False


def test_read_fully_reads_until_asked_or_the_end() -> None:
    data = bytes(range(256)) * 40  # 10,240 bytes
    assert read_fully(Sized(data, 1000), 0, 5000) == data[:5000]
    assert read_fully(Sized(data, 1000), 0, 20_000) == data  # the end comes first
    assert read_fully(Sized(data, 1000), 0, 0) == b""
    assert read_fully(Sized(data, 1000), 9_000, 5000) == data[9_000:]
    assert read_fully(Sized(data, 7), 100, 10) == data[100:110]


class Flaky(Sized):
    """A store file whose reads fail with ``OSError`` while ``failures`` lasts, as a timed-out GET does."""

    def __init__(self, data: bytes, failures: list[int]) -> None:
        super().__init__(data, len(data))
        self._failures = failures

    def read_at(self, length: int, offset: int) -> bytes:
        if self._failures[0] > 0:
            self._failures[0] -= 1
            raise OSError("AWS Error NETWORK_CONNECTION during GetObject operation: curlCode: 28, Timeout was reached")
        return super().read_at(length, offset)


def store_with(
    tmp_path, monkeypatch, stream: Callable[[bytes], Sized], row_group_size: int | None = None
) -> duckdb.DuckDBPyConnection:
    """DuckDB reading ``s3://bucket/t.parquet`` (50,000 rows) from a store whose files are ``stream(bytes)``."""
    (tmp_path / "bucket").mkdir()
    rows = pa.table({"x": list(range(50_000)), "s": [f"value {i}" for i in range(50_000)]})
    pq.write_table(rows, tmp_path / "bucket" / "t.parquet", row_group_size=row_group_size, compression="zstd")

    class Store:
        """The local filesystem under ``tmp_path``, its input files read through ``stream``."""

        def __init__(self) -> None:
            self.local = pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem())

        def __getattr__(self, name: str):
            return getattr(self.local, name)

        def open_input_file(self, path: str) -> Sized:
            return stream((tmp_path / path).read_bytes())

    monkeypatch.setattr(object_store, "arrow_filesystem", lambda scheme, options: Store())
    monkeypatch.setattr(object_store, "READ_RETRY_PAUSE_S", 0.01)
    con = duckdb.connect()
    con.register_filesystem(object_store.duckdb_filesystem("s3", {}))
    return con


def test_duckdb_reads_a_parquet_file_whose_store_returns_short_reads(tmp_path, monkeypatch) -> None:
    """The files DuckDB gets read whole: with the store's file cut to 4 kB a read, the scan still succeeds."""
    con = store_with(tmp_path, monkeypatch, lambda data: Sized(data, 4096))
    found = con.execute("SELECT count(*), sum(x) FROM read_parquet('s3://bucket/t.parquet')").fetchone()
    assert found == (50_000, sum(range(50_000)))


def _flaky_store(tmp_path, monkeypatch, failures: list[int]) -> duckdb.DuckDBPyConnection:
    return store_with(tmp_path, monkeypatch, lambda data: Flaky(data, failures))


def test_a_read_the_store_fails_a_few_times_is_asked_again_from_its_offset(tmp_path, monkeypatch) -> None:
    failures = [object_store.READ_ATTEMPTS - 1]
    con = _flaky_store(tmp_path, monkeypatch, failures)
    found = con.execute("SELECT count(*), sum(x) FROM read_parquet('s3://bucket/t.parquet')").fetchone()
    assert found == (50_000, sum(range(50_000)))
    assert failures == [0]


def test_a_read_that_keeps_failing_fails_the_query_with_the_store_error(tmp_path, monkeypatch) -> None:
    con = _flaky_store(tmp_path, monkeypatch, [10**6])
    try:
        con.execute("SELECT count(*) FROM read_parquet('s3://bucket/t.parquet')").fetchone()
    except duckdb.Error as exc:
        assert store_failed(exc), str(exc)
        error = storage_error(exc, "s3://bucket/wh")
        assert isinstance(error, WarehouseUnreachableError), str(error)
        assert str(error).startswith(
            "warehouse s3://bucket/wh: cannot reach the object store (OSError: AWS Error NETWORK"
        ), error
    else:
        raise AssertionError("the query succeeded although every read failed")


def test_threads_reading_one_file_each_read_at_their_own_offset(tmp_path, monkeypatch) -> None:
    """DuckDB's threads share a file object and read as seek() then read(): positions are per thread.

    With one position for all (pyarrow's), 4 threads over 20 row groups failed every query of 20
    ("Failed to read ... only 0 bytes returned", or wrong bytes: "ZSTD Decompression failure").
    """
    con = store_with(tmp_path, monkeypatch, lambda data: Sized(data, len(data), wait_s=0.0005), row_group_size=2_500)
    con.execute("SET threads = 4")
    for _ in range(10):
        found = con.execute("SELECT count(*), sum(x), sum(length(s)) FROM read_parquet('s3://bucket/t.parquet')")
        assert found.fetchone() == (50_000, sum(range(50_000)), sum(len(f"value {i}") for i in range(50_000)))
