"""Records given as Arrow columns: a producer's columnar write (feeds), for any backend.

A :class:`ColumnRecords` is a key column, a value column and a delete flag per row, all
records carrying the same headers: each row is the record ``(key, value, headers)``, and a
delete row is followed by its tombstone ``(key, None, headers)``. Read as a sequence it is
exactly those :class:`~log.base.Record` objects (what any log appends); a log that
:class:`~log.encoded_batches.AppendsEncodedBatches` encodes them per partition straight from the Arrow
buffers instead (:meth:`~log.encoded_batches.AppendsEncodedBatches.column_batches`; the file log:
:mod:`log.file.column_batches`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import overload

import pyarrow as pa  # type: ignore[import-untyped]  # no stubs
import pyarrow.compute as pc  # type: ignore[import-untyped]

from log.base import Record


def _column(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    """One contiguous string/binary array (chunks joined; a null-typed column as null strings)."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks() if values.num_chunks != 1 else values.chunk(0)
    if pa.types.is_null(values.type):
        values = values.cast(pa.string())
    if not (
        pa.types.is_string(values.type)
        or pa.types.is_binary(values.type)
        or pa.types.is_large_string(values.type)
        or pa.types.is_large_binary(values.type)
    ):
        msg = f"record keys and values must be string or binary columns, not {values.type}"
        raise TypeError(msg)
    return values


class ColumnRecords(Sequence[Record]):
    """The records of key/value/delete columns that share one set of headers (see the module docstring).

    ``len()`` counts records: one per row plus one tombstone per delete. Indexing or
    iterating builds the :class:`Record` objects (once); a log's encoded batches do not.
    """

    __slots__ = ("_records", "deletes", "headers", "keys", "values")

    def __init__(
        self,
        keys: pa.Array | pa.ChunkedArray,
        values: pa.Array | pa.ChunkedArray,
        deletes: pa.Array | pa.ChunkedArray | None,
        headers: tuple[tuple[str, bytes], ...],
    ) -> None:
        self.keys = _column(keys)
        self.values = _column(values)
        if len(self.keys) != len(self.values):
            msg = f"{len(self.keys)} keys but {len(self.values)} values"
            raise ValueError(msg)
        #: Per row: a delete (a tombstone follows it); a null flag is no delete.
        self.deletes: pa.Array | None = None
        if deletes is not None:
            flags = pc.fill_null(deletes, False)
            self.deletes = flags.combine_chunks() if isinstance(flags, pa.ChunkedArray) else flags
            if len(self.deletes) != len(self.keys):
                msg = f"{len(self.keys)} rows but {len(self.deletes)} delete flags"
                raise ValueError(msg)
        self.headers = headers
        self._records: list[Record] | None = None

    @property
    def rows(self) -> int:
        """Rows (records without the tombstones)."""
        return len(self.keys)

    @property
    def delete_count(self) -> int:
        """Rows that are deletes (each followed by a tombstone)."""
        if self.deletes is None:
            return 0
        return int(pc.sum(self.deletes).as_py() or 0)

    def __len__(self) -> int:
        return self.rows + self.delete_count

    @overload
    def __getitem__(self, index: int) -> Record: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[Record]: ...
    def __getitem__(self, index: int | slice) -> Record | Sequence[Record]:
        return self.records()[index]

    def __iter__(self) -> Iterator[Record]:
        return iter(self.records())

    def records(self) -> list[Record]:
        """The records as :class:`Record` objects (built on first use)."""
        if self._records is None:
            keys, values, deletes = pylists(self)
            headers = self.headers
            out: list[Record] = []
            append = out.append
            for key, value, delete in zip(keys, values, deletes, strict=True):
                append(Record(key, value, headers))
                if delete:
                    append(Record(key, None, headers))
            self._records = out
        return self._records


def pylists(records: ColumnRecords) -> tuple[list[bytes | None], list[bytes | None], list[bool]]:
    """Keys, values and delete flags as Python lists (keys and values as bytes)."""
    keys = records.keys.cast(pa.large_binary()).to_pylist()
    values = records.values.cast(pa.large_binary()).to_pylist()
    deletes = [False] * len(keys) if records.deletes is None else records.deletes.to_pylist()
    return keys, values, deletes
