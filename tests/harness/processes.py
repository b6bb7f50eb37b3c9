"""Make sure every service a test session starts is stopped when the session ends, however it ends.

``stop_at_exit`` registers a stop callback that runs from the pytest finalizer, from
``atexit`` (session crashed before its finalizers) or on SIGTERM, whichever comes first,
and only once.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import signal
import threading
from collections.abc import Callable
from typing import Any

_lock = threading.Lock()
_pending: list[Callable[[], None]] = []
_signal_installed = False


def stop_at_exit(stop: Callable[[], None]) -> Callable[[], None]:
    """Register ``stop`` to run at interpreter exit or SIGTERM; returns an idempotent stopper."""
    done = threading.Event()

    def once() -> None:
        if done.is_set():
            return
        done.set()
        with _lock, contextlib.suppress(ValueError):
            _pending.remove(once)
        stop()

    with _lock:
        _pending.append(once)
    _install_sigterm()
    return once


def stop_all() -> None:
    """Stop everything still registered, newest first (the atexit and SIGTERM path)."""
    while True:
        with _lock:
            if not _pending:
                return
            stopper = _pending[-1]
        with contextlib.suppress(Exception):
            stopper()


atexit.register(stop_all)


def _install_sigterm() -> None:
    # Python's default SIGTERM ends the process without atexit: services would leak.
    global _signal_installed
    if _signal_installed or threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return
    _signal_installed = True

    def on_sigterm(signum: int, frame: Any) -> None:
        stop_all()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_sigterm)


def die_with_parent() -> None:
    """``preexec_fn`` for child processes: the kernel sends SIGTERM to the child if pytest dies (Linux)."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGTERM)
