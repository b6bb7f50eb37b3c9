"""``headwater maintain``: compact, checkpoint and vacuum warehouse tables (once, or ``--follow``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import click

from headwater.cli_context import (
    Context,
    Output,
    StageOptions,
    cleaner_options,
    config_option,
    pass_context,
    stop_on_signals,
)

if TYPE_CHECKING:
    from warehouse_loader.maintenance import Done


@click.command("maintain")
@click.argument("tables", nargs=-1)
@config_option
@click.option("--follow", is_flag=True, help="Repeat every warehouse.maintenance.interval_s until Ctrl-C / SIGTERM.")
@cleaner_options
@pass_context
def maintain_command(context: Context, tables: tuple[str, ...], follow: bool, options: StageOptions) -> None:
    """Compact small files, checkpoint the log and remove versions past the retention (all tables by default)."""
    from operations.maintain import maintain
    from warehouse_loader.load_job import UnknownWarehouseTableError

    output = options.output("maintain")
    config = context.config(needs_sources=False)
    unknown = [name for name in tables if name not in config.warehouse.tables]
    if unknown:
        known = ", ".join(config.warehouse.tables) or "none"
        msg = f"no warehouse table named {unknown[0]!r}; known: {known} (see warehouse.tables in headwater.yaml)"
        raise UnknownWarehouseTableError(msg)
    record = _recorder(context, options, output, tables)

    reported: list[Done] = []

    def report(done: Done) -> None:
        reported.append(done)
        if done.idle and follow:
            return  # a stage looking every second says only what it did
        output.info(done.describe(), table=done.table)
        if record is not None:
            record(done)

    maintain(config, tables, report, stop=stop_on_signals() if follow else None)
    if not reported and not follow:
        output.info("no table to maintain yet (not loaded)")


def _recorder(
    context: Context, options: StageOptions, output: Output, tables: tuple[str, ...]
) -> Callable[[Done], None] | None:
    """With ``--metrics-port`` (or as a stage of ``run --follow``), what counts each pass in the metrics."""
    from core.metrics import multiprocess_dir

    if options.metrics_port is None and multiprocess_dir() is None:
        return None
    from headwater.stage_runtime import StageRuntime
    from operations.pipeline_metrics import Scope, record_maintenance

    config = context.config(needs_sources=False)
    runtime = StageRuntime(config, options, output, "headwater maintain")
    runtime.serve(Scope(tables=tables or tuple(config.warehouse.tables)))
    return record_maintenance


def register(cli: click.Group) -> None:
    """Attach the ``maintain`` command."""
    cli.add_command(maintain_command)
