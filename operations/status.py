"""``headwater status``: one picture of the pipeline's health, gathered read-only.

Per source: slot active, confirmed flush LSN, WAL the slot retains. Per topic: end
offsets, and (file backend) bytes on disk and dirty ratio (closed segments not yet
compacted, over all closed segments). Per feed: its current topic, input lag and quarantined rows. Per warehouse
table: last committed change, freshness, lag (records the
table's loader has not yet committed past, from its consumer group
``headwater.load.<table>``), files, bytes, dirty ratio and when maintenance last
compacted, checkpointed and vacuumed it. Per stage command that last stopped with an error: the
error's line, exit code and time (:mod:`operations.stage_errors`). A source that cannot be reached (server down, or its
password variable unset: status never needs secrets) is reported, not fatal.

Stage libraries (psycopg, pyspark, deltalake behind them) are imported inside the functions
that need them, so a process that uses one part of this module does not load the others.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from typing import Any

from core.config import ProjectConfig
from core.deployment import shown_settings
from core.errors import HeadwaterError
from core.stage_problems import stage_problem
from log.base import Log, end_offsets, lag
from log.cleaner import ReportsUsage
from log.topics import load_group
from operations.stage_errors import last_errors


def source_status(config: ProjectConfig) -> list[dict[str, Any]]:
    """Each registered source's row, from its kind (PostgreSQL: the slot's state; password never included)."""
    from capture.kinds import kind_of

    rows: list[dict[str, Any]] = []
    for name in config.sources:
        try:
            kind = kind_of(config, name)
        except HeadwaterError as exc:
            rows.append({"source": name, "error": str(exc)})
            continue
        row = kind.status(config, name)
        problem = stage_problem(config.home_dir, "capture", name)
        if problem is not None:
            row["problem"] = problem
        rows.append(row)
    return rows


def topic_status(log: Log) -> list[dict[str, Any]]:
    """End offsets per partition of every topic; bytes and dirty ratio where the log knows them (file backend)."""
    rows = []
    for topic in log.list_topics():
        row: dict[str, Any] = {"topic": topic}
        try:
            ends = end_offsets(log, topic)
            row.update(end_offsets={str(p): o for p, o in ends.items()}, records=sum(ends.values()))
            if isinstance(log, ReportsUsage):
                usage = log.usage(topic)
                row.update(bytes=usage.bytes, dirty_ratio=round(usage.dirty_ratio, 3))
        except HeadwaterError as exc:  # a damaged topic is shown, the others still are
            row["error"] = str(exc)
        rows.append(row)
    return rows


def table_status(
    config: ProjectConfig, log: Log, now_s: float | None = None, *, names: Collection[str] | None = None
) -> list[dict[str, Any]]:
    """Last commit time, freshness, lag, size and shape (files, dirty ratio, last maintenance) of every table.

    ``names``: only these tables (each table's status opens and reads it: a caller after one
    table must not pay for all of them).
    """
    from operations.maintain import maintenance_status
    from warehouse_loader.formats import format_of
    from warehouse_loader.load_job import load_identity, table_key_problem, table_path

    now_s = time.time() if now_s is None else now_s
    topics = set(log.list_topics())
    rows = []
    for name, table in config.warehouse.tables.items():
        if names is not None and name not in names:
            continue
        row: dict[str, Any] = {"table": name, "from": table.from_, "mode": table.mode}
        build, source_topic = load_identity(config, name)
        path = table_path(config, name)
        stored = format_of(config, name).open(path)  # local or on an object store (warehouse.path)
        if stored is None:
            row["state"] = "not loaded yet"
        else:
            # DuckDB, not a pyarrow dataset scan: the scan's threads can outlive it and abort
            # the process at exit ("terminate called without an active exception", arrow#34314).
            latest = stored.select("SELECT max(__hw_commit_ts) AS last FROM target")
            last = latest.column("last")[0].as_py()
            if last is not None:
                row["last_commit"] = last.isoformat()
                row["freshness_s"] = round(now_s - last.timestamp(), 3)
            row["state"] = "loaded"
            row.update(maintenance_status(config, name))  # files, bytes, dirty ratio, last maintenance
        if source_topic in topics:
            try:
                row["lag"] = sum(lag(log, load_group(build), source_topic).values())
            except HeadwaterError as exc:  # a damaged topic (shown under topics too)
                row["problem"] = str(exc)
                rows.append(row)
                continue
            problem = table_key_problem(config, log, name) or stage_problem(config.home_dir, "load", name)
            if problem is not None:
                row["problem"] = problem
        rows.append(row)
    return rows


def feed_status(config: ProjectConfig, log: Log) -> list[dict[str, Any]]:
    """Per feed: its current output topic and the records of its inputs it has not processed."""
    from derived_feeds.feed_spec import feed_spec

    topics = set(log.list_topics())
    rows = []
    for name in config.feeds:
        spec = feed_spec(config, name)
        row: dict[str, Any] = {"feed": name, "topic": spec.topic, "version": spec.version}
        row["plan_class"] = spec.recorded_plan_class()  # decided by the feed job when it plans the SQL
        inputs = [t for t in spec.input_topics if t in topics]
        try:
            row["lag"] = sum(sum(lag(log, spec.group, topic).values()) for topic in inputs) if inputs else None
            if spec.quarantine_topic in topics:
                row["quarantined"] = sum(end_offsets(log, spec.quarantine_topic).values())
        except HeadwaterError as exc:  # a damaged topic (shown under topics too)
            row["problem"] = str(exc)
        problem = stage_problem(config.home_dir, "feed", name)
        if problem is not None:
            row.setdefault("problem", problem)  # a damaged topic's error first
        rows.append(row)
    return rows


def sink_status(config: ProjectConfig, log: Log) -> list[dict[str, Any]]:
    """Per sink: kind, topics, state (running, blocked on its target, ...), records behind, dead-lettered."""
    from sinks.status import sink_rows
    from spark_log.versions import resolve_topic

    return sink_rows(config, log, lambda name: resolve_topic(config, name))


def deployment_status(config: ProjectConfig) -> dict[str, Any]:
    """Where Spark runs and where the warehouse and checkpoints live (credential values masked)."""
    return {
        "spark": {
            "master": config.spark.master,
            "driver_memory": config.spark.driver_memory,
            "conf": shown_settings(config.spark.conf),
            "checkpoint_path": str(config.checkpoint_dir),
        },
        "warehouse": {
            "path": config.warehouse_root,
            "storage_options": shown_settings(config.warehouse.storage_options),
        },
    }


def pipeline_status(config: ProjectConfig, log: Log) -> dict[str, Any]:
    """Everything ``headwater status`` shows."""
    return {
        "deployment": deployment_status(config),
        "sources": source_status(config),
        "topics": topic_status(log),
        "feeds": feed_status(config, log),
        "tables": table_status(config, log),
        "sinks": sink_status(config, log),
        "errors": last_errors(config),
    }
