"""``headwater maintain``: compaction, checkpoints and expiry of warehouse tables, once or as a stage.

One pass over a table (:func:`maintain_table`) looks at its shape, asks the policy
(:func:`warehouse_loader.maintenance.plan`) what to run, and runs it through the table
format's maintainer (:meth:`warehouse_loader.table_format.TableFormat.maintainer`; Delta:
:class:`warehouse_loader.delta.maintenance.DeltaMaintainer`, Iceberg:
:class:`warehouse_loader.iceberg.maintenance.IcebergMaintainer`), for the table and for the
table of its remembered deletes (asked of the format by the table's location: an Iceberg
side table is found through the main table's catalog entry, not by its directory). Compaction and expiry run under
the table's commit lease (:mod:`core.table_leases`), the lease every loader micro-batch
and backfill commits under, so they never conflict with a commit; expiry is put off while a
reader (``verify``, a backfill) holds the table's reader lease.

``follow`` (``maintain --follow``, a stage of ``run --follow``) repeats a pass over every
table every ``interval_s`` until stopped. What a pass did is kept per table build in
``<home>/maintenance/<build>.json`` (last compaction, checkpoint, vacuum), read by
``status`` and ``/metrics``.

A pass killed at any point leaves the table readable and exact: each step is one atomic
commit (or, for vacuum, deletions of files no kept version references); files a killed
compaction wrote without committing are removed by a later vacuum once older than the
retention.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from core.config import ProjectConfig
from core.table_leases import committing, no_readers
from warehouse_loader import maintenance_runs
from warehouse_loader.maintenance import Done, effective_retention_s, plan, small_file_size


def last_runs(config: ProjectConfig, build: str) -> dict[str, str]:
    """When compaction, checkpoint and vacuum last ran on table build ``build`` (ISO times; absent: never)."""
    return maintenance_runs.last_runs(config.home_dir, build)


def _parse(value: str | None) -> dt.datetime | None:
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00")) if value else None


def maintain_table(
    config: ProjectConfig, name: str, *, now: dt.datetime | None = None, commit_wait_s: float = 600.0
) -> list[Done]:
    """One maintenance pass over warehouse table ``name`` and its side tables (one :class:`Done` each)."""
    from warehouse_loader.formats import format_of
    from warehouse_loader.load_job import table_path

    settings = config.warehouse.maintenance_of(name)
    fmt = format_of(config, name)
    location = table_path(config, name)
    build = location.name
    now = now or dt.datetime.now(dt.UTC)
    runs = last_runs(config, build)
    results = []
    tasks: set[str] = set()
    side = fmt.tombstones(location)  # remembered deletes live beside the table, maintained with it
    parts = [(name, False)] + ([] if side is None else [(f"{name}/{side.location.name}", True)])
    for label, tombstones in parts:
        maintainer = fmt.maintainer(location, tombstones=tombstones)
        shape = maintainer.shape(small_file_size(settings))
        if shape is None:
            continue
        shape = replace(
            shape, last_compaction=_parse(runs.get("last_compaction")), last_vacuum=_parse(runs.get("last_vacuum"))
        )
        todo = plan(shape, settings, now)
        done = Done(label)
        if todo.compact:
            with committing(config.home_dir, build, commit_wait_s):
                removed, added, written = maintainer.compact(
                    settings.target_file_size, small_file_size(settings), settings.compact_dirty_ratio
                )
            done = Done(label, compacted_files=removed, written_files=added, rewritten_bytes=written)
            tasks.add("compaction")
        if todo.expire:
            with no_readers(config.home_dir, build) as free:
                if not free:
                    done = replace(done, deferred="a reader (verify or a backfill) holds the table")
                else:
                    with committing(config.home_dir, build, commit_wait_s):
                        files, freed, entries = maintainer.expire(effective_retention_s(settings))
                    done = replace(done, vacuumed_files=files, vacuumed_bytes=freed, expired_log_entries=entries)
                    tasks.add("vacuum")
        if todo.checkpoint or done.vacuumed_files:
            with committing(config.home_dir, build, commit_wait_s):  # not beside the loader's own checkpoint
                checkpointed = maintainer.checkpoint()
            if checkpointed:
                done = replace(done, checkpointed=True)
                tasks.add("checkpoint")
        results.append(done)
    if tasks:
        maintenance_runs.record_runs(config.home_dir, build, sorted(tasks), now)
    return results


def maintain(
    config: ProjectConfig,
    names: Sequence[str],
    report: Callable[[Done], None],
    *,
    stop: threading.Event | None = None,
) -> None:
    """Maintain ``names``: one pass, or with ``stop`` a pass every ``interval_s`` until it is set.

    No ``names``: every table whose maintenance is enabled.
    """
    tables = config.warehouse.tables
    selected = list(names) or [name for name in tables if config.warehouse.maintenance_of(name).enabled]
    while True:
        started = time.monotonic()
        for name in selected:
            if stop is not None and stop.is_set():
                return
            for done in maintain_table(config, name):
                report(done)
        if stop is None:
            return
        interval = min(config.warehouse.maintenance_of(n).interval_s for n in selected) if selected else 60.0
        if stop.wait(max(0.0, interval - (time.monotonic() - started))):
            return


def maintenance_status(config: ProjectConfig, name: str) -> dict[str, Any]:
    """Files, bytes, dirty ratio, log entries since the checkpoint and last maintenance runs of table ``name``."""
    from warehouse_loader.formats import format_of
    from warehouse_loader.load_job import table_path

    settings = config.warehouse.maintenance_of(name)
    location = table_path(config, name)
    shape = format_of(config, name).maintainer(location).shape(small_file_size(settings))
    if shape is None:
        return {}
    return {
        "version": shape.version,
        "files": shape.files,
        "bytes": shape.bytes,
        "small_files": shape.small_files,
        "dirty_ratio": round(shape.dirty_ratio, 3),
        "deleted_rows": shape.deleted_rows,
        "commits_since_checkpoint": shape.commits_since_checkpoint,
        **last_runs(config, location.name),
    }
