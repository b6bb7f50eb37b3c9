"""ColumnRecords as the file log's column batches: per partition, the bytes the Record path writes."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import native
from log.base import Record, TopicSpec
from log.column_records import ColumnRecords
from log.file import column_batches as column_batches_module
from log.file.backend import FileLog
from log.file.batch_codec import encode_batch, encode_headers
from log.file.column_batches import BatchScratch, _column_batches_python, column_batches
from log.partitioner import partitions_for

NOW = 1_763_700_000_123
MARKER = (("headwater.feed.batch", b"0123456789abcdef:42"),)
TYPES = [pa.string(), pa.large_string(), pa.binary()]
#: Reused by every example: a buffer left longer by an earlier example must not leak into a batch.
SCRATCH = BatchScratch()

texts = st.one_of(st.none(), st.text(max_size=12), st.sampled_from(["", '{"id":1}', "é€😀", '{"k":"\\u0000"}']))
rows = st.lists(st.tuples(texts, texts, st.one_of(st.none(), st.booleans())), max_size=40)


def record_path(keys, values, deletes, headers):
    """The records the feed writer built one ``Record`` at a time before ColumnRecords."""
    out = []
    for key, value, delete in zip(keys, values, deletes, strict=True):
        key_bytes = None if key is None else key.encode()
        out.append(Record(key_bytes, None if value is None else value.encode(), headers, NOW))
        if delete:
            out.append(Record(key_bytes, None, headers, NOW))
    return out


def expected_batches(records, partitions, base=7):
    routed = partitions_for([r.key for r in records], partitions)
    out = []
    for partition in range(partitions):
        mine = [r for r, p in zip(records, routed, strict=True) if p == partition]
        out.append(encode_batch(base, mine, 0)[0] if mine else None)
    return out


def sealed(batches, base=7):
    return [None if b is None else bytes(encode_batch(base, b, 0)[0]) for b in batches]


def column(data, type_):
    return pa.array([None if v is None else (v.encode() if pa.types.is_binary(type_) else v) for v in data], type_)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=rows,
    partitions=st.integers(1, 5),
    type_=st.sampled_from(TYPES),
    headers=st.sampled_from([MARKER, (), (("a", b""), ("é", b"x" * 3))]),
    cut=st.integers(0, 3),
)
def test_batches_are_the_record_paths_bytes_native_and_python(data, partitions, type_, headers, cut):
    # Sliced arrays (non-zero Arrow offsets) are what a column taken from a bigger table looks like.
    padded = [("pad", "pad", True)] * cut + data
    keys = column([k for k, _, _ in padded], type_)[cut:]
    values = column([v for _, v, _ in padded], type_)[cut:]
    deletes = pa.array([d for _, _, d in padded], pa.bool_())[cut:]
    records = ColumnRecords(keys, values, deletes, headers)
    reference = record_path([k for k, _, _ in data], [v for _, v, _ in data], [bool(d) for _, _, d in data], headers)
    assert len(records) == len(reference)
    assert [(r.key, r.value, r.headers) for r in records] == [(r.key, r.value, r.headers) for r in reference]
    want = [None if b is None else bytes(b) for b in expected_batches(reference, partitions)]
    python = _column_batches_python(records, partitions, encode_headers(headers), NOW)
    assert sealed(python) == want
    if native.speedups is not None:
        assert sealed(column_batches(records, partitions, NOW)) == want
        assert sealed(column_batches(records, partitions, NOW, SCRATCH)) == want


def test_chunked_columns_and_no_delete_flags():
    keys = pa.chunked_array([['{"id":1}', '{"id":2}'], ['{"id":3}']])
    values = pa.chunked_array([["a", ""], ["c"]])
    records = ColumnRecords(keys, values, None, MARKER)
    reference = record_path(['{"id":1}', '{"id":2}', '{"id":3}'], ["a", "", "c"], [False] * 3, MARKER)
    assert len(records) == 3
    assert sealed(column_batches(records, 2, NOW)) == [
        None if b is None else bytes(b) for b in expected_batches(reference, 2)
    ]


def test_python_twin_runs_when_the_extension_is_off(monkeypatch):
    records = ColumnRecords(pa.array(['{"id":1}', None]), pa.array(["v", "w"]), pa.array([True, False]), MARKER)
    monkeypatch.setattr(column_batches_module, "_native", None)
    batches = column_batches(records, 3, NOW)
    reference = record_path(['{"id":1}', None], ["v", "w"], [True, False], MARKER)
    assert sealed(batches) == [None if b is None else bytes(b) for b in expected_batches(reference, 3)]


def test_empty_columns_give_no_batches():
    records = ColumnRecords(pa.array([], pa.string()), pa.array([], pa.string()), pa.array([], pa.bool_()), MARKER)
    assert len(records) == 0 and not records
    assert column_batches(records, 3, NOW) == [None, None, None]


def test_mismatched_or_wrong_columns_are_refused():
    with pytest.raises(ValueError, match="2 keys but 1 values"):
        ColumnRecords(pa.array(["a", "b"]), pa.array(["v"]), None, ())
    with pytest.raises(TypeError, match="string or binary"):
        ColumnRecords(pa.array([1]), pa.array(["v"]), None, ())


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_file_log_segments_are_identical_to_the_record_paths(tmp_path, compression):
    n = 3000
    keys = [f'{{"id":{i}}}' for i in range(n)]
    values = [f'{{"after":{{"id":{i},"name":"c-{i}"}},"op":"{"d" if i % 9 == 0 else "u"}"}}' for i in range(n)]
    deletes = [i % 9 == 0 for i in range(n)]
    logs = {}
    for path in ("records", "columns"):
        log = FileLog(tmp_path / path, compression=compression)
        log.create_topic(TopicSpec("feed", partitions=3))
        logs[path] = log
    try:
        reference = record_path(keys, values, deletes, MARKER)
        routed = partitions_for([r.key for r in reference], 3)
        for partition in range(3):
            mine = [r for r, p in zip(reference, routed, strict=True) if p == partition]
            logs["records"].append("feed", partition, mine)
        columns = ColumnRecords(pa.array(keys), pa.array(values), pa.array(deletes), MARKER)
        for partition, batch in enumerate(column_batches(columns, 3, NOW)):
            assert batch is not None
            logs["columns"].append("feed", partition, batch)
        for partition in range(3):
            segments = {
                path: [f.read_bytes() for f in sorted((tmp_path / path / "feed" / str(partition)).glob("*.log"))]
                for path in logs
            }
            assert segments["columns"] == segments["records"] and segments["columns"][0]
            assert logs["columns"].end_offset("feed", partition) == routed.count(partition)
    finally:
        for log in logs.values():
            log.close()


@pytest.mark.skipif(native.speedups is None, reason="the scratch buffers are the extension's (HEADWATER_NATIVE=0)")
def test_scratch_buffers_are_reused_only_when_no_batch_holds_them():
    scratch = BatchScratch()
    first = ColumnRecords(pa.array(['{"id":1}', '{"id":2}']), pa.array(["a", "b"]), None, MARKER)
    second = ColumnRecords(
        pa.array(['{"id":1}', '{"id":2}']), pa.array(["x" * 500, "y"]), pa.array([True, True]), MARKER
    )
    held = column_batches(first, 1, NOW, scratch)
    kept = bytes(held[0].buffer)
    again = column_batches(second, 1, NOW, scratch)
    assert again[0].buffer is not held[0].buffer and bytes(held[0].buffer) == kept, "a held batch is never overwritten"
    buffer = id(again[0].buffer)  # the scratch keeps it alive: the id stays its own
    want = sealed(column_batches(second, 1, NOW))
    del again, held
    reused = column_batches(second, 1, NOW, scratch)
    assert id(reused[0].buffer) == buffer, "a buffer only the scratch holds is built in again"
    assert sealed(reused) == want
    del reused
    small = column_batches(first, 1, NOW, scratch)  # the same buffer, shrunk: no byte of the longer batch left
    assert id(small[0].buffer) == buffer
    assert sealed(small) == sealed(column_batches(first, 1, NOW))
    tiny = BatchScratch(max_bytes=10)
    column_batches(second, 1, NOW, tiny)
    assert tiny.buffers == [None], "more than max_bytes is not kept"
