"""Running an incremental snapshot to completion, for any source kind (Dagster's ``resnapshot_source`` job).

The kind queues the request (:meth:`capture.source_kind.SourceKind.request_snapshot`). When an
agent captures the source elsewhere it carries the request out and this waits until the kind
says every row is in the log; otherwise a capture runs here until caught up, which returns only
once the queued snapshot is done. Either way streaming goes on, and the rows never overwrite a
newer change.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from capture.errors import CaptureError
from capture.kinds import kind_of
from capture.runner import run_capture
from core.config import ProjectConfig
from core.errors import PermanentError

#: How often the request is looked at while a running agent carries it out.
_POLL_S = 0.2


class SnapshotTimeoutError(CaptureError, PermanentError):
    """A running agent did not finish an incremental snapshot in the time given."""


@dataclass(frozen=True, slots=True)
class SnapshotRun:
    """A finished incremental snapshot: its request, tables (``schema.table``), and who carried it out."""

    request_id: str
    tables: tuple[str, ...]
    by_running_agent: bool


def run_incremental_snapshot(
    config: ProjectConfig, source: str, tables: Sequence[str], *, timeout_s: float = 3600.0
) -> SnapshotRun:
    """Re-snapshot ``tables`` of ``source`` and return once their rows are durably in the log."""
    kind = kind_of(config, source)
    request = kind.request_snapshot(config, source, tables, captured_only=True)
    holder = kind.holder(config, source)
    if holder is None:
        run_capture(config, (source,), until_caught_up=True)
        return SnapshotRun(request.request_id, request.tables, by_running_agent=False)
    deadline = time.monotonic() + timeout_s
    while not kind.snapshot_done(config, source, request.request_id):
        if time.monotonic() > deadline:
            msg = (
                f"incremental snapshot {request.request_id} of {', '.join(request.tables)} is not done after "
                f"{timeout_s:.0f} s; the capture agent streaming {source!r} ({holder.describe()}) still holds it "
                "and finishes it while it runs"
            )
            raise SnapshotTimeoutError(msg, source=source)
        time.sleep(_POLL_S)
    return SnapshotRun(request.request_id, request.tables, by_running_agent=True)
