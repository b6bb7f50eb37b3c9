"""``headwater feeds run``: keep derived feeds up to date with Spark (upstream feeds first)."""

from __future__ import annotations

import functools

import click

from core.config import ProjectConfig
from headwater.cli_context import Context, StageOptions, config_option, once_or_follow, pass_context, stage_options


@click.group("feeds")
def feeds_group() -> None:
    """Derived feeds: SQL over the current row images of a topic or feed."""


@feeds_group.command("run")
@click.argument("feeds", nargs=-1)
@config_option
@once_or_follow(
    "available-now",
    once_help="Process everything in the log now (DAG order), then exit 0.",
    follow_help="Keep every feed up to date as the log grows, until Ctrl-C; wait as a standby while another "
    "process runs a feed.",
)
@stage_options
@pass_context
def run_command(context: Context, feeds: tuple[str, ...], follow: bool, options: StageOptions) -> None:
    """Run FEEDS (all by default) in DAG order."""
    from derived_feeds.feed_job import run_feeds, start_feed
    from headwater.stage_runtime import StageRuntime
    from operations.holders import holding
    from operations.pipeline import feed_records_written, wait_for_captured_inputs
    from operations.pipeline_metrics import Scope
    from spark_log.job import follow as follow_queries
    from spark_log.job import spark_job

    output = options.output("feeds")
    config = context.config(needs_sources=False)
    if follow:
        wait_for_captured_inputs(config, feeds, output.note)
    _check_before_spark(config, feeds)
    selected = feeds or tuple(config.feeds)
    runtime = StageRuntime(config, options, output, "headwater feeds run")
    runtime.feeds = selected
    runtime.serve(Scope(feeds=selected))
    with (
        holding(config, "feed", selected, options.holder_wait(output, follow=follow)),
        spark_job(config, "headwater-feeds") as (spark, log),
        runtime.recording(follow=follow),
    ):
        started = run_feeds(spark, config, log, feeds, available_now=not follow)
        for query, plan in started:
            runtime.feed_stats[plan.spec.name] = functools.partial(dict, plan.stats)
            runtime.follow_query("feeds", plan.spec.name, query, feed_records_written(plan.stats))
        if follow:
            running = ", ".join(f"{plan.spec.name} ({plan.plan_class})" for _, plan in started)
            output.note(f"running {running}; Ctrl-C to stop")
            specs = [plan.spec for _, plan in started]
            follow_queries(
                spark,
                [query for query, _ in started],
                restart=lambda at: start_feed(spark, config, log, specs[at], available_now=False)[0],
            )
            for _, plan in started:
                if plan.error is not None:
                    raise plan.error
        for _, plan in started:
            stats = plan.stats
            output.info(
                f"{plan.spec.name} -> {plan.spec.topic} ({plan.plan_class}): {stats['batches']} batch(es), "
                f"{stats['upserts']} upserts, {stats['deletes']} deletes, {stats['dropped']} quarantined",
                feed=plan.spec.name,
                topic=plan.spec.topic,
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
