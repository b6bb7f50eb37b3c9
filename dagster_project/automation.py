"""Jobs, the new-data sensor for feeds and loads, and the quality-check schedule.

The sensor compares every feed's and warehouse loader's committed consumer-group
offsets with its input topics' ends (the lag ``headwater status`` shows) and requests
one run of what is behind, feeds first (a table reading a pending feed is included).
An SCD2 history table is daily-partitioned: in that run it is materialised with the
:data:`~dagster_project.partitions.INCREMENTAL_TAG`, which makes it run the streaming load
(everything new, whatever day it was committed) instead of a rebuild, for the partitions of
every day the new changes were committed on (today's alone while nothing older is pending; a
day range after downtime, see :mod:`dagster_project.history_days`). Only one such run is in
flight at a time, so a table never has two loaders.
"""

import datetime as dt

from dagster import (
    AssetSelection,
    DagsterRunStatus,
    RunRequest,
    RunsFilter,
    ScheduleDefinition,
    SensorDefinition,
    SensorEvaluationContext,
    SkipReason,
    define_asset_job,
    sensor,
)

from dagster_project.history_days import history_days
from dagster_project.lineage import FEEDS_GROUP, WAREHOUSE_GROUP, feed_key, warehouse_key
from dagster_project.metadata import pending_work
from dagster_project.partitions import INCREMENTAL, INCREMENTAL_TAG
from dagster_project.resources import HeadwaterLog, HeadwaterProject

#: Quality checks run at minute 0 of every hour (UTC) once the schedule is turned on.
QUALITY_CRON = "0 * * * *"
#: Run tag of the sensor's runs (one in flight at a time).
TRIGGER_TAG = "headwater/trigger"
NEW_DATA = "new-data"
#: Dagster's run tags for a run over a range of partitions (a single-run backfill uses the same).
RANGE_START_TAG = "dagster/asset_partition_range_start"
RANGE_END_TAG = "dagster/asset_partition_range_end"
_IN_FLIGHT = [
    DagsterRunStatus.QUEUED,
    DagsterRunStatus.NOT_STARTED,
    DagsterRunStatus.STARTING,
    DagsterRunStatus.STARTED,
    DagsterRunStatus.CANCELING,
]

warehouse_job = define_asset_job(
    "warehouse_loads",
    selection=AssetSelection.groups(WAREHOUSE_GROUP),
    description="Load every warehouse table from the log (available now), then run its checks.",
)
quality_job = define_asset_job(
    "quality_checks",
    selection=AssetSelection.all_asset_checks(),
    description="Run the quality suites of headwater.yaml against the warehouse as it is.",
)
quality_schedule = ScheduleDefinition(name="quality_checks_hourly", job=quality_job, cron_schedule=QUALITY_CRON)


@sensor(
    name="pipeline_on_new_data",
    target=AssetSelection.groups(FEEDS_GROUP, WAREHOUSE_GROUP),
    minimum_interval_seconds=30,
    description="Runs the feeds and warehouse loads whose input has records their consumer group has not "
    "committed past (SCD2 history: the partitions of the days the new changes were committed on, loaded "
    "incrementally).",
)
def new_data_sensor(
    context: SensorEvaluationContext, project: HeadwaterProject, log: HeadwaterLog
) -> RunRequest | SkipReason:
    """One run of the pending feeds and loads, unless the previous one is still in flight."""
    in_flight = context.instance.get_run_records(RunsFilter(tags={TRIGGER_TAG: NEW_DATA}, statuses=_IN_FLIGHT), limit=1)
    if in_flight:
        return SkipReason(f"run {in_flight[0].dagster_run.run_id} for earlier new data is still in flight")
    config = project.load()
    today = dt.datetime.now(dt.UTC).date()
    with log.open() as handle:
        work = pending_work(config, handle)
        days = history_days(config, handle, work, today) if work else None
    if not work:
        return SkipReason("every feed and warehouse loader has committed up to its input's end")
    context.log.info(f"records behind: feeds {work.feeds}, tables {work.tables}")
    selection = [feed_key(name) for name in sorted(work.feeds)]
    selection += [warehouse_key(name) for name in sorted(work.tables)]
    tags = {TRIGGER_TAG: NEW_DATA, INCREMENTAL_TAG: INCREMENTAL}
    partition_key = None
    if days is not None and days[0] == days[1]:
        partition_key = days[1].isoformat()
    elif days is not None:
        context.log.info(f"history partitions {days[0]} .. {days[1]}: new changes were committed on those days")
        tags |= {RANGE_START_TAG: days[0].isoformat(), RANGE_END_TAG: days[1].isoformat()}
    return RunRequest(
        # Changes only when an input grows: one run per new data, however often the sensor ticks.
        run_key=work.position,
        asset_selection=selection,
        partition_key=partition_key,
        tags=tags,
    )


def build_sensors() -> list[SensorDefinition]:
    """The project's sensors."""
    return [new_data_sensor]
