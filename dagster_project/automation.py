"""Jobs, the new-data sensor for warehouse loads, and the quality-check schedule."""

from dagster import (
    AssetSelection,
    RunRequest,
    ScheduleDefinition,
    SensorDefinition,
    SensorEvaluationContext,
    SkipReason,
    define_asset_job,
    sensor,
)

from dagster_project.lineage import WAREHOUSE_GROUP, warehouse_key
from dagster_project.metadata import end_position, pending_loads
from dagster_project.resources import HeadwaterLog, HeadwaterProject

#: Quality checks run at minute 0 of every hour (UTC) once the schedule is turned on.
QUALITY_CRON = "0 * * * *"

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
    name="warehouse_loads_on_new_data",
    target=AssetSelection.groups(WAREHOUSE_GROUP),
    minimum_interval_seconds=30,
    description="Loads the warehouse tables whose topic has records their loader has not committed past.",
)
def new_data_sensor(
    context: SensorEvaluationContext, project: HeadwaterProject, log: HeadwaterLog
) -> RunRequest | SkipReason:
    """Compare each table's topic end offsets with its loader's committed group offsets (``headwater.status`` lag)."""
    config = project.load()
    with log.open() as handle:
        pending = pending_loads(config, handle)
        if not pending:
            return SkipReason("every warehouse loader has committed up to its topic's end")
        # The run key changes only when a topic grows: one run per new data, however often the sensor ticks.
        run_key = ";".join(
            f"{name}@{end_position(handle, config.warehouse.tables[name].from_)}" for name in sorted(pending)
        )
    context.log.info(f"records behind per table: {pending}")
    return RunRequest(run_key=run_key, asset_selection=[warehouse_key(name) for name in sorted(pending)])


def build_sensors() -> list[SensorDefinition]:
    """The project's sensors."""
    return [new_data_sensor]
