"""A running query's guard against schema versions it was not planned with.

A streaming query's row type is fixed when it is planned. Capture appends a topic's new schema
version to ``_headwater.schemas`` before any record written with it (``capture/appender.py``), so
when a micro-batch is planned, the versions seen after the partitions' ends were taken cover
every record below those ends: a newer one than planned stops the query
(:class:`~spark_log.errors.SchemaChangedError`) before it reads any of them, and the job starts
it again, planned with the new version (a column added is read, a renamed one under its new name,
a feed's SQL checked against the new columns).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from log.base import Log
from log.table_schemas import read_schema_records
from log.topics import SCHEMAS_TOPIC
from spark_log.errors import SchemaChangedError
from spark_log.offsets import LogPosition
from spark_log.source_schema import RowSchema


def check_schema_versions(
    log: Log, topics: Sequence[str], planned: Mapping[str, RowSchema] | None, seen_at: LogPosition | None
) -> LogPosition | None:
    """Raise :class:`SchemaChangedError` for a topic with a version newer than ``planned``; the position looked at.

    ``seen_at``: ``_headwater.schemas``' ends when it was last looked at (nothing appended since:
    nothing to read). Pass the returned position next time.
    """
    if SCHEMAS_TOPIC not in log.list_topics():
        return seen_at
    partitions = log.describe_topic(SCHEMAS_TOPIC).partitions
    ends = LogPosition.of({(SCHEMAS_TOPIC, p): log.end_offset(SCHEMAS_TOPIC, p) for p in range(partitions)})
    if ends == seen_at:
        return seen_at
    records = read_schema_records(log, topics)
    for topic in topics:
        versions = [int(record.get("version", 0)) for record in records.get(topic, ())]
        if not versions:
            continue
        known = None if planned is None or topic not in planned else planned[topic].version
        if known is None or max(versions) > known:
            raise SchemaChangedError(topic, known, max(versions))
    return ends
