"""``headwater capture``: stream registered sources into the log."""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeRemainingColumn

from capture.runner import ProgressFactory, run_capture
from capture.source_kind import SnapshotProgress
from core.config import ProjectConfig
from headwater.cli_context import (
    Context,
    Output,
    StageOptions,
    config_option,
    once_or_follow,
    pass_context,
    stage_options,
)
from operations.pipeline import BackgroundCleaner

if TYPE_CHECKING:
    from capture.stats import CaptureStats


class RichSnapshotProgress:
    """Snapshot progress as a rich bar with rows/s and ETA."""

    def __init__(self, source: str, console: Console) -> None:
        self._source = source
        self._progress = Progress(
            TextColumn("snapshot {task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]}"),
            TimeRemainingColumn(),
            console=console,
            transient=False,
        )
        self._task: TaskID | None = None
        self._started = 0.0

    def start(self, total_rows: int) -> None:
        """Show the bar."""
        self._progress.start()
        self._task = self._progress.add_task(self._source, total=max(total_rows, 1), rate="")
        self._started = time.monotonic()

    def advance(self, rows: int) -> None:
        """Move the bar."""
        if self._task is not None:
            self._progress.advance(self._task, rows)
            done = self._progress.tasks[0].completed
            rate = done / max(time.monotonic() - self._started, 1e-6)
            self._progress.update(self._task, rate=f"{rate:,.0f} rows/s")

    def finish(self) -> None:
        """Complete and stop the bar."""
        if self._task is not None:
            task = self._progress.tasks[0]
            self._progress.update(self._task, total=max(task.completed, 1))
        self._progress.stop()


def _progress_for(console: Console) -> ProgressFactory:
    def make(name: str) -> SnapshotProgress | None:
        return RichSnapshotProgress(name, console) if console.is_terminal else None

    return make


@click.command("capture")
@click.argument("names", nargs=-1)
@config_option
@once_or_follow(
    "until-caught-up",
    once_help="Capture everything committed before start, then exit 0.",
    follow_help="Keep streaming until Ctrl-C / SIGTERM; wait as a standby while another process captures.",
)
@click.option(
    "--cleaner/--no-cleaner",
    default=True,
    help="With --follow, run the log's cleaner beside capture (headwater log clean --follow).",
)
@stage_options
@pass_context
def capture_command(
    context: Context, names: tuple[str, ...], follow: bool, cleaner: bool, options: StageOptions
) -> None:
    """Stream registered sources (all by default) into the log."""
    output = options.output("capture")
    config = context.config()
    with_cleaner = follow and cleaner and config.config_path is not None
    with contextlib.ExitStack() as stack:
        if with_cleaner and options.metrics_port is not None:
            # Before prometheus_client is imported: capture and its cleaner record into one directory.
            from headwater.stage_runtime import children_record_metrics

            stack.enter_context(children_record_metrics(here_too=True))
        results = _capture(config, names, options, output, stack, follow=follow, with_cleaner=with_cleaner)
    for name, stats in results.items():
        output.info(
            f"{name}: {stats.transactions} transactions, {stats.events} events, "
            f"{stats.records_written} records written, {stats.records_skipped} already in the log, "
            f"acknowledged {stats.acked}",
            source=name,
            lsn=stats.acked,
        )


def _capture(
    config: ProjectConfig,
    names: tuple[str, ...],
    options: StageOptions,
    output: Output,
    stack: contextlib.ExitStack,
    *,
    follow: bool,
    with_cleaner: bool,
) -> dict[str, CaptureStats]:
    from headwater.stage_runtime import StageRuntime
    from operations.pipeline_metrics import Scope

    runtime = StageRuntime(config, options, output, "headwater capture")
    runtime.serve(Scope(sources=names or tuple(config.sources)))
    if with_cleaner:
        assert config.config_path is not None
        cleaner_options = ["--log-format", options.log_format]
        stack.enter_context(BackgroundCleaner(config.config_path, say=output.note, options=cleaner_options))
    progress = _progress_for(Console(stderr=True)) if options.log_format == "text" else None
    with runtime.recording(follow=follow):
        return run_capture(
            config,
            names,
            until_caught_up=not follow,
            progress=progress,
            holder_wait=options.holder_wait(output, follow=follow),
            observe=runtime.observe_capture,
        )


__all__ = ["RichSnapshotProgress", "capture_command", "register"]


def register(cli: click.Group) -> None:
    """Attach the ``capture`` command."""
    cli.add_command(capture_command)
