"""What a stage command runs beside its work: ``/metrics``, the metric recorders, and recording in Dagster.

Each stage command (``capture``, ``feeds run``, ``load``, ``run``) opens a
:class:`StageRuntime` around its work. With ``--metrics-port`` it serves ``/metrics``
(gauges of its own scope, read at scrape time, plus its counters); as a child of
``run --follow`` (``PROMETHEUS_MULTIPROC_DIR`` set) it only records counters for the
parent's endpoint. Whatever it did is recorded in the project's Dagster instance (when the
project has one: ``headwater ui`` and ``headwater demo`` create it) when the work ends, and
every 30 s while a ``--follow`` stage runs.

Stage libraries (prometheus-client, Dagster) are imported only when used: ``--help`` and
quick commands do not pay for them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from core.config import ProjectConfig
from headwater.cli_context import Output, StageOptions

if TYPE_CHECKING:
    from capture.stats import CaptureStats
    from dagster_project.recording import AssetRecorder
    from operations.pipeline_metrics import CaptureRecorder, Scope, SparkRecorder


class StageRuntime:
    """Metrics and Dagster recording of one stage command (see the module docstring)."""

    def __init__(self, config: ProjectConfig, options: StageOptions, output: Output, description: str) -> None:
        from core.metrics import multiprocess_dir

        self.config = config
        self.options = options
        self.output = output
        self._description = description
        self.metrics = options.metrics_port is not None or multiprocess_dir() is not None
        self.capture_stats: dict[str, CaptureStats] = {}
        #: Feeds to record in Dagster, with their run's live counters when known.
        self.feed_stats: dict[str, Callable[[], dict[str, int]]] = {}
        self.feeds: tuple[str, ...] = ()
        self.tables: tuple[str, ...] = ()
        self._capture: CaptureRecorder | None = None
        self._spark: SparkRecorder | None = None
        self._assets: AssetRecorder | None = None

    def serve(self, scope: Scope, extra: Any = None) -> None:
        """Serve ``/metrics`` for ``scope`` when ``--metrics-port`` was given."""
        if self.options.metrics_port is None:
            return
        from core.metrics import serve
        from operations.pipeline_metrics import PipelineCollector

        port, host = self.options.metrics_port, self.options.metrics_host
        serve(port, host, [PipelineCollector(self.config, scope, extra)])
        shown = f"[{host}]" if ":" in host else host
        self.output.note(f"metrics on http://{shown}:{port}/metrics")

    def observe_capture(self, source: str, stats: CaptureStats) -> None:
        """The ``observe`` hook of :func:`capture.runner.run_capture`."""
        self.capture_stats[source] = stats
        if self.metrics:
            if self._capture is None:
                from operations.pipeline_metrics import CaptureRecorder

                self._capture = CaptureRecorder()
                self._capture.start()
            self._capture.observe(source, stats)

    def follow_query(self, stage: str, name: str, query: Any, written: Callable[[], int] | None = None) -> None:
        """Record a streaming query's micro-batches in the stage counters."""
        if not self.metrics:
            return
        if self._spark is None:
            from operations.pipeline_metrics import SparkRecorder

            self._spark = SparkRecorder()
            self._spark.start()
        self._spark.follow(stage, name, query, written)

    def stop_recorders(self) -> None:
        """Last copy of the counters (call while Spark still runs)."""
        for recorder in (self._capture, self._spark):
            if recorder is not None:
                recorder.stop()
        self._capture = self._spark = None

    def record_assets(self) -> None:
        """Record what this stage holds now as materializations in the project's Dagster instance, if it has one.

        Without one (``headwater ui`` creates it and records what exists then) nothing is
        imported or read: a project nobody watches in Dagster does not pay for it.
        """
        from dagster_project.ui import dagster_instance_exists

        if not dagster_instance_exists(self.config):
            return
        recorder = self._asset_recorder()
        sources = {name: capture_figures(stats) for name, stats in self.capture_stats.items()}
        feeds = {name: self.feed_stats[name]() if name in self.feed_stats else {} for name in self.feeds}
        recorder.record(sources=sources, feeds=feeds, tables=self.tables)

    @contextlib.contextmanager
    def recording(self, *, follow: bool) -> Iterator[None]:
        """Record the assets when the block ends, and every 30 s during a ``--follow`` run."""
        if not follow:
            try:
                yield
            finally:
                self.stop_recorders()
            self.record_assets()
            return
        from dagster_project.periodic import PeriodicRecording

        try:
            with PeriodicRecording(self.record_assets).running():
                yield
        finally:
            self.stop_recorders()

    def _asset_recorder(self) -> AssetRecorder:
        if self._assets is None:
            from dagster_project.recording import AssetRecorder

            self._assets = AssetRecorder(self.config, self._description)
        return self._assets


#: prometheus_client's variable (``core.metrics.MULTIPROC_ENV``), named here without importing it.
_MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


@contextlib.contextmanager
def children_record_metrics(*, here_too: bool = False) -> Iterator[str | None]:
    """A fresh directory child processes record their counters into, summed by this process's endpoint.

    ``here_too``: this process records into it as well (``capture --follow`` beside its cleaner);
    that needs the variable set before ``prometheus_client`` is first imported, so when it
    already was (or a parent set a directory) nothing changes and ``None`` is yielded.
    """
    if os.environ.get(_MULTIPROC_ENV) or (here_too and "prometheus_client" in sys.modules):
        yield None
        return
    directory = tempfile.mkdtemp(prefix="headwater-metrics-")
    os.environ[_MULTIPROC_ENV] = directory  # for the children, and for this process's endpoint
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def capture_figures(stats: CaptureStats) -> dict[str, Any]:
    """What a capture's materialization reports besides the topic's offsets."""
    return {"acked": str(stats.acked), "events": stats.events, "records_written": stats.records_written}
