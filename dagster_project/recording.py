"""Work done outside Dagster, recorded in the Dagster instance ``headwater ui`` serves.

Whatever runs the pipeline (the CLI, ``run --follow``'s stages, the demo), the asset
catalog must show what is in the log and the warehouse. :class:`AssetRecorder` writes
runless materializations into ``<home>/dagster`` with the same metadata the assets'
own runs report (:mod:`dagster_project.metadata`: end offsets, lag, row counts, last
commit), one per asset whose figures changed since it last recorded. An SCD2 history
table's materializations name the commit days (partitions) its new rows belong to.

Recording never fails the work it records: an error is logged and the next call tries again.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Mapping
from typing import Any

from dagster import AssetKey, AssetMaterialization, DagsterInstance

from core.config import ProjectConfig
from dagster_project.lineage import feed_key, source_topics, topic_key, warehouse_key
from dagster_project.metadata import capture_metadata, feed_metadata, table_metadata, topic_metadata
from dagster_project.ui import creating_dagster_instance
from log.base import Log
from log.factory import open_log

logger = logging.getLogger(__name__)

#: Metadata that changes at every look without new work (not part of "did anything change").
_VOLATILE = ("warehouse/freshness_s",)


class AssetRecorder:
    """Records materializations of this project's assets in its Dagster instance."""

    def __init__(self, config: ProjectConfig, description: str) -> None:
        self._config = config
        self._description = description
        self._instance: DagsterInstance | None = None
        self._recorded: dict[str, str] = {}
        self._lock = threading.Lock()

    def _open(self) -> DagsterInstance:
        if self._instance is None:
            with creating_dagster_instance(self._config) as home:
                self._instance = DagsterInstance.from_config(str(home))
        return self._instance

    def record(
        self,
        *,
        sources: Mapping[str, Mapping[str, Any]] | None = None,
        feeds: Mapping[str, Mapping[str, int]] | None = None,
        tables: tuple[str, ...] = (),
        only_unrecorded: bool = False,
    ) -> int:
        """Record the assets of ``sources`` (name -> capture figures), ``feeds`` (name -> run counts) and ``tables``.

        Returns how many materializations were recorded (assets whose figures did not change
        since this recorder's last call are skipped; with ``only_unrecorded``, also every asset
        the instance already has a materialization of).
        """
        with self._lock:
            try:
                log = open_log(self._config)
                try:
                    return self._record(log, sources or {}, feeds or {}, tables, only_unrecorded)
                finally:
                    log.close()
            except Exception as exc:  # recording is a report on the work, never a reason for it to fail
                logger.warning("could not record the work in the Dagster instance: %s", exc)
                return 0

    def _record(
        self,
        log: Log,
        sources: Mapping[str, Mapping[str, Any]],
        feeds: Mapping[str, Mapping[str, int]],
        tables: tuple[str, ...],
        only_unrecorded: bool = False,
    ) -> int:
        events: list[AssetMaterialization] = []
        topics = source_topics(self._config)
        for source, figures in sources.items():
            for topic in topics.get(source, ()):
                kind = self._config.sources[source].kind
                metadata = topic_metadata(self._config, log, topic) | capture_metadata(kind, figures)
                events += self._changed(topic_key(topic), metadata)
        for name, stats in feeds.items():
            events += self._changed(feed_key(name), feed_metadata(self._config, log, name, stats))
        for name in tables:
            metadata = table_metadata(self._config, log, name)
            days = self._history_days(name, metadata) if self._config.warehouse.tables[name].mode == "scd2" else None
            events += self._changed(warehouse_key(name), metadata, days)
        if not events:
            return 0
        instance = self._open()
        if only_unrecorded:
            keys = {event.asset_key for event in events}
            unrecorded = {key for key in keys if instance.get_latest_materialization_event(key) is None}
            events = [event for event in events if event.asset_key in unrecorded]
        for event in events:
            instance.report_runless_asset_event(event)
        return len(events)

    def _changed(
        self, key: AssetKey, metadata: dict[str, Any], partitions: list[str] | None = None
    ) -> list[AssetMaterialization]:
        fingerprint = repr(sorted((k, repr(v)) for k, v in metadata.items() if k not in _VOLATILE))
        if self._recorded.get(key.to_user_string()) == fingerprint:
            return []
        self._recorded[key.to_user_string()] = fingerprint
        if partitions is not None and not partitions:
            return []  # an empty history table: no day to mark
        days: list[str | None] = list(partitions) if partitions is not None else [None]
        return [
            AssetMaterialization(key, description=self._description, metadata=metadata, partition=day) for day in days
        ]

    def _history_days(self, name: str, metadata: Mapping[str, Any]) -> list[str]:
        """The commit days (UTC) of the history rows committed since this recorder last recorded ``name``."""
        from warehouse_loader.changes import COMMIT_TS
        from warehouse_loader.formats import format_of
        from warehouse_loader.load_job import table_path

        stored = format_of(self._config, name).open(table_path(self._config, name))
        if stored is None:
            return []
        since = self._recorded.get(f"{name}/last_commit")
        where = f"WHERE {COMMIT_TS} > TIMESTAMPTZ '{since}'" if since else ""
        rows = stored.select(f"SELECT DISTINCT CAST({COMMIT_TS} AS DATE) AS day FROM target {where} ORDER BY 1")
        if metadata.get("warehouse/last_commit"):
            self._recorded[f"{name}/last_commit"] = str(metadata["warehouse/last_commit"])
        return [day.isoformat() for day in rows.column("day").to_pylist() if isinstance(day, dt.date)]


def record_unrecorded(config: ProjectConfig) -> int:
    """Record the current state of every asset the project's instance has no materialization of.

    Stage commands record only into an existing instance (:func:`dagster_project.ui.dagster_instance_exists`):
    what was captured, fed and loaded before ``headwater ui`` first created it is recorded here, once.
    """
    recorder = AssetRecorder(config, "headwater ui: found at its start (made before the instance existed)")
    return recorder.record(
        sources={name: {} for name in config.sources},
        feeds={name: {} for name in config.feeds},
        tables=tuple(config.warehouse.tables),
        only_unrecorded=True,
    )
