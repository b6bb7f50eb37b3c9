"""``headwater sinks``: deliver the log to webhooks, Redis, NATS, RabbitMQ and PostgreSQL tables."""

from __future__ import annotations

import datetime as dt

import click

from headwater.cli_context import (
    Context,
    StageOptions,
    config_option,
    once_or_follow,
    pass_context,
    print_json,
    stage_options,
    stop_on_signals,
)


@click.group("sinks")
def sinks_group() -> None:
    """Sinks: each one a consumer group delivering its topics to a target."""


@sinks_group.command("run")
@click.argument("names", nargs=-1)
@config_option
@once_or_follow(
    "until-caught-up",
    once_help="Deliver everything in the log now, then exit 0.",
    follow_help="Keep delivering as the log grows, until Ctrl-C / SIGTERM (the batch in hand is finished).",
)
@stage_options
@pass_context
def run_command(context: Context, names: tuple[str, ...], follow: bool, options: StageOptions) -> None:
    """Run the sinks NAMES (all by default); a target that is down is retried, poison records dead-lettered."""
    from headwater.stage_runtime import StageRuntime
    from operations.pipeline_metrics import Scope
    from sinks.runner import run_sinks
    from spark_log.versions import resolve_topic

    output = options.output("sinks")
    config = context.config(needs_sources=False)
    selected = names or tuple(config.sinks)
    if not selected:
        output.note("no sinks in headwater.yaml; add a sinks: section")
        return
    runtime = StageRuntime(config, options, output, "headwater sinks run")
    runtime.serve(Scope(sinks=selected))
    stop = stop_on_signals()
    results = run_sinks(
        config,
        names,
        follow=follow,
        resolve_name=lambda name: resolve_topic(config, name),
        say=output.note,
        stop=stop,
    )
    for stats in results:
        output.info(
            f"sink {stats.sink}: {stats.delivered} delivered, {stats.skipped} skipped, "
            f"{stats.dead_lettered} dead-lettered, {stats.retries} retries",
            sink=stats.sink,
        )


@sinks_group.command("replay")
@click.argument("name")
@click.option("--from", "start", required=True, help="An offset (0: all the log holds) or a time (ISO 8601).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@config_option
@pass_context
def replay_command(context: Context, name: str, start: str, as_json: bool) -> None:
    """Deliver sink NAME again from an offset or a time (the sink must be stopped)."""
    from sinks.replay import replay
    from spark_log.versions import resolve_topic

    config = context.config(needs_sources=False)
    offset, time_ms = _start(start)
    offsets = replay(
        config, name, from_offset=offset, from_time_ms=time_ms, resolve_name=lambda feed: resolve_topic(config, feed)
    )
    if as_json:
        print_json([{"topic": tp.topic, "partition": tp.partition, "offset": o} for tp, o in sorted(offsets.items())])
        return
    for tp, next_offset in sorted(offsets.items()):
        click.echo(f"{tp.topic}/{tp.partition}: from offset {next_offset}")
    click.echo(f"sink {name} delivers from there at its next run")


def _start(text: str) -> tuple[int | None, int | None]:
    """``--from``: an offset, or a time (ISO 8601, a time zone required)."""
    if text.isdigit():
        return int(text), None
    try:
        moment = dt.datetime.fromisoformat(text)
    except ValueError:
        msg = f"--from {text!r} is neither an offset nor an ISO 8601 time (e.g. 2026-01-31T12:00:00+00:00)"
        raise click.UsageError(msg) from None
    if moment.tzinfo is None:
        msg = f"--from {text!r} has no time zone; add one (e.g. +00:00 or Z)"
        raise click.UsageError(msg)
    return None, int(moment.timestamp() * 1000)


def register(cli: click.Group) -> None:
    """Attach the ``sinks`` commands."""
    cli.add_command(sinks_group)
