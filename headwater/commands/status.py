"""``headwater status``: slots (MySQL: binlog positions), WAL retained, log ends, lag and table freshness."""

from __future__ import annotations

from typing import Any

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
    sources = Table("source", "slot", "active", "confirmed flush", "WAL retained", "behind", "note", title="sources")
    for row in status["sources"]:
        retained = row.get("wal_retained_bytes")
        behind = row.get("lag_bytes")
        sources.add_row(
            row["source"],
            # A PostgreSQL source's slot; a MySQL source's saved binlog position.
            row.get("slot") or row.get("position") or "-",
            str(row.get("active", "-")),
            row.get("confirmed_flush_lsn") or "-",
            f"{retained:,} B" if isinstance(retained, int) else "-",
            f"{behind:,} B" if isinstance(behind, int) else "-",
            "see below" if "error" in row or "binlog_end" in row else "",
        )
    console.print(sources)
    for row in status["sources"]:
        if "error" in row:  # in full, not cut to the table's width
            click.echo(f"source {row['source']}: {row['error']}")
        if "binlog_end" in row:
            click.echo(f"source {row['source']}: {binlog_line(row)}")
        if "problem" in row:
            click.echo(f"source {row['source']}: stopped: {row['problem']}")
        if row.get("rereading"):
            click.echo(f"source {row['source']}: reading again after a schema change: {', '.join(row['rereading'])}")
    topics = Table("topic", "records", "end offsets", "size", "dirty", title="topics")
    for row in status["topics"]:
        size = f"{row['bytes']:,} B" if "bytes" in row else "-"
        dirty = f"{row['dirty_ratio']:.0%}" if "dirty_ratio" in row else "-"
        ends = " ".join(f"{p}:{o}" for p, o in row.get("end_offsets", {}).items()) or "see below"
        records = f"{row['records']:,}" if "records" in row else "-"
        topics.add_row(row["topic"], records, ends, size, dirty)
    console.print(topics)
    for row in status["topics"]:
        if "error" in row:
            click.echo(f"topic {row['topic']}: {row['error']}")
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
    for row in status["feeds"]:
        if "problem" in row:
            console.print(f"[yellow]warning:[/] {row['problem']}")
    tables = Table("table", "from", "mode", "state", "last commit", "freshness", "lag", title="warehouse")
    upkeep = Table("table", "files", "size", "dirty", "last compaction", "last vacuum", title="warehouse files")
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
        if "files" in row:
            upkeep.add_row(
                row["table"],
                str(row["files"]),
                f"{row['bytes']:,} B",
                f"{row['dirty_ratio']:.0%}",
                row.get("last_compaction", "never"),
                row.get("last_vacuum", "never"),
            )
    console.print(tables)
    if upkeep.row_count:
        console.print(upkeep)
    sinks = Table("sink", "kind", "state", "lag", "dead-lettered", "topics", title="sinks")
    for row in status["sinks"]:
        sinks.add_row(
            row["sink"], row["kind"], row["state"], str(row["lag"]), str(row["dead_lettered"]), ", ".join(row["topics"])
        )
    if status["sinks"]:
        console.print(sinks)
    for row in status["sinks"]:
        if "error" in row:
            click.echo(f"sink {row['sink']} {row['state']}: {row['error']}")
    for row in status["tables"]:
        if "problem" in row:
            console.print(f"[yellow]warning:[/] {row['problem']}")
    for row in status["errors"]:  # in full, not cut to a table's width
        click.echo(f"{row['stage']}: last stopped at {row['at']} (exit {row['exit_code']}): {row['error']}")


def binlog_line(row: dict[str, Any]) -> str:
    """A MySQL source's binlog: the server's end, how far behind, what the server keeps before the position."""
    parts = [f"binlog end {row['binlog_end']}"]
    if row.get("binlog_status") == "purged":
        parts.append(
            f"saved position {row['position']} is purged (oldest binlog kept {row.get('oldest_binlog') or '-'}): "
            f"run 'headwater source resync {row['source']}'"
        )
    elif "lag_bytes" in row:
        seconds = row.get("lag_seconds")
        parts.append(f"{row['lag_bytes']:,} B behind" + (f" (at most {seconds:.0f} s)" if seconds else ""))
        parts.append(
            f"oldest binlog kept {row.get('oldest_binlog') or '-'}, {row['binlog_headroom_files']} file(s) "
            f"({row['binlog_headroom_bytes']:,} B) before the position's"
        )
    expire = row.get("binlog_expire_s")
    parts.append("binlogs kept forever" if expire is None else f"binlogs kept {_duration(expire)}")
    if row.get("last_commit"):
        parts.append(f"last commit captured {row['last_commit']}")
    return "; ".join(parts)


def _duration(seconds: int) -> str:
    days, rest = divmod(seconds, 86400)
    return f"{days} d {rest // 3600} h" if days else f"{rest // 3600} h {rest % 3600 // 60} min"


def register(cli: click.Group) -> None:
    """Attach the ``status`` command."""
    cli.add_command(status_command)
