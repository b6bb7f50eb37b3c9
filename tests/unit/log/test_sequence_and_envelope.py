import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from log.envelope import ChangeEvent, Op, SnapshotMarker, SourceInfo, decode_key, decode_value, encode_key, encode_value
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
    source = SourceInfo(
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
    assert set(value) == {"before", "after", "source", "op", "ts_ms", "ts_us", "transaction"}
    assert value["op"] == "u"
    assert value["source"]["connector"] == "postgresql"
    assert value["source"]["sequence"] == '["24023000","24023128"]'
    assert value["source"]["ts_ms"] == 1_700_000_000_123
    assert value["source"]["snapshot"] == "false"
    assert decode_value(raw) == event


def test_snapshot_marker_and_key_codec():
    source = SourceInfo(
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
