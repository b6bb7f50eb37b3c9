"""The native hot path (native/_speedups.c) is byte-identical to the pure-Python path.

Every comparison runs the extension and its Python twin on the same input: row images and
keys (type map + orjson), whole events from EventBuilder, pgoutput tuples, murmur2
partitions and file-log batches. The fallback (no extension, or HEADWATER_NATIVE=0) is
checked in subprocesses.
"""

from __future__ import annotations

import hashlib
import os
import struct
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import native
from capture.column_policy import ColumnPolicy, ColumnRules, column_mask
from capture.errors import TypeMappingError
from capture.postgres.decoding.pgoutput import PgoutputDecodeError, PgoutputDecoder, _read_tuple_python
from capture.postgres.decoding.pgoutput_messages import (
    Delete,
    Insert,
    Relation,
    RelationColumn,
    ReplicaIdentity,
    Update,
)
from capture.postgres.events.builder import EventBuilder, OutRecord
from capture.postgres.events.relations import policy_rules
from capture.postgres.events.rows import RowConverter, TextRowDecoder
from capture.postgres.snapshot.copy_text import CopyRows, copy_pieces, encodable, parse_copy_text
from capture.postgres.snapshot.native_pass import encode_piece
from capture.postgres.streaming.connection import WalMessage
from capture.postgres.streaming.transactions import Transaction, TransactionAssembler
from capture.postgres.types.typemap import native_kind as _native_kind
from capture.records import PartitionBatch
from capture.tuples import UNCHANGED_TOAST, NonUtf8Text
from core.source_config import ColumnsConfig, MaskConfig, TypesConfig
from log import partitioner
from log.base import Record
from log.file import batch_codec
from log.file.encoded_appends import EncodedAppends
from log.pg_types import Oid
from log.sequence import Lsn
from log.sequence import Sequence as Seq

pytestmark = pytest.mark.skipif(
    native.speedups is None, reason="the native extension is not built here (or HEADWATER_NATIVE=0)"
)
ROOT = Path(__file__).resolve().parents[3]
FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# -- text values as PostgreSQL prints them (pinned session: UTC, ISO, extra_float_digits=3) -------

# Valid UTF-8 only (PostgreSQL text never holds surrogates); quotes, backslashes, controls, non-BMP.
odd_text = st.text(
    alphabet=st.one_of(
        st.sampled_from(['"', "\\", "\x00", "\x01", "\x1f", "\x7f", "\b", "\t", "\n", "\f", "\r", "\u2028", "é"]),
        st.characters(blacklist_categories=("Cs",)),
    ),
    max_size=12,
)
int_text = st.one_of(
    st.integers(-(2**63), 2**63 - 1).map(str),
    st.sampled_from(["0", "-1", str(2**63 - 1), str(-(2**63)), "007", "-0", "1e3", " 5", "", "12a"]),
)
bool_text = st.sampled_from(["t", "f", "", "true"])
numeric_text = st.one_of(
    st.decimals(allow_nan=False, allow_infinity=False, places=4).map(lambda d: format(d, "f")),
    st.sampled_from(["NaN", "Infinity", "-Infinity", "0.0100", "-0.0001", "123456789012345678901234567890.5", "-"]),
)
float_text = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.sampled_from(["NaN", "Infinity", "-Infinity", "1e+20", "-0", "1.5e-07"]),
)


def file_batches(compression):
    """The file log's encoded-batch capability (what FileLog mixes in) storing batches as ``compression`` says."""
    appends = EncodedAppends()
    appends.compression = compression
    return appends


def _ts_text(year: int, month: int, day: int, hms: tuple[int, int, int], micros: int) -> str:
    fraction = f".{micros:06d}".rstrip("0") if micros else ""
    era = ""
    if year <= 0:
        year, era = 1 - year, " BC"
    return f"{year:04d}-{month:02d}-{day:02d} {hms[0]:02d}:{hms[1]:02d}:{hms[2]:02d}{fraction}{era}"


timestamp_parts = st.tuples(
    st.integers(-4712, 12000),
    st.integers(1, 12),
    st.integers(1, 28),
    st.tuples(st.integers(0, 23), st.integers(0, 59), st.integers(0, 59)),
    st.one_of(st.integers(0, 999_999), st.sampled_from([0, 500_000, 1, 120_000])),
)
timestamp_text = st.one_of(
    timestamp_parts.map(lambda p: _ts_text(*p)),
    st.sampled_from(["infinity", "-infinity", "2024-01-05 12:34:56.1234567", "2024-01-05 12:34:56."]),
)


def _tz_text(parts: tuple[int, int, int, tuple[int, int, int], int], offset: str) -> str:
    text = _ts_text(*parts)
    if text.endswith(" BC"):
        return text[:-3] + offset + " BC"
    return text + offset


timestamptz_text = st.one_of(
    st.builds(_tz_text, timestamp_parts, st.sampled_from(["+00", "+00", "+05:30", "-08", "+00:00:12"])),
    st.sampled_from(["infinity", "-infinity"]),
)
date_text = st.one_of(
    st.builds(lambda p: _ts_text(*p).split(" ")[0] + (" BC" if p[0] <= 0 else ""), timestamp_parts),
    st.sampled_from(["infinity", "-infinity", "2024-1-05"]),
)
bytea_text = st.one_of(
    st.binary(max_size=20).map(lambda b: "\\x" + b.hex()),
    st.binary(max_size=6).map(lambda b: "\\x" + b.hex().upper()),
    st.sampled_from(["\\x", "\\x0", "\\xzz", "abc"]),
)
uuid_text = st.uuids().map(str)
json_text = st.dictionaries(st.text(max_size=4), st.integers(-(2**53), 2**53), max_size=3).map(
    lambda d: orjson.dumps(d).decode()
)

#: (type oid, typmod, strategy of its text values): every type the extension converts, and some it
#: leaves to Python (float, arrays, interval), so mixed rows are covered too.
COLUMN_TYPES = [
    (Oid.INT2, -1, st.integers(-(2**15), 2**15 - 1).map(str)),
    (Oid.INT4, -1, int_text),
    (Oid.INT8, -1, int_text),
    (Oid.TEXT, -1, odd_text),
    (Oid.VARCHAR, 14, odd_text),
    (Oid.BPCHAR, 5, odd_text),
    (Oid.BOOL, -1, bool_text),
    (Oid.NUMERIC, -1, numeric_text),
    (Oid.NUMERIC, (10 << 16 | 2) + 4, numeric_text),
    (Oid.FLOAT4, -1, float_text),
    (Oid.FLOAT8, -1, float_text),
    (Oid.TIMESTAMP, -1, timestamp_text),
    (Oid.TIMESTAMP, 3, timestamp_text),
    (Oid.TIMESTAMPTZ, -1, timestamptz_text),
    (Oid.TIMESTAMPTZ, 0, timestamptz_text),
    (Oid.TIMESTAMPTZ, 3, timestamptz_text),
    (Oid.DATE, -1, date_text),
    (Oid.UUID, -1, uuid_text),
    (Oid.JSON, -1, json_text),
    (Oid.JSONB, -1, json_text),
    (Oid.BYTEA, -1, bytea_text),
    (Oid.INTERVAL, -1, st.sampled_from(["1 year 2 mons -3 days +04:05:06.5", "00:00:01"])),
    (1007, -1, st.sampled_from(["{1,2,NULL}", "{}"])),  # int4[]
]
MODES = [
    TypesConfig(),
    TypesConfig(decimal_handling_mode="precise", time_precision_mode="connect", binary_handling_mode="hex"),
    TypesConfig(decimal_handling_mode="double"),
]


@st.composite
def relation_and_rows(draw: st.DrawFn) -> tuple[list[RelationColumn], list[tuple[object, ...]], list[int], list[int]]:
    chosen = draw(st.lists(st.sampled_from(range(len(COLUMN_TYPES))), min_size=1, max_size=7))
    columns = [
        RelationColumn(False, f'c{i}_"{n}', COLUMN_TYPES[n][0], COLUMN_TYPES[n][1]) for i, n in enumerate(chosen)
    ]
    keep = sorted(draw(st.sets(st.sampled_from(range(len(columns))), min_size=1)))
    keys = sorted(draw(st.sets(st.sampled_from(keep), max_size=2)))
    rows = []
    for _ in range(draw(st.integers(1, 4))):
        row = []
        for n in chosen:
            marker = draw(st.integers(0, 9))
            row.append(None if marker == 0 else UNCHANGED_TOAST if marker == 1 else draw(COLUMN_TYPES[n][2]))
        rows.append(tuple(row))
    return columns, rows, keep, keys


def python_encode(
    converter: RowConverter, row: tuple[object, ...], keep: list[int], keys: list[int]
) -> tuple[bytes, bytes | None] | None:
    """What the Python path makes of the row, or None where it does not produce an image here.

    Columns not kept are never converted (so a value they could not convert is no error).
    """
    if any(value is UNCHANGED_TOAST or isinstance(value, bytes) for value in row):
        return None
    try:
        image = converter.restricted(ColumnRules(keep, {})).convert_text(row)  # type: ignore[arg-type]
    except TypeMappingError:
        return None
    names = converter.names
    after = {names[i]: image[names[i]] for i in keep}
    key = orjson.dumps({names[i]: image[names[i]] for i in keys}) if keys else None
    return orjson.dumps(after), key


#: Masks of every kind: native SHA-256 (both hash versions), a Python-only algorithm, truncation, replacement.
MASKS = [
    MaskConfig(hash="sha256", salt="salt", version=1),
    MaskConfig(hash="sha256", salt='é"\\x', version=2),
    MaskConfig(hash="md5", salt="s"),
    MaskConfig(truncate=2),
    MaskConfig(truncate=0),
    MaskConfig(replace='*"é\\'),
]
HASHES = [m for m in MASKS if m.hash is not None]


def draw_columns(data: st.DataObject, table: str, columns, keep: list[int], keys: list[int]) -> ColumnsConfig:
    """The columns not in ``keep`` excluded, and some kept ones masked (key columns only by a hash)."""
    masks = {}
    for i in keep:
        mask = data.draw(st.sampled_from([None, None, *(HASHES if i in keys else MASKS)]))
        if mask is not None:
            masks[f"{table}.{columns[i].name}"] = mask
    excluded = tuple(f"{table}.{c.name}" for i, c in enumerate(columns) if i not in keep)
    return ColumnsConfig(exclude=excluded, mask=masks)


@FAST
@given(case=relation_and_rows(), mode=st.sampled_from(MODES), data=st.data())
def test_masked_row_images_and_keys_are_byte_identical(case, mode, data) -> None:
    columns, rows, keep, keys = case
    relation = Relation(9, "public", "t", ReplicaIdentity.DEFAULT, tuple(columns))
    rules = policy_rules(ColumnPolicy(draw_columns(data, "public.t", columns, keep, keys)), relation)
    converter = RowConverter(columns, mode).restricted(rules)
    encoder = converter.native_encoder(keep, keys)
    assert encoder is not None
    for row in rows:
        assert encoder.encode(row) == python_encode(converter, row, keep, keys)


@FAST
@given(salt=st.binary(max_size=130), value=odd_text, version=st.sampled_from([1, 2]))
def test_the_native_sha256_mask_equals_hashlib_with_and_without_the_cpus_sha_extensions(salt, value, version) -> None:
    assert native.speedups is not None
    wanted = column_mask(
        MaskConfig(hash="sha256", salt=salt.decode("latin-1"), version=version)
    ).mask  # the salt's UTF-8 bytes: latin-1 text round-trips any byte string only through this decode
    expected = hashlib.sha256(salt.decode("latin-1").encode() + (value.encode() if version == 2 else b"")).hexdigest()
    if version == 2:
        assert wanted(value) == expected
    salt_bytes = salt.decode("latin-1").encode()
    for portable in (False, True):
        assert native.speedups.mask_sha256(salt_bytes, value, version, portable) == wanted(value)
    long_value = value * 50  # several blocks, and a length past 55 bytes in the last one
    assert native.speedups.mask_sha256(salt_bytes, long_value, version) == wanted(long_value)


def test_masks_are_computed_natively_and_match_debezium() -> None:
    """Debezium 3.6.3's own output for salt 'salt' (column.mask.hash.SHA-256.with.salt.salt on varchar(10)
    and char(5), column.mask.hash.v2 on text), and every native mask without a Python call."""
    columns = [
        RelationColumn(True, "id", Oid.INT4, -1),
        RelationColumn(False, "v", Oid.VARCHAR, 14),
        RelationColumn(False, "c", Oid.BPCHAR, 9),
        RelationColumn(False, "t", Oid.TEXT, -1),
        RelationColumn(False, "cut", Oid.TEXT, -1),
        RelationColumn(False, "n", Oid.INT4, -1),
    ]
    relation = Relation(9, "public", "a", ReplicaIdentity.DEFAULT, tuple(columns))
    config = ColumnsConfig(
        mask={
            "public.a.v": MaskConfig(hash="sha256", salt="salt", version=1),
            "public.a.c": MaskConfig(hash="sha256", salt="salt", version=1),
            "public.a.t": MaskConfig(hash="sha256", salt="salt", version=2),
            "public.a.cut": MaskConfig(truncate=3),
            "public.a.n": MaskConfig(replace="****"),
        }
    )
    rules = policy_rules(ColumnPolicy(config), relation)
    converter = RowConverter(columns, TypesConfig()).restricted(rules)
    keep = list(range(len(columns)))
    expected = {
        "id": 2,
        "v": "4588e1f2dc",
        "c": "ec423",
        "t": "e84ac3142870113ddc6710c06f76421befc8e8ca6de64e98d2993ed8d41f4085",
        "cut": "😀é😀",
        "n": "****",
    }
    row = ("2", "world", "xyz  ", "world", "😀é😀😀", "7")
    assert converter.convert_text(row) == expected
    assert native.speedups is not None
    plan = [(m.native_kind, m.native_param) if (m := rules.masks.get(i)) else (1, 0) for i in keep]
    encoder = native.speedups.RowEncoder(
        tuple(kind for kind, _ in plan),
        tuple(param for _, param in plan),
        (True,) * len(row),
        tuple(orjson.dumps(c.name) + b":" for c in columns),
        (_explode,) * len(row),
        (0,),
        orjson.dumps,
        UNCHANGED_TOAST,
        tuple(m.native_blob if (m := rules.masks.get(i)) else None for i in keep),
    )
    assert encoder.encode(row) == (orjson.dumps(expected), b'{"id":2}')


@FAST
@given(case=relation_and_rows(), mode=st.sampled_from(MODES))
def test_row_images_and_keys_are_byte_identical(case, mode) -> None:
    columns, rows, keep, keys = case
    converter = RowConverter(columns, mode)
    encoder = converter.native_encoder(keep, keys)
    assert encoder is not None
    for row in rows:
        assert encoder.encode(row) == python_encode(converter, row, keep, keys)


def test_every_common_type_is_converted_natively() -> None:
    # A row of the common types must not call back into Python converters: replace them all
    # with failing ones and the native encoder still answers.
    columns = [RelationColumn(False, f"c{i}", oid, typmod) for i, (oid, typmod, _) in enumerate(COLUMN_TYPES[:21])]
    converter = RowConverter(columns, TypesConfig())
    row = (
        "1", "2", "3", "a", "b", "c", "t", "1.50", "2.00", None, None,
        "2024-01-05 12:34:56.5", "2024-01-05 12:34:56.5", "2024-01-05 12:34:56.5+00", "2024-01-05 12:34:56+00",
        "2024-01-05 12:34:56.123+00", "2024-01-05", "6f1c1f1e-8f0a-4a53-9a5e-4f0c0d3b7a10", "{}", '{"a": 1}', "\\x00ff",
    )  # fmt: skip
    expected = python_encode(converter, row, list(range(len(row))), [0])
    assert native.speedups is not None
    plan = [_native_kind(c) for _, c in converter._plan]
    encoder = native.speedups.RowEncoder(
        tuple(kind for kind, _ in plan),
        tuple(param for _, param in plan),
        (True,) * len(row),
        tuple(orjson.dumps(name) + b":" for name in converter.names),
        (_explode,) * len(row),
        (0,),
        orjson.dumps,
        UNCHANGED_TOAST,
    )
    assert encoder.encode(row) == expected


def _explode(_text: str) -> object:
    raise AssertionError("a Python converter was called for a natively converted type")


# -- whole events --------------------------------------------------------------------------------


def _decoders(columns: list[RelationColumn], mode: TypesConfig):
    def decoder_for(relation: Relation) -> TextRowDecoder:
        return TextRowDecoder(RowConverter(relation.columns, mode))

    return decoder_for


@FAST
@given(case=relation_and_rows(), mode=st.sampled_from(MODES), data=st.data())
def test_events_are_byte_identical(case, mode, data) -> None:
    columns, rows, keep, keys = case
    keyed = [RelationColumn(i in keys, c.name, c.type_oid, c.atttypmod) for i, c in enumerate(columns)]
    identity = data.draw(st.sampled_from([ReplicaIdentity.DEFAULT, ReplicaIdentity.FULL]))
    relation = Relation(9, "public", 'tåble"', identity, tuple(keyed))
    config = draw_columns(data, 'public.tåble"', columns, keep, keys)
    changes: list[object] = [relation]
    for row in rows:
        kind = data.draw(st.sampled_from(["insert", "update", "update_old", "delete_key", "delete_full"]))
        other = data.draw(st.sampled_from(rows))
        if kind == "insert":  # pgoutput sends every value of a new row
            changes.append(Insert(9, tuple(None if v is UNCHANGED_TOAST else v for v in row)))
        elif kind == "update":
            changes.append(Update(9, None, row))
        elif kind == "update_old":
            changes.append(Update(9, other, row, old_is_key=identity != ReplicaIdentity.FULL))
        elif kind == "delete_key":
            key_only = tuple(value if i in keys else None for i, value in enumerate(row))
            changes.append(Delete(9, key_only, True))
        else:
            changes.append(Delete(9, row, False))
    cache_size = data.draw(st.sampled_from([0, 2, 5, 100_000]))
    txn = Transaction(77, Lsn(0x1_0000_0100), Lsn(0x1_0000_0108), 1_700_000_000_123_456, changes, [])  # type: ignore[arg-type]

    def build(use_native: bool):
        builder = EventBuilder(
            "src",
            "db",
            _decoders(columns, mode),
            columns=config,
            primary_key=lambda _rel: tuple(columns[i].name for i in keys) or None,
            image_cache_size=cache_size,  # small sizes rotate the TOAST image cache mid-transaction
            use_native=use_native,
        )
        try:
            records, schemas = builder.build(txn)
            snapshot = builder.snapshot_records(9, [r for r in rows if UNCHANGED_TOAST not in r], Seq(5, 0))
        except Exception as exc:  # e.g. an unchanged TOAST value in a full old image: both paths alike
            return repr(exc)
        return records, schemas, snapshot

    assert build(True) == build(False)


# -- pgoutput tuples -----------------------------------------------------------------------------


def _tuple_bytes(values: list[object]) -> bytes:
    out = bytearray(struct.pack(">h", len(values)))
    for value in values:
        if value is None:
            out += b"n"
        elif value is UNCHANGED_TOAST:
            out += b"u"
        elif isinstance(value, bytes):
            out += b"b" + struct.pack(">i", len(value)) + value
        else:
            raw = str(value).encode()
            out += b"t" + struct.pack(">i", len(raw)) + raw
    return bytes(out)


tuple_values = st.lists(st.one_of(st.none(), st.just(UNCHANGED_TOAST), odd_text, st.binary(max_size=8)), max_size=8)


@FAST
@given(values=tuple_values, prefix=st.binary(max_size=3), cut=st.integers(0, 40), junk=st.binary(max_size=3))
def test_pgoutput_tuples_decode_identically(values, prefix, cut, junk) -> None:
    data = prefix + _tuple_bytes(values) + junk
    assert native.speedups is not None
    assert native.speedups.read_tuple(data, len(prefix), UNCHANGED_TOAST) == _read_tuple_python(data, len(prefix))
    damaged = data[: max(len(prefix), len(data) - cut)] + junk
    try:
        expected = _read_tuple_python(damaged, len(prefix))
    except (struct.error, IndexError, ValueError, PgoutputDecodeError):
        expected = None  # malformed: the extension hands it back, the Python twin raises
    if expected is not None and any(isinstance(value, NonUtf8Text) for value in expected[0]):
        expected = None  # text that is not UTF-8: the extension hands it back, the Python twin keeps the bytes
    assert native.speedups.read_tuple(damaged, len(prefix), UNCHANGED_TOAST) == expected


def test_malformed_tuple_still_raises_the_decode_error() -> None:
    message = b"I" + struct.pack(">I", 5) + b"N" + struct.pack(">h", 1) + b"x"
    with pytest.raises(PgoutputDecodeError, match="unknown tuple column kind"):
        PgoutputDecoder(2).decode(message)


# -- replication frames into transactions -------------------------------------------------------


@st.composite
def wal_frames(draw: st.DrawFn) -> list[WalMessage]:
    """Frames of transactions: Begin, row changes (some damaged), Commit; WAL positions increasing."""
    payloads: list[bytes] = []
    for xid in range(draw(st.integers(1, 3))):
        payloads.append(b"B" + struct.pack(">QqI", 1000 + xid, 5, xid))
        for _ in range(draw(st.integers(0, 8))):
            oid = struct.pack(">I", draw(st.integers(1, 3)))
            row = _tuple_bytes(draw(tuple_values))
            kind = draw(st.sampled_from(["I", "U", "UK", "UO", "DK", "DO", "damaged"]))
            if kind == "I":
                payloads.append(b"I" + oid + b"N" + row)
            elif kind.startswith("U"):
                old = b"" if kind == "U" else kind[1].encode() + _tuple_bytes(draw(tuple_values))
                payloads.append(b"U" + oid + old + b"N" + row)
            elif kind.startswith("D"):
                payloads.append(b"D" + oid + kind[1].encode() + row)
            else:
                payloads.append(b"I" + oid + b"N" + row[: draw(st.integers(0, max(len(row) - 1, 0)))] + b"?")
        payloads.append(b"C" + struct.pack(">BQQq", 0, 1000 + xid, 1100 + xid, 7))
    return [WalMessage(16 * (at + 1), payload) for at, payload in enumerate(payloads)]


def _assemble(frames: list[WalMessage], *, take: bool) -> list[object]:
    """Transactions out of ``frames`` as the agent's stream loop makes them (``take``: with take_changes)."""
    decoder, assembler = PgoutputDecoder(2), TransactionAssembler()
    out: list[object] = []
    at = 0
    while at < len(frames):
        lists = assembler.open_lists()
        if take and lists is not None and not decoder.in_stream:
            assert native.speedups is not None
            at = native.speedups.take_changes(frames, at, lists[0], lists[1])
            if at >= len(frames):
                break
        frame = frames[at]
        at += 1
        try:
            done = assembler.feed(decoder.decode(frame.payload), frame.wal_start)
        except PgoutputDecodeError as exc:
            out.append(("error", at, str(exc)))
            break
        if isinstance(done, Transaction):
            out.append((done.xid, done.commit_lsn, list(done.changes), list(done.lsns)))
    return out


@FAST
@given(frames=wal_frames())
def test_take_changes_assembles_what_decode_and_feed_assemble(frames) -> None:
    assert native.speedups is not None
    native.speedups.bind_libpq(0, WalMessage)  # binds the message type (no libpq of version 0 exists)
    assert _assemble(frames, take=True) == _assemble(frames, take=False)


def test_take_changes_stops_at_other_frames_and_foreign_items() -> None:
    assert native.speedups is not None
    native.speedups.bind_libpq(0, WalMessage)
    insert = b"I" + struct.pack(">I", 7) + b"N" + _tuple_bytes(["1", None])
    frames: list[object] = [WalMessage(8, insert), WalMessage(9, b"C"), WalMessage(10, insert), (11, insert)]
    changes: list[object] = []
    lsns: list[int] = []
    assert native.speedups.take_changes(frames, 0, changes, lsns) == 1
    assert changes == [Insert(7, ("1", None))] and lsns == [8]
    assert native.speedups.take_changes(frames, 2, changes, lsns) == 3  # a plain tuple is not a WalMessage
    assert lsns == [8, 10]


@FAST
@given(
    picks=st.lists(
        st.tuples(st.sampled_from(["a", "b", "c"]), st.one_of(st.none(), st.binary(max_size=12))), max_size=40
    ),
    counts=st.fixed_dictionaries({"a": st.integers(1, 5), "b": st.integers(1, 5)}),
)
def test_group_records_groups_as_the_agent_loop(picks, counts) -> None:
    assert native.speedups is not None
    records = [OutRecord(topic, key, b"v", 1, at) for at, (topic, key) in enumerate(picks)]
    expected: dict[str, list[list[OutRecord]]] = {}
    missing = None
    for record in records:
        if record.topic not in counts:
            missing = missing or record.topic
            continue
        buckets = expected.setdefault(record.topic, [[] for _ in range(counts[record.topic])])
        n = len(buckets)
        hashed = partitioner._murmur2_python(record.key) & 0x7FFFFFFF if record.key is not None else 0
        buckets[0 if record.key is None or n == 1 else hashed % n].append(record)
    grouped = native.speedups.group_records(records, counts)
    if missing is not None:
        assert grouped == missing  # the first record's topic that is not created yet
    else:
        assert grouped == expected
        assert list(grouped) == list(expected)
    assert native.speedups.group_records([OutRecord("a", "text key", None, 1, 1)], {"a": 3}) is None


# -- murmur2 and file-log batches ----------------------------------------------------------------


@FAST
@given(keys=st.lists(st.one_of(st.none(), st.binary(max_size=40)), max_size=20), n=st.integers(1, 64))
def test_partitions_equal_kafka_murmur2(keys, n) -> None:
    assert native.speedups is not None
    expected = [0 if key is None else (partitioner._murmur2_python(key) & 0x7FFFFFFF) % n for key in keys]
    assert partitioner.partitions_for(keys, n) == expected
    assert [partitioner.partition_for(key, n) for key in keys] == expected
    for key in keys:
        if key is not None:
            assert native.speedups.murmur2(key) == partitioner._murmur2_python(key)


records = st.lists(
    st.builds(
        Record,
        key=st.one_of(st.none(), st.binary(max_size=10)),
        value=st.one_of(st.none(), st.binary(max_size=30)),
        headers=st.one_of(st.just(()), st.lists(st.tuples(st.text(max_size=4), st.binary(max_size=4))).map(tuple)),
        timestamp_ms=st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)),
    ),
    min_size=1,  # the log never encodes an empty batch
    max_size=12,
)


@FAST
@given(batch=records, base=st.integers(0, 2**40), now=st.integers(0, 2**45))
def test_file_log_batches_are_byte_identical(batch, base, now) -> None:
    assert batch_codec.encode_batch(base, batch, now) == batch_codec._encode_batch_python(base, batch, now)


# -- fallback ------------------------------------------------------------------------------------


def _probe(code: str, **env: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return result.stdout.strip() + result.stderr.strip()


def test_headwater_native_0_forces_the_python_path() -> None:
    code = (
        "import native as n, log.partitioner as p, capture.postgres.decoding.pgoutput as g;"
        "print(n.speedups, p._native, g._native_read_tuple, p.partition_for(b'21', 3))"
    )
    assert _probe(code, HEADWATER_NATIVE="0") == "None None None 0"


def test_without_the_extension_the_python_path_runs_and_says_so() -> None:
    code = (
        "import logging, sys; logging.basicConfig(level=logging.DEBUG, format='%(name)s: %(message)s');"
        "sys.modules['native._speedups'] = None;"
        "import native as n; print(n.speedups)"
    )
    out = _probe(code)
    assert "None" in out
    assert "native: native speedups not available" in out


def test_simple_changes_never_reach_the_python_event_path() -> None:
    columns = [RelationColumn(True, "id", Oid.INT8, -1), RelationColumn(False, "label", Oid.TEXT, -1)]
    relation = Relation(9, "public", "t", ReplicaIdentity.DEFAULT, tuple(columns))
    changes = [relation, Insert(9, ("1", "a")), Update(9, None, ("1", "b")), Delete(9, ("1", None), True)]
    txn = Transaction(5, Lsn(100), Lsn(108), 0, changes, [])  # type: ignore[arg-type]
    fast = EventBuilder("src", "db", _decoders(columns, TypesConfig()))
    fast._events = None  # type: ignore[method-assign]  # calling it would fail the test
    slow = EventBuilder("src", "db", _decoders(columns, TypesConfig()), use_native=False)
    records, _ = fast.build(txn)
    assert records == slow.build(txn)[0]
    assert [r.value is None for r in records] == [False, False, False, True]


# -- snapshot rows straight from COPY text -------------------------------------------------------

_COPY_ESCAPES = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f", "\v": "\\v"}


def _copy_field(value: object) -> str:
    if value is None:
        return "\\N"
    return "".join(_COPY_ESCAPES.get(char, char) for char in str(value))


@FAST
@given(case=relation_and_rows(), mode=st.sampled_from(MODES), data=st.data())
def test_snapshot_rows_from_copy_text_are_byte_identical(case, mode, data) -> None:
    columns, rows, keep, keys = case
    keyed = [RelationColumn(i in keys, c.name, c.type_oid, c.atttypmod) for i, c in enumerate(columns)]
    relation = Relation(9, "public", "t", ReplicaIdentity.DEFAULT, tuple(keyed))
    config = draw_columns(data, "public.t", columns, keep, keys)
    lines = ["\t".join(_copy_field(None if v is UNCHANGED_TOAST else v) for v in row) for row in rows]
    # Damage: a row with a field too many or too few, an empty line, odd escapes, no final newline.
    extra = data.draw(
        st.lists(st.sampled_from(["", "1", "1\t2\t3\t4\t5\t6\t7\t8", "\\x41\\q\\", "é\t\\N"]), max_size=2)
    )
    lines[data.draw(st.integers(0, len(lines))) : 0] = extra
    text = "\n".join(lines) + data.draw(st.sampled_from(["\n", ""]))

    def snapshot(use_native: bool):
        builder = EventBuilder("src", "db", _decoders(columns, mode), columns=config, use_native=use_native)
        builder.relation(relation)
        rows = CopyRows(text.encode())
        return len(rows), builder.snapshot_records(9, rows, Seq(5, 7), ts_us=1_700_000_000_000_001)

    assert snapshot(True) == snapshot(False)


def test_copy_rows_count_like_the_parser() -> None:
    for text in [b"", b"1\t2\n", b"1\n2", b"\n1\n\n\n2\n", b"a\\nb\n"]:
        assert len(CopyRows(text)) == len(parse_copy_text(text))


def test_clean_copy_text_never_reaches_the_python_snapshot_path() -> None:
    columns = [RelationColumn(True, "id", Oid.INT8, -1), RelationColumn(False, "label", Oid.TEXT, -1)]
    relation = Relation(9, "public", "t", ReplicaIdentity.DEFAULT, tuple(columns))
    fast = EventBuilder("src", "db", _decoders(columns, TypesConfig()))
    slow = EventBuilder("src", "db", _decoders(columns, TypesConfig()), use_native=False)
    fast.relation(relation)
    slow.relation(relation)
    fast._snapshot_rows_python = None  # type: ignore[method-assign]  # calling it would fail the test
    text = b"1\ta\\tb\n2\t\\N\n"
    assert fast.snapshot_records(9, CopyRows(text), Seq(5, 0)) == slow.snapshot_records(9, CopyRows(text), Seq(5, 0))


def _python_snapshot_batches(records, partitions: int, now_ms: int):
    """Per (topic, partition): the records of the Python path in order, as (key, value, txn_index)."""
    out: dict[tuple[str, int], list[tuple[bytes | None, bytes | None, int]]] = {}
    for record in records:
        count = partitions if record.topic == "src.public.t" else 1
        partition = partitioner.partition_for(record.key, count) if record.key is not None and count > 1 else 0
        out.setdefault((record.topic, partition), []).append((record.key, record.value, record.txn_index))
    return out


@FAST
@given(case=relation_and_rows(), mode=st.sampled_from(MODES), data=st.data())
def test_snapshot_batches_from_copy_text_are_byte_identical(case, mode, data) -> None:
    """encode_piece's batches hold the records snapshot_records builds (Python path), byte for byte."""
    columns, rows, keep, keys = case
    keyed = [RelationColumn(i in keys, c.name, c.type_oid, c.atttypmod) for i, c in enumerate(columns)]
    relation = Relation(9, "public", "t", ReplicaIdentity.DEFAULT, tuple(keyed))
    config = draw_columns(data, "public.t", columns, keep, keys)
    lines = ["\t".join(_copy_field(None if v is UNCHANGED_TOAST else v) for v in row) for row in rows]
    # Damage the native pass hands back: a field too many or too few, odd escapes; no final newline.
    extra = data.draw(st.lists(st.sampled_from(["1", "1\t2\t3\t4\t5\t6\t7\t8", "\\x41\\q\\", "é\t\\N"]), max_size=2))
    lines[data.draw(st.integers(0, len(lines))) : 0] = extra
    raw = ("\n".join(lines) + data.draw(st.sampled_from(["\n", ""]))).encode()
    if not encodable(raw):  # an empty line (a one-column row of ""): the agent takes snapshot_records
        assert raw.startswith(b"\n") or b"\n\n" in raw
        return
    partitions = data.draw(st.integers(1, 4))
    compression = data.draw(st.sampled_from(["none", "zstd"]))
    ts_us = 1_700_000_000_000_001
    slow = EventBuilder("src", "db", _decoders(columns, mode), columns=config, use_native=False)
    slow.relation(relation)
    expected_records = slow.snapshot_records(9, CopyRows(raw), Seq(5, 7), ts_us=ts_us)
    fast = EventBuilder("src", "db", _decoders(columns, mode), columns=config)
    fast.relation(relation)
    got: dict[tuple[str, int], list[tuple[bytes | None, bytes | None, int]]] = {}
    index = 7
    now_ms = None
    for piece in copy_pieces(raw, data.draw(st.integers(1, 64))):
        pieces = encode_piece(
            fast, 9, raw, piece, Seq(5, index), partitions=partitions, ts_us=ts_us, log=file_batches(compression)
        )
        for part in pieces:
            if isinstance(part[0], PartitionBatch):
                for encoded in part:
                    assert isinstance(encoded, PartitionBatch)
                    now_ms = encoded.batch.max_timestamp
                    sealed = bytes(encoded.batch.seal(3))
                    header = batch_codec.parse_header(sealed)
                    assert header is not None and batch_codec.crc_ok(sealed, 0, header)
                    decoded: list = []
                    batch_codec.decode_records(
                        sealed, 0, header, topic="", partition=0, min_offset=0, out=decoded, max_records=10**6,
                        max_bytes=1 << 40,
                    )  # fmt: skip
                    # The same records through the Python encoder give the same bytes; a batch the
                    # encoder compressed (its zstd frame may come from another zstd build than the
                    # Python codec's) holds those bytes as its records section and is smaller.
                    again = [Record(r.key, r.value, (), now_ms) for r in decoded]
                    expected = batch_codec._encode_batch_python(3, again, now_ms)[0]
                    if header.attributes & batch_codec.ATTR_CODEC:
                        assert compression == "zstd" and len(sealed) < len(expected)
                        plain = batch_codec.parse_header(expected)
                        assert plain is not None and header._replace(length=0, crc=0, attributes=0) == plain._replace(
                            length=0, crc=0, attributes=0
                        )
                        records, at = batch_codec.records_section(sealed, 0, header)
                        assert bytes(records[at:]) == bytes(expected[batch_codec.HEADER_SIZE :])
                    else:
                        assert sealed == bytes(expected)
                    mine = got.setdefault(("src.public.t", encoded.partition), [])
                    mine.extend((r.key, r.value, -1) for r in decoded)
                    mine[-1] = (*mine[-1][:2], encoded.last_index)
                    assert encoded.commit_lsn == 5
            else:
                for record in part:
                    count = partitions if record.topic == "src.public.t" else 1
                    where = partitioner.partition_for(record.key, count) if record.key is not None and count > 1 else 0
                    got.setdefault((record.topic, where), []).append((record.key, record.value, record.txn_index))
        index += piece[2]
    expected = _python_snapshot_batches(expected_records, partitions, now_ms or 0)
    assert {k: [(key, value) for key, value, _ in v] for k, v in got.items()} == {
        k: [(key, value) for key, value, _ in v] for k, v in expected.items()
    }
    for where, mine in got.items():  # the last sequence of each native batch is the record's own
        wanted = {value: txn for _key, value, txn in expected[where]}
        assert all(txn == -1 or wanted[value] == txn for _key, value, txn in mine)


def test_copy_pieces_cut_after_newlines_and_count_rows() -> None:
    data = b"1\ta\n22\tbb\n333\tccc\n4\td"
    for target in range(1, len(data) + 2):
        pieces = copy_pieces(data, target)
        assert b"".join(data[a:b] for a, b, _ in pieces) == data
        assert all(data[b - 1 : b] == b"\n" for _a, b, _ in pieces[:-1])
        assert sum(rows for _a, _b, rows in pieces) == len(parse_copy_text(data))
    assert not encodable(b"1\n\n2\n") and not encodable(b"\n1\n") and not encodable(b"\xff\n")
    assert encodable("é\n".encode())


def test_an_encoder_copy_serves_another_thread_and_the_original_is_refused_while_busy() -> None:
    columns = [RelationColumn(True, "id", Oid.INT8, -1), RelationColumn(False, "label", Oid.TEXT, -1)]
    encoder = RowConverter(columns, TypesConfig()).native_encoder([0, 1], [0])
    assert encoder is not None
    twin = encoder.copy()
    assert twin is not encoder and twin.encode(("1", "a")) == encoder.encode(("1", "a"))
    data = b"1\ta\n2\tb\n"
    assert twin.copy_batches(data, 0, len(data), b"<", b">", b".", 0, 2, 9) == encoder.copy_batches(
        data, 0, len(data), b"<", b">", b".", 0, 2, 9
    )
    # The encoder's buffers are reused from call to call: a second call gives the same batches.
    assert twin.copy_batches(data, 0, len(data), b"<", b">", b".", 0, 2, 9) == encoder.copy_batches(
        data, 0, len(data), b"<", b">", b".", 0, 2, 9
    )


NATIVE_ZSTD = native.speedups is not None and native.speedups.zstd_version() is not None


@pytest.mark.skipif(not NATIVE_ZSTD, reason="the extension found no libzstd (libzstd.so.1): Python compresses")
def test_the_native_pass_compresses_its_batches_itself_and_reuses_its_buffers() -> None:
    columns = [RelationColumn(True, "id", Oid.INT8, -1), RelationColumn(False, "label", Oid.TEXT, -1)]
    encoder = RowConverter(columns, TypesConfig()).native_encoder([0, 1], [0])
    assert encoder is not None
    import pyarrow as pa

    rows = 30_000  # ~1.5 MB of records: several zstd frames (COMPRESS_SEGMENT) per batch
    data = b"".join(b"%d\tlabel %d\n" % (i, i) for i in range(rows))
    for nparts in (3, 1, 5, 2):  # fewer and more partitions than the call before
        plain = encoder.copy_batches(data, 0, len(data), b"<", b">", b".", 7, nparts, 9)
        zipped = encoder.copy_batches(data, 0, len(data), b"<", b">", b".", 7, nparts, 9, batch_codec.ZSTD_LEVEL)
        assert plain[:2] == zipped[:2] == (len(data), rows + 7)
        for mine, small in zip(plain[2], zipped[2], strict=True):
            assert (mine is None) == (small is None)
            if mine is None or small is None:
                continue
            assert mine[1:] == (*small[1:3], 0) and small[3] == batch_codec.CODEC_ZSTD
            assert len(small[0]) < len(mine[0]) // 3
            sealed = bytes(batch_codec.EncodedBatch(small[0], small[1], 9, small[3]).seal(0))
            header = batch_codec.parse_header(sealed)
            assert header is not None and batch_codec.crc_ok(sealed, 0, header)
            records, at = batch_codec.records_section(sealed, 0, header)
            assert bytes(records[at:]) == bytes(mine[0][batch_codec.HEADER_SIZE :])
            # The frames read with pyarrow's codec too (readers without the extension).
            raw = len(mine[0]) - batch_codec.HEADER_SIZE
            frames = small[0][batch_codec.HEADER_SIZE + 4 :]
            assert small[0][batch_codec.HEADER_SIZE : batch_codec.HEADER_SIZE + 4] == raw.to_bytes(4, "little")
            unpacked = pa.Codec("zstd").decompress(frames, decompressed_size=raw, asbytes=True)
            assert unpacked == bytes(mine[0][batch_codec.HEADER_SIZE :])
    # Records zstd cannot make smaller (one short row: the frame's own bytes are more) come back
    # plain (codec 0), as compress_records decides, the same as without compression.
    one = b"1\ta\n"
    tiny = encoder.copy_batches(one, 0, len(one), b"", b"", b"", 0, 1, 9, batch_codec.ZSTD_LEVEL)
    assert tiny == encoder.copy_batches(one, 0, len(one), b"", b"", b"", 0, 1, 9) and tiny[2][0][3] == 0


def test_without_native_zstd_the_batches_come_back_plain_and_python_compresses_them(monkeypatch) -> None:
    columns = [RelationColumn(True, "id", Oid.INT8, -1), RelationColumn(False, "label", Oid.TEXT, -1)]
    relation = Relation(9, "public", "t", ReplicaIdentity.DEFAULT, tuple(columns))
    builder = EventBuilder("src", "db", _decoders(columns, TypesConfig()))
    builder.relation(relation)
    if builder.snapshot_pieces(9, 5)[0] is None:
        pytest.skip("no native encoder (HEADWATER_NATIVE=0 or no extension)")
    data = b"".join(b"%d\tlabel %d\n" % (i, i) for i in range(2000))
    results = []
    for native_zstd in (True, False):
        if native_zstd and not NATIVE_ZSTD:
            continue
        monkeypatch.setattr(
            "capture.postgres.snapshot.native_pass._native_zstd", lambda native_zstd=native_zstd: native_zstd
        )
        piece = encode_piece(
            builder, 9, data, (0, len(data), 2000), Seq(5, 0), partitions=3, ts_us=1, log=file_batches("zstd")
        )
        batches = [batch for part in piece for batch in part if isinstance(batch, PartitionBatch)]
        assert batches and all(batch.batch.codec == batch_codec.CODEC_ZSTD for batch in batches)
        results.append([(b.partition, b.last_index, _plain_records(b.batch)) for b in batches])
    assert all(result == results[0] for result in results)


def _plain_records(batch: batch_codec.EncodedBatch) -> list[tuple[bytes | None, bytes | None]]:
    sealed = bytes(batch.seal(0))
    header = batch_codec.parse_header(sealed)
    assert header is not None and batch_codec.crc_ok(sealed, 0, header)
    out: list = []
    batch_codec.decode_records(
        sealed, 0, header, topic="", partition=0, min_offset=0, out=out, max_records=10**6, max_bytes=1 << 40
    )
    return [(r.key, r.value) for r in out]  # the timestamps are each call's own clock


@st.composite
def row_messages(draw: st.DrawFn) -> tuple[bytes, bool]:
    in_stream = draw(st.booleans())
    kind = draw(st.sampled_from(["I", "U", "UK", "UO", "DK", "DO"]))
    head = kind[0].encode() + (struct.pack(">I", draw(st.integers(0, 2**32 - 1))) if in_stream else b"")
    head += struct.pack(">I", draw(st.integers(0, 2**32 - 1)))
    old, new = _tuple_bytes(draw(tuple_values)), _tuple_bytes(draw(tuple_values))
    body = {
        "I": b"N" + new,
        "U": b"N" + new,
        "UK": b"K" + old + b"N" + new,
        "UO": b"O" + old + b"N" + new,
        "DK": b"K" + old,
        "DO": b"O" + old,
    }[kind]
    return head + body, in_stream


@FAST
@given(message=row_messages(), cut=st.integers(0, 30), junk=st.binary(max_size=4))
def test_row_messages_decode_identically(message, cut, junk) -> None:
    data, in_stream = message

    def decode(payload: bytes, use_native: bool) -> object:
        import capture.postgres.decoding.pgoutput as pgoutput

        saved = pgoutput._native_decode_change, pgoutput._native_read_tuple
        if not use_native:
            pgoutput._native_decode_change = pgoutput._native_read_tuple = None
        try:
            decoder = PgoutputDecoder(2)
            decoder.in_stream = in_stream
            return decoder.decode(payload)
        except PgoutputDecodeError as exc:
            return repr(exc)
        finally:
            pgoutput._native_decode_change, pgoutput._native_read_tuple = saved

    for payload in (data, data + junk, data[: max(1, len(data) - cut)]):
        assert decode(payload, True) == decode(payload, False)
