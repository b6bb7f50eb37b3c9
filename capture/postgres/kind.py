"""The PostgreSQL source kind (``kind: postgres``, the default): :class:`capture.source_kind.SourceKind` over pgoutput.

Registration creates a publication and a logical replication slot; capture is
:class:`capture.postgres.agent.CaptureAgent` (an exported-snapshot initial snapshot, then
pgoutput streaming, acknowledging the commit's end LSN); a position is the commit LSN and the
change's index in its transaction (:class:`log.sequence.Sequence`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from capture.errors import CaptureError
from capture.incremental_queue import STATE_FILE, IncrementalState
from capture.postgres.agent import CaptureAgent
from capture.postgres.catalog import typemap_decoders
from capture.postgres.identifiers import TableName, split_list
from capture.postgres.registration import registry
from capture.postgres.registration.slot import slot_status
from capture.postgres.registration.slot_holder import application_name, slot_holder
from capture.postgres.snapshot import incremental_request, resync
from capture.postgres.snapshot.incremental import SCHEMA_REQUEST, reread_topics
from capture.postgres.snapshot.resync import capture_state_dir
from capture.source_kind import Confirm, Outcome, SnapshotProgress, SnapshotRequest, SourceRequest, SourceView
from core.config import ProjectConfig, unset_variables
from core.errors import HeadwaterError
from core.leases import Holder
from log.base import Log
from log.topics import table_topic


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def _view_rows(view: registry.SourceView) -> tuple[tuple[str, str], ...]:
    """``source show``'s rows: settings, then the slot's live state."""
    rows = [("source", view.name), ("dsn", view.dsn)]
    if view.tables is not None:
        rows.append(("tables", ", ".join(view.tables)))
    else:
        rows.append(("schemas", ", ".join(view.schemas or ())))
    rows.append(("snapshot", view.snapshot))
    rows.append(("publication", view.publication + ("" if view.publication_info or view.error else " (missing)")))
    status = view.slot_status
    if view.error:
        rows.append(("slot", f"{view.slot} (status unknown: {view.error})"))
    elif status is None:
        rows.append(("slot", f"{view.slot} (missing: run headwater source resync {view.name})"))
    else:
        active = "active, pid " + str(status.active_pid) if status.active else "inactive"
        lost = f" (invalidated: run headwater source resync {view.name})" if status.wal_status == "lost" else ""
        rows += [
            ("slot", f"{view.slot} ({active})"),
            ("confirmed flush lsn", str(status.confirmed_flush_lsn or "-")),
            ("restart lsn", str(status.restart_lsn or "-")),
            ("wal retained", _size(status.wal_retained_bytes)),
            ("wal status", (status.wal_status or "-") + lost),
        ]
    return tuple(rows)


class PostgresSource:
    """PostgreSQL through pgoutput logical replication (see the module docstring)."""

    name = "postgres"

    # -- registration and prerequisites ------------------------------------------------------

    def add(self, config_path: Path, request: SourceRequest, *, confirm: Confirm | None) -> Outcome:
        """Check prerequisites, create the publication and slot, and add the source to the config."""
        result = registry.add_source(
            config_path,
            request.name,
            request.dsn,
            tables=request.tables,
            schemas=request.schemas,
            snapshot=request.snapshot,  # type: ignore[arg-type]  # the CLI offers only the valid modes
            slot=request.options.get("slot"),
            publication=request.options.get("publication"),
            confirm=confirm,
        )
        return Outcome(
            result.name,
            f"registered source {result.name}: publication {result.publication} ({result.publication_action}), "
            f"slot {result.slot} at {result.consistent_lsn}; config {result.config_path}",
            next_step=f"headwater capture {result.name} --until-caught-up",
            warnings=result.warnings,
            notes=result.notes,
        )

    def show(self, config: ProjectConfig, name: str) -> SourceView:
        """The source's settings and its live slot and publication."""
        view = registry.show_source(config, name)
        return SourceView(name, self.name, _view_rows(view), view.as_dict())

    def removal_question(self, config: ProjectConfig, name: str) -> str:
        """What ``remove`` drops."""
        return registry.removal_text(config, name)

    def remove(self, config_path: Path, name: str) -> Outcome:
        """Drop the slot and (Headwater's own) publication, and remove the source from the config."""
        result = registry.remove_source(config_path, name)
        dropped = [
            f"slot {result.slot}" if result.slot_dropped else None,
            f"publication {result.publication}" if result.publication_dropped else None,
        ]
        what = " and ".join(d for d in dropped if d) or "nothing in the database"
        return Outcome(result.name, f"removed source {result.name}; dropped {what}", notes=result.notes)

    def check(self, config: ProjectConfig, name: str) -> None:
        """Log in once: registration's one-line errors (login, TLS/sslmode, unreachable), password scrubbed."""
        registry.connect(config.sources[name].dsn.get_secret_value(), source=name).close()

    def status(self, config: ProjectConfig, name: str) -> dict[str, Any]:
        """Slot state: active, confirmed flush LSN, WAL retained (never the password)."""
        source = config.sources[name]
        slot_name = source.slot or f"headwater_{name}"
        row: dict[str, Any] = {"source": name, "dsn": source.dsn_redacted, "slot": slot_name}
        # Tables read again after a schema change (the source's schema: incremental snapshots queued).
        state = IncrementalState.load(capture_state_dir(config, name) / STATE_FILE)
        rereading = sorted({t.table for t in state.tables if t.request.startswith(SCHEMA_REQUEST)})
        if rereading:
            row["rereading"] = rereading
        unset = unset_variables(source.dsn.get_secret_value())
        if unset:
            row["error"] = (
                f"not checked: environment variable {unset[0]} (in its dsn) is not set; export it to see the slot"
            )
            return row
        try:
            with registry.connect(source.dsn.get_secret_value(), source=name) as conn:
                status = slot_status(conn, slot_name)
        except HeadwaterError as exc:
            row["error"] = str(exc)
            return row
        if status is None:
            row["error"] = f"slot {slot_name} does not exist; run 'headwater source resync {name}'"
        else:
            row.update(
                active=status.active,
                confirmed_flush_lsn=str(status.confirmed_flush_lsn) if status.confirmed_flush_lsn else None,
                wal_retained_bytes=status.wal_retained_bytes,
                wal_status=status.wal_status,
            )
        return row

    # -- capture ----------------------------------------------------------------------------

    def prepare_process(self) -> None:
        """Name this process in ``pg_stat_replication`` (a name inherited from a capturing parent is replaced)."""
        if os.environ.get("PGAPPNAME", "headwater capture ").startswith("headwater capture "):
            os.environ["PGAPPNAME"] = application_name()

    def holder(self, config: ProjectConfig, name: str) -> Holder | None:
        """The process streaming from the source's slot elsewhere, or None."""
        source = config.sources[name]
        with registry.connect(source.dsn.get_secret_value(), source=name) as conn:
            return slot_holder(conn, source.slot or f"headwater_{name}")

    def agent(self, config: ProjectConfig, name: str, log: Log, *, progress: SnapshotProgress | None) -> CaptureAgent:
        """The pgoutput capture agent of source ``name``."""
        source = config.sources[name]
        return CaptureAgent(
            name,
            source,
            log,
            config.log,
            typemap_decoders(source.types),
            state_dir=resync.capture_state_dir(config, name),
            progress=progress,
        )

    # -- snapshots -------------------------------------------------------------------------

    def request_snapshot(
        self, config: ProjectConfig, name: str, tables: Sequence[str], *, captured_only: bool = False
    ) -> SnapshotRequest:
        """Queue an incremental snapshot; with ``captured_only`` refuse tables the source does not capture."""
        if captured_only:
            tables = [str(t) for t in incremental_request.snapshot_tables(config, name, tables)]
        request_id, names = incremental_request.request_incremental_snapshot(
            resync.capture_state_dir(config, name), tables
        )
        return SnapshotRequest(request_id, tuple(str(n) for n in names))

    def snapshot_done(self, config: ProjectConfig, name: str, request_id: str) -> bool:
        """True once the agent took the request and every chunk of its tables is durably in the log."""
        return incremental_request.request_done(resync.capture_state_dir(config, name), request_id)

    def rereading(self, config: ProjectConfig, name: str) -> frozenset[str]:
        """Topics of the re-reads schema changes queued (request ids ``schema:<topic>:v<version>``)."""
        state = IncrementalState.load(capture_state_dir(config, name) / STATE_FILE)
        return reread_topics(t.request for t in state.tables)

    def resync_question(self, config: ProjectConfig, name: str) -> str:
        """What ``resync`` does to the slot."""
        return resync.resync_question(config, name)

    def resync(self, config: ProjectConfig, name: str, *, confirm: Confirm | None) -> Outcome:
        """Record a resync request and replace the slot; the next capture re-snapshots every table."""
        result = resync.resync_source(config, name, confirm=confirm)
        lost = f", changes after {result.lost_from} were not streamed" if result.lost_from is not None else ""
        return Outcome(
            result.name,
            f"source {result.name}: slot {result.slot} was {result.previous}{lost}; created it again at "
            f"{result.new_slot_lsn}. The next capture re-snapshots {result.targets} of publication "
            f"{result.publication} and writes deletes for rows removed meanwhile",
            next_step=f"headwater capture {result.name} --until-caught-up",
        )

    # -- names -----------------------------------------------------------------------------

    def split_tables(self, text: str, *, what: str) -> list[str]:
        """Comma-separated names, commas inside double quotes kept (``"s,1"."t,2"``)."""
        return split_list(text, what=what)

    def table_topics(self, name: str, tables: Sequence[str]) -> list[str]:
        """The topic of each configured table: quoted names parsed as capture parses them."""
        topics = []
        for table in tables:
            for text in (table, f"public.{table}"):
                try:
                    parsed = TableName.parse(text)
                except CaptureError:
                    continue
                topics.append(table_topic(name, parsed.schema, parsed.name))
                break
            else:
                topics.append(f"{name}.{table}")
        return topics
