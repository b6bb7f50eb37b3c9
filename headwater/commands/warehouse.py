"""``headwater load`` and ``headwater query``: materialise and query warehouse tables."""

from __future__ import annotations

import sys
from typing import Any

import click

from headwater.cli_context import Context, StageOptions, config_option, once_or_follow, pass_context, stage_options
from warehouse_loader.query import OutputFormat, format_result, query_warehouse


@click.command("query")
@click.argument("sql")
@config_option
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "json", "csv"]),
    default="table",
    show_default=True,
    help="json: one array of row objects.",
)
@pass_context
def query_command(context: Context, sql: str, fmt: OutputFormat) -> None:
    """Run read-only SQL over warehouse tables (DuckDB; tables by their warehouse name)."""
    result = query_warehouse(context.config(needs_sources=False), sql)
    text = format_result(result, fmt)
    sys.stdout.write(text if text.endswith("\n") else text + "\n")


@click.command("load")
@click.argument("tables", nargs=-1)
@config_option
@once_or_follow(
    "available-now",
    once_help="Load everything in the log now, then exit 0.",
    follow_help="Keep loading as the log grows, until Ctrl-C; wait as a standby while another process loads.",
)
@stage_options
@pass_context
def load_command(context: Context, tables: tuple[str, ...], follow: bool, options: StageOptions) -> None:
    """Materialise warehouse tables (all by default) from the log with Spark."""
    from headwater.stage_runtime import StageRuntime
    from operations.holders import holding
    from operations.pipeline_metrics import Scope
    from spark_log.job import follow as follow_queries
    from spark_log.job import spark_job
    from warehouse_loader.load_job import run_loads, start_load

    output = options.output("load")
    config = context.config(needs_sources=False)
    unknown = [name for name in tables if name not in config.warehouse.tables]
    if unknown:  # before Spark's start, which takes seconds
        from warehouse_loader.load_job import UnknownWarehouseTableError

        known = ", ".join(config.warehouse.tables) or "none"
        msg = f"no warehouse table named {unknown[0]!r}; known: {known} (see warehouse.tables in headwater.yaml)"
        raise UnknownWarehouseTableError(msg)
    from warehouse_loader.formats import check_warehouse

    check_warehouse(config)  # a refused or missing bucket fails here, before Spark starts
    selected = tables or tuple(config.warehouse.tables)
    runtime = StageRuntime(config, options, output, "headwater load")
    runtime.tables = selected
    runtime.serve(Scope(tables=selected))
    # Held before Spark starts: a second loader of a table waits or names the holder, no Spark error.
    with (
        holding(config, "load", selected, options.holder_wait(output, follow=follow)),
        spark_job(config, "headwater-load") as (spark, log),
        runtime.recording(follow=follow),
    ):
        queries = run_loads(spark, config, log, selected, available_now=not follow)
        for name, query in zip(selected, queries, strict=True):
            runtime.follow_query("load", name, query)
        if follow:
            output.note(f"loading {', '.join(q.name or '?' for q in queries)}; Ctrl-C to stop")
            follow_queries(
                spark, queries, restart=lambda at: start_load(spark, config, log, selected[at], available_now=False)
            )
        for name, query in zip(selected, queries, strict=True):
            progress: dict[str, Any] = dict(query.lastProgress or {})
            output.info(
                f"{query.name}: last batch {progress.get('batchId', '-')}, rows {progress.get('numInputRows', 0)}",
                table=name,
            )


def register(cli: click.Group) -> None:
    """Attach the warehouse commands."""
    cli.add_command(query_command)
    cli.add_command(load_command)
