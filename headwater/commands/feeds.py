"""``headwater feeds run``: keep derived feeds up to date with Spark (upstream feeds first)."""

from __future__ import annotations

import click

from core.config import ProjectConfig
from headwater.cli_context import Context, config_option, once_or_follow, pass_context


@click.group("feeds")
def feeds_group() -> None:
    """Derived feeds: SQL over the current row images of a topic or feed."""


@feeds_group.command("run")
@click.argument("feeds", nargs=-1)
@config_option
@once_or_follow(
    "available-now",
    once_help="Process everything in the log now (DAG order), then exit 0.",
    follow_help="Keep every feed up to date as the log grows, until Ctrl-C.",
)
@pass_context
def run_command(context: Context, feeds: tuple[str, ...], follow: bool) -> None:
    """Run FEEDS (all by default) in DAG order."""
    from derived_feeds.feed_job import run_feeds
    from spark_log.job import follow as follow_queries
    from spark_log.job import spark_job

    config = context.config(needs_sources=False)
    _check_before_spark(config, feeds)
    with spark_job(config, "headwater-feeds") as (spark, log):
        started = run_feeds(spark, config, log, feeds, available_now=not follow)
        if follow:
            running = ", ".join(f"{plan.spec.name} ({plan.plan_class})" for _, plan in started)
            click.echo(f"running {running}; Ctrl-C to stop")
            follow_queries(spark, [query for query, _ in started])
            for _, plan in started:
                if plan.error is not None:
                    raise plan.error
        for _, plan in started:
            stats = plan.stats
            click.echo(
                f"{plan.spec.name} -> {plan.spec.topic} ({plan.plan_class}): {stats['batches']} batch(es), "
                f"{stats['upserts']} upserts, "
                f"{stats['deletes']} deletes, {stats['dropped']} quarantined"
            )


def _check_before_spark(config: ProjectConfig, feeds: tuple[str, ...]) -> None:
    """Fail in a second, not after Spark's start, on what needs no session (names, inputs, expectations)."""
    from derived_feeds.feed_spec import check_before_spark
    from log.factory import open_log

    log = open_log(config)
    try:
        topics = log.list_topics()
    finally:
        log.close()
    check_before_spark(config, topics, feeds)


def register(cli: click.Group) -> None:
    """Attach the feeds commands and ``reprocess``."""
    from headwater.commands.reprocess import reprocess_command

    cli.add_command(feeds_group)
    cli.add_command(reprocess_command)
