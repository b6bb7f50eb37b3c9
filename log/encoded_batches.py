"""The capability of logs that store batches producers encoded in the log's own batch format.

The file backend has it (``log/file/encoded_appends.py``): capture's native snapshot pass encodes
COPY text straight into its batches and feeds their Arrow columns (:class:`log.column_records.ColumnRecords`),
with no ``Record`` per row. A producer tests ``isinstance(log, AppendsEncodedBatches)``, as for
every log capability, and gets such batches only from the log itself.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

from log.base import AppendResult, Record

if TYPE_CHECKING:  # pyarrow: only a snapshot pass builds them, so a streaming capture never imports it
    from log.column_records import ColumnRecords

#: How a backend stores a batch's records: as they are, or zstd-compressed (``log.file.compression``).
BatchCompression = Literal["none", "zstd"]


class EncodedRecords(Sequence[Record], ABC):
    """Records already encoded in a backend's batch format: ``len()`` counts them; only that backend appends them."""

    @abstractmethod
    def compressed(self, compression: BatchCompression) -> EncodedRecords:
        """The batch with its records compressed as ``compression`` says (itself when that is no smaller)."""


@runtime_checkable
class AppendsEncodedBatches(Protocol):
    """A log that also stores batches a producer encoded in the log's own batch format, byte for byte.

    The file backend does: capture's native snapshot pass encodes COPY text straight into its
    batches, and feeds their Arrow columns (:class:`log.column_records.ColumnRecords`), with no
    ``Record`` per row. A producer gets such batches only from the log (:meth:`encoded_batch`,
    :meth:`column_batches`) and appends them with :meth:`append_encoded`, which has
    :meth:`Log.append`'s contract.
    """

    #: How this log stores batches' records; a producer's native encoder compresses alike.
    compression: BatchCompression
    #: The zstd level this log compresses at (a native encoder compressing in its pass uses it).
    zstd_level: int

    def append_encoded(self, topic: str, partition: int, batch: Sequence[Record]) -> AppendResult:
        """Append one encoded batch to one partition atomically and durably; return its offsets."""
        ...

    def encoded_batch(self, buffer: bytearray, count: int, max_timestamp: int, codec: int = 0) -> EncodedRecords:
        """``count`` records a native encoder wrote into ``buffer`` (after a header placeholder) as a batch."""
        ...

    def column_batches(self, records: ColumnRecords, partitions: int, now_ms: int) -> list[EncodedRecords | None]:
        """Per partition (Kafka's partitioner of the keys), its records as one encoded batch; None where none."""
        ...
