"""``headwater query``: SQL over the warehouse tables, by name."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from headwater.cli import Context, config_option, pass_context
from headwater.config import ProjectConfig
from warehouse_loader.query import OutputFormat, format_result, run_query


def warehouse_paths(config: ProjectConfig) -> dict[str, Path]:
    """Every configured warehouse table's Delta path (``<home>/warehouse/<name>``)."""
    root = config.home_dir / "warehouse"
    return {name: root / name for name in config.warehouse.tables}


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
    result = run_query(sql, warehouse_paths(context.config(needs_sources=False)))
    text = format_result(result, fmt)
    sys.stdout.write(text if text.endswith("\n") else text + "\n")


def register(cli: click.Group) -> None:
    """Attach the warehouse commands."""
    cli.add_command(query_command)
