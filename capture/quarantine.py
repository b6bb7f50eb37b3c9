"""Quarantine: change events whose values cannot be converted go to ``<topic>.quarantine`` (DESIGN section 6).

A bad record must neither stop capture nor vanish. Its record keeps everything needed
to repair and replay it by hand: the operation, the ``source`` block (with
``commit_lsn`` and ``txn_index``, so the agent's resume point covers quarantine topics
like any other), the raw text values exactly as pgoutput or COPY sent them, and the
reason, both in the value and in the ``headwater.error`` header.

Quarantine topics are not compacted: every bad record is kept.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import orjson

from capture.pgoutput import UNCHANGED_TOAST, TupleData

#: Suffix of a table topic's quarantine topic.
QUARANTINE_SUFFIX = ".quarantine"
#: Header carrying the reason a record was quarantined.
ERROR_HEADER = "headwater.error"


def quarantine_topic(topic: str) -> str:
    """``<topic>.quarantine``."""
    return f"{topic}{QUARANTINE_SUFFIX}"


def is_quarantine_topic(topic: str) -> bool:
    """True for topics made by :func:`quarantine_topic` (stored without compaction)."""
    return topic.endswith(QUARANTINE_SUFFIX)


def raw_values(names: Sequence[str], row: TupleData | None) -> dict[str, str | None] | None:
    """Column name -> text value as received; unchanged TOAST columns are left out (never sent)."""
    if row is None:
        return None
    out: dict[str, str | None] = {}
    for name, value in zip(names, row, strict=False):
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
