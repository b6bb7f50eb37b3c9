"""What every CLI command shares: the context object, ``--config`` and JSON output.

Command modules import from here, never from :mod:`headwater.cli` (which imports them).
"""

from __future__ import annotations

import contextlib
import functools
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import FrameType
from typing import Any, TypeVar

import click
import orjson

from core import stop_request
from core.config import ProjectConfig, load_config
from core.errors import HeadwaterError
from core.leases import LeaseWait
from core.log_format import LogFormat, configure_logging, json_line
from spark_log.task_errors import unwrap


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


@dataclass
class Output:
    """What a command prints: text lines as always, or with ``--log-format json`` one JSON object per line.

    ``info`` goes to stdout (results), ``note`` and ``warn`` to stderr (progress, notices).
    """

    log_format: LogFormat = "text"
    stage: str = "cli"

    def info(self, message: str, **fields: Any) -> None:
        """A result line (stdout)."""
        self._emit(message, "info", fields, err=False)

    def note(self, message: str, **fields: Any) -> None:
        """A progress or notice line (stderr)."""
        self._emit(message, "info", fields, err=True)

    def warn(self, message: str, **fields: Any) -> None:
        """A warning (stderr)."""
        self._emit(message if self.log_format == "json" else f"warning: {message}", "warning", fields, err=True)

    def _emit(self, message: str, level: str, fields: dict[str, Any], *, err: bool) -> None:
        text = json_line(self.stage, level, message, fields) if self.log_format == "json" else message
        click.echo(text, err=err)


@dataclass(frozen=True)
class StageOptions:
    """The options every long-running stage command takes (``capture``, ``feeds run``, ``load``, ``run``)."""

    log_format: LogFormat
    metrics_port: int | None
    metrics_host: str
    holder_timeout_s: float

    def output(self, stage: str) -> Output:
        """The command's output, with library logging routed the same way."""
        configure_logging(self.log_format, stage)
        return Output(self.log_format, stage)

    def holder_wait(self, output: Output, *, follow: bool) -> LeaseWait:
        """Wait for a holder as a standby (``--follow``) or at most ``--holder-timeout`` seconds."""
        return LeaseWait(None if follow else self.holder_timeout_s, say=output.note)


@contextlib.contextmanager
def _last_error_kept() -> Iterator[None]:
    """Keep the stage's Headwater error for ``headwater status`` (:mod:`operations.stage_errors`)."""
    ctx = click.get_current_context()
    stage = ctx.command_path.split(" ", 1)[-1]  # "feeds run", "load", ...
    try:
        yield
    except Exception as exc:
        error = exc if isinstance(exc, HeadwaterError) else unwrap(exc)
        if error is None:
            raise
        config = _loaded(ctx)
        if config is not None:
            from operations.stage_errors import remember

            remember(config, stage, error)
        if error is exc:
            raise
        raise error from exc
    config = _loaded(ctx)
    if config is not None:
        from operations.stage_errors import forget

        forget(config, stage)


def _loaded(ctx: click.Context) -> ProjectConfig | None:
    """The project's config if it loads (an error about the config itself is kept nowhere)."""
    context = ctx.find_object(Context)
    try:
        return load_config(context.config_path if context is not None else None, strict_env=False)
    except (HeadwaterError, OSError):
        return None


#: Seconds a run that must finish waits for another process holding what it needs.
DEFAULT_HOLDER_TIMEOUT_S = 60.0


def stage_options(command: _Command) -> _Command:
    """Add ``--log-format``, ``--metrics-port``, ``--metrics-host``, ``--holder-timeout``; pass ``options``."""
    return _with_stage_options(command, holders=True)


def cleaner_options(command: _Command) -> _Command:
    """``stage_options`` without ``--holder-timeout`` (the log's cleaner waits for no holder)."""
    return _with_stage_options(command, holders=False)


def _with_stage_options(command: _Command, *, holders: bool) -> _Command:
    @functools.wraps(command)
    def collected(*args: Any, **kwargs: Any) -> Any:
        kwargs["options"] = StageOptions(
            kwargs.pop("log_format"),
            kwargs.pop("metrics_port"),
            kwargs.pop("metrics_host"),
            kwargs.pop("holder_timeout") if holders else DEFAULT_HOLDER_TIMEOUT_S,
        )
        if not kwargs.get("follow"):
            with _last_error_kept():
                return command(*args, **kwargs)
        # --follow: SIGINT/SIGTERM are a clean stop at any moment (core.stop_request).
        try:
            stop_request.stop_anywhere()
            with _last_error_kept():
                return command(*args, **kwargs)
        except KeyboardInterrupt:
            stop_request.listen()
            click.echo("stopped", err=True)
            return None

    options = [
        click.option("--metrics-host", default="127.0.0.1", show_default=True, help="Address of --metrics-port."),
        click.option(
            "--metrics-port",
            type=click.IntRange(1, 65535),
            default=None,
            help="Serve Prometheus metrics on http://HOST:PORT/metrics.",
        ),
        click.option(
            "--log-format",
            type=click.Choice(["text", "json"]),
            default="text",
            show_default=True,
            help="json: one JSON object per line (time, level, stage, message, source, table, lsn, offset).",
        ),
    ]
    if holders:
        holder_timeout = click.option(
            "--holder-timeout",
            type=click.FloatRange(min=0),
            default=DEFAULT_HOLDER_TIMEOUT_S,
            show_default=True,
            help="Seconds to wait when another process holds a source or table (not with --follow, which "
            "waits as a standby and takes over when the holder stops).",
        )
        options.insert(0, holder_timeout)
    decorated: Any = collected
    for option in options:
        decorated = option(decorated)
    return decorated  # type: ignore[no-any-return]


def stop_on_signals() -> threading.Event:
    """An event SIGINT and SIGTERM set: a follower finishes what it is doing (a batch, a pass) and leaves."""
    stop = stop_request.SignalSafeEvent()

    def handle(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGINT, handle)
    signal.signal(signal.SIGTERM, handle)
    if stop_request.requested.is_set():  # asked before the handlers above (core.stop_request)
        stop.set()
    return stop
