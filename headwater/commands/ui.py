"""``headwater ui``: the Dagster UI (webserver + daemon) for this project, on 127.0.0.1 by default."""

from __future__ import annotations

import click

from dagster_project.ui import DEFAULT_HOST, DEFAULT_PORT, dagster_home, run_ui
from headwater.cli_context import Context, config_option, pass_context


@click.command("ui")
@config_option
@click.option("--host", default=DEFAULT_HOST, show_default=True, help="Address to bind (keep it local unless told).")
@click.option("--port", type=click.IntRange(1, 65535), default=DEFAULT_PORT, show_default=True, help="Port.")
@pass_context
def ui_command(context: Context, host: str, port: int) -> None:
    """Serve the Dagster UI for this project until Ctrl-C."""
    config = context.config(needs_sources=False)
    click.echo(f"starting Dagster (DAGSTER_HOME={dagster_home(config)})", err=True)

    def ready(url: str) -> None:
        click.echo(f"Dagster UI: {url}  (Ctrl-C to stop)", err=True)

    run_ui(config, host=host, port=port, on_ready=ready)
    click.echo("stopped the Dagster webserver and daemon", err=True)


def register(cli: click.Group) -> None:
    """Attach the ``ui`` command."""
    cli.add_command(ui_command)
