"""The MySQL/MariaDB source kind (``kind: mysql``): :class:`capture.source_kind.SourceKind` over the binlog.

Registration checks the server and the account (:mod:`capture.mysql.prerequisites`) and writes the
source into ``headwater.yaml``; nothing is created in the database (a binlog reader needs no slot:
the server keeps binlogs by time, checked as a prerequisite). Capture is
:class:`capture.mysql.agent.MySqlAgent`: an initial snapshot at a consistent binlog point, then
the binlog. A position is the binlog file and offset (and the MariaDB GTID position) after the
last transaction the log holds, in ``<home>/capture/<source>/binlog.json``.

``resync`` (after a purged binlog) records a request and forgets the positions; the next capture
re-snapshots every table and writes a delete plus tombstone for every key the log holds live
that the source no longer has, so the log converges to the source (:mod:`capture.mysql.resync`).

``consistent_read`` reads a table at a new consistent point as capture's events (``headwater verify``).

``headwater snapshot`` and the signal table queue incremental snapshots that the running (or
next) capture agent reads between binlog points while it streams (:mod:`capture.mysql.incremental`,
:mod:`capture.mysql.signals`; MariaDB servers only).
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ruamel.yaml.comments import CommentedMap

from capture import config_document
from capture.errors import CancelledError, CaptureError, PrerequisiteError, SourceExistsError
from capture.incremental_queue import (
    STATE_FILE,
    IncrementalSnapshotError,
    IncrementalState,
    request_done,
    write_request,
)
from capture.mysql.agent import MySqlAgent
from capture.mysql.backlog import binlog_backlog, read_server_binlogs
from capture.mysql.consistent_read import MySqlConsistentRead
from capture.mysql.incremental import snapshot_problem
from capture.mysql.prerequisites import check as check_prerequisites
from capture.mysql.resync import request_resync
from capture.mysql.settings import MySqlSource, default_server_id
from capture.mysql.state import load_state
from capture.mysql.types.values import TypeModes
from capture.source_kind import Confirm, Outcome, SnapshotProgress, SnapshotRequest, SourceRequest, SourceView
from core.config import ProjectConfig, unset_variables
from core.errors import HeadwaterError
from core.leases import Holder, lease
from core.source_config import SourceConfig
from log.base import Log
from log.topics import table_topic

logger = logging.getLogger(__name__)


def state_dir(config: ProjectConfig, name: str) -> Path:
    """Where capture keeps a MySQL source's positions and snapshot progress."""
    return config.home_dir / "capture" / name


def modes_of(source: SourceConfig) -> TypeModes:
    """The source's ``types`` block in Debezium's MySQL terms (``adaptive`` is ``adaptive_time_microseconds``)."""
    types = source.types
    return TypeModes(
        decimal=types.decimal_handling_mode,
        time="connect" if types.time_precision_mode == "connect" else "adaptive_time_microseconds",
        bigint_unsigned=types.bigint_unsigned_handling_mode,
        binary=types.binary_handling_mode,
    )


def settings_of(name: str, source: SourceConfig) -> MySqlSource:
    """What the agent needs, from the validated config (``schemas`` are databases captured whole)."""
    return MySqlSource.from_dsn(
        name,
        source.dsn.get_secret_value(),
        tuple(source.tables or ()),
        modes=modes_of(source),
        server_id=source.server_id or default_server_id(name),
        snapshot="never" if source.snapshot == "never" else "initial",
        transactions=source.transactions,
        databases=tuple(source.schemas or ()),
        columns=source.columns,
        keys=dict(source.keys),
        filters=dict(source.filters),
        skipped_operations=tuple(source.skipped_operations),
        spill_threshold_bytes=source.spill_threshold_bytes,
        signal_table=source.signal_table,
    )


def refuse_unsupported(name: str, source: SourceConfig) -> None:
    """Settings a MySQL source does not apply yet are refused when capture starts, never ignored.

    ``max_transaction_bytes`` (the bound of a transaction held whole before MySQL capture
    spilled) is accepted with a warning: an old config still loads and captures.
    """
    if source.max_transaction_bytes is not None:
        # Accepted, not applied: it bounded a transaction held whole in memory; large ones spill now.
        logger.warning(
            "source %s: sources.%s.max_transaction_bytes is no longer used (MySQL capture spills a large "
            "transaction to disk past spill_threshold_bytes, whatever its size); remove it from the source",
            name,
            name,
        )


class MySqlSourceKind:
    """MySQL and MariaDB through the binlog (see the module docstring)."""

    name = "mysql"

    # -- registration and prerequisites ------------------------------------------------------

    def add(self, config_path: Path, request: SourceRequest, *, confirm: Confirm | None) -> Outcome:
        """Check the server and account, then add the source to the config (nothing is created in the database)."""
        config_path = Path(config_path)
        document = config_document.read_document(config_path)
        current = config_document.validate(config_document.render(document), config_path)
        if request.name in current.sources:
            msg = (
                f"source {request.name} is already registered in {config_path}; pick another name, "
                f"or remove it first: headwater source remove {request.name}"
            )
            raise SourceExistsError(msg, source=request.name)
        if not request.tables and not request.schemas:
            msg = "a MySQL source needs --tables database.table,... or --schemas database,..."
            raise CaptureError(msg, source=request.name)
        if request.snapshot not in ("initial", "never"):
            msg = f"--snapshot {request.snapshot} is not supported for MySQL sources; use initial or never"
            raise CaptureError(msg, source=request.name)
        entry = CommentedMap()
        entry["kind"] = self.name
        entry["dsn"] = request.dsn
        if request.tables:
            entry["tables"] = config_document.flow_list(list(request.tables))
        else:
            entry["schemas"] = config_document.flow_list(list(request.schemas or ()))
        entry["snapshot"] = request.snapshot
        entry["server_id"] = default_server_id(request.name)
        config_document.sources_map(document)[request.name] = entry
        text = config_document.render(document)
        # Validated (and ${VAR} resolved in the DSN) before the server is asked anything.
        source_config = config_document.validate(text, config_path).sources[request.name]
        settings = settings_of(request.name, source_config)
        try:
            found = check_prerequisites(
                settings.address, settings.tables, server_id=settings.server_id, databases=settings.databases
            )
        except HeadwaterError:
            raise
        except Exception as exc:
            msg = f"source {request.name}: cannot check {settings.redacted_dsn()}: {_one_line(exc, settings)}"
            raise CaptureError(msg, source=request.name) from None
        if found.problems:
            line = f"source {request.name}: " + "; ".join(found.problems)
            raise PrerequisiteError(line, source=request.name, problems=tuple(found.problems))
        config_document.write_atomically(config_path, text)
        what = f"{len(settings.tables)} table(s)" if settings.tables else f"database(s) {', '.join(settings.databases)}"
        return Outcome(
            request.name,
            f"registered MySQL source {request.name}: {what}, replica id {settings.server_id}; config {config_path}",
            next_step=f"headwater capture {request.name} --until-caught-up",
            warnings=tuple(found.warnings),
        )

    def show(self, config: ProjectConfig, name: str) -> SourceView:
        """The source's settings and where capture stands."""
        source = config.sources[name]
        saved = load_state(state_dir(config, name))
        rows = (
            ("source", name),
            ("kind", self.name),
            ("dsn", source.dsn_redacted),
            ("tables", ", ".join(source.tables or ()))
            if source.tables
            else ("schemas", ", ".join(source.schemas or ())),
            ("snapshot", source.snapshot),
            ("replica id", str(source.server_id or default_server_id(name))),
            ("binlog position", "-" if saved is None else f"{saved.position} (GTID {saved.gtids or '-'})"),
        )
        return SourceView(name, self.name, rows, {k.replace(" ", "_"): v for k, v in rows})

    def removal_question(self, config: ProjectConfig, name: str) -> str:
        """What ``remove`` does."""
        return f"Remove MySQL source {name} from the config (nothing is dropped in the database)?"

    def remove(self, config_path: Path, name: str) -> Outcome:
        """Remove the source from the config."""
        document = config_document.read_document(config_path)
        del config_document.sources_map(document)[name]
        text = config_document.render(document)
        config_document.validate(text, config_path)
        config_document.write_atomically(config_path, text)
        return Outcome(name, f"removed source {name}; nothing to drop in the database")

    def check(self, config: ProjectConfig, name: str) -> None:
        """Log in once."""
        settings = settings_of(name, config.sources[name])
        try:
            settings.address.connect().close()
        except Exception as exc:
            msg = f"source {name}: cannot connect to {settings.redacted_dsn()}: {_one_line(exc, settings)}"
            raise CaptureError(msg, source=name) from None

    def status(self, config: ProjectConfig, name: str) -> dict[str, Any]:
        """The saved position against the server's binlogs: end, lag, what is kept before it (never the password).

        ``active``: a capture on this host holds the source's lease. Keys besides the protocol's:
        ``binlog_end``, ``lag_bytes``, ``lag_seconds``, ``last_commit``
        (the last captured transaction's binlog time), ``binlog_status`` (``present`` | ``purged``),
        ``oldest_binlog``, ``binlog_headroom_bytes``/``_files`` and ``binlog_expire_s``
        (:mod:`capture.mysql.backlog`).
        """
        source = config.sources[name]
        row: dict[str, Any] = {"source": name, "kind": self.name, "dsn": source.dsn_redacted}
        saved = load_state(state_dir(config, name))
        row["position"] = None if saved is None else str(saved.position)
        # A capture on this host holds the source's lease (the server knows no slot to ask).
        active = lease(config.home_dir, "capture", name).taken()
        if active is not None:
            row["active"] = active
        if saved is not None and saved.commit_ts is not None:
            row["last_commit"] = dt.datetime.fromtimestamp(saved.commit_ts, dt.UTC).isoformat().replace("+00:00", "Z")
        queued = IncrementalState.load(state_dir(config, name) / STATE_FILE).tables
        if queued:  # incremental snapshots taken by an agent, queued or in progress
            row["incremental_snapshots"] = [t.table for t in queued]
        unset = unset_variables(source.dsn.get_secret_value())
        if unset:
            row["error"] = (
                f"not checked: environment variable {unset[0]} (in its dsn) is not set; export it to see the binlog"
            )
            return row
        settings = settings_of(name, source)
        try:
            with settings.address.connect() as conn, conn.cursor() as cur:
                server = read_server_binlogs(cur)
        except Exception as exc:
            row["error"] = _one_line(exc, settings)
            return row
        if server is None:
            row["error"] = "the server's binary log is off: capture needs log_bin"
            return row
        row["binlog_end"] = str(server.end)
        row["binlog_expire_s"] = server.expire_s
        row["oldest_binlog"] = server.files[0].name if server.files else None
        if saved is None:
            return row
        backlog = binlog_backlog(saved.position, server)
        row.update(
            binlog_status="present" if backlog.present else "purged",
            lag_bytes=backlog.lag_bytes,
            binlog_headroom_bytes=backlog.headroom_bytes,
            binlog_headroom_files=backlog.headroom_files,
        )
        if backlog.lag_bytes == 0:
            row["lag_seconds"] = 0.0
        elif saved.commit_ts is not None:
            # An upper bound: the changes not read yet are younger than the last one captured.
            row["lag_seconds"] = max(time.time() - saved.commit_ts, 0.0)
        return row

    # -- capture ----------------------------------------------------------------------------

    def prepare_process(self) -> None:
        """Nothing to prepare."""

    def holder(self, config: ProjectConfig, name: str) -> Holder | None:
        """Not known from the server: the local lease is the only guard."""
        return None

    def agent(self, config: ProjectConfig, name: str, log: Log, *, progress: SnapshotProgress | None) -> MySqlAgent:
        """The binlog capture agent of source ``name``."""
        refuse_unsupported(name, config.sources[name])
        return MySqlAgent(settings_of(name, config.sources[name]), log, config.log, state_dir(config, name))

    # -- consistent reads (headwater verify) ------------------------------------------------

    def consistent_read(self, config: ProjectConfig, name: str, topic: str) -> MySqlConsistentRead:
        """The source table of ``topic`` at a new consistent binlog point (:mod:`capture.mysql.consistent_read`)."""
        return MySqlConsistentRead(settings_of(name, config.sources[name]), topic)

    def captured_to(self, config: ProjectConfig, name: str) -> int | None:
        """The saved binlog position's sequence: the log holds every transaction committed up to it."""
        saved = load_state(state_dir(config, name))
        return None if saved is None else saved.position.sequence()

    # -- snapshots -------------------------------------------------------------------------

    def request_snapshot(
        self, config: ProjectConfig, name: str, tables: Sequence[str], *, captured_only: bool = False
    ) -> SnapshotRequest:
        """Queue an incremental snapshot of captured ``database.table`` names (:mod:`capture.mysql.incremental`)."""
        settings = settings_of(name, config.sources[name])
        names = [t.replace("`", "").strip() for t in tables if t.strip()]
        if not names:
            msg = f"give at least one table of source {name!r} to snapshot, e.g. shop.orders"
            raise IncrementalSnapshotError(msg, source=name)
        missing = [t for t in names if "." not in t or not settings.wants(*t.split(".", 1))]
        if missing:
            msg = (
                f"source {name!r} does not capture {', '.join(missing)}; snapshot only database.table names it "
                "captures (its tables, or tables of its schemas)"
            )
            raise IncrementalSnapshotError(msg, source=name, table=missing[0])
        problem = snapshot_problem(settings, names)
        if problem is not None:
            msg = f"source {name}: {problem}"
            raise IncrementalSnapshotError(msg, source=name)
        return SnapshotRequest(write_request(state_dir(config, name), names), tuple(names))

    def snapshot_done(self, config: ProjectConfig, name: str, request_id: str) -> bool:
        """True once the agent took the request and every chunk of its tables is durably in the log."""
        return request_done(state_dir(config, name), request_id)

    def rereading(self, config: ProjectConfig, name: str) -> frozenset[str]:
        """None: a MySQL source reads no table again after a schema change (its DDL is not followed by re-reads yet)."""
        return frozenset()

    def resync_question(self, config: ProjectConfig, name: str) -> str:
        """What ``resync`` does."""
        return (
            f"forget where source {name}'s capture stands, so the next capture re-snapshots every table and "
            "writes deletes for the rows removed meanwhile?"
        )

    def resync(self, config: ProjectConfig, name: str, *, confirm: Confirm | None) -> Outcome:
        """Record a resync request (:mod:`capture.mysql.resync`): the next capture re-snapshots and reconciles."""
        held = lease(config.home_dir, "capture", name)
        if not held.try_acquire():
            holder = held.holder()
            by = f" by {holder.describe()}" if holder is not None else ""
            msg = f"source {name} is being captured{by}; stop its capture first, then run the resync again"
            raise CaptureError(msg, source=name)
        try:
            if confirm is not None and not confirm(self.resync_question(config, name)):
                msg = f"cancelled: the capture state of source {name} is unchanged"
                raise CancelledError(msg, source=name)
            directory = state_dir(config, name)
            saved = load_state(directory)
            request_resync(directory, "source resync", None if saved is None else saved.position)
        finally:
            held.release()
        read = "" if saved is None else f" (the binlog was read up to {saved.position})"
        return Outcome(
            name,
            f"source {name}: positions forgotten{read}; the next capture re-snapshots every table and writes "
            "deletes for the rows removed meanwhile, then streams from the re-snapshot's binlog point",
            next_step=f"headwater capture {name} --until-caught-up",
        )

    # -- names -----------------------------------------------------------------------------

    def split_tables(self, text: str, *, what: str) -> list[str]:
        """Comma-separated ``database.table`` names."""
        names = [part.strip().replace("`", "") for part in text.split(",") if part.strip()]
        if not names:
            msg = f"{what} lists no table; give database.table,..."
            raise CaptureError(msg)
        return names

    def table_topics(self, name: str, tables: Sequence[str]) -> list[str]:
        """``<source>.<database>.<table>`` per configured table."""
        return [table_topic(name, *table.split(".", 1)) if "." in table else f"{name}.{table}" for table in tables]


def _one_line(exc: BaseException, settings: MySqlSource) -> str:
    text = " ".join(str(exc).split())
    return text.replace(settings.address.password, "***") if settings.address.password else text
