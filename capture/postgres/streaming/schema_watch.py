"""Schema changes of published tables, followed exactly while streaming goes on.

Two ways a DDL reaches capture:

* **A Relation message.** pgoutput sends one before the first change of a table after its
  definition changed; the event builder records the new schema version there
  (:meth:`capture.postgres.events.relations.Relations.relation`, placed at that change's position).
* **A catalog check**, for a DDL no change follows (the Relation would never come): at start
  (before the ``--until-caught-up`` marker) and at every heartbeat, the catalog of every
  published table is compared with its topic's latest schema record. A table that differs,
  or one new in the publication, gets a ``schema-check <token>`` marker written into the WAL
  *after* the catalog was read. When the marker arrives in the stream the DDL is behind it;
  if no Relation of the table came in between (the stream would have recorded that change
  itself), the state read then becomes the table's next schema version, placed at the
  marker's position. A change of the table after the marker is found by the next check.
  A table being read again after a schema change is not checked until the re-read is done:
  the re-read shows the rows in the stream's shape (:mod:`capture.postgres.snapshot.reread_columns`)
  and its values belong before the next version (capture stopped across several DDLs replays
  the first one's Relation while the catalog holds the last one's state). A run that ends
  when caught up checks once more after its re-reads, and goes on while that check finds
  a table that differs (:meth:`SchemaWatch.settled`).

Either way, a change that leaves existing rows with values the stream never carried
(:mod:`capture.postgres.events.schema_transitions`) queues an incremental re-read of the table
(:mod:`capture.postgres.snapshot.incremental`): its rows arrive as ordinary ``op: r`` events while
streaming goes on, and ``--until-caught-up`` waits for it; when a partition was detached or
dropped, the keys the log holds that the table no longer has get deletes at the re-read's end
(a reconciling re-read). A table that cannot be re-read
(no primary key to read it by) stops capture with one line naming ``source resync``; nothing
after the change is acknowledged, so nothing wrong reaches the log.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import psycopg

from capture.errors import SchemaChangeError
from capture.postgres.catalog_state import CatalogTable, published_tables
from capture.postgres.events.builder import EventBuilder
from capture.postgres.events.relations import Reread
from capture.postgres.events.schema_transitions import REWRITTEN
from capture.postgres.identifiers import TableName
from capture.postgres.snapshot.incremental import SCHEMA_REQUEST, IncrementalSnapshotter, reread_topics
from capture.postgres.streaming.markers import emit_marker
from capture.records import SchemaRecord
from log.sequence import Sequence as Seq

logger = logging.getLogger(__name__)

SCHEMA_CHECK: Final = "schema-check"


@dataclass(frozen=True, slots=True)
class _Check:
    """Tables a catalog check found changed, each with how many Relations the stream had cached of it then."""

    tables: tuple[tuple[CatalogTable, int], ...]


class SchemaWatch:
    """Finds schema changes no change announces, and queues the re-reads schema changes need."""

    def __init__(self, source: str, publication: str, *, read_new_tables: bool = True) -> None:
        self._source = source
        self._publication = publication
        # A table new in the publication is read once, unless the source takes no snapshots at all.
        self._read_new_tables = read_new_tables
        self._pending: dict[str, _Check] = {}
        #: Re-reads queued for new storage alone (request ids by topic): a TRUNCATE in the stream
        #: after them explains that storage (see :meth:`follow`).
        self._storage_rereads: dict[str, set[str]] = {}

    def check(
        self, conn: psycopg.Connection[Any], builder: EventBuilder, incremental: IncrementalSnapshotter | None = None
    ) -> str | None:
        """Compare the publication's tables with their schema records; mark the stream when one differs.

        Tables ``incremental`` is reading again after a schema change are left for a later check.
        Returns the marker's token (None: nothing differs, or a check is already on its way).
        """
        if self._pending:
            return None  # one check in flight at a time: the next heartbeat looks again
        relations = builder.relations
        rereading = _rereading(incremental)
        differ = [table for table in published_tables(conn, self._publication).values() if relations.differs(table)]
        found = tuple(
            (table, relations.relation_count(table.oid))
            for table in differ
            if relations.topic_for(table.oid, table.namespace, table.name) not in rereading
        )
        if not found:
            return None
        token = emit_marker(conn, SCHEMA_CHECK, token="", transactional=False)
        assert token is not None
        self._pending[token] = _Check(found)
        return token

    def settled(
        self, conn: psycopg.Connection[Any], builder: EventBuilder, incremental: IncrementalSnapshotter
    ) -> bool:
        """Check once more; True when nothing differs (no check in flight), so a caught-up run may end.

        A check at start can be overtaken: the stream replays an earlier DDL's Relation before its
        marker, which then leaves the table to the next check; a check held back for a re-read waits too.
        """
        if not self._pending:
            self.check(conn, builder, incremental)
        return not self._pending

    def reset(self) -> None:
        """Forget checks in flight (the replication connection was lost; the next check looks again)."""
        self._pending.clear()

    def on_marker(
        self, token: str | None, at: Seq, builder: EventBuilder, incremental: IncrementalSnapshotter
    ) -> list[SchemaRecord]:
        """The check ``token`` arrived in the stream at ``at``: record what no Relation recorded meanwhile."""
        check = self._pending.pop(token or "", None)
        if check is None:
            return []  # a marker of an earlier session (re-sent by the slot): its check is gone
        relations = builder.relations
        records = []
        for table, seen in check.tables:
            if relations.relation_count(table.oid) != seen:
                continue  # a Relation of the table came first and was recorded where it belongs
            new = relations.latest_schema(relations.topic_for(table.oid, table.namespace, table.name)) is None
            record = builder.relation(table.relation(), at=at, table=table)
            if record is not None:
                records.append(record)
                logger.info("source %s: schema of %s changed (found in the catalog)", self._source, table.qualified)
            if new and self._read_new_tables:
                # A table new to the log whose rows did not come as changes (created by a statement
                # that writes no row change, moved into a captured schema, added to the publication).
                topic = relations.topic_for(table.oid, table.namespace, table.name)
                reason = "the table is new in the publication"
                self.queue(
                    [Reread(topic, table.namespace, table.name, 1, reason, bool(table.primary_key), oid=table.oid)],
                    incremental,
                )
        self.follow(builder, incremental)
        return records

    def follow(self, builder: EventBuilder, incremental: IncrementalSnapshotter) -> None:
        """Act on what the stream built since the last call: truncations first, then new re-reads.

        The catalog is read when a Relation is recorded, later than the stream's position, so new
        storage it shows may come from a TRUNCATE further on in the stream (seen: a partitioned
        table read again, its rows inserted after the TRUNCATE sent twice). A re-read queued for
        new storage alone is dropped when that TRUNCATE arrives: the stream says every row is
        gone and rows after it come as changes. Its chunks cannot have closed before: their
        watermarks were written after the catalog showed the new storage, so after the TRUNCATE.
        Re-reads built in the same stretch of the stream as a TRUNCATE but before it were dropped
        by the builder (:meth:`~capture.postgres.events.relations.Relations.truncated`); those after
        it are queued here after the drop, so they stay.
        """
        for topic in builder.take_truncations():
            requests = self._storage_rereads.pop(topic, set())
            if requests and incremental.drop_requests(requests):
                logger.info(
                    "source %s: %s was truncated in the stream; its re-read for new storage is not needed",
                    self._source,
                    topic,
                )
        self.queue(builder.take_rereads(), incremental)

    def queue(self, rereads: Sequence[Reread], incremental: IncrementalSnapshotter) -> None:
        """Queue each table's re-read; refuse (one line) a table that cannot be re-read."""
        for reread in rereads:
            table = str(TableName(reread.schema, reread.name))
            if not reread.has_primary_key:
                msg = (
                    f"source {self._source}: table {reread.qualified} changed ({reread.reason}) and its rows must be "
                    f"read again, but it has no primary key to read them by; nothing after the change was "
                    f"acknowledged. Run 'headwater source resync {self._source}' (a fresh slot and a re-snapshot)"
                )
                raise SchemaChangeError(msg, source=self._source, table=reread.qualified)
            request = f"{SCHEMA_REQUEST}{reread.topic}:v{reread.version}"
            # A partition detached or dropped took rows with it, no change in the stream: the re-read
            # also deletes every key the log holds that the table no longer has.
            if reread.reason == REWRITTEN:
                self._storage_rereads.setdefault(reread.topic, set()).add(request)
            if incremental.request_once(table, request, reconcile=reread.partitions_dropped, oid=reread.oid):
                logger.info(
                    "source %s: reading %s again (%s) while streaming goes on",
                    self._source,
                    reread.qualified,
                    reread.reason,
                )


def _rereading(incremental: IncrementalSnapshotter | None) -> frozenset[str]:
    """The topics ``incremental`` has a schema change's re-read of queued or in progress."""
    return frozenset() if incremental is None else reread_topics(request for _, request in incremental.queued())
