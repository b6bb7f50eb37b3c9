"""Sinks: the log delivered where services live (webhooks, Redis, NATS JetStream, RabbitMQ, PostgreSQL).

Each sink of ``headwater.yaml`` (``sinks:``) is a consumer group ``headwater.sink.<name>``
(:mod:`sinks.runner`) that polls its topics, filters and transforms each event
(:mod:`sinks.event_filter`, :mod:`sinks.transform`), hands batches to its kind
(:mod:`sinks.base` states the contract; one module or subpackage per kind, built by
:mod:`sinks.factory`), retries a target that is down with backoff and jitter
(:mod:`sinks.backoff`), and sends records the target refuses for good to its dead-letter topic
(:mod:`sinks.dead_letter`). Kinds never import each other; only the factory knows them all.
"""
