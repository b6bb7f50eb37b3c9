"""``headwater run``: capture, feeds and warehouse loads together, in dependency order.

``until_caught_up``: capture everything committed before the call, then run every feed
and every load with ``availableNow`` in one Spark session, in DAG order (feeds before
the tables that read them), then return.

``follow``: each stage is its own supervised process (``headwater capture --follow``,
``headwater feeds run --follow``, ``headwater load --follow``, and the log's cleaner
``headwater log clean --follow``). A process that dies is restarted with exponential
backoff and reported; SIGINT/SIGTERM stop every child (they get SIGINT and finish their
current batch: capture acknowledges only what is durable, Spark jobs resume from their
checkpoints, a cleaning pass replaces segments atomically), so nothing is lost.

The cleaner is a process of its own, not a thread of capture: a compaction pass is
CPU-bound Python that would take the GIL from capture's hot path, and as a stage it is
restarted like the others. ``capture --follow`` run on its own starts the same child
(:class:`BackgroundCleaner`); under ``run --follow`` capture is told not to, so one
cleaner serves the pipeline. :func:`history_holds` keeps it from cleaning what an SCD2
table's loader has not loaded yet.

Stage libraries (psycopg, pyspark, deltalake behind them) are imported inside the functions
that need them, so a process that uses one part of this module does not load the others.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from core.config import ProjectConfig
from core.errors import EXIT_PERMANENT
from log.base import Log
from log.cleaner import Holds
from log.topics import load_group

#: Backoff before restarting a crashed stage (seconds), capped at the last value.
RESTART_BACKOFF_S = (1.0, 2.0, 5.0, 10.0, 30.0)
#: A stage that ran this long before dying is considered healthy again (backoff resets).
HEALTHY_AFTER_S = 60.0


@dataclass
class Stage:
    """One supervised child process."""

    name: str
    argv: list[str]
    process: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    started_at: float = 0.0
    failed: bool = False


@dataclass
class RunSummary:
    """What an ``until_caught_up`` run did."""

    lines: list[str] = field(default_factory=list)


def run_until_caught_up(config: ProjectConfig, say: Callable[[str], None]) -> RunSummary:
    """Capture, then feeds, then loads, each until everything available is processed."""
    from capture.runner import run_capture

    summary = RunSummary()
    if config.feeds or config.warehouse.tables:  # a cluster or object store that refuses fails before capture writes
        from spark_log.cluster import check_before_session
        from warehouse_loader.location import check_warehouse

        check_before_session(config)
        check_warehouse(config)
    if config.sources:
        for name, stats in run_capture(config, (), until_caught_up=True).items():
            summary.lines.append(f"capture {name}: {stats.events} events, acknowledged {stats.acked_lsn}")
            say(summary.lines[-1])
    if not config.feeds and not config.warehouse.tables:
        return summary
    from spark_log.job import spark_job

    with spark_job(config, "headwater-run") as (spark, log):
        if config.feeds:
            from derived_feeds.feed_job import run_feeds

            run_feeds(spark, config, log, (), available_now=True)
            summary.lines.append(f"feeds: {', '.join(config.feeds)} caught up")
            say(summary.lines[-1])
        if config.warehouse.tables:
            from warehouse_loader.load_job import run_loads

            run_loads(spark, config, log, (), available_now=True)
            summary.lines.append(f"warehouse: {', '.join(config.warehouse.tables)} loaded")
            say(summary.lines[-1])
    return summary


def _headwater(config_path: Path) -> list[str]:
    return [sys.executable, "-m", "headwater", "--config", str(config_path)]


def cleaner_stage(config_path: Path) -> Stage:
    """The log's background cleaner as a supervised child (see the module docstring)."""
    return Stage("cleaner", [*_headwater(config_path), "log", "clean", "--follow"])


def follow_stages(config: ProjectConfig, config_path: Path) -> list[Stage]:
    """The child processes of ``run --follow``, upstream first, the cleaner last."""
    base = _headwater(config_path)
    stages = []
    if config.sources:
        stages.append(Stage("capture", [*base, "capture", "--follow", "--no-cleaner"]))
    if config.feeds:
        stages.append(Stage("feeds", [*base, "feeds", "run", "--follow"]))
    if config.warehouse.tables:
        stages.append(Stage("load", [*base, "load", "--follow"]))
    stages.append(cleaner_stage(config_path))
    return stages


def history_holds(config: ProjectConfig, log: Log) -> Holds:
    """Per topic, the offsets the cleaner must not clean past: each SCD2 table's loader position.

    A table that reads the topic keeps, per partition, everything from its loader's committed
    offset on (from offset 0 before its first load): those versions are history it has not
    written yet. Read again at every pass, so the holds follow the loads (and version switches).
    """
    from warehouse_loader.load_job import load_identity

    def holds(topic: str) -> dict[int, int]:
        found: dict[int, int] = {}
        for name, table in config.warehouse.tables.items():
            if table.mode != "scd2":
                continue
            build, source = load_identity(config, name)
            if source != topic:
                continue
            committed = log.committed(load_group(build), topic)
            for partition in range(log.describe_topic(topic).partitions):
                position = committed.get(partition, 0)
                found[partition] = min(found.get(partition, position), position)
        return found

    return holds


class BackgroundCleaner:
    """``headwater log clean --follow`` supervised beside a long-running command (``capture --follow``)."""

    def __init__(self, config_path: Path, say: Callable[[str], None]) -> None:
        self._supervisor = Supervisor([cleaner_stage(config_path)], say)
        self._thread = threading.Thread(target=self._supervisor.run, name="headwater-cleaner", daemon=True)

    def __enter__(self) -> BackgroundCleaner:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        """Stop the cleaner (SIGINT: it ends its pass) and wait for it."""
        self._supervisor.stop()
        self._thread.join()


class Supervisor:
    """Keeps stages running until asked to stop; restarts crashed ones with backoff."""

    def __init__(self, stages: Sequence[Stage], say: Callable[[str], None], *, poll_s: float = 0.5) -> None:
        self.stages = list(stages)
        self._say = say
        self._poll_s = poll_s
        self._stop = threading.Event()

    def stop(self) -> None:
        """Ask every stage to finish its current batch and exit."""
        self._stop.set()

    def run(self) -> int:
        """Supervise until :meth:`stop`; return 0 when every child exited cleanly."""
        for stage in self.stages:
            self._start(stage)
        next_start: dict[str, float] = {}
        while not self._stop.wait(self._poll_s):
            for stage in self.stages:
                process = stage.process
                if stage.failed:
                    continue
                if process is None:
                    if time.monotonic() >= next_start.get(stage.name, 0.0):
                        self._start(stage)
                    continue
                code = process.poll()
                if code is None:
                    continue
                if code == EXIT_PERMANENT:
                    # Restarting cannot help (a dropped slot, bad config, corrupt data): the
                    # stage's own one-line error says what to do; the other stages go on.
                    stage.process = None
                    stage.failed = True
                    self._say(f"{stage.name} stopped with an error that needs an operator; not restarting it")
                    continue
                lived = time.monotonic() - stage.started_at
                if lived >= HEALTHY_AFTER_S:
                    stage.restarts = 0
                delay = RESTART_BACKOFF_S[min(stage.restarts, len(RESTART_BACKOFF_S) - 1)]
                stage.restarts += 1
                stage.process = None
                next_start[stage.name] = time.monotonic() + delay
                self._say(f"{stage.name} exited with code {code} after {lived:.1f}s; restarting in {delay:.0f}s")
            if all(stage.failed for stage in self.stages):
                break
        return self._shutdown()

    def _start(self, stage: Stage) -> None:
        # Own process group: a terminal's Ctrl-C reaches only the supervisor, which then
        # stops the children with SIGINT (each finishes its current batch).
        stage.process = subprocess.Popen(stage.argv, start_new_session=True)
        stage.started_at = time.monotonic()
        self._say(f"started {stage.name} (pid {stage.process.pid})")

    def _shutdown(self, timeout_s: float = 60.0) -> int:
        status = 1 if any(stage.failed for stage in self.stages) else 0
        for stage in self.stages:
            if stage.process is not None and stage.process.poll() is None:
                # SIGINT: every stage treats it as "finish the current batch and exit".
                stage.process.send_signal(signal.SIGINT)
        deadline = time.monotonic() + timeout_s
        for stage in self.stages:
            process = stage.process
            if process is None:
                continue
            try:
                code = process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self._say(f"{stage.name} did not stop within {timeout_s:.0f}s; killing it")
                os.killpg(process.pid, signal.SIGKILL)
                code = process.wait()
            if code not in (0, 130, -signal.SIGINT):
                status = 1
            self._say(f"stopped {stage.name} (exit {code})")
        return status
