"""Records of one log partition as Arrow columns, and the logs that can read them that way.

A reader that turns records into Arrow anyway (the ``headwater_log`` Spark source,
resync's key scan) asks a log that :class:`ColumnarReads` for :class:`RecordColumns`
instead of a ``StoredRecord`` per record. The records are exactly those
:meth:`log.base.Log.read` gives for the same offsets (compacted gaps, tombstones, null
keys, retention); record headers are not carried.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from log.base import StoredRecord

if TYPE_CHECKING:  # imported where columns are built: capture imports this module, and streams without pyarrow
    import pyarrow as pa  # type: ignore[import-untyped]  # no stubs


@dataclass(frozen=True, slots=True)
class RecordColumns:
    """Records of one partition, in offset order, as Arrow arrays of equal length.

    ``offsets`` and ``timestamps_ms`` are int64; ``keys`` and ``values`` binary (null: no
    key; a tombstone). Headers are not carried.
    """

    topic: str
    partition: int
    offsets: pa.Array
    timestamps_ms: pa.Array
    keys: pa.Array
    values: pa.Array

    def __len__(self) -> int:
        return len(self.offsets)

    def filter(self, mask: pa.Array) -> RecordColumns:
        """The rows where ``mask`` (a boolean array of this length) is true."""
        chosen = (column.filter(mask) for column in (self.offsets, self.timestamps_ms, self.keys, self.values))
        return RecordColumns(self.topic, self.partition, *chosen)

    @classmethod
    def from_records(cls, topic: str, partition: int, records: Sequence[StoredRecord]) -> RecordColumns:
        """The columns of ``records`` (all of one partition), e.g. from a backend without a columnar read."""
        import pyarrow as pa  # type: ignore[import-untyped]  # no stubs

        return RecordColumns(
            topic,
            partition,
            pa.array([r.offset for r in records], pa.int64()),
            pa.array([r.timestamp_ms for r in records], pa.int64()),
            pa.array([r.key for r in records], pa.binary()),
            pa.array([r.value for r in records], pa.binary()),
        )

    def to_records(self) -> list[StoredRecord]:
        """One ``StoredRecord`` per row (without headers: the columns carry none)."""
        return [
            StoredRecord(self.topic, self.partition, offset, ts, key, value)
            for offset, ts, key, value in zip(
                self.offsets.to_pylist(),
                self.timestamps_ms.to_pylist(),
                self.keys.to_pylist(),
                self.values.to_pylist(),
                strict=True,
            )
        ]


@runtime_checkable
class ColumnarReads(Protocol):
    """A log whose partitions can be read as Arrow columns (the file backend: straight from the batches' bytes)."""

    def read_columns(
        self, topic: str, partition: int, offset: int, end: int, *, max_records: int = ..., max_bytes: int = ...
    ) -> tuple[RecordColumns, int]:
        """The records :meth:`log.base.Log.read` gives, those before ``end``, as columns; and the offset to go on from.

        Read ``[start, end)`` by calling again at the returned offset until it reaches ``end``
        or stays where it was (nothing more held).
        """
        ...
