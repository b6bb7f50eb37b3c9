"""The native snapshot pass: pieces of COPY text straight to finished file-log batches.

With the extension and the file log, each COPY block is cut into pieces of about
:data:`capture.postgres.snapshot.copy_text.PIECE_BYTES` (by the reader, as the rows arrive) that
``ENCODE_THREADS`` threads turn into finished, zstd-compressed file-log batches, one per
partition, in one native pass without the GIL (:func:`encode_piece`), while the server
produces the next block and the pieces before are appended, in order
(:mod:`capture.postgres.snapshot.pipeline`).
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

import native
from capture.postgres.events.builder import EventBuilder
from capture.postgres.snapshot.copy_text import parse_copy_text
from capture.records import OutRecord, PartitionBatch
from log.encoded_batches import AppendsEncodedBatches
from log.envelope import SnapshotMarker
from log.sequence import Sequence as Seq

if TYPE_CHECKING:
    from native._speedups import RowEncoder


#: Threads encoding pieces (the extension releases the GIL while it encodes).
ENCODE_THREADS = 2


#: What a piece became, in row order: runs of native batches (one per partition with rows)
#: and, between them, the records of rows the Python path built (quarantined ones included).
EncodedPiece = list[list[PartitionBatch] | list[OutRecord]]

_threads = threading.local()
_python_rows = threading.Lock()


def _thread_encoder(encoder: RowEncoder) -> RowEncoder:
    """This thread's own copy of ``encoder`` (an encoder's buffers serve one thread at a time)."""
    copies: dict[int, tuple[RowEncoder, RowEncoder]] = _threads.__dict__.setdefault("copies", {})
    held = copies.get(id(encoder))
    if held is None or held[0] is not encoder:
        held = copies[id(encoder)] = (encoder, encoder.copy())  # holding encoder keeps its id unique
    return held[1]


def _native_zstd() -> bool:
    """Whether the extension compresses batches itself (it found libzstd)."""
    return native.speedups is not None and native.speedups.zstd_version() is not None


def encode_piece(
    builder: EventBuilder,
    relation_oid: int,
    data: bytes,
    piece: tuple[int, int, int],
    sequence_start: Seq,
    *,
    partitions: int,
    ts_us: int,
    log: AppendsEncodedBatches,
    marker: SnapshotMarker = SnapshotMarker.TRUE,
) -> EncodedPiece:
    """The snapshot events of ``data[start:end]`` as ``log``'s own batches (thread-safe).

    Byte-identical to what :meth:`EventBuilder.snapshot_records` builds and the file log encodes
    (``tests/unit/native/test_native.py``); a row the native pass hands back takes that Python
    path alone, and the native pass goes on after it. When the log compresses its batches the
    records are compressed here, in the encoder thread (the codec releases the GIL), so
    compression overlaps the COPY reads and the appends.
    """
    start, end, _rows = piece
    lsn, index = sequence_start.commit_lsn, sequence_start.txn_index
    shared, head, pre, tail = builder.snapshot_pieces(relation_oid, lsn, marker=marker, ts_us=ts_us)
    if shared is None:
        msg = "encode_piece needs the table's native encoder"
        raise ValueError(msg)
    encoder = _thread_encoder(shared)
    now_ms = time.time_ns() // 1_000_000
    # The extension compresses inside its pass (without the GIL, no plain copy for Python) when it
    # has libzstd; else the batches come back plain and are compressed here.
    compression = log.compression
    level = log.zstd_level if compression == "zstd" and _native_zstd() else None
    out: EncodedPiece = []
    at = start
    while at < end:
        at, index, batches = encoder.copy_batches(data, at, end, head, pre, tail, index, partitions, now_ms, level)
        encoded = []
        for partition, found in enumerate(batches):
            if found is None:
                continue
            batch = log.encoded_batch(found[0], found[1], now_ms, found[3])
            if level is None:
                batch = batch.compressed(compression)
            encoded.append(PartitionBatch(partition, batch, lsn, found[2]))
        if encoded:
            out.append(encoded)
        if at >= end:
            break
        line_end = data.find(b"\n", at, end)
        line_end = end if line_end < 0 else line_end
        rows = parse_copy_text(data[at:line_end])
        with _python_rows:  # the shared encoder and the Python converters, one thread at a time
            out.append(builder.snapshot_records(relation_oid, rows, Seq(lsn, index), ts_us=ts_us))
        index += len(rows)
        at = line_end + 1
    return out
