"""A binlog purged before MySQL capture read it stops capture in one line naming `source resync`.

``status`` and ``/metrics`` say so too: the saved position's binlog is ``purged``
(``headwater_binlog_position_purged 1``).
"""

from __future__ import annotations

from pathlib import Path

import pymysql
import pytest
from harness.mariadb import purge_binlogs, start_mariadb_server

from capture.mysql.agent import MySqlAgent
from capture.mysql.binlog.client import BinlogPurgedError
from capture.mysql.kind import MySqlSourceKind, state_dir
from capture.mysql.settings import MySqlSource
from core.config import load_config
from core.log_config import LogConfig
from log.file.backend import FileLog
from operations.pipeline_metrics import PipelineCollector, Scope


def test_a_purged_binlog_stops_capture_naming_resync(tmp_path: Path) -> None:
    server, stop = start_mariadb_server()
    password = server.password
    try:
        with pymysql.connect(**server.connect_args(), autocommit=True) as conn, conn.cursor() as cur:
            cur.execute("CREATE DATABASE p")
            cur.execute("CREATE TABLE p.t (id INT PRIMARY KEY)")
            (tmp_path / "headwater.yaml").write_text(
                f"project: p\nhome: .\nsources:\n  p: {{kind: mysql, dsn: '{server.dsn('p')}', tables: [p.t]}}\n"
            )
            config = load_config(tmp_path / "headwater.yaml")
            state = state_dir(config, "p")
            source = MySqlSource.from_dsn("p", server.dsn("p"), ("t",))
            agent = MySqlAgent(source, FileLog(tmp_path / "log"), LogConfig(), state)
            agent.run(until_caught_up=True)
            cur.execute("INSERT INTO p.t VALUES (1)")  # in the binlog capture has not read yet
        behind = MySqlSourceKind().status(config, "p")
        assert behind["binlog_status"] == "present" and behind["lag_bytes"] > 0
        purge_binlogs(server)
        with pytest.raises(BinlogPurgedError) as raised:
            MySqlAgent(source, FileLog(tmp_path / "log"), LogConfig(), state).run(until_caught_up=True)
        purged = MySqlSourceKind().status(config, "p")
        gauges = {
            family.name: sample.value
            for family in PipelineCollector(config, Scope(sources=("p",))).collect()
            for sample in family.samples
            if sample.labels.get("source") == "p"
        }
    finally:
        stop()
    assert purged["binlog_status"] == "purged" and purged["lag_bytes"] is None
    assert purged["oldest_binlog"] == purged["binlog_end"].split(":")[0] != purged["position"].split(":")[0]
    assert gauges["headwater_source_up"] == 1 and gauges["headwater_binlog_position_purged"] == 1
    assert "headwater_capture_lag_bytes" not in gauges
    message = str(raised.value)
    assert "\n" not in message
    assert "no longer has the binlog" in message and "headwater source resync" in message
    assert password not in message
