"""Op jobs for operator actions: re-snapshot source tables, reprocess a feed or table, maintain tables.

Each op calls one library function; its errors (a name not in ``headwater.yaml``, a
table the source does not capture) fail the run with the library's one-line message
(:class:`dagster.Failure`), not a traceback.

Library modules are imported inside asset and check bodies: Dagster loads these definitions in
every process (webserver, daemon, each run), most of which never run a given stage.
"""

from collections.abc import Iterator

from dagster import AssetMaterialization, Config, Failure, OpExecutionContext, ScheduleDefinition, job, op
from pydantic import Field

from core.errors import HeadwaterError
from dagster_project.lineage import feed_key, topic_key, warehouse_key
from dagster_project.metadata import topic_metadata
from dagster_project.resources import HeadwaterLog, HeadwaterProject, HeadwaterSpark


class ResnapshotConfig(Config):
    """Which tables of which source to read again."""

    source: str = Field(description="A source of headwater.yaml.")
    tables: list[str] = Field(description="schema.table names the source captures, e.g. ['public.orders'].")


class ReprocessConfig(Config):
    """Which feed or warehouse table to rebuild."""

    name: str = Field(description="A feed or warehouse table of headwater.yaml.")
    drop_old: bool = Field(default=False, description="After the switch, delete the previous versions.")


def _failure(exc: HeadwaterError) -> Failure:
    return Failure(description=str(exc), allow_retries=False)


@op(
    name="incremental_snapshot",
    out={},
    description="Read the tables again as op 'r' events (source.snapshot 'incremental') while streaming goes on.",
)
def incremental_snapshot_op(
    context: OpExecutionContext, config: ResnapshotConfig, project: HeadwaterProject, log: HeadwaterLog
) -> Iterator[AssetMaterialization]:
    """Run :func:`capture.snapshots.run_incremental_snapshot`; report each topic it wrote."""
    from capture.snapshots import run_incremental_snapshot

    try:
        settings = project.load(needs_sources=True)
        run = run_incremental_snapshot(settings, config.source, config.tables)
    except HeadwaterError as exc:
        raise _failure(exc) from None
    how = "by the running capture agent" if run.by_running_agent else "by a capture run until caught up"
    context.log.info(f"snapshot {run.request_id} of {', '.join(run.tables)} done {how}")
    with log.open() as handle:
        for table in run.tables:
            topic = f"{config.source}.{table}"
            yield AssetMaterialization(
                topic_key(topic),
                description=f"incremental snapshot {run.request_id}",
                metadata={**topic_metadata(settings, handle, topic), "snapshot/request": run.request_id},
            )


@job(
    name="resnapshot_source",
    description="Incremental (DBLog) re-snapshot of source tables, by the running capture agent or a capture run.",
)
def resnapshot_job() -> None:
    """The re-snapshot job."""
    incremental_snapshot_op()


@op(
    name="reprocess_version",
    out={},
    description="Rebuild a feed or warehouse table as version N+1 from offset 0, then switch readers to it.",
)
def reprocess_op(
    context: OpExecutionContext,
    config: ReprocessConfig,
    project: HeadwaterProject,
    log: HeadwaterLog,
    spark: HeadwaterSpark,
) -> Iterator[AssetMaterialization]:
    """Run :func:`operations.reprocess.reprocess` (and ``drop_old``); report the asset's new version."""
    from operations.reprocess import drop_old, next_version, reprocess

    settings = project.load()
    try:
        next_version(settings, config.name)  # an unknown name fails before Spark starts
        with log.open() as handle:
            version = reprocess(spark.session(), settings, handle, config.name)
            dropped = drop_old(settings, handle, config.name) if config.drop_old else []
    except HeadwaterError as exc:
        raise _failure(exc) from None
    context.log.info(f"{config.name}: version {version.number} ({version.target}) is current; dropped {dropped}")
    key = feed_key(config.name) if version.kind == "feed" else warehouse_key(config.name)
    yield AssetMaterialization(
        key,
        description=f"reprocessed as version {version.number}",
        metadata={
            "reprocess/version": version.number,
            "reprocess/target": version.target,
            "reprocess/dropped": dropped,
        },
    )


@job(name="reprocess", description="Rebuild a feed or warehouse table from offset 0 as a new version, then switch.")
def reprocess_job() -> None:
    """The reprocess job."""
    reprocess_op()


class MaintainConfig(Config):
    """Which warehouse tables to maintain."""

    tables: list[str] = Field(default=[], description="Warehouse tables of headwater.yaml; empty: every enabled one.")


@op(
    name="maintain_pass",
    out={},
    description="Compact small files, checkpoint the log, vacuum what no version inside the retention needs.",
)
def maintain_op(
    context: OpExecutionContext, config: MaintainConfig, project: HeadwaterProject
) -> Iterator[AssetMaterialization]:
    """Run one pass of :func:`operations.maintain.maintain`; report each table's files, bytes and dirty ratio."""
    from operations.maintain import maintain, maintenance_status
    from warehouse_loader.maintenance import Done

    settings = project.load(needs_sources=False)
    unknown = [name for name in config.tables if name not in settings.warehouse.tables]
    if unknown:
        raise Failure(description=f"no warehouse table named {unknown[0]!r} in headwater.yaml", allow_retries=False)
    done: list[Done] = []
    try:
        maintain(settings, config.tables, done.append)
    except HeadwaterError as exc:
        raise _failure(exc) from None
    for item in done:
        context.log.info(item.describe())
    for name in sorted({item.table.split("/", 1)[0] for item in done}):
        shape = maintenance_status(settings, name)
        yield AssetMaterialization(
            warehouse_key(name),
            description="maintained",
            metadata={f"maintenance/{k}": v for k, v in shape.items() if isinstance(v, (int, float, str))},
        )


@job(name="maintain_tables", description="Compaction, checkpoints and vacuum of warehouse tables (one pass).")
def maintain_job() -> None:
    """The maintenance job (also on the hourly schedule ``maintain_tables_hourly``)."""
    maintain_op()


#: Maintenance at minute 30 of every hour (UTC) once turned on (``run --follow`` maintains tables itself).
maintain_schedule = ScheduleDefinition(name="maintain_tables_hourly", job=maintain_job, cron_schedule="30 * * * *")

#: The operator jobs, for :func:`dagster_project.definitions.build_definitions`.
OPERATOR_JOBS = [resnapshot_job, reprocess_job, maintain_job]
