"""The binlog backlog of a saved position: lag across files, headroom before it, purged positions."""

from __future__ import annotations

from capture.mysql.backlog import BinlogBacklog, BinlogFile, ServerBinlogs, binlog_backlog
from capture.mysql.binlog.position import BinlogPosition

FILES = (BinlogFile("binlog.000003", 1000), BinlogFile("binlog.000004", 2000), BinlogFile("binlog.000005", 700))
SERVER = ServerBinlogs(FILES, BinlogPosition("binlog.000005", 700), expire_s=86400)


def at(file: str, offset: int) -> BinlogBacklog:
    return binlog_backlog(BinlogPosition(file, offset), SERVER)


def test_a_position_in_the_current_file_lags_by_the_offsets_difference() -> None:
    assert at("binlog.000005", 650) == BinlogBacklog(True, 50, 3000, 2, "binlog.000003")
    assert at("binlog.000005", 700).lag_bytes == 0


def test_the_lag_counts_the_rest_of_the_file_every_file_between_and_the_end_offset() -> None:
    # 1000 - 400 of 000003, all 2000 of 000004, 700 into 000005.
    assert at("binlog.000003", 400) == BinlogBacklog(True, 600 + 2000 + 700, 0, 0, "binlog.000003")
    assert at("binlog.000004", 1500) == BinlogBacklog(True, 500 + 700, 1000, 1, "binlog.000003")


def test_a_position_whose_file_is_gone_is_purged() -> None:
    assert at("binlog.000002", 400) == BinlogBacklog(False, None, 0, 0, "binlog.000003")


def test_the_current_file_not_listed_yet_still_counts() -> None:
    server = ServerBinlogs(FILES[:2], BinlogPosition("binlog.000005", 90))
    assert binlog_backlog(BinlogPosition("binlog.000005", 4), server) == BinlogBacklog(
        True, 86, 3000, 2, "binlog.000003"
    )
    assert binlog_backlog(BinlogPosition("binlog.000004", 1990), server).lag_bytes == 10 + 90
