"""``headwater quality``: run the ``quality:`` suites and write the self-contained HTML report."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from headwater.cli_context import Context, config_option, pass_context
from log.factory import open_log
from warehouse_loader.quality import BlockingExpectationFailedError, QualityRun, data_docs_path
from warehouse_loader.quality_report import run_and_report


def _summary(run: QualityRun) -> Table:
    table = Table("table", "rows", "passed", "pass rate", "failed expectations", title="data quality")
    for outcome in run.tables:
        failed = [
            f"{e.name}{' (blocking)' if e.blocking else ''}"
            + (f": {e.unexpected_count:,} unexpected" if e.unexpected_count else "")
            for e in outcome.expectations
            if not e.success
        ]
        rate = outcome.pass_rate
        table.add_row(
            outcome.table,
            "-" if outcome.rows is None else f"{outcome.rows:,}",
            f"{outcome.passed}/{len(outcome.expectations)}",
            "-" if rate is None else f"{rate * 100:.1f}%",
            outcome.error or "\n".join(failed) or "-",
        )
    return table


@click.command("quality")
@click.argument("tables", nargs=-1)
@config_option
@click.option(
    "--report",
    "report_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Where to write the HTML report (default: <home>/quality/report.html).",
)
@pass_context
def quality_command(context: Context, tables: tuple[str, ...], report_path: Path | None) -> None:
    """Run the quality suites of TABLES (all by default); exit non-zero if a blocking one fails."""
    config = context.config(needs_sources=False)
    log = open_log(config)
    try:
        with Console(stderr=True).status("running expectations (Great Expectations)"):
            run, written = run_and_report(config, log, tables, report_path)
    finally:
        log.close()
    Console().print(_summary(run))
    click.echo(f"report: {written}")
    click.echo(f"GX Data Docs: {data_docs_path(config) / 'index.html'} (load CSS/JS from CDNs; unstyled offline)")
    if run.failed_blocking:
        raise BlockingExpectationFailedError(run.failed_blocking)


def register(cli: click.Group) -> None:
    """Attach the ``quality`` command."""
    cli.add_command(quality_command)
