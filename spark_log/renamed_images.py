"""Renamed columns in the ``headwater_log`` source's batches: records below a rename hold the old name.

A capture topic's schema history places each column rename at a position of the source's order
(:mod:`log.schema_history`); a record below it was written with the old name. The source reads
every record with the latest names: images are decoded with the old names too
(:func:`with_hidden`), then :func:`renamed_batch` moves each old name's value to its new name in
the rows below the rename (a renamed key column in the record key too) and leaves the struct the
query declared (old names only where a later version has such a column again).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import orjson
import pyarrow as pa  # type: ignore[import-untyped]  # no stubs
import pyarrow.compute as pc  # type: ignore[import-untyped]
from pyspark.sql.types import StructField, StructType

from spark_log import source_schema as cols
from spark_log.source_schema import RowSchema, UnconstrainedNumeric, with_hidden_fields


def with_hidden(
    schema: StructType, row_schemas: Mapping[str, RowSchema] | None, unconstrained: UnconstrainedNumeric
) -> StructType:
    """``schema`` with the image struct extended by the topics' hidden (renamed-away) fields; itself when none."""
    image = schema[cols.AFTER].dataType
    if row_schemas is None or not isinstance(image, StructType):
        return schema
    wide = with_hidden_fields(image, row_schemas, unconstrained)
    if wide is image:
        return schema
    return StructType(
        [StructField(f.name, wide, f.nullable) if f.name in (cols.BEFORE, cols.AFTER) else f for f in schema.fields]
    )


def renamed_batch(batch: pa.RecordBatch, row_schemas: Mapping[str, RowSchema], target: pa.Schema) -> pa.RecordBatch:
    """``batch`` (decoded with :func:`with_hidden`) with renamed columns under their new name, as ``target``."""
    topics, seqs = batch.column(cols.TOPIC), batch.column(cols.SEQ)
    columns = list(batch.columns)
    key_index = batch.schema.get_field_index(cols.KEY)
    columns[key_index] = _renamed_keys(columns[key_index], topics, seqs, row_schemas)
    for side in (cols.BEFORE, cols.AFTER):
        index = batch.schema.get_field_index(side)
        images = batch.column(index)
        fields = {f.name: images.field(i) for i, f in enumerate(images.type)}
        for topic, schema in row_schemas.items():
            in_topic = pc.equal(topics, topic)
            for rename in schema.renames:
                old, new = fields.get(rename.old), fields.get(rename.new)
                if old is None or new is None:
                    continue
                before = pc.and_kleene(in_topic, pc.less(seqs, rename.at.sortable())).fill_null(False)
                # Only where the old name is set: a feed's record below the position may already
                # carry the new name (computed from an image read under it).
                moved = pc.and_(before, old.is_valid())
                fields[rename.new] = pc.if_else(moved, old.cast(new.type), new)
                fields[rename.old] = pc.if_else(before, pa.scalar(None, old.type), old)
        image_type = target.field(side).type
        children = [fields[f.name] for f in image_type]
        columns[index] = pa.StructArray.from_arrays(children, fields=list(image_type), mask=images.is_null())
    return pa.RecordBatch.from_arrays(columns, schema=target)


def _renamed_keys(keys: pa.Array, topics: pa.Array, seqs: pa.Array, row_schemas: Mapping[str, RowSchema]) -> pa.Array:
    """Record keys (JSON text) below a key column's rename, with the column's new name (one key per row still)."""
    texts: list[str | None] | None = None
    for topic, schema in row_schemas.items():
        for rename in schema.renames:
            if rename.old not in schema.key_names:
                continue
            before = pc.and_kleene(pc.equal(topics, topic), pc.less(seqs, rename.at.sortable())).fill_null(False)
            rows = np.flatnonzero(before.to_numpy(zero_copy_only=False))
            if not len(rows):
                continue
            texts = keys.to_pylist() if texts is None else texts
            for row in rows:
                text = texts[row]
                key = None if text is None else orjson.loads(text)
                if isinstance(key, dict) and rename.old in key:
                    named = {rename.new if name == rename.old else name: value for name, value in key.items()}
                    texts[row] = orjson.dumps(named).decode()
    return keys if texts is None else pa.array(texts, pa.string())
