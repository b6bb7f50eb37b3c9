"""Quarantine: change events whose values cannot be converted go to ``<topic>.quarantine``.

A bad record must neither stop capture nor vanish. Its record keeps everything needed
to repair and replay it by hand: the operation, the ``source`` block (with
``commit_lsn`` and ``txn_index``, so the agent's resume point covers quarantine topics
like any other), the raw text values exactly as pgoutput or COPY sent them, and the
reason, both in the value and in the ``headwater.error`` header.

Quarantine topics are not compacted: every bad record is kept.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson

from capture.column_policy import ColumnRules
from capture.tuples import UNCHANGED_TOAST, TupleData
from log.base import Log
from log.errors import BatchTooLargeError
from log.partitioner import partition_for
from log.topics import ERROR_HEADER, quarantine_topic


def raw_values(rules: ColumnRules, names: Sequence[str], row: TupleData | None) -> dict[str, str | None] | None:
    """Captured column name -> text value as received, masked columns masked.

    Columns left out (``columns.exclude``/``include``) are not there, nor are unchanged TOAST
    columns (never sent).
    """
    if row is None:
        return None
    out: dict[str, str | None] = {}
    for name, value in rules.raw_image(names, row):
        if value is UNCHANGED_TOAST:
            continue
        out[name] = value.hex() if isinstance(value, bytes) else value  # type: ignore[assignment]
    return out


def quarantine_value(
    *,
    op: str,
    source: Mapping[str, object],
    before: Mapping[str, str | None] | None,
    after: Mapping[str, str | None] | None,
    error: str,
) -> bytes:
    """The quarantine record's value: the event's shape with raw text values and the reason."""
    return orjson.dumps(
        {
            "op": op,
            "source": source,
            "before_raw": before,
            "after_raw": after,
            "error": error,
        }
    )


def error_headers(error: str) -> tuple[tuple[str, bytes], ...]:
    """The headers of a quarantine record."""
    return ((ERROR_HEADER, error.encode()),)


def append_or_quarantine(
    log: Log, topic: str, partition: int, records: Sequence[Any], ensure_topic: Callable[[str], int]
) -> None:
    """Append ``records`` (capture's ``OutRecord``s) as one batch, or as well as the log allows.

    When the log refuses the batch as too large (a Kafka record batch has a size limit), the
    records go one per append, in order: the partition stays in sequence order, only the
    batch's atomicity is given up. A record too large even alone is never dropped silently:
    a note of it (key, op, ``source`` with its sequence, size, reason) goes to
    ``<topic>.quarantine`` in its place and capture goes on.
    """
    try:
        log.append(topic, partition, records)
        return
    except BatchTooLargeError:
        if len(records) == 1:
            _quarantine_oversized(log, records[0], ensure_topic)
            return
    for record in records:
        try:
            log.append(topic, partition, [record])
        except BatchTooLargeError:
            _quarantine_oversized(log, record, ensure_topic)


def _quarantine_oversized(log: Log, record: Any, ensure_topic: Callable[[str], int]) -> None:
    size = len(record.value or b"")
    error = f"record of {size} bytes is larger than the log accepts in one batch; the row is in the source table"
    event = orjson.loads(record.value) if record.value else {}
    note = orjson.dumps({"op": event.get("op"), "source": event.get("source"), "value_bytes": size, "error": error})
    target = quarantine_topic(record.topic)
    count = ensure_topic(target)
    partition = 0 if record.key is None or count == 1 else partition_for(record.key, count)
    log.append(target, partition, [record._replace(topic=target, value=note, headers=error_headers(error))])
