"""The Redis sink's one script per batch, driven directly: every field of every entry, with and without ``maxlen``.

The script takes each record's fields positionally (4 per record without a mirror); a field out
of place would put one record's key or value under another's id.
"""

from __future__ import annotations

import orjson

from core.sink_config import RedisOptions, TransformConfig
from log.base import TopicPartition
from log.consumer import Checkpoint
from sinks.records import SinkRecord
from sinks.redis_streams import RedisStreamSink

TOPIC = "src.public.t"
GROUP = "headwater.sink.r"


def batches(count, size):
    offset = 0
    for _ in range(count):
        batch = []
        for _ in range(size):
            value = orjson.dumps({"after": {"id": offset}, "op": "c", "n": offset})
            batch.append(SinkRecord(TOPIC, offset % 2, offset, 0, b'{"id":%d}' % offset, value, value))
            offset += 1
        yield batch, {TopicPartition(TOPIC, p): Checkpoint(offset, f"owner-{p}") for p in range(2)}


def run(server, stream, maxlen):
    sink = RedisStreamSink("r", RedisOptions(url=server.url, stream=stream, maxlen=maxlen), TransformConfig())
    sink.open()
    try:
        sink.claim(GROUP, {TopicPartition(TOPIC, p): f"owner-{p}" for p in range(2)})
        written = []
        for batch, checkpoints in batches(3, 200):
            sink.deliver(batch, checkpoints, lambda rejected: None)
            written.extend(batch)
        return written
    finally:
        sink.close()


def fields(record):
    return {b"id": record.event_id.encode(), b"key": record.key, b"value": record.payload}


def test_every_entry_holds_its_own_fields(redis_server, unique_name):
    stream = unique_name("s")
    written = run(redis_server, stream, None)
    client = redis_server.client()
    assert [f for _, f in client.xrange(stream)] == [fields(r) for r in written]
    assert client.hgetall(f"headwater:offsets:{GROUP}") == {b"src.public.t/0": b"600", b"src.public.t/1": b"600"}


def test_maxlen_trims_the_stream_and_keeps_the_newest_entries_whole(redis_server, unique_name):
    stream = unique_name("s")
    written = run(redis_server, stream, 10)
    client = redis_server.client()
    kept = [f for _, f in client.xrange(stream)]
    assert 10 <= len(kept) < len(written)  # MAXLEN ~ trims whole nodes
    assert kept == [fields(r) for r in written[-len(kept) :]]
