"""An iterator read one item ahead by a thread of its own.

The snapshot reads COPY blocks this way (the extension's reads release the GIL, so the
server produces the next block while the caller encodes and appends this one) and starts
the next chunk's COPY on a second connection while the current chunk is still taken.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import TypeVar

_END = object()
_Item = TypeVar("_Item")


class ReadAhead(Iterator[_Item]):
    """The items of ``source``, produced by a thread from construction on, one item ahead.

    The snapshot starts the next chunk's COPY (on a second connection) this way while the
    agent still takes the chunk before, so the server runs it meanwhile. The thread alone
    drives ``source`` (and its connection) until it ends; :meth:`close` stops it early and
    waits for it (``source`` is closed, so a COPY is drained, in that thread).
    """

    def __init__(self, source: Iterator[_Item], name: str = "snapshot-read-ahead") -> None:
        self._ahead: queue.Queue[object] = queue.Queue(maxsize=1)
        self._stop = threading.Event()
        self._done = False
        self._thread = threading.Thread(target=self._pump, args=(source,), name=name, daemon=True)
        self._thread.start()

    def _pump(self, source: Iterator[_Item]) -> None:
        try:
            for item in source:
                while not self._stop.is_set():
                    try:
                        self._ahead.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if self._stop.is_set():
                    break
        except BaseException as exc:  # handed to the consumer, raised there
            self._ahead.put(exc)
            return
        finally:
            close = getattr(source, "close", None)
            if close is not None:
                close()
        self._ahead.put(_END)

    def __next__(self) -> _Item:
        if self._done:
            raise StopIteration
        item = self._ahead.get()
        if item is _END:
            self._done = True
            self._thread.join()
            raise StopIteration
        if isinstance(item, BaseException):
            self._done = True
            self._thread.join()
            raise item
        return item  # type: ignore[return-value]

    def close(self) -> None:
        """Stop reading (idempotent); returns once the thread has ended."""
        self._stop.set()
        while self._thread.is_alive():
            try:
                self._ahead.get(timeout=0.1)
            except queue.Empty:
                continue
        self._thread.join()
        self._done = True
