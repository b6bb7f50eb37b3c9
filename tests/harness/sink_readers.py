"""Read back what a sink delivered, from the real server, in the server's order.

Each reader returns ``[(event id, row id, op, v)]`` for the audited table ``t``
(:mod:`harness.sink_pipeline`).
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from harness.sink_pipeline import Delivered, event_of


def redis_stream(client: Any, stream: str) -> list[Delivered]:
    out: list[Delivered] = []
    for _entry, fields in client.xrange(stream):
        value = orjson.loads(fields[b"value"])
        if value["op"] != "t":
            out.append((fields[b"id"].decode(), *event_of(value)))
    return out


def redis_mirror(client: Any, prefix: str) -> dict[int, int]:
    rows = {}
    for key in client.scan_iter(match=f"{prefix}*", count=1000):
        if b"__hw_" in key:
            continue  # the mirror's own bookkeeping (positions, truncates)
        rows[orjson.loads(key.decode().split(":", 1)[1].split(":", 1)[1])["id"]] = orjson.loads(client.get(key))["v"]
    return rows


def nats_stream(url: str, stream: str) -> list[Delivered]:
    """Every message of ``stream`` in sequence order (``[]`` while it holds none).

    An empty stream reports ``first_seq`` 0 (no message was ever stored, e.g. the sink has
    just created it after the server's restart), and ``get_msg(stream, 0)`` is a request
    without a sequence, which JetStream answers 400 "bad request" (err_code 10003).
    """

    async def read() -> list[Delivered]:
        import nats

        nc = await nats.connect(url)
        try:
            js = nc.jetstream()
            info = await js.stream_info(stream)
            out: list[Delivered] = []
            if not info.state.messages:
                return out
            for seq in range(max(info.state.first_seq, 1), info.state.last_seq + 1):
                msg = await js.get_msg(stream, seq)
                out.append((msg.headers["Nats-Msg-Id"], *event_of(orjson.loads(msg.data))))
            return out
        finally:
            await nc.close()

    return asyncio.run(read())


def rabbit_queue(url: str, queue: str) -> list[Delivered]:
    """Everything in ``queue``, taken off it in order (acknowledged)."""

    async def read() -> list[Delivered]:
        import aio_pika

        connection = await aio_pika.connect(url)
        try:
            channel = await connection.channel()
            declared = await channel.declare_queue(queue, durable=True, passive=True)
            out: list[Delivered] = []
            while True:
                message = await declared.get(no_ack=True, fail=False)
                if message is None:
                    return out
                out.append((message.message_id, *event_of(orjson.loads(message.body))))
        finally:
            await connection.close()

    return asyncio.run(read())
