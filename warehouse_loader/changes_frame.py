"""A micro-batch of the ``headwater_log`` source -> the warehouse change batch (``warehouse_loader.changes``).

Spark does the flattening (one projection, no Python per row) and hands the result over
as Arrow (``DataFrame.toArrow``), ready for :func:`warehouse_loader.delta.writer.write_batch`:

* key columns first, then ``__hw_seq``, ``__hw_op``, ``__hw_commit_ts`` (timestamp[us, UTC]),
  then the other row-image columns;
* the row image is ``after`` for ``c``/``u``/``r`` and ``before`` for ``d`` (with the default
  replica identity a delete's ``before`` holds only the key: other columns are null, as
  the change-batch contract wants); a truncate has no image (keys null);
* tombstones and logical messages carry no change and are left out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import pyarrow as pa  # type: ignore[import-untyped]  # no stubs
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from spark_log import source_schema as cols
from warehouse_loader.changes import COMMIT_TS, COMMIT_TS_TYPE, OP, SEQ
from warehouse_loader.errors import ChangeFrameError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

_IMAGE = "__hw_image"


def changes_frame(rows: DataFrame, keys: Sequence[str]) -> DataFrame:
    """The change batch as a DataFrame (lazy; see :func:`change_batch` for the Arrow table)."""
    image_type = rows.schema[cols.AFTER].dataType
    if not isinstance(image_type, StructType):
        msg = (
            "the topic has no schema record, so 'after' is a JSON string; a warehouse load needs typed "
            "columns: load from a table topic, or parse 'after' with from_json first"
        )
        raise ChangeFrameError(msg)
    names = image_type.fieldNames()
    missing = [key for key in keys if key not in names]
    if missing:
        msg = f"key column(s) {', '.join(missing)} are not in the row image (columns: {', '.join(names)})"
        raise ChangeFrameError(msg)
    flat = rows.where(F.col(cols.OP).isin(*cols.CHANGE_OPS)).select(
        cols.row_image().alias(_IMAGE),
        F.col(cols.SEQ).alias(SEQ),
        F.col(cols.OP).alias(OP),
        F.col(cols.COMMIT_TS).alias(COMMIT_TS),
    )
    rest = [name for name in names if name not in keys]
    return flat.select(
        *[F.col(_IMAGE)[key].alias(key) for key in keys],
        SEQ,
        OP,
        COMMIT_TS,
        *[F.col(_IMAGE)[name].alias(name) for name in rest],
    )


def change_batch(rows: DataFrame, keys: Sequence[str]) -> pa.Table:
    """The change batch of a micro-batch as an Arrow table (call it inside ``foreachBatch``)."""
    table = changes_frame(rows, keys).toArrow()
    position = table.schema.get_field_index(COMMIT_TS)
    if table.schema.field(position).type != COMMIT_TS_TYPE:
        table = table.set_column(position, COMMIT_TS, table.column(position).cast(COMMIT_TS_TYPE))
    return table
