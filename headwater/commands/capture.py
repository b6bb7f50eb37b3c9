"""``headwater capture``: stream registered sources into the log."""

from __future__ import annotations

import time

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeRemainingColumn

from capture.runner import ProgressFactory, run_capture
from capture.snapshot_plan import SnapshotProgress
from headwater.cli_context import Context, StageOptions, config_option, once_or_follow, pass_context, stage_options


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
@stage_options
@pass_context
def capture_command(context: Context, names: tuple[str, ...], follow: bool, options: StageOptions) -> None:
    """Stream registered sources (all by default) into the log."""
    from headwater.stage_runtime import StageRuntime
    from operations.pipeline_metrics import Scope

    output = options.output("capture")
    config = context.config()
    runtime = StageRuntime(config, options, output, "headwater capture")
    runtime.serve(Scope(sources=names or tuple(config.sources)))
    progress = _progress_for(Console(stderr=True)) if options.log_format == "text" else None
    with runtime.recording(follow=follow):
        results = run_capture(
            config,
            names,
            until_caught_up=not follow,
            progress=progress,
            holder_wait=options.holder_wait(output, follow=follow),
            observe=runtime.observe_capture,
        )
    for name, stats in results.items():
        output.info(
            f"{name}: {stats.transactions} transactions, {stats.events} events, "
            f"{stats.records_written} records written, {stats.records_skipped} already in the log, "
            f"acknowledged {stats.acked_lsn}",
            source=name,
            lsn=stats.acked_lsn,
        )


__all__ = ["RichSnapshotProgress", "capture_command", "register"]


def register(cli: click.Group) -> None:
    """Attach the ``capture`` command."""
    cli.add_command(capture_command)
