"""Each sink kind end to end against its real server: Postgres -> capture -> log -> sink -> read back.

Per kind: every key's changes arrive in the source's order and the last one is the source's
final row; the kinds that are exactly once (Redis, PostgreSQL) and NATS within its duplicate
window deliver no event twice. Servers are shared by the session; names are per test.
"""

from __future__ import annotations

import time

import psycopg
from harness.sink_pipeline import check_delivery, final_rows
from harness.sink_readers import nats_stream, rabbit_queue, redis_mirror, redis_stream


def rounds(pipeline, *, first=0) -> None:
    """Two rounds of changes, each captured and delivered by ``run --until-caught-up``."""
    pipeline.cli("run", "--until-caught-up")  # the empty snapshot: history starts at the first change
    for start, count in ((first, 12), (first + 12, 12)):
        pipeline.batches(start, count)
        pipeline.cli("run", "--until-caught-up")


def last_values(delivered) -> dict[int, int]:
    last: dict[int, int | None] = {}
    for _, row_id, op, v in delivered:
        last[row_id] = None if op == "d" else v
    return {k: v for k, v in last.items() if v is not None}


def test_redis_stream_and_mirror_equal_the_source(pipeline, redis_server, unique_name):
    prefix = unique_name("mirror") + ":"
    stream = unique_name("stream")
    pipeline.sinks = {
        "cache": {
            "kind": "redis",
            "from": pipeline.topic,
            "batch_size": 64,
            "options": {"url": redis_server.url, "stream": stream, "mirror_prefix": prefix},
        }
    }
    pipeline.setup()
    rounds(pipeline)
    client = redis_server.client()
    assert redis_mirror(client, prefix) == final_rows(pipeline.dsn)
    # a truncate (one partition) amid changes to every partition: the mirror drops only older rows
    with psycopg.connect(pipeline.dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE t")
    pipeline.batches(24, 6)
    pipeline.cli("run", "--until-caught-up")
    delivered = redis_stream(client, stream)
    report = check_delivery(pipeline.dsn, delivered)
    assert report.repeats == 0
    assert redis_mirror(client, prefix) == final_rows(pipeline.dsn) != {}


def test_nats_jetstream_equals_the_source(pipeline, nats_server, unique_name):
    stream = unique_name("S").upper()
    subject = unique_name("sub")
    pipeline.sinks = {
        "bus": {
            "kind": "nats",
            "from": pipeline.topic,
            "options": {"servers": nats_server.url, "subject": f"{subject}.{{table}}", "stream": stream},
        }
    }
    pipeline.setup()
    rounds(pipeline)
    delivered = nats_stream(nats_server.url, stream)
    report = check_delivery(pipeline.dsn, delivered)
    assert report.repeats == 0
    assert last_values(delivered) == final_rows(pipeline.dsn)


def test_rabbitmq_queue_equals_the_source(pipeline, rabbit_server, unique_name):
    queue = unique_name("q")
    pipeline.sinks = {
        "amqp": {
            "kind": "rabbitmq",
            "from": pipeline.topic,
            "batch_size": 200,
            "options": {"url": rabbit_server.url, "exchange": unique_name("x"), "queue": queue},
        }
    }
    pipeline.setup()
    rounds(pipeline)
    delivered = rabbit_queue(rabbit_server.url, queue)
    report = check_delivery(pipeline.dsn, delivered)
    assert report.repeats == 0  # nothing failed in this run, so nothing was sent twice
    assert last_values(delivered) == final_rows(pipeline.dsn)


def test_redis_restored_from_an_older_snapshot_gets_the_lost_entries_again(pipeline, redis_server, unique_name):
    """A Redis that comes back with older data (its stream and the sink's offsets) under a running sink."""
    stream = unique_name("stream")
    pipeline.sinks = {
        "cache": {
            "kind": "redis",
            "from": pipeline.topic,
            "batch_size": 25,
            "options": {"url": redis_server.url, "stream": stream},
        }
    }
    pipeline.setup()
    pipeline.cli("run", "--until-caught-up")
    pipeline.start("capture", "--follow")
    pipeline.start("sinks", "run", "--follow")
    client = redis_server.client()
    offsets_key = "headwater:offsets:headwater.sink.cache"

    def delivered_rounds(first: int, count: int) -> None:
        pipeline.batches(first, count)
        deadline = time.monotonic() + 120
        while True:
            try:
                check_delivery(pipeline.dsn, redis_stream(client, stream))
                return
            except AssertionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1)

    delivered_rounds(0, 6)
    snapshot = {key: client.dump(key) for key in (stream, offsets_key)}
    delivered_rounds(6, 6)
    for key, data in snapshot.items():  # "restarted from the older snapshot": entries and offsets go back
        client.restore(key, 0, data, replace=True)
    delivered_rounds(12, 4)  # passes only if the entries lost by the restore were delivered again
    report = check_delivery(pipeline.dsn, redis_stream(client, stream))
    assert report.repeats == 0
