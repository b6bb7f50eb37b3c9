"""``headwater source ...``: register, inspect and remove source databases.

Each command parses its options, loads the config and calls :mod:`capture.registration`.
"""

from __future__ import annotations

import sys
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from capture.errors import ConfirmationRequiredError
from capture.identifiers import split_list
from capture.registration import add_source, removal_text, remove_source, show_source
from capture.resync import resync_source
from core.config import find_config_path
from headwater.cli_context import Context, config_option, pass_context, print_json


@click.group("source")
def source_group() -> None:
    """Register and inspect source databases."""


@source_group.command("list")
@config_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@pass_context
def source_list(context: Context, as_json: bool) -> None:
    """List the registered sources (DSN passwords masked)."""
    config = context.config()
    rows: list[dict[str, Any]] = [
        {
            "name": name,
            "dsn": source.dsn_redacted,
            "tables": list(source.tables) if source.tables is not None else None,
            "schemas": list(source.schemas) if source.schemas is not None else None,
            "snapshot": source.snapshot,
        }
        for name, source in config.sources.items()
    ]
    if as_json:
        print_json(rows)
        return
    if not rows:
        click.echo("no sources registered; add one with: headwater source add NAME --dsn DSN --tables T,...")
        return
    table = Table("name", "dsn", "captures", "snapshot")
    for row in rows:
        captures = ", ".join(row["tables"] or [f"schema {s}" for s in row["schemas"] or []])
        table.add_row(row["name"], row["dsn"], captures, row["snapshot"])
    Console().print(table)


def _confirmer(yes: bool, action: str) -> Any:
    """A ``confirm(question) -> bool`` for the library: always yes, ask on a terminal, else refuse."""

    def confirm(question: str) -> bool:
        if yes:
            return True
        if sys.stdin is None or not sys.stdin.isatty():
            msg = f"not {action} without confirmation and stdin is not a terminal to ask on; pass --yes"
            raise ConfirmationRequiredError(msg)
        return click.confirm(question[0].upper() + question[1:], default=False)

    return confirm


def _warn(message: str) -> None:
    click.echo(f"warning: {message}", err=True)


@source_group.command("add")
@config_option
@click.argument("name")
@click.option("--dsn", required=True, help="postgresql://user:${PW_VAR}@host:port/db (stored as given).")
@click.option("--tables", default=None, help="Comma-separated schema.table names (quote odd names: '\"My T\"').")
@click.option("--schemas", default=None, help="Comma-separated schemas: capture every table in them (PG 15+).")
@click.option(
    "--snapshot",
    type=click.Choice(["initial", "never", "when_needed", "initial_only"]),
    default="initial",
    show_default=True,
    help="Initial snapshot mode.",
)
@click.option("--slot", default=None, help="Replication slot name (default: headwater_<name>).")
@click.option("--publication", default=None, help="Publication name (default: headwater_<name>); may be pre-created.")
@click.option("--yes", is_flag=True, help="Create the publication and slot without asking.")
@pass_context
def source_add(
    context: Context,
    *,
    name: str,
    dsn: str,
    tables: str | None,
    schemas: str | None,
    snapshot: Any,
    slot: str | None,
    publication: str | None,
    yes: bool,
) -> None:
    """Check prerequisites, create publication and slot, and add source NAME to the config."""
    result = add_source(
        find_config_path(context.config_path),
        name,
        dsn,
        tables=split_list(tables, what="--tables") if tables is not None else None,
        schemas=split_list(schemas, what="--schemas") if schemas is not None else None,
        snapshot=snapshot,
        slot=slot,
        publication=publication,
        confirm=_confirmer(yes, "creating a replication slot"),
    )
    for warning in result.warnings:
        _warn(warning)
    for note in result.notes:
        click.echo(f"note: {note}", err=True)
    click.echo(
        f"registered source {result.name}: publication {result.publication} ({result.publication_action}), "
        f"slot {result.slot} at {result.consistent_lsn}; config {result.config_path}"
    )
    click.echo(f"next: headwater capture {result.name} --until-caught-up")


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


@source_group.command("show")
@config_option
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@pass_context
def source_show(context: Context, name: str, as_json: bool) -> None:
    """Show source NAME's settings and its live slot (DSN password masked)."""
    view = show_source(context.config(), name)
    if as_json:
        print_json(view.as_dict())
        return
    table = Table(show_header=False, box=None)
    table.add_row("source", view.name)
    table.add_row("dsn", view.dsn)
    if view.tables is not None:
        table.add_row("tables", ", ".join(view.tables))
    else:
        table.add_row("schemas", ", ".join(view.schemas or ()))
    table.add_row("snapshot", view.snapshot)
    table.add_row("publication", view.publication + ("" if view.publication_info or view.error else " (missing)"))
    status = view.slot_status
    if view.error:
        table.add_row("slot", f"{view.slot} (status unknown: {view.error})")
    elif status is None:
        table.add_row("slot", f"{view.slot} (missing: run headwater source resync {view.name})")
    else:
        table.add_row(
            "slot", f"{view.slot} ({'active, pid ' + str(status.active_pid) if status.active else 'inactive'})"
        )
        table.add_row("confirmed flush lsn", str(status.confirmed_flush_lsn or "-"))
        table.add_row("restart lsn", str(status.restart_lsn or "-"))
        table.add_row("wal retained", _size(status.wal_retained_bytes))
        lost = f" (invalidated: run headwater source resync {view.name})" if status.wal_status == "lost" else ""
        table.add_row("wal status", (status.wal_status or "-") + lost)
    Console(markup=False, highlight=False).print(table)


@source_group.command("remove")
@config_option
@click.argument("name")
@click.option("--yes", is_flag=True, help="Drop the slot and publication without asking.")
@pass_context
def source_remove(context: Context, name: str, yes: bool) -> None:
    """Drop source NAME's slot and publication and remove it from the config."""
    question = removal_text(context.config(), name)
    if not _confirmer(yes, "dropping the replication slot")(question):
        click.echo("cancelled; nothing changed", err=True)
        raise SystemExit(1)
    result = remove_source(find_config_path(context.config_path), name)
    for note in result.notes:
        click.echo(f"note: {note}", err=True)
    dropped = [
        f"slot {result.slot}" if result.slot_dropped else None,
        f"publication {result.publication}" if result.publication_dropped else None,
    ]
    what = " and ".join(d for d in dropped if d) or "nothing in the database"
    click.echo(f"removed source {result.name}; dropped {what}")


@source_group.command("resync")
@config_option
@click.argument("name")
@click.option("--yes", is_flag=True, help="Replace the slot and schedule the re-snapshot without asking.")
@pass_context
def source_resync(context: Context, name: str, yes: bool) -> None:
    """Recover source NAME after its slot was dropped or invalidated: fresh slot, then a re-snapshot.

    The next 'headwater capture' re-reads every table and writes deletes for rows
    removed meanwhile, so the log converges to the source.
    """
    result = resync_source(context.config(), name, confirm=_confirmer(yes, "replacing the replication slot"))
    lost = f", changes after {result.lost_from} were not streamed" if result.lost_from is not None else ""
    click.echo(
        f"source {result.name}: slot {result.slot} was {result.previous}{lost}; created it again at "
        f"{result.new_slot_lsn}. The next capture re-snapshots {result.targets} of publication "
        f"{result.publication} and writes deletes for rows removed meanwhile"
    )
    click.echo(f"next: headwater capture {result.name} --until-caught-up")


def register(cli: click.Group) -> None:
    """Attach the ``source`` commands to the root group."""
    cli.add_command(source_group)
