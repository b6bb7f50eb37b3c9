"""``headwater status``: one picture of the pipeline's health, gathered read-only.

Per source: slot active, confirmed flush LSN, WAL the slot retains. Per topic: end
offsets, and (file backend) bytes on disk and dirty ratio (closed segments not yet
compacted, over all closed segments). Per feed: its current topic, input lag and quarantined rows. Per warehouse
table: last committed change, freshness, and lag (records the
table's loader has not yet committed past, from its consumer group
``headwater.load.<table>``). A source that cannot be reached (server down, or its
password variable unset: status never needs secrets) is reported, not fatal.

Stage libraries (psycopg, pyspark, deltalake behind them) are imported inside the functions
that need them, so a process that uses one part of this module does not load the others.
"""

from __future__ import annotations

import time
from typing import Any

from core.config import ProjectConfig, unset_variables
from core.deployment import shown_settings
from core.errors import HeadwaterError
from log.base import Log, end_offsets, lag
from log.cleaner import ReportsUsage
from log.topics import load_group


def source_status(config: ProjectConfig) -> list[dict[str, Any]]:
    """Slot state of every registered source (password never included)."""
    from capture.registration import connect
    from capture.slot import slot_status

    rows: list[dict[str, Any]] = []
    for name, source in config.sources.items():
        slot_name = source.slot or f"headwater_{name}"
        row: dict[str, Any] = {"source": name, "dsn": source.dsn_redacted, "slot": slot_name}
        unset = unset_variables(source.dsn.get_secret_value())
        if unset:
            row["error"] = (
                f"not checked: environment variable {unset[0]} (in its dsn) is not set; export it to see the slot"
            )
            rows.append(row)
            continue
        try:
            with connect(source.dsn.get_secret_value(), source=name) as conn:
                status = slot_status(conn, slot_name)
        except HeadwaterError as exc:
            row["error"] = str(exc)
            rows.append(row)
            continue
        if status is None:
            row["error"] = f"slot {slot_name} does not exist; run 'headwater source resync {name}'"
        else:
            row.update(
                active=status.active,
                confirmed_flush_lsn=str(status.confirmed_flush_lsn) if status.confirmed_flush_lsn else None,
                wal_retained_bytes=status.wal_retained_bytes,
                wal_status=status.wal_status,
            )
        rows.append(row)
    return rows


def topic_status(log: Log) -> list[dict[str, Any]]:
    """End offsets per partition of every topic; bytes and dirty ratio where the log knows them (file backend)."""
    rows = []
    for topic in log.list_topics():
        ends = end_offsets(log, topic)
        row: dict[str, Any] = {
            "topic": topic,
            "end_offsets": {str(p): o for p, o in ends.items()},
            "records": sum(ends.values()),
        }
        if isinstance(log, ReportsUsage):
            usage = log.usage(topic)
            row.update(bytes=usage.bytes, dirty_ratio=round(usage.dirty_ratio, 3))
        rows.append(row)
    return rows


def table_status(config: ProjectConfig, log: Log, now_s: float | None = None) -> list[dict[str, Any]]:
    """Last commit time, freshness and lag of every warehouse table."""
    from warehouse_loader.delta_scan import select_rows
    from warehouse_loader.load_job import load_identity, table_key_problem, table_path

    now_s = time.time() if now_s is None else now_s
    topics = set(log.list_topics())
    rows = []
    for name, table in config.warehouse.tables.items():
        row: dict[str, Any] = {"table": name, "from": table.from_, "mode": table.mode}
        build, source_topic = load_identity(config, name)
        path = table_path(config, name)
        delta = path.open()  # local or on an object store (warehouse.path)
        if delta is None:
            row["state"] = "not loaded yet"
        else:
            # DuckDB, not a pyarrow dataset scan: the scan's threads can outlive it and abort
            # the process at exit ("terminate called without an active exception", arrow#34314).
            latest = select_rows(path, delta, "SELECT max(__hw_commit_ts) AS last FROM target")
            last = latest.column("last")[0].as_py()
            if last is not None:
                row["last_commit"] = last.isoformat()
                row["freshness_s"] = round(now_s - last.timestamp(), 3)
            row["state"] = "loaded"
        if source_topic in topics:
            row["lag"] = sum(lag(log, load_group(build), source_topic).values())
            problem = table_key_problem(config, log, name)
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
        row["lag"] = sum(sum(lag(log, spec.group, topic).values()) for topic in inputs) if inputs else None
        if spec.quarantine_topic in topics:
            row["quarantined"] = sum(end_offsets(log, spec.quarantine_topic).values())
        rows.append(row)
    return rows


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
    }
