import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from capture.postgres.events.source_block import postgres_source
from log.envelope import ChangeEvent, Op, SnapshotMarker, decode_key, decode_value, encode_key, encode_value
from log.sequence import Lsn, Sequence


def test_lsn_parse_format_order():
    lsn = Lsn.parse("16/B374D848")
    assert lsn.value == (0x16 << 32) | 0xB374D848
    assert str(lsn) == "16/B374D848"
    assert Lsn.parse("0/1") < Lsn.parse("1/0")
    with pytest.raises(ValueError, match="not an LSN"):
        Lsn.parse("16-B3")


@given(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1), st.integers(0, 10**9), st.integers(0, 10**9))
def test_sequence_sortable_orders_like_sequence(a_lsn, b_lsn, a_idx, b_idx):
    a, b = Sequence(a_lsn, a_idx), Sequence(b_lsn, b_idx)
    assert (a < b) == (a.sortable() < b.sortable())
    assert Sequence.from_sortable(a.sortable()) == a


def test_event_round_trip_and_debezium_shape():
    source = postgres_source(
        name="shop",
        db="shop",
        schema="public",
        table="customers",
        tx_id=777,
        lsn=24023128,
        commit_lsn=24023200,
        txn_index=3,
        ts_us=1_700_000_000_123_456,
        last_commit_lsn=24023000,
    )
    event = ChangeEvent(
        op=Op.UPDATE, source=source, before=None, after={"id": 1, "email": "a@b"}, ts_us=1_700_000_000_200_000
    )
    raw = encode_value(event)
    value = orjson.loads(raw)
    assert list(value) == ["before", "after", "source", "op", "ts_ms", "ts_us", "ts_ns", "transaction"]
    assert value["op"] == "u"
    assert value["ts_ns"] == 1_700_000_000_200_000_000
    assert value["source"]["connector"] == "postgresql"
    assert value["source"]["sequence"] == '["24023000","24023128"]'
    assert value["source"]["ts_ms"] == 1_700_000_000_123
    assert value["source"]["ts_ns"] == 1_700_000_000_123_456_000
    assert value["source"]["snapshot"] == "false"
    assert (value["source"]["origin"], value["source"]["origin_lsn"]) == (None, None)
    assert decode_value(raw) == event


def test_message_envelope_is_debeziums():
    source = postgres_source("shop", "shop", "", "", 9, 100, 120, 0, 1_700_000_000_123_456, origin="up", origin_lsn=7)
    event = ChangeEvent(op=Op.MESSAGE, source=source, ts_us=source.ts_us, message={"prefix": "p", "content": "AA=="})
    value = orjson.loads(encode_value(event))
    assert list(value) == ["op", "ts_ms", "source", "transaction", "message"]
    assert decode_value(encode_value(event)) == event


@pytest.mark.parametrize(
    ("first_in_table", "last_in_table", "first_table", "last_table", "marker"),
    [
        (True, True, True, True, SnapshotMarker.LAST),  # the only row of the only table
        (True, False, True, False, SnapshotMarker.FIRST),
        (True, True, True, False, SnapshotMarker.FIRST),  # a single-row first table
        (False, True, False, True, SnapshotMarker.LAST),
        (True, True, False, True, SnapshotMarker.LAST),  # a single-row last table
        (True, True, False, False, SnapshotMarker.LAST_IN_DATA_COLLECTION),  # a single-row table between
        (True, False, False, False, SnapshotMarker.FIRST_IN_DATA_COLLECTION),
        (False, True, True, False, SnapshotMarker.LAST_IN_DATA_COLLECTION),
        (False, False, True, True, SnapshotMarker.TRUE),
    ],
)
def test_snapshot_markers_follow_debezium(first_in_table, last_in_table, first_table, last_table, marker):
    assert (
        SnapshotMarker.of_row(
            first_in_table=first_in_table, last_in_table=last_in_table, first_table=first_table, last_table=last_table
        )
        is marker
    )


def test_snapshot_marker_and_key_codec():
    source = postgres_source(
        name="s",
        db="d",
        schema="p",
        table="t",
        tx_id=None,
        lsn=None,
        commit_lsn=5,
        txn_index=0,
        ts_us=0,
        snapshot=SnapshotMarker.LAST,
    )
    event = ChangeEvent(op=Op.READ, source=source, after={"id": 2})
    assert decode_value(encode_value(event)).source.snapshot is SnapshotMarker.LAST
    assert encode_key({"id": 42}) == b'{"id":42}'
    assert decode_key(encode_key({"id": 42})) == {"id": 42}
    assert encode_key(None) is None
