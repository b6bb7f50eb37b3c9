"""Where streaming starts: the slot, the snapshot the mode asks for, and a requested resync.

A slot that is gone (dropped, or invalidated) after this source has streamed from it is
never silently replaced: the changes it held would be skipped. Capture stops with
:class:`capture.errors.SlotGoneError` unless a resync was requested (or the snapshot mode
is ``when_needed``, which requests one itself). A slot is (re)created with an exported
snapshot only when nothing was streamed from it yet, so recreating it loses nothing.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import orjson
import psycopg

from capture.errors import SlotError
from capture.position import ResumePoint
from capture.postgres.events.builder import EventBuilder
from capture.postgres.registration.slot import (
    SlotStatus,
    create_slot,
    drop_slot,
    enable_failover,
    export_snapshot_command,
    has_failover_slots,
    is_gone,
    slot_gone_error,
    slot_status,
)
from capture.postgres.snapshot.plan import SnapshotState
from capture.postgres.snapshot.reader import SnapshotReader
from capture.postgres.streaming.connection import ReplicationLostError, acked_lsn, pinned_options
from capture.resync import ResyncRequest
from capture.stats import CaptureStats
from core.errors import one_line
from core.source_config import SourceConfig
from log.sequence import Lsn

logger = logging.getLogger(__name__)

#: In the state directory once the source has streamed from its slot: a slot missing
#: after that was dropped, and its changes cannot be streamed any more.
STREAMED_MARKER = "streamed.json"


def resume_lsn(resume: ResumePoint) -> Lsn | None:
    """The commit LSN of the last change the log holds for the source (None: none yet)."""
    highest = resume.highest()
    return Lsn(highest.commit_lsn) if highest is not None else None


class SlotPolicy:
    """Makes sure a source's slot exists with the snapshot its mode asks for (see the module docstring)."""

    def __init__(
        self,
        name: str,
        source: SourceConfig,
        slot: str,
        dsn: str,
        state_dir: Path,
        *,
        snapshot: SnapshotReader,
        stats: CaptureStats,
    ) -> None:
        self.name = name
        self.source = source
        self.slot = slot
        self._dsn = dsn
        self._state_dir = state_dir
        self._snapshot = snapshot
        #: True once this run read a snapshot (initial, resumed or a resync's): the schemas it wrote are current.
        self.snapshotted = False
        self._stats = stats

    def check(self, sql_conn: psycopg.Connection[Any], resume: ResumePoint) -> None:
        """Raise :class:`SlotGoneError` when the slot was dropped or invalidated (while we were away)."""
        try:
            status = slot_status(sql_conn, self.slot)
        except psycopg.OperationalError as exc:
            raise ReplicationLostError.from_psycopg(exc, slot=self.slot, dsn=self._dsn) from None
        if is_gone(status):
            since = status.confirmed_flush_lsn if status is not None else None
            if since is None and acked_lsn(self._stats).value:
                since = acked_lsn(self._stats)
            raise slot_gone_error(
                self.name, self.slot, status, since or resume_lsn(resume), failover_slots=has_failover_slots(sql_conn)
            )

    def prepare(self, sql_conn: psycopg.Connection[Any], builder: EventBuilder, resume: ResumePoint) -> bool:
        """Make sure the slot exists and the snapshot the mode asks for is done; False: stop after.

        Carries out a requested resync first; a slot gone after streaming raises
        :class:`SlotGoneError` (mode ``when_needed``: requests a resync instead).
        """
        mode = self.source.snapshot
        state = SnapshotState.load(self._state_dir / "snapshot.json")
        slot = slot_status(sql_conn, self.slot)
        request = ResyncRequest.load(self._state_dir)
        if request is None and is_gone(slot) and self._streamed_before(state, resume):
            since = slot.confirmed_flush_lsn if slot is not None else resume_lsn(resume)
            error = slot_gone_error(self.name, self.slot, slot, since, failover_slots=has_failover_slots(sql_conn))
            if mode != "when_needed":
                raise error
            logger.warning("%s; snapshot mode when_needed: re-snapshotting instead", error)
            request = ResyncRequest.new(self._state_dir, "slot gone, snapshot: when_needed", since)
            request.save()
        if request is not None:
            self._resync(sql_conn, builder, resume, state, request=request, slot=slot)
            self._mark_streamed()
            return mode != "initial_only"
        if slot is not None and slot.wal_status == "lost":
            # Invalidated before anything was streamed from it: recreating it loses nothing.
            drop_slot(sql_conn, self.slot, source=self.name)
            slot = None
        if slot is not None and slot.failover is False:
            self._enable_failover()
        wants = mode in ("initial", "initial_only", "when_needed") and not state.completed
        if not wants:
            if slot is None:
                create_slot(sql_conn, self.slot, source=self.name)
            self._mark_streamed()
            return mode != "initial_only"
        if state.consistent_lsn is None or slot is None:
            # Nothing was streamed from this slot yet (no snapshot finished), so recreating it
            # with an exported snapshot loses nothing.
            state = self._snapshot_with_new_slot(
                sql_conn, builder, resume, SnapshotState(state.path), slot, reconcile=False
            )
        else:
            self._snapshot.read(builder, resume, state, exported=None)
            self.snapshotted = True
        state.completed = True
        state.save()
        self._mark_streamed()
        return mode != "initial_only"

    def _resync(
        self,
        sql_conn: psycopg.Connection[Any],
        builder: EventBuilder,
        resume: ResumePoint,
        state: SnapshotState,
        *,
        request: ResyncRequest,
        slot: SlotStatus | None,
    ) -> None:
        """Carry out a requested re-snapshot (:mod:`capture.postgres.snapshot.resync`), from its start unless done."""
        if request.consistent_lsn is not None and state.completed and state.consistent_lsn == request.consistent_lsn:
            request.clear()  # done; only the clearing was interrupted
            return
        logger.warning("source %s: re-snapshotting every table (%s)", self.name, request.reason)
        state = SnapshotState(state.path)
        state.save()  # an interrupted resync never resumes a half snapshot: the key set must be whole
        state = self._snapshot_with_new_slot(sql_conn, builder, resume, state, slot, reconcile=True, request=request)
        state.completed = True
        state.save()
        request.clear()

    def _snapshot_with_new_slot(
        self,
        sql_conn: psycopg.Connection[Any],
        builder: EventBuilder,
        resume: ResumePoint,
        state: SnapshotState,
        slot: SlotStatus | None,
        *,
        reconcile: bool,
        request: ResyncRequest | None = None,
    ) -> SnapshotState:
        """(Re)create the slot with an exported snapshot and read every table at its consistent point."""
        if slot is not None:
            drop_slot(sql_conn, self.slot, source=self.name)
        repl = psycopg.connect(self._dsn, autocommit=True, replication="database", options=pinned_options())
        try:
            row = repl.execute(export_snapshot_command(repl, self.slot)).fetchone()
            assert row is not None
            consistent = Lsn.parse(row[1])
            highest = resume.highest()
            if highest is not None and consistent.value <= highest.commit_lsn:
                # Snapshot rows would sort before events already in the log (and be skipped).
                msg = (
                    f"source {self.name}: the new slot starts at {consistent}, not after the log's last change "
                    f"at {Lsn(highest.commit_lsn)}: the database is not the one this log was captured from "
                    "(restored from a backup or failed over?); capture it into a new log (another home or source name)"
                )
                raise SlotError(msg, source=self.name, slot=self.slot)
            state = SnapshotState(state.path, consistent_lsn=consistent.value)
            state.save()
            if request is not None:
                request.consistent_lsn = consistent.value
                request.save()
            self._snapshot.read(builder, resume, state, exported=str(row[2]), reconcile=reconcile)
            self.snapshotted = True
        finally:
            repl.close()
        return state

    def _enable_failover(self) -> None:
        """Give a slot made before failover slots (or by hand) ``failover`` (17+), so a promotion keeps it."""
        try:
            with psycopg.connect(self._dsn, autocommit=True, replication="database") as repl:
                enable_failover(repl, self.slot)
        except psycopg.Error as exc:
            logger.warning(
                "source %s: could not enable failover on slot %s (%s): a failover would need 'headwater source resync'",
                self.name,
                self.slot,
                one_line(exc),
            )

    def _streamed_before(self, state: SnapshotState, resume: ResumePoint) -> bool:
        """Whether this source has taken changes from its slot (so a lost slot lost some).

        Rows of an unfinished initial snapshot do not count: nothing was streamed yet, so
        a new slot with a new exported snapshot loses nothing. Without a snapshot (mode
        ``never``), anything in the log came from the slot.
        """
        if state.completed or (self._state_dir / STREAMED_MARKER).exists():
            return True
        return self.source.snapshot == "never" and resume.highest() is not None

    def _mark_streamed(self) -> None:
        marker = self._state_dir / STREAMED_MARKER
        if not marker.exists():
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.write_text(orjson.dumps({"slot": self.slot}).decode())
