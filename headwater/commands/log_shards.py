"""``headwater log split|merge|shards``: elastic shards of file-log topics (:mod:`log.shards`).

Imported by :mod:`headwater.commands.log`, which attaches these commands to its group.
"""

from __future__ import annotations

from typing import Any

import click
from rich.console import Console
from rich.table import Table

from headwater.cli_context import Context, config_option, pass_context, print_json
from log.base import Log
from log.factory import open_log
from log.shards import ElasticShards, ShardMap, elastic


def shard_rows(log: Log, topic: str, shards: ShardMap | None) -> list[dict[str, Any]]:
    """One row per partition: hash range, parents, children, state and end offset."""
    if shards is None:
        shards = ShardMap.initial(topic, log.describe_topic(topic).partitions)
    return [
        {
            "partition": s.number,
            "hash_from": s.lo,
            "hash_to": s.hi,
            "parents": list(s.parents),
            "children": list(s.children),
            "state": "open" if s.is_open else "sealed",
            "end_offset": log.end_offset(topic, s.number),
        }
        for s in shards.shards
    ]


def _print(rows: list[dict[str, Any]], topic: str, as_json: bool) -> None:
    if as_json:
        print_json(rows)
        return
    table = Table("partition", "hash range", "parents", "children", "state", "end offset", title=topic)
    for row in rows:
        family = [",".join(map(str, row[k])) or "-" for k in ("parents", "children")]
        table.add_row(
            str(row["partition"]),
            f"[{row['hash_from']}, {row['hash_to']})",
            *family,
            row["state"],
            str(row["end_offset"]),
        )
    Console().print(table)


@click.command("shards")
@click.argument("topic")
@config_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@pass_context
def shards_command(context: Context, topic: str, as_json: bool) -> None:
    """Show TOPIC's partitions with their key hash ranges, parents, children and sealed ends."""
    log = open_log(context.config(needs_sources=False))
    try:
        shards = log.shard_map(topic) if isinstance(log, ElasticShards) else None
        rows = shard_rows(log, topic, shards)
    finally:
        log.close()
    _print(rows, topic, as_json)


@click.command("split")
@click.argument("topic")
@click.argument("partition", type=int)
@click.option(
    "--at", "at", type=int, default=None, help="The hash where the second child starts (default: the middle)."
)
@config_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@pass_context
def split_command(context: Context, topic: str, partition: int, at: int | None, as_json: bool) -> None:
    """Seal PARTITION of TOPIC and create two children covering its key hash range."""
    log = open_log(context.config(needs_sources=False))
    try:
        shards = elastic(log).split_partition(topic, partition, at=at)
        rows = shard_rows(log, topic, shards)
    finally:
        log.close()
    if not as_json:
        low, high = shards.shard(partition).children
        click.echo(
            f"{topic}: partition {partition} sealed at offset {shards.shard(partition).sealed_end}; new: {low}, {high}"
        )
    _print(rows, topic, as_json)


@click.command("merge")
@click.argument("topic")
@click.argument("first", type=int)
@click.argument("second", type=int)
@config_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@pass_context
def merge_command(context: Context, topic: str, first: int, second: int, as_json: bool) -> None:
    """Seal two adjacent open partitions FIRST and SECOND of TOPIC and create one child covering both."""
    log = open_log(context.config(needs_sources=False))
    try:
        shards = elastic(log).merge_partitions(topic, first, second)
        rows = shard_rows(log, topic, shards)
    finally:
        log.close()
    if not as_json:
        child = shards.shard(first).children[0]
        click.echo(f"{topic}: partitions {first} and {second} sealed; new: {child}")
    _print(rows, topic, as_json)


def attach(group: click.Group) -> None:
    """Add the commands to ``headwater log``."""
    for command in (shards_command, split_command, merge_command):
        group.add_command(command)
