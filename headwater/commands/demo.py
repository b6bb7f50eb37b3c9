"""``headwater demo``: embedded Postgres + sample shop workload + the pipeline stages that exist."""

from __future__ import annotations

from pathlib import Path

import click

from core.config import load_config
from operations.demo import DEMO_QUERIES, PASSWORD_VAR, DemoSettings, run_demo


def _capture_stage(config_path: Path) -> str:
    from capture.runner import run_capture

    config = load_config(config_path)
    stats = run_capture(config, ("shop",), until_caught_up=True)["shop"]
    return (
        f"captured until caught up: {stats.events} events in {stats.transactions} transactions "
        f"({stats.records_written} log records incl. tombstones)"
    )


def _pipeline_stage(config_path: Path) -> list[str]:
    from log.factory import open_log
    from operations.pipeline import run_until_caught_up
    from warehouse_loader.quality_report import run_and_report
    from warehouse_loader.query import format_result, run_query

    config = load_config(config_path)
    lines = run_until_caught_up(config, say=lambda _line: None).lines
    from warehouse_loader.load_job import table_path

    tables = {name: table_path(config, name) for name in config.warehouse.tables}
    for title, sql in DEMO_QUERIES:
        lines.append(f"{title}:\n{format_result(run_query(sql, tables), 'table')}")
    log = open_log(config)
    try:
        run, report = run_and_report(config, log)
    finally:
        log.close()
    rate = "n/a" if run.pass_rate is None else f"{run.pass_rate:.0%}"
    failed = ", ".join(run.failed_blocking) or "none"
    lines.append(f"quality: pass rate {rate}, failed blocking expectations: {failed}; report {report}")
    return lines


@click.command("demo")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path), default="headwater-demo")
@click.option("--small", is_flag=True, help="A smaller workload (what CI runs).")
def demo_command(directory: Path, small: bool) -> None:
    """Run the sample shop through the pipeline in DIRECTORY (wiped first)."""
    settings = DemoSettings(customers=300, orders=600, big_transaction_rows=3_000) if small else DemoSettings()
    result = run_demo(
        directory,
        settings,
        say=lambda line: click.echo(f"- {line}"),
        capture=_capture_stage,
        pipeline=_pipeline_stage,
    )
    config = result.config_path
    click.echo("")
    click.echo("done. Postgres was stopped; the log and config remain in " + str(result.directory))
    click.echo("try next:")
    click.echo(f"  headwater --config {config} query 'SELECT * FROM customers LIMIT 5'")
    click.echo(f"  headwater --config {config} status")
    click.echo(f"  headwater --config {config} ui      # Dagster UI on http://127.0.0.1:3000")
    click.echo(f"  open {result.directory / '.headwater' / 'quality' / 'report.html'}")
    click.echo(f"  headwater --config {config} log topics")
    click.echo(f"  headwater --config {config} log tail shop.public.orders --limit 5 --json")
    click.echo(f"  (commands that reach the database need {PASSWORD_VAR} and the demo Postgres running)")


def register(cli: click.Group) -> None:
    """Attach the ``demo`` command."""
    cli.add_command(demo_command)
