"""The MySQL prerequisite rules on server variables alone."""

from __future__ import annotations

from capture.mysql.prerequisites import ServerFacts, evaluate

GOOD = {
    "version": "10.11.19-MariaDB-log",
    "log_bin": "ON",
    "binlog_format": "ROW",
    "binlog_row_image": "FULL",
    "binlog_row_metadata": "FULL",
    "server_id": "1",
    "log_bin_compress": "OFF",
    "binlog_expire_logs_seconds": "0",
    "expire_logs_days": "0",
}


def test_a_ready_server_has_nothing_to_say() -> None:
    found = evaluate(ServerFacts(GOOD))
    assert found.problems == [] and found.warnings == []


def test_every_setting_is_named_with_its_fix() -> None:
    bad = {**GOOD, "log_bin": "OFF", "binlog_row_image": "MINIMAL", "server_id": "0", "log_bin_compress": "ON"}
    problems = evaluate(ServerFacts(bad)).problems
    assert [p.split(":")[0] for p in problems] == [
        "binary logging is off",
        "binlog_row_image is MINIMAL, capture needs FULL",
        "server_id is 0",
        "log_bin_compress is ON",
    ]
    assert all("SET GLOBAL" in p or "config file" in p for p in problems)


def test_an_old_server_without_row_metadata_is_refused() -> None:
    facts = {k: v for k, v in GOOD.items() if k != "binlog_row_metadata"}
    assert "upgrade the server" in evaluate(ServerFacts(facts)).problems[0]


def test_mysql_without_gtids_and_short_retention_only_warn() -> None:
    mysql = {**GOOD, "version": "8.0.40", "gtid_mode": "OFF", "binlog_expire_logs_seconds": "7200"}
    found = evaluate(ServerFacts(mysql))
    assert found.problems == []
    assert [w.split(":")[0] for w in found.warnings] == ["gtid_mode is OFF", "binlogs are kept only 2 h 0 min"]
    assert evaluate(ServerFacts({**GOOD, "expire_logs_days": "0.5"})).warnings  # MariaDB's older knob
