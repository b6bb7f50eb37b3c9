"""The daily partitions of SCD2 history tables: one partition per UTC commit day."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from dagster import DailyPartitionsDefinition

#: The first day a history partition exists for (the log holds nothing older in any deployment so far).
HISTORY_START_DATE = "2024-01-01"

#: Days by ``__hw_commit_ts`` (UTC). ``end_offset=1`` includes today, so the current day can
#: be rebuilt too (while the streaming load is not running: one writer per table).
HISTORY_PARTITIONS = DailyPartitionsDefinition(start_date=HISTORY_START_DATE, timezone="UTC", end_offset=1)


#: Run tag: a partitioned history table loads incrementally (the streaming load, ``availableNow``)
#: for the run's partition instead of rebuilding that day from the log (the new-data sensor's runs).
INCREMENTAL_TAG = "headwater/load"
INCREMENTAL = "incremental"


def partition_days(keys: Sequence[str]) -> list[dt.date]:
    """The UTC dates of partition keys (``YYYY-MM-DD``)."""
    return [dt.date.fromisoformat(key) for key in keys]
