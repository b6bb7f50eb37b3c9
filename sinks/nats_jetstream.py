"""The NATS JetStream kind: each event published with ``Nats-Msg-Id``, acknowledged by the stream.

Subject: the ``subject`` template (default the topic: ``shop.public.orders``). Headers:
``Nats-Msg-Id`` (the idempotency key ``<topic>/<partition>/<offset>``), ``Headwater-Key``
(the record key's JSON). Publishes of a batch are pipelined (up to ``in_flight`` awaiting
their acknowledgement); the batch counts once every acknowledgement came back. With
``stream`` set, the stream is created over ``subjects`` (default ``<subject prefix>.>``) with
``duplicate_window_s`` when it does not exist.

Guarantee: the stream stores each event once when a repeat comes within its duplicate
window (the server drops a publish whose ``Nats-Msg-Id`` it saw, and says so in the
acknowledgement): a batch retried after a lost connection, a server restart or a SIGKILL of
the sink repeats nothing if the retry comes within the window (default 2 minutes); a later
one is at least once (dedupe by ``Nats-Msg-Id``). Messages from one connection are stored in
publish order, and a retried batch starts again from its first record, so each key's
changes keep their order. A record over the server's ``max_payload`` is a poison record.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

from core.sink_config import NatsOptions
from log.base import TopicPartition
from log.consumer import Checkpoint
from sinks.base import Guarantee, Reject
from sinks.errors import SinkConfigError, TargetUnavailableError
from sinks.event_loop import BackgroundLoop
from sinks.records import Rejection, SinkRecord, topic_fields


class JetStreamSink:
    """Publishes batches to JetStream (see the module docstring)."""

    guarantee = Guarantee(
        "exactly once within the stream's duplicate window (Nats-Msg-Id), at least once beyond it",
        "the Nats-Msg-Id header (<topic>/<partition>/<offset>)",
    )

    def __init__(self, name: str, options: NatsOptions) -> None:
        self.name = name
        self.options = options
        self._loop: BackgroundLoop | None = None
        self._nc: Any = None
        self._js: Any = None
        self._subjects: dict[str, str] = {}

    def open(self) -> None:
        """Connect (and create the stream when asked); :class:`TargetUnavailableError` when NATS does not answer."""
        if self._loop is None:
            self._loop = BackgroundLoop(f"sink-{self.name}-nats")
        self._run(self._open(), self.options.timeout_s + 5)

    async def _open(self) -> None:
        import nats
        from nats.js.api import StreamConfig
        from nats.js.errors import NotFoundError

        if self._nc is None or self._nc.is_closed:
            self._nc = await nats.connect(
                servers=list(self.options.servers),
                connect_timeout=min(self.options.timeout_s, 5),
                allow_reconnect=True,
                max_reconnect_attempts=-1,
                reconnect_time_wait=0.5,
                name=f"headwater-sink-{self.name}",
            )
            self._js = self._nc.jetstream(publish_async_max_pending=self.options.in_flight)
        if self.options.stream is None:
            return
        try:
            await self._js.stream_info(self.options.stream)
        except NotFoundError:
            prefix = self.options.subject.split("{", 1)[0].rstrip(".")
            subjects = list(self.options.subjects) or ([f"{prefix}.>"] if prefix else [">"])
            await self._js.add_stream(
                StreamConfig(
                    name=self.options.stream, subjects=subjects, duplicate_window=self.options.duplicate_window_s
                )
            )

    def _run(self, coroutine: Any, timeout_s: float) -> Any:
        import nats.errors
        import nats.js.errors

        assert self._loop is not None
        try:
            return self._loop.run(coroutine, timeout_s)
        except (TimeoutError, nats.errors.Error, OSError) as exc:
            if isinstance(exc, nats.js.errors.BadRequestError):
                raise SinkConfigError(self.name, f"JetStream refused: {exc}") from None
            raise TargetUnavailableError(self.name, f"nats: {type(exc).__name__}: {exc}") from None

    def deliver(
        self, records: Sequence[SinkRecord], checkpoints: Mapping[TopicPartition, Checkpoint], reject: Reject
    ) -> None:
        """Publish ``records`` and wait for every acknowledgement; oversized records go to ``reject``."""
        if not records:
            return
        limit = self._nc.max_payload if self._nc is not None else None
        poison = [r for r in records if limit and len(r.payload) > limit]
        if poison:
            reject([Rejection(r, f"{len(r.payload)} bytes, over the server's max_payload {limit}") for r in poison])
            records = [r for r in records if not limit or len(r.payload) <= limit]
        timeout = self.options.timeout_s + len(records) / 1000
        self._run(self._publish(records), timeout)

    async def _publish(self, records: Sequence[SinkRecord]) -> None:
        js = self._js
        futures = []
        try:
            for r in records:
                headers = {"Nats-Msg-Id": r.event_id, "Headwater-Key": (r.key or b"null").decode()}
                futures.append(await js.publish_async(self._subject(r.topic), r.payload, headers=headers))
            await asyncio.wait_for(asyncio.gather(*futures), self.options.timeout_s)
        except BaseException:
            # Acknowledgements that will never come (a server that died) would keep their slots of
            # the client's in-flight limit: give them back before the batch is retried.
            for future in futures:
                future.cancel()
            raise

    def _subject(self, topic: str) -> str:
        subject = self._subjects.get(topic)
        if subject is None:
            subject = self._subjects[topic] = self.options.subject.format(**topic_fields(topic))
        return subject

    def close(self) -> None:
        """Close the connection and the loop."""
        if self._loop is None:
            return
        if self._nc is not None and not self._nc.is_closed:
            with contextlib.suppress(Exception):  # closing a connection to a dead server: nothing to keep
                self._loop.run(self._nc.close(), 5)
        self._nc = None
        self._loop.close()
        self._loop = None
