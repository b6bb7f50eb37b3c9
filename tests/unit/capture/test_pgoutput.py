"""pgoutput decoding against bytes recorded from PostgreSQL 15 (see record_pgoutput.py)."""

from __future__ import annotations

import struct
import time

import pytest
from pgoutput_recordings import recording

from capture.postgres.decoding.pgoutput import PG_EPOCH_OFFSET_US, MessageType, PgoutputDecodeError, PgoutputDecoder
from capture.postgres.decoding.pgoutput_messages import (
    Begin,
    Commit,
    Delete,
    Insert,
    LogicalMessage,
    Origin,
    PgoutputMessage,
    Relation,
    RelationColumn,
    ReplicaIdentity,
    StreamAbort,
    StreamCommit,
    StreamStart,
    StreamStop,
    Truncate,
    TruncateOption,
    Type,
    Update,
)
from capture.postgres.decoding.replication_protocol import (
    FrameType,
    PrimaryKeepalive,
    XLogData,
    decode_copy_data,
    encode_standby_status,
)
from capture.tuples import UNCHANGED_TOAST
from log.sequence import Lsn

V1 = "pgoutput_v1.jsonl"
V2 = "pgoutput_v2.jsonl"
BINARY = "pgoutput_v1_binary.jsonl"


def decode_all(name: str, version: int) -> list[PgoutputMessage]:
    decoder = PgoutputDecoder(version)
    return [decoder.decode(row.data) for row in recording(name)]


def relation(messages: list[PgoutputMessage], name: str) -> Relation:
    return next(m for m in messages if isinstance(m, Relation) and m.name == name)


def changes_of(messages: list[PgoutputMessage], name: str) -> list[PgoutputMessage]:
    oid = relation(messages, name).oid
    return [m for m in messages if isinstance(m, Insert | Update | Delete) and m.relation_oid == oid]


@pytest.fixture(scope="module")
def v1() -> list[PgoutputMessage]:
    return decode_all(V1, 1)


@pytest.fixture(scope="module")
def v2() -> list[PgoutputMessage]:
    return decode_all(V2, 2)


def test_every_message_type_is_recorded_and_decoded(v1: list[PgoutputMessage], v2: list[PgoutputMessage]) -> None:
    kinds = {type(m) for m in v1} | {type(m) for m in v2}
    assert kinds == {
        Begin, Commit, Origin, Relation, Type, Insert, Update, Delete, Truncate, LogicalMessage,
        StreamStart, StreamStop, StreamCommit, StreamAbort,
    }  # fmt: skip


def test_begin_and_commit_agree_and_match_the_peek_rows(v1: list[PgoutputMessage]) -> None:
    rows = recording(V1)
    begins = [(i, m) for i, m in enumerate(v1) if isinstance(m, Begin)]
    commits = [m for m in v1 if isinstance(m, Commit)]
    assert len(begins) == len(commits) > 10
    for (index, begin), commit in zip(begins, commits, strict=True):
        assert begin.xid == rows[index].xid  # the peek's xid column
        assert begin.final_lsn == commit.commit_lsn
        assert commit.end_lsn > commit.commit_lsn
        assert commit.flags == 0
        assert begin.commit_ts_us == commit.commit_ts_us
    # commit timestamps are Unix-epoch microseconds, recorded in this decade
    assert 1_700_000_000_000_000 < commits[0].commit_ts_us < 2_100_000_000_000_000


def test_relation_columns_key_flags_typmods_and_replica_identity(v1: list[PgoutputMessage]) -> None:
    all_types = relation(v1, "all_types")
    assert all_types.namespace == "public"
    assert all_types.replica_identity is ReplicaIdentity.DEFAULT
    assert all_types.columns[0] == RelationColumn(key=True, name="id", type_oid=23, atttypmod=-1)
    by_name = {c.name: c for c in all_types.columns}
    assert by_name["c_num_10_2"] == RelationColumn(False, "c_num_10_2", 1700, (10 << 16 | 2) + 4)
    assert by_name["c_varchar"].atttypmod == 20 + 4
    assert by_name["c_ts3"].atttypmod == 3
    full = relation(v1, "toast_full")
    assert full.replica_identity is ReplicaIdentity.FULL
    assert [c.key for c in full.columns] == [True, True, True]  # FULL: every column is "key"
    no_key = relation(v1, "no_key")
    assert [c.key for c in no_key.columns] == [False, False]


def test_type_messages_precede_the_relation_that_uses_them(v1: list[PgoutputMessage]) -> None:
    types = [m for m in v1 if isinstance(m, Type)]
    names = [(t.namespace, t.name) for t in types]
    assert ("public", "mood") in names
    assert ("public", "_mood") in names
    assert ("public", "hstore") in names
    # A domain's Type message names its base type ('posint' -> pg_catalog.int4), hence the TypeRegistry.
    assert ("", "int4") in names
    all_types = relation(v1, "all_types")
    mood = next(t for t in types if t.name == "mood")
    assert mood.oid in {c.type_oid for c in all_types.columns}
    assert v1.index(mood) < v1.index(all_types)


def test_insert_text_values_nulls_and_unicode(v1: list[PgoutputMessage]) -> None:
    first, second, *_ = changes_of(v1, "all_types")
    assert isinstance(first, Insert)
    assert first.xid is None
    names = [c.name for c in relation(v1, "all_types").columns]
    row = dict(zip(names, first.new, strict=True))
    assert row["id"] == "1"
    assert row["c_text"] == 'héllo "wörld"\n'
    assert row["c_bytea"] == "\\xdeadbeef00"
    assert row["c_char"] == "ab   "
    assert isinstance(second, Insert)
    assert dict(zip(names, second.new, strict=True))["c_int4"] is None


def test_update_with_unchanged_toast_and_key_change_replica_identity_default(v1: list[PgoutputMessage]) -> None:
    insert, update_n, update_key, delete = changes_of(v1, "toast_default")
    assert isinstance(insert, Insert)
    big = insert.new[1]
    assert isinstance(big, str)
    assert len(big) == 12_800
    assert update_n == Update(insert.relation_oid, None, ("1", UNCHANGED_TOAST, "2"), old_is_key=False)
    assert update_key == Update(insert.relation_oid, ("1", None, None), ("10", UNCHANGED_TOAST, "2"), old_is_key=True)
    assert delete == Delete(insert.relation_oid, ("10", None, None), old_is_key=True)


def test_update_and_delete_with_replica_identity_full_carry_the_old_row(v1: list[PgoutputMessage]) -> None:
    insert, update_n, update_key, delete = changes_of(v1, "toast_full")
    assert isinstance(insert, Insert)
    big = insert.new[1]
    assert isinstance(update_n, Update)
    assert update_n.old == ("1", big, "1")
    assert update_n.old_is_key is False
    assert update_n.new == ("1", UNCHANGED_TOAST, "2")
    assert isinstance(update_key, Update)
    assert update_key.old == ("1", big, "2")
    assert update_key.new == ("10", UNCHANGED_TOAST, "2")
    assert delete == Delete(insert.relation_oid, ("10", big, "2"), old_is_key=False)


def test_truncate_options_and_relations(v1: list[PgoutputMessage]) -> None:
    plain, cascade = (m for m in v1 if isinstance(m, Truncate))
    assert plain.options is TruncateOption.NONE
    assert plain.relation_oids == (relation(v1, "no_key").oid,)
    assert cascade.options == TruncateOption.CASCADE | TruncateOption.RESTART_IDENTITY
    assert cascade.relation_oids == (relation(v1, "toast_default").oid, relation(v1, "toast_full").oid)


def test_logical_messages_transactional_and_not(v1: list[PgoutputMessage]) -> None:
    in_txn, immediate = (m for m in v1 if isinstance(m, LogicalMessage))
    assert (in_txn.transactional, in_txn.prefix, in_txn.content) == (True, "hw.txn", b"in a transaction")
    assert (immediate.transactional, immediate.prefix, immediate.content) == (False, "hw.now", b"\x00\xff")
    # a transactional message sits between Begin and Commit; the other stands alone
    index = v1.index(in_txn)
    assert isinstance(v1[index + 1], Commit)
    assert isinstance(v1[v1.index(immediate) + 1], Begin)
    row = recording(V1)[v1.index(immediate)]
    assert row.xid == 0
    assert immediate.lsn == Lsn.parse(row.lsn)


def test_schema_changes_send_a_new_relation(v1: list[PgoutputMessage]) -> None:
    versions = [m for m in v1 if isinstance(m, Relation) and m.name == "evolving"]
    assert [[c.name for c in r.columns] for r in versions] == [
        ["id", "a", "b"],
        ["id", "a", "b", "c"],
        ["id", "a", "c"],
        ["id", "a_renamed", "c"],
    ]
    inserts = changes_of(v1, "evolving")
    assert [m.new for m in inserts if isinstance(m, Insert)] == [
        ("1", "1", "one"),
        ("2", "2", "two", "added"),
        ("3", "3", "dropped b"),
        ("4", "4", "renamed a"),
    ]


def test_origin_message(v1: list[PgoutputMessage]) -> None:
    (origin,) = (m for m in v1 if isinstance(m, Origin))
    assert origin == Origin(Lsn.parse("0/ABCDEF"), "upstream")
    begin = v1[v1.index(origin) - 1]
    assert isinstance(begin, Begin)
    assert begin.commit_ts_us == 1_704_067_200_000_000  # pg_replication_origin_xact_setup's timestamp


def test_proto1_sends_the_large_transaction_whole(v1: list[PgoutputMessage]) -> None:
    big = [m for m in changes_of(v1, "big") if isinstance(m, Insert)]
    assert len(big) == 801  # 800 + 1 after ROLLBACK TO SAVEPOINT; the rolled-back ones never appear
    assert not any(isinstance(m, StreamStart | StreamAbort) for m in v1)


def test_proto2_streamed_blocks_carry_the_xid(v2: list[PgoutputMessage]) -> None:
    rows = recording(V2)
    starts = [i for i, m in enumerate(v2) if isinstance(m, StreamStart)]
    assert len(starts) >= 3
    for start in starts:
        stream_start = v2[start]
        assert isinstance(stream_start, StreamStart)
        stop = next(i for i in range(start, len(v2)) if isinstance(v2[i], StreamStop))
        assert stop > start + 1
        assert rows[start].xid == stream_start.xid
        for index in range(start + 1, stop):
            message = v2[index]
            assert isinstance(message, Relation | Insert)
            # The peek's xid column is the top-level transaction; the message carries the xid of the
            # (sub)transaction that made the change: a subtransaction's xid comes after its parent's.
            assert rows[index].xid == stream_start.xid
            assert message.xid is not None
            assert message.xid >= stream_start.xid
    first_segments = [m for m in v2 if isinstance(m, StreamStart) and m.first_segment]
    assert len(first_segments) == 2  # one per streamed top-level transaction


def test_proto2_stream_commit_and_aborts(v2: list[PgoutputMessage]) -> None:
    commits = [m for m in v2 if isinstance(m, StreamCommit)]
    aborts = [m for m in v2 if isinstance(m, StreamAbort)]
    (commit,) = commits
    sub_abort, top_abort = aborts
    assert sub_abort.xid == commit.xid
    assert sub_abort.subxid != sub_abort.xid  # ROLLBACK TO SAVEPOINT of a streamed subtransaction
    assert top_abort.subxid == top_abort.xid  # the rolled-back streamed transaction
    assert top_abort.xid != commit.xid
    assert commit.end_lsn > commit.commit_lsn
    # the committed stream's inserts: everything with its xid or its surviving subtransaction
    streamed = [m for m in v2 if isinstance(m, Insert) and m.xid is not None]
    committed = [m for m in streamed if m.xid not in (sub_abort.subxid, top_abort.xid)]
    assert {m.new[0] for m in committed} >= {"1", "800", "0"}
    assert all(int(str(m.new[0])) >= 200_000 for m in streamed if m.xid == top_abort.xid)


def test_proto2_outside_streams_matches_proto1(v1: list[PgoutputMessage], v2: list[PgoutputMessage]) -> None:
    # Until the first streamed transaction, both protocol versions decode to the same messages.
    first_stream = next(i for i, m in enumerate(v2) if isinstance(m, StreamStart))
    assert v2[:first_stream] == v1[:first_stream]


def test_binary_tuple_values() -> None:
    messages = decode_all(BINARY, 1)
    inserts = [m for m in messages if isinstance(m, Insert)]
    first = inserts[0].new
    assert first[0] == struct.pack(">i", 1)  # int4 in send/recv format
    assert first[1] == struct.pack(">h", -32768)
    assert first[3] == struct.pack(">q", -9223372036854775808)
    assert inserts[1].new[8] == struct.pack(">f", float("nan"))  # real NaN
    assert inserts[-1].new[1] is None


def test_decoder_errors_are_typed() -> None:
    decoder = PgoutputDecoder(1)
    with pytest.raises(PgoutputDecodeError, match="unknown message type"):
        decoder.decode(b"Z")
    with pytest.raises(PgoutputDecodeError, match="empty"):
        decoder.decode(b"")
    begin = recording(V1)[0].data
    with pytest.raises(PgoutputDecodeError):
        decoder.decode(begin[:10])
    with pytest.raises(ValueError, match="protocol version"):
        PgoutputDecoder(3)


def test_memoryview_input() -> None:
    row = recording(V1)[0].data
    assert PgoutputDecoder(1).decode(memoryview(row)) == PgoutputDecoder(1).decode(row)


def test_message_type_enum_matches_wire_bytes() -> None:
    assert ord("I") == MessageType.INSERT
    assert ord("c") == MessageType.STREAM_COMMIT


# -- replication protocol frames ------------------------------------------------------------


def test_xlogdata_frame() -> None:
    payload = recording(V1)[0].data
    frame = b"w" + struct.pack(">QQq", 0x16A9F70, 0x1714728, 10) + payload
    decoded = decode_copy_data(frame)
    assert isinstance(decoded, XLogData)
    assert decoded.wal_start == Lsn.parse("0/16A9F70")
    assert decoded.wal_end == Lsn.parse("0/1714728")
    assert decoded.send_time_us == 946_684_800_000_010
    assert bytes(decoded.payload) == payload
    assert isinstance(PgoutputDecoder(1).decode(decoded.payload), Begin)


def test_keepalive_frame() -> None:
    frame = b"k" + struct.pack(">Qq?", 0x1714728, 0, True)
    assert decode_copy_data(frame) == PrimaryKeepalive(Lsn(0x1714728), PG_EPOCH_OFFSET_US, reply_requested=True)
    with pytest.raises(PgoutputDecodeError):
        decode_copy_data(b"k\x00")
    with pytest.raises(PgoutputDecodeError):
        decode_copy_data(b"x")


def test_standby_status_update_frame() -> None:
    frame = encode_standby_status(Lsn(0x30), Lsn(0x20), Lsn(0x10), 946_684_800_000_000 + 123, reply_requested=True)
    assert frame[0] == FrameType.STANDBY_STATUS_UPDATE == ord("r")
    assert frame == b"r" + struct.pack(">QQQqB", 0x30, 0x20, 0x10, 123, 1)
    assert len(frame) == 34


# -- speed ----------------------------------------------------------------------------------


def test_insert_decode_speed() -> None:
    """A simple Insert (int + 20-char text) decodes in a few microseconds; reported, loosely asserted."""
    rows = recording(V1)
    decoder = PgoutputDecoder(1)
    big_oid = relation(decode_all(V1, 1), "big").oid
    inserts = [r.data for r in rows if r.data[:1] == b"I" and struct.unpack_from(">I", r.data, 1)[0] == big_oid]
    assert len(inserts) == 801
    decode = decoder.decode
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        for data in inserts:
            decode(data)
        best = min(best, (time.perf_counter() - started) / len(inserts))
    print(f"\npgoutput Insert decode: {best * 1e6:.2f} µs/message")
    assert best < 50e-6  # generous: shared CI machines; typically ~1-2 µs
