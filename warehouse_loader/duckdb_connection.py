"""DuckDB connections that read warehouse tables wherever they live, for every table format.

Tables on an object store are read through the store as an fsspec filesystem over pyarrow's
(:func:`warehouse_loader.object_store.duckdb_filesystem`), so no DuckDB extension is needed;
extension auto-install and auto-load are off on every database, so nothing is downloaded at
run time. Each format registers its tables into such a connection
(:meth:`warehouse_loader.table_format.StoredTable.register`).

Opening an in-memory database costs 50-90 ms here (more than a small table's whole read), a
connection to an open one ~1 ms, and a load opens several per micro-batch. So a process keeps
one database per set of stores and hands out connections to it: what a caller registers and
creates is private to its connection (registered tables, ``CREATE TEMP`` views and tables,
``SET`` of session settings such as the time zone), so concurrent callers never see each
other's. A caller that changes database-wide settings (``query`` locks external access) asks
for a ``private`` database of its own.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterable, Iterator

import duckdb

from core.errors import PYTHON_TRACEBACK
from warehouse_loader.location import TableLocation, storage_error
from warehouse_loader.object_store import duckdb_filesystem

#: Stores (scheme and options of each remote location) -> the process's database reading them.
_DATABASES: dict[frozenset[tuple[str, tuple[tuple[str, str], ...]]], duckdb.DuckDBPyConnection] = {}
_DATABASES_LOCK = threading.Lock()
_DATABASES_PID = os.getpid()


def _database(locations: list[TableLocation]) -> duckdb.DuckDBPyConnection:
    """A new in-memory database (no extension downloads) with a filesystem for each remote store."""
    con = duckdb.connect(":memory:")
    con.execute("SET autoinstall_known_extensions = false")
    con.execute("SET autoload_known_extensions = false")
    # Without its background threads DuckDB's allocator kept what each query freed: a load's driver
    # grew ~15-70 MB with every merge-on-read batch (3.8 GB after 50 batches of 200k changes), and
    # stayed at ~400 MiB with them (bench/RESULTS.md, issue 31).
    con.execute("SET allocator_background_threads = true")
    registered: set[str] = set()
    for location in locations:
        if location.is_remote and location.scheme not in registered:
            filesystem = duckdb_filesystem(location.scheme, location.storage_options or {})
            con.register_filesystem(filesystem)
            registered.update(filesystem.protocol)
    return con


def store_failed(exc: duckdb.Error) -> bool:
    """Whether a DuckDB error is a store's: its own I/O error, or an exception its Python filesystem raised.

    DuckDB reports an exception raised inside a Python filesystem it called (an object store's
    read that timed out after its retries) as a bare ``duckdb.Error`` whose message is that
    exception's traceback.
    """
    return isinstance(exc, duckdb.IOException) or PYTHON_TRACEBACK in str(exc)


@contextlib.contextmanager
def store_errors(where: TableLocation) -> Iterator[None]:
    """Raise a store's DuckDB error in the block (:func:`store_failed`) as :func:`storage_error` at ``where``.

    Other DuckDB errors pass unchanged; the store's is raised ``from None`` (one line naming the store).
    """
    try:
        yield
    except duckdb.Error as exc:
        if not store_failed(exc):
            raise
        raise storage_error(exc, where) from None


def duckdb_connection(locations: Iterable[TableLocation] = (), *, private: bool = False) -> duckdb.DuckDBPyConnection:
    """A connection (time zone UTC) that can read tables at ``locations``; close it when done.

    ``private``: a database of its own (for callers that change database-wide settings);
    otherwise a connection to the process's database for these stores.
    """
    global _DATABASES_PID  # noqa: PLW0603
    wanted = list(locations)
    if private:
        con = _database(wanted)
    else:
        stores = frozenset((loc.scheme, loc.options) for loc in wanted if loc.is_remote)
        with _DATABASES_LOCK:
            if os.getpid() != _DATABASES_PID:  # a forked child never uses its parent's database
                _DATABASES.clear()
                _DATABASES_PID = os.getpid()
            if stores not in _DATABASES:
                _DATABASES[stores] = _database(wanted)
            con = _DATABASES[stores].cursor()
    con.execute("SET TimeZone = 'UTC'")
    return con
