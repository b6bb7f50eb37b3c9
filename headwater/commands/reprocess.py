"""``headwater reprocess NAME``: rebuild a feed or warehouse table as a new version, then switch readers."""

from __future__ import annotations

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from headwater.cli_context import Context, config_option, pass_context


@click.command("reprocess")
@click.argument("name")
@config_option
@click.option("--drop-old", is_flag=True, help="After switching, delete the previous versions (topics or tables).")
@click.option(
    "--accept-incomplete-history",
    is_flag=True,
    help="Rebuild an SCD2 table even though compaction removed versions from its topic.",
)
@pass_context
def reprocess_command(context: Context, name: str, drop_old: bool, accept_incomplete_history: bool) -> None:
    """Rebuild feed or table NAME from offset 0 as version N+1; switch readers when it has caught up."""
    from log.factory import open_log
    from operations.reprocess import check_history, next_version, reprocess
    from operations.reprocess import drop_old as drop_versions
    from spark_log.job import open_session
    from spark_log.session import stop_spark

    config = context.config(needs_sources=False)
    target = next_version(config, name)  # fails fast on an unknown name, before Spark starts
    if target.kind == "table":
        from warehouse_loader.formats import check_warehouse

        check_warehouse(config)  # a refused or missing bucket fails here, before Spark starts
    log = open_log(config)
    try:
        if not accept_incomplete_history:
            check_history(config, log, name)  # fails fast on a cleaned topic, before Spark starts
        spark = open_session(config, "headwater-reprocess")
    except BaseException:
        log.close()
        raise
    console = Console(stderr=True)
    try:
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
        with Progress(*columns, console=console, transient=True) as bar:
            task = bar.add_task(f"{name} v{target.number}: catching up", total=None)

            def show(done: int, total: int) -> None:
                bar.update(task, completed=done, total=total)

            version = reprocess(
                spark, config, log, name, progress=show, accept_incomplete_history=accept_incomplete_history
            )
        click.echo(f"{name}: version {version.number} ({version.target}) is current")
        if drop_old:
            for dropped in drop_versions(config, log, name):
                click.echo(f"dropped {dropped}")
    finally:
        log.close()
        stop_spark(spark)
