"""The ``_headwater.schemas`` topic: each table topic's columns and key, one record per version.

Capture (for source tables) and each feed (for its output topic) append a record keyed by
the topic whenever its shape changes. A record's value::

    {"topic", "schema", "table", "replica_identity", "key": [names], "key_source",
     "columns": [{"name", "logical", "native", "key", ...}], "version"}

Each column names its logical type in Debezium's schema vocabulary (``logical``:
:func:`log.row_types.connect_schema`, e.g. ``{"type": "int64", "name":
"io.debezium.time.MicroTimestamp"}``) and the source's own type name beside it (``native``,
e.g. ``numeric(10,2)``); a kind may add fields of its own (PostgreSQL: ``type_oid``,
``typmod``). Records written before logical types were recorded name only ``type_oid`` and
``typmod``; :func:`column_type` reads them as readers always have (:mod:`log.pg_types`).

``key`` is the one place every consumer (loads, backfills, feeds, status, verify) takes a
topic's key from: the fields of every record key of the topic, in their order; ``[]`` for
a keyless table. Each column's ``key`` flag says the same. ``key_source`` says where it
comes from (capture: ``configured``, ``primary_key``, ``replica_identity_index``, ``none``;
a feed's output: ``feed``).

Records written before keys were recorded have no ``key`` field; their flags came from
the replica identity, which is the record key under DEFAULT and USING INDEX but every
column under FULL. :func:`schema_key` reads the former and answers ``None`` for the latter
(capture re-records such a table's schema when it starts).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import orjson

from core.source_config import TypesConfig
from log.base import Log
from log.pg_types import logical_type
from log.reading import read_range
from log.row_types import LogicalType, from_connect_schema
from log.topics import SCHEMAS_TOPIC

#: ``replica_identity`` of a record whose per-column flags are not the key (every column is flagged).
_FULL_IDENTITY = "f"


def schema_key(record: Mapping[str, Any]) -> tuple[str, ...] | None:
    """The key columns a schema record gives its topic (``()``: keyless; ``None``: not recorded)."""
    if "key" in record:
        return tuple(record["key"])
    if record.get("replica_identity") == _FULL_IDENTITY:
        return None
    return tuple(column["name"] for column in record.get("columns", ()) if column.get("key"))


def column_type(column: Mapping[str, Any], modes: TypesConfig) -> LogicalType:
    """The logical type of a schema record's column: its ``logical`` type, else (an older record) by its oid.

    ``modes`` are the writing source's type modes; only a record without ``logical`` needs them.
    """
    recorded = column.get("logical")
    if recorded is not None:
        return from_connect_schema(recorded)
    return logical_type(int(column["type_oid"]), int(column.get("typmod", -1)), modes)


def _records(log: Log) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(topic, value)`` of every schema record held now, in append order."""
    if SCHEMAS_TOPIC not in log.list_topics():
        return
    for partition in range(log.describe_topic(SCHEMAS_TOPIC).partitions):
        start = log.beginning_offset(SCHEMAS_TOPIC, partition)
        end = log.end_offset(SCHEMAS_TOPIC, partition)
        for records in read_range(log, SCHEMAS_TOPIC, partition, start, end, chunk=1000):
            for record in records:
                if record.key is not None and record.value is not None:
                    yield record.key.decode(), orjson.loads(record.value)


def read_schema_records(log: Log, topics: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
    """Every schema record of ``topics`` still held in ``_headwater.schemas`` (all versions, in order)."""
    wanted = set(topics)
    found: dict[str, list[dict[str, Any]]] = {}
    for topic, value in _records(log):
        if topic in wanted:
            found.setdefault(topic, []).append(value)
    return found


def schema_histories(log: Log, prefix: str = "") -> dict[str, list[dict[str, Any]]]:
    """Every schema record of every topic whose name starts with ``prefix`` (all versions, in order)."""
    found: dict[str, list[dict[str, Any]]] = {}
    for topic, value in _records(log):
        if topic.startswith(prefix):
            found.setdefault(topic, []).append(value)
    return found


def latest_schemas(log: Log, prefix: str = "") -> dict[str, dict[str, Any]]:
    """The latest schema record of every topic whose name starts with ``prefix``."""
    return {topic: value for topic, value in _records(log) if topic.startswith(prefix)}
