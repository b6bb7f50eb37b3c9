"""``headwater log ...``: inspect topics, tail and follow records, consumer groups, cleaning, split/merge."""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO

import click
import orjson
from rich.console import Console
from rich.table import Table

from core.config import ProjectConfig
from headwater.cli_context import (
    Context,
    Output,
    StageOptions,
    cleaner_options,
    config_option,
    pass_context,
    print_json,
    stop_on_signals,
)
from headwater.commands.log_shards import attach as attach_shard_commands
from log.base import Log, StoredRecord, TopicPartition, end_offsets
from log.cleaner import CleanedTopic, Cleaner
from log.consumer import Consumer, ConsumerSettings, DescribesGroups, GroupDescription
from log.errors import FencedMemberError
from log.factory import consumer_of, open_log
from log.topic_policy import cleanup_policy
from operations.pipeline import history_holds


def _decode_json(data: bytes | None) -> Any:
    # Keys and values are JSON in Headwater topics; anything else is shown as text.
    if data is None:
        return None
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return data.decode("utf-8", errors="replace")


def record_json(record: StoredRecord) -> dict[str, Any]:
    """The ``log tail --json`` object: ``{"topic","partition","offset","timestamp_ms","key","value","headers"}``."""
    return {
        "topic": record.topic,
        "partition": record.partition,
        "offset": record.offset,
        "timestamp_ms": record.timestamp_ms,
        "key": _decode_json(record.key),
        "value": _decode_json(record.value),
        "headers": {name: value.decode("utf-8", errors="replace") for name, value in record.headers},
    }


def tail_records(log: Log, topic: str, *, from_beginning: bool, limit: int | None) -> Iterator[StoredRecord]:
    """Records of every partition, partition by partition in offset order.

    Without ``from_beginning`` each partition starts ``limit`` (default 10) records
    before its end; ``limit`` also caps the total printed.
    """
    spec = log.describe_topic(topic)
    per_partition = limit if limit is not None else 10
    emitted = 0
    for partition in range(spec.partitions):
        end = log.end_offset(topic, partition)
        start = log.beginning_offset(topic, partition)
        offset = start if from_beginning else max(start, end - per_partition)
        while offset < end:
            batch = log.read(topic, partition, offset, max_records=min(10_000, end - offset))
            if not batch:
                break
            for record in batch:
                if limit is not None and emitted >= limit:
                    return
                yield record
                emitted += 1
            offset = batch[-1].offset + 1


@click.group("log")
def log_group() -> None:
    """Inspect and maintain the log."""


@log_group.command("topics")
@config_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@pass_context
def topics_command(context: Context, as_json: bool) -> None:
    """List topics with partitions, cleanup policy and end offsets."""
    log = open_log(context.config(needs_sources=False))
    try:
        rows: list[dict[str, Any]] = []
        for name in log.list_topics():
            spec = log.describe_topic(name)
            ends = end_offsets(log, name)
            rows.append(
                {
                    "topic": name,
                    "partitions": spec.partitions,
                    "cleanup_policy": cleanup_policy(spec),
                    "end_offsets": {str(p): o for p, o in ends.items()},
                    "records": sum(ends.values()),
                }
            )
    finally:
        log.close()
    if as_json:
        print_json(rows)
        return
    table = Table("topic", "partitions", "cleanup", "end offsets")
    for row in rows:
        ends_text = " ".join(f"{p}:{o}" for p, o in row["end_offsets"].items())
        table.add_row(row["topic"], str(row["partitions"]), row["cleanup_policy"], ends_text)
    Console().print(table)


def _write(out: BinaryIO, record: StoredRecord, *, as_json: bool) -> None:
    data = record_json(record)
    if as_json:
        out.write(orjson.dumps(data) + b"\n")
    else:
        key = orjson.dumps(data["key"]).decode()
        value = orjson.dumps(data["value"]).decode()
        out.write(f"{record.partition}:{record.offset} key={key} value={value}\n".encode())


def follow_records(
    consumer: Consumer, out: BinaryIO, stop: threading.Event, *, as_json: bool, limit: int | None
) -> None:
    """Print what ``consumer`` polls until ``stop`` (or ``limit`` records); a group member commits what it printed."""
    printed = 0
    while not stop.is_set() and (limit is None or printed < limit):
        records = consumer.poll(timeout_s=0.5)
        if limit is not None:
            records = records[: limit - printed]
        if not records:
            continue
        done: dict[TopicPartition, int] = {}
        for record in records:
            _write(out, record, as_json=as_json)
            done[TopicPartition(record.topic, record.partition)] = record.offset + 1
        out.flush()
        printed += len(records)
        if consumer.group is not None:
            try:
                consumer.commit(done)
            except FencedMemberError as exc:  # the partition moved on: its new owner prints from the last commit
                click.echo(f"warning: {exc}", err=True)


@log_group.command("tail")
@click.argument("topic")
@config_option
@click.option("--from-beginning", is_flag=True, help="Start at the first record instead of the last few.")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Print at most N records.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per record per line.")
@click.option("--follow", is_flag=True, help="Keep printing new records until Ctrl-C / SIGTERM.")
@click.option(
    "--group",
    default=None,
    help="With --follow: read as a member of this consumer group (members split the partitions; "
    "each commits what it printed; a new group starts at the end unless --from-beginning).",
)
@pass_context
def tail_command(
    context: Context,
    *,
    topic: str,
    from_beginning: bool,
    limit: int | None,
    as_json: bool,
    follow: bool,
    group: str | None,
) -> None:
    """Print records of TOPIC."""
    if group is not None and not follow:
        msg = "--group needs --follow"
        raise click.UsageError(msg)
    log = open_log(context.config(needs_sources=False))
    out = sys.stdout.buffer
    if not follow:
        try:
            for record in tail_records(log, topic, from_beginning=from_beginning, limit=limit):
                _write(out, record, as_json=as_json)
        finally:
            out.flush()
            log.close()
        return
    stop = stop_on_signals()
    settings = ConsumerSettings(auto_offset_reset="earliest" if from_beginning else "latest")
    with consumer_of(log, group, settings, owns_log=True) as consumer:
        if group is not None:
            consumer.subscribe([topic])
        else:
            partitions = [TopicPartition(topic, p) for p in range(log.describe_topic(topic).partitions)]
            consumer.assign(partitions)
            if not from_beginning:  # the last few records of each partition first, as without --follow
                for tp in partitions:
                    start = log.beginning_offset(topic, tp.partition)
                    consumer.seek(tp, max(start, log.end_offset(topic, tp.partition) - (limit or 10)))
        try:
            follow_records(consumer, out, stop, as_json=as_json, limit=limit)
        except BrokenPipeError:  # the reader went away (e.g. `| head`): stop quietly
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


@log_group.command("compact")
@click.argument("topic")
@config_option
@pass_context
def compact_command(context: Context, topic: str) -> None:
    """Run compaction (or retention) on TOPIC now."""
    log = open_log(context.config(needs_sources=False))
    try:
        result = log.compact(topic)
    finally:
        log.close()
    click.echo(
        f"{topic}: {result.records_before} -> {result.records_after} records, "
        f"{result.bytes_before} -> {result.bytes_after} bytes"
    )


def _group_row(description: GroupDescription) -> dict[str, Any]:
    return {
        "group": description.group,
        "state": description.state,
        "members": len(description.members),
        "partitions": len(description.partitions),
        "lag": sum(p.lag for p in description.partitions),
    }


@log_group.command("groups")
@click.argument("group", required=False)
@config_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@pass_context
def groups_command(context: Context, group: str | None, as_json: bool) -> None:
    """List consumer groups, or show GROUP's members, assignment, committed offsets and lag."""
    log = open_log(context.config(needs_sources=False))
    try:
        assert isinstance(log, DescribesGroups)
        if group is None:
            rows = [_group_row(log.describe_group(name)) for name in log.list_groups()]
        else:
            described = log.describe_group(group)
    finally:
        log.close()
    if group is None:
        if as_json:
            print_json(rows)
            return
        table = Table("group", "state", "members", "partitions", "lag")
        for row in rows:
            table.add_row(row["group"], row["state"], str(row["members"]), str(row["partitions"]), f"{row['lag']:,}")
        Console().print(table)
        return
    if as_json:
        print_json(dataclasses.asdict(described))
        return
    console = Console()
    generation = "" if described.generation is None else f", generation {described.generation}"
    console.print(f"group {described.group}: {described.state}{generation}")
    members = Table("member", "client", "partitions", "lease left", title="members")
    for m in described.members:
        parts = " ".join(f"{tp.topic}/{tp.partition}" for tp in m.assignment) or "-"
        lease = "-" if m.lease_left_ms is None else f"{m.lease_left_ms / 1000:.1f} s"
        members.add_row(m.member_id, m.client, parts, lease)
    console.print(members)
    partitions = Table("topic", "partition", "owner", "committed", "end", "lag", title="partitions")
    for p in described.partitions:
        committed = "-" if p.committed is None else str(p.committed)
        partitions.add_row(p.topic, str(p.partition), p.owner or "-", committed, str(p.end), f"{p.lag:,}")
    console.print(partitions)


@log_group.command("clean")
@click.argument("topics", nargs=-1)
@config_option
@click.option("--follow", is_flag=True, help="Keep cleaning every log.cleaner_interval_s until Ctrl-C / SIGTERM.")
@cleaner_options
@pass_context
def clean_command(context: Context, topics: tuple[str, ...], follow: bool, options: StageOptions) -> None:
    """Compact and delete by each topic's cleaning settings (log.topics), sparing what SCD2 loads still need."""
    output = options.output("cleaner")
    config = context.config(needs_sources=False)
    record = _cleaning_recorder(config, options, output)

    def report(done: CleanedTopic) -> None:
        output.info(done.describe(), topic=done.topic)
        if record is not None:
            record(done)

    log = open_log(config)
    try:
        for topic in topics:
            log.describe_topic(topic)  # an unknown topic: one line
        cleaner = Cleaner(log, holds=history_holds(config, log))
        if follow:
            stop = stop_on_signals()
            cleaner.run(stop, config.log.cleaner_interval_s, report=report)
            return
        cleaned = cleaner.run_once(topics or None)
    finally:
        log.close()
    for done in cleaned:
        report(done)
    if not cleaned:
        output.info("nothing to clean")


def _cleaning_recorder(
    config: ProjectConfig, options: StageOptions, output: Output
) -> Callable[[CleanedTopic], None] | None:
    """With ``--metrics-port`` (or as a stage of ``run --follow``), what records each cleaning in the metrics."""
    from core.metrics import multiprocess_dir

    if options.metrics_port is None and multiprocess_dir() is None:
        return None
    from headwater.stage_runtime import StageRuntime
    from operations.pipeline_metrics import Scope, record_cleaning

    StageRuntime(config, options, output, "headwater log clean").serve(Scope(every_topic=True))
    return record_cleaning


def register(cli: click.Group) -> None:
    """Attach the ``log`` commands to the root group."""
    attach_shard_commands(log_group)
    cli.add_command(log_group)
