"""The HTTP webhook kind: each batch POSTed as one JSON array, signed with HMAC-SHA256.

Body: ``[{"id", "topic", "partition", "offset", "timestamp_ms", "key", "value"}, ...]`` in
delivery order; ``id`` is the idempotency key ``<topic>/<partition>/<offset>``, ``key`` the
record key (JSON, ``null`` for keyless tables), ``value`` the event (or its transform).
Headers: ``Content-Type: application/json``, ``X-Headwater-Sink``, the configured ones, and
with a ``secret`` the signature ``<signature_header>: t=<unix seconds>,v1=<hex>`` where
``v1 = HMAC-SHA256(secret, "<t>." + body)`` (a receiver checks it and the age of ``t``).

Answers: 2xx accepts the whole batch. 408, 425, 429 and 5xx, a timeout or a refused
connection mean "later": :class:`~sinks.errors.TargetUnavailableError`, the runner retries
the batch. Any other 4xx refuses the batch: it is split in halves and each half sent on
(in order) until the refused records stand alone; each of those is a poison record for the
dead-letter topic, with the status and the start of the answer.

Guarantee: at least once; a retried batch repeats records the receiver may already have
taken (dedupe by ``id``); per-key order holds because one batch is in flight at a time.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Mapping, Sequence

import orjson
import urllib3

from core.sink_config import WebhookOptions
from log.base import TopicPartition
from log.consumer import Checkpoint
from sinks.base import Guarantee, Reject
from sinks.errors import TargetUnavailableError
from sinks.records import Rejection, SinkRecord

#: Client errors that mean "try again later", not "this request is wrong".
_LATER = frozenset({408, 425, 429})
#: How much of a refusal's answer the dead-letter reason keeps.
_REASON_BYTES = 300


class WebhookSink:
    """POSTs batches to ``options.url`` (see the module docstring)."""

    guarantee = Guarantee("at least once", 'each element\'s "id" (<topic>/<partition>/<offset>)')

    def __init__(self, name: str, options: WebhookOptions) -> None:
        self.name = name
        self.options = options
        self._secret = options.secret.get_secret_value().encode() if options.secret is not None else None
        self._pool: urllib3.PoolManager | None = None
        self._headers = {"Content-Type": "application/json", "X-Headwater-Sink": name, **options.headers}

    def open(self) -> None:
        """Create the connection pool (the first request connects)."""
        if self._pool is None:
            self._pool = urllib3.PoolManager(num_pools=1, maxsize=1, retries=False)

    def deliver(
        self, records: Sequence[SinkRecord], checkpoints: Mapping[TopicPartition, Checkpoint], reject: Reject
    ) -> None:
        """POST ``records``; poison records found by halving go to ``reject``."""
        if not records:
            return
        rejected: list[Rejection] = []
        self._send(records, rejected)
        reject(rejected)

    def _send(self, records: Sequence[SinkRecord], rejected: list[Rejection]) -> None:
        status, answer = self._post(body(records))
        if 200 <= status < 300:
            return
        if len(records) == 1:
            text = answer[:_REASON_BYTES].decode(errors="replace")
            rejected.append(Rejection(records[0], f"webhook answered HTTP {status}: {' '.join(text.split())}"))
            return
        middle = len(records) // 2
        self._send(records[:middle], rejected)
        self._send(records[middle:], rejected)

    def _post(self, payload: bytes) -> tuple[int, bytes]:
        assert self._pool is not None, "open() first"
        headers = dict(self._headers)
        if self._secret is not None:
            headers[self.options.signature_header] = signature(self._secret, payload, int(time.time()))
        try:
            response = self._pool.request(
                "POST",
                self.options.url,
                body=payload,
                headers=headers,
                timeout=urllib3.Timeout(total=self.options.timeout_s),
                preload_content=True,
            )
        except urllib3.exceptions.HTTPError as exc:  # refused, reset, timed out
            raise TargetUnavailableError(self.name, f"POST {_shown(self.options.url)}: {type(exc).__name__}") from None
        status = response.status
        if status >= 500 or status in _LATER or status < 200 or 300 <= status < 400:
            raise TargetUnavailableError(self.name, f"POST {_shown(self.options.url)} answered HTTP {status}")
        return status, response.data

    def close(self) -> None:
        """Close the connection pool."""
        if self._pool is not None:
            self._pool.clear()
            self._pool = None


def body(records: Sequence[SinkRecord]) -> bytes:
    """The JSON array of a batch, built from the stored JSON bytes without decoding them."""
    parts = []
    for r in records:
        parts.append(
            b'{"id":"%s","topic":%s,"partition":%d,"offset":%d,"timestamp_ms":%d,"key":%s,"value":%s}'
            % (
                r.event_id.encode(),
                orjson.dumps(r.topic),
                r.partition,
                r.offset,
                r.timestamp_ms,
                r.key if r.key is not None else b"null",
                r.payload,
            )
        )
    return b"[" + b",".join(parts) + b"]"


def signature(secret: bytes, payload: bytes, timestamp_s: int) -> str:
    """``t=<timestamp>,v1=<hex HMAC-SHA256 of "<timestamp>." + payload>``."""
    digest = hmac.new(secret, b"%d." % timestamp_s + payload, hashlib.sha256).hexdigest()
    return f"t={timestamp_s},v1={digest}"


def _shown(url: str) -> str:
    """The URL without its query string (which may hold a token)."""
    return url.split("?", 1)[0]
