"""SIGINT and SIGTERM of a long-running (``--follow``) command: a clean stop at any moment.

A ``--follow`` stage stops cleanly whatever it is doing when the signal comes: each stage's work
loop has its own graceful handler (capture appends and acknowledges the transaction in hand,
Spark queries finish or drop their micro-batch and resume from their checkpoints, the cleaner
ends its pass), and before and around those loops (loading the config, waiting for a lease,
starting Spark, planning queries: nothing written yet, or nothing that a restart does not
resume) the signal raises :class:`KeyboardInterrupt` where the main thread is, and the command
exits 0 (``headwater.cli_context``). So ``run --follow``'s supervisor sees every stage exit 0.

* :func:`listen`, first thing in the process: a signal only marks :data:`requested` (Python's
  start-up and imports are not interrupted). It also unblocks SIGINT/SIGTERM: a supervisor
  starts its children with SIGINT blocked (:func:`held_until_listening`), so a stop sent while
  the interpreter is still starting stays pending until here instead of killing it mid-import.
* :func:`stop_anywhere`: from then on a signal raises :class:`KeyboardInterrupt` (at once if one
  came already); after the first, further signals only mark the request, so the unwinding
  (Spark's stop, leases released) is not interrupted again. Never inside an import: raised
  there, it can leave a native module half-initialised (DuckDB's import then aborted the
  process, exit -6), and one raised while an extension runs Python through ``PyRun_String``
  makes CPython end the process with SIGINT (exit -2) even after the stop was handled. A
  signal that lands in an import is sent again a moment later, until it lands outside one.
"""

from __future__ import annotations

import os
import signal
import threading
from types import FrameType

#: How long a stop that landed inside an import waits before it is sent again.
_RETRY_S = 0.05


class SignalSafeEvent(threading.Event):
    """A :class:`threading.Event` a signal handler may set while the main thread waits on it.

    A handler runs in the main thread, between two of its bytecodes. ``Event.wait(timeout)``
    holds the event's lock at moments (before it sleeps, after each timeout); a handler that
    calls ``set()`` at such a moment waits for a lock its own thread holds: the process hangs
    for good, deaf to further SIGTERMs (seen as a consumer-group test member that never stopped;
    1 in ~1,850 signals in a loop under load). Here the lock is re-entrant, so that ``set()``
    takes it again and wakes every waiter, the main thread's own wait included.
    """

    def __init__(self) -> None:
        super().__init__()
        self._cond = threading.Condition(threading.RLock())


#: Set once SIGINT or SIGTERM asked this process to stop.
requested = SignalSafeEvent()
SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _mark(_signum: int, _frame: FrameType | None) -> None:
    requested.set()


def _raise(signum: int, frame: FrameType | None) -> None:
    requested.set()
    if _importing(frame):
        retry = threading.Timer(_RETRY_S, os.kill, (os.getpid(), signum))
        retry.daemon = True
        retry.start()
        return
    listen()
    raise KeyboardInterrupt


def _importing(frame: FrameType | None) -> bool:
    """Whether ``frame`` (where the main thread is) runs inside an import."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def listen() -> None:
    """SIGINT/SIGTERM only mark :data:`requested` (main thread only, as every signal handler)."""
    if threading.current_thread() is threading.main_thread():
        for number in SIGNALS:
            signal.signal(number, _mark)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _HELD)


_HELD = frozenset(SIGNALS)


def held_until_listening() -> None:
    """A child's ``preexec_fn`` part: SIGINT/SIGTERM stay pending from exec until its :func:`listen`."""
    signal.pthread_sigmask(signal.SIG_BLOCK, _HELD)


def stop_anywhere() -> None:
    """SIGINT/SIGTERM raise :class:`KeyboardInterrupt` in the main thread; at once if a stop was requested."""
    if threading.current_thread() is threading.main_thread():
        for number in SIGNALS:
            signal.signal(number, _raise)
    if requested.is_set():  # marked before (or while) the handlers were installed
        listen()
        raise KeyboardInterrupt
