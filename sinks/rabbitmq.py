"""The RabbitMQ kind: each event published persistently, the batch done when the broker confirmed it all.

Message: body the event (or its transform), ``content_type`` ``application/json``,
persistent, ``message_id`` the idempotency key ``<topic>/<partition>/<offset>``, headers
``headwater-topic`` and ``headwater-key`` (the record key's JSON). Routing key: the
``routing_key`` template (default the topic). A named ``exchange`` is declared as a durable
topic exchange; ``queue`` declares a durable queue (bound with ``#`` to a named exchange; on
the default exchange the routing key must be the queue's name).

Publisher confirms: every publish of a batch is sent on one confirming channel, then the
sink waits for all confirmations; a nack, a closed channel or connection, or no answer within
``timeout_s`` makes the batch retried from its first record (the broker may hold some of it:
at least once, dedupe by ``message_id``). A channel delivers in publish order and a retry
starts again from the batch's start, so each key's changes keep their order.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

from core.sink_config import RabbitmqOptions
from log.base import TopicPartition
from log.consumer import Checkpoint
from sinks.base import Guarantee, Reject
from sinks.errors import TargetUnavailableError
from sinks.event_loop import BackgroundLoop
from sinks.records import SinkRecord, topic_fields


class RabbitSink:
    """Publishes batches to RabbitMQ with publisher confirms (see the module docstring)."""

    guarantee = Guarantee(
        "at least once (publisher confirms)", "the message_id property (<topic>/<partition>/<offset>)"
    )

    def __init__(self, name: str, options: RabbitmqOptions) -> None:
        self.name = name
        self.options = options
        self._loop: BackgroundLoop | None = None
        self._connection: Any = None
        self._exchange: Any = None
        self._keys: dict[str, str] = {}

    def open(self) -> None:
        """Connect and declare what the options name; :class:`TargetUnavailableError` if the broker does not answer."""
        if self._loop is None:
            self._loop = BackgroundLoop(f"sink-{self.name}-amqp")
        self._run(self._open(), self.options.timeout_s + 5)

    async def _open(self) -> None:
        import aio_pika

        if self._connection is not None and not self._connection.is_closed:
            return
        self._connection = await aio_pika.connect(
            self.options.url.get_secret_value(),
            timeout=self.options.timeout_s,
            client_properties={"connection_name": f"headwater-sink-{self.name}"},
        )
        channel = await self._connection.channel(publisher_confirms=True)
        if self.options.exchange:
            self._exchange = await channel.declare_exchange(
                self.options.exchange, aio_pika.ExchangeType.TOPIC, durable=True
            )
        else:
            self._exchange = channel.default_exchange
        if self.options.queue:
            queue = await channel.declare_queue(self.options.queue, durable=True)
            if self.options.exchange:
                await queue.bind(self._exchange, routing_key="#")

    def _run(self, coroutine: Any, timeout_s: float) -> Any:
        import aio_pika.exceptions
        import aiormq.exceptions

        assert self._loop is not None
        try:
            return self._loop.run(coroutine, timeout_s)
        except (TimeoutError, OSError, aio_pika.exceptions.AMQPError, aiormq.exceptions.AMQPError) as exc:
            self._drop()  # the next attempt connects afresh
            raise TargetUnavailableError(self.name, f"rabbitmq: {type(exc).__name__}: {exc}") from None

    def deliver(
        self, records: Sequence[SinkRecord], checkpoints: Mapping[TopicPartition, Checkpoint], reject: Reject
    ) -> None:
        """Publish ``records`` and wait for every confirmation (reconnecting first if the last attempt failed)."""
        if not records:
            return
        if self._connection is None:
            self.open()
        self._run(self._publish(records), self.options.timeout_s + len(records) / 1000)

    async def _publish(self, records: Sequence[SinkRecord]) -> None:
        import aio_pika

        exchange = self._exchange
        persistent = aio_pika.DeliveryMode.PERSISTENT
        confirmations = [
            exchange.publish(
                aio_pika.Message(
                    r.payload,
                    content_type="application/json",
                    delivery_mode=persistent,
                    message_id=r.event_id,
                    headers={"headwater-topic": r.topic, "headwater-key": (r.key or b"null").decode()},
                ),
                routing_key=self._routing_key(r.topic),
                mandatory=False,
            )
            for r in records
        ]
        # Tasks start in list order, so the frames go out in it; gather waits for every confirmation.
        await asyncio.wait_for(asyncio.gather(*confirmations), self.options.timeout_s)

    def _routing_key(self, topic: str) -> str:
        key = self._keys.get(topic)
        if key is None:
            key = self._keys[topic] = self.options.routing_key.format(**topic_fields(topic))
        return key

    def _drop(self) -> None:
        connection, self._connection, self._exchange = self._connection, None, None
        if connection is not None and self._loop is not None:
            with contextlib.suppress(Exception):  # a connection to a dead broker: nothing to keep
                self._loop.run(connection.close(), 5)

    def close(self) -> None:
        """Close the connection and the loop."""
        if self._loop is None:
            return
        self._drop()
        self._loop.close()
        self._loop = None
