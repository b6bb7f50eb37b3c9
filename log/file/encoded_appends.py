"""The file log's :class:`~log.encoded_batches.AppendsEncodedBatches`: batches producers encode in its format.

Capture's snapshot pass encodes COPY text straight into file-log batches and feeds encode their
Arrow columns (:mod:`log.file.column_batches`); they get such batches only through this
capability, never from :mod:`log.file` itself, so every other backend stays possible.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from log.base import AppendResult, Record
from log.file.batch_codec import ZSTD_LEVEL, Compression, EncodedBatch

if TYPE_CHECKING:
    from log.column_records import ColumnRecords
    from log.file.column_batches import BatchScratch

_scratch = threading.local()


def _thread_scratch() -> BatchScratch:
    """This thread's batch buffers (a feed's ``foreachBatch`` calls come on one thread at a time)."""
    from log.file.column_batches import BatchScratch  # pyarrow: a streaming capture never gets here

    scratch: BatchScratch | None = getattr(_scratch, "buffers", None)
    if scratch is None:
        scratch = _scratch.buffers = BatchScratch()
    return scratch


class _Appends(Protocol):
    def append(self, topic: str, partition: int, records: Sequence[Record]) -> AppendResult: ...


class EncodedAppends:
    """Mixed into :class:`log.file.backend.FileLog` (which sets ``compression``)."""

    compression: Compression
    zstd_level = ZSTD_LEVEL

    def append_encoded(self: _Appends, topic: str, partition: int, batch: Sequence[Record]) -> AppendResult:
        """Append a batch encoded by ``log.file.batch_codec`` (an ``EncodedBatch``) as it is.

        :meth:`append` takes such a batch too; this is the same call under the capability's name.
        """
        return self.append(topic, partition, batch)

    def encoded_batch(self, buffer: bytearray, count: int, max_timestamp: int, codec: int = 0) -> EncodedBatch:
        """The records a native encoder wrote into ``buffer`` after the header placeholder, as one batch."""
        return EncodedBatch(buffer, count, max_timestamp, codec)

    def column_batches(self, records: ColumnRecords, partitions: int, now_ms: int) -> list[EncodedBatch | None]:
        """Per partition, the records as one file-log batch, built in this thread's reused buffers."""
        from log.file.column_batches import column_batches  # pyarrow, as in _thread_scratch

        return column_batches(records, partitions, now_ms, _thread_scratch())
