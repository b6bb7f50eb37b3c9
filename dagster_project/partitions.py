"""The daily partitions of SCD2 history tables: one partition per UTC commit day.

They start at the first day with data (:func:`dagster_project.history_days.history_start`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from dagster import DailyPartitionsDefinition

#: Run tag: a partitioned history table loads incrementally (the streaming load, ``availableNow``)
#: for the run's partition instead of rebuilding that day from the log (the new-data sensor's runs).
INCREMENTAL_TAG = "headwater/load"
INCREMENTAL = "incremental"


def history_partitions(start: dt.date) -> DailyPartitionsDefinition:
    """Days by ``__hw_commit_ts`` (UTC) from ``start``.

    ``end_offset=1`` includes today, so the current day can be rebuilt too (while the
    streaming load is not running: one writer per table).
    """
    return DailyPartitionsDefinition(start_date=start.isoformat(), timezone="UTC", end_offset=1)


def partition_days(keys: Sequence[str]) -> list[dt.date]:
    """The UTC dates of partition keys (``YYYY-MM-DD``)."""
    return [dt.date.fromisoformat(key) for key in keys]
