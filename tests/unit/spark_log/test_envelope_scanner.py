"""The envelope scanner: C and Python twin agree, and the batches equal the whole-envelope parse's (pure, no Spark)."""

from __future__ import annotations

import json
from unittest import mock

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from log.base import StoredRecord
from log.columns import RecordColumns
from native import speedups
from spark_log import source_batches as event_batches
from spark_log.envelope_scanner import _scan_envelopes_python, scan_envelopes
from spark_log.errors import UndecodableValueError
from tests.unit.spark_log.test_source_batches import RECORDS, TOPIC, builder

native = pytest.mark.skipif(speedups is None, reason="the native extension is not built (or HEADWATER_NATIVE=0)")


def twin(values: pa.Array):
    return _scan_envelopes_python(values.buffers()[1], values.buffers()[2], values.offset, len(values))


def c_scan(values: pa.Array):
    assert speedups is not None
    scanned = speedups.scan_envelopes(values.buffers()[1], values.buffers()[2], values.offset, len(values))
    return None if scanned is None else tuple(scanned)


def same_scan(values: pa.Array) -> None:
    expected = twin(values)
    got = c_scan(values)
    assert got == (None if expected is None else tuple(expected))


def columns(values: list[bytes | None]) -> RecordColumns:
    records = [StoredRecord(TOPIC, 0, i, 1_700_000_000_000 + i, b'{"id":1}', v) for i, v in enumerate(values)]
    return RecordColumns.from_records(TOPIC, 0, records)


def whole_envelope_parse(build, cols):
    """The batch (or the error) as built without the scanner."""
    with mock.patch.object(event_batches, "scan_envelopes", lambda values: None):
        return outcome(build, cols)


def outcome(build, cols):
    try:
        return build.build_columns(cols)
    except Exception as exc:  # the verdict to compare, whichever it is
        return exc


def same_batches(values: list[bytes | None], tombstones: bool = False) -> None:
    build = builder(include_tombstones=tombstones)
    expected = whole_envelope_parse(build, columns(values))
    got = outcome(build, columns(values))
    if isinstance(expected, Exception):
        assert type(got) is type(expected)
        assert str(got) == str(expected)
    else:
        assert isinstance(got, pa.RecordBatch), got
        assert got.schema.equals(expected.schema)
        assert got.equals(expected)


# --------------------------------------------------------------------------- generated envelopes

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
)
nested = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner, max_size=3)),
)
MISSING = object()
ODD_IDS = st.sampled_from([1.0, "1", 2**70, True, -(2**63)])
ODD_INTS = st.sampled_from([-1, 10**18, 10**19, 1.5, "7", True])
ODD_STRINGS = st.sampled_from([True, 3, []])


def images(odd: bool):
    ids = st.one_of(st.none(), st.integers(-(2**31), 2**31 - 1), *([ODD_IDS] if odd else []))
    prices = st.one_of(
        st.none(), st.integers(-5, 5), st.sampled_from(["1.50", "-0.01", *(["NaN", "1e3", "1x"] if odd else [])])
    )
    image = st.fixed_dictionaries({"id": ids, "price": prices}, optional={"extra": nested, "n\u00e9": nested})
    return st.one_of(st.none(), st.just(MISSING), image, *([st.sampled_from([[], "text", 5, {}])] if odd else []))


def sources(odd: bool):
    ints = st.one_of(st.none(), st.just(MISSING), st.integers(0, 2**59), *([ODD_INTS] if odd else []))
    strings = st.one_of(st.none(), st.just(MISSING), st.text(max_size=6), *([ODD_STRINGS] if odd else []))
    source = st.fixed_dictionaries(
        {
            "commit_lsn": ints,
            "txn_index": ints,
            "ts_us": ints,
            "snapshot": strings,
            "db": strings,
            "schema": strings,
            "table": strings,
            "extra": st.one_of(st.just(MISSING), nested),
        }
    )
    return st.one_of(st.none(), st.just(MISSING), source, *([st.sampled_from([[], "s", 1])] if odd else []))


def ops(odd: bool):
    chosen = ["c", "u", "d", "r", "m", "t", None, MISSING, "\u00e9\U0001f600", *([1, True] if odd else [])]
    return st.one_of(st.sampled_from(chosen), st.text(max_size=3))


@st.composite
def envelopes(draw) -> bytes | None:
    """A change envelope's JSON as the capture writes it, with odd fields or hostile bytes one time in eight."""
    if draw(st.integers(0, 15)) == 0:
        return None  # tombstone
    odd = draw(st.integers(0, 7)) == 0
    fields = {
        "op": draw(ops(odd)),
        "before": draw(images(odd)),
        "after": draw(images(odd)),
        "source": draw(sources(odd)),
        "ts_ms": draw(st.one_of(st.integers(0, 2**50), st.just(MISSING))),
        "transaction": draw(st.one_of(nested, st.just(MISSING))),
        "message": draw(st.one_of(st.just(MISSING), st.fixed_dictionaries({"prefix": st.text(max_size=3)}))),
    }
    envelope = {k: _drop_missing(v) for k, v in fields.items() if v is not MISSING}
    order = draw(st.permutations(list(envelope)))
    envelope = {k: envelope[k] for k in order}
    text = json.dumps(
        envelope,
        ensure_ascii=draw(st.booleans()),
        indent=draw(st.sampled_from([None, None, 0, 2])),
        separators=draw(st.sampled_from([(",", ":"), (", ", ": "), (" ,\t", " :\r\n ")])),
    ).encode()
    mutation = draw(st.integers(0, 9)) if odd else -1
    if mutation in (0, 1, 2) and text:  # hostile bytes: cut, or one byte changed
        at = draw(st.integers(0, len(text) - 1))
        text = text[:at] if draw(st.booleans()) else text[:at] + bytes([draw(st.integers(0, 255))]) + text[at + 1 :]
    elif mutation == 3:  # a field given twice
        text = text[:-1] + b',"op":"c"}'
    elif mutation == 4:  # surrounding whitespace
        text = b" " + text
    return text


def _drop_missing(value):
    if isinstance(value, dict):
        return {k: _drop_missing(v) for k, v in value.items() if v is not MISSING}
    return value


@native
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(envelopes(), min_size=1, max_size=6))
def test_native_and_twin_scan_alike(values):
    array = pa.array([v for v in values if v is not None], pa.binary())
    same_scan(array)
    for i in range(len(array)):
        same_scan(array.slice(i, 1))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(envelopes(), min_size=1, max_size=6), st.booleans())
def test_scanned_batches_equal_the_whole_envelope_parse(values, tombstones):
    same_batches(values, tombstones)


# --------------------------------------------------------------------------- chosen cases

REGULAR = RECORDS[0].value


@pytest.mark.parametrize(
    "odd",
    [
        b"{not json}",
        b'{"op":"c","after":{"id":1,"price":"1.00"},"x":[1,]}',  # invalid in a field nobody reads
        b'{"op":"c","after":{"id":1,"price":"1.00"},"x":NaN}',  # pyarrow reads NaN, orjson does not
        b'{"op":"c","after":{"id":1,"price":"1.00"},"x":"\xff"}',  # not UTF-8
        b'{"op":"c","after":{"id":1,"price":"1.00"},"x":"\\ud800"}',  # a lone surrogate
        b'{"op":"c","after":{"id":1,"price":"1.00"},"x":"\\ud83d\\ude00"}',
        b'{"op":5,"after":{"id":1,"price":"1.00"}}',  # op of the wrong type
        b'{"op":"\\u0063","after":{"id":1,"price":"1.00"}}',  # escaped op
        b'{"o\\u0070":"c","after":{"id":1,"price":"1.00"}}',  # escaped key
        b'{"op":"c","op":"u","after":{"id":1,"price":"1.00"}}',
        b'{"op":"c","after":{"id":1,"price":"1.00"},"x":1,"x":[2]}',  # a field nobody reads, twice
        b'{"op":"c","after":{"id":1,"price":"1.00","id":2}}',  # an image field twice
        b'{"op":"c","after":{"id":1,"price":"1.00"},"source":{"v":1,"v":2,"db":"a"}}',
        b'{"op":"c","after":"{\\"id\\":1}"}',  # image as a JSON string
        b'{"op":"c","after":[1]}',
        b'{"op":"c","after":{"id":1,"price":"1.00"},"source":[]}',
        b'{"op":"c","after":{"id":1,"price":"1.00"},"source":{"commit_lsn":"5"}}',
        b'{"op":"c","after":{"id":1,"price":"1.00"},"source":{"commit_lsn":5.0}}',
        b'{"op":"c","after":{"id":1,"price":"1.00"},"source":{"commit_lsn":1234567890123456789}}',
        b'{"op":"c","after":{"id":1,"price":"1.00"},"source":{"commit_lsn":-0,"txn_index":-1}}',
        b'{"op":"c","after":{"id":1,"price":"1.00"},"source":{"snapshot":true}}',
        b'{"op":"c","after":{"id":1,"price":"1.00"},"source":{"db":null,"db":"x"}}',
        b'{"op":"c","after":{"id":1,"price":"1.00"},"source":null}',
        b'{"op":"c","after":{"id":1,"price":"1.00"}}{"op":"c"}',  # two documents in one value
        b'{"op":"c","after":{"id":1,"price":"1.00"}',
        b'{"after":{"id":1,"price":"1.00"}}',  # no op
        b'{"op":"m","message":{"prefix":"p","content":"AQ=="}}',  # a logical message
        b'{"op":"t","source":{"commit_lsn":9,"txn_index":0}}',  # a truncate
        b'{"id":1,"price":"1.00"}',  # no envelope
        b'{"op":"c","before":null,"after":{"id":1,"price":"1.00","deep":' + b"[" * 300 + b"]" * 300 + b"}}",
        b'{"op":"c","after":{"id":1,"price":"1.00","deep":' + b"[" * 150 + b"]" * 150 + b"}}",
        b"",
        b"{}",
    ],
)
def test_irregular_values_build_as_before(odd):
    same_batches([REGULAR, odd, None, REGULAR])
    same_batches([REGULAR, odd, None], tombstones=True)
    if speedups is not None:
        same_scan(pa.array([REGULAR, odd], pa.binary()))


@pytest.mark.parametrize(
    ("odd", "named"),
    [
        (b'{"op":"c","after":{"id":1,"price":"1.00"}', "not a JSON object"),
        (b'{"op":"c","after":{"id":1,"price":"x"}}', "after.price"),
        (b'{"op":"c","after":{"id":"one","price":"1.00"}}', "after.id"),
    ],
)
def test_a_bad_value_raises_the_error_it_raised_before(odd, named):
    build = builder()
    expected = whole_envelope_parse(build, columns([REGULAR, odd]))
    assert isinstance(expected, UndecodableValueError)
    assert named in str(expected)
    with pytest.raises(UndecodableValueError) as raised:
        build.build_columns(columns([REGULAR, odd]))
    assert str(raised.value) == str(expected)
    assert "items/0@1" in str(raised.value)


def test_regular_envelopes_are_scanned_and_read_as_before():
    values = [r.value for r in RECORDS]
    assert scan_envelopes(pa.array([v for v in values if v is not None], pa.binary())) is not None
    same_batches(values)
    same_batches(values, tombstones=True)


@native
def test_native_rejects_offsets_outside_the_data():
    bad = pa.py_buffer(np.array([0, 50], np.int32).tobytes())
    with pytest.raises(ValueError, match="outside the data"):
        speedups.scan_envelopes(bad, pa.py_buffer(b"{}"), 0, 1)
    with pytest.raises(ValueError, match="outside the data"):
        _scan_envelopes_python(bad, pa.py_buffer(b"{}"), 0, 1)
    with pytest.raises(ValueError, match="do not cover"):
        speedups.scan_envelopes(bad, pa.py_buffer(b"{}"), 1, 1)
    with pytest.raises(ValueError, match="do not cover"):
        _scan_envelopes_python(bad, pa.py_buffer(b"{}"), 1, 1)
