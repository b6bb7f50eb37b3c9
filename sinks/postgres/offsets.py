"""The PostgreSQL sink's checkpoints: a table in the target database, written in each batch's transaction.

``<schema>.headwater_sink_offsets (group_id, topic, partition, next_offset, owner)``: the
:class:`~log.offset_store.OffsetStore` contract over PostgreSQL. A member that gains a
partition claims it (its ownership token replaces the previous owner's); every batch saves
its next offsets only where the token is still the claimed one, in the transaction that
writes the rows, so a former owner's late batch rolls back whole.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from psycopg import sql

from log.base import TopicPartition
from log.consumer import Checkpoint
from log.errors import FencedMemberError

TABLE = "headwater_sink_offsets"


class PostgresOffsets:
    """Claims, reads and saves checkpoints in ``<schema>.headwater_sink_offsets``."""

    def __init__(self, schema: str) -> None:
        self._table = sql.Identifier(schema, TABLE)
        #: The checkpoints' update by number of partitions.
        self._updates: dict[int, bytes] = {}

    def create(self, conn: Any) -> None:
        """Create the table if it is missing (in the caller's transaction)."""
        conn.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (group_id text NOT NULL, topic text NOT NULL, "
                "partition integer NOT NULL, next_offset bigint, owner text NOT NULL, "
                "PRIMARY KEY (group_id, topic, partition))"
            ).format(self._table)
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
        """Store ``checkpoints`` in the open transaction (one statement); :class:`FencedMemberError` where not owned."""
        self.send(conn, group, checkpoints)()

    def send(self, conn: Any, group: str, checkpoints: Mapping[TopicPartition, Checkpoint]) -> Callable[[], None]:
        """Send the update of ``checkpoints``; the check it returns raises :class:`FencedMemberError` where not owned.

        In a pipeline, call the check after the pipeline's sync (its rows have arrived by then: no
        round trip of its own); elsewhere at once (:meth:`save`). Either way inside the transaction.
        """
        if not checkpoints:
            return _nothing
        ordered = sorted(checkpoints.items())
        statement = self._updates.get(len(ordered))
        if statement is None:  # one text per number of partitions, built once
            rows = sql.SQL(", ").join(sql.SQL("(%s, %s::integer, %s::bigint, %s)") for _ in ordered)
            statement = self._updates[len(ordered)] = (
                sql.SQL(
                    "UPDATE {} o SET next_offset = c.next_offset "
                    "FROM (VALUES {}) AS c(topic, partition, next_offset, owner) "
                    "WHERE o.group_id = %s AND o.topic = c.topic AND o.partition = c.partition AND o.owner = c.owner "
                    "RETURNING o.topic, o.partition"
                )
                .format(self._table, rows)
                .as_bytes(conn)
            )
        params: list[Any] = []
        for tp, checkpoint in ordered:
            params += [tp.topic, tp.partition, checkpoint.offset, checkpoint.owner]
        cursor = conn.execute(statement, [*params, group])

        def check() -> None:
            updated = {(topic, partition) for topic, partition in cursor.fetchall()}
            for tp, checkpoint in ordered:
                if (tp.topic, tp.partition) not in updated:
                    raise FencedMemberError(
                        group,
                        checkpoint.owner,
                        tp.topic,
                        tp.partition,
                        "another member claimed it in the target database",
                    )

        return check

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


def _nothing() -> None:
    """No checkpoints: nothing to check."""
