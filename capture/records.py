"""What capture writes to the log: change records, schema records, and batches a log encoded."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson

from log.encoded_batches import EncodedRecords
from log.sequence import Sequence as Seq

#: Header carrying ``<commit_lsn>:<txn_index>`` on records whose value has no ``source`` block
#: (BEGIN/END of ``<source>.transaction``), so a restart knows what the log holds of them.
SEQUENCE_HEADER = "headwater.sequence"


def sequence_headers(commit_lsn: int, txn_index: int) -> tuple[tuple[str, bytes], ...]:
    """The :data:`SEQUENCE_HEADER` of a record at ``(commit_lsn, txn_index)``."""
    return ((SEQUENCE_HEADER, b"%d:%d" % (commit_lsn, txn_index)),)


class OutRecord(NamedTuple):
    """One record for the log. ``value=None`` is a tombstone; ``(commit_lsn, txn_index)`` orders it.

    It has every field of :class:`log.base.Record` (``key, value, headers, timestamp_ms``), so
    it can be appended as it is.
    """

    topic: str
    key: bytes | None
    value: bytes | None
    commit_lsn: int
    txn_index: int
    headers: tuple[tuple[str, bytes], ...] = ()
    timestamp_ms: int | None = None

    @property
    def sequence(self) -> Seq:
        """The record's position in the source's total order."""
        return Seq(self.commit_lsn, self.txn_index)


@dataclass(frozen=True, slots=True)
class SchemaRecord:
    """A table's column list, written to ``_headwater.schemas`` keyed by topic when it changes."""

    topic: str
    value: bytes


def dumps_kept(value: Any) -> bytes:
    """``orjson.dumps(value)`` as an exact-size copy, for bytes kept beyond the change (keys, cached images).

    orjson 3.13 returns its whole write buffer (4 KiB at least) behind a short result;
    100k cached row images of ~100 bytes held ~210 MB instead of ~25 MB.
    """
    return bytes(memoryview(orjson.dumps(value)))


@dataclass(frozen=True)
class PartitionBatch:
    """A batch of one partition in the log's own format (a native snapshot pass); the sequence of its last record."""

    partition: int
    batch: EncodedRecords
    commit_lsn: int
    last_index: int
