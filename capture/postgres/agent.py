"""The capture agent: one source's replication stream into the log, nothing lost or doubled.

Loop: frames → pgoutput messages → committed transactions → events → one atomic
append per (topic, partition) → acknowledge the transaction's end LSN to Postgres.
The agent coordinates; each step has its own collaborator:

* :class:`capture.postgres.streaming.slot_policy.SlotPolicy`: the slot, and the snapshot (or resync) its mode
  asks for, before streaming starts (:class:`capture.postgres.snapshot.reader.SnapshotReader`).
* :class:`capture.postgres.streaming.session.Streaming`: one replication session at a time.
* :class:`capture.appender.Appender`: pending records → the log, then the acknowledgement.

Resume points and invariants:

* The flush LSN reported to Postgres is the end LSN of the last transaction whose
  events were all appended (fsynced), so a restart resumes at or before it.
* On restart, :class:`capture.position.ResumePoint` skips events the log already
  holds, so a transaction re-sent after a crash between two appends is written once.
* ``--until-caught-up`` emits a non-transactional marker message at start
  (:mod:`capture.postgres.streaming.markers`: prefix ``headwater``, which other consumers of the database can
  filter); receiving it means every transaction committed before start has been received
  (and the run goes on until the incremental snapshots queued by then are done, unless
  they are paused).
* The source's settings are checked against the database before the slot is read
  (:mod:`capture.postgres.registration.source_settings`), so a setting refused loses nothing.
* Incremental snapshots (:mod:`capture.postgres.snapshot.incremental`) read chunks between
  watermark messages; their rows join the pending records at the HIGH watermark's
  transaction, and their progress is saved only after an append.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import psycopg
from psycopg import sql

from capture.appender import Appender
from capture.collector import restore_collections, space_young_collections
from capture.errors import PrerequisiteError
from capture.position import ResumePoint
from capture.postgres.catalog import primary_key_lookup, relation_from_catalog
from capture.postgres.catalog_state import read_tables
from capture.postgres.events.builder import EventBuilder
from capture.postgres.events.previous_images import LogImages
from capture.postgres.events.relations import RowDecoderFactory
from capture.postgres.identifiers import parse_tables
from capture.postgres.registration.prerequisites import standby_refusal
from capture.postgres.registration.registry import connect
from capture.postgres.registration.slot import in_recovery
from capture.postgres.registration.source_settings import check_source_settings
from capture.postgres.snapshot.incremental import IncrementalSnapshotter
from capture.postgres.snapshot.reader import SnapshotReader
from capture.postgres.streaming.connection import ReplicationLostError, StreamOptions, pinned_options
from capture.postgres.streaming.markers import CAUGHT_UP
from capture.postgres.streaming.schema_watch import SchemaWatch
from capture.postgres.streaming.session import StreamedSettings, Streaming, write_marker
from capture.postgres.streaming.signals import SignalTable
from capture.postgres.streaming.slot_policy import SlotPolicy
from capture.retry_report import RetryReport
from capture.source_kind import SnapshotProgress
from capture.source_topics import SourceTopics
from capture.spill import SPILL_DIRECTORY
from capture.stats import CaptureStats
from core.log_config import LogConfig
from core.source_config import SourceConfig
from core.stop_request import SignalSafeEvent
from log.base import Log
from log.sequence import Lsn
from log.table_schemas import schema_histories, schema_key


@dataclass(frozen=True)
class AgentSettings:
    """Batching and timing of the agent loop."""

    max_batch_records: int = 20_000
    poll_timeout_s: float = 0.2
    reconnect_backoff_s: tuple[float, ...] = (0.2, 0.5, 1.0, 2.0, 5.0)
    #: How often appends (and spill writes) are retried while the disk is full.
    log_retry_s: float = 1.0


class CaptureAgent:
    """Streams one registered source into the log (see the module docstring)."""

    def __init__(
        self,
        name: str,
        source: SourceConfig,
        log: Log,
        log_config: LogConfig,
        decoder_for: Callable[[psycopg.Connection[Any]], RowDecoderFactory],
        *,
        state_dir: Path,
        settings: AgentSettings | None = None,
        progress: SnapshotProgress | None = None,
    ) -> None:
        self.name = name
        self.state_dir = state_dir
        self.source = source
        self.log = log
        self.settings = settings = settings or AgentSettings()
        self.stats = CaptureStats(Lsn(0))
        self._make_decoder_factory = decoder_for
        self._stop = SignalSafeEvent()
        self._dsn = source.dsn.get_secret_value()
        self.slot = source.slot or f"headwater_{name}"
        self.publication = source.publication or f"headwater_{name}"
        incremental = IncrementalSnapshotter(state_dir, self.publication, filters=source.filters, log=log)
        self._retry = RetryReport(name)
        self._topics = SourceTopics(log, log_config, name)
        self._appender = Appender(
            name,
            log,
            self._topics,
            self.stats,
            self._stop,
            retry_s=settings.log_retry_s,
            on_flushed=self._flushed,
        )
        snapshot = SnapshotReader(
            name,
            self._dsn,
            self.publication,
            state_dir,
            self._appender,
            max_batch_records=settings.max_batch_records,
            progress=progress,
            table_order=parse_tables(source.tables or ()),
            filters=source.filters,
            captured=(source.tables or (), source.schemas or ()),
        )
        self._slot_policy = SlotPolicy(
            name, source, self.slot, self._dsn, state_dir, snapshot=snapshot, stats=self.stats
        )
        self._streaming = Streaming(
            self._dsn,
            StreamOptions(self.slot, self.publication),
            self._appender,
            incremental,
            retry=self._retry,
            stop=self._stop,
            max_batch_records=settings.max_batch_records,
            poll_timeout_s=settings.poll_timeout_s,
            heartbeat_interval_s=source.heartbeat_interval_s,
            schema_watch=SchemaWatch(name, self.publication, read_new_tables=source.snapshot != "never"),
            settings=StreamedSettings(
                skipped_operations=source.skipped_operations,
                transactions=source.transactions,
                signals=None
                if source.signal_table is None
                else SignalTable(name, source.signal_table, self.publication, source.filters),
                spill_dir=state_dir / SPILL_DIRECTORY,
                spill_threshold_bytes=source.spill_threshold_bytes,
                spill_retry_s=settings.log_retry_s,
            ),
        )

    @property
    def incremental(self) -> IncrementalSnapshotter:
        """The incremental snapshots of this source (replaceable before :meth:`run`, as tests do)."""
        return self._streaming.incremental

    @incremental.setter
    def incremental(self, snapshotter: IncrementalSnapshotter) -> None:
        self._streaming.incremental = snapshotter

    def _flushed(self) -> None:
        # Looked up at each flush: the snapshotter (or its flushed, as tests do) may be replaced.
        self.incremental.flushed()

    def stop(self) -> None:
        """Ask the loop to finish the current batch, acknowledge it and return."""
        self._stop.set()

    def install_signal_handlers(self) -> None:
        """SIGINT/SIGTERM stop the agent cleanly (current batch appended and acknowledged)."""

        def handle(_signum: int, _frame: FrameType | None) -> None:
            self.stop()

        signal.signal(signal.SIGINT, handle)
        signal.signal(signal.SIGTERM, handle)

    def run(self, *, until_caught_up: bool) -> CaptureStats:
        """Stream until stopped, or until everything committed before the call is in the log.

        A lost connection (walsender ended, server restarting) is retried with backoff;
        a slot that is gone ends the run with :class:`SlotGoneError`.
        """
        try:
            sql_conn = self._connect_sql()
        except (ReplicationLostError, psycopg.ProgrammingError):
            # Never connected: a bad DSN, password or host is an operator's error, not a lost
            # connection. Say which in the words `source add` uses (one line, password masked).
            connect(self._dsn, source=self.name).close()
            raise
        collector = space_young_collections()
        try:
            check_source_settings(sql_conn, self.name, self.source, self.publication, state_dir=self.state_dir)
            builder = self._new_builder(sql_conn)
            resume = ResumePoint.load(self.log, self._topics.of_source())
            if not self._slot_policy.prepare(sql_conn, builder, resume):
                return self.stats
            if self._slot_policy.snapshotted:
                # A snapshot (or resync) wrote each table's current schema: the catalog check below
                # compares with those, not with the schemas before it (a keyless table changed before
                # a resync would otherwise ask for a re-read the snapshot already did).
                builder = self._new_builder(sql_conn)
            # DDL committed before now that no change announces is marked in the stream before the
            # caught-up marker, so a run that ends there has followed it (capture.postgres.streaming.schema_watch).
            self._streaming.check_schemas(sql_conn, builder)
            marker = (
                write_marker(sql_conn, CAUGHT_UP, slot=self.slot, dsn=self._dsn, token="") if until_caught_up else None
            )
            failures = 0
            reconnect = False
            while not self._stop.is_set():
                acked_before = self.stats.acked
                try:
                    if reconnect:
                        sql_conn = self._reconnect_sql(sql_conn)
                        self._slot_policy.check(sql_conn, resume)
                        builder = self._new_builder(sql_conn)
                        resume = ResumePoint.load(self.log, self._topics.of_source())
                        reconnect = False
                    if self._streaming.session(sql_conn, builder, resume, marker):
                        break
                except ReplicationLostError as exc:
                    # Resume point: everything acknowledged is in the log, and the slot re-sends
                    # from the acknowledged LSN. What was pending is dropped and rebuilt from the
                    # re-sent WAL by a fresh builder (its schema and TOAST caches may be ahead of
                    # the log), and ResumePoint skips whatever did reach the log.
                    failures = 0 if self.stats.acked > acked_before else failures + 1
                    backoff = self.settings.reconnect_backoff_s
                    delay = backoff[min(max(failures - 1, 0), len(backoff) - 1)]
                    self.stats.reconnects += 1
                    self._retry.failed(str(exc), backoff[-1])
                    self._appender.clear()
                    self.incremental.reset()
                    self._streaming.schema_watch.reset()
                    reconnect = True
                    if self._stop.wait(delay):
                        break
            return self.stats
        finally:
            restore_collections(collector)
            sql_conn.close()

    def _new_builder(self, sql_conn: psycopg.Connection[Any]) -> EventBuilder:
        """An event builder with the schemas already published to the log."""
        try:
            builder = EventBuilder(
                self.name,
                str(sql_conn.info.dbname),
                self._make_decoder_factory(sql_conn),
                columns=self.source.columns,
                primary_key=primary_key_lookup(sql_conn),
                configured_keys=self.source.keys,
                previous_image=LogImages(self.log, self._topics.partitions),
                binary_handling_mode=self.source.types.binary_handling_mode,
                catalog=lambda oid: read_tables(sql_conn, [oid]).get(oid),
            )
            self._seed_schemas(builder, sql_conn)
        except psycopg.OperationalError as exc:
            raise ReplicationLostError.from_psycopg(exc, slot=self.slot, dsn=self._dsn) from None
        return builder

    def _seed_schemas(self, builder: EventBuilder, sql_conn: psycopg.Connection[Any]) -> None:
        """Seed the builder with the schemas already published; re-record those without a key.

        Schema records written before keys were recorded do not say the key of a REPLICA
        IDENTITY FULL table (:func:`log.table_schemas.schema_key`): each such table's schema
        is recorded again now, from the catalog, so loads find its key without waiting for
        its next change.
        """
        for topic, versions in schema_histories(self.log, prefix=f"{self.name}.").items():
            value = max(versions, key=lambda record: int(record.get("version", 0)))
            names = sorted({str(c["name"]) for record in versions for c in record.get("columns", ())})
            builder.known_schema(topic, value, names_seen=names)
            if schema_key(value) is not None:
                continue
            qualified = ".".join(sql.Identifier(part).as_string(sql_conn) for part in (value["schema"], value["table"]))
            try:
                relation = relation_from_catalog(sql_conn, qualified)
            except (ValueError, psycopg.errors.UndefinedTable):
                continue  # the table is gone: its topic keeps the old record
            record = builder.relation(relation)
            if record is not None:
                self._appender.schemas.append(record)

    def _connect_sql(self) -> psycopg.Connection[Any]:
        try:
            conn = psycopg.connect(self._dsn, autocommit=True, options=pinned_options(), connect_timeout=10)
            standby = in_recovery(conn)
        except psycopg.OperationalError as exc:
            raise ReplicationLostError.from_psycopg(exc, slot=self.slot, dsn=self._dsn) from None
        if standby:
            database = str(conn.info.dbname)
            conn.close()
            raise PrerequisiteError(standby_refusal(database), source=self.name)
        return conn

    def _reconnect_sql(self, conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
        if not conn.closed and not conn.broken:
            return conn
        conn.close()
        return self._connect_sql()
