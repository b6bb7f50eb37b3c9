"""The capture agent: one source's replication stream into the log, nothing lost or doubled.

Loop: frames → pgoutput messages → committed transactions → events → one atomic
append per (topic, partition) → acknowledge the transaction's end LSN to Postgres.

Resume points and invariants:

* The flush LSN reported to Postgres is the end LSN of the last transaction whose
  events were all appended (fsynced), so a restart resumes at or before it.
* On restart, :class:`capture.position.ResumePoint` skips events the log already
  holds, so a transaction re-sent after a crash between two appends is written once.
* ``--until-caught-up`` emits a non-transactional marker message at start; receiving
  it means every transaction committed before start has been received.
"""

from __future__ import annotations

import logging
import secrets
import signal
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import psycopg

from capture.events import INTERNAL_MESSAGE_PREFIX, EventBuilder, OutRecord, RowDecoderFactory, SchemaRecord
from capture.pgoutput import LogicalMessage, PgoutputDecoder, Relation
from capture.position import ResumePoint
from capture.replication_protocol import PrimaryKeepalive, XLogData
from capture.stream import ReplicationLostError, ReplicationStream, StreamOptions, pinned_options
from capture.transactions import LooseMessage, Transaction, TransactionAssembler
from headwater.config import LogConfig, SourceConfig
from log.base import SCHEMAS_TOPIC, Log, Record, TopicPartition, TopicSpec, append_keyed
from log.partitioner import partition_for
from log.sequence import Lsn

logger = logging.getLogger(__name__)

CAUGHT_UP_PREFIX = f"{INTERNAL_MESSAGE_PREFIX}caught_up"
HEARTBEAT_PREFIX = f"{INTERNAL_MESSAGE_PREFIX}heartbeat"


@dataclass
class CaptureStats:
    """Counters for progress display and tests."""

    transactions: int = 0
    events: int = 0
    records_written: int = 0
    records_skipped: int = 0
    acked_lsn: Lsn = field(default_factory=lambda: Lsn(0))
    reconnects: int = 0


@dataclass(frozen=True)
class AgentSettings:
    """Batching and timing of the agent loop."""

    max_batch_records: int = 20_000
    max_batch_delay_s: float = 0.05
    poll_timeout_s: float = 0.2
    reconnect_backoff_s: tuple[float, ...] = (0.2, 0.5, 1.0, 2.0, 5.0)


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
        settings: AgentSettings | None = None,
    ) -> None:
        self.name = name
        self.source = source
        self.log = log
        self.log_config = log_config
        self.settings = settings or AgentSettings()
        self.stats = CaptureStats()
        self._make_decoder_factory = decoder_for
        self._stop = threading.Event()
        self._known_topics: set[str] = set()
        self._pending: list[OutRecord] = []
        self._pending_schemas: list[SchemaRecord] = []
        self._pending_end: Lsn | None = None
        self._pending_since = 0.0
        self._dsn = source.dsn.get_secret_value()
        self.slot = source.slot or f"headwater_{name}"
        self.publication = source.publication or f"headwater_{name}"

    # -- control -----------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the loop to finish the current batch, acknowledge it and return."""
        self._stop.set()

    def install_signal_handlers(self) -> None:
        """SIGINT/SIGTERM stop the agent cleanly (current batch appended and acknowledged)."""

        def handle(_signum: int, _frame: FrameType | None) -> None:
            self.stop()

        signal.signal(signal.SIGINT, handle)
        signal.signal(signal.SIGTERM, handle)

    # -- main loop ---------------------------------------------------------------------

    def run(self, *, until_caught_up: bool) -> CaptureStats:
        """Stream until stopped, or until everything committed before the call is in the log."""
        sql_conn = self._connect_sql()
        try:
            db = str(sql_conn.info.dbname)
            builder = EventBuilder(
                self.name,
                db,
                self._make_decoder_factory(sql_conn),
                excluded_columns=self.source.columns.exclude,
            )
            self._seed_schemas(builder)
            resume = ResumePoint.load(self.log, self._source_topics())
            marker = self._emit_marker(sql_conn, CAUGHT_UP_PREFIX) if until_caught_up else None
            backoff = iter(self.settings.reconnect_backoff_s)
            while not self._stop.is_set():
                try:
                    if self._stream(sql_conn, builder, resume, marker):
                        break
                except ReplicationLostError as exc:
                    delay = next(backoff, self.settings.reconnect_backoff_s[-1])
                    self.stats.reconnects += 1
                    logger.warning("%s; retrying in %.1fs", exc, delay)
                    self._pending.clear()
                    self._pending_schemas.clear()
                    self._pending_end = None
                    resume = ResumePoint.load(self.log, self._source_topics())
                    if self._stop.wait(delay):
                        break
                    sql_conn = self._reconnect_sql(sql_conn)
            return self.stats
        finally:
            sql_conn.close()

    def _stream(
        self,
        sql_conn: psycopg.Connection[Any],
        builder: EventBuilder,
        resume: ResumePoint,
        marker: str | None,
    ) -> bool:
        """One replication session; True when caught up (``marker`` seen)."""
        stream = ReplicationStream(self._dsn, StreamOptions(self.slot, self.publication))
        decoder = PgoutputDecoder(protocol_version=2)
        assembler = TransactionAssembler()
        stream.start(Lsn(0))
        last_heartbeat = time.monotonic()
        try:
            while not self._stop.is_set():
                for frame in stream.frames(self.settings.poll_timeout_s):
                    if isinstance(frame, PrimaryKeepalive):
                        if frame.reply_requested:
                            stream.send_status(self.stats.acked_lsn)
                        continue
                    assert isinstance(frame, XLogData)
                    done = assembler.feed(decoder.decode(frame.payload))
                    if isinstance(done, Transaction):
                        self._add_transaction(builder, done)
                    elif isinstance(done, LooseMessage):
                        caught_up = self._on_loose_message(done.message, marker, resume, stream)
                        if caught_up:
                            return True
                    if len(self._pending) >= self.settings.max_batch_records:
                        self._flush(resume, stream)
                if self._pending_end is not None:
                    self._flush(resume, stream)
                now = time.monotonic()
                if now - last_heartbeat >= self.source.heartbeat_interval_s:
                    # A heartbeat message flows through the slot even when only unpublished
                    # tables change, so the acknowledged LSN (and retained WAL) keeps moving.
                    self._emit_marker(sql_conn, HEARTBEAT_PREFIX)
                    last_heartbeat = now
            self._flush(resume, stream)
            return False
        finally:
            stream.close()

    def _add_transaction(self, builder: EventBuilder, txn: Transaction) -> None:
        records, schemas = builder.build(txn)
        self._pending.extend(records)
        self._pending_schemas.extend(schemas)
        self._pending_end = txn.end_lsn
        self.stats.transactions += 1
        self.stats.events += sum(1 for r in records if r.value is not None)

    def _on_loose_message(
        self, message: LogicalMessage, marker: str | None, resume: ResumePoint, stream: ReplicationStream
    ) -> bool:
        if not message.prefix.startswith(INTERNAL_MESSAGE_PREFIX):
            return False
        # Every transaction committed before this message has been received: once the
        # pending ones are durable, the message's LSN is safe to acknowledge.
        self._flush(resume, stream)
        if message.lsn > self.stats.acked_lsn and not self._pending:
            self.stats.acked_lsn = message.lsn
            stream.send_status(message.lsn)
        return marker is not None and message.prefix == CAUGHT_UP_PREFIX and message.content.decode() == marker

    def _flush(self, resume: ResumePoint, stream: ReplicationStream) -> None:
        """Append pending records (skipping those the log holds), then acknowledge."""
        if self._pending_schemas:
            self._ensure_topic(SCHEMAS_TOPIC)
            # Schemas go first: a reader never meets an event whose columns it cannot know.
            append_keyed(self.log, SCHEMAS_TOPIC, [Record(s.topic.encode(), s.value) for s in self._pending_schemas])
            self._pending_schemas.clear()
        groups: dict[TopicPartition, list[OutRecord]] = {}
        for record in self._pending:
            self._ensure_topic(record.topic)
            where = TopicPartition(record.topic, partition_for(record.key, self._partitions(record.topic)))
            if resume.already_stored(where, record.sequence):
                self.stats.records_skipped += 1
                continue
            groups.setdefault(where, []).append(record)
        for where, records in groups.items():
            self.log.append(where.topic, where.partition, [Record(r.key, r.value) for r in records])
            resume.advance(where, records[-1].sequence)
            self.stats.records_written += len(records)
        self._pending.clear()
        if self._pending_end is not None:
            # Acknowledged only after the appends above returned (fsynced): a restart
            # resumes at or before this LSN.
            stream.send_status(self._pending_end)
            self.stats.acked_lsn = self._pending_end
            self._pending_end = None

    # -- helpers -----------------------------------------------------------------------

    def _partitions(self, topic: str) -> int:
        return self.log.describe_topic(topic).partitions

    def _ensure_topic(self, topic: str) -> None:
        if topic in self._known_topics:
            return
        cfg = self.log_config
        spec = TopicSpec(
            name=topic,
            partitions=1 if topic == SCHEMAS_TOPIC else cfg.partitions,
            compacted=True,
            min_compaction_lag_ms=cfg.min_compaction_lag_s * 1000,
            delete_retention_ms=cfg.delete_retention_s * 1000,
        )
        self.log.create_topic(spec, exist_ok=True)
        self._known_topics.add(topic)

    def _source_topics(self) -> Iterable[str]:
        prefix = f"{self.name}."
        return [t for t in self.log.list_topics() if t.startswith(prefix)]

    def _seed_schemas(self, builder: EventBuilder) -> None:
        if SCHEMAS_TOPIC not in self.log.list_topics():
            return
        import orjson

        latest: dict[str, bytes] = {}
        for partition in range(self._partitions(SCHEMAS_TOPIC)):
            offset = self.log.beginning_offset(SCHEMAS_TOPIC, partition)
            while records := self.log.read(SCHEMAS_TOPIC, partition, offset):
                for record in records:
                    if record.key is not None and record.value is not None:
                        latest[record.key.decode()] = record.value
                offset = records[-1].offset + 1
        for topic, value in latest.items():
            if topic.startswith(f"{self.name}."):
                builder.known_schema(topic, value, int(orjson.loads(value)["version"]))

    def _connect_sql(self) -> psycopg.Connection[Any]:
        try:
            return psycopg.connect(self._dsn, autocommit=True, options=pinned_options(), connect_timeout=10)
        except psycopg.OperationalError as exc:
            raise ReplicationLostError.from_psycopg(exc, slot=self.slot, dsn=self._dsn) from None

    def _reconnect_sql(self, conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
        if not conn.closed and not conn.broken:
            return conn
        conn.close()
        return self._connect_sql()

    def _emit_marker(self, conn: psycopg.Connection[Any], prefix: str) -> str:
        token = secrets.token_hex(8)
        try:
            conn.execute("SELECT pg_logical_emit_message(false, %s, %s)", (prefix, token))
        except psycopg.OperationalError as exc:
            raise ReplicationLostError.from_psycopg(exc, slot=self.slot, dsn=self._dsn) from None
        return token


def relation_from_catalog(conn: psycopg.Connection[Any], qualified: str) -> Relation:
    """A pgoutput-equivalent :class:`Relation` for a table, read from the catalog (for snapshots)."""
    from capture.pgoutput import RelationColumn, ReplicaIdentity

    row = conn.execute(
        "SELECT c.oid, n.nspname, c.relname, c.relreplident FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = %s::regclass",
        (qualified,),
    ).fetchone()
    if row is None:
        msg = f"table {qualified} does not exist"
        raise ValueError(msg)
    oid, namespace, name, identity = row
    columns = conn.execute(
        "SELECT a.attname, a.atttypid, a.atttypmod, "
        "coalesce(a.attnum = ANY(i.indkey), false) AS key "
        "FROM pg_attribute a LEFT JOIN pg_index i ON i.indrelid = a.attrelid AND "
        "(CASE WHEN %s = 'i' THEN i.indisreplident ELSE i.indisprimary END) "
        "WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
        (identity, oid),
    ).fetchall()
    cols = tuple(
        RelationColumn(key=bool(key) or identity == "f", name=n, type_oid=int(t), atttypmod=int(m))
        for n, t, m, key in columns
    )
    return Relation(
        oid=int(oid), namespace=namespace, name=name, replica_identity=ReplicaIdentity(identity), columns=cols
    )
