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

import orjson

import native
from capture.mysql.binlog.table_map import TableShape
from capture.mysql.state import StreamState as StreamPoint
from capture.mysql.streaming.transactions import RowChange, Statement, Transaction
from capture.mysql.table_plan import TablePlan
from capture.records import OutRecord, dumps_kept
from log.envelope import EVENT_VERSION
from log.topics import table_topic

CONNECTOR = "mysql"
_binlog_events = native.speedups.binlog_events if native.speedups is not None else None
#: Changes handed to ``binlog_events`` per call (its records are yielded before the next call).
_NATIVE_RUN = 1000
#: The most key columns ``binlog_events`` takes (``Shape.key`` in ``native/binlog_events.c``).
_NATIVE_MAX_KEYS = 64
#: ``binlog_events``'s skipped-operation bits.
_SKIP_BITS = {"c": 1, "u": 2, "d": 4}


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
        native: bool = True,
    ) -> None:
        self.source = source
        self.plan_of = plan_of
        self._captures = captures
        self._skipped = skipped_operations
        self._native = native and _binlog_events is not None
        #: Per plan (by identity, kept alive here): its ``binlog_events`` arguments, or None (the Python path).
        self._native_plans: dict[int, tuple[TablePlan, _NativePlan | None]] = {}

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
        """Every record of ``transaction``, in its order, built as they are taken (a spilled one: a piece at a time).

        A run of changes of one table whose plan has no row filter and no masks is built by
        ``native/binlog_events.c`` (:func:`_native_pieces`), this method's twin; the rest here.
        """
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

        def change_records(item: RowChange, plan: TablePlan) -> Iterator[OutRecord]:
            nonlocal index
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

        if self._native and not transaction.statements:
            pieces: dict[int, tuple[bytes, ...]] = {}
            for changes in transaction.change_lists():
                at, end = 0, len(changes)
                while at < end:
                    change = changes[at]
                    plan = self.plan_of(change.shape)
                    native_plan = self._native_plan(plan)
                    if native_plan is not None and _binlog_events is not None:
                        shared = pieces.get(id(plan))
                        if shared is None:
                            shared = pieces[id(plan)] = _native_pieces(self.source, plan, transaction, txn_id, now_us)
                        out: list[OutRecord] = []
                        taken, index, per_table[plan.topic] = _binlog_events(
                            changes,
                            at,
                            change.shape,
                            *native_plan,
                            shared,
                            commit,
                            index,
                            per_table.get(plan.topic, 0),
                            plan.topic,
                            OutRecord,
                            out,
                            _NATIVE_RUN,
                        )
                        yield from out
                        if taken:
                            at += taken
                            continue
                    yield from change_records(change, plan)  # a change the native run left to Python
                    at += 1
            return
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
            yield from change_records(item, self.plan_of(item.shape))

    def _native_plan(self, plan: TablePlan) -> _NativePlan | None:
        """``plan``'s arguments of ``binlog_events`` (None: a row filter or masks keep its events in Python)."""
        found = self._native_plans.get(id(plan))
        if found is not None and found[0] is plan:
            return found[1]
        native_plan: _NativePlan | None = None
        # The C side holds up to 64 key columns (a configured key may name more).
        if plan.row_filter is None and not plan.masks and len(plan.key) <= _NATIVE_MAX_KEYS:
            kept = set(plan.kept)
            native_plan = (
                tuple(orjson.dumps(name) + b":" for name in plan.names),
                bytes(int(i in kept) for i in range(len(plan.names))),
                plan.key,
                sum(_SKIP_BITS[op] for op in plan.skipped_operations if op in _SKIP_BITS),
                orjson.dumps,
            )
        self._native_plans[id(plan)] = (plan, native_plan)
        return native_plan

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


#: ``binlog_events``'s per-plan arguments: each column's ``b'"name":'``, which columns the images
#: write (a byte each), the key's positions, the skipped-operation bits, and the JSON writer of other values.
_NativePlan = tuple[tuple[bytes, ...], bytes, tuple[int, ...], int, Callable[[Any], bytes]]


def _native_pieces(
    source: str, plan: TablePlan, transaction: Transaction, txn_id: str, now_us: int
) -> tuple[bytes, ...]:
    """The bytes of a streamed event's value that are the same for every event of ``plan`` in ``transaction``.

    ``native/binlog_events.c`` writes between them, in order: the before image, the after image,
    ``source``'s ``ts_ms``, ``ts_us``, ``ts_ns``, ``server_id``, ``pos``, ``row`` and ``txn_index``,
    the op, ``total_order``, ``data_collection_order``: the fields of :meth:`EventBuilder._source`,
    ``value`` and :func:`_envelope`, in their order (the equality test pins every byte).
    """
    j = orjson.dumps
    gtid = None if transaction.gtid is None else str(transaction.gtid)
    assert transaction.commit is not None
    return (
        b'{"before":',
        b',"after":',
        b',"source":{"version":%b,"connector":%b,"name":%b,"ts_ms":' % (j(EVENT_VERSION), j(CONNECTOR), j(source)),
        b',"snapshot":"false","db":%b,"sequence":null,"ts_us":' % j(plan.shape.schema),
        b',"ts_ns":',
        b',"schema":null,"table":%b,"server_id":' % j(plan.shape.table),
        b',"gtid":%b,"file":%b,"pos":' % (j(gtid), j(transaction.file)),
        b',"row":',
        b',"thread":null,"query":null,"commit_lsn":%d,"txn_index":' % transaction.commit.sequence(),
        b'},"op":"',
        b'","ts_ms":%d,"ts_us":%d,"ts_ns":%d,"transaction":{"id":%b,"total_order":'
        % (now_us // 1000, now_us, now_us * 1000, j(txn_id)),
        b',"data_collection_order":',
        b"}}",
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
