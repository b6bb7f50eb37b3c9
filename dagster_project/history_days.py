"""The commit days of SCD2 history tables: where their partitions start, and what a run of pending work brings.

The partitions start at the commit day of the oldest change in the history tables' input
topics (the first change of each partition: the log is in commit order per partition).
Once found it is kept in ``<home>/dagster/history_start``, so the partitions never shrink
when compaction drops the oldest records; before any data exists they start today.

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
import logging
from collections.abc import Iterator
from pathlib import Path

import orjson

from core.config import ProjectConfig
from core.durable_files import replace_file
from dagster_project.metadata import PendingWork
from log.base import Log
from log.topics import load_group

logger = logging.getLogger(__name__)
_START_FILE = "history_start"
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
    return max(first, history_start(config, log, today)), today


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


def history_start(config: ProjectConfig, log: Log | None, today: dt.date | None = None) -> dt.date:
    """The first partition day of the project's history tables (see the module docstring)."""
    today = today or dt.datetime.now(dt.UTC).date()
    kept_path = config.home_dir / "dagster" / _START_FILE
    kept = _read_day(kept_path)
    found = first_day(config, log) if log is not None else None
    if found is not None and (kept is None or found < kept):
        replace_file(kept_path, found.isoformat().encode(), durable=False)
        kept = found
    return min(kept or today, today)


def first_day(config: ProjectConfig, log: Log) -> dt.date | None:
    """The commit day (UTC) of the oldest change in the input topics of the SCD2 tables (None: none yet)."""
    from warehouse_loader.load_job import load_identity

    try:
        existing = set(log.list_topics())
        days = []
        for name, table in config.warehouse.tables.items():
            if table.mode != "scd2":
                continue
            _, topic = load_identity(config, name)
            if topic not in existing:
                continue
            for partition in range(log.describe_topic(topic).partitions):
                start = log.beginning_offset(topic, partition)
                day = next(
                    (d for r in log.read(topic, partition, start, max_records=_PEEK) if (d := _commit_day(r.value))),
                    None,
                )
                if day is not None:
                    days.append(day)
    except Exception as exc:  # a log that cannot be read now must not stop the definitions from loading
        logger.warning("history partitions: could not read the log (%s); using the day kept before", exc)
        return None
    return min(days) if days else None


def _read_day(path: Path) -> dt.date | None:
    try:
        return dt.date.fromisoformat(path.read_text().strip())
    except (OSError, ValueError):
        return None
