"""``headwater demo``: an embedded Postgres (or MariaDB, ``--kind mysql``) + sample shop workload + the pipeline."""

from __future__ import annotations

import shlex
import shutil
import sys
from pathlib import Path

import click

from core.config import load_config
from operations.demo import DEMO_QUERIES, PASSWORD_VAR, DemoKind, DemoSettings, run_demo


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
    from warehouse_loader.query import format_result, query_warehouse

    config = load_config(config_path)
    lines = run_until_caught_up(config, say=lambda _line: None).lines
    for title, sql in DEMO_QUERIES:
        lines.append(f"{title}:\n{format_result(query_warehouse(config, sql), 'table')}")
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
@click.option(
    "--kind",
    type=click.Choice(["postgres", "mysql"]),
    default="postgres",
    show_default=True,
    help="The source: an embedded PostgreSQL, or an embedded MariaDB captured from its binlog.",
)
def demo_command(directory: Path, small: bool, kind: DemoKind) -> None:
    """Run the sample shop through the pipeline in DIRECTORY (wiped first)."""
    settings = DemoSettings(customers=300, orders=600, big_transaction_rows=3_000) if small else DemoSettings()
    result = run_demo(
        directory,
        settings,
        kind=kind,
        say=lambda line: click.echo(f"- {line}"),
        capture=_capture_stage,
        pipeline=_pipeline_stage,
    )
    recorded = _record_in_dagster(result.config_path)
    click.echo(f"- {recorded}")
    config = shlex.quote(str(result.config_path))
    headwater = headwater_command()
    click.echo("")
    server = result.server_name
    click.echo(f"done. {server} was stopped; the log, the warehouse and the config remain in {result.directory}")
    click.echo(f"quality report: {result.directory / '.headwater' / 'quality' / 'report.html'} (open it in a browser)")
    click.echo("try next:")
    for command in next_steps(result.topic_prefix):
        click.echo(f"  {headwater} --config {config} {command}")
    click.echo(
        f"(status reports the source as unreachable: the demo's {server} is stopped and {PASSWORD_VAR} is not kept; "
        "everything else works without them)"
    )


def next_steps(topic_prefix: str) -> tuple[str, ...]:
    """What the demo suggests next, after ``headwater --config <file>`` (tested one by one, as printed)."""
    return (
        # ORDER BY: without it DuckDB returns any five rows (its scan is parallel), not the first customers
        "query 'SELECT id, email, country, balance FROM customers ORDER BY id LIMIT 5'",
        "status",
        "log topics",
        f"log tail {topic_prefix}.orders --limit 5 --json",
        "ui      # the Dagster UI on http://127.0.0.1:3000 (Ctrl-C to stop)",
    )


def headwater_command() -> str:
    """How to run this ``headwater`` from the current directory: its name when that is on PATH, else its path."""
    script = Path(sys.executable).parent / "headwater"
    if not script.exists():
        return f"{shlex.quote(sys.executable)} -m headwater"
    found = shutil.which("headwater")
    if found is not None and Path(found).resolve() == script.resolve():
        return "headwater"
    try:
        shown = script.relative_to(Path.cwd())
    except ValueError:
        return shlex.quote(str(script))
    return shlex.quote(str(shown) if len(shown.parts) > 1 else f"./{shown}")


def _record_in_dagster(config_path: Path) -> str:
    """Record what the demo made in the Dagster instance ``headwater ui`` serves."""
    from dagster_project.recording import AssetRecorder

    config = load_config(config_path, strict_env=False)
    recorded = AssetRecorder(config, "headwater demo").record(
        sources={name: {} for name in config.sources},
        feeds={name: {} for name in config.feeds},
        tables=tuple(config.warehouse.tables),
    )
    return f"recorded {recorded} asset materializations in the Dagster instance (headwater ui shows them)"


def register(cli: click.Group) -> None:
    """Attach the ``demo`` command."""
    cli.add_command(demo_command)
