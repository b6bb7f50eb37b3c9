"""What ``/metrics`` shows about the pipeline: gauges read at scrape time, counters fed by the stages.

:class:`PipelineCollector` reads, at each scrape, what only the log and the source know:
capture lag (WAL bytes the slot has not confirmed, seconds behind from
``pg_stat_replication``; a MySQL source's binlog bytes past its saved position, across files,
and the binlog the server keeps before it, from its kind's ``status``), WAL each slot retains,
records and seconds each feed and load is behind (its consumer group against its input's end),
quarantined records per topic, and the size of every topic (file log) and warehouse table. A
source that cannot be reached (server down, password variable unset) is ``headwater_source_up 0``;
the rest is still shown.

:class:`CaptureRecorder` and :class:`SparkRecorder` copy a running stage's own counters
(capture statistics, Spark's progress per micro-batch) into :mod:`core.metrics` once a second.

Stage libraries (psycopg, deltalake) are imported inside the functions that need them.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from core import metrics
from core.config import ProjectConfig, unset_variables
from core.errors import HeadwaterError
from log.base import Log, end_offsets
from log.cleaner import CleanedTopic, ReportsUsage
from log.factory import open_log
from log.topics import is_quarantine_topic, load_group, sink_group

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from capture.stats import CaptureStats
    from warehouse_loader.maintenance import Done

#: Seconds a scrape waits for a source's server.
_CONNECT_TIMEOUT_S = 3


@dataclass(frozen=True)
class Scope:
    """Which stages an endpoint reports on (a single-stage command reports its own)."""

    sources: tuple[str, ...] = ()
    feeds: tuple[str, ...] = ()
    tables: tuple[str, ...] = ()
    sinks: tuple[str, ...] = ()
    #: Sizes of every topic, not only those of ``sources`` and ``feeds`` (the log's cleaner).
    every_topic: bool = False

    @classmethod
    def everything(cls, config: ProjectConfig) -> Scope:
        """Every source, feed and table of the project (``headwater run``)."""
        return cls(tuple(config.sources), tuple(config.feeds), tuple(config.warehouse.tables), tuple(config.sinks))


class PipelineCollector(Collector):
    """Gauges of the pipeline in ``scope``, read from the log and the sources at each scrape."""

    def __init__(
        self, config: ProjectConfig, scope: Scope, extra: Callable[[], Iterator[Metric]] | None = None
    ) -> None:
        self._config = config
        self._scope = scope
        self._extra = extra
        self._lock = threading.Lock()
        self._log: Log | None = None

    def collect(self) -> Iterator[Metric]:
        """Every gauge, fresh (one scrape at a time)."""
        with self._lock:
            yield from self._sources()
            try:
                log = self._open_log()
                yield from self._log_metrics(log)
            except HeadwaterError:
                self._close_log()
            if self._extra is not None:
                yield from self._extra()

    def _open_log(self) -> Log:
        if self._log is None:
            self._log = open_log(self._config)
        return self._log

    def _close_log(self) -> None:
        if self._log is not None:
            with contextlib.suppress(Exception):
                self._log.close()
            self._log = None

    def _sources(self) -> Iterator[Metric]:
        if not self._scope.sources:
            return
        up = GaugeMetricFamily(
            "headwater_source_up", "1 when the source's server answered this scrape.", labels=["source"]
        )
        lag_bytes = GaugeMetricFamily(
            "headwater_capture_lag_bytes",
            "Source log bytes capture has not stored: WAL from the slot's confirmed flush LSN to the server's WAL "
            "end (PostgreSQL); binlog from the saved position to the server's end, across files (MySQL).",
            labels=["source"],
        )
        lag_seconds = GaugeMetricFamily(
            "headwater_capture_lag_seconds",
            "Seconds capture is behind, 0 when nothing is unconfirmed: its walsender's flush_lag (PostgreSQL); "
            "since the last captured commit, an upper bound (MySQL).",
            labels=["source"],
        )
        last_commit = GaugeMetricFamily(
            "headwater_capture_last_commit_timestamp_seconds",
            "Binlog time of the last source transaction capture stored (Unix time, the server's clock; MySQL).",
            labels=["source"],
        )
        headroom = GaugeMetricFamily(
            "headwater_binlog_headroom_bytes",
            "Binlog bytes the server keeps in files older than the saved position's, purged before it (MySQL); "
            "0 outside the current file: the next purge loses changes not captured yet.",
            labels=["source"],
        )
        purged = GaugeMetricFamily(
            "headwater_binlog_position_purged",
            "1 when the server no longer has the binlog file capture resumes from (MySQL: source resync).",
            labels=["source"],
        )
        retained = GaugeMetricFamily(
            "headwater_slot_wal_retained_bytes", "WAL the source's slot keeps on the server.", labels=["source", "slot"]
        )
        active = GaugeMetricFamily(
            "headwater_slot_active", "1 when a capture streams from the slot.", labels=["source"]
        )
        for name in self._scope.sources:
            row = source_gauges(self._config, name)
            up.add_metric([name], 1.0 if row is not None else 0.0)
            if row is None:
                continue
            if row.get("lag_bytes") is not None:
                lag_bytes.add_metric([name], float(row["lag_bytes"]))
            if row.get("lag_seconds") is not None:
                lag_seconds.add_metric([name], float(row["lag_seconds"]))
            if "slot" in row:
                retained.add_metric([name, row["slot"]], row["wal_retained_bytes"])
                active.add_metric([name], 1.0 if row["active"] else 0.0)
            if row.get("commit_ts") is not None:
                last_commit.add_metric([name], float(row["commit_ts"]))
            if "binlog_status" in row:
                headroom.add_metric([name], float(row["binlog_headroom_bytes"]))
                purged.add_metric([name], 1.0 if row["binlog_status"] == "purged" else 0.0)
        yield from (up, lag_bytes, lag_seconds, retained, active, last_commit, headroom, purged)

    def _log_metrics(self, log: Log) -> Iterator[Metric]:
        from derived_feeds.feed_spec import feed_spec
        from warehouse_loader.load_job import load_identity

        topics = set(log.list_topics())
        lag_records = GaugeMetricFamily(
            "headwater_lag_records", "Input records a feed or load has not committed past.", labels=["stage", "name"]
        )
        lag_seconds = GaugeMetricFamily(
            "headwater_lag_seconds",
            "Age of the oldest input record a feed or load has not processed.",
            labels=["stage", "name"],
        )
        for name in self._scope.feeds:
            spec = feed_spec(self._config, name)
            behind = [consumer_lag(log, spec.group, topic) for topic in spec.input_topics if topic in topics]
            lag_records.add_metric(["feeds", name], sum(b[0] for b in behind))
            lag_seconds.add_metric(["feeds", name], max((b[1] for b in behind), default=0.0))
        for name in self._scope.tables:
            build, topic = load_identity(self._config, name)
            records, seconds = consumer_lag(log, load_group(build), topic) if topic in topics else (0, 0.0)
            lag_records.add_metric(["load", name], records)
            lag_seconds.add_metric(["load", name], seconds)
        yield from self._sink_metrics(log, lag_records, lag_seconds)
        yield lag_records
        yield lag_seconds
        quarantined = CounterMetricFamily(
            "headwater_quarantined_records", "Records in a quarantine topic (never compacted).", labels=["topic"]
        )
        sizes = GaugeMetricFamily("headwater_log_topic_size_bytes", "Bytes a topic holds (file log).", labels=["topic"])
        dirty = GaugeMetricFamily(
            "headwater_log_topic_dirty_ratio",
            "Closed segment bytes not yet compacted over all closed segment bytes (file log; the cleaner's backlog).",
            labels=["topic"],
        )
        for topic in sorted(topics):
            if not self._in_scope(topic):
                continue
            if is_quarantine_topic(topic):
                quarantined.add_metric([topic], sum(end_offsets(log, topic).values()))
            size = topic_size(log, topic)
            if size is not None:
                sizes.add_metric([topic], size)
            if isinstance(log, ReportsUsage):
                dirty.add_metric([topic], log.usage(topic).dirty_ratio)
        yield quarantined
        yield sizes
        yield dirty
        yield from table_gauges(self._config, self._scope.tables)

    def _sink_metrics(
        self, log: Log, lag_records: GaugeMetricFamily, lag_seconds: GaugeMetricFamily
    ) -> Iterator[Metric]:
        """Each sink's lag (stage ``sink``) and whether it is blocked on its target."""
        if not self._scope.sinks:
            return
        from sinks.state import BLOCKED, read_state
        from sinks.status import sink_topics
        from spark_log.versions import resolve_topic

        blocked = GaugeMetricFamily(
            "headwater_sink_blocked", "1 while a sink retries a target that is down or refusing.", labels=["sink"]
        )
        for name in self._scope.sinks:
            topics = sink_topics(self._config, log, name, lambda feed: resolve_topic(self._config, feed))
            behind = [consumer_lag(log, sink_group(name), topic) for topic in topics]
            lag_records.add_metric(["sink", name], sum(b[0] for b in behind))
            lag_seconds.add_metric(["sink", name], max((b[1] for b in behind), default=0.0))
            blocked.add_metric([name], 1.0 if read_state(self._config, name)["state"] == BLOCKED else 0.0)
        yield blocked

    def _in_scope(self, topic: str) -> bool:
        if self._scope.every_topic:
            return True
        base = topic.removesuffix(".quarantine")
        return any(base.startswith(f"{s}.") for s in self._scope.sources) or any(
            base == f or base.startswith(f"{f}.") for f in self._scope.feeds
        )


def source_gauges(config: ProjectConfig, name: str) -> dict[str, Any] | None:
    """Lag gauges of source ``name``; None when it cannot be reached now.

    PostgreSQL: the slot's lag, activity and retained WAL. Another kind: its ``status`` row
    (:meth:`capture.source_kind.SourceKind.status`; MySQL: ``lag_bytes``, ``lag_seconds``, the binlog's
    headroom and whether the position is purged) when its server answered, plus ``commit_ts``.
    """
    import psycopg

    source = config.sources[name]
    dsn = source.dsn.get_secret_value()
    if unset_variables(dsn):
        return None
    if source.kind != "postgres":
        return _kind_gauges(config, name)
    slot = source.slot or f"headwater_{name}"
    try:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=_CONNECT_TIMEOUT_S) as conn:
            row = conn.execute(
                "SELECT s.active, coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), s.confirmed_flush_lsn), 0)::float8, "
                "coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), s.restart_lsn), 0)::float8, "
                "coalesce(extract(epoch FROM r.flush_lag), 0)::float8 "
                "FROM pg_replication_slots s LEFT JOIN pg_stat_replication r ON r.pid = s.active_pid "
                "WHERE s.slot_name = %s",
                (slot,),
            ).fetchone()
    except psycopg.Error:
        return None
    if row is None:
        return {"slot": slot, "active": False, "lag_bytes": 0.0, "wal_retained_bytes": 0.0, "lag_seconds": 0.0}
    # flush_lag is the latency of the last acknowledged WAL (it stays > 0 while heartbeats flow):
    # behind is only what is not yet confirmed.
    lag_seconds = row[3] if row[1] > 0 else 0.0
    return {
        "slot": slot,
        "active": row[0],
        "lag_bytes": row[1],
        "wal_retained_bytes": row[2],
        "lag_seconds": lag_seconds,
    }


def _kind_gauges(config: ProjectConfig, name: str) -> dict[str, Any] | None:
    """Source ``name``'s status row from its kind; None when the kind cannot log in (or read its status) now."""
    from capture.kinds import kind_of

    try:
        kind = kind_of(config, name)
        kind.check(config, name)
        row = kind.status(config, name)
    except HeadwaterError:
        return None
    if "error" in row:
        return None
    if row.get("last_commit"):
        row["commit_ts"] = dt.datetime.fromisoformat(str(row["last_commit"]).replace("Z", "+00:00")).timestamp()
    return row


def consumer_lag(log: Log, group: str, topic: str, now_s: float | None = None) -> tuple[int, float]:
    """Records ``group`` has not committed past in ``topic``, and the age in seconds of the oldest of them."""
    now_s = time.time() if now_s is None else now_s
    committed = log.committed(group, topic)
    behind = 0
    oldest = 0.0
    for partition, end in end_offsets(log, topic).items():
        start = committed.get(partition, log.beginning_offset(topic, partition))
        if start >= end:
            continue
        behind += end - start
        first = log.read(topic, partition, start, max_records=1)
        if first:
            oldest = max(oldest, now_s - first[0].timestamp_ms / 1000)
    return behind, max(oldest, 0.0)


def topic_size(log: Log, topic: str) -> int | None:
    """Bytes of ``topic``'s files (file log: ``<root>/<topic>/``); None for other backends."""
    root = getattr(log, "root", None)
    if root is None:
        return None
    directory = root / topic
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file()) if directory.is_dir() else 0


def table_gauges(config: ProjectConfig, names: Sequence[str]) -> Iterator[Metric]:
    """Size and shape of tables ``names``: bytes, files, dirty ratio, log since checkpoint, last compaction."""
    from operations.maintain import maintenance_status

    families = {
        "bytes": GaugeMetricFamily(
            "headwater_warehouse_table_size_bytes", "Bytes of a warehouse table's current files.", labels=["table"]
        ),
        "files": GaugeMetricFamily(
            "headwater_warehouse_table_files", "Data files of a warehouse table's current version.", labels=["table"]
        ),
        "dirty_ratio": GaugeMetricFamily(
            "headwater_warehouse_table_dirty_ratio",
            "Share of a warehouse table's bytes in small files (what compaction would rewrite).",
            labels=["table"],
        ),
        "commits_since_checkpoint": GaugeMetricFamily(
            "headwater_warehouse_table_commits_since_checkpoint",
            "Log entries a reader replays after the newest checkpoint (Iceberg: manifests a rewrite would remove).",
            labels=["table"],
        ),
        "last_compaction": GaugeMetricFamily(
            "headwater_warehouse_table_last_compaction_timestamp_seconds",
            "When maintenance last compacted a warehouse table (Unix time).",
            labels=["table"],
        ),
    }
    for name in names:
        shape = maintenance_status(config, name)
        for key, family in families.items():
            value = shape.get(key)
            if key == "last_compaction" and isinstance(value, str):
                value = dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
            if value is not None:
                family.add_metric([name], float(value))
    yield from families.values()


def record_maintenance(done: Done) -> None:
    """Count what one maintenance pass did to a table (``headwater_maintenance_*``)."""
    table = done.table
    if done.compacted_files:
        metrics.MAINTENANCE_TASKS.labels(table, "compaction").inc()
        metrics.MAINTENANCE_REWRITTEN_BYTES.labels(table).inc(done.rewritten_bytes)
    if done.checkpointed:
        metrics.MAINTENANCE_TASKS.labels(table, "checkpoint").inc()
    if done.vacuumed_files or done.expired_log_entries:
        metrics.MAINTENANCE_TASKS.labels(table, "vacuum").inc()
        metrics.MAINTENANCE_FREED_BYTES.labels(table).inc(done.vacuumed_bytes)


class _Poller:
    """A daemon thread calling ``tick`` every ``interval_s`` until stopped (and once more at the stop)."""

    def __init__(self, name: str, interval_s: float = 1.0) -> None:
        self._stop = threading.Event()
        self._interval_s = interval_s
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        """Start ticking."""
        self._thread.start()

    def stop(self) -> None:
        """Stop, after a last tick."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            with contextlib.suppress(Exception):  # a metric is never worth a stage
                self.tick()
        with contextlib.suppress(Exception):
            self.tick()

    def tick(self) -> None:
        """Copy what changed since the last tick."""
        raise NotImplementedError


class CaptureRecorder(_Poller):
    """Copies each agent's :class:`~capture.stats.CaptureStats` into the capture counters."""

    def __init__(self) -> None:
        super().__init__("capture-metrics")
        self._stats: dict[str, CaptureStats] = {}
        self._seen: dict[str, tuple[int, int, int, int]] = {}

    def observe(self, source: str, stats: CaptureStats) -> None:
        """Follow ``stats`` of ``source`` (the :func:`capture.runner.run_capture` ``observe`` hook)."""
        self._stats[source] = stats
        self._seen.setdefault(source, (0, 0, 0, 0))

    def tick(self) -> None:
        """Add what each agent counted since the last tick."""
        for source, stats in list(self._stats.items()):
            now = (stats.events, stats.transactions, stats.records_written, stats.reconnects)
            before = self._seen[source]
            for counter, new, old in zip(
                (
                    metrics.CAPTURE_EVENTS,
                    metrics.CAPTURE_TRANSACTIONS,
                    metrics.CAPTURE_RECORDS,
                    metrics.CAPTURE_RECONNECTS,
                ),
                now,
                before,
                strict=True,
            ):
                if new > old:
                    counter.labels(source).inc(new - old)
            self._seen[source] = now


@dataclass
class _Query:
    stage: str
    name: str
    query: Any
    written: Callable[[], int] | None
    last_batch: int = -1
    last_written: int = 0


@dataclass
class SparkRecorder(_Poller):
    """Copies each streaming query's progress (rows, batch durations) into the stage counters."""

    queries: list[_Query] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__init__("spark-metrics")

    def follow(self, stage: str, name: str, query: Any, written: Callable[[], int] | None = None) -> None:
        """Follow ``query`` of ``stage`` (``feeds``/``load``) for ``name``; ``written`` counts its output records."""
        self.queries.append(_Query(stage, name, query, written))

    def tick(self) -> None:
        """Record the micro-batches each query finished since the last tick."""
        for item in self.queries:
            last = item.query.lastProgress
            if last is None or int(last.get("batchId", -1)) <= item.last_batch:
                progresses = []
            elif int(last["batchId"]) == item.last_batch + 1:
                progresses = [last]
            else:  # several batches since the last tick: Spark keeps the recent ones
                progresses = item.query.recentProgress or []
            for data in progresses:
                batch = int(data.get("batchId", -1))
                if batch <= item.last_batch:
                    continue
                item.last_batch = batch
                rows = int(data.get("numInputRows", 0))
                labels = (item.stage, item.name)
                metrics.STAGE_EVENTS.labels(*labels).inc(rows)
                metrics.STAGE_BATCHES.labels(*labels).inc()
                duration = (data.get("durationMs") or {}).get("triggerExecution")
                if duration is not None:
                    metrics.BATCH_DURATION.labels(*labels).observe(duration / 1000)
                if item.written is None:
                    metrics.STAGE_RECORDS.labels(*labels).inc(rows)
            if item.written is not None:
                written = item.written()
                if written > item.last_written:
                    metrics.STAGE_RECORDS.labels(item.stage, item.name).inc(written - item.last_written)
                    item.last_written = written


def record_cleaning(done: CleanedTopic) -> None:
    """Count what one look of the log's cleaner at a topic did (``headwater_cleaner_*``)."""
    topic = done.topic
    if done.configs_changed:
        metrics.CLEANER_CONFIG_CHANGES.labels(topic).inc()
    result = done.result
    if result is None:
        return
    metrics.CLEANER_PASSES.labels(topic).inc()
    metrics.CLEANER_PASS_DURATION.labels(topic).observe(done.seconds)
    metrics.CLEANER_RECORDS_REMOVED.labels(topic).inc(max(result.records_before - result.records_after, 0))
    metrics.CLEANER_BYTES_REMOVED.labels(topic).inc(max(result.bytes_before - result.bytes_after, 0))


def stage_restarts(restarts: Callable[[], Sequence[tuple[str, int]]]) -> Callable[[], Iterator[Metric]]:
    """A metric source for :class:`PipelineCollector`: ``headwater_stage_restarts_total`` from the supervisor."""

    def collect() -> Iterator[Metric]:
        family = CounterMetricFamily(
            "headwater_stage_restarts", "Stage processes restarted after a crash.", labels=["stage"]
        )
        for stage, count in restarts():
            family.add_metric([stage], count)
        yield family

    return collect
