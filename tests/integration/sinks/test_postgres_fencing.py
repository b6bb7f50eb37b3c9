"""A PostgreSQL sink member whose partition another member claimed applies nothing of its batch.

The sink is driven directly, batch by batch, as the runner does (prepared, then delivered). A
member fenced on one partition of the batch leaves rows and offsets as they were, and the sink
goes on with the tokens it holds now.
"""

from __future__ import annotations

import orjson
import psycopg
import pytest

from log.base import TopicPartition
from log.consumer import Checkpoint
from log.errors import FencedMemberError
from sinks.records import SinkRecord

TOPIC = "src.public.t"  # the direct_replica fixture's
GROUP = "headwater.sink.r"


def change(partition, offset, row_id, v):
    value = orjson.dumps(
        {"before": None, "after": {"id": row_id, "v": v}, "source": {"commit_lsn": offset, "txn_index": 0}, "op": "u"}
    )
    return SinkRecord(TOPIC, partition, offset, 0, orjson.dumps({"id": row_id}), value, value)


def test_a_fenced_batch_applies_nothing_and_the_next_goes_on(direct_replica):
    sink, dsn = direct_replica
    owners = {TopicPartition(TOPIC, p): f"old-{p}" for p in range(2)}
    sink.claim(GROUP, owners)

    def deliver(records, tokens, next_offset):
        batch = sink.prepare(records)
        checkpoints = {tp: Checkpoint(next_offset, token) for tp, token in tokens.items()}
        sink.deliver(batch, checkpoints, lambda rejected: None)

    def state():
        with psycopg.connect(dsn) as conn:
            rows = dict(conn.execute("SELECT id, v FROM t").fetchall())
            offsets = dict(conn.execute("SELECT partition, next_offset FROM headwater_sink_offsets").fetchall())
        return rows, offsets

    deliver([change(0, 0, 1, 1), change(1, 1, 2, 2)], owners, 2)  # creates the replica
    deliver([change(0, 2, 1, 10), change(1, 3, 3, 3)], owners, 4)
    assert state() == ({1: 10, 2: 2, 3: 3}, {0: 4, 1: 4})

    newer = {**owners, TopicPartition(TOPIC, 1): "new-1"}
    sink.claim(GROUP, {TopicPartition(TOPIC, 1): "new-1"})  # another member takes partition 1
    with pytest.raises(FencedMemberError):
        deliver([change(0, 4, 1, 100), change(1, 5, 2, 200), change(1, 6, 4, 4)], owners, 7)
    assert state() == ({1: 10, 2: 2, 3: 3}, {0: 4, 1: 4})  # nothing of the fenced batch

    deliver([change(0, 4, 1, 100), change(1, 5, 2, 200), change(1, 6, 4, 4)], newer, 7)
    deliver([change(0, 7, 5, 5)], newer, 8)
    assert state() == ({1: 100, 2: 200, 3: 3, 4: 4, 5: 5}, {0: 8, 1: 8})
