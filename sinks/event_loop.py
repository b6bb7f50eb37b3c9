"""An asyncio loop in a daemon thread, for kinds whose client library is asynchronous (nats-py, aio-pika).

The loop runs between batches too, so the client answers the server's pings and heartbeats
while the sink waits for records (a loop run only during deliveries would let an idle
connection be dropped as dead).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class BackgroundLoop:
    """Runs coroutines on a loop of its own thread; :meth:`run` waits for one's result."""

    def __init__(self, name: str) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        """The coroutine's result (its exception raised here); ``TimeoutError`` after ``timeout_s``."""
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        try:
            return future.result(timeout_s)
        except TimeoutError:
            future.cancel()
            raise

    def close(self) -> None:
        """Stop the loop and its thread. Idempotent."""
        if self._loop.is_closed():
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        if not self._loop.is_running():
            self._loop.close()
