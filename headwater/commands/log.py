"""``headwater log ...``: inspect topics, tail records, trigger compaction."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import click
import orjson
from rich.console import Console
from rich.table import Table

from headwater.cli_context import Context, config_option, pass_context, print_json
from log.base import Log, StoredRecord, end_offsets
from log.factory import open_log


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
                    "cleanup_policy": "compact" if spec.compacted else "delete",
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


@log_group.command("tail")
@click.argument("topic")
@config_option
@click.option("--from-beginning", is_flag=True, help="Start at the first record instead of the last few.")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Print at most N records.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per record per line.")
@pass_context
def tail_command(context: Context, topic: str, from_beginning: bool, limit: int | None, as_json: bool) -> None:
    """Print records of TOPIC."""
    log = open_log(context.config(needs_sources=False))
    out = sys.stdout.buffer
    try:
        for record in tail_records(log, topic, from_beginning=from_beginning, limit=limit):
            data = record_json(record)
            if as_json:
                out.write(orjson.dumps(data) + b"\n")
            else:
                key = orjson.dumps(data["key"]).decode()
                value = orjson.dumps(data["value"]).decode()
                out.write(f"{record.partition}:{record.offset} key={key} value={value}\n".encode())
    finally:
        out.flush()
        log.close()


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


def register(cli: click.Group) -> None:
    """Attach the ``log`` commands to the root group."""
    cli.add_command(log_group)
