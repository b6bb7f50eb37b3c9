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
the topic's records follow the source's order like every other topic's.
"""

from __future__ import annotations

from collections.abc import Sequence

import orjson

from capture.records import OutRecord
from capture.transactions import Transaction
from log.topics import is_quarantine_topic, message_topic

#: The data collection name of logical messages.
MESSAGE_COLLECTION = "message"


def transaction_topic(source: str) -> str:
    """``<source>.transaction`` (Debezium's ``<topic.prefix>.transaction``)."""
    return f"{source}.transaction"


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
            name = f"{source.get('schema')}.{source.get('table')}"
        self._collections[record.topic] = name
        return name

    def records(self, txn: Transaction, events: Sequence[OutRecord]) -> tuple[OutRecord, OutRecord] | None:
        """BEGIN and END of ``txn`` given its events (None: it wrote none)."""
        counts: dict[str, int] = {}
        for record in events:
            if record.value is None:
                continue  # a tombstone
            name = self._collection(record)
            if name is not None:
                counts[name] = counts.get(name, 0) + 1
        if not counts:
            return None
        commit = txn.commit_lsn.value
        ident = f"{txn.xid}:{commit}"
        key = orjson.dumps({"id": ident})
        ts_ms = txn.commit_ts_us // 1000
        begin = {"status": "BEGIN", "id": ident, "event_count": None, "data_collections": None, "ts_ms": ts_ms}
        end = {
            "status": "END",
            "id": ident,
            "event_count": sum(counts.values()),
            "data_collections": [{"data_collection": name, "event_count": n} for name, n in counts.items()],
            "ts_ms": ts_ms,
        }
        last = max(record.txn_index for record in events) + 1
        return (
            OutRecord(self._topic, key, orjson.dumps(begin), commit, 0),
            OutRecord(self._topic, key, orjson.dumps(end), commit, last),
        )
