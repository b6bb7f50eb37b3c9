"""``headwater source ...``: register and inspect source databases."""

from __future__ import annotations

from typing import Any

import click
from rich.console import Console
from rich.table import Table

from headwater.cli import Context, config_option, pass_context, print_json


@click.group("source")
def source_group() -> None:
    """Register and inspect source databases."""


@source_group.command("list")
@config_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@pass_context
def source_list(context: Context, as_json: bool) -> None:
    """List the registered sources (DSN passwords masked)."""
    config = context.config()
    rows: list[dict[str, Any]] = [
        {
            "name": name,
            "dsn": source.dsn_redacted,
            "tables": list(source.tables) if source.tables is not None else None,
            "schemas": list(source.schemas) if source.schemas is not None else None,
            "snapshot": source.snapshot,
        }
        for name, source in config.sources.items()
    ]
    if as_json:
        print_json(rows)
        return
    if not rows:
        click.echo("no sources registered; add one with: headwater source add NAME --dsn DSN --tables T,...")
        return
    table = Table("name", "dsn", "captures", "snapshot")
    for row in rows:
        captures = ", ".join(row["tables"] or [f"schema {s}" for s in row["schemas"] or []])
        table.add_row(row["name"], row["dsn"], captures, row["snapshot"])
    Console().print(table)


def register(cli: click.Group) -> None:
    """Attach the ``source`` commands to the root group."""
    cli.add_command(source_group)
