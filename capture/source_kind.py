"""The source interface: what capture needs from one kind of source database (``sources.<name>.kind``).

A source kind (PostgreSQL today, :mod:`capture.postgres`) turns one database's changes into
change events in the log. The stages, the CLI, Dagster and ``operations`` never import a kind:
they ask :mod:`capture.kinds` for the kind of a configured source and call this interface.

Contract every kind keeps (the conformance of the PostgreSQL kind is the test suite):

* **Registration** (:meth:`SourceKind.add`) checks every prerequisite before it creates
  anything, names each problem in one line with its fix, creates what the source needs
  (PostgreSQL: publication, then slot) and only then records the source in
  ``headwater.yaml`` (:mod:`capture.config_document`). A failure leaves nothing behind.
* **Capture** (:meth:`SourceKind.agent`) is one :class:`Agent` per source: an initial
  snapshot as ``snapshot`` asks, then streaming. Events and schema records go to the log
  through the source-neutral writers of :mod:`capture` (:class:`capture.appender.Appender`,
  :mod:`capture.records`, :class:`capture.source_topics.SourceTopics`); a position is
  acknowledged to the source (:class:`Acknowledgement`) only after every event up to it is
  durable in the log, and records the log already holds are skipped on restart
  (:class:`capture.position.ResumePoint`), so nothing is lost or written twice.
* **Positions** are the kind's own value objects; every event carries its place in the
  source's total order as the log's :class:`log.sequence.Sequence` (see :mod:`log.position`).
* **Types**: each column's values are written in the form of its logical type
  (:mod:`log.row_types`), recorded with the column in ``_headwater.schemas``.
* **Snapshots**: initial (consistent with the stream's start), incremental (while
  streaming, requested by :meth:`SourceKind.request_snapshot` or a signal) and resync
  (:meth:`SourceKind.resync`: a fresh start position plus a re-snapshot that writes deletes
  for rows gone meanwhile).
* **Signals** (``sources.<name>.signal_table``) are read by the kind from its stream and
  carried out by its agent.
* Errors are :class:`capture.errors.CaptureError` subclasses whose message is one line
  without secrets (a DSN's password never appears).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from core.config import ProjectConfig
from core.leases import Holder
from log.base import Log

if TYPE_CHECKING:
    from capture.stats import CaptureStats

#: Asked before anything is created or dropped; False cancels (:class:`capture.errors.CancelledError`).
Confirm = Callable[[str], bool]


class SnapshotProgress(Protocol):
    """Receives snapshot progress (the CLI shows a rich progress bar)."""

    def start(self, total_rows: int) -> None:
        """Reading starts; ``total_rows`` is the catalog's estimate."""

    def advance(self, rows: int) -> None:
        """``rows`` more rows were read."""

    def finish(self) -> None:
        """Reading ended."""


@dataclass(frozen=True, slots=True)
class SourceRequest:
    """``headwater source add``: a new source as the user asked for it (names as written)."""

    name: str
    dsn: str
    tables: Sequence[str] | None = None
    schemas: Sequence[str] | None = None
    snapshot: str = "initial"
    #: Settings only this kind knows (PostgreSQL: ``slot``, ``publication``); None values are left out.
    options: Mapping[str, str | None] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a registration, removal or resync did, as the CLI prints it."""

    name: str
    #: The one line saying what was done.
    summary: str
    #: The command to run next (None: nothing to run).
    next_step: str | None = None
    warnings: tuple[str, ...] = ()
    #: What the operator should know (not a problem).
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class SourceView:
    """A registered source as configured, with its live state (never a secret)."""

    name: str
    kind: str
    #: ``(label, value)`` rows in display order.
    rows: tuple[tuple[str, str], ...]
    #: The JSON form (``source show --json``).
    data: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class SnapshotRequest:
    """An incremental snapshot asked of a source: its id and the tables (canonical names)."""

    request_id: str
    tables: tuple[str, ...]


@runtime_checkable
class Agent(Protocol):
    """Captures one source into the log until caught up or stopped (see the module docstring)."""

    name: str
    #: Live counters, readable from another thread while :meth:`run` goes on.
    stats: CaptureStats

    def run(self, *, until_caught_up: bool) -> CaptureStats:
        """Snapshot as configured, then stream; return when caught up (if asked) or when stopped."""

    def stop(self) -> None:
        """Finish the transaction in hand, append and acknowledge it, then let :meth:`run` return."""


class Acknowledgement(Protocol):
    """Where an agent acknowledges positions to its source (PostgreSQL: the slot's standby status).

    Called only with a position whose events are all durable in the log; the source may then
    discard what lies before it, and re-sends from at or before it after a restart.
    """

    def send_status(self, position: Any) -> None:
        """Acknowledge ``position`` (also sent unchanged as a keepalive while the log cannot be written)."""


class SourceKind(Protocol):
    """One kind of source database: registration, capture, snapshots, status (see the module docstring).

    ``name`` is the value of ``sources.<name>.kind``. Methods take the validated config and
    the source's name; the source's settings are ``config.sources[name]``.
    """

    name: str

    # -- registration and prerequisites ------------------------------------------------------

    def add(self, config_path: Path, request: SourceRequest, *, confirm: Confirm | None) -> Outcome:
        """Check prerequisites, create what capture needs and add the source to ``config_path``."""

    def show(self, config: ProjectConfig, name: str) -> SourceView:
        """The source's settings and live state; an unreachable source is shown with the reason."""

    def removal_question(self, config: ProjectConfig, name: str) -> str:
        """What :meth:`remove` will drop, as a question to confirm."""

    def remove(self, config_path: Path, name: str) -> Outcome:
        """Drop what registration created and remove the source from ``config_path``."""

    def check(self, config: ProjectConfig, name: str) -> None:
        """Fail fast, in one line, when the source cannot be reached or logged into."""

    def status(self, config: ProjectConfig, name: str) -> dict[str, Any]:
        """The source's row of ``headwater status``, never a secret.

        Keys: ``source``, ``dsn`` (redacted), and those that apply: ``kind``, ``slot`` (PostgreSQL)
        or ``position`` (the last position acknowledged, as the kind prints it), ``active``,
        ``confirmed_flush_lsn``, ``wal_retained_bytes``, ``lag_bytes`` and ``lag_seconds`` (how far
        capture is behind the source's log end; ``/metrics`` shows them), ``error`` (why it was not read).
        """

    # -- capture ----------------------------------------------------------------------------

    def prepare_process(self) -> None:
        """Called once per capturing process before any agent starts (PostgreSQL names the process)."""

    def holder(self, config: ProjectConfig, name: str) -> Holder | None:
        """The process capturing this source elsewhere (another host, another client), or None."""

    def agent(self, config: ProjectConfig, name: str, log: Log, *, progress: SnapshotProgress | None) -> Agent:
        """A capture agent for source ``name`` writing to ``log``."""

    # -- snapshots -------------------------------------------------------------------------

    def request_snapshot(
        self, config: ProjectConfig, name: str, tables: Sequence[str], *, captured_only: bool = False
    ) -> SnapshotRequest:
        """Queue an incremental snapshot of ``tables``; with ``captured_only`` refuse tables not captured."""

    def snapshot_done(self, config: ProjectConfig, name: str, request_id: str) -> bool:
        """True once every row of the request is durably in the log."""

    def rereading(self, config: ProjectConfig, name: str) -> frozenset[str]:
        """Topics whose tables capture still reads again after a schema change (their rows not all in the log yet)."""

    def resync_question(self, config: ProjectConfig, name: str) -> str:
        """What :meth:`resync` will do, as a question to confirm."""

    def resync(self, config: ProjectConfig, name: str, *, confirm: Confirm | None) -> Outcome:
        """Start the source again from a fresh position; the next capture re-snapshots it."""

    # -- names -----------------------------------------------------------------------------

    def split_tables(self, text: str, *, what: str) -> list[str]:
        """A comma-separated list of table (or schema) names as written, split as this kind quotes names."""

    def table_topics(self, name: str, tables: Sequence[str]) -> list[str]:
        """The raw topics source ``name`` writes for configured ``tables`` (names as written)."""
