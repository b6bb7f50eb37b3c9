"""What every CLI command shares: the context object, ``--config`` and JSON output.

Command modules import from here, never from :mod:`headwater.cli` (which imports them).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import click
import orjson

from core.config import ProjectConfig, load_config


@dataclass
class Context:
    """Options shared by every command."""

    config_path: str | None
    debug: bool

    def config(self, *, needs_sources: bool = True) -> ProjectConfig:
        """Load and validate the project config (found as DESIGN section 2 says).

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
