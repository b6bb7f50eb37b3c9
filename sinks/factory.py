"""Builds a sink of any kind from ``headwater.yaml``: the one module that knows every kind.

Each kind's module is imported only when a sink of that kind is built, so a process loads
only the client libraries it uses (redis, nats-py, aio-pika, urllib3, psycopg).
"""

from __future__ import annotations

from core.config import ProjectConfig
from core.sink_config import NatsOptions, PostgresOptions, RabbitmqOptions, RedisOptions, WebhookOptions
from log.base import Log
from sinks.base import Sink


def build_sink(config: ProjectConfig, name: str, log: Log) -> Sink:
    """The :class:`~sinks.base.Sink` of sink ``name`` (not yet opened)."""
    spec = config.sinks[name]
    options = spec.options
    if isinstance(options, WebhookOptions):
        from sinks.webhook import WebhookSink

        return WebhookSink(name, options)
    if isinstance(options, RedisOptions):
        from sinks.redis_streams import RedisStreamSink

        return RedisStreamSink(name, options, spec.transform)
    if isinstance(options, NatsOptions):
        from sinks.nats_jetstream import JetStreamSink

        return JetStreamSink(name, options)
    if isinstance(options, RabbitmqOptions):
        from sinks.rabbitmq import RabbitSink

        return RabbitSink(name, options)
    if isinstance(options, PostgresOptions):
        from sinks.postgres.sink import PostgresSink

        return PostgresSink(name, options, spec.transform, config, log)
    msg = f"no sink kind for {type(options).__name__}"
    raise TypeError(msg)
