"""A retry loop's state changes, logged once each (a server down for an hour is one line, not thousands)."""

from __future__ import annotations

import logging
import time

logger = logging.getLogger(__name__)


class RetryReport:
    """Logs a retry loop's state changes: one line when a new error shows, one when it recovers.

    Each line names the source; the same error repeating (the server is still down)
    stays quiet. Messages come from :class:`ReplicationLostError`, whose text is
    scrubbed of DSN passwords.
    """

    def __init__(self, source: str) -> None:
        self.source = source
        self._last: str | None = None
        self._since = 0.0
        self._attempts = 0

    def failed(self, detail: str, max_delay_s: float) -> None:
        """One attempt failed with ``detail``."""
        if self._attempts == 0:
            self._since = time.monotonic()
        self._attempts += 1
        detail = detail.removesuffix("; reconnecting")
        if detail != self._last:
            self._last = detail
            logger.warning("source %s: %s; retrying with backoff (at most %gs apart)", self.source, detail, max_delay_s)

    def resumed(self) -> None:
        """An attempt worked."""
        if self._attempts:
            logger.warning(
                "source %s: replication resumed after %d failed attempts in %.1fs",
                self.source,
                self._attempts,
                time.monotonic() - self._since,
            )
        self._attempts = 0
        self._last = None
