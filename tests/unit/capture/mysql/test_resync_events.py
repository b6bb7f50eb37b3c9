"""A MySQL resync without a server: its deletes' events from a real file log, and the request it records."""

from __future__ import annotations

from pathlib import Path

import orjson

from capture.key_set import KEY_SET_FILE, KeySet
from capture.mysql.binlog.position import BinlogPosition
from capture.mysql.binlog.table_map import ColumnShape, ColumnType, TableShape
from capture.mysql.events import EventBuilder
from capture.mysql.resync import request_resync
from capture.mysql.snapshot import SNAPSHOT_FILE
from capture.mysql.state import STATE_FILE, StreamState, save_state
from capture.mysql.table_plan import TablePlanner
from capture.mysql.types.values import TypeModes
from capture.resync import DELETE_INDEX_BASE, REQUEST_FILE, ResyncRequest, vanished_key_deletes
from log.base import Record, TopicSpec
from log.file.backend import FileLog
from log.partitioner import partition_for

SHAPE = TableShape(
    7,
    "shop",
    "orders",
    (ColumnShape("id", ColumnType.LONG), ColumnShape("note", ColumnType.VARCHAR, meta=40)),
    primary_key=(0,),
)
TOPIC = "src.shop.orders"


def test_vanished_keys_get_debeziums_mysql_delete_with_the_last_image(tmp_path: Path) -> None:
    builder = EventBuilder("src", TablePlanner("src", TypeModes()).plan, lambda _db, _table: True)
    plan = builder.plan_of(SHAPE)
    with FileLog(tmp_path / "log") as log:
        log.create_topic(TopicSpec(TOPIC, partitions=2))
        for commit, (i, note) in enumerate([(1, "a"), (2, "b"), (3, "c"), (2, "b2")], start=10):
            record = builder.read_record(
                plan, {"id": i, "note": note}, commit=commit, index=0, marker="true", ts_us=1, file="f", pos=4
            )
            assert record.key is not None
            log.append(TOPIC, partition_for(record.key, 2), [Record(record.key, record.value)])
        point = BinlogPosition("binlog.000003", 1234)
        with KeySet(tmp_path / KEY_SET_FILE) as present:
            present.add(TOPIC, [orjson.dumps({"id": 1})])

            def delete_value(event: dict, index: int) -> bytes:
                return builder.vanished_delete(
                    event, commit=point.sequence(), index=index, ts_us=5_000_000, file=point.file, pos=point.offset
                )

            out = list(
                vanished_key_deletes(
                    log, TOPIC, present, delete_value, commit_lsn=point.sequence(), first_index=DELETE_INDEX_BASE
                )
            )
    assert [(r.key, r.value is None) for r in out] == [
        (b'{"id":2}', False),
        (b'{"id":2}', True),
        (b'{"id":3}', False),
        (b'{"id":3}', True),
    ]
    deleted = [orjson.loads(r.value) for r in out if r.value is not None]
    assert [d["before"] for d in deleted] == [{"id": 2, "note": "b2"}, {"id": 3, "note": "c"}], "the last images"
    assert all(d["op"] == "d" and d["after"] is None and d["transaction"] is None for d in deleted)
    source = deleted[0]["source"]
    assert (source["connector"], source["name"], source["db"], source["table"]) == ("mysql", "src", "shop", "orders")
    where = ("true", "binlog.000003", 1234, 5_000_000)
    assert (source["snapshot"], source["file"], source["pos"], source["ts_us"]) == where
    assert [(d["source"]["commit_lsn"], d["source"]["txn_index"]) for d in deleted] == [
        (point.sequence(), DELETE_INDEX_BASE),
        (point.sequence(), DELETE_INDEX_BASE + 1),
    ]
    # Field by field the shape of a streamed delete (the envelope and its source block).
    assert list(deleted[0]) == ["before", "after", "source", "op", "ts_ms", "ts_us", "ts_ns", "transaction"]


def test_a_resync_request_forgets_the_positions_and_keeps_the_rest(tmp_path: Path) -> None:
    position = BinlogPosition("binlog.000002", 4711)
    save_state(tmp_path, StreamState(position))
    (tmp_path / SNAPSHOT_FILE).write_text("{}")
    (tmp_path / "spill").mkdir()
    request = request_resync(tmp_path, "source resync", position)
    assert sorted(p.name for p in tmp_path.iterdir()) == [REQUEST_FILE, "spill"]
    assert not (tmp_path / STATE_FILE).exists()
    loaded = ResyncRequest.load(tmp_path)
    assert loaded is not None and (loaded.reason, loaded.lost_from) == ("source resync", "binlog.000002:4711")
    request.clear()
    assert ResyncRequest.load(tmp_path) is None
