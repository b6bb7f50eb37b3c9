"""Requesting an incremental snapshot (``headwater snapshot``, Dagster) and knowing when it is done.

A request is a file the source's capture agent picks up (:mod:`capture.postgres.snapshot.incremental`
reads the tables between watermarks while streaming goes on); :mod:`capture.snapshots` runs one
to completion for any source kind.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from capture.errors import UnknownSourceError
from capture.incremental_queue import IncrementalSnapshotError, request_done, write_request
from capture.postgres.identifiers import TableName, parse_tables
from core.config import ProjectConfig

__all__ = ["request_done", "request_incremental_snapshot", "snapshot_tables"]


def request_incremental_snapshot(state_dir: Path, tables: Sequence[str]) -> tuple[str, tuple[TableName, ...]]:
    """Record a request to re-snapshot ``tables`` (``schema.table``); return its id and the parsed names.

    The source's capture agent picks it up (:func:`capture.incremental_queue.write_request`).
    """
    names = parse_tables(list(tables))
    if not names:
        msg = "give at least one table, e.g. --tables public.orders"
        raise IncrementalSnapshotError(msg)
    return write_request(state_dir, [str(t) for t in names]), names


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
