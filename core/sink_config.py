"""The ``sinks:`` section of ``headwater.yaml``: where the log is delivered, one consumer group per sink.

Each sink names a ``kind`` and takes that kind's ``options`` (validated by the kind's model
below, so an error names ``sinks.<name>.options.<field>``), the topics it reads (``from``:
names or globs), an optional ``filter`` (a SQL predicate on the event) and ``transform``
(choose fields, flatten to the row). Secrets (a webhook's HMAC key, passwords in URLs and
DSNs) are :class:`pydantic.SecretStr` and never shown.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, ValidationInfo, field_validator

from core.config_model import ConfigModel

SinkKind = Literal["webhook", "redis", "nats", "rabbitmq", "postgres"]
#: The fields a template (a stream, subject, routing key or table name) may name.
TEMPLATE_FIELDS = ("topic", "source", "schema", "table")


def _template(value: str) -> str:
    try:
        value.format(**dict.fromkeys(TEMPLATE_FIELDS, "x"))
    except (KeyError, IndexError, ValueError) as exc:
        msg = f"template {value!r} may name only {{{'}, {'.join(TEMPLATE_FIELDS)}}}: {exc}"
        raise ValueError(msg) from None
    return value


class WebhookOptions(ConfigModel):
    """POST batches of events as a JSON array to ``url``; a 2xx accepts the whole batch."""

    url: Annotated[str, Field(pattern=r"^https?://[^\s/]+")]
    #: Key of the HMAC-SHA256 signature of the body, sent in ``signature_header`` (``sha256=<hex>``).
    secret: SecretStr | None = None
    signature_header: str = "X-Headwater-Signature"
    headers: dict[str, str] = {}
    timeout_s: float = Field(default=10.0, gt=0)


class RedisOptions(ConfigModel):
    """``XADD`` each event to a stream; optionally mirror each key's latest row (``SET``/``DEL``)."""

    url: SecretStr = SecretStr("redis://127.0.0.1:6379/0")
    stream: str = "{topic}"
    #: ``MAXLEN ~ N`` on each ``XADD`` (``None``: the stream keeps everything).
    maxlen: int | None = Field(default=None, gt=0)
    #: Key prefix of the key-value mirror (``<prefix><topic>:<key JSON>``); ``None``: no mirror.
    mirror_prefix: str | None = None

    _stream = field_validator("stream")(classmethod(lambda cls, v: _template(v)))


class NatsOptions(ConfigModel):
    """Publish each event to JetStream with ``Nats-Msg-Id`` (the server drops a repeat within its window)."""

    servers: tuple[str, ...] = ("nats://127.0.0.1:4222",)
    subject: str = "{topic}"
    #: Create this stream over ``subjects`` when it does not exist (``None``: it must exist).
    stream: str | None = None
    subjects: tuple[str, ...] = ()
    duplicate_window_s: float = Field(default=120.0, gt=0)
    #: Publishes awaiting their acknowledgement at once.
    in_flight: int = Field(default=1000, ge=1)
    timeout_s: float = Field(default=10.0, gt=0)

    _subject = field_validator("subject")(classmethod(lambda cls, v: _template(v)))

    @field_validator("servers", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return (value,) if isinstance(value, str) else value


class RabbitmqOptions(ConfigModel):
    """Publish each event persistently to ``exchange`` with publisher confirms."""

    url: SecretStr = SecretStr("amqp://guest:guest@127.0.0.1:5672/")
    exchange: str = ""
    routing_key: str = "{topic}"
    #: Declare this durable queue (bound to ``exchange`` by ``routing_key`` unless the default exchange).
    queue: str | None = None
    timeout_s: float = Field(default=10.0, gt=0)

    _routing_key = field_validator("routing_key")(classmethod(lambda cls, v: _template(v)))


class PostgresOptions(ConfigModel):
    """A live replica of each topic's rows in a table, with the sink's offsets in the same transactions."""

    dsn: SecretStr
    schema_: str = Field(default="public", alias="schema")
    table: str = "{table}"

    _table = field_validator("table")(classmethod(lambda cls, v: _template(v)))


_OPTIONS: dict[str, type[ConfigModel]] = {
    "webhook": WebhookOptions,
    "redis": RedisOptions,
    "nats": NatsOptions,
    "rabbitmq": RabbitmqOptions,
    "postgres": PostgresOptions,
}

SinkOptions = WebhookOptions | RedisOptions | NatsOptions | RabbitmqOptions | PostgresOptions


class TransformConfig(ConfigModel):
    """What is delivered of an event: every field, or the row (``flatten``), optionally only some columns."""

    #: Deliver the row (``after``; a delete's ``before``) with ``__op``, ``__topic``, ``__deleted``,
    #: ``__source_ts_ms`` instead of the whole envelope (Debezium's ExtractNewRecordState).
    flatten: bool = False
    #: Keep only these row columns (in ``before`` and ``after``, or in the flattened row).
    fields: tuple[str, ...] | None = None

    @field_validator("fields")
    @classmethod
    def _distinct(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if value is not None and (not value or len(set(value)) != len(value)):
            msg = "give one or more distinct column names"
            raise ValueError(msg)
        return value


class RetryConfig(ConfigModel):
    """Backoff between attempts while the target is down: exponential from ``initial_s`` to ``max_s``, jittered."""

    initial_s: float = Field(default=0.5, gt=0)
    max_s: float = Field(default=30.0, gt=0)


class SinkConfig(ConfigModel):
    """One sink: a consumer group ``headwater.sink.<name>`` delivering ``from`` to a target of ``kind``."""

    kind: SinkKind
    #: Topic names or globs (``shop.public.*``); a feed's name reads its current topic.
    from_: tuple[str, ...] = Field(alias="from")
    options: SinkOptions = Field(default_factory=dict, validate_default=True)
    #: A SQL boolean expression over the event (DuckDB): ``op``, ``topic``, ``before``, ``after``, ``source``.
    filter: str | None = None
    transform: TransformConfig = TransformConfig()
    #: The most records one delivery carries.
    batch_size: int = Field(default=500, ge=1, le=100_000)
    retry: RetryConfig = RetryConfig()

    @field_validator("from_", mode="before")
    @classmethod
    def _topics(cls, value: Any) -> Any:
        value = (value,) if isinstance(value, str) else value
        if not value:
            msg = "name one or more topics, feeds or globs"
            raise ValueError(msg)
        return value

    @field_validator("options", mode="before")
    @classmethod
    def _options_of_kind(cls, value: Any, info: ValidationInfo) -> Any:
        model = _OPTIONS.get(str(info.data.get("kind")))
        if model is None:
            return value  # the kind's own error names it
        return model.model_validate(value if value is not None else {})

    @field_validator("filter")
    @classmethod
    def _predicate(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            msg = "give a SQL boolean expression over the event, e.g. \"op <> 'd'\""
            raise ValueError(msg)
        return value
