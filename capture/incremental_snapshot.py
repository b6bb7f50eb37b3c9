"""Requesting an incremental snapshot, and running one to completion (``headwater snapshot``, Dagster).

A request is a file the source's capture agent picks up (:mod:`capture.incremental_snapshotter`
reads the tables between watermarks while streaming goes on).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from capture.errors import UnknownSourceError
from capture.identifiers import TableName, parse_tables
from capture.incremental_snapshotter import (
    REQUEST_POLL_S,
    REQUESTS_DIR,
    STATE_FILE,
    IncrementalSnapshotError,
    IncrementalState,
)
from capture.registration import connect
from capture.runner import run_capture
from capture.slot import slot_status
from core.config import ProjectConfig
from core.durable_files import replace_json


def request_incremental_snapshot(state_dir: Path, tables: Sequence[str]) -> tuple[str, tuple[TableName, ...]]:
    """Record a request to re-snapshot ``tables`` (``schema.table``); return its id and the parsed names.

    The source's capture agent picks it up within :data:`REQUEST_POLL_S` when it runs,
    else at its next start.
    """
    names = parse_tables(list(tables))
    if not names:
        msg = "give at least one table, e.g. --tables public.orders"
        raise IncrementalSnapshotError(msg)
    request_id = f"{time.time_ns():020d}-{secrets.token_hex(4)}"
    replace_json(state_dir / REQUESTS_DIR / f"{request_id}.json", {"id": request_id, "tables": [str(t) for t in names]})
    return request_id, names


def snapshot_tables(config: ProjectConfig, source: str, tables: Sequence[str]) -> tuple[TableName, ...]:
    """``tables`` as names, refused unless ``source`` is configured and captures every one of them."""
    if source not in config.sources:
        where = config.config_path or "headwater.yaml"
        msg = f"no source named {source!r} in {where}; known: {', '.join(config.sources) or 'none'}"
        raise UnknownSourceError(msg, source=source)
    names = parse_tables(list(tables))
    if not names:
        msg = f"give at least one table of source {source!r} to snapshot, e.g. public.orders"
        raise IncrementalSnapshotError(msg, source=source)
    settings = config.sources[source]
    if settings.tables is not None:
        captured = {TableName.parse(t) for t in settings.tables}
        missing = [t for t in names if t not in captured]
        scope = "tables " + ", ".join(sorted(map(str, captured)))
    else:
        missing = [t for t in names if t.schema not in (settings.schemas or ())]
        scope = "schemas " + ", ".join(settings.schemas or ())
    if missing:
        msg = (
            f"source {source!r} does not capture {', '.join(map(str, missing))} (it captures {scope}); "
            f"snapshot only tables it captures, or add them with 'headwater source add'"
        )
        raise IncrementalSnapshotError(msg, source=source, table=str(missing[0]))
    return names


def request_done(state_dir: Path, request_id: str) -> bool:
    """True once an agent took request ``request_id`` and emitted (durably) every chunk of its tables."""
    if (state_dir / REQUESTS_DIR / f"{request_id}.json").exists():
        return False
    return all(t.request != request_id for t in IncrementalState.load(state_dir / STATE_FILE).tables)


@dataclass(frozen=True, slots=True)
class SnapshotRun:
    """A finished incremental snapshot: its request, tables, and whether a running agent did it."""

    request_id: str
    tables: tuple[TableName, ...]
    by_running_agent: bool


def run_incremental_snapshot(
    config: ProjectConfig, source: str, tables: Sequence[str], *, timeout_s: float = 3600.0
) -> SnapshotRun:
    """Re-snapshot ``tables`` of ``source`` and return once their rows are durably in the log.

    When an agent streams the source (its slot is active), the request is left to it and
    this waits until the agent has emitted every chunk; otherwise a capture runs until
    caught up, which returns only once the queued snapshot is done. Either way streaming
    goes on, and the rows never overwrite a newer change (see the module docstring).
    """
    names = snapshot_tables(config, source, tables)
    settings = config.sources[source]
    state_dir = config.home_dir / "capture" / source
    with connect(settings.dsn.get_secret_value(), source=source) as conn:
        status = slot_status(conn, settings.slot or f"headwater_{source}")
    request_id, _ = request_incremental_snapshot(state_dir, [str(n) for n in names])
    if status is None or not status.active:
        run_capture(config, (source,), until_caught_up=True)
        return SnapshotRun(request_id, names, by_running_agent=False)
    deadline = time.monotonic() + timeout_s
    while not request_done(state_dir, request_id):
        if time.monotonic() > deadline:
            msg = (
                f"incremental snapshot {request_id} of {', '.join(map(str, names))} is not done after "
                f"{timeout_s:.0f} s; the capture agent streaming {source!r} (process {status.active_pid}) still "
                "holds it and finishes it while it runs"
            )
            raise IncrementalSnapshotError(msg, source=source)
        time.sleep(REQUEST_POLL_S / 5)
    return SnapshotRun(request_id, names, by_running_agent=True)
