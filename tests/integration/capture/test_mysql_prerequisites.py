"""MySQL source prerequisites on a real MariaDB: each miss named with its fix, privileges tried, not read."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from harness.mariadb import start_mariadb_server

from capture.mysql.binlog.client import ServerAddress
from capture.mysql.prerequisites import check


@pytest.fixture(scope="module")
def misconfigured() -> Iterator[Any]:
    server, stop = start_mariadb_server(
        settings={"binlog_format": "STATEMENT", "binlog_row_metadata": "MINIMAL", "binlog_expire_logs_seconds": "3600"}
    )
    try:
        yield server
    finally:
        stop()


def test_a_misconfigured_server_is_named_setting_by_setting(misconfigured) -> None:
    found = check(
        ServerAddress(misconfigured.host, misconfigured.port, "root", misconfigured.password), [], server_id=99
    )
    assert found.problems == [
        "binlog_format is STATEMENT, capture needs ROW: "
        "SET GLOBAL binlog_format = 'ROW' and in the server's config file",
        "binlog_row_metadata is MINIMAL, capture needs FULL: "
        "SET GLOBAL binlog_row_metadata = 'FULL' and in the server's config file",
    ]
    assert len(found.warnings) == 1
    assert "kept only 1 h 0 min" in found.warnings[0] and "source resync" in found.warnings[0]


def test_each_missing_privilege_is_named_with_its_grant(mariadb_database, unique_name) -> None:
    server, db = mariadb_database.server, mariadb_database.name
    user = unique_name("cap")
    mariadb_database.script(
        "CREATE TABLE allowed (id INT PRIMARY KEY)",
        "CREATE TABLE hidden (id INT PRIMARY KEY)",
        f"CREATE USER '{user}'@'127.0.0.1' IDENTIFIED BY 'pw'",
        f"GRANT SELECT ON `{db}`.allowed TO '{user}'@'127.0.0.1'",
    )
    address = ServerAddress(server.host, server.port, user, "pw")
    tables = [f"{db}.allowed", f"{db}.hidden"]
    try:
        assert check(address, tables, server_id=98).problems == [
            f"{user} may not read the binlog position: GRANT BINLOG MONITOR ON *.* TO {user}",
            f"{user} may not read {db}.hidden: GRANT SELECT ON `{db}`.`hidden` TO {user}",
        ]
        mariadb_database.script(
            f"GRANT BINLOG MONITOR ON *.* TO '{user}'@'127.0.0.1'",
            f"GRANT SELECT ON `{db}`.hidden TO '{user}'@'127.0.0.1'",
        )
        # Only a binlog dump shows the last one: the account may look at the binlog, not read it.
        assert check(address, tables, server_id=98).problems == [
            f"{user} may not read the binlog: GRANT REPLICATION SLAVE ON *.* TO {user}"
        ]
        mariadb_database.script(f"GRANT REPLICATION SLAVE ON *.* TO '{user}'@'127.0.0.1'")
        found = check(address, tables, server_id=98)
        assert found.problems == [] and found.warnings == []
    finally:
        mariadb_database.script(f"DROP USER '{user}'@'127.0.0.1'")
