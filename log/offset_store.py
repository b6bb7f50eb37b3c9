"""Checkpoints stored with a consumer's own results, in one transaction: exactly-once processing.

LogHub's consumer library and Kafka's "store offsets outside Kafka" pattern: a consumer
that writes its results to a database keeps its read positions in the same database and
writes both in one transaction, so a crash leaves both or neither. Fencing keeps a paused
former owner from writing after its partition moved:

1. When a member gains a partition, the consumer **claims** it in the store: it records
   the member's ownership token (unique to this member holding this partition) and reads
   the stored next offset, in one transaction (:meth:`OffsetStore.claim`).
2. Every batch's results and checkpoints are written in one transaction of the caller's
   (:func:`commit_with_output`); the store refuses, with
   :class:`~log.errors.FencedMemberError`, a checkpoint whose token is not the partition's
   claimed one, so the caller's transaction rolls back with it.

:class:`SqliteOffsetStore` implements it over SQLite (the README shows a whole consumer).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol, TypeVar, runtime_checkable

from log.base import TopicPartition
from log.consumer import Checkpoint, Consumer
from log.errors import FencedMemberError

Transaction = TypeVar("Transaction")
Transaction_contra = TypeVar("Transaction_contra", contravariant=True)


class OffsetStore(Protocol[Transaction_contra]):
    """Where a consumer keeps its positions, beside its results (see the module docstring)."""

    def claim(self, group: str, owners: Mapping[TopicPartition, str]) -> dict[TopicPartition, int]:
        """Make each token its partition's owner, in one transaction; return the stored next offsets (if any)."""
        ...

    def save(
        self, transaction: Transaction_contra, group: str, checkpoints: Mapping[TopicPartition, Checkpoint]
    ) -> None:
        """Store checkpoints inside the caller's ``transaction``; :class:`FencedMemberError` if a token was replaced."""
        ...


@runtime_checkable
class ReadsOffsets(Protocol):
    """An offset store that can say what it holds for a partition without claiming it.

    A consumer of a split topic (:mod:`log.shards`) asks it whether a sealed parent was
    processed to its end before it reads the children.
    """

    def stored(self, group: str, partition: TopicPartition) -> int | None:
        """The next offset stored for ``partition``, or ``None``."""
        ...


def commit_with_output(
    consumer: Consumer,
    store: OffsetStore[Transaction],
    transaction: Transaction,
    offsets: Mapping[TopicPartition, int] | None = None,
) -> None:
    """Store the consumer's checkpoints (default: its positions) in ``transaction``, beside the results written there.

    Call it last inside the transaction that writes the results of the records polled;
    the transaction's commit makes both durable. A :class:`FencedMemberError` must abort
    that transaction (the results of a member that lost the partition must not count).
    """
    if consumer.group is None:
        msg = "commit_with_output needs a consumer of a group"
        raise ValueError(msg)
    store.save(transaction, consumer.group, consumer.checkpoints(offsets))


_SCHEMA = """
CREATE TABLE IF NOT EXISTS headwater_offsets (
    group_id TEXT NOT NULL,
    topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    next_offset INTEGER,
    owner TEXT NOT NULL,
    PRIMARY KEY (group_id, topic, partition)
)
"""


def _write_ahead_log(connection: sqlite3.Connection, timeout_s: float) -> None:
    """Switch the database to WAL, waiting out other processes opening it at the same moment.

    SQLite answers "database is locked" at once, without its busy timeout, when another
    connection holds the file while the journal mode changes (members of a group starting
    together on a new store did, 2 times in 30 with 8 processes): try again until ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            connection.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(0.02)


class SqliteOffsetStore:
    """An :class:`OffsetStore` in a SQLite database, usually the one the consumer writes its results to.

    :meth:`transaction` opens a write transaction (``BEGIN IMMEDIATE``) on :attr:`connection`;
    write the results through the connection it yields and call :func:`commit_with_output`
    before the block ends. Several processes may share the file (WAL journal, busy timeout).
    """

    def __init__(self, path: str | Path, *, timeout_s: float = 30.0) -> None:
        #: Autocommit mode: transactions are exactly the ``transaction()`` blocks.
        self.connection = sqlite3.connect(str(path), timeout=timeout_s, isolation_level=None, check_same_thread=False)
        _write_ahead_log(self.connection, timeout_s)
        self.connection.execute(_SCHEMA)

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """A write transaction: committed when the block ends, rolled back if it raises."""
        self.connection.execute("BEGIN IMMEDIATE")
        try:
            yield self.connection
        except BaseException:
            self.connection.execute("ROLLBACK")
            raise
        self.connection.execute("COMMIT")

    def claim(self, group: str, owners: Mapping[TopicPartition, str]) -> dict[TopicPartition, int]:
        """Record each partition's new owner token; return the stored next offsets."""
        found: dict[TopicPartition, int] = {}
        with self.transaction() as db:
            for tp, owner in sorted(owners.items()):
                db.execute(
                    "INSERT INTO headwater_offsets (group_id, topic, partition, next_offset, owner) "
                    "VALUES (?, ?, ?, NULL, ?) "
                    "ON CONFLICT (group_id, topic, partition) DO UPDATE SET owner = excluded.owner",
                    (group, tp.topic, tp.partition, owner),
                )
                row = db.execute(
                    "SELECT next_offset FROM headwater_offsets WHERE group_id = ? AND topic = ? AND partition = ?",
                    (group, tp.topic, tp.partition),
                ).fetchone()
                if row is not None and row[0] is not None:
                    found[tp] = int(row[0])
        return found

    def stored(self, group: str, partition: TopicPartition) -> int | None:
        """The next offset stored for ``partition`` (``None``: none), without claiming it (:class:`ReadsOffsets`)."""
        row = self.connection.execute(
            "SELECT next_offset FROM headwater_offsets WHERE group_id = ? AND topic = ? AND partition = ?",
            (group, partition.topic, partition.partition),
        ).fetchone()
        return None if row is None or row[0] is None else int(row[0])

    def save(
        self, transaction: sqlite3.Connection, group: str, checkpoints: Mapping[TopicPartition, Checkpoint]
    ) -> None:
        """Store checkpoints in ``transaction``; :class:`FencedMemberError` if another member claimed a partition."""
        for tp, checkpoint in sorted(checkpoints.items()):
            updated = transaction.execute(
                "UPDATE headwater_offsets SET next_offset = ? "
                "WHERE group_id = ? AND topic = ? AND partition = ? AND owner = ?",
                (checkpoint.offset, group, tp.topic, tp.partition, checkpoint.owner),
            ).rowcount
            if updated != 1:
                raise FencedMemberError(
                    group, checkpoint.owner, tp.topic, tp.partition, "another member claimed it in the offset store"
                )

    def close(self) -> None:
        """Close the connection."""
        self.connection.close()
