"""``headwater snapshot NAME --tables T,...``: request an incremental re-snapshot while streaming goes on."""

from __future__ import annotations

import click

from headwater.cli_context import Context, config_option, pass_context


@click.command("snapshot")
@click.argument("name")
@config_option
@click.option("--tables", required=True, help="Comma-separated schema.table names to read again.")
@pass_context
def snapshot_command(context: Context, name: str, tables: str) -> None:
    """Re-read TABLES of source NAME as incremental snapshot events; a running capture picks it up."""
    from capture.kinds import kind_of

    config = context.config(needs_sources=False)
    kind = kind_of(config, name)
    request = kind.request_snapshot(config, name, kind.split_tables(tables, what="--tables"))
    click.echo(
        f"requested incremental snapshot {request.request_id} of {', '.join(request.tables)}: a running "
        f"'headwater capture' for {name} picks it up within seconds (PostgreSQL: a second; MySQL: at the "
        "binlog heartbeat on an idle server), otherwise the next one does"
    )


def register(cli: click.Group) -> None:
    """Attach the ``snapshot`` command."""
    cli.add_command(snapshot_command)
