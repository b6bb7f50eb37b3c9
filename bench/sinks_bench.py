"""Sinks benchmark: each kind's sink against the kind's own client writing the same records, in one run.

``--records`` change events (Debezium JSON, ~330 bytes, every one a new key) are appended to a
3-partition topic of a file log (with a schema record, as capture writes). Per kind, in the same
run and on the same server (each started here as a local process):

* **reference**: the kind's own client writes the same records in batches of ``--batch``, read
  from the log beforehand (so the reference does no log reading): redis-py pipelined ``XADD``
  (``id``, ``key``, ``value`` fields), nats-py ``publish_async`` with ``Nats-Msg-Id`` and the
  acknowledgements awaited per batch, aio-pika publishes with publisher confirms awaited per
  batch, urllib3 ``POST`` of the same JSON array bodies (to a receiver process that parses each),
  psycopg ``COPY`` into a temporary table + ``INSERT ... ON CONFLICT`` per batch (each event's
  ``after`` row);
* **sink**: ``SinkRunner(...).run(follow=False)`` of a sink of that kind, reading the log as a
  consumer group member (the clock includes joining the group) and doing what the kind
  promises (Redis: its script with checkpoints; PostgreSQL: checkpoints in the transaction).

Prints one line per kind, ``<kind>: sink <rec/s> vs <client> <rec/s> = <ratio>``, and the load
average; the goal is a ratio >= 0.7.

    .venv/bin/python bench/sinks_bench.py [--records N] [--batch N] [--kinds redis,nats,rabbitmq,webhook,postgres]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

import orjson  # noqa: E402

from core.config import parse_config  # noqa: E402
from log.base import Record, StoredRecord, TopicSpec, append_keyed  # noqa: E402
from log.factory import open_log  # noqa: E402
from log.topics import SCHEMAS_TOPIC  # noqa: E402
from sinks.runner import SinkRunner  # noqa: E402
from sinks.webhook import body  # noqa: E402

TOPIC = "bench.public.items"
KINDS = ("redis", "nats", "rabbitmq", "webhook", "postgres")


def event(i: int) -> bytes:
    return orjson.dumps(
        {
            "before": None,
            "after": {"id": i, "v": i * 7, "name": f"customer {i:08d}", "note": "x" * 40},
            "source": {
                "version": "headwater-0.1",
                "connector": "postgresql",
                "name": "bench",
                "ts_ms": 1_700_000_000_000 + i,
                "db": "bench",
                "schema": "public",
                "table": "items",
                "commit_lsn": 10_000_000 + i,
                "txn_index": 0,
            },
            "op": "c",
            "ts_ms": 1_700_000_000_000 + i,
        }
    )


def fill(config: Any, n: int) -> list[StoredRecord]:
    log = open_log(config)
    try:
        log.create_topic(TopicSpec(SCHEMAS_TOPIC, partitions=1), exist_ok=True)
        columns = [("id", 23), ("v", 20), ("name", 25), ("note", 25)]
        schema = {
            "topic": TOPIC,
            "schema": "public",
            "table": "items",
            "replica_identity": "d",
            "key": ["id"],
            "key_source": "primary_key",
            "columns": [{"name": c, "type_oid": o, "typmod": -1, "key": c == "id"} for c, o in columns],
            "version": 1,
        }
        log.append(SCHEMAS_TOPIC, 0, [Record(TOPIC.encode(), orjson.dumps(schema))])
        log.create_topic(TopicSpec(TOPIC, partitions=3, compacted=False))
        for start in range(0, n, 5000):
            append_keyed(log, TOPIC, [Record(b'{"id":%d}' % i, event(i)) for i in range(start, min(n, start + 5000))])
        out: list[StoredRecord] = []
        for partition in range(3):
            offset = 0
            while chunk := log.read(TOPIC, partition, offset):
                out.extend(chunk)
                offset = chunk[-1].offset + 1
        return out
    finally:
        log.close()


def batches(records: list[StoredRecord], size: int) -> list[list[StoredRecord]]:
    return [records[i : i + size] for i in range(0, len(records), size)]


def ident(r: StoredRecord) -> str:
    return f"{r.topic}/{r.partition}/{r.offset}"


# -- references: the kind's own client -----------------------------------------------------------


def ref_redis(server: Any, records: list[StoredRecord], size: int, stream: str) -> None:
    client = server.client()
    for batch in batches(records, size):
        pipe = client.pipeline(transaction=False)
        for r in batch:
            pipe.xadd(stream, {"id": ident(r), "key": r.key, "value": r.value})
        pipe.execute()
    client.close()


def ref_nats(server: Any, records: list[StoredRecord], size: int, stream: str, subject: str) -> None:
    async def run() -> None:
        import nats

        nc = await nats.connect(server.url)
        js = nc.jetstream(publish_async_max_pending=1000)
        await js.add_stream(name=stream, subjects=[f"{subject}.>"])
        for batch in batches(records, size):
            futures = [
                await js.publish_async(f"{subject}.items", r.value, headers={"Nats-Msg-Id": "ref/" + ident(r)})
                for r in batch
            ]
            await asyncio.gather(*futures)
        await nc.close()

    asyncio.run(run())


def ref_rabbit(server: Any, records: list[StoredRecord], size: int, queue: str) -> None:
    async def run() -> None:
        import aio_pika

        connection = await aio_pika.connect(server.url)
        channel = await connection.channel(publisher_confirms=True)
        await channel.declare_queue(queue, durable=True)
        for batch in batches(records, size):
            await asyncio.gather(
                *[
                    channel.default_exchange.publish(
                        aio_pika.Message(r.value, delivery_mode=aio_pika.DeliveryMode.PERSISTENT, message_id=ident(r)),
                        routing_key=queue,
                    )
                    for r in batch
                ]
            )
        await connection.close()

    asyncio.run(run())


def ref_webhook(url: str, records: list[StoredRecord], size: int) -> None:
    import urllib3

    from sinks.records import SinkRecord

    pool = urllib3.PoolManager(maxsize=1, retries=False)
    for batch in batches(records, size):
        payload = body(
            [SinkRecord(r.topic, r.partition, r.offset, r.timestamp_ms, r.key, r.value, r.value) for r in batch]
        )  # type: ignore[arg-type]
        response = pool.request("POST", url, body=payload, headers={"Content-Type": "application/json"})
        assert response.status == 200
    pool.clear()


def ref_postgres(dsn: str, records: list[StoredRecord], size: int, table: str) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id integer PRIMARY KEY, v bigint, name text, note text)")
        for batch in batches(records, size):
            with conn.transaction():
                conn.execute(f"CREATE TEMP TABLE stage (LIKE {table}) ON COMMIT DROP")
                with conn.cursor().copy("COPY stage (id, v, name, note) FROM STDIN") as copy:
                    for r in batch:
                        row = orjson.loads(r.value)["after"]  # type: ignore[arg-type]
                        copy.write_row((row["id"], row["v"], row["name"], row["note"]))
                conn.execute(
                    f"INSERT INTO {table} SELECT * FROM stage ON CONFLICT (id) DO UPDATE SET "
                    "v = EXCLUDED.v, name = EXCLUDED.name, note = EXCLUDED.note"
                )


# -- the sink -------------------------------------------------------------------------------------


RECEIVER = """
import http.server, sys, orjson
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        orjson.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers()
    def log_message(self, *a): pass
server = http.server.HTTPServer(("127.0.0.1", 0), H)
print(server.server_address[1], flush=True)
server.serve_forever()
"""


def start_receiver() -> tuple[Any, str]:
    """A webhook receiver in its own process (parses each body, answers 200), like a real target."""
    import subprocess

    from harness.processes import die_with_parent

    process = subprocess.Popen(
        [sys.executable, "-c", RECEIVER],
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=die_with_parent,  # noqa: PLW1509
    )
    assert process.stdout is not None
    port = int(process.stdout.readline())
    return process, f"http://127.0.0.1:{port}/hook"


def run_sink(home: Path, kind: str, options: dict[str, Any], size: int, name: str = "") -> tuple[float, int]:
    """Run a sink of ``kind`` (named ``name``, default ``s_<kind>``: its group) over the topic to its end."""
    name = name or f"s_{kind}"
    config = parse_config(
        {
            "project": "bench",
            "home": str(home),
            "log": {"partitions": 3},
            "sinks": {name: {"kind": kind, "from": TOPIC, "batch_size": size, "options": options}},
        },
        home.parent / "headwater.yaml",
    )
    started = time.perf_counter()
    stats = SinkRunner(config, name).run(follow=False)
    return time.perf_counter() - started, stats.delivered


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--kinds", default=",".join(KINDS))
    args = parser.parse_args()
    kinds = args.kinds.split(",")
    work = Path(tempfile.mkdtemp(prefix="hw-sinks-bench-"))
    home = work / "home"
    config = parse_config({"project": "bench", "home": str(home)}, work / "headwater.yaml")
    records = fill(config, args.records)
    n = len(records)
    print(
        f"sinks_bench: {n:,} records of ~{sum(len(r.value or b'') for r in records) // n} bytes, "
        f"batches of {args.batch}"
    )
    from harness.sink_servers import NatsServer, RabbitServer, RedisServer

    results: list[str] = []
    for kind in kinds:
        server: Any = None
        try:
            if kind == "redis":
                server = RedisServer().start()
                t0 = time.perf_counter()
                ref_redis(server, records, args.batch, "ref")
                ref = time.perf_counter() - t0
                sink, delivered = run_sink(home, kind, {"url": server.url, "stream": "sink"}, args.batch)
                client = "redis-py pipelined XADD"
            elif kind == "nats":
                server = NatsServer().start()
                t0 = time.perf_counter()
                ref_nats(server, records, args.batch, "REF", "ref")
                ref = time.perf_counter() - t0
                options = {"servers": server.url, "subject": "sink.{table}", "stream": "SINK"}
                sink, delivered = run_sink(home, kind, options, args.batch)
                client = "nats-py publish_async"
            elif kind == "rabbitmq":
                server = RabbitServer().start()
                t0 = time.perf_counter()
                ref_rabbit(server, records, args.batch, "ref")
                ref = time.perf_counter() - t0
                sink, delivered = run_sink(
                    home, kind, {"url": server.url, "queue": "sink", "routing_key": "sink"}, args.batch
                )
                client = "aio-pika with confirms"
            elif kind == "webhook":
                process, url = start_receiver()
                server = process.kill
                t0 = time.perf_counter()
                ref_webhook(url, records, args.batch)
                ref = time.perf_counter() - t0
                sink, delivered = run_sink(home, kind, {"url": url}, args.batch)
                client = "urllib3 POST"
            else:
                from harness.postgres import start_pg_server

                pg, stop = start_pg_server()
                server = stop
                dsn = pg.dsn("postgres")
                t0 = time.perf_counter()
                ref_postgres(dsn, records, args.batch, "ref_items")
                ref = time.perf_counter() - t0
                sink, delivered = run_sink(home, kind, {"dsn": dsn, "schema": "sink"}, args.batch)
                client = "psycopg COPY + INSERT ON CONFLICT"
            assert delivered == n, (kind, delivered, n)
            line = (
                f"{kind}: sink {n / sink:,.0f} rec/s vs {client} {n / ref:,.0f} rec/s = {ref / sink:.2f} "
                f"(load {os.getloadavg()[0]:.1f})"
            )
            print(line, flush=True)
            results.append(line)
        finally:
            if callable(server):
                server()
            elif server is not None:
                (server.close if hasattr(server, "close") else server.kill)()
    print(f"sinks_bench done: load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
