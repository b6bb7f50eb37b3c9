"""Reads DuckDB makes through the object-store filesystem: whole, even when the store returns less."""

from __future__ import annotations

import io
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


class Trickle(io.RawIOBase):
    """A stream that returns at most ``most`` bytes per read, as a ranged GET cut short does."""

    def __init__(self, data: bytes, most: int) -> None:
        self._data, self._at, self._most = data, 0, most

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        self._at = {0: offset, 1: self._at + offset, 2: len(self._data) + offset}[whence]
        return self._at

    def tell(self) -> int:
        return self._at

    def read(self, length: int = -1) -> bytes:
        asked = len(self._data) - self._at if length is None or length < 0 else length
        end = min(len(self._data), self._at + min(asked, self._most))
        out = self._data[self._at : end]
        self._at = end
        return out


def test_read_fully_reads_until_asked_or_the_end() -> None:
    data = bytes(range(256)) * 40  # 10,240 bytes
    assert read_fully(Trickle(data, 1000), 5000) == data[:5000]
    assert read_fully(Trickle(data, 1000), 20_000) == data  # the end comes first
    stream = Trickle(data, 1000)
    assert read_fully(stream, 0) == b""
    assert read_fully(stream, 10) == data[:10]


class Sized(Trickle):
    def size(self) -> int:
        return len(self._data)


class Flaky(Sized):
    """A store file whose reads fail with ``OSError`` while ``failures`` lasts, as a timed-out GET does."""

    def __init__(self, data: bytes, failures: list[int]) -> None:
        super().__init__(data, len(data))
        self._failures = failures

    def read(self, length: int = -1) -> bytes:
        if self._failures[0] > 0:
            self._failures[0] -= 1
            self._at += 7  # a failed read may have moved the position: the retry starts over from the offset
            raise OSError("AWS Error NETWORK_CONNECTION during GetObject operation: curlCode: 28, Timeout was reached")
        return super().read(length)


def store_with(tmp_path, monkeypatch, stream: Callable[[bytes], Sized]) -> duckdb.DuckDBPyConnection:
    """DuckDB reading ``s3://bucket/t.parquet`` (50,000 rows) from a store whose files are ``stream(bytes)``."""
    (tmp_path / "bucket").mkdir()
    pq.write_table(pa.table({"x": list(range(50_000))}), tmp_path / "bucket" / "t.parquet")

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
