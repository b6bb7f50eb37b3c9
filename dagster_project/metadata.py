"""Materialisation metadata from ``headwater.status``: log end offsets, lag, row counts, freshness."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dagster import MetadataValue

from headwater.config import ProjectConfig
from headwater.status import LOAD_GROUP_PREFIX, table_status
from log.base import Log, end_offsets, lag


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
            metadata[f"lag/{LOAD_GROUP_PREFIX}{name}"] = sum(lag(log, LOAD_GROUP_PREFIX + name, topic).values())
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
    from deltalake import DeltaTable

    from warehouse_loader.load_job import table_path

    status = next(row for row in table_status(config, log) if row["table"] == name)
    metadata: dict[str, Any] = {"warehouse/state": status["state"], "warehouse/path": str(table_path(config, name))}
    path = table_path(config, name)
    if DeltaTable.is_deltatable(str(path)):
        table = DeltaTable(str(path))
        metadata["dagster/row_count"] = table.to_pyarrow_dataset().count_rows()
        metadata["delta/version"] = table.version()
    if "last_commit" in status:
        metadata["warehouse/last_commit"] = status["last_commit"]
        metadata["warehouse/freshness_s"] = status["freshness_s"]
    if "lag" in status:
        metadata["warehouse/lag"] = status["lag"]
    source = config.warehouse.tables[name].from_
    if source in log.list_topics():
        metadata["log/end_offsets"] = MetadataValue.json({str(p): o for p, o in end_offsets(log, source).items()})
    return metadata


def pending_loads(config: ProjectConfig, log: Log) -> dict[str, int]:
    """Warehouse tables whose loader has not committed up to its topic's end: name -> records behind."""
    topics = set(log.list_topics())
    pending: dict[str, int] = {}
    for name, table in config.warehouse.tables.items():
        if table.from_ in topics:
            behind = sum(lag(log, LOAD_GROUP_PREFIX + name, table.from_).values())
            if behind > 0:
                pending[name] = behind
    return pending


def end_position(log: Log, topic: str) -> str:
    """A compact text of ``topic``'s end offsets (``0:12,1:40``): a run key that changes with new data."""
    return ",".join(f"{p}:{o}" for p, o in sorted(end_offsets(log, topic).items()))
