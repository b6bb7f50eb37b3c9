"""What a sink delivers: a log record with its idempotency id and its payload after filter and transform."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from log.base import StoredRecord
from native import speedups

_tuple_new = tuple.__new__


class SinkRecord(NamedTuple):
    """One event for a target, in its partition's offset order.

    ``value`` is the event as stored in the log (Debezium JSON); ``payload`` what the sink
    delivers (``value`` itself unless a transform applies). A named tuple: a batch builds one
    per record.
    """

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes
    payload: bytes

    @property
    def event_id(self) -> str:
        """The idempotency key ``<topic>/<partition>/<offset>``: a receiver that saw it may drop a repeat."""
        return f"{self.topic}/{self.partition}/{self.offset}"


def as_sent(records: Sequence[StoredRecord]) -> list[SinkRecord]:
    """``records`` with a value (tombstones dropped), each as a :class:`SinkRecord` whose payload is its value.

    What a sink without a transform delivers. The extension builds the batch in one C loop
    (``native.speedups.sink_records``); this loop is its twin.
    """
    if speedups is not None and isinstance(records, list):
        built: list[SinkRecord] | None = speedups.sink_records(records, SinkRecord)
        if built is not None:
            return built
    # Each record's fields unpacked, no call per record but the tuple's own (a named tuple's
    # __new__ is a Python function: half this loop's time).
    return [_tuple_new(SinkRecord, (t, p, o, ts, k, v, v)) for t, p, o, ts, k, v, _ in records if v is not None]


class Rejection(NamedTuple):
    """A record the target refused for good (a poison record), and why: it goes to the dead-letter topic."""

    record: SinkRecord
    reason: str


def topic_fields(topic: str) -> dict[str, str]:
    """What a template (stream, subject, routing key, table) may name: ``topic``, ``source``, ``schema``, ``table``.

    ``shop.public.orders`` gives source ``shop``, schema ``public``, table ``orders``; a topic
    with fewer parts (a feed) gives its whole name for each part it lacks.
    """
    parts = topic.split(".", 2)
    source = parts[0]
    schema = parts[1] if len(parts) == 3 else topic
    table = parts[2] if len(parts) == 3 else topic
    return {"topic": topic, "source": source, "schema": schema, "table": table}
