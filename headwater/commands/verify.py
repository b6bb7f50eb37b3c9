"""``headwater verify TABLE``: compare an SCD1 table with its source table at a consistent point."""

from __future__ import annotations

import click

from headwater.cli_context import Context, config_option, pass_context


@click.command("verify")
@click.argument("table")
@config_option
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=1),
    default=60.0,
    show_default=True,
    help="Seconds to wait for capture and the load to pass the snapshot.",
)
@click.option("--load", is_flag=True, help="Run the table's load here if it lags (only when no loader runs).")
@pass_context
def verify_command(context: Context, table: str, timeout_s: float, load: bool) -> None:
    """Compare SCD1 TABLE with its source table; exit 0 when equal, 1 when keys differ."""
    from operations.verify import TableDiffersError, verify_table

    result = verify_table(
        context.config(), table, timeout_s=timeout_s, load=load, say=lambda line: click.echo(line, err=True)
    )
    for line in result.lines():
        click.echo(line)
    if not result.equal:
        msg = f"{table} differs from its source: {result.lines()[-1]}"
        raise TableDiffersError(msg)


def register(cli: click.Group) -> None:
    """Attach the ``verify`` command."""
    cli.add_command(verify_command)
