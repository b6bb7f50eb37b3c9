"""Materialisation metadata from ``operations.status``: log end offsets, lag, row counts, freshness.

Library modules are imported inside asset and check bodies: Dagster loads these definitions in
every process (webserver, daemon, each run), most of which never run a given stage.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dagster import MetadataValue

from core.config import ProjectConfig
from log.base import Log, end_offsets, lag
from log.topics import load_group
from operations.status import table_status


def capture_metadata(kind: str, figures: Mapping[str, Any]) -> dict[str, Any]:
    """A capture's figures as asset metadata (``acked``: the position capture last acknowledged).

    The position is ``capture/acked_lsn`` for PostgreSQL, ``capture/acked_position`` for another
    kind (MySQL: the saved binlog ``file:offset``).
    """
    acked = "acked_lsn" if kind == "postgres" else "acked_position"
    return {f"capture/{acked if k == 'acked' else k}": v for k, v in figures.items()}


def topic_metadata(config: ProjectConfig, log: Log, topic: str) -> dict[str, Any]:
    """End offsets and records of ``topic``, and the lag of every warehouse loader reading it."""
    if topic not in log.list_topics():
        return {"log/records": 0, "log/state": "topic not created yet (nothing captured)"}
    ends = end_offsets(log, topic)
    metadata: dict[str, Any] = {
        "log/topic": topic,
        "log/end_offsets": MetadataValue.json({str(p): o for p, o in ends.items()}),
        "log/records": sum(ends.values()),
    }
    for name, table in config.warehouse.tables.items():
        if table.from_ == topic:
            metadata[f"lag/{load_group(name)}"] = sum(lag(log, load_group(name), topic).values())
    return metadata


def feed_metadata(config: ProjectConfig, log: Log, name: str, stats: Mapping[str, int]) -> dict[str, Any]:
    """End offsets of feed ``name``'s topic, the lag of its group, its quarantined count and the run's counts."""
    from derived_feeds.feed_spec import feed_spec

    spec = feed_spec(config, name)
    topics = set(log.list_topics())
    metadata: dict[str, Any] = {f"feed/{counter}": value for counter, value in stats.items()}
    metadata["log/topic"] = spec.topic
    if spec.topic in topics:
        ends = end_offsets(log, spec.topic)
        metadata["log/end_offsets"] = MetadataValue.json({str(p): o for p, o in ends.items()})
        metadata["log/records"] = sum(ends.values())
    # The quarantine topic keeps every dropped row (never compacted): its size is the count.
    quarantined = sum(end_offsets(log, spec.quarantine_topic).values()) if spec.quarantine_topic in topics else 0
    metadata["feed/quarantined"] = quarantined
    metadata[f"lag/{spec.group}"] = sum(
        sum(lag(log, spec.group, topic).values()) for topic in spec.input_topics if topic in topics
    )
    return metadata


def table_metadata(config: ProjectConfig, log: Log, name: str) -> dict[str, Any]:
    """Row count, last commit time, freshness and loader lag of warehouse table ``name``."""
    from warehouse_loader.formats import format_of
    from warehouse_loader.load_job import table_path

    (status,) = table_status(config, log, names=(name,))
    path = table_path(config, name)  # a local path or an object store URL (never its credentials)
    metadata: dict[str, Any] = {"warehouse/state": status["state"], "warehouse/path": str(path)}
    fmt = format_of(config, name)
    table = fmt.open(path)
    if table is not None:
        # Counted by DuckDB like every other read of a table (no pyarrow dataset scan: its
        # threads can abort the process at exit, arrow#34314).
        counted = table.select("SELECT count(*) AS n FROM target")
        metadata["dagster/row_count"] = counted.column("n")[0].as_py()
        metadata[f"{fmt.name}/version"] = table.version()
    if "last_commit" in status:
        metadata["warehouse/last_commit"] = status["last_commit"]
        metadata["warehouse/freshness_s"] = status["freshness_s"]
    if "lag" in status:
        metadata["warehouse/lag"] = status["lag"]
    source = config.warehouse.tables[name].from_
    if source in log.list_topics():
        metadata["log/end_offsets"] = MetadataValue.json({str(p): o for p, o in end_offsets(log, source).items()})
    return metadata


@dataclass(frozen=True, slots=True)
class PendingWork:
    """Feeds and warehouse tables with input their consumer group has not committed past.

    ``feeds`` / ``tables``: name -> records behind (a table reading a pending feed is
    pending too, with what it is behind so far). ``position``: the end offsets of every
    input topic of that work, a text that changes only when one of them grows.
    """

    feeds: dict[str, int] = field(default_factory=dict)
    tables: dict[str, int] = field(default_factory=dict)
    position: str = ""

    def __bool__(self) -> bool:
        return bool(self.feeds or self.tables)


def _behind(log: Log, group: str, topics: Sequence[str], existing: set[str]) -> int:
    return sum(sum(lag(log, group, topic).values()) for topic in topics if topic in existing)


def _position(log: Log, topics: Sequence[str]) -> str:
    return ";".join(
        f"{topic}@" + ",".join(f"{p}:{o}" for p, o in sorted(end_offsets(log, topic).items())) for topic in topics
    )


def pending_work(config: ProjectConfig, log: Log) -> PendingWork:
    """What a run of feeds and loads would process now (``headwater status`` lag, per consumer group)."""
    from derived_feeds.feed_spec import feed_spec
    from warehouse_loader.load_job import load_identity

    existing = set(log.list_topics())
    feeds: dict[str, int] = {}
    inputs: set[str] = set()
    for name in config.feeds:
        spec = feed_spec(config, name)
        behind = _behind(log, spec.group, spec.input_topics, existing)
        if behind > 0:
            feeds[name] = behind
            inputs.update(t for t in spec.input_topics if t in existing)
    tables: dict[str, int] = {}
    for name, table in config.warehouse.tables.items():
        build, topic = load_identity(config, name)
        behind = _behind(log, load_group(build), [topic], existing)
        if behind > 0 or table.from_ in feeds:
            tables[name] = behind
            if topic in existing:
                inputs.add(topic)
    return PendingWork(feeds, tables, _position(log, sorted(inputs)))
