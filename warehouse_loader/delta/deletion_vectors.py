"""Delta deletion vectors as the protocol defines them: row positions → bytes, files and descriptors.

delta-rs 1.6.6 reads deletion vectors (its query engine, ``deletion_vectors()``, MERGE,
optimize) but never writes them (delta-rs#4512): this module writes them for
:mod:`warehouse_loader.delta.merge_on_read`. Formats (PROTOCOL.md, "Deletion Vectors"):

* **RoaringBitmapArray**: magic ``1681511377`` (int32 LE), the number of 32-bit bitmaps
  (int64 LE), then per bitmap its key (the high 32 bits of the positions, int32 LE) and the
  bitmap in the portable Roaring format (cookie 12346: no run containers; per container its
  low-16-bit key and cardinality - 1, then an offset per container, then array containers
  of sorted uint16 or, above 4096 values, 8 KiB bitmap containers).
* **A deletion vector file** (storage type ``u``): a version byte ``1``, then per vector its
  size (int32 BE), the RoaringBitmapArray and its CRC-32 (uint32 BE). The descriptor names
  the file by a prefix and the Z85 encoding of a random UUID
  (``<prefix>/deletion_vector_<uuid>.bin``) and the vector by its offset (of the size field).

Files go under ``_hw_dv/`` of the table (the prefix): delta-rs's vacuum skips ``_``-prefixed
directories (its full vacuum would delete deletion vector files it does not know are in use,
measured), so they are removed by Headwater's maintenance (:func:`referenced_files`).
"""

from __future__ import annotations

import struct
import uuid
import zlib
from typing import Any

import numpy as np
import orjson

from warehouse_loader.delta.add_actions import LOG_DIR
from warehouse_loader.delta.table_files import TableFiles

#: The table subdirectory holding deletion vector files (also the descriptors' path prefix).
DV_DIR = "_hw_dv"
_MAGIC = 1681511377
_NO_RUN_COOKIE = 12346
_ARRAY_MAX = 4096
_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"


def z85(data: bytes) -> str:
    """Z85 text of ``data`` (a multiple of 4 bytes)."""
    out = []
    for (packed,) in struct.iter_unpack(">I", data):
        chars, word = [], packed
        for _ in range(5):
            word, digit = divmod(word, 85)
            chars.append(_Z85[digit])
        out.append("".join(reversed(chars)))
    return "".join(out)


def _bitmap32(low: np.ndarray) -> bytes:
    """Portable Roaring serialization of sorted unique uint32 values."""
    high16 = (low >> 16).astype(np.uint16)
    keys, starts = np.unique(high16, return_index=True)
    ends = [*starts[1:], len(low)]
    headers, bodies = [], []
    for key, start, end in zip(keys, starts, ends, strict=True):
        values = (low[start:end] & 0xFFFF).astype("<u2")
        headers.append(struct.pack("<HH", int(key), len(values) - 1))
        if len(values) <= _ARRAY_MAX:
            bodies.append(values.tobytes())
        else:
            words = np.zeros(1024, dtype="<u8")
            np.bitwise_or.at(words, values >> 6, np.left_shift(np.uint64(1), (values & 63).astype(np.uint64)))
            bodies.append(words.tobytes())
    head = struct.pack("<II", _NO_RUN_COOKIE, len(keys)) + b"".join(headers)
    offset = len(head) + 4 * len(keys)
    offsets = []
    for body in bodies:
        offsets.append(struct.pack("<I", offset))
        offset += len(body)
    return head + b"".join(offsets) + b"".join(bodies)


def encode(positions: np.ndarray) -> bytes:
    """The RoaringBitmapArray of row ``positions`` (any order, duplicates allowed)."""
    unique = np.unique(np.asarray(positions, dtype=np.uint64))
    high = (unique >> np.uint64(32)).astype(np.uint32)
    keys, starts = np.unique(high, return_index=True)
    ends = [*starts[1:], len(unique)]
    parts = [struct.pack("<iq", _MAGIC, len(keys))]
    for key, start, end in zip(keys, starts, ends, strict=True):
        parts.append(
            struct.pack("<i", int(key)) + _bitmap32((unique[start:end] & np.uint64(0xFFFFFFFF)).astype(np.uint32))
        )
    return b"".join(parts)


def write_file(files: TableFiles, vectors: list[np.ndarray]) -> list[dict[str, Any]]:
    """Write ``vectors`` into one new deletion vector file of the table; their descriptors, in order.

    The file is durable before the descriptors are returned: a commit naming them never
    names bytes that a crash could lose.
    """
    name = uuid.uuid4()
    chunks, descriptors, offset = [b"\x01"], [], 1
    for positions in vectors:
        data = encode(positions)
        chunks.append(struct.pack(">i", len(data)) + data + struct.pack(">I", zlib.crc32(data)))
        descriptors.append(
            {
                "storageType": "u",
                "pathOrInlineDv": DV_DIR + z85(name.bytes),
                "offset": offset,
                "sizeInBytes": len(data),
                "cardinality": len(np.unique(positions)),
            }
        )
        offset += len(chunks[-1])
    files.write(f"{DV_DIR}/deletion_vector_{name}.bin", b"".join(chunks))
    return descriptors


def file_name(descriptor: dict[str, Any]) -> str | None:
    """The file a ``u`` descriptor of ours names (``_hw_dv/deletion_vector_<uuid>.bin``), else None."""
    text = str(descriptor.get("pathOrInlineDv", ""))
    if descriptor.get("storageType") != "u" or not text.startswith(DV_DIR) or len(text) != len(DV_DIR) + 20:
        return None
    encoded = text[len(DV_DIR) :]
    data = b""
    for start in range(0, len(encoded), 5):  # each 5 characters are one big-endian 32-bit word
        word = 0
        for char in encoded[start : start + 5]:
            word = word * 85 + _Z85.index(char)
        data += struct.pack(">I", word)
    return f"deletion_vector_{uuid.UUID(bytes=data)}.bin"


def referenced_files(files: TableFiles) -> set[str]:
    """Names of our deletion vector files any version still in the log uses (its checkpoints and JSON entries)."""
    names: set[str] = set()
    for entry in files.listing(LOG_DIR):
        descriptors: list[Any] = []
        relative = f"{LOG_DIR}/{entry.base_name}"
        if entry.base_name.endswith(".json") and not entry.base_name.startswith("."):
            for line in files.read(relative).splitlines():
                action = orjson.loads(line) if line.strip() else {}
                descriptors.extend((action.get(kind) or {}).get("deletionVector") for kind in ("add", "remove"))
        elif ".checkpoint" in entry.base_name and entry.base_name.endswith(".parquet"):
            columns = files.metadata(relative).schema.to_arrow_schema().names
            for kind in ("add", "remove"):
                if kind in columns:
                    rows = files.parquet(relative, [kind]).column(kind).to_pylist()
                    descriptors.extend((row or {}).get("deletionVector") for row in rows)
        names.update(name for d in descriptors if d and (name := file_name(d)) is not None)
    return names


def decode(data: bytes) -> np.ndarray | None:
    """Row positions of a RoaringBitmapArray; None for a layout this reader does not decode (run containers)."""
    magic, count = struct.unpack_from("<iq", data, 0)
    if magic != _MAGIC:
        return None
    at, parts = 12, []
    for _ in range(count):
        (high,) = struct.unpack_from("<i", data, at)
        cookie, containers = struct.unpack_from("<II", data, at + 4)
        if cookie != _NO_RUN_COOKIE:
            return None
        header = at + 12
        offsets = header + 4 * containers
        base = at + 4
        for index in range(containers):
            key, minus_one = struct.unpack_from("<HH", data, header + 4 * index)
            (offset,) = struct.unpack_from("<I", data, offsets + 4 * index)
            start = base + offset
            cardinality = minus_one + 1
            if cardinality <= _ARRAY_MAX:
                low = np.frombuffer(data, dtype="<u2", count=cardinality, offset=start).astype(np.uint64)
                end = start + 2 * cardinality
            else:
                words = np.frombuffer(data, dtype="<u8", count=1024, offset=start)
                low = np.flatnonzero(np.unpackbits(words.view(np.uint8), bitorder="little")).astype(np.uint64)
                end = start + 8192
            parts.append((np.uint64(high) << np.uint64(32)) | (np.uint64(key) << np.uint64(16)) | low)
            at = max(at, end)
    return np.concatenate(parts) if parts else np.zeros(0, np.uint64)


def read(files: TableFiles, descriptor: dict[str, Any]) -> np.ndarray | None:
    """The row positions a descriptor of ours (``_hw_dv/`` file) names; None for any other deletion vector.

    One read: the size field and the vector (its size is in the descriptor too).
    """
    name = file_name(descriptor)
    if name is None:
        return None
    size = int(descriptor["sizeInBytes"])
    data = files.read_at(f"{DV_DIR}/{name}", int(descriptor.get("offset") or 1), 4 + size)
    (stored,) = struct.unpack_from(">i", data, 0)
    if stored != size:
        msg = f"deletion vector {name}: {stored} bytes stored, {size} in the descriptor"
        raise ValueError(msg)
    return decode(data[4:])
