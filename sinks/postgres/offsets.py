"""The PostgreSQL sink's checkpoints: a table in the target database, written in each batch's transaction.

``<schema>.headwater_sink_offsets (group_id, topic, partition, next_offset, owner)``: the
:class:`~log.offset_store.OffsetStore` contract over PostgreSQL. A member that gains a
partition claims it (its ownership token replaces the previous owner's); every batch saves
its next offsets only where the token is still the claimed one, in the transaction that
writes the rows, so a former owner's late batch rolls back whole. The refusal happens in the
server (``<schema>.headwater_sink_fence`` raises :data:`FENCED`), so the batch's ``COMMIT`` can be
sent with its statements, in one round trip: after the refusal PostgreSQL runs nothing more of it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
import psycopg
from psycopg import sql

from log.base import TopicPartition
from log.consumer import Checkpoint
from log.errors import FencedMemberError

TABLE = "headwater_sink_offsets"
FENCE = "headwater_sink_fence"
#: The SQLSTATE of a save refused because another member claimed a partition (its detail: ``[topic, partition]``).
FENCED = "HWF01"


class PostgresOffsets:
    """Claims, reads and saves checkpoints in ``<schema>.headwater_sink_offsets``."""

    def __init__(self, schema: str) -> None:
        self._table = sql.Identifier(schema, TABLE)
        self._fence = sql.Identifier(schema, FENCE)
        #: The checkpoints' update by number of partitions.
        self._updates: dict[int, bytes] = {}

    def create(self, conn: Any) -> None:
        """Create the table and the fence's function if they are missing (in the caller's transaction)."""
        conn.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (group_id text NOT NULL, topic text NOT NULL, "
                "partition integer NOT NULL, next_offset bigint, owner text NOT NULL, "
                "PRIMARY KEY (group_id, topic, partition))"
            ).format(self._table)
        )
        # Members starting together: one creates the function, the others then find it.
        fence = self._fence.as_string(conn)
        conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (fence,))
        if conn.execute("SELECT to_regprocedure(%s)", (f"{fence}(text, integer)",)).fetchone()[0] is None:
            conn.execute(
                sql.SQL(
                    "CREATE FUNCTION {}(topic text, part integer) RETURNS void LANGUAGE plpgsql AS $$ BEGIN "
                    "RAISE EXCEPTION 'another member claimed partition % of %', part, topic "
                    "USING ERRCODE = {}, DETAIL = json_build_array(topic, part)::text; END $$"
                ).format(self._fence, sql.Literal(FENCED))
            )

    def claim(self, conn: Any, group: str, owners: Mapping[TopicPartition, str]) -> dict[TopicPartition, int]:
        """Make each token its partition's owner and return the stored next offsets (one transaction)."""
        found: dict[TopicPartition, int] = {}
        with conn.transaction():
            for tp, owner in sorted(owners.items()):
                row = conn.execute(
                    sql.SQL(
                        "INSERT INTO {} (group_id, topic, partition, next_offset, owner) VALUES (%s, %s, %s, NULL, %s) "
                        "ON CONFLICT (group_id, topic, partition) DO UPDATE SET owner = excluded.owner "
                        "RETURNING next_offset"
                    ).format(self._table),
                    (group, tp.topic, tp.partition, owner),
                ).fetchone()
                if row is not None and row[0] is not None:
                    found[tp] = int(row[0])
        return found

    def stored(self, conn: Any, group: str, partition: TopicPartition) -> int | None:
        """The next offset stored for ``partition`` (no claim)."""
        with conn.transaction():
            row = conn.execute(
                sql.SQL("SELECT next_offset FROM {} WHERE group_id = %s AND topic = %s AND partition = %s").format(
                    self._table
                ),
                (group, partition.topic, partition.partition),
            ).fetchone()
        return None if row is None or row[0] is None else int(row[0])

    def save(self, conn: Any, group: str, checkpoints: Mapping[TopicPartition, Checkpoint]) -> None:
        """Send the update of ``checkpoints`` in the open transaction (one statement, nothing to read back).

        Where a token is no longer the claimed one the server refuses the statement (:data:`FENCED`;
        :meth:`refused` tells it), in a pipeline before any ``COMMIT`` queued after it.
        """
        if not checkpoints:
            return
        ordered = sorted(checkpoints.items())
        statement = self._updates.get(len(ordered))
        if statement is None:  # one text per number of partitions, built once
            rows = sql.SQL(", ").join(sql.SQL("(%s, %s::integer, %s::bigint, %s)") for _ in ordered)
            statement = self._updates[len(ordered)] = (
                sql.SQL(
                    "WITH c (topic, partition, next_offset, owner) AS (VALUES {}), "
                    "u AS (UPDATE {} o SET next_offset = c.next_offset FROM c "
                    "WHERE o.group_id = %s AND o.topic = c.topic AND o.partition = c.partition AND o.owner = c.owner "
                    "RETURNING o.topic, o.partition) "
                    "SELECT {}(c.topic, c.partition) FROM c "
                    "WHERE NOT EXISTS (SELECT FROM u WHERE u.topic = c.topic AND u.partition = c.partition)"
                )
                .format(rows, self._table, self._fence)
                .as_bytes(conn)
            )
        params: list[Any] = []
        for tp, checkpoint in ordered:
            params += [tp.topic, tp.partition, checkpoint.offset, checkpoint.owner]
        conn.execute(statement, [*params, group])

    @staticmethod
    def refused(
        exc: psycopg.Error, group: str, checkpoints: Mapping[TopicPartition, Checkpoint]
    ) -> FencedMemberError | None:
        """The :class:`FencedMemberError` of a save the server refused (``exc``), or None for another error."""
        if getattr(exc, "sqlstate", None) != FENCED:
            return None
        topic, partition = orjson.loads(exc.diag.message_detail or "[]") or ("?", -1)
        checkpoint = checkpoints.get(TopicPartition(topic, partition))
        return FencedMemberError(
            group,
            checkpoint.owner if checkpoint is not None else "?",
            topic,
            partition,
            "another member claimed it in the target database",
        )

    def rewind(self, conn: Any, group: str, offsets: Mapping[TopicPartition, int]) -> None:
        """Store ``offsets`` with no owner (a running member's next save is refused), in one transaction."""
        with conn.transaction():
            for tp, offset in sorted(offsets.items()):
                conn.execute(
                    sql.SQL(
                        "INSERT INTO {} (group_id, topic, partition, next_offset, owner) VALUES (%s, %s, %s, %s, '') "
                        "ON CONFLICT (group_id, topic, partition) DO UPDATE SET next_offset = excluded.next_offset, "
                        "owner = ''"
                    ).format(self._table),
                    (group, tp.topic, tp.partition, offset),
                )
