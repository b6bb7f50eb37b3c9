"""Transactions -> change records in Debezium's MySQL form (plus Headwater's sequence fields).

Per row change: key ``{primary key columns}`` (null for a table without one), value
``{"before", "after", "source", "op", "ts_ms", "ts_us", "ts_ns", "transaction"}``; a delete is
followed by a tombstone; an update that changes the key is a delete of the old key (and its
tombstone) then a create of the new one, as Debezium's MySQL connector writes it. A
``TRUNCATE`` is an ``op: "t"`` event with a null key and no images.

``source`` has Debezium's MySQL fields (``server_id``, ``gtid``, ``file``, ``pos`` = the start
of the row event, ``row`` = the row's index in it, ``thread``, ``query``) and Headwater's
``commit_lsn``/``txn_index``: the transaction's commit position packed into one integer
(:meth:`capture.mysql.binlog.position.BinlogPosition.sequence`) and the event's index in the
transaction, the source's total order. Every event of a transaction has the same ``transaction``
block id: the MariaDB GTID (``file:commit offset`` without one).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from capture.mysql.binlog.table_map import TableShape
from capture.mysql.state import StreamState as StreamPoint
from capture.mysql.streaming.transactions import RowChange, Statement, Transaction
from capture.mysql.table_plan import TablePlan
from capture.records import OutRecord, dumps_kept
from log.envelope import EVENT_VERSION
from log.topics import table_topic

CONNECTOR = "mysql"


def _now_us() -> int:
    return time.time_ns() // 1000


class EventBuilder:
    """Builds the records of one source's transactions through its table plans (:mod:`capture.mysql.table_plan`).

    ``captures(database, table)`` says which tables' events are written (a truncate of another
    table is not); ``plan_of(shape)`` gives a shape's plan.
    """

    def __init__(
        self,
        source: str,
        plan_of: Callable[[TableShape], TablePlan],
        captures: Callable[[str, str], bool],
        *,
        skipped_operations: frozenset[str] = frozenset(),
    ) -> None:
        self.source = source
        self.plan_of = plan_of
        self._captures = captures
        self._skipped = skipped_operations

    def _source(self, db: str, table: str, item: RowChange | Statement, transaction: Transaction) -> dict[str, Any]:
        ts_us = item.timestamp * 1_000_000
        return {
            "version": EVENT_VERSION,
            "connector": CONNECTOR,
            "name": self.source,
            "ts_ms": ts_us // 1000,
            # Debezium's MySQL connector writes null here; every Headwater kind writes "false" (log.envelope).
            "snapshot": "false",
            "db": db,
            "sequence": None,
            "ts_us": ts_us,
            "ts_ns": ts_us * 1000,
            "schema": None,
            "table": table,
            "server_id": item.server_id,
            "gtid": None if transaction.gtid is None else str(transaction.gtid),
            "file": transaction.file,
            "pos": item.event_start,
            "row": item.row if isinstance(item, RowChange) else 0,
            "thread": None,
            "query": None,
        }

    def records(self, transaction: Transaction) -> Iterator[OutRecord]:
        """Every record of ``transaction``, in its order, built as they are taken (a spilled one: a piece at a time)."""
        assert transaction.commit is not None
        commit = transaction.commit.sequence()
        txn_id = str(transaction.gtid) if transaction.gtid is not None else str(transaction.commit)
        per_table: dict[str, int] = {}
        index = 0
        now_us = _now_us()

        def value(op: str, before: Any, after: Any, source: dict[str, Any], topic: str) -> bytes:
            per_table[topic] = per_table.get(topic, 0) + 1
            source["commit_lsn"] = commit
            source["txn_index"] = index
            transaction_block = {"id": txn_id, "total_order": index + 1, "data_collection_order": per_table[topic]}
            return _envelope(op, before, after, source, transaction=transaction_block, now_us=now_us)

        for item in transaction.items():
            if isinstance(item, Statement):
                if item.truncated is None or "t" in self._skipped or not self._captures(*item.truncated):
                    continue
                db, table = item.truncated
                topic = table_topic(self.source, db, table)
                yield OutRecord(
                    topic,
                    None,
                    value("t", None, None, self._source(db, table, item, transaction), topic),
                    commit,
                    index,
                )
                index += 1
                continue
            plan = self.plan_of(item.shape)
            for op, before, after in _operations(item, plan):
                image_before = None if before is None else plan.image(before)
                image_after = None if after is None else plan.image(after)
                key = event_key(image_before if op == "d" else image_after, plan)
                source = self._source(item.shape.schema, item.shape.table, item, transaction)
                yield OutRecord(
                    plan.topic, key, value(op, image_before, image_after, source, plan.topic), commit, index
                )
                if op == "d":
                    yield OutRecord(plan.topic, key, None, commit, index)
                index += 1

    def snapshot_record(
        self, plan: TablePlan, image: dict[str, Any], *, point: StreamPoint, index: int, marker: str, ts_us: int
    ) -> OutRecord:
        """One snapshot row (``op: "r"``, ``image`` as the plan writes it) read at ``point``; ``index`` orders it."""
        return self.read_record(
            plan,
            image,
            commit=point.position.sequence(),
            index=index,
            marker=marker,
            ts_us=ts_us,
            file=point.position.file,
            pos=point.position.offset,
        )

    def read_record(
        self,
        plan: TablePlan,
        image: dict[str, Any],
        *,
        commit: int,
        index: int,
        marker: str,
        ts_us: int,
        file: str,
        pos: int,
    ) -> OutRecord:
        """An ``op: "r"`` record of ``image`` at sequence ``(commit, index)`` (initial or incremental snapshot)."""
        shape = plan.shape
        source = self._read_source(
            shape.schema, shape.table, commit=commit, index=index, marker=marker, ts_us=ts_us, file=file, pos=pos
        )
        return OutRecord(plan.topic, event_key(image, plan), _envelope("r", None, image, source), commit, index)

    def vanished_delete(
        self, event: dict[str, Any], *, commit: int, index: int, ts_us: int, file: str, pos: int
    ) -> bytes:
        """A resync's delete (``op: "d"``) of the key whose last event in the log is ``event``, at ``(commit, index)``.

        ``before`` is that event's ``after``, the last image the log holds (a Debezium delete
        carries the row's last image); ``source`` names the event's table and is marked as the
        re-snapshot's (``snapshot: "true"``), which found the row gone at its point ``file``/``pos``.
        """
        old = event["source"]
        source = self._read_source(
            old["db"], old["table"], commit=commit, index=index, marker="true", ts_us=ts_us, file=file, pos=pos
        )
        return _envelope("d", event.get("after"), None, source)

    def vanished_truncate(
        self, event: dict[str, Any], *, commit: int, index: int, ts_us: int, file: str, pos: int
    ) -> bytes:
        """A resync's truncate (``op: "t"``, keyless) of the table of ``event``, found gone at ``file``/``pos``."""
        old = event["source"]
        source = self._read_source(
            old["db"], old["table"], commit=commit, index=index, marker="true", ts_us=ts_us, file=file, pos=pos
        )
        return _envelope("t", None, None, source)

    def _read_source(
        self, db: str, table: str, *, commit: int, index: int, marker: str, ts_us: int, file: str, pos: int
    ) -> dict[str, Any]:
        """The ``source`` block of what a snapshot writes: no server, GTID or row event, the snapshot's point."""
        return {
            "version": EVENT_VERSION,
            "connector": CONNECTOR,
            "name": self.source,
            "ts_ms": ts_us // 1000,
            "snapshot": marker,
            "db": db,
            "sequence": None,
            "ts_us": ts_us,
            "ts_ns": ts_us * 1000,
            "schema": None,
            "table": table,
            "server_id": 0,
            "gtid": None,
            "file": file,
            "pos": pos,
            "row": 0,
            "thread": None,
            "query": None,
            "commit_lsn": commit,
            "txn_index": index,
        }


def _envelope(
    op: str,
    before: Any,
    after: Any,
    source: dict[str, Any],
    *,
    transaction: dict[str, Any] | None = None,
    now_us: int | None = None,
) -> bytes:
    """An event's value: a streamed one with its ``transaction`` block, a snapshot's without; stamped ``now_us``."""
    if now_us is None:
        now_us = _now_us()
    return dumps_kept(
        {
            "before": before,
            "after": after,
            "source": source,
            "op": op,
            "ts_ms": now_us // 1000,
            "ts_us": now_us,
            "ts_ns": now_us * 1000,
            "transaction": transaction,
        }
    )


def event_key(image: dict[str, Any] | None, plan: TablePlan) -> bytes | None:
    """The record key of a row image (None: the table has no key)."""
    if not plan.key or image is None:
        return None
    return dumps_kept({name: image[name] for name in plan.key_names})


_Change = tuple[str, list[Any] | None, list[Any] | None]


def _filtered(change: RowChange, plan: TablePlan) -> _Change | None:
    """The change as the table's row filter and skipped operations leave it (None: not written)."""
    op, before, after = change.op, change.before, change.after
    row_filter = plan.row_filter
    if row_filter is not None:
        if op == "c":
            if not row_filter.keeps(after):  # type: ignore[arg-type]
                return None
        elif op == "d":
            if not row_filter.keeps(before):  # type: ignore[arg-type]
                return None
        else:
            was, now = row_filter.keeps(before), row_filter.keeps(after)  # type: ignore[arg-type]
            if not (was or now):
                return None
            if not was:
                op, before = "c", None  # moves into the filter: a create
            elif not now:
                op, after = "d", None  # leaves it: a delete
    if op in plan.skipped_operations:
        return None
    return op, before, after


def _operations(change: RowChange, plan: TablePlan) -> tuple[_Change, ...]:
    """The events of one change: none (filtered out, skipped), itself, or a delete then a create (its key changed)."""
    kept = _filtered(change, plan)
    if kept is None:
        return ()
    op, before, after = kept
    if op == "u" and before is not None and after is not None:
        for i in plan.key:
            if before[i] != after[i]:
                return ("d", before, None), ("c", None, after)
    return (kept,)
