"""Binlog event type codes (MySQL's ``Log_event_type``, MariaDB's additions from 160 on)."""

from __future__ import annotations

from enum import IntEnum


class EventType(IntEnum):
    """The event types capture reads; every other type is skipped by its length."""

    QUERY = 2
    STOP = 3
    ROTATE = 4
    INTVAR = 5
    RAND = 13
    USER_VAR = 14
    FORMAT_DESCRIPTION = 15
    XID = 16
    TABLE_MAP = 19
    WRITE_ROWS_V1 = 23
    UPDATE_ROWS_V1 = 24
    DELETE_ROWS_V1 = 25
    INCIDENT = 26
    HEARTBEAT = 27
    ROWS_QUERY = 29
    WRITE_ROWS = 30
    UPDATE_ROWS = 31
    DELETE_ROWS = 32
    MYSQL_GTID = 33
    MYSQL_ANONYMOUS_GTID = 34
    MYSQL_PREVIOUS_GTIDS = 35
    TRANSACTION_PAYLOAD = 40
    MARIADB_ANNOTATE_ROWS = 160
    MARIADB_BINLOG_CHECKPOINT = 161
    MARIADB_GTID = 162
    MARIADB_GTID_LIST = 163
    MARIADB_START_ENCRYPTION = 164
    MARIADB_QUERY_COMPRESSED = 165
    MARIADB_WRITE_ROWS_COMPRESSED_V1 = 169
    MARIADB_UPDATE_ROWS_COMPRESSED_V1 = 170
    MARIADB_DELETE_ROWS_COMPRESSED_V1 = 171


#: Row event type -> the operation it carries ("c", "u", "d").
ROW_OPERATIONS: dict[int, str] = {
    EventType.WRITE_ROWS_V1: "c",
    EventType.WRITE_ROWS: "c",
    EventType.UPDATE_ROWS_V1: "u",
    EventType.UPDATE_ROWS: "u",
    EventType.DELETE_ROWS_V1: "d",
    EventType.DELETE_ROWS: "d",
}

#: Event types whose contents capture cannot read: meeting one stops capture in one line.
UNREADABLE: dict[int, str] = {
    EventType.TRANSACTION_PAYLOAD: "binlog_transaction_compression=ON (set it OFF)",
    EventType.MARIADB_QUERY_COMPRESSED: "log_bin_compress=ON (set it OFF)",
    EventType.MARIADB_WRITE_ROWS_COMPRESSED_V1: "log_bin_compress=ON (set it OFF)",
    EventType.MARIADB_UPDATE_ROWS_COMPRESSED_V1: "log_bin_compress=ON (set it OFF)",
    EventType.MARIADB_DELETE_ROWS_COMPRESSED_V1: "log_bin_compress=ON (set it OFF)",
}
