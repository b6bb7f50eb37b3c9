"""Child processes that never outlive the process that started them (Linux).

The kernel's parent-death signal (``prctl(PR_SET_PDEATHSIG)``) is set in the child between
``fork`` and ``exec`` (a ``preexec_fn``), so it holds even when the parent is SIGKILLed or
OOM-killed, where no cleanup code of the parent runs. It survives ``exec`` (not of a
set-uid binary) and is not inherited by the child's own children: each generation sets
its own (``headwater run --follow`` sets it on its stages, each stage on its Spark JVM).

Caveat (Linux): the "parent" is the *thread* that forked the child. A child started from a
thread that later exits would be signalled then, so :func:`parent_death_preexec` sets the
signal only when called from the main thread, which lives as long as the process, or from a
thread its caller vouches for (``thread_outlives_child``: a supervisor thread that waits for
its children before it ends); children started from other threads do without it (their
callers stop them explicitly).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
import threading
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1


def _prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None
    function: Callable[..., int] = libc.prctl
    return function


# Looked up once in the parent: a preexec_fn runs between fork and exec, where loading a
# library (or anything that takes a lock another thread may hold) can deadlock.
_PRCTL = _prctl()


def set_parent_death_signal(signum: int = signal.SIGKILL) -> None:
    """In the calling process: have the kernel send ``signum`` when its parent thread exits."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0)


def parent_death_preexec(
    signum: int = signal.SIGKILL, then: Callable[[], object] | None = None, *, thread_outlives_child: bool = False
) -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child die with this process (see the module docstring).

    ``then`` runs after it in the child (another ``preexec_fn`` to keep). ``None`` when
    there is nothing to do (not Linux, not the main thread unless ``thread_outlives_child``,
    and no ``then``).
    """
    on_main = threading.current_thread() is threading.main_thread()
    if _PRCTL is None or not (on_main or thread_outlives_child):
        return None if then is None else _only(then)
    prctl, number, parent = _PRCTL, int(signum), os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, number, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the signal was armed
            os._exit(1)
        if then is not None:
            then()

    return preexec


def _only(then: Callable[[], object]) -> Callable[[], None]:
    def preexec() -> None:
        then()

    return preexec


def process_alive(pid: int) -> bool:
    """Whether a process with ``pid`` exists on this host (one of another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
