"""The PostgreSQL kind's ``source`` block and ``transaction`` block, as Debezium's PostgreSQL connector writes them.

The block holds the fields every kind writes (:data:`log.envelope.SOURCE_FIELDS`) and PostgreSQL's
own, in Debezium's order: ``version, connector, name, ts_ms, ts_us, ts_ns, snapshot, db, sequence,
schema, table, txId, lsn, xmin, origin, origin_lsn``, then Headwater's ``commit_lsn`` and
``txn_index``. ``sequence`` is Debezium's ``["<last commit LSN>", "<LSN>"]`` as a JSON string.
The native event encoder (``native/_speedups.c``) and :mod:`capture.postgres.events.builder`
write the same bytes.
"""

from __future__ import annotations

from typing import Any

import orjson

from log.envelope import EVENT_VERSION, SnapshotMarker, SourceInfo
from log.sequence import Lsn

#: ``source.connector`` of PostgreSQL events.
CONNECTOR = "postgresql"


def _text(value: int | None) -> str | None:
    return None if value is None else str(value)


def postgres_source(  # noqa: PLR0917  (Debezium's fields, in its order)
    name: str,
    db: str,
    schema: str,
    table: str,
    tx_id: int | None,
    lsn: int | None,
    commit_lsn: int,
    txn_index: int,
    ts_us: int,
    snapshot: SnapshotMarker = SnapshotMarker.FALSE,
    last_commit_lsn: int | None = None,
    origin: str | None = None,
    origin_lsn: int | None = None,
) -> SourceInfo:
    """The ``source`` block of a PostgreSQL event.

    ``last_commit_lsn`` is the end LSN of the transaction before (Debezium's "last commit LSN",
    ``sequence[0]``); ``origin``/``origin_lsn`` the replication origin a replayed transaction came
    through, and its LSN there.
    """
    fields: dict[str, Any] = {
        "version": EVENT_VERSION,
        "connector": CONNECTOR,
        "name": name,
        "ts_ms": ts_us // 1000,
        "ts_us": ts_us,
        "ts_ns": ts_us * 1000,
        "snapshot": snapshot.value,
        "db": db,
        "sequence": orjson.dumps([_text(last_commit_lsn), _text(lsn)]).decode(),
        "schema": schema,
        "table": table,
        "txId": tx_id,
        "lsn": lsn,
        "xmin": None,
        "origin": origin,
        "origin_lsn": origin_lsn,
        "commit_lsn": commit_lsn,
        "txn_index": txn_index,
    }
    return SourceInfo(fields)


def transaction_block(tx_id: int, commit_lsn: Lsn, total_order: int, data_collection_order: int) -> dict[str, Any]:
    """Debezium's ``transaction`` object: id ``txid:lsn``, position overall and per table."""
    return {
        "id": f"{tx_id}:{commit_lsn.value}",
        "total_order": total_order,
        "data_collection_order": data_collection_order,
    }
