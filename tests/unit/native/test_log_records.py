"""The file log's records read by the extension (native/log_records.c) are its Python twin's, or handed back.

Random batches (keys and values absent, empty or long; timestamps of any sign; some records with
headers; plain and zstd-compressed) are read with every selection a read makes (a minimum offset,
a record limit, a byte budget, records already held): the extension's records and return value
equal the twin's, element by element and type by type, wherever it answers; it answers every
batch without headers, and hands back one with headers, a memoryview or a cut-off buffer.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from log.base import Record, StoredRecord
from log.file.batch_codec import _decode_records, encode_batch, parse_header, records_section
from native import speedups

pytestmark = pytest.mark.skipif(speedups is None, reason="the extension is not built (HEADWATER_NATIVE=0, no compiler)")

_blob = st.none() | st.binary(max_size=300)
_record = st.builds(
    Record,
    key=_blob,
    value=_blob,
    headers=st.just(()),
    timestamp_ms=st.integers(-(2**62), 2**62),
)


def _batch(records: list[Record], base: int, compression: str) -> tuple[bytes, int, Any]:
    data = bytes(encode_batch(base, records, 0, compression)[0])  # type: ignore[arg-type]
    header = parse_header(data, 0)
    assert header is not None
    buf, p = records_section(data, 0, header)
    return bytes(buf), p, header


def _both(buf: Any, p: int, header: Any, *, min_offset: int, max_records: int, max_bytes: int, held: int) -> Any:
    assert speedups is not None
    prior = [StoredRecord("t", 0, -1, 0, None, None)] * held
    twin_out = list(prior)
    twin_used = _decode_records(
        buf, p, header, topic="t", partition=2, min_offset=min_offset, out=twin_out,
        max_records=max_records, max_bytes=max_bytes,
    )  # fmt: skip
    native = speedups.decode_records(
        buf, p, header.record_count, header.base_offset, min_offset, "t", 2, StoredRecord,
        max_records - held, max_bytes, held,
    )  # fmt: skip
    return (twin_out[held:], twin_used), native


@settings(max_examples=400, deadline=None)
@given(
    st.lists(_record, min_size=1, max_size=30),
    st.integers(0, 10**12),
    st.sampled_from(["none", "zstd"]),
    st.integers(0, 40),
    st.integers(0, 35),
    st.integers(0, 12_000) | st.integers(-40, -1),
    st.integers(0, 2),
)
def test_records_are_the_twins_under_every_selection(
    records: list[Record], base: int, compression: str, skip: int, max_records: int, max_bytes: int, held: int
) -> None:
    buf, p, header = _batch(records, base, compression)
    if max_bytes < 0:  # a budget that ends exactly at a record's end (-1: the first kept one's)
        sizes = [24 + len(r.key or b"") + len(r.value or b"") for i, r in enumerate(records) if i >= skip]
        max_bytes = sum(sizes[: min(-max_bytes, len(sizes))])
    (twin_records, twin_used), native = _both(
        buf, p, header, min_offset=base + skip, max_records=max_records, max_bytes=max_bytes, held=held
    )
    assert native is not None, "a plain batch without headers is the extension's to read"
    native_records, native_used = native
    assert native_used == twin_used
    assert native_records == twin_records
    for mine, theirs in zip(native_records, twin_records, strict=True):
        assert type(mine) is StoredRecord
        assert [type(field) for field in mine] == [type(field) for field in theirs]


def test_a_batch_with_headers_a_memoryview_or_a_cut_buffer_goes_to_the_twin() -> None:
    assert speedups is not None
    with_headers = [Record(b"k", b"v"), Record(b"k2", b"v2", headers=(("h", b"1"),))]
    buf, p, header = _batch(with_headers, 7, "none")
    args = (p, header.record_count, header.base_offset, 0, "t", 0, StoredRecord, 10, 1 << 30, 0)
    assert speedups.decode_records(buf, *args) is None
    buf, p, header = _batch([Record(b"k", b"value")] * 3, 7, "none")
    args = (p, header.record_count, header.base_offset, 0, "t", 0, StoredRecord, 10, 1 << 30, 0)
    assert speedups.decode_records(memoryview(buf), *args) is None
    assert speedups.decode_records(buf[:-1], *args) is None  # the last value cut short
    assert speedups.decode_records(buf, *args) is not None


def test_records_of_plain_values_are_left_to_reference_counting() -> None:
    """StoredRecords hold no container: the cyclic GC need not track them (a held batch costs it nothing)."""
    import gc

    buf, p, header = _batch([Record(b"k", b"v"), Record(None, None)], 0, "none")
    decoded = speedups.decode_records(buf, p, header.record_count, 0, 0, "t", 0, StoredRecord, 9, 1 << 30, 0)  # type: ignore[union-attr]
    assert decoded is not None
    assert [gc.is_tracked(r) for r in decoded[0]] == [False, False]
