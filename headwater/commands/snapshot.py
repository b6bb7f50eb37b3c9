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
    from capture.errors import UnknownSourceError
    from capture.identifiers import split_list
    from capture.incremental_snapshot import request_incremental_snapshot

    config = context.config(needs_sources=False)
    if name not in config.sources:
        msg = f"no source named {name!r}; known: {', '.join(config.sources) or 'none'} (see 'headwater source list')"
        raise UnknownSourceError(msg, source=name)
    request_id, names = request_incremental_snapshot(
        config.home_dir / "capture" / name, split_list(tables, what="--tables")
    )
    click.echo(
        f"requested incremental snapshot {request_id} of {', '.join(map(str, names))}: a running "
        f"'headwater capture' for {name} picks it up within a second, otherwise the next one does"
    )


def register(cli: click.Group) -> None:
    """Attach the ``snapshot`` command."""
    cli.add_command(snapshot_command)
