"""The MySQL incremental snapshot window without a server: when a chunk is emitted, at which sequence."""

from __future__ import annotations

from pathlib import Path

import orjson

from capture.incremental_queue import STATE_FILE, IncrementalState, SnapshotTable
from capture.mysql.binlog.position import BinlogPosition
from capture.mysql.binlog.table_map import ColumnShape, ColumnType, TableShape
from capture.mysql.events import EventBuilder
from capture.mysql.incremental import (
    INCREMENTAL_INDEX_BASE,
    ChunkWindow,
    MySqlIncremental,
    chunk_statement,
    first_index,
)
from capture.mysql.settings import MySqlSource
from capture.mysql.signals import MySqlSignalTable, condition_problem
from capture.mysql.table_plan import TablePlanner
from capture.mysql.types.values import TypeModes
from capture.records import OutRecord
from capture.resync import DELETE_INDEX_BASE
from log.sequence import Sequence as Seq

SHAPE = TableShape(
    7,
    "shop",
    "orders",
    (ColumnShape("id", ColumnType.LONG), ColumnShape("note", ColumnType.VARCHAR, meta=40)),
    primary_key=(0,),
)
TWO_KEYS = TableShape(
    8,
    "shop",
    "lines",
    (ColumnShape("a", ColumnType.LONG), ColumnShape("b", ColumnType.LONG), ColumnShape("n", ColumnType.LONG)),
    primary_key=(0, 1),
)
SOURCE = MySqlSource.from_dsn("src", "mysql://u:p@127.0.0.1:1/shop", ("shop.orders", "shop.signals"))
BUILDER = EventBuilder("src", TablePlanner("src", TypeModes()).plan, lambda _db, _table: True)
P = BinlogPosition("binlog.000003", 5000)


def window(rows: dict[int, str], *, last: bool = False) -> ChunkWindow:
    plan = BUILDER.plan_of(SHAPE)
    images = {orjson.dumps({"id": k}): {"id": k, "note": v} for k, v in rows.items()}
    return ChunkWindow(P, plan, images, [str(max(rows))] if rows else None, last)


def snapshotter(tmp_path: Path) -> MySqlIncremental:
    incremental = MySqlIncremental(SOURCE, BUILDER, tmp_path, lambda _plan: None)
    incremental.request([SnapshotTable("shop.orders")], "r1")
    return incremental


def test_the_window_is_due_once_the_stream_passes_the_point() -> None:
    chunk = window({1: "a"})
    assert not chunk.due_before(BinlogPosition("binlog.000003", 4000))
    assert not chunk.due_before(P), "a transaction ending at the point is in the chunk's view"
    assert chunk.due_before(BinlogPosition("binlog.000003", 5001))
    assert chunk.due_before(BinlogPosition("binlog.000004", 4)), "a later file is later, whatever its offset"
    assert not chunk.due_at(BinlogPosition("binlog.000003", 4999))
    assert chunk.due_at(P)


def test_chunk_rows_sort_between_the_transactions_around_the_point() -> None:
    rows = window({1: "a", 2: "b"}).records(BUILDER, first_index=INCREMENTAL_INDEX_BASE, ts_us=1)
    at_point = Seq(P.sequence(), 3)  # the last event of a transaction committed at the point
    after = Seq(BinlogPosition("binlog.000003", 5001).sequence(), 0)
    sequences = [Seq(r.commit_lsn, r.txn_index) for r in rows]
    assert all(at_point < s < after for s in sequences)
    assert sequences == sorted(sequences) and all(s.txn_index < DELETE_INDEX_BASE for s in sequences)
    values = [orjson.loads(r.value or b"") for r in rows]
    assert [(v["op"], v["after"], v["source"]["snapshot"]) for v in values] == [
        ("r", {"id": 1, "note": "a"}, "incremental"),
        ("r", {"id": 2, "note": "b"}, "incremental"),
    ]
    assert values[0]["source"]["file"] == P.file and values[0]["source"]["pos"] == P.offset


def test_a_later_chunk_at_the_same_point_indexes_past_the_rows_the_log_holds() -> None:
    assert first_index(P, None) == INCREMENTAL_INDEX_BASE
    assert first_index(P, Seq(P.sequence(), 7)) == INCREMENTAL_INDEX_BASE, "a streamed transaction at the point"
    held = Seq(P.sequence(), INCREMENTAL_INDEX_BASE + 1023)
    assert first_index(P, held) == INCREMENTAL_INDEX_BASE + 1024
    assert first_index(BinlogPosition("binlog.000003", 6000), held) == INCREMENTAL_INDEX_BASE


def replay(events: list[tuple[str, int, str | None]]) -> dict[int, str | None]:
    """The state a log's events leave per key, in log order (``r``/``c``/``u`` set, ``d`` deletes)."""
    state: dict[int, str | None] = {}
    for op, key, value in events:
        state[key] = None if op == "d" else value
    return state


def test_streamed_changes_around_the_point_and_the_chunk_leave_the_source_state(tmp_path: Path) -> None:
    """The agent's rule: before each committed transaction ask ``before``; between transactions ask ``at``."""
    incremental = snapshotter(tmp_path)
    # The view at P: key 1 updated by a transaction at P (streamed before), key 3 deleted before P.
    incremental._chunk = window({1: "a2", 2: "b"})
    streamed = [
        (BinlogPosition("binlog.000003", 4500), [("c", 3, "c"), ("d", 3, None)]),
        (P, [("u", 1, "a2")]),
        (BinlogPosition("binlog.000003", 6000), [("u", 2, "b2"), ("d", 1, None)]),
        (BinlogPosition("binlog.000003", 7000), [("c", 1, "a3")]),
    ]
    log: list[tuple[str, int, str | None]] = []
    for commit, changes in streamed:
        due = incremental.before(commit, None)
        for record in due.rows if due is not None else ():
            value = orjson.loads(record.value or b"")
            log.append(("r", value["after"]["id"], value["after"]["note"]))
        log.extend(changes)
    assert replay(log) == {1: "a3", 2: "b2", 3: None}
    # No snapshot row after a newer change of its key: each r precedes the key's changes past P.
    assert [e for e in log if e[0] == "r"] == [("r", 1, "a2"), ("r", 2, "b")]
    assert log.index(("r", 1, "a2")) < log.index(("d", 1, None))
    assert log.index(("r", 2, "b")) < log.index(("u", 2, "b2"))


def test_progress_is_saved_only_after_the_append(tmp_path: Path) -> None:
    incremental = snapshotter(tmp_path)
    incremental._chunk = window({1: "a", 2: "b"})
    assert incremental.at(BinlogPosition("binlog.000003", 4999), None) is None
    due = incremental.at(P, None)
    assert due is not None and len(due.rows) == 2 and due.schema is None
    assert not incremental.wants_chunk(), "the next chunk waits until these rows are durable"
    assert IncrementalState.load(tmp_path / STATE_FILE).tables[0].last_key is None
    incremental.flushed()
    assert IncrementalState.load(tmp_path / STATE_FILE).tables[0].last_key == ["2"]
    assert incremental.wants_chunk()
    incremental._chunk = window({3: "c"}, last=True)
    incremental.at(P, None)
    incremental.flushed()
    assert IncrementalState.load(tmp_path / STATE_FILE).tables == [] and not incremental.pending


def test_a_lost_connection_forgets_the_chunk_in_flight(tmp_path: Path) -> None:
    incremental = snapshotter(tmp_path)
    incremental._chunk = window({1: "a"})
    incremental.reset()
    assert incremental.at(P, None) is None and incremental.wants_chunk()


def test_chunk_statements_range_over_the_primary_key() -> None:
    plan = BUILDER.plan_of(SHAPE)
    first, params, converters = chunk_statement(plan, SOURCE, after=None, condition=None, limit=10)
    assert first == "SELECT `id`, `note` FROM `shop`.`orders` ORDER BY `id` LIMIT 10" and params == []
    assert len(converters) == 2
    later, params, _ = chunk_statement(plan, SOURCE, after=["7"], condition="note <> 'x'", limit=10)
    assert later.endswith("WHERE ((`id` > %s)) AND (note <> 'x') ORDER BY `id` LIMIT 10") and params == ["7"]
    two = BUILDER.plan_of(TWO_KEYS)
    statement, params, _ = chunk_statement(two, SOURCE, after=["1", "5"], condition=None, limit=3)
    assert "WHERE ((`a` > %s) OR (`a` = %s AND `b` > %s)) ORDER BY `a`, `b` LIMIT 3" in statement
    assert params == ["1", "1", "5"]


def test_additional_conditions_cannot_leave_their_parentheses() -> None:
    assert condition_problem("id > 3 AND note IN ('a)', \"b(\")") is None
    assert condition_problem("id > 0) OR (true") == "a ')' closes a parenthesis that was not opened"
    assert condition_problem("(id > 0") == "a '(' is not closed"
    assert condition_problem("id > 0; DROP TABLE t") == "';' is not allowed in a condition"
    assert condition_problem("id > 0 -- )") == "comments are not allowed in a condition"
    assert condition_problem("note = 'it\\'s'") is None


def test_signals_are_the_inserts_into_the_signal_table() -> None:
    signals = MySqlSignalTable(SOURCE, "shop.signals")

    def event(op: str, after: dict | None) -> bytes:
        return orjson.dumps({"op": op, "after": after, "before": None})

    signals.collect(
        [
            OutRecord("src.shop.orders", b"{}", event("c", {"id": "x", "type": "log", "data": "{}"}), 9, 0),
            OutRecord("src.shop.signals", b"{}", event("c", {"id": "s1", "type": "log", "data": '{"m":1}'}), 9, 1),
            OutRecord("src.shop.signals", b"{}", event("u", {"id": "s1", "type": "log", "data": None}), 9, 2),
            OutRecord("src.shop.signals", b"{}", None, 9, 3),
        ]
    )
    found = signals._found
    assert [(s.id, s.type, s.data, s.sequence) for s in found] == [("s1", "log", '{"m":1}', Seq(9, 1))]
