"""``headwater source ...``: register, inspect and remove source databases.

Each command parses its options, loads the config and calls the source's kind
(:class:`capture.source_kind.SourceKind`, found by :mod:`capture.kinds`).
"""

from __future__ import annotations

import sys
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from capture.errors import ConfirmationRequiredError
from capture.kinds import DEFAULT_KIND, kind_of, source_kind
from capture.source_kind import Outcome, SourceRequest
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


def _report(outcome: Outcome) -> None:
    """Warnings and notes on stderr, then what was done and what to run next."""
    for warning in outcome.warnings:
        _warn(warning)
    for note in outcome.notes:
        click.echo(f"note: {note}", err=True)
    click.echo(outcome.summary)
    if outcome.next_step is not None:
        click.echo(f"next: {outcome.next_step}")


@source_group.command("add")
@config_option
@click.argument("name")
@click.option(
    "--kind",
    default=DEFAULT_KIND,
    show_default=True,
    help="The source's kind: postgres, or one a plug-in adds (see docs/architecture.md, plug-in points).",
)
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
    kind: str,
    dsn: str,
    tables: str | None,
    schemas: str | None,
    snapshot: Any,
    slot: str | None,
    publication: str | None,
    yes: bool,
) -> None:
    """Check prerequisites, create publication and slot, and add source NAME to the config."""
    source = source_kind(kind, where="--kind")
    request = SourceRequest(
        name,
        dsn,
        tables=source.split_tables(tables, what="--tables") if tables is not None else None,
        schemas=source.split_tables(schemas, what="--schemas") if schemas is not None else None,
        snapshot=snapshot,
        options={"slot": slot, "publication": publication},
    )
    _report(
        source.add(
            find_config_path(context.config_path), request, confirm=_confirmer(yes, "creating a replication slot")
        )
    )


@source_group.command("show")
@config_option
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@pass_context
def source_show(context: Context, name: str, as_json: bool) -> None:
    """Show source NAME's settings and its live slot (DSN password masked)."""
    config = context.config()
    view = kind_of(config, name).show(config, name)
    if as_json:
        print_json(dict(view.data))
        return
    table = Table(show_header=False, box=None)
    for label, value in view.rows:
        table.add_row(label, value)
    Console(markup=False, highlight=False).print(table)


@source_group.command("remove")
@config_option
@click.argument("name")
@click.option("--yes", is_flag=True, help="Drop the slot and publication without asking.")
@pass_context
def source_remove(context: Context, name: str, yes: bool) -> None:
    """Drop source NAME's slot and publication and remove it from the config."""
    config = context.config()
    kind = kind_of(config, name)
    if not _confirmer(yes, "dropping the replication slot")(kind.removal_question(config, name)):
        click.echo("cancelled; nothing changed", err=True)
        raise SystemExit(1)
    _report(kind.remove(find_config_path(context.config_path), name))


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
    config = context.config()
    _report(kind_of(config, name).resync(config, name, confirm=_confirmer(yes, "replacing the replication slot")))


def register(cli: click.Group) -> None:
    """Attach the ``source`` commands to the root group."""
    cli.add_command(source_group)
