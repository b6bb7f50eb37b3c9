"""A truncate sits in one partition, the rows in all: the replica applies it by the source's order.

The sink is driven directly with crafted batches (as partitions interleave in a real run): rows
older than the truncate are removed, newer ones written before it (from another partition) stay,
and an older upsert met after it is not applied.
"""

from __future__ import annotations

import orjson
import psycopg

from log.base import TopicPartition
from log.consumer import Checkpoint
from sinks.records import SinkRecord

TOPIC = "src.public.t"  # the direct_replica fixture's


def event(op, row_id, v, lsn):
    value = {
        "before": {"id": row_id} if op == "d" else None,
        "after": None if op in ("d", "t") else {"id": row_id, "v": v},
        "source": {"commit_lsn": lsn, "txn_index": 0},
        "op": op,
    }
    key = None if op == "t" else orjson.dumps({"id": row_id})
    return key, orjson.dumps(value)


def test_truncate_removes_older_rows_only_and_blocks_older_upserts(direct_replica):
    sink, dsn = direct_replica
    owners = {TopicPartition(TOPIC, p): f"owner-{p}" for p in range(2)}
    sink.claim("headwater.sink.r", owners)
    offset = iter(range(1000))

    def deliver(*events):
        batch = []
        for partition, (op, row_id, v, lsn) in events:
            key, value = event(op, row_id, v, lsn)
            batch.append(SinkRecord(TOPIC, partition, next(offset), 0, key, value, value))
        checkpoints = {tp: Checkpoint(next(offset), token) for tp, token in owners.items()}
        sink.deliver(batch, checkpoints, lambda rejected: None)

    deliver((0, ("c", 1, 1, 10)), (1, ("c", 2, 2, 20)), (1, ("c", 3, 3, 120)))  # 3 is newer than the truncate
    deliver((0, ("t", 0, None, 100)))  # TRUNCATE at position 100, in partition 0
    deliver((1, ("u", 2, 22, 30)), (1, ("c", 4, 4, 150)))  # 2's update is older than the truncate
    with psycopg.connect(dsn) as conn:
        rows = dict(conn.execute("SELECT id, v FROM t").fetchall())
    assert rows == {3: 3, 4: 4}
