"""The Prometheus metrics of Headwater's stages, and the ``/metrics`` endpoint that serves them.

Counters and histograms are recorded by the process doing the work (capture, feeds, loads);
gauges (lag, WAL retained, quarantine sizes) are read at scrape time by a collector the
caller registers (:mod:`operations.pipeline_metrics`), so they are never stale.

``headwater run --follow`` serves one endpoint for all its stages: it points its children
at a directory (``PROMETHEUS_MULTIPROC_DIR``, read by ``prometheus_client`` when first
imported) where each records its counters, and sums them at scrape time, those of
restarted children included, so a counter never goes down.

Names follow Prometheus conventions: ``headwater_<stage>_<what>_<unit>``, counters end in
``_total``, durations are in seconds, sizes in bytes.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.registry import Collector

#: Where ``run --follow``'s children record their metrics (set in their environment).
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
DEFAULT_HOST = "127.0.0.1"

#: Batch durations from a few milliseconds to minutes.
_DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)

CAPTURE_EVENTS = Counter(
    "headwater_capture_events_total", "Change events captured (tombstones not counted).", ["source"]
)
CAPTURE_TRANSACTIONS = Counter("headwater_capture_transactions_total", "Source transactions captured.", ["source"])
CAPTURE_RECORDS = Counter(
    "headwater_capture_records_total", "Log records written by capture (events, tombstones, snapshot rows).", ["source"]
)
CAPTURE_RECONNECTS = Counter(
    "headwater_capture_reconnects_total", "Replication connections lost and retried.", ["source"]
)
STAGE_EVENTS = Counter(
    "headwater_stage_input_records_total", "Log records a Spark stage read (feeds, loads).", ["stage", "name"]
)
STAGE_RECORDS = Counter(
    "headwater_stage_output_records_total",
    "Records a Spark stage wrote (feed upserts and deletes; for loads the rows read, merged in one commit).",
    ["stage", "name"],
)
STAGE_BATCHES = Counter("headwater_stage_batches_total", "Micro-batches a Spark stage committed.", ["stage", "name"])
BATCH_DURATION = Histogram(
    "headwater_batch_duration_seconds",
    "Duration of one micro-batch of a Spark stage (feeds, loads).",
    ["stage", "name"],
    buckets=_DURATION_BUCKETS,
)

SINK_RECORDS = Counter(
    "headwater_sink_records_total",
    "Records a sink's target accepted (after filter; repeats after a retry counted).",
    ["sink"],
)
SINK_SKIPPED = Counter(
    "headwater_sink_skipped_records_total", "Records a sink read but did not deliver (filter, tombstones).", ["sink"]
)
SINK_DEAD_LETTERS = Counter(
    "headwater_sink_dead_letter_records_total",
    "Records a sink's target refused for good (dead-letter topic).",
    ["sink"],
)
SINK_RETRIES = Counter(
    "headwater_sink_retries_total", "Deliveries a sink retried because its target was unavailable.", ["sink"]
)
SINK_BATCH_DURATION = Histogram(
    "headwater_sink_batch_duration_seconds",
    "Duration of one delivered batch of a sink (retries included).",
    ["sink"],
    buckets=_DURATION_BUCKETS,
)

CLEANER_PASSES = Counter(
    "headwater_cleaner_passes_total", "Cleaning passes over a topic that removed or rewrote something.", ["topic"]
)
CLEANER_RECORDS_REMOVED = Counter(
    "headwater_cleaner_records_removed_total",
    "Records the cleaner removed (superseded, tombstones, expired).",
    ["topic"],
)
CLEANER_BYTES_REMOVED = Counter("headwater_cleaner_bytes_removed_total", "Bytes on disk the cleaner freed.", ["topic"])
CLEANER_CONFIG_CHANGES = Counter(
    "headwater_cleaner_config_changes_total", "Topic configs the cleaner aligned with log.topics (Kafka).", ["topic"]
)
CLEANER_PASS_DURATION = Histogram(
    "headwater_cleaner_pass_duration_seconds",
    "Duration of one cleaning pass over a topic.",
    ["topic"],
    buckets=_DURATION_BUCKETS,
)


MAINTENANCE_TASKS = Counter(
    "headwater_maintenance_tasks_total",
    "Maintenance tasks run on a warehouse table (task: compaction, checkpoint, vacuum).",
    ["table", "task"],
)
MAINTENANCE_REWRITTEN_BYTES = Counter(
    "headwater_maintenance_rewritten_bytes_total", "Bytes compaction wrote into a warehouse table.", ["table"]
)
MAINTENANCE_FREED_BYTES = Counter(
    "headwater_maintenance_freed_bytes_total", "Bytes vacuum removed from a warehouse table's storage.", ["table"]
)


def multiprocess_dir() -> Path | None:
    """The directory this process records into for a parent's endpoint (None: it serves its own)."""
    value = os.environ.get(MULTIPROC_ENV)
    return Path(value) if value else None


def serve(port: int, host: str = DEFAULT_HOST, collectors: Iterable[Collector] = ()) -> CollectorRegistry:
    """Serve ``/metrics`` on ``host:port`` (a daemon thread): this process's metrics plus ``collectors``.

    In a parent of recording children (``PROMETHEUS_MULTIPROC_DIR`` set in this process's
    environment before ``prometheus_client`` was imported), the children's metrics are summed in.
    """
    registry = REGISTRY
    directory = os.environ.get(MULTIPROC_ENV)
    if directory:
        from prometheus_client import multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=directory)  # type: ignore[no-untyped-call]
    for collector in collectors:
        registry.register(collector)
    start_http_server(port, addr=host, registry=registry)
    return registry
