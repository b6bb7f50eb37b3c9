"""Stored log records -> Arrow record batches of the ``headwater_log`` source's schema.

Pure: records in, one :class:`pyarrow.RecordBatch` out, whose schema equals Spark's
``to_arrow_schema`` of the declared schema exactly (the Python data source rejects
anything else). Each record's JSON is parsed once (orjson) into per-column lists;
the typed ``before``/``after`` structs are then decoded column by column
(:mod:`derived_feeds.value_decoder`).

A record whose value is not a change envelope (no ``op``/``before``/``after``, e.g. a
plain row written by a feed) is read as ``after`` = the whole value, ``op`` null.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson
import pyarrow as pa  # type: ignore[import-untyped]  # no stubs
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from derived_feeds import event_schema as cols
from derived_feeds.errors import UndecodableValueError
from derived_feeds.event_schema import RowSchema
from derived_feeds.value_decoder import BadValue, decode_values
from log.base import StoredRecord
from log.sequence import Sequence as Seq

_ENVELOPE_KEYS = ("op", "before", "after")


def arrow_schema(schema: StructType) -> pa.Schema:
    """The Arrow schema Spark checks returned batches against."""
    return to_arrow_schema(schema, timezone="UTC")


class EventBatchBuilder:
    """Builds the source's record batches for one declared schema.

    ``row_schemas`` maps each table topic to its row schema; ``None`` means the images
    are JSON strings (topics without schema record). Picklable: it holds only the
    schemas, so the planner can ship it to executors.
    """

    def __init__(
        self,
        schema: StructType,
        row_schemas: Mapping[str, RowSchema] | None,
        *,
        include_tombstones: bool = False,
    ) -> None:
        self.schema = schema
        self.row_schemas = dict(row_schemas) if row_schemas is not None else None
        self.include_tombstones = include_tombstones

    def build(self, records: Sequence[StoredRecord]) -> pa.RecordBatch:
        """One record batch of ``records`` (tombstones dropped unless asked for)."""
        target = arrow_schema(self.schema)
        kept = list(records) if self.include_tombstones else [r for r in records if r.value is not None]
        events = _parse(kept)
        columns = _envelope_columns(kept, events)
        image_type = target.field(cols.AFTER).type
        befores = [None if e is None else e.get("before") for e in events]
        columns.append(self._images(kept, befores, image_type, cols.BEFORE))
        afters = [None if e is None else e.get("after") for e in events]
        columns.append(self._images(kept, afters, image_type, cols.AFTER))
        return pa.RecordBatch.from_arrays(columns, schema=target)

    def _images(
        self, records: Sequence[StoredRecord], images: list[Any], image_type: pa.DataType, side: str
    ) -> pa.Array:
        if pa.types.is_string(image_type):
            return pa.array([None if i is None else orjson.dumps(i).decode() for i in images], pa.string())
        if not any(image is not None for image in images):
            return pa.nulls(len(images), image_type)
        assert self.row_schemas is not None
        # One input partition is one topic, but keep batches of several topics correct too.
        topics = {r.topic for r in records}
        if len(topics) > 1:
            parts = [self._images_of(records, images, image_type, side, topic) for topic in sorted(topics)]
            order = sorted(range(len(records)), key=lambda i: (records[i].topic, i))
            inverse = [0] * len(order)
            for position, index in enumerate(order):
                inverse[index] = position
            return pa.concat_arrays(parts).take(pa.array(inverse, pa.int64()))
        return self._images_of(records, images, image_type, side, next(iter(topics)))

    def _images_of(
        self, records: Sequence[StoredRecord], images: list[Any], image_type: pa.DataType, side: str, topic: str
    ) -> pa.Array:
        assert self.row_schemas is not None
        chosen = [i for i, r in enumerate(records) if r.topic == topic]
        rows = [images[i] for i in chosen] if len(chosen) != len(records) else images
        schema = self.row_schemas.get(topic)
        logical = {c.name: c.logical for c in schema.columns} if schema is not None else {}
        children: list[pa.Array] = []
        for field in image_type:
            values = [None if row is None else row.get(field.name) for row in rows]
            column_type = logical.get(field.name)
            if column_type is None:
                children.append(pa.nulls(len(rows), field.type))
                continue
            try:
                children.append(decode_values(values, column_type, field.type))
            except BadValue as exc:
                record = records[chosen[exc.index]]
                raise UndecodableValueError(
                    topic=record.topic,
                    partition=record.partition,
                    offset=record.offset,
                    column=f"{side}.{field.name}",
                    value=exc.value,
                    expected=exc.expected,
                    reason=exc.reason,
                ) from None
        mask = pa.array([row is None for row in rows], pa.bool_())
        return pa.StructArray.from_arrays(children, fields=list(image_type), mask=mask)


_NO_SOURCE: dict[str, Any] = {}


def _parse(records: Sequence[StoredRecord]) -> list[dict[str, Any] | None]:
    """Parse every value (``None`` for tombstones); a value that is not an envelope becomes ``after``."""
    loads = orjson.loads
    try:
        events = [None if r.value is None else loads(r.value) for r in records]
    except orjson.JSONDecodeError:
        for record in records:
            if record.value is not None:
                try:
                    loads(record.value)
                except orjson.JSONDecodeError as exc:
                    raise UndecodableValueError(
                        topic=record.topic,
                        partition=record.partition,
                        offset=record.offset,
                        column="value",
                        value=record.value[:60],
                        expected="JSON object",
                        reason=str(exc),
                    ) from None
        raise
    for index, event in enumerate(events):
        if event is not None and (type(event) is not dict or not any(k in event for k in _ENVELOPE_KEYS)):
            events[index] = {"after": event}
    return events


def _envelope_columns(records: Sequence[StoredRecord], events: Sequence[dict[str, Any] | None]) -> list[pa.Array]:
    # One comprehension per column: several times faster than appending to many lists in one loop.
    sources = [_NO_SOURCE if e is None else (e.get("source") or _NO_SOURCE) for e in events]
    lsns = [s.get("commit_lsn") for s in sources]
    indexes = [s.get("txn_index") for s in sources]
    seqs = [
        None if lsn is None or index is None else Seq(lsn, index).sortable()
        for lsn, index in zip(lsns, indexes, strict=True)
    ]
    utc = pa.timestamp("us", tz="UTC")
    return [
        pa.array([r.topic for r in records], pa.string()),
        pa.array([r.partition for r in records], pa.int32()),
        pa.array([r.offset for r in records], pa.int64()),
        pa.array([r.timestamp_ms * 1000 for r in records], pa.int64()).cast(utc),
        pa.array([None if r.key is None else r.key.decode() for r in records], pa.string()),
        pa.array([None if e is None else e.get("op") for e in events], pa.string()),
        pa.array(seqs, pa.string()),
        pa.array(lsns, pa.int64()),
        pa.array(indexes, pa.int64()),
        pa.array([s.get("ts_us") for s in sources], pa.int64()).cast(utc),
        pa.array([s.get("snapshot") for s in sources], pa.string()),
        pa.array([s.get("db") for s in sources], pa.string()),
        pa.array([s.get("schema") for s in sources], pa.string()),
        pa.array([s.get("table") for s in sources], pa.string()),
    ]
