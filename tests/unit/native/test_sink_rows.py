"""The PostgreSQL sink's native rows (native/sink_rows.c) are its Python twin's bytes, or handed back.

The twin is what the sink does without the extension: ``orjson.loads`` of each event, the row
image with its position, each column's converter and psycopg's ``COPY`` text. ``copy_text``
must give the same bytes for every event it answers, answer the events capture writes, and
return None (the twin's turn) for anything it cannot write exactly; ``event_ops`` must give
each event's op as the twin reads it, or ``?`` where only the twin can tell; ``copy_arrays`` must
turn that text into the twin's array literals (sinks/postgres/arrays.py). ``sink_records`` must
build the batch every sink delivers without a transform as ``sinks.records.as_sent``'s loop does.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Sequence
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from psycopg._copy_base import _format_row_text
from psycopg.adapt import Transformer

from log.base import StoredRecord
from native import speedups
from sinks import records as records_module
from sinks.postgres.arrays import column_arrays
from sinks.postgres.columns import _date, _timestamp, copy_rows, same
from sinks.postgres.sink import _parsed_event
from sinks.postgres.truncates import INDEX_COLUMN, LSN_COLUMN
from sinks.records import SinkRecord

pytestmark = pytest.mark.skipif(speedups is None, reason="the extension is not built (HEADWATER_NATIVE=0, no compiler)")

_CONVERTERS: dict[str, Callable[[Any], Any]] = {
    "i": same,
    "d": _date(None),  # type: ignore[arg-type]
    "T": _timestamp(1)(None),  # type: ignore[arg-type]
    "t": _timestamp(1000)(None),  # type: ignore[arg-type]
    "L": same,
    "X": same,
}
_COLUMNS = ["id", "flag", "name", "note", "day", "at_us", "at_ms", LSN_COLUMN, INDEX_COLUMN]
_KINDS = "iiiidTtLX"


def twin(values: Sequence[bytes], columns: Sequence[str] = _COLUMNS, kinds: str = _KINDS) -> bytes:
    """What the sink writes without the extension."""
    converters = {c: _CONVERTERS[k] for c, k in zip(columns, kinds, strict=True)}
    out = bytearray()
    transformer = Transformer()
    for value in values:
        row = _parsed_event(value)["after"]
        for each in copy_rows([row], columns, converters):
            _format_row_text(each, transformer, out)
    return bytes(out)


def native(values: list[bytes], columns: Sequence[str] = _COLUMNS, kinds: str = _KINDS) -> bytes | None:
    assert speedups is not None
    text: bytes | None = speedups.copy_text(values, [c.encode() for c in columns], kinds.encode())
    return text


def twin_arrays(values: Sequence[bytes]) -> list[str]:
    """The array literals the sink's statements read, without the extension."""
    converters = {c: _CONVERTERS[k] for c, k in zip(_COLUMNS, _KINDS, strict=True)}
    rows = [_parsed_event(value)["after"] for value in values]
    return column_arrays(rows, _COLUMNS, converters, Transformer(), "utf-8")


def native_arrays(values: list[bytes]) -> list[str] | None:
    assert speedups is not None
    text = native(values)
    return None if text is None else speedups.copy_arrays(text, len(_COLUMNS))


def event(after: dict[str, Any] | None, *, op: str = "u", lsn: int = 4_000_000_123, index: int = 7) -> dict[str, Any]:
    return {
        "before": None,
        "after": after,
        "source": {"version": "x", "name": "shop", "commit_lsn": lsn, "txn_index": index, "ts_ms": 1},
        "op": op,
        "ts_ms": 1_700_000_000_000,
    }


_text = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=40)
_rows = st.fixed_dictionaries(
    {"id": st.integers(-(2**63) + 1, 2**63 - 1)},
    optional={
        "flag": st.booleans() | st.none(),
        "name": _text | st.none(),
        "note": _text,
        "day": st.integers(-719_162, 2_932_896) | st.none(),
        "at_us": st.integers(-62_135_596_800_000_000, 253_402_300_799_999_999),
        "at_ms": st.integers(-62_135_596_800_000, 253_402_300_799_999),
    },
)


# The same JSON as orjson writes it (capture's events), and as json.dumps writes it with every
# non-ASCII character escaped (\uXXXX, surrogate pairs) and spaces between tokens.
def _ascii_dumps(obj: Any) -> bytes:
    return json.dumps(obj, ensure_ascii=True).encode()


def _spaced_dumps(obj: Any) -> bytes:
    return json.dumps(obj, indent=1).encode()


_dumps = st.sampled_from([orjson.dumps, _ascii_dumps, _spaced_dumps])


@settings(max_examples=300, deadline=None)
@given(st.lists(_rows, min_size=1, max_size=8), _dumps, st.integers(0, 2**62), st.integers(0, 2**31))
def test_rows_it_answers_are_the_twins_bytes_and_it_answers_what_capture_writes(
    rows: list[dict[str, Any]], dumps: Callable[[Any], bytes], lsn: int, index: int
) -> None:
    values = [dumps(event(row, lsn=lsn, index=index)) for row in rows]
    assert native(values) == twin(values)
    assert native_arrays(values) == twin_arrays(values)


def test_escapes_control_characters_and_text_as_psycopg_does() -> None:
    row = {"id": 1, "name": 'tab\there\nnew\\back\rcr\x0bvt\x0cff\x08bs\x01one\x7fdel "q" /s é 😀 \u2028'}
    for dumps in (orjson.dumps, _ascii_dumps):
        values = [dumps(event(row))]
        assert native(values) == twin(values)
    # \u escapes of every kind of character, and an escaped solidus
    raw = b'{"after":{"id":2,"name":"\\u0041\\u00e9\\u20ac\\ud83d\\ude00\\/\\u005c\\u0009"},"source":null,"op":"c"}'
    name = b"A\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80/\\\\\\t"
    assert native([raw]) == twin([raw]) == b"2\t\\N\t" + name + b"\t\\N" * 4 + b"\t0\t0\n"
    upper = raw.replace(b"\\u00e9", b"\\u00E9").replace(b"\\ud83d\\ude00", b"\\uD83D\\uDE00")
    assert upper != raw and native([upper]) == native([raw])


def test_array_literals_quote_every_value_and_escape_quotes_and_backslashes() -> None:
    awkward = 'tab\there\nnew\\back\rcr\x0bvt\x0cff\x08bs "q" {a,b} NULL é 😀'
    rows = [{"id": 1, "name": awkward, "note": ""}, {"id": 2, "name": "NULL", "flag": False}, {"id": 3}]
    values = [orjson.dumps(event(row)) for row in rows]
    got = native_arrays(values)
    assert got == twin_arrays(values)
    assert got is not None
    quoted = awkward.replace("\\", "\\\\").replace('"', '\\"')
    assert got[:4] == ['{"1","2","3"}', '{NULL,"f",NULL}', f'{{"{quoted}","NULL",NULL}}', '{"",NULL,NULL}']


@pytest.mark.parametrize(
    ("text", "count"),
    [(b"1\t2\n", 3), (b"1\t2\t3\n", 2), (b"1\t2", 2), (b"1\\x41\n", 1), (b"1\\\n", 1)],
)
def test_copy_arrays_refuses_other_widths_and_escapes(text: bytes, count: int) -> None:
    assert speedups is not None
    assert speedups.copy_arrays(text, count) is None


def test_dates_and_timestamps_at_the_ends_of_their_range() -> None:
    for day in (-719_162, -1, 0, 1, 2_932_896):
        values = [orjson.dumps(event({"id": 1, "day": day}))]
        assert native(values) == twin(values)
    for us in (-62_135_596_800_000_000, -1, 0, 1, 999_999, 1_000_000, 253_402_300_799_999_999):
        values = [orjson.dumps(event({"id": 1, "at_us": us, "at_ms": us // 1000}))]
        assert native(values) == twin(values)
    assert dt.date(1970, 1, 1) + dt.timedelta(days=2_932_896) == dt.date(9999, 12, 31)


@pytest.mark.parametrize(
    ("after", "why"),
    [
        ({"id": 1, "extra": 2}, "a column the replica lacks: the twin evolves the table"),
        ({"id": 1, "name": {"a": 1}}, "an object in a column written as it is"),
        ({"id": 1, "name": [1]}, "an array"),
        ({"id": 1.5}, "a number that is not a plain integer"),
        ({"id": 2**63}, "an integer past 64 bits"),
        ({"id": 1, "day": 2_932_897}, "a date past 9999-12-31 (the twin's date refuses it)"),
        ({"id": 1, "at_us": 253_402_300_800_000_000}, "a timestamp past the year 9999"),
        ({"id": 1, "day": "2020-01-01"}, "a date that is not a day count"),
        ({"id": 1, LSN_COLUMN: 5}, "the row image holds a position column (the twin overwrites it)"),
        (None, "no row image"),
    ],
)
def test_what_it_cannot_write_exactly_goes_to_the_twin(after: dict[str, Any] | None, why: str) -> None:
    values = [orjson.dumps(event({"id": 0})), orjson.dumps(event(after))]
    assert native(values) is None, why


@pytest.mark.parametrize(
    "raw",
    [
        b'{"after":{"id":1,"name":"nul \\u0000 here"},"op":"c"}',  # PostgreSQL text holds no NUL
        b'{"after":{"id":1,"name":"lone \\ud83d surrogate"},"op":"c"}',
        b'{"after":{"id":1,"name":"low \\ude00 first"},"op":"c"}',
        b'{"after":{"id":1,"na\\u006de":"escaped key"},"op":"c"}',
        b'{"after":{"id":1},"after":{"id":2},"op":"c"}',  # a key twice: orjson keeps the last
        b'{"after":{"id":1,"id":2},"op":"c"}',
        b'{"after":{"id":1},"source":{"commit_lsn":"12"},"op":"c"}',  # a position the twin reads with int()
        b'{"after":{"id":1},"source":{"commit_lsn":100000000000000000000},"op":"c"}',
    ],
)
def test_escapes_and_shapes_only_the_twin_reads_exactly_go_to_it(raw: bytes) -> None:
    assert native([raw]) is None


_ops = st.one_of(
    st.sampled_from(["c", "u", "d", "r", "t", "m", "", "cu", "é", "?"]), st.none(), st.integers(-1000, 1000)
)


@settings(max_examples=200, deadline=None)
@given(_ops, _dumps, st.booleans())
def test_event_ops_are_the_twins_op(op: Any, dumps: Callable[[Any], bytes], present: bool) -> None:
    body = event({"id": 1, "op": "d"}, op=op)  # an "op" inside the row image is not the event's
    if not present:
        del body["op"]
    value = dumps(body)
    assert speedups is not None
    got = chr(speedups.event_ops([value])[0])
    seen = orjson.loads(value).get("op")
    if got == "?":
        return  # the twin parses it; allowed for any event, required only below
    expected = seen if isinstance(seen, str) and len(seen) == 1 and seen.isascii() else " "
    assert got == expected


@pytest.mark.parametrize(
    "raw",
    [
        b'{"op":"\\u0063"}',  # an escaped op: the twin decodes it
        b'{"op":"c"',
        b'{"op":"c"} x',
        b'{"op":"c","before":tru}',
        b'{"op":"c","ts":1.}',
        b'{"op":"c","name":"\xff"}',  # not UTF-8
        b'{"op":"c","name":"\\x"}',
        b'[{"op":"c"}]',
        b"",
    ],
)
def test_event_ops_hand_what_json_or_orjson_refuses_to_the_twin(raw: bytes) -> None:
    assert speedups is not None
    assert speedups.event_ops([raw]) in (b"?",)


_stored = st.builds(
    StoredRecord,
    st.sampled_from(["shop.public.orders", "t"]),
    st.integers(0, 7),
    st.integers(0, 2**62),
    st.integers(-(2**40), 2**62),
    st.none() | st.binary(max_size=12),
    st.none() | st.binary(max_size=40),
    st.just(()) | st.just((("h", b"v"),)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_stored, max_size=20))
def test_sink_records_are_the_twins(records: list[StoredRecord]) -> None:
    built = records_module.as_sent(records)
    records_module.speedups = None  # the twin (no fixture: Hypothesis runs the body many times)
    try:
        expected = records_module.as_sent(records)
    finally:
        records_module.speedups = speedups
    assert speedups is not None
    assert speedups.sink_records(records, SinkRecord) == built
    assert built == expected
    assert all(type(r) is SinkRecord for r in built)
    assert [r.payload for r in built] == [r.value for r in records if r.value is not None]


def test_sink_records_hand_other_items_to_the_twin() -> None:
    assert speedups is not None
    record = StoredRecord("t", 0, 1, 2, b"k", b"v", ())
    assert speedups.sink_records([record, ("t", 0, 1)], SinkRecord) is None
    assert speedups.sink_records([record, "not a record"], SinkRecord) is None
    with pytest.raises(TypeError):
        speedups.sink_records([record], dict)


_string_parts = st.lists(
    st.sampled_from(
        [b"a", b"plain text", b"x" * 17, b'"', b"\\", b"\\n", b'\\"', b"\\u00e9", b"\x01", b"\x1f", b"\x7f",
         b"\xc3\xa9", b"\xe2\x82\xac", b"\xff", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80"]
    ),
    max_size=24,
)  # fmt: skip


@settings(max_examples=500, deadline=None)
@given(_string_parts, st.sampled_from([b"note", b"name"]))
def test_long_strings_are_read_as_json_reads_them(parts: list[bytes], column: bytes) -> None:
    """Plain bytes are passed 8 at a time: a quote, backslash, control or non-ASCII byte anywhere in a word counts."""
    text = b"".join(parts)
    row = b'{"id":1,"%s":"%s"}' % (column, text)
    value = b'{"before":null,"after":%s,"source":{"commit_lsn":5,"txn_index":0},"op":"c"}' % row
    try:
        orjson.loads(value)
    except orjson.JSONDecodeError:
        valid = False
    else:
        valid = True
    assert speedups is not None
    assert speedups.event_ops([value]) == (b"c" if valid else b"?")
    got = native([value], ["id", "name", "note"], "iii")
    if not valid:
        assert got is None
    elif got is not None:
        assert got == twin([value], ["id", "name", "note"], "iii")


def test_sink_records_of_plain_values_are_left_to_reference_counting() -> None:
    import gc

    assert speedups is not None
    plain = StoredRecord("t", 0, 1, 2, b"k", b"v", ())
    odd = StoredRecord("t", 0, 1, 2, [b"k"], b"v", ())  # a container: it could be part of a cycle
    built = speedups.sink_records([plain, odd], SinkRecord)
    assert [gc.is_tracked(r) for r in built] == [False, True]
