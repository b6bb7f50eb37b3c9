"""Kafka's default partitioner (murmur2 of the key bytes).

A key lands in the same partition on the file backend as on Kafka.
"""

from __future__ import annotations

from collections.abc import Sequence

import native

#: The extension (C murmur2), or None: the pure-Python functions below define the result.
_native = native.speedups

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2``: a signed 32-bit hash of ``data``."""
    if _native is not None:
        return _native.murmur2(data)  # type: ignore[no-any-return]
    return _murmur2_python(data)


def _murmur2_python(data: bytes) -> int:
    length = len(data)
    h = (_SEED ^ length) & _MASK
    for i in range(0, length - length % 4, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = (h * _M) & _MASK
        h ^= k
    tail = length % 4
    base = length - tail
    if tail == 3:
        h ^= data[base + 2] << 16
    if tail >= 2:
        h ^= data[base + 1] << 8
    if tail >= 1:
        h ^= data[base]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for(key: bytes | None, partitions: int) -> int:
    """Kafka's ``toPositive(murmur2(key)) % partitions``; a null key goes to partition 0.

    Kafka spreads null keys over partitions; we pin them to partition 0 so events of
    a keyless table keep their order.
    """
    if key is None:
        return 0
    return (murmur2(key) & 0x7FFFFFFF) % partitions


if _native is not None:
    partition_for = _native.partition_for  # the same function in C: called once per appended record


def partitions_for(keys: Sequence[bytes | None], partitions: int) -> list[int]:
    """:func:`partition_for` of every key (one native call for the whole list)."""
    if _native is not None:
        return _native.partitions(keys, partitions)  # type: ignore[no-any-return]
    return [partition_for(key, partitions) for key in keys]
