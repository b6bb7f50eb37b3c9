"""The ``headwater`` command line: parses arguments, loads config, delegates to the packages.

Every command takes ``--config``. A :class:`~core.errors.HeadwaterError` is printed
as one line on stderr with a non-zero exit; ``--debug`` adds the traceback.
"""

from __future__ import annotations

import atexit
import importlib
import os
import sys
import threading
import traceback
from pathlib import Path

import click

from core.errors import EXIT_PERMANENT, HeadwaterError, PermanentError, one_line
from headwater import __version__
from headwater.cli_context import Context, config_option, pass_context, print_json, root_config_option
from operations.scaffold import init_project
from spark_log.task_errors import unwrap

__all__ = ["Context", "cli", "config_option", "main", "pass_context", "print_json"]

EXIT_ERROR = 1
EXIT_USAGE = 2


# Command name -> the module under headwater/commands that attaches it. Modules are imported on
# first use: `headwater log tail` need not import Spark, Dagster or psycopg (each CLI process
# starts in a fraction of the time, which every subprocess-driven test and script feels).
_COMMAND_MODULES = {
    "source": "source",
    "capture": "capture",
    "snapshot": "snapshot",
    "log": "log",
    "query": "warehouse",
    "load": "warehouse",
    "quality": "quality",
    "run": "run",
    "status": "status",
    "ui": "ui",
    "demo": "demo",
    "feeds": "feeds",
    "reprocess": "feeds",
    "verify": "verify",
    "maintain": "maintain",
    "sinks": "sinks",
}


class _LazyGroup(click.Group):
    """The root group: imports a command's module when the command is asked for."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *_COMMAND_MODULES})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        module_name = _COMMAND_MODULES.get(cmd_name)
        if module_name is not None and cmd_name not in self.commands:
            importlib.import_module(f"headwater.commands.{module_name}").register(self)
        return super().get_command(ctx, cmd_name)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="headwater")
@root_config_option
@click.option("--debug", is_flag=True, help="Show tracebacks on errors.")
@click.pass_context
def cli(ctx: click.Context, config_path: str | None, debug: bool) -> None:
    """Headwater: PostgreSQL change capture into a unified log, feeds and a Delta warehouse."""
    ctx.obj = Context(config_path=config_path, debug=debug)


@cli.command("init")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path), default=".")
@click.option("--project", default=None, help="Project name (default: the directory name).")
def init_command(directory: Path, project: str | None) -> None:
    """Scaffold headwater.yaml and the state dir in DIRECTORY."""
    path = init_project(directory, project)
    click.echo(f"wrote {path}")
    click.echo("next: headwater source add NAME --dsn DSN --tables schema.table,...")


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; return the process exit code."""
    debug = "--debug" in (argv if argv is not None else sys.argv[1:])
    # libpq: text as UTF-8 on every connection; on a SQL_ASCII database psycopg would return bytes.
    os.environ.setdefault("PGCLIENTENCODING", "UTF8")
    try:
        cli.main(args=argv, prog_name="headwater", standalone_mode=False)
    except HeadwaterError as exc:
        return _failed(exc, debug=debug)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return EXIT_ERROR
    except click.UsageError as exc:
        # One line like every other error (click's own form is three), with where to find help.
        command = exc.ctx.command_path if exc.ctx is not None else "headwater"
        message = one_line(exc.format_message()).rstrip(".")
        click.echo(f"error: {message}; see '{command} --help'", err=True)
        return EXIT_USAGE
    except click.ClickException as exc:
        click.echo(f"error: {one_line(exc.format_message())}", err=True)
        return EXIT_USAGE
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        return 130
    except Exception as exc:  # a bug, not bad input: still one line unless --debug
        carried = unwrap(exc)  # a Headwater error raised inside Spark, come back as Spark's text
        if carried is not None:
            return _failed(carried, debug=debug)
        if debug:
            traceback.print_exc()
        detail = one_line(str(exc))
        click.echo(f"error: unexpected {type(exc).__name__}: {detail} (rerun with --debug for the traceback)", err=True)
        return EXIT_ERROR
    return 0


def exit_quietly() -> None:
    """In a process that runs the CLI as its program: nothing on stderr after its last line (unless ``--debug``)."""
    if "--debug" not in sys.argv[1:]:
        atexit.register(_no_words_after_the_last_line)


def _no_words_after_the_last_line() -> None:
    """Keep what the interpreter prints while it shuts down off stderr once the CLI has said its last line.

    A command that stops on an error can leave threads mid-work: another streaming query's
    micro-batch in py4j's callback thread, holding DuckDB cursors. The interpreter exits under
    them, and DuckDB's bindings then print a hundred "nanobind: leaked instance" lines below the
    one ``error:`` line (seen in CI). Nothing they say is actionable, and what they held is redone
    from checkpoints. Only when such threads remain; ``--debug`` keeps everything.
    """
    if not any(thread.is_alive() for thread in threading.enumerate() if thread is not threading.main_thread()):
        return
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.close(devnull)


def _failed(error: HeadwaterError, *, debug: bool) -> int:
    """Print ``error`` as the one ``error:`` line (the traceback too with ``--debug``); its exit code."""
    if debug:
        traceback.print_exc()
    click.echo(f"error: {one_line(str(error))}", err=True)
    return EXIT_PERMANENT if isinstance(error, PermanentError) else EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
