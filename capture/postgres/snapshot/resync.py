"""Resynchronising a source whose replication slot is gone: a fresh slot plus a re-snapshot.

When a slot is dropped or invalidated (``wal_status = 'lost'``), the changes between
its last acknowledged position and now can no longer be streamed. Capture refuses to
go on (creating a new slot and streaming from it would skip them silently) and asks
for ``headwater source resync NAME``, which

1. checks the source (reachable, slot not in use, publication present),
2. records a :class:`~capture.resync.ResyncRequest` in the source's capture state directory,
3. drops what is left of the slot and creates a fresh one (WAL is kept from now on).

The next capture run sees the request and re-snapshots every published table with a
slot created with an exported snapshot (so rows and stream line up exactly). The log
then converges to the source:

* every current row is written as an ``op: r`` event at the new slot's consistent
  point, which is past every position already in the log (checked), so it sorts after
  everything there and before every change streamed afterwards;
* every key the log still holds as live but the source no longer has (deleted while
  the slot was gone) gets a delete event plus tombstone at the same point
  (:func:`vanished_key_deletes`, PostgreSQL's events over :func:`capture.resync.vanished_key_deletes`,
  which the MySQL kind shares), so nothing deleted meanwhile lingers downstream. The
  keys the re-snapshot read are held in a :class:`~capture.key_set.KeySet`, the log's
  live keys it did not read in :class:`~capture.key_set.Candidates`; both spill to one
  file in the capture state directory past a threshold, and the deletes are appended
  as they are generated, so a table of any size or delete history (and a mass delete
  while the slot was gone) is reconciled in bounded memory.

The request (and the spilled key set with it) is cleared only after the snapshot and
the deletes are durable; a run interrupted before that starts the re-snapshot over
with a new slot and an empty key set (nothing was acknowledged from the old one, and
the new snapshot covers everything before it).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from capture import resync as reconcile
from capture.errors import (
    CancelledError,
    PrerequisiteError,
    PublicationError,
    SlotError,
    UnknownSourceError,
)
from capture.key_set import KeySet
from capture.postgres.events.source_block import postgres_source
from capture.postgres.identifiers import TableName, quote_part
from capture.postgres.registration import publication as pub
from capture.postgres.registration import slot as slots
from capture.postgres.registration.registry import connect, object_names
from capture.postgres.registration.slot import SlotStatus
from capture.records import OutRecord
from capture.resync import ResyncRequest
from core.config import ProjectConfig
from log.base import Log
from log.columns import ColumnarReads
from log.envelope import ChangeEvent, Op, SnapshotMarker, encode_value
from log.reading import read_range_columns
from log.sequence import Lsn


def capture_state_dir(config: ProjectConfig, name: str) -> Path:
    """Where capture keeps a source's state (snapshot progress, resync request)."""
    return config.home_dir / "capture" / name


# -- reconciling deletes ------------------------------------------------------------------------


def snapshot_keys(log: Log, topic: str, start: Mapping[int, int], present: KeySet) -> None:
    """Add to ``present`` the keys ``topic`` received from ``start`` (end offsets before the re-snapshot) on.

    The re-snapshot is the only writer meanwhile, so these are the keys of the rows it
    read, encoded exactly as the log holds them, whichever path (native batches or
    records) wrote them. The topic is registered even when it holds none.
    """
    present.add(topic, ())
    if topic not in log.list_topics():
        return
    for partition in range(log.describe_topic(topic).partitions):
        offset = start.get(partition, 0)
        if isinstance(log, ColumnarReads):  # the columnar read: the key column straight from the batches
            for columns in read_range_columns(log, topic, partition, offset, log.end_offset(topic, partition)):
                present.add(topic, [key for key in columns.keys.to_pylist() if key is not None])
            continue
        while records := log.read(topic, partition, offset):
            present.add(topic, [r.key for r in records if r.key is not None])
            offset = records[-1].offset + 1


def vanished_key_deletes(
    log: Log,
    topic: str,
    present: KeySet,
    *,
    commit_lsn: int,
    first_index: int,
    ts_us: int,
    end: Mapping[int, int] | None = None,
    marker: SnapshotMarker = SnapshotMarker.TRUE,
) -> Generator[OutRecord, None, None]:
    """PostgreSQL delete events (each followed by a tombstone) for keys live in ``topic`` but not in ``present``.

    :func:`capture.resync.vanished_key_deletes` with PostgreSQL's ``source`` block: the
    last event's names, the re-snapshot's point as ``lsn``/``commit_lsn``, ``marker``.
    """

    def delete_value(event: dict[str, Any], index: int) -> bytes:
        return _reconciling_event(Op.DELETE, event, commit_lsn=commit_lsn, index=index, ts_us=ts_us, marker=marker)

    return reconcile.vanished_key_deletes(
        log, topic, present, delete_value, commit_lsn=commit_lsn, first_index=first_index, end=end
    )


def vanished_truncate(
    event: dict[str, Any], *, commit_lsn: int, index: int, ts_us: int, marker: SnapshotMarker = SnapshotMarker.TRUE
) -> bytes:
    """A resync's truncate (keyless) of the table of ``event``, found gone at the re-snapshot's point."""
    return _reconciling_event(Op.TRUNCATE, event, commit_lsn=commit_lsn, index=index, ts_us=ts_us, marker=marker)


def _reconciling_event(
    op: Op, event: dict[str, Any], *, commit_lsn: int, index: int, ts_us: int, marker: SnapshotMarker
) -> bytes:
    """A delete (``before``: the last event's ``after``) or truncate of the last event's table at the point."""
    old = event["source"]
    source = postgres_source(
        name=old["name"],
        db=old["db"],
        schema=old["schema"],
        table=old["table"],
        tx_id=None,
        lsn=commit_lsn,
        commit_lsn=commit_lsn,
        txn_index=index,
        ts_us=ts_us,
        snapshot=marker,
    )
    before = event.get("after") if op == Op.DELETE else None
    return encode_value(ChangeEvent(op=op, source=source, before=before, ts_us=ts_us))


def gone_tables(conn: Any, log: Log, source: str, publication: str, unread: Iterable[str]) -> list[str]:
    """The topics in ``unread`` whose table does not exist in the snapshot's catalog; refuses one that does.

    ``conn`` is in the re-snapshot's transaction, so ``pg_class`` is read as of its point,
    and the catalog lists every table whatever the capture user may read: only a table that
    is not there counts as dropped. One that is there but not published (dropped and
    re-created under its name while the slot was gone, as a drop takes a table out of its
    publications, or taken out by hand) is refused in one line: the resync cannot re-read it,
    and its old rows would stay live. The table's names are its events'
    (:func:`capture.resync.topic_table`).
    """
    gone = []
    for topic in unread:
        names = reconcile.topic_table(log, topic, "schema")
        if names is None:
            continue  # no row event, so no live key to delete
        found = conn.execute(
            "SELECT 1 FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relname = %s",
            names,
        ).fetchone()
        if found is None:
            gone.append(topic)
            continue
        table = str(TableName(*names))
        msg = (
            f"source {source}: table {table} is captured but publication {publication} does not publish it (dropped "
            f"and re-created while the slot was gone, or taken out of the publication), so the resync cannot re-read "
            f"it; run ALTER PUBLICATION {quote_part(publication)} ADD TABLE {table}, or take it out of "
            f"sources.{source}.tables, then run 'headwater capture {source}' again (the resync stays requested)"
        )
        raise PrerequisiteError(msg, source=source)
    return gone


def refuse_keyless(source: str, table: str) -> None:
    """Refuse a resync of a keyless table in one line (:func:`capture.resync.keyless_refusal`)."""
    raise PrerequisiteError(reconcile.keyless_refusal(source, table, "the slot was gone"), source=source)


# -- the command's library side -----------------------------------------------------------------


@dataclass(frozen=True)
class ResyncResult:
    """What ``headwater source resync`` did."""

    name: str
    slot: str
    publication: str
    #: The old slot: ``dropped`` (did not exist), ``invalidated`` or ``healthy``.
    previous: str
    lost_from: Lsn | None
    new_slot_lsn: Lsn
    targets: str


def _previous(status: SlotStatus | None) -> str:
    if status is None:
        return "dropped"
    return "invalidated" if status.wal_status == "lost" else "healthy"


def resync_question(config: ProjectConfig, name: str) -> str:
    """The confirmation question for ``resync``."""
    source = _source(config, name)
    slot, _ = object_names(name, source)
    return (
        f"drop what is left of replication slot {slot}, create a fresh one and re-snapshot every table of "
        f"source {name} at the next 'headwater capture'? Rows deleted meanwhile are written as deletes"
    )


def _source(config: ProjectConfig, name: str) -> Any:
    if name not in config.sources:
        known = ", ".join(sorted(config.sources)) or "none"
        msg = f"no source named {name} in {config.config_path} (registered: {known}); see 'headwater source list'"
        raise UnknownSourceError(msg, source=name)
    return config.sources[name]


def resync_source(config: ProjectConfig, name: str, *, confirm: Callable[[str], bool] | None = None) -> ResyncResult:
    """Check the source, record a resync request, and replace its slot with a fresh one."""
    source = _source(config, name)
    slot, publication = object_names(name, source)
    with connect(source.dsn.get_secret_value(), source=name) as conn:
        status = slots.slot_status(conn, slot)
        if status is not None and status.active:
            msg = (
                f"source {name}: replication slot {slot} is in use by process {status.active_pid}; "
                f"stop 'headwater capture {name}' first, then run the resync again"
            )
            raise SlotError(msg, source=name, slot=slot)
        info = pub.publication_info(conn, publication)
        if info is None:
            msg = (
                f"source {name}: publication {publication} does not exist, so there is nothing to re-snapshot; "
                f"re-register the source ('headwater source remove {name}' then 'headwater source add')"
            )
            raise PublicationError(msg, source=name, publication=publication)
        if confirm is not None and not confirm(resync_question(config, name)):
            msg = f"cancelled: slot {slot} and the capture state of source {name} are unchanged"
            raise CancelledError(msg, source=name)
        lost_from = status.confirmed_flush_lsn if status is not None else None
        previous = _previous(status)
        # The request first: should anything below fail, capture still re-snapshots
        # instead of streaming from a slot that missed changes.
        ResyncRequest.new(capture_state_dir(config, name), f"source resync (slot was {previous})", lost_from).save()
        slots.drop_slot(conn, slot, source=name)
        new_lsn = slots.create_slot(conn, slot, source=name)
    return ResyncResult(name, slot, publication, previous, lost_from, new_lsn, info.describe_targets())
