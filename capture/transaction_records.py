"""Transaction boundaries (``sources.<name>.transactions: true``): BEGIN and END records per transaction.

As Debezium's transaction metadata (``provide.transaction.metadata``): each transaction that
writes at least one event gets a BEGIN and an END record in ``<source>.transaction``, keyed
``{"id": ...}``, with Debezium's value fields in its order::

    {"status": "BEGIN", "id": "571:53195829", "event_count": null, "data_collections": null, "ts_ms": ...}
    {"status": "END", "id": "571:53195829", "event_count": 2,
     "data_collections": [{"data_collection": "s1.a", "event_count": 1}, ...], "ts_ms": ...}

``id`` is the ``id`` of every event's ``transaction`` block (``<xid>:<commit LSN>``, the same
in BEGIN, END and every event; Debezium puts each operation's own LSN after the colon, so its
ids differ within one transaction), ``ts_ms`` the commit time. ``event_count`` counts the
events that carry the ``transaction`` block (tombstones, quarantined changes and
incremental-snapshot rows do not), per data collection in the order they first appear: a
table as ``schema.table``, logical messages as ``message`` (``<source>.<data_collection>`` is
the topic, up to the characters topic names replace).

Ordering: BEGIN sorts at ``(commit_lsn, 0)`` and END after the transaction's last event, so
the topic's records follow the source's order like every other topic's. Their values have no
``source`` block, so each carries its sequence in a ``headwater.sequence`` header
(:data:`capture.records.SEQUENCE_HEADER`): a restart skips the BEGIN (or END) already in
the log like any other record (:mod:`capture.position`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import orjson

from capture.records import OutRecord, sequence_headers
from log.topics import is_quarantine_topic, message_topic

#: The data collection name of logical messages.
MESSAGE_COLLECTION = "message"


def transaction_topic(source: str) -> str:
    """``<source>.transaction`` (Debezium's ``<topic.prefix>.transaction``)."""
    return f"{source}.transaction"


class CommittedTransaction(Protocol):
    """A source's committed transaction, as far as its boundary records need it."""

    #: When it committed (microseconds since the epoch).
    commit_ts_us: int

    @property
    def transaction_id(self) -> str:
        """Debezium's id of the transaction (PostgreSQL: ``<xid>:<commit LSN>``)."""
        ...

    @property
    def commit_ordinal(self) -> int:
        """The commit's place in the log's order (:meth:`log.position.Position.ordinal`)."""
        ...


class TransactionBoundaries:
    """Builds the BEGIN and END records of a source's transactions from their events."""

    def __init__(self, source: str) -> None:
        self._topic = transaction_topic(source)
        self._messages = message_topic(source)
        # topic -> data collection (None: not counted), learned from each topic's first event.
        self._collections: dict[str, str | None] = {}

    def _collection(self, record: OutRecord) -> str | None:
        found = self._collections.get(record.topic, "")
        if found != "":
            return found
        if record.topic == self._messages:
            name: str | None = MESSAGE_COLLECTION
        elif is_quarantine_topic(record.topic):
            name = None
        else:
            source = orjson.loads(record.value or b"{}").get("source") or {}
            # PostgreSQL events name a schema; MySQL's have none (their ``db`` is the database).
            name = f"{source.get('schema') or source.get('db')}.{source.get('table')}"
        self._collections[record.topic] = name
        return name

    def records(self, txn: CommittedTransaction, events: Sequence[OutRecord]) -> tuple[OutRecord, OutRecord] | None:
        """BEGIN and END of ``txn`` given its events (None: it wrote none)."""
        counting = self.start(txn)
        begin = counting.add(events)
        end = counting.end()
        return None if begin is None or end is None else (begin, end)

    def start(self, txn: CommittedTransaction) -> BoundaryCount:
        """Count ``txn``'s events as they are built, a piece at a time (:class:`BoundaryCount`)."""
        return BoundaryCount(self, txn)


class BoundaryCount:
    """The BEGIN and END records of one transaction whose events come in pieces.

    :meth:`add` returns BEGIN with the first piece that has a counted event (so it is appended
    before that piece's events); :meth:`end` returns END after the last piece, counting every
    piece. A transaction re-sent after a crash is counted again from the start, so its END
    says the same whichever of its pieces the log already held.
    """

    def __init__(self, boundaries: TransactionBoundaries, txn: CommittedTransaction) -> None:
        self._boundaries = boundaries
        self._txn = txn
        self._counts: dict[str, int] = {}
        self._last = -1
        self._commit = txn.commit_ordinal
        self._ident = txn.transaction_id
        self._key = orjson.dumps({"id": self._ident})

    def add(self, events: Sequence[OutRecord]) -> OutRecord | None:
        """Count the next piece's events; BEGIN when they hold the transaction's first counted event."""
        counts = self._counts
        first = not counts
        for record in events:
            self._last = max(self._last, record.txn_index)
            if record.value is None:
                continue  # a tombstone
            name = self._boundaries._collection(record)
            if name is not None:
                counts[name] = counts.get(name, 0) + 1
        if not (first and counts):
            return None
        txn = self._txn
        ts_ms = txn.commit_ts_us // 1000
        begin = {"status": "BEGIN", "id": self._ident, "event_count": None, "data_collections": None, "ts_ms": ts_ms}
        commit, value = self._commit, orjson.dumps(begin)
        return OutRecord(self._boundaries._topic, self._key, value, commit, 0, sequence_headers(commit, 0))

    def end(self) -> OutRecord | None:
        """END after the last piece (None: the transaction wrote no counted event)."""
        counts = self._counts
        if not counts:
            return None
        txn = self._txn
        end = {
            "status": "END",
            "id": self._ident,
            "event_count": sum(counts.values()),
            "data_collections": [{"data_collection": name, "event_count": n} for name, n in counts.items()],
            "ts_ms": txn.commit_ts_us // 1000,
        }
        commit, index, value = self._commit, self._last + 1, orjson.dumps(end)
        return OutRecord(self._boundaries._topic, self._key, value, commit, index, sequence_headers(commit, index))
