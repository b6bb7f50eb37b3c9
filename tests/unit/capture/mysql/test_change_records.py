"""MySQL change records: each value is the bytes ``orjson.dumps`` writes for Debezium's dict of the change."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from capture.mysql.binlog.events import Query
from capture.mysql.binlog.position import BinlogPosition, Gtid
from capture.mysql.binlog.table_map import ColumnShape, ColumnType, TableShape
from capture.mysql.events import EventBuilder
from capture.mysql.streaming.transactions import RowChange, Statement, Transaction
from capture.mysql.table_plan import TablePlanner
from capture.mysql.types.values import TypeModes
from log.envelope import EVENT_VERSION

SHAPE = TableShape(
    7,
    "shop",
    'or"ders',  # a name JSON must escape
    (ColumnShape("id", ColumnType.LONG), ColumnShape("note", ColumnType.VARCHAR, meta=40)),
    primary_key=(0,),
)


def _expected(
    op: str,
    before: Any,
    after: Any,
    item: RowChange | Statement,
    transaction: Transaction,
    index: int,
    order: int,
    ts_us_now: int,
) -> dict[str, Any]:
    """The value as a dict, field by field in Debezium's order (the form the builder wrote before its template)."""
    ts_us = item.timestamp * 1_000_000
    assert transaction.commit is not None
    return {
        "before": before,
        "after": after,
        "source": {
            "version": EVENT_VERSION,
            "connector": "mysql",
            "name": "src",
            "ts_ms": ts_us // 1000,
            "snapshot": "false",
            "db": "shop",
            "sequence": None,
            "ts_us": ts_us,
            "ts_ns": ts_us * 1000,
            "schema": None,
            "table": 'or"ders',
            "server_id": item.server_id,
            "gtid": None if transaction.gtid is None else str(transaction.gtid),
            "file": transaction.file,
            "pos": item.event_start,
            "row": item.row if isinstance(item, RowChange) else 0,
            "thread": None,
            "query": None,
            "commit_lsn": transaction.commit.sequence(),
            "txn_index": index,
        },
        "op": op,
        "ts_ms": ts_us_now // 1000,
        "ts_us": ts_us_now,
        "ts_ns": ts_us_now * 1000,
        "transaction": {
            "id": str(transaction.gtid) if transaction.gtid is not None else str(transaction.commit),
            "total_order": index + 1,
            "data_collection_order": order,
        },
    }


@pytest.mark.parametrize("gtid", [Gtid(0, 1, 5), None])
def test_values_are_orjsons_bytes_of_debeziums_dict(gtid: Gtid | None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("capture.mysql.events._now_us", lambda: 1_767_225_600_123_456)
    changes = [
        RowChange(SHAPE, "c", None, [1, "é"], 100, 0, 3, 1_767_225_000),
        RowChange(SHAPE, "u", [1, "é"], [1, None], 200, 0, 3, 1_767_225_001),
        RowChange(SHAPE, "u", [1, None], [2, "moved"], 200, 1, 3, 1_767_225_001),  # key change: d, c
        RowChange(SHAPE, "d", [2, "moved"], None, 300, 0, 3, 1_767_225_002),
    ]
    truncate = Statement(Query("shop", 'TRUNCATE `or"ders`', 1, 0), 400, ("shop", 'or"ders'), 3, 1_767_225_003)
    transaction = Transaction(gtid, 3, 1_767_225_000, "mysql-bin.000002", changes, [truncate])
    transaction.commit = BinlogPosition("mysql-bin.000002", 999)
    builder = EventBuilder("src", TablePlanner("src", TypeModes()).plan, lambda _db, _table: True)
    records = list(builder.records(transaction))

    def image(row: list[Any] | None) -> dict[str, Any] | None:
        return None if row is None else {"id": row[0], "note": row[1]}

    c, u, k = changes[0], changes[1], changes[2]
    expected = [
        ("c", None, image(c.after), c, 0),
        ("u", image(u.before), image(u.after), u, 1),
        ("d", image(k.before), None, k, 2),
        ("c", None, image(k.after), k, 3),
        ("d", image(changes[3].before), None, changes[3], 4),
        ("t", None, None, truncate, 5),
    ]
    values = [r for r in records if r.value is not None]
    assert len(values) == len(expected)
    for record, (op, before, after, item, index) in zip(values, expected, strict=True):
        want = _expected(op, before, after, item, transaction, index, index + 1, 1_767_225_600_123_456)
        assert record.value == orjson.dumps(want)
        assert record.txn_index == index
    keys = [b'{"id":1}'] * 4 + [b'{"id":2}'] * 3  # a delete and its tombstone share the key
    assert [r.key for r in records] == [*keys, None]
