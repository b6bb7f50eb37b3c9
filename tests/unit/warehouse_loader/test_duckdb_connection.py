"""The process's DuckDB databases: settings every one of them runs with."""

from __future__ import annotations

import pytest

from warehouse_loader.duckdb_connection import duckdb_connection


@pytest.mark.parametrize("private", [False, True])
def test_every_database_returns_freed_memory_and_downloads_nothing(private: bool) -> None:
    """Background allocator threads: without them a load's driver kept every merge's freed memory (issue 31)."""
    con = duckdb_connection(private=private)
    try:
        settings = dict(
            con.execute(
                "SELECT name, value FROM duckdb_settings() WHERE name IN ('allocator_background_threads', "
                "'autoinstall_known_extensions', 'autoload_known_extensions', 'TimeZone')"
            ).fetchall()
        )
    finally:
        con.close()
    assert settings == {
        "allocator_background_threads": "true",
        "autoinstall_known_extensions": "false",
        "autoload_known_extensions": "false",
        "TimeZone": "UTC",
    }
