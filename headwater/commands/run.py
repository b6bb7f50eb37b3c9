"""``headwater run``: the whole pipeline, until caught up or supervised."""

from __future__ import annotations

import signal
from types import FrameType

import click

from headwater.cli_context import Context, config_option, once_or_follow, pass_context
from operations.pipeline import Supervisor, follow_stages, run_until_caught_up


@click.command("run")
@config_option
@once_or_follow(
    "until-caught-up",
    once_help="Everything committed before start through every stage.",
    follow_help="Supervised capture, feeds and loads until Ctrl-C / SIGTERM.",
)
@pass_context
def run_command(context: Context, follow: bool) -> None:
    """Capture + feeds + warehouse loads, in dependency order."""
    config = context.config()
    if not follow:
        run_until_caught_up(config, say=click.echo)
        return
    assert config.config_path is not None
    supervisor = Supervisor(follow_stages(config, config.config_path), say=lambda line: click.echo(line, err=True))

    def stop(_signum: int, _frame: FrameType | None) -> None:
        supervisor.stop()

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    raise SystemExit(supervisor.run())


def register(cli: click.Group) -> None:
    """Attach the ``run`` command."""
    cli.add_command(run_command)
