"""Reading whole topics back and making raw topics, for tests of every package.

One implementation of what tests used to copy under many names (``read_all``,
``read_topic``, ``all_records``, ``events`` ...).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson

from log.base import Log, Record, StoredRecord, TopicSpec, append_keyed


def partition_records(log: Log, topic: str, partition: int, offset: int | None = None) -> list[StoredRecord]:
    """Every record of one partition from ``offset`` (default: its beginning) to its end now, in offset order."""
    records: list[StoredRecord] = []
    offset = log.beginning_offset(topic, partition) if offset is None else offset
    while batch := log.read(topic, partition, offset):
        records.extend(batch)
        offset = batch[-1].offset + 1
    return records


def topic_records(log: Log, topic: str) -> dict[int, list[StoredRecord]]:
    """Every record of ``topic``, per partition in offset order."""
    return {p: partition_records(log, topic, p) for p in range(log.describe_topic(topic).partitions)}


def read_topic(log: Log, topic: str) -> list[StoredRecord]:
    """Every record of ``topic``, partition by partition, each in offset order."""
    return [record for records in topic_records(log, topic).values() for record in records]


def topic_values(log: Log, topic: str) -> list[dict[str, Any]]:
    """The decoded JSON values of ``topic`` (tombstones left out), partition by partition."""
    return [orjson.loads(r.value) for r in read_topic(log, topic) if r.value is not None]


def make_topic(log: Log, topic: str, records: Iterable[Record] = (), *, partitions: int = 1, **spec: Any) -> None:
    """Create ``topic`` (``TopicSpec`` options as keywords) and append ``records``, each to its key's partition."""
    log.create_topic(TopicSpec(topic, partitions=partitions, **spec), exist_ok=True)
    listed = list(records)
    if listed:
        append_keyed(log, topic, listed)
