"""``headwater run``: capture, feeds and warehouse loads together, in dependency order.

``until_caught_up``: capture everything committed before the call, then run every feed
and every load with ``availableNow`` in one Spark session, in DAG order (feeds before
the tables that read them), then return.

``follow``: each stage is its own supervised process (``headwater capture --follow``,
``headwater feeds run --follow``, ``headwater load --follow``, ``headwater sinks run --follow``,
the warehouse tables' maintenance ``headwater maintain --follow`` and the log's cleaner
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
from typing import TYPE_CHECKING, Any

from core import stop_request
from core.config import ProjectConfig
from core.errors import EXIT_PERMANENT
from core.leases import LeaseWait
from core.process_lifetime import parent_death_preexec
from log.base import Log
from log.cleaner import Holds
from log.topics import load_group
from operations.holders import holding

if TYPE_CHECKING:
    from capture.stats import CaptureStats

#: Called with each streaming query a run starts: ``(stage, name, query, records written so far or None)``.
QueryHook = Callable[[str, str, Any, Callable[[], int] | None], None]

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
    #: Every restart, for the restarts counter (``restarts`` resets once the stage is healthy).
    restarts_total: int = 0
    started_at: float = 0.0
    failed: bool = False


@dataclass
class RunSummary:
    """What an ``until_caught_up`` run did."""

    lines: list[str] = field(default_factory=list)


def run_until_caught_up(
    config: ProjectConfig,
    say: Callable[[str], None],
    *,
    holder_wait: LeaseWait | None = None,
    on_capture: Callable[[str, CaptureStats], None] | None = None,
    on_query: QueryHook | None = None,
) -> RunSummary:
    """Capture, then feeds, then loads, each until everything available is processed.

    What another process holds (a source it captures, a feed or table it runs) is waited
    for as ``holder_wait`` says (default: a few seconds), then :class:`core.leases.HeldError`
    names the holder. ``on_capture`` and ``on_query`` see each agent's counters and each
    streaming query (for metrics).
    """
    from capture.runner import DEFAULT_HOLDER_WAIT, run_capture

    wait = holder_wait or DEFAULT_HOLDER_WAIT
    summary = RunSummary()
    if config.feeds or config.warehouse.tables:  # a cluster or object store that refuses fails before capture writes
        from spark_log.cluster import check_before_session
        from warehouse_loader.formats import check_warehouse

        check_before_session(config)
        check_warehouse(config)
    if config.sources:
        for name, stats in run_capture(config, (), until_caught_up=True, holder_wait=wait, observe=on_capture).items():
            summary.lines.append(f"capture {name}: {stats.events} events, acknowledged {stats.acked}")
            say(summary.lines[-1])
    if not config.feeds and not config.warehouse.tables:
        return run_sinks_until_caught_up(config, say, summary)
    from spark_log.job import spark_job

    with (
        holding(config, "feed", tuple(config.feeds), wait),
        holding(config, "load", tuple(config.warehouse.tables), wait),
        spark_job(config, "headwater-run") as (spark, log),
    ):
        if config.feeds:
            from derived_feeds.feed_job import run_feeds

            for query, plan in run_feeds(spark, config, log, (), available_now=True):
                if on_query is not None:
                    on_query("feeds", plan.spec.name, query, feed_records_written(plan.stats))
            summary.lines.append(f"feeds: {', '.join(config.feeds)} caught up")
            say(summary.lines[-1])
        if config.warehouse.tables:
            from warehouse_loader.load_job import run_loads

            queries = run_loads(spark, config, log, (), available_now=True)
            for name, query in zip(config.warehouse.tables, queries, strict=True):
                if on_query is not None:
                    on_query("load", name, query, None)
            summary.lines.append(f"warehouse: {', '.join(config.warehouse.tables)} loaded")
            say(summary.lines[-1])
    return run_sinks_until_caught_up(config, say, summary)


def run_sinks_until_caught_up(config: ProjectConfig, say: Callable[[str], None], summary: RunSummary) -> RunSummary:
    """Every sink until caught up (a feed read by its current topic), after the stages that write their topics."""
    if not config.sinks:
        return summary
    from sinks.runner import run_sinks
    from spark_log.versions import resolve_topic

    for stats in run_sinks(config, (), follow=False, resolve_name=lambda name: resolve_topic(config, name), say=say):
        summary.lines.append(f"sink {stats.sink}: {stats.delivered} delivered, {stats.dead_lettered} dead-lettered")
        say(summary.lines[-1])
    return summary


def wait_for_captured_inputs(
    config: ProjectConfig, feeds: Sequence[str], say: Callable[[str], None], *, poll_s: float = 1.0
) -> None:
    """Wait until the raw topics ``feeds`` read exist, when a configured source will write them.

    A ``--follow`` feed started with its capture (``run --follow`` on a fresh project) would
    otherwise stop at once on a topic capture has not created yet. A topic no source of this
    project writes is left to the feed's own check, which names it.
    """
    from derived_feeds.feed_spec import feed_spec
    from log.factory import open_log

    wanted = {
        topic
        for name in feeds or tuple(config.feeds)
        for topic in feed_spec(config, name).input_topics
        if topic.split(".", 1)[0] in config.sources and topic not in config.feeds
    }
    said = False
    while True:
        log = open_log(config)
        try:
            missing = sorted(wanted - set(log.list_topics()))
        finally:
            log.close()
        if not missing:
            return
        if not said:
            say(f"waiting for topic {missing[0]}: its capture has not written it yet")
            said = True
        time.sleep(poll_s)


def feed_records_written(stats: dict[str, int]) -> Callable[[], int]:
    """The records a feed run has written so far (upserts and deletes), read from its live counters."""
    return lambda: stats["upserts"] + stats["deletes"]


def _headwater(config_path: Path) -> list[str]:
    return [sys.executable, "-m", "headwater", "--config", str(config_path)]


def cleaner_stage(config_path: Path, options: Sequence[str] = ()) -> Stage:
    """The log's background cleaner as a supervised child (see the module docstring)."""
    return Stage("cleaner", [*_headwater(config_path), "log", "clean", "--follow", *options])


def follow_stages(config: ProjectConfig, config_path: Path, options: Sequence[str] = ()) -> list[Stage]:
    """The child processes of ``run --follow``, upstream first, table maintenance and the cleaner last.

    ``options`` (``--log-format``) are passed to each, the cleaner included.
    """
    base = _headwater(config_path)
    stages = []
    if config.sources:
        stages.append(Stage("capture", [*base, "capture", "--follow", "--no-cleaner", *options]))
    if config.feeds:
        stages.append(Stage("feeds", [*base, "feeds", "run", "--follow", *options]))
    if config.warehouse.tables:
        stages.append(Stage("load", [*base, "load", "--follow", *options]))
    if any(config.warehouse.maintenance_of(name).enabled for name in config.warehouse.tables):
        stages.append(Stage("maintain", [*base, "maintain", "--follow", *options]))
    if config.sinks:
        stages.append(Stage("sinks", [*base, "sinks", "run", "--follow", *options]))
    stages.append(cleaner_stage(config_path, options))
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

    def __init__(self, config_path: Path, say: Callable[[str], None], options: Sequence[str] = ()) -> None:
        # The supervisor runs in a thread of its own; its child still dies with this process
        # (Supervisor arms the parent-death signal from that thread, which ends only after it).
        self._supervisor = Supervisor([cleaner_stage(config_path, options)], say)
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
        self._stop = stop_request.SignalSafeEvent()

    def stop(self) -> None:
        """Ask every stage to finish its current batch and exit."""
        self._stop.set()

    def run(self) -> int:
        """Supervise until :meth:`stop`; return 0 when every child exited cleanly.

        Returns (or raises) only after every child it started has exited.
        """
        try:
            self._supervise()
        except BaseException:
            self._shutdown()
            raise
        return self._shutdown()

    def _supervise(self) -> None:
        for stage in self.stages:
            if self._stop.is_set():  # a stop asked while the stages start: start no more
                return
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
                stage.restarts_total += 1
                stage.process = None
                next_start[stage.name] = time.monotonic() + delay
                self._say(f"{stage.name} exited with code {code} after {lived:.1f}s; restarting in {delay:.0f}s")
            if all(stage.failed for stage in self.stages):
                break

    def _start(self, stage: Stage) -> None:
        # Own process group: a terminal's Ctrl-C reaches only the supervisor, which then
        # stops the children with SIGINT (each finishes its current batch). A supervisor that
        # is SIGKILLed runs no cleanup: the kernel SIGKILLs the children then (every stage
        # resumes from what is durable), and each child's Spark JVM dies with it.
        # A prctl call only, safe between fork and exec (core.process_lifetime). Armed from any
        # thread: the thread running :meth:`run` ends only after every child it started.
        # SIGINT sent while a child's interpreter is still starting stays pending until its first
        # line listens (core.stop_request): a stop at any moment is a clean exit 0.
        preexec = parent_death_preexec(thread_outlives_child=True, then=stop_request.held_until_listening)
        stage.process = subprocess.Popen(stage.argv, start_new_session=True, preexec_fn=preexec)  # noqa: PLW1509
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
