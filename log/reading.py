"""Reading a range of a partition, whatever the backend: in chunks, stopping at a given end."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from log.base import READ_MAX_BYTES, READ_MAX_RECORDS, Log, StoredRecord

if TYPE_CHECKING:  # log.columns loads pyarrow, which readers of records (schemas, capture) do without
    from log.columns import ColumnarReads, RecordColumns

#: Records per read call.
READ_CHUNK = READ_MAX_RECORDS


def read_range(
    log: Log, topic: str, partition: int, start: int, end: int, *, chunk: int = READ_CHUNK
) -> Iterator[list[StoredRecord]]:
    """Records of ``[start, end)`` in chunks; stops at ``end`` even if more has been appended since."""
    offset = start
    while offset < end:
        records = log.read(topic, partition, offset, max_records=min(chunk, end - offset))
        if not records:
            return  # retention removed the rest of the range, or nothing was there
        if records[-1].offset >= end:
            records = [r for r in records if r.offset < end]
            if not records:
                return
        yield records
        offset = records[-1].offset + 1


def read_range_columns(
    log: ColumnarReads,
    topic: str,
    partition: int,
    start: int,
    end: int,
    *,
    max_records: int = READ_MAX_RECORDS,
    max_bytes: int = READ_MAX_BYTES,
) -> Iterator[RecordColumns]:
    """The records of ``[start, end)`` as columns, a chunk of at most ``max_records`` / ``max_bytes`` at a time.

    Stops at ``end`` even if more has been appended since, and where the partition holds
    nothing more (retention removed the rest of the range, or nothing was there).
    """
    offset = start
    while offset < end:
        columns, resume = log.read_columns(topic, partition, offset, end, max_records=max_records, max_bytes=max_bytes)
        if len(columns):
            yield columns
        if resume <= offset:
            return
        offset = resume
