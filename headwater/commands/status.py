"""``headwater status``: slots, WAL retained, log ends, lag and table freshness."""

from __future__ import annotations

import click
from rich.console import Console
from rich.table import Table

from headwater.cli_context import Context, config_option, pass_context, print_json
from log.factory import open_log
from operations.status import pipeline_status


@click.command("status")
@config_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@pass_context
def status_command(context: Context, as_json: bool) -> None:
    """Show the health of every source, topic and warehouse table (a source it cannot reach is reported)."""
    config = context.config(needs_sources=False)
    log = open_log(config)
    try:
        status = pipeline_status(config, log)
    finally:
        log.close()
    if as_json:
        print_json(status)
        return
    console = Console()
    deployment = status["deployment"]
    console.print(f"spark: {deployment['spark']['master']}   warehouse: {deployment['warehouse']['path']}")
    sources = Table("source", "slot", "active", "confirmed flush", "WAL retained", "note", title="sources")
    for row in status["sources"]:
        retained = row.get("wal_retained_bytes")
        sources.add_row(
            row["source"],
            row["slot"],
            str(row.get("active", "-")),
            row.get("confirmed_flush_lsn") or "-",
            f"{retained:,} B" if isinstance(retained, int) else "-",
            "see below" if "error" in row else "",
        )
    console.print(sources)
    for row in status["sources"]:
        if "error" in row:  # in full, not cut to the table's width
            click.echo(f"source {row['source']}: {row['error']}")
    topics = Table("topic", "records", "end offsets", "size", "dirty", title="topics")
    for row in status["topics"]:
        size = f"{row['bytes']:,} B" if "bytes" in row else "-"
        dirty = f"{row['dirty_ratio']:.0%}" if "dirty_ratio" in row else "-"
        ends = " ".join(f"{p}:{o}" for p, o in row["end_offsets"].items())
        topics.add_row(row["topic"], f"{row['records']:,}", ends, size, dirty)
    console.print(topics)
    feeds = Table("feed", "topic", "version", "plan class", "lag", "quarantined", title="feeds")
    for row in status["feeds"]:
        feeds.add_row(
            row["feed"],
            row["topic"],
            str(row["version"]),
            row.get("plan_class") or "-",
            str(row.get("lag", "-")),
            str(row.get("quarantined", 0)),
        )
    if status["feeds"]:
        console.print(feeds)
    tables = Table("table", "from", "mode", "state", "last commit", "freshness", "lag", title="warehouse")
    for row in status["tables"]:
        freshness = row.get("freshness_s")
        tables.add_row(
            row["table"],
            row["from"],
            row["mode"],
            row["state"],
            row.get("last_commit", "-"),
            f"{freshness:.1f} s" if freshness is not None else "-",
            str(row.get("lag", "-")),
        )
    console.print(tables)
    for row in status["tables"]:
        if "problem" in row:
            console.print(f"[yellow]warning:[/] {row['problem']}")


def register(cli: click.Group) -> None:
    """Attach the ``status`` command."""
    cli.add_command(status_command)
