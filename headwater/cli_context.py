"""What every CLI command shares: the context object, ``--config`` and JSON output.

Command modules import from here, never from :mod:`headwater.cli` (which imports them).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import click
import orjson

from core.config import ProjectConfig, load_config


@dataclass
class Context:
    """Options shared by every command."""

    config_path: str | None
    debug: bool

    def config(self, *, needs_sources: bool = True) -> ProjectConfig:
        """Load and validate the project config (``--config``, else ``$HEADWATER_CONFIG``, else ``./headwater.yaml``).

        Commands that never connect to a source pass ``needs_sources=False`` so an unset
        password variable does not stop them.
        """
        return load_config(self.config_path, strict_env=needs_sources)


pass_context = click.make_pass_decorator(Context)
root_config_option = click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Path to headwater.yaml (default: $HEADWATER_CONFIG, else ./headwater.yaml).",
)


def _config_override(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    # `--config` is accepted both before and after the subcommand name.
    if value is not None:
        ctx.find_object(Context).config_path = value  # type: ignore[union-attr]


config_option = click.option(
    "--config",
    type=click.Path(dir_okay=False),
    expose_value=False,
    callback=_config_override,
    help="Path to headwater.yaml.",
)


def print_json(value: Any) -> None:
    """Write ``value`` as indented JSON to stdout."""
    sys.stdout.buffer.write(orjson.dumps(value, option=orjson.OPT_INDENT_2) + b"\n")
    sys.stdout.flush()


_Command = TypeVar("_Command", bound=Callable[..., Any])


def once_or_follow(once: str, *, once_help: str, follow_help: str) -> Callable[[_Command], _Command]:
    """The pair every long-running command takes: ``--<once>`` (catch up, then exit 0) or ``--follow``.

    Exactly one of them; the command receives ``follow: bool``.
    """
    once_name = once.replace("-", "_")

    def decorate(command: _Command) -> _Command:
        @functools.wraps(command)
        def checked(*args: Any, **kwargs: Any) -> Any:
            if kwargs.pop(once_name) == kwargs["follow"]:
                msg = f"pass exactly one of --{once} or --follow"
                raise click.UsageError(msg)
            return command(*args, **kwargs)

        with_follow = click.option("--follow", is_flag=True, help=follow_help)(checked)
        return click.option(f"--{once}", is_flag=True, help=once_help)(with_follow)  # type: ignore[return-value]

    return decorate
