"""EventBuilder: pre-encoded event values equal log.envelope's encoding; quarantine; TOAST; txn_index."""

from __future__ import annotations

import dataclasses

import orjson
import pytest

from capture.errors import ConfiguredKeyError, KeyColumnExcludedError, UnrepresentableValueError
from capture.postgres.decoding.pgoutput_messages import (
    Delete,
    Insert,
    LogicalMessage,
    Relation,
    RelationColumn,
    ReplicaIdentity,
    Truncate,
    TruncateOption,
    Update,
)
from capture.postgres.events.builder import EventBuilder
from capture.postgres.events.source_block import postgres_source, transaction_block
from capture.postgres.streaming.transactions import Transaction
from capture.records import OutRecord
from capture.tuples import UNCHANGED_TOAST, TupleData
from log.envelope import ChangeEvent, Op, SnapshotMarker, encode_value
from log.sequence import Lsn
from log.sequence import Sequence as Seq
from log.topics import ERROR_HEADER, message_topic

NAMES = ("id", 'la"bel', "prïce")


def relation(identity: ReplicaIdentity = ReplicaIdentity.DEFAULT, oid: int = 7) -> Relation:
    return Relation(
        oid,
        'sch"ema',
        "tåble",
        identity,
        (
            RelationColumn(True, "id", 23, -1),
            RelationColumn(False, 'la"bel', 25, -1),
            RelationColumn(False, "prïce", 1700, -1),
        ),
    )


def decoder_for(rel: Relation):
    def decode(row: TupleData) -> dict:
        out = {}
        for column, value in zip(rel.columns, row, strict=True):
            if value is UNCHANGED_TOAST:
                out[column.name] = UNCHANGED_TOAST
            elif value == "NaN":
                raise UnrepresentableValueError("numeric NaN in precise mode", column=column.name)
            elif value is None:
                out[column.name] = None
            else:
                out[column.name] = int(value) if column.type_oid == 23 else value
        return out

    return decode


def builder() -> EventBuilder:
    return EventBuilder("s\\rc", 'd"b', decoder_for, primary_key=lambda _rel: ("id",))


def txn(changes: list, xid: int = 42, commit: int = 0x1_0000_0100) -> Transaction:
    return Transaction(
        xid, Lsn(commit), Lsn(commit + 8), 1_700_000_000_123_456, changes, [1000 + i for i in range(len(changes))]
    )


def value_of(
    op: Op, t: Transaction, *, index: int, lsn: int, before, after, last=None, order=1, total=None, origin=None
) -> bytes:
    source = postgres_source(
        name="s\\rc",
        db='d"b',
        schema='sch"ema',
        table="tåble",
        tx_id=t.xid,
        lsn=lsn,
        commit_lsn=t.commit_lsn.value,
        txn_index=index,
        ts_us=t.commit_ts_us,
        last_commit_lsn=last,
        origin=origin.origin if origin else None,
        origin_lsn=origin.origin_lsn if origin else None,
    )
    block = transaction_block(t.xid, t.commit_lsn, index + 1 if total is None else total, order)
    return encode_value(ChangeEvent(op, source, before, after, t.commit_ts_us, block))


def test_change_values_equal_the_envelope_encoding() -> None:
    rel = relation()
    b = builder()
    first = txn([rel, Insert(7, ("1", 'a "quoted" \\ label', "1.50"))], commit=0x100)
    records, schemas = b.build(first)
    assert len(schemas) == 1
    assert records == [
        OutRecord(
            "s_rc.sch_ema.t_ble",
            b'{"id":1}',
            value_of(
                Op.CREATE,
                first,
                index=0,
                lsn=1001,
                before=None,
                after={"id": 1, 'la"bel': 'a "quoted" \\ label', "prïce": "1.50"},
            ),
            0x100,
            0,
        )
    ]
    second = txn(
        [
            Update(7, None, ("1", "x", "2")),
            Update(7, ("1", None, None), ("5", "y", "3"), old_is_key=True),
            Delete(7, ("5", None, None), old_is_key=True),
            Insert(7, ("9", None, None)),
        ],
        xid=43,
        commit=0x200,
    )
    records, _ = b.build(second)
    topic = "s_rc.sch_ema.t_ble"
    row_x = {"id": 1, 'la"bel': "x", "prïce": "2"}
    row_y = {"id": 5, 'la"bel': "y", "prïce": "3"}
    assert [(r.key, r.txn_index) for r in records] == [
        (b'{"id":1}', 0),
        (b'{"id":1}', 1),
        (b'{"id":1}', 1),
        (b'{"id":5}', 2),
        (b'{"id":5}', 3),
        (b'{"id":5}', 3),
        (b'{"id":9}', 4),
    ]
    assert all(r.topic == topic and r.commit_lsn == 0x200 for r in records)
    # sequence[0] is the end LSN of the transaction before (Debezium's last commit LSN).
    last = first.end_lsn.value
    assert records[0].value == value_of(Op.UPDATE, second, index=0, lsn=1000, before=None, after=row_x, last=last)
    # A key tuple's delete lists every column, the non-key ones null; the key change's create
    # is the table's next event in the transaction (data_collection_order 3).
    key_only_1 = {"id": 1, 'la"bel': None, "prïce": None}
    key_only_5 = {"id": 5, 'la"bel': None, "prïce": None}
    assert records[1].value == value_of(
        Op.DELETE, second, index=1, lsn=1001, before=key_only_1, after=None, last=last, order=2
    )
    assert records[2].value is None
    assert records[3].value == value_of(
        Op.CREATE, second, index=2, lsn=1001, before=None, after=row_y, last=last, order=3
    )
    assert records[4].value == value_of(
        Op.DELETE, second, index=3, lsn=1002, before=key_only_5, after=None, last=last, order=4
    )
    assert records[5].value is None
    assert orjson.loads(records[6].value)["source"]["sequence"] == f'["{last}","1003"]'


def test_full_identity_before_image_and_primary_key() -> None:
    rel = relation(ReplicaIdentity.FULL)
    b = builder()
    t = txn([rel, Update(7, ("1", "old", "1"), ("1", "new", "1")), Delete(7, ("1", "new", "1"), old_is_key=False)])
    records, _ = b.build(t)
    update = orjson.loads(records[0].value)
    assert records[0].key == b'{"id":1}'
    assert update["before"] == {"id": 1, 'la"bel': "old", "prïce": "1"}
    assert orjson.loads(records[1].value)["before"] == {"id": 1, 'la"bel': "new", "prïce": "1"}
    assert records[0].value == value_of(
        Op.UPDATE, t, index=0, lsn=1001, before=update["before"], after={"id": 1, 'la"bel': "new", "prïce": "1"}
    )


def test_snapshot_values_equal_the_envelope_encoding() -> None:
    b = builder()
    b.relation(relation())
    records = b.snapshot_records(7, [("1", "a", "1"), ("2", None, "NaN")], Seq(0x300, 10))
    source = postgres_source("s\\rc", 'd"b', 'sch"ema', "tåble", None, 0x300, 0x300, 10, 0, SnapshotMarker.TRUE)
    event = ChangeEvent(Op.READ, source, None, {"id": 1, 'la"bel': "a", "prïce": "1"}, 0)
    assert records[0] == OutRecord("s_rc.sch_ema.t_ble", b'{"id":1}', encode_value(event), 0x300, 10)
    quarantined = records[1]
    assert quarantined.topic == "s_rc.sch_ema.t_ble.quarantine"
    assert (quarantined.commit_lsn, quarantined.txn_index) == (0x300, 11)
    assert orjson.loads(quarantined.value)["after_raw"] == {"id": "2", 'la"bel': None, "prïce": "NaN"}


def test_unconvertible_value_is_quarantined_in_place() -> None:
    b = builder()
    t = txn([relation(), Insert(7, ("1", "a", "NaN")), Insert(7, ("2", "b", "1"))])
    records, _ = b.build(t)
    bad, good = records
    assert bad.topic.endswith(".quarantine")
    assert bad.key == b'{"id":"1"}'
    assert dict(bad.headers)[ERROR_HEADER].decode().endswith("numeric NaN in precise mode")
    body = orjson.loads(bad.value)
    assert body["op"] == "c"
    assert body["after_raw"] == {"id": "1", 'la"bel': "a", "prïce": "NaN"}
    assert (body["source"]["commit_lsn"], body["source"]["txn_index"]) == (t.commit_lsn.value, 0)
    assert good.txn_index == 1
    assert orjson.loads(good.value)["after"]["id"] == 2


def test_unchanged_toast_filled_from_the_cache_or_quarantined() -> None:
    b = builder()
    b.build(txn([relation(), Insert(7, ("1", "big", "1"))], commit=0x100))
    records, _ = b.build(
        txn([Update(7, None, ("1", UNCHANGED_TOAST, "2")), Update(7, None, ("8", UNCHANGED_TOAST, "2"))])
    )
    assert orjson.loads(records[0].value)["after"][NAMES[1]] == "big"
    assert records[1].topic.endswith(".quarantine")
    assert "unchanged TOAST" in dict(records[1].headers)[ERROR_HEADER].decode()


def test_truncate_and_message_take_their_own_indexes() -> None:
    b = builder()
    t = txn(
        [
            relation(),
            dataclasses.replace(relation(oid=8), name="other"),
            Truncate(TruncateOption.NONE, (7, 8)),
            LogicalMessage(True, Lsn(5), "app", b"hi"),
            LogicalMessage(True, Lsn(6), "headwater.heartbeat", b"x"),
        ]
    )
    records, _ = b.build(t)
    assert [(r.key, r.txn_index) for r in records] == [(None, 0), (None, 1), (b'{"prefix":"app"}', 2)]
    first, second, message = (orjson.loads(r.value) for r in records)
    assert (first["op"], second["op"]) == ("t", "t")
    # Each truncated table's event and the message carry the transaction block, as Debezium's do.
    assert first["transaction"] == transaction_block(t.xid, t.commit_lsn, 1, 1)
    assert second["transaction"] == transaction_block(t.xid, t.commit_lsn, 2, 1)
    assert message["transaction"] == transaction_block(t.xid, t.commit_lsn, 3, 1)
    # Debezium's message envelope: no images, no ts_us/ts_ns; content as binary_handling_mode says.
    assert list(message) == ["op", "ts_ms", "source", "transaction", "message"]
    assert message["message"] == {"prefix": "app", "content": "aGk="}
    hex_builder = EventBuilder("s\\rc", 'd"b', decoder_for, binary_handling_mode="hex")
    hex_records, _ = hex_builder.build(txn([LogicalMessage(True, Lsn(5), "app", b"hi")]))
    assert orjson.loads(hex_records[0].value)["message"]["content"] == "6869"


def test_a_loose_message_is_an_event_between_transactions() -> None:
    b = builder()
    t = txn([relation(), Insert(7, ("1", "a", "1"))], commit=0x100)
    b.build(t)
    loose = b.loose_message(LogicalMessage(False, Lsn(0x180), "app", b"\x00\xff"), now_us=1)
    assert (loose.key, loose.commit_lsn, loose.txn_index) == (b'{"prefix":"app"}', 0x180, 0)
    assert loose.topic == message_topic("s\\rc")
    value = orjson.loads(loose.value)
    assert value["transaction"] is None
    assert value["message"] == {"prefix": "app", "content": "AP8="}
    assert value["source"]["txId"] is None
    assert value["source"]["sequence"] == f'["{0x180}","{0x180}"]'  # Debezium's: the message counts as a commit
    assert value["source"]["ts_us"] == t.commit_ts_us  # the last commit's time (pgoutput sends none)
    after, _ = b.build(txn([Insert(7, ("2", "b", "2"))], commit=0x200))
    assert orjson.loads(after[0].value)["source"]["sequence"].startswith(f'["{0x180}"')


def test_origin_reaches_the_source_block() -> None:
    b = builder()
    t = dataclasses.replace(txn([relation(), Insert(7, ("1", "a", "1"))]), origin="upstream", origin_lsn=0xABCDEF)
    records, _ = b.build(t)
    source = orjson.loads(records[0].value)["source"]
    assert (source["origin"], source["origin_lsn"]) == ("upstream", 0xABCDEF)
    assert records[0].value == value_of(
        Op.CREATE, t, index=0, lsn=1001, before=None, after={"id": 1, 'la"bel': "a", "prïce": "1"}, origin=t
    )


@pytest.mark.parametrize("excluded", [(), ('sch"ema.tåble.prïce',)])
def test_excluded_columns_never_leave(excluded: tuple[str, ...]) -> None:
    b = EventBuilder("src", "db", decoder_for, excluded_columns=excluded)
    records, schemas = b.build(txn([relation(), Insert(7, ("1", "a", "1"))]))
    after = orjson.loads(records[0].value)["after"]
    assert ("prïce" in after) == (not excluded)
    assert ("prïce" in schemas[0].value.decode()) == (not excluded)


def test_cached_images_and_keys_are_kept_at_their_own_size() -> None:
    # orjson 3.13 returns its whole write buffer (>= 4 KiB) behind a short result; the
    # builder's image cache keeps one image per key, so it must keep exact-size copies.
    import gc
    import tracemalloc

    rel = relation(ReplicaIdentity.FULL)
    b = builder()
    b.build(txn([rel]))
    tracemalloc.start()
    try:
        for start in range(0, 20_000, 1000):
            changes = [Update(7, (str(i), "old", "1.5"), (str(i), "new", "2.5")) for i in range(start, start + 1000)]
            records, _ = b.build(txn(changes, commit=0x1_0000_0100 + start * 100))
            del records
        gc.collect()
        retained, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert retained / 20_000 < 600, f"{retained / 20_000:.0f} bytes retained per cached image"


# --------------------------------------------------------------------------- the key a schema record gives


def _identity_relation(identity: ReplicaIdentity, *flags: bool) -> Relation:
    """``relation()``'s columns with pgoutput's replica-identity flags as given."""
    base = relation(identity)
    columns = tuple(dataclasses.replace(c, key=flag) for c, flag in zip(base.columns, flags, strict=True))
    return dataclasses.replace(base, columns=columns)


def _schema_of(b: EventBuilder, rel: Relation) -> dict:
    record = b.relation(rel)
    assert record is not None
    return orjson.loads(record.value)


def test_full_identity_schema_records_the_primary_key_not_every_column() -> None:
    # pgoutput flags every column under REPLICA IDENTITY FULL: the loader merged on all of them (issue 15).
    schema = _schema_of(builder(), _identity_relation(ReplicaIdentity.FULL, True, True, True))
    assert schema["key"] == ["id"]
    assert schema["key_source"] == "primary_key"
    assert [c["name"] for c in schema["columns"] if c["key"]] == ["id"]


def test_full_identity_without_primary_key_is_keyless_unless_configured() -> None:
    full = _identity_relation(ReplicaIdentity.FULL, True, True, True)
    keyless = EventBuilder("src", "db", decoder_for, primary_key=lambda _rel: None)
    assert _schema_of(keyless, full)["key"] == []
    configured = EventBuilder(
        "src", "db", decoder_for, primary_key=lambda _rel: None, configured_keys={'sch"ema.tåble': ('la"bel',)}
    )
    schema = _schema_of(configured, full)
    assert (schema["key"], schema["key_source"]) == (['la"bel'], "configured")
    records, _ = configured.build(txn([full, Insert(7, ("1", "x", "2"))]))
    assert records[0].key == b'{"la\\"bel":"x"}'


def test_index_identity_keys_by_the_identity_index() -> None:
    # Under USING INDEX an update that changes only the primary key sends no old key: the index is the key.
    schema = _schema_of(builder(), _identity_relation(ReplicaIdentity.INDEX, False, True, False))
    assert (schema["key"], schema["key_source"]) == (['la"bel'], "replica_identity_index")


def test_configured_key_must_be_carried_by_every_change() -> None:

    b = EventBuilder("src", "db", decoder_for, configured_keys={'sch"ema.tåble': ("prïce",)})
    with pytest.raises(ConfiguredKeyError, match="REPLICA IDENTITY DEFAULT"):
        b.relation(relation())
    b = EventBuilder("src", "db", decoder_for, configured_keys={'sch"ema.tåble': ("nope",)})
    with pytest.raises(ConfiguredKeyError, match="has no column 'nope'"):
        b.relation(relation(ReplicaIdentity.FULL))
    b = EventBuilder("src", "db", decoder_for, excluded_columns=['sch"ema.tåble.id'])
    with pytest.raises(KeyColumnExcludedError, match="part of the key"):
        b.relation(relation())
