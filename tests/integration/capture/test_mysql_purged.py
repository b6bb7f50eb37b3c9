"""A binlog purged before MySQL capture read it stops capture in one line naming `source resync`."""

from __future__ import annotations

from pathlib import Path

import pymysql
import pytest
from harness.mariadb import purge_binlogs, start_mariadb_server

from capture.mysql.agent import MySqlAgent
from capture.mysql.binlog.client import BinlogPurgedError
from capture.mysql.settings import MySqlSource
from core.log_config import LogConfig
from log.file.backend import FileLog


def test_a_purged_binlog_stops_capture_naming_resync(tmp_path: Path) -> None:
    server, stop = start_mariadb_server()
    password = server.password
    try:
        with pymysql.connect(**server.connect_args(), autocommit=True) as conn, conn.cursor() as cur:
            cur.execute("CREATE DATABASE p")
            cur.execute("CREATE TABLE p.t (id INT PRIMARY KEY)")
            source = MySqlSource.from_dsn("p", server.dsn("p"), ("t",))
            agent = MySqlAgent(source, FileLog(tmp_path / "log"), LogConfig(), tmp_path / "state")
            agent.run(until_caught_up=True)
            cur.execute("INSERT INTO p.t VALUES (1)")  # in the binlog capture has not read yet
        purge_binlogs(server)
        with pytest.raises(BinlogPurgedError) as raised:
            MySqlAgent(source, FileLog(tmp_path / "log"), LogConfig(), tmp_path / "state").run(until_caught_up=True)
    finally:
        stop()
    message = str(raised.value)
    assert "\n" not in message
    assert "no longer has the binlog" in message and "headwater source resync" in message
    assert password not in message
