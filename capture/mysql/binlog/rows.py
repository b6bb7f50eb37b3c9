"""Row images of a row event, decoded with the table's shape at the time it was written.

A row event holds rows back to back; each image is a null bitmap over the columns present
in the image, then the non-null values in column order (an update: the before image, then
the after image). Capture requires full images (``binlog_row_image=FULL``): an event whose
images leave columns out is refused, as an update could not be written without them.
"""

from __future__ import annotations

from typing import Any

import native
from capture.mysql.binlog.events import Rows
from capture.mysql.binlog.table_map import TableShape
from capture.mysql.types.charsets import Charsets
from capture.mysql.types.row_plan import row_plan
from capture.mysql.types.values import Reader, TypeModes, column_reader, skip_reader
from core.errors import PermanentError

_binlog_rows = native.speedups.binlog_rows if native.speedups is not None else None
#: ``binlog_rows``'s op: 0 images after (insert), 1 before (delete), 2 both (update).
_OP_CODES = {"c": 0, "d": 1}


class PartialRowImageError(PermanentError):
    """A row event without every column: the server's binlog_row_image is not FULL."""


class RowDecoder:
    """Decodes the row images of one table shape into lists of Debezium JSON values.

    Columns in ``skip`` (left out by the source's column settings and not read by its row
    filter) are stepped over, never converted: their place in the list is None.

    A shape whose every column the extension writes exactly (:mod:`capture.mysql.types.row_plan`)
    is decoded by it (``native/binlog_rows.c``) an event at a time; the readers are its twin and
    decode what it hands back. ``native=False`` keeps to the readers (the twin's tests).
    """

    def __init__(
        self,
        shape: TableShape,
        modes: TypeModes,
        charsets: Charsets,
        skip: frozenset[int] = frozenset(),
        *,
        native: bool = True,
    ) -> None:
        self.shape = shape
        self.skip = skip
        self.readers: list[Reader] = [
            skip_reader(column)
            if i in skip
            else column_reader(column, modes, charsets, f"{shape.schema}.{shape.table}.{column.name}")
            for i, column in enumerate(shape.columns)
        ]
        self._all_present = (1 << len(shape.columns)) - 1
        self._null_width = (len(shape.columns) + 7) // 8
        self._native = row_plan(shape, modes, charsets, skip) if native and _binlog_rows is not None else None

    def _image(self, data: bytes, pos: int) -> tuple[list[Any], int]:
        width = self._null_width
        nulls = int.from_bytes(data[pos : pos + width], "little")
        pos += width
        values: list[Any] = []
        append = values.append
        for i, reader in enumerate(self.readers):
            if nulls >> i & 1:
                append(None)
            else:
                value, pos = reader(data, pos)
                append(value)
        return values, pos

    def decode(self, rows: Rows) -> list[tuple[list[Any] | None, list[Any] | None]]:
        """``(before, after)`` per row: inserts have no before, deletes no after."""
        if rows.present != self._all_present or rows.present_after != self._all_present:
            msg = (
                f"a row event of {self.shape.schema}.{self.shape.table} lacks columns: "
                "set binlog_row_image=FULL on the server (SET GLOBAL binlog_row_image = FULL, and in its config file)"
            )
            raise PartialRowImageError(msg)
        data, pos, end = rows.body, rows.start, len(rows.body)
        if self._native is not None and _binlog_rows is not None and type(data) is bytes:
            decoded: list[tuple[list[Any] | None, list[Any] | None]] | None = _binlog_rows(
                data, pos, _OP_CODES.get(rows.op, 2), *self._native
            )
            if decoded is not None:
                return decoded
        out: list[tuple[list[Any] | None, list[Any] | None]] = []
        image = self._image
        if rows.op == "c":
            while pos < end:
                after, pos = image(data, pos)
                out.append((None, after))
        elif rows.op == "d":
            while pos < end:
                before, pos = image(data, pos)
                out.append((before, None))
        else:
            while pos < end:
                before, pos = image(data, pos)
                after, pos = image(data, pos)
                out.append((before, after))
        return out
