"""EmbeddedPostgres parts that need no server: binary discovery, DSNs, ports, names."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from core.errors import PermanentError
from operations.embedded_postgres import (
    EmbeddedPostgres,
    EmbeddedPostgresError,
    PostgresNotInstalledError,
    find_postgres_bin,
    free_port,
)


def fake_bin(directory: Path, names=("initdb", "pg_ctl", "postgres")) -> Path:
    directory.mkdir(parents=True)
    for name in names:
        path = directory / name
        path.write_text("#!/bin/sh\n")
        path.chmod(0o755)
    return directory


@pytest.fixture(autouse=True)
def no_override(monkeypatch):
    monkeypatch.delenv("HEADWATER_PG_BIN", raising=False)


def test_missing_binaries_raise_one_line_saying_how_to_install(tmp_path) -> None:
    with pytest.raises(PostgresNotInstalledError) as caught:
        find_postgres_bin(path=str(tmp_path), search_dirs=[str(tmp_path / "postgresql" / "*" / "bin")], use_wheel=False)
    message = str(caught.value)
    assert "\n" not in message
    assert "apt-get install postgresql-15" in message
    assert "HEADWATER_PG_BIN" in message
    assert isinstance(caught.value, PermanentError)


def test_a_directory_missing_one_binary_is_skipped(tmp_path) -> None:
    fake_bin(tmp_path / "partial", names=("initdb", "pg_ctl"))
    with pytest.raises(PostgresNotInstalledError):
        find_postgres_bin(path=str(tmp_path / "partial"), search_dirs=[], use_wheel=False)


def test_path_wins_over_search_dirs(tmp_path) -> None:
    on_path = fake_bin(tmp_path / "onpath")
    fake_bin(tmp_path / "postgresql" / "16" / "bin")
    found = find_postgres_bin(path=str(on_path), search_dirs=[str(tmp_path / "postgresql" / "*" / "bin")])
    assert found == on_path


def test_newest_version_of_search_dirs_wins(tmp_path) -> None:
    for version in ("9.6", "15", "14"):
        fake_bin(tmp_path / "postgresql" / version / "bin")
    found = find_postgres_bin(path="", search_dirs=[str(tmp_path / "postgresql" / "*" / "bin")])
    assert found == tmp_path / "postgresql" / "15" / "bin"


def test_env_override_wins(tmp_path, monkeypatch) -> None:
    chosen = fake_bin(tmp_path / "chosen")
    monkeypatch.setenv("HEADWATER_PG_BIN", str(chosen))
    assert find_postgres_bin(path=str(fake_bin(tmp_path / "other")), search_dirs=[]) == chosen


def test_free_port_is_bindable() -> None:
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_port_before_start_is_an_error(tmp_path) -> None:
    with pytest.raises(EmbeddedPostgresError, match="start"):
        _ = EmbeddedPostgres(tmp_path / "data").port


def test_dsn_quotes_user_password_and_database(tmp_path) -> None:
    server = EmbeddedPostgres(tmp_path / "data", port=5999)
    server._port = 5999  # as after start(); no server needed to format a DSN
    dsn = server.dsn("my db", user="us@r", password="p:w/d")
    assert dsn == "postgresql://us%40r:p%3Aw%2Fd@127.0.0.1:5999/my%20db"


def test_initdb_refuses_a_non_empty_directory(tmp_path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "something").write_text("x")
    server = EmbeddedPostgres(data, bin_dir=fake_bin(tmp_path / "bin"))
    with pytest.raises(EmbeddedPostgresError, match="not empty"):
        server.start()
    assert sorted(os.listdir(data)) == ["something"]
