"""The commit days a run of pending work brings to SCD2 history tables.

The new-data sensor's run loads everything new into a history table, whatever day it
was committed; after downtime that spans several days, so the run must mark each of
those days' partitions, not only today's. The first pending record of every partition
of the table's input (and, when that input is a pending feed, of the feed's inputs) is
the oldest commit the run applies there: the log is in commit order per partition.

Library modules are imported inside asset and check bodies: Dagster loads these definitions in
every process (webserver, daemon, each run), most of which never run a given stage.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

import orjson

from core.config import ProjectConfig
from dagster_project.metadata import PendingWork
from dagster_project.partitions import HISTORY_START_DATE
from log.base import Log
from log.topics import load_group

#: Records read past tombstones at a partition's first pending offset before giving up on it.
_PEEK = 64


def history_days(config: ProjectConfig, log: Log, work: PendingWork, today: dt.date) -> tuple[dt.date, dt.date] | None:
    """First and last commit day (UTC) the pending SCD2 loads apply; ``None`` if no SCD2 table is pending.

    The last day is ``today``; the first is the oldest pending commit's day (never before
    the partitions' start, never after ``today``).
    """
    from derived_feeds.feed_spec import feed_spec
    from warehouse_loader.load_job import load_identity

    history = [name for name in work.tables if config.warehouse.tables[name].mode == "scd2"]
    if not history:
        return None
    inputs: set[tuple[str, str]] = set()
    for name in history:
        build, topic = load_identity(config, name)
        inputs.add((load_group(build), topic))
        source = config.warehouse.tables[name].from_
        if source in work.feeds:
            spec = feed_spec(config, source)
            inputs.update((spec.group, input_topic) for input_topic in spec.input_topics)
    existing = set(log.list_topics())
    first = today
    for group, topic in sorted(inputs):
        if topic in existing:
            first = min([first, *_pending_commit_days(log, group, topic)])
    return max(first, dt.date.fromisoformat(HISTORY_START_DATE)), today


def _pending_commit_days(log: Log, group: str, topic: str) -> Iterator[dt.date]:
    """The commit day of the first pending change in each partition of ``topic`` for ``group``."""
    committed = log.committed(group, topic)
    for partition in range(log.describe_topic(topic).partitions):
        start = committed.get(partition, log.beginning_offset(topic, partition))
        if start >= log.end_offset(topic, partition):
            continue
        for record in log.read(topic, partition, start, max_records=_PEEK):
            day = _commit_day(record.value)
            if day is not None:
                yield day
                break


def _commit_day(value: bytes | None) -> dt.date | None:
    """The UTC day of a change event's ``source.ts_us``; ``None`` for tombstones and other records."""
    if value is None:
        return None
    try:
        ts_us = orjson.loads(value)["source"]["ts_us"]
        return dt.datetime.fromtimestamp(int(ts_us) / 1_000_000, dt.UTC).date()
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, OverflowError, OSError):
        return None
