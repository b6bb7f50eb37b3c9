"""The native event builder (native/binlog_events.c) against its twin, EventBuilder's Python path: same bytes.

Transactions of creates, updates (some changing the key), deletes and tombstones over two tables,
with values of every type the row decoders return (None, bool, int to the unsigned 64-bit range,
text with characters JSON must escape, floats including NaN/inf, and a value only orjson writes),
keyless tables, configured keys, excluded columns, skipped operations, a row filter and a mask
(those two keep a table's events in Python): every record (topic, key, value, sequence) must be
what ``HEADWATER_NATIVE=0`` writes, and the native path must have built the events it claims.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import native
from capture.mysql import events
from capture.mysql.binlog.position import BinlogPosition, Gtid
from capture.mysql.binlog.table_map import ColumnShape, ColumnType, TableShape
from capture.mysql.events import EventBuilder
from capture.mysql.streaming.transactions import RowChange, Transaction
from capture.mysql.table_plan import TablePlanner
from capture.mysql.types.values import TypeModes
from core.source_config import ColumnsConfig, MaskConfig

pytestmark = pytest.mark.skipif(native.speedups is None, reason="the native extension is not built")

NOW_US = 1_767_225_600_123_456
#: Column names JSON must escape, beside plain ones.
NAMES = ("id", 'q"uo\\te', "ünï\tcode", "c3", "c4", "c5")
COLUMNS = tuple(ColumnShape(name, ColumnType.VARCHAR, meta=40) for name in NAMES)

_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.text(st.characters(exclude_categories=("Cs",)), max_size=12),
    st.floats(allow_nan=True, allow_infinity=True),
    st.dictionaries(st.text(max_size=3), st.integers(-5, 5), max_size=2),  # written by orjson.dumps
)


def _row(draw: st.DrawFn) -> list[Any]:
    return [draw(_values) for _ in NAMES]


@st.composite
def _changes(draw: st.DrawFn, shapes: tuple[TableShape, ...]) -> list[RowChange]:
    changes = []
    for n in range(draw(st.integers(0, 12))):
        shape = draw(st.sampled_from(shapes))
        op = draw(st.sampled_from("cud"))
        before = None if op == "c" else _row(draw)
        after = None if op == "d" else _row(draw)
        if op == "u" and draw(st.booleans()):
            after = [before[0], *after[1:]]  # type: ignore[index]  # the key kept: an update
        server, when = draw(st.integers(0, 2**32 - 1)), draw(st.integers(0, 2**32 - 1))
        changes.append(RowChange(shape, op, before, after, 4 + 100 * n, draw(st.integers(0, 3)), server, when))
    return changes


def _build(planner: TablePlanner, transaction: Transaction, *, native_path: bool) -> list[Any]:
    builder = EventBuilder("s\u00e9rc", planner.plan, lambda _db, _table: True, native=native_path)
    return list(builder.records(transaction))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_native_records_are_the_python_records(data: st.DataObject) -> None:
    with pytest.MonkeyPatch.context() as monkeypatch:
        _check_native_records(data, monkeypatch)


def _check_native_records(data: st.DataObject, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(events, "_now_us", lambda: NOW_US)
    keyed = TableShape(7, 'sh"op', "orders", COLUMNS, primary_key=data.draw(st.sampled_from([(0,), (0, 2), (3, 0)])))
    keyless = TableShape(8, "shop", "log\u2028s", COLUMNS)
    setting = data.draw(st.sampled_from(["plain", "exclude", "keys", "skip", "filter", "mask"]))
    planner = TablePlanner(
        "s\u00e9rc",
        TypeModes(),
        columns=ColumnsConfig(
            exclude=("shop.log\u2028s.c4", 'sh"op.orders.c5') if setting == "exclude" else (),
            mask={"shop.log\u2028s.c3": MaskConfig(replace="***")} if setting == "mask" else {},
        ),
        keys={"shop.log\u2028s": ("c4", "id")} if setting == "keys" else None,
        filters={'sh"op.orders': "c3 IS NOT NULL"} if setting == "filter" else None,
        skipped_operations=data.draw(st.sampled_from(["c", "u", "d", "cd"])) if setting == "skip" else (),
    )
    changes = data.draw(_changes((keyed, keyless)))
    gtid = data.draw(st.one_of(st.none(), st.builds(Gtid, st.integers(0, 9), st.integers(0, 9), st.integers(0, 99))))
    transaction = Transaction(gtid, 3, 1_767_225_000, "mysql-bin.000002", changes)
    transaction.commit = BinlogPosition("mysql-bin.000002", data.draw(st.integers(4, 2**32 - 1)))

    calls = []
    binlog_events = events._binlog_events
    assert binlog_events is not None

    def counted(*args: Any) -> Any:
        calls.append(args)
        return binlog_events(*args)

    monkeypatch.setattr(events, "_binlog_events", counted)
    expected = _build(planner, transaction, native_path=False)
    assert not calls
    try:
        got = _build(planner, transaction, native_path=True)
    except Exception as exc:  # a value orjson refuses: the Python path must refuse it the same way
        with pytest.raises(type(exc)):
            _build(planner, transaction, native_path=False)
        return
    assert got == expected
    assert all(type(r) is type(e) for r, e in zip(got, expected, strict=True))
    native_tables = {"plain", "exclude", "keys", "skip"} if setting in ("plain", "exclude", "keys", "skip") else set()
    if changes and native_tables:
        assert calls, "the native path built none of the events"
    if setting == "filter":
        assert all(call[2] is keyless for call in calls)
    if setting == "mask":
        assert all(call[2] is keyed for call in calls)


def test_native_records_follow_every_claimed_op(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fixed transaction: create, update, key-changing update, delete; the native path builds all of them."""
    monkeypatch.setattr(events, "_now_us", lambda: NOW_US)
    shape = TableShape(7, "shop", "orders", COLUMNS[:2], primary_key=(0,))
    changes = [
        RowChange(shape, "c", None, [1, "é\n"], 100, 0, 3, 1_767_225_000),
        RowChange(shape, "u", [1, "é\n"], [1, None], 200, 0, 3, 1_767_225_001),
        RowChange(shape, "u", [1, None], [2, 1.5], 200, 1, 3, 1_767_225_001),
        RowChange(shape, "d", [2, 1.5], None, 300, 0, 3, 1_767_225_002),
    ]
    transaction = Transaction(Gtid(0, 1, 5), 3, 1_767_225_000, "mysql-bin.000002", changes)
    transaction.commit = BinlogPosition("mysql-bin.000002", 999)
    planner = TablePlanner("src", TypeModes())
    calls = []
    binlog_events = events._binlog_events
    assert binlog_events is not None

    def counted(*args: Any) -> Any:
        calls.append(args)
        return binlog_events(*args)

    monkeypatch.setattr(events, "_binlog_events", counted)
    got = _build(planner, transaction, native_path=True)
    assert len(calls) == 1
    assert got == _build(planner, transaction, native_path=False)
    assert [r.key for r in got] == [b'{"id":1}'] * 4 + [b'{"id":2}'] * 3
    assert [r.txn_index for r in got] == [0, 1, 2, 2, 3, 4, 4]
