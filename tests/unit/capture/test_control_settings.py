"""Capture controls without services: config keys, row filter conditions, transaction records, markers, signals."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import orjson
import pytest

from capture.errors import ColumnSettingError
from capture.postgres.decoding.pgoutput_messages import (
    Insert,
    LogicalMessage,
    Relation,
    RelationColumn,
    ReplicaIdentity,
    Update,
)
from capture.postgres.registration.row_filters import condition_problem, sync_publication_filters
from capture.postgres.streaming.markers import MARKER_PREFIX, is_marker, marker_content, marker_of
from capture.postgres.streaming.signals import SignalTable
from capture.postgres.streaming.transactions import Transaction
from capture.records import OutRecord
from capture.transaction_records import TransactionBoundaries, transaction_topic
from core.config import parse_config
from core.errors import ConfigError
from log.sequence import Lsn
from log.sequence import Sequence as Seq


def source_error(**settings: object) -> str:
    raw = {"project": "p", "sources": {"s": {"dsn": "postgresql://h/db", "tables": ["public.t"], **settings}}}
    with pytest.raises(ConfigError) as refused:
        parse_config(raw, Path("headwater.yaml"), env={"SALT": "x"})
    assert "\n" not in str(refused.value)
    return str(refused.value)


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        (
            {"columns": {"mask": {"public.t.c": {"hash": "sha3", "salt": "x"}}}},
            "mask.public.t.c.hash: must be 'sha256'",
        ),
        ({"columns": {"mask": {"public.t.c": {"hash": "sha256"}}}}, "a hash mask needs a 'salt'"),
        ({"columns": {"mask": {"public.t.c": {"truncate": 2, "replace": "*"}}}}, "give exactly one of 'hash'"),
        ({"columns": {"mask": {"public.t.c": {"replace": "*", "salt": "x"}}}}, "'salt' and 'version' belong to a hash"),
        ({"columns": {"mask": {"public.t": {"replace": "*"}}}}, "'public.t' must be written schema.table.column"),
        (
            {"columns": {"exclude": ["public.t.c"], "mask": {"public.t.c": {"replace": "*"}}}},
            "both masked and excluded",
        ),
        ({"columns": {"include": ["public.t.a"], "exclude": ["public.t.b"]}}, "in both 'include' and 'exclude'"),
        ({"columns": {"include": ["public.t.a"], "mask": {"public.t.b": {"replace": "*"}}}}, "not in 'include'"),
        ({"keys": {"public.t": ["c"]}, "columns": {"exclude": ["public.t.c"]}}, "key column 'c' is not captured"),
        ({"keys": {"public.t": ["c"]}, "columns": {"mask": {"public.t.c": {"truncate": 1}}}}, "would merge distinct"),
        ({"filters": {"public.t": "  "}}, "filters: public.t: the filter is empty"),
        ({"filters": {"t": "id > 1"}}, "'t' must be written schema.table"),
        ({"skipped_operations": ["x"]}, "skipped_operations[0]: must be 'c', 'u', 'd' or 't'"),
        ({"skipped_operations": ["c", "c"]}, "list each operation once"),
        ({"signal_table": "signals"}, "signal_table: 'signals' must be written schema.table"),
        ({"transactions": "maybe"}, "sources.s.transactions"),
    ],
)
def test_bad_settings_are_one_line_naming_the_field(settings: dict[str, object], expected: str) -> None:
    assert expected in source_error(**settings)


def test_the_settings_parse() -> None:
    raw = {
        "project": "p",
        "sources": {
            "s": {
                "dsn": "postgresql://h/db",
                "tables": ["public.t"],
                "columns": {
                    "include": ["public.t.id", "public.t.e"],
                    "mask": {"public.t.e": {"hash": "md5", "salt": "${SALT}"}},
                },
                "keys": {"public.t": ["e"]},
                "filters": {"public.t": "id > 1"},
                "skipped_operations": ["t", "d"],
                "transactions": True,
                "signal_table": "public.sig",
            }
        },
    }
    source = parse_config(raw, Path("headwater.yaml"), env={"SALT": "pepper"}).sources["s"]
    mask = source.columns.mask["public.t.e"]
    assert mask.kind == "hash" and mask.version == 2 and mask.salt is not None
    assert "pepper" not in repr(source)  # the salt is a secret
    assert source.columns.captures("public.t", "e") and not source.columns.captures("public.t", "other")
    assert source.columns.captures("public.u", "anything")
    assert source.skipped_operations == ("t", "d") and source.transactions and source.signal_table == "public.sig"


@pytest.mark.parametrize(
    ("condition", "problem"),
    [
        ("id > 1", None),
        ("label = 'a;b -- (c'", None),
        ('"we""ird;" > 0 AND (x IN (1, 2))', None),
        ("body = $tag$ ; ) $tag$", None),
        ("s = E'it\\'s ;'", None),
        ("id > 1; DROP TABLE t", "';' is not allowed"),
        ("id > 1) OR (true", "closes a parenthesis that was not opened"),
        ("(id > 1", "'(' is not closed"),
        ("id > 1 -- comment", "comments are not allowed"),
        ("id > 1 /* c */", "comments are not allowed"),
        ("label = 'open", "quote is not closed"),
        ("x = $a$ never", "dollar quote $a$ is not closed"),
    ],
)
def test_a_condition_is_one_expression(condition: str, problem: str | None) -> None:
    found = condition_problem(condition)
    assert (found is None) if problem is None else (problem in str(found))


def test_row_filters_before_postgresql_15_are_refused_in_one_line() -> None:
    rows = SimpleNamespace(fetchall=lambda: [])
    old_server = SimpleNamespace(
        info=SimpleNamespace(server_version=140011, parameter_status=lambda _name: "14.11"),
        execute=lambda *_args: rows,
    )
    with pytest.raises(ColumnSettingError) as refused:
        sync_publication_filters(old_server, "shop", "pub", {"public.t": "id > 1"})  # type: ignore[arg-type]
    assert str(refused.value) == (
        "sources.shop.filters.public.t: row filters need PostgreSQL 15 or later (the source runs 14.11); "
        "remove the filters or upgrade"
    )


def _record(topic: str, index: int, *, value: bool = True, table: str = "a") -> OutRecord:
    body = orjson.dumps({"source": {"schema": "public", "table": table}}) if value else None
    return OutRecord(topic, b"k", body, 0x500, index)


def test_begin_and_end_records() -> None:
    txn = Transaction(571, Lsn(0x500), Lsn(0x508), 1_486_500_577_125_000)
    boundaries = TransactionBoundaries("shop")
    events = [
        _record("shop.public.a", 0),
        _record("shop.public.a", 1),
        _record("shop.public.a", 1, value=False),  # a tombstone
        _record("shop.message", 2),
        _record("shop.public.a.quarantine", 3),
        _record("shop.public.b", 4, table="b"),
    ]
    result = boundaries.records(txn, events)
    assert result is not None
    begin, end = result
    assert begin.topic == end.topic == transaction_topic("shop") == "shop.transaction"
    assert begin.key == end.key == b'{"id":"571:1280"}'
    assert (begin.commit_lsn, begin.txn_index, end.commit_lsn, end.txn_index) == (0x500, 0, 0x500, 5)
    assert begin.value == (
        b'{"status":"BEGIN","id":"571:1280","event_count":null,"data_collections":null,"ts_ms":1486500577125}'
    )
    assert orjson.loads(end.value or b"") == {
        "status": "END",
        "id": "571:1280",
        "event_count": 4,
        "data_collections": [
            {"data_collection": "public.a", "event_count": 2},
            {"data_collection": "message", "event_count": 1},
            {"data_collection": "public.b", "event_count": 1},
        ],
        "ts_ms": 1486500577125,
    }
    assert boundaries.records(txn, [_record("shop.public.a.quarantine", 0)]) is None


def test_markers_have_one_prefix() -> None:
    assert marker_content("caught-up", "abc") == "caught-up abc" and marker_content("heartbeat") == "heartbeat"
    message = LogicalMessage(False, Lsn(8), MARKER_PREFIX, b"snapshot-window-open 12ab")
    assert marker_of(message) == ("snapshot-window-open", "12ab")
    assert marker_of(LogicalMessage(False, Lsn(8), "app", b"x")) is None
    assert is_marker("headwater") and is_marker("headwater.heartbeat")  # the prefix of earlier versions too
    assert not is_marker("headwaters") and not is_marker("app.headwater")


def test_signals_are_the_rows_inserted_into_the_signal_table() -> None:
    columns = (RelationColumn(True, "id", 1043, 46), RelationColumn(False, "data", 1043, -1))
    signal_columns = (*columns[:1], RelationColumn(False, "type", 1043, 36), columns[1])
    table = Relation(9, "public", "signals", ReplicaIdentity.DEFAULT, signal_columns)
    other = Relation(10, "public", "other", ReplicaIdentity.DEFAULT, columns)
    signals = SignalTable("shop", "public.signals", "pub")
    txn = Transaction(
        5,
        Lsn(0x900),
        Lsn(0x908),
        0,
        [
            table,
            other,
            Insert(10, ("x", "{}")),
            Insert(9, ("s1", "log", '{"message": "hi"}')),
            Update(9, None, ("s1", "log", "{}")),
            Insert(9, ("s2", "pause-snapshot", None)),
        ],
    )
    found = signals.signals_in(txn)
    assert [(s.id, s.type, s.data, s.sequence) for s in found] == [
        ("s1", "log", '{"message": "hi"}', Seq(0x900, 3)),
        ("s2", "pause-snapshot", None, Seq(0x900, 5)),
    ]
