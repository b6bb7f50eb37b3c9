"""Resident memory sampled from ``/proc`` while a process runs: of its process tree, and its own high-water mark.

:class:`TreeRss` reads ``VmRSS`` from ``/proc/<pid>/status`` of a process and every live
descendant every ``every_s`` (the tree itself is re-listed every ``tree_every_s``: a scan of
``/proc`` costs more than a read of a few status files) and keeps the highest sum seen. Given
a ``limit_kib``, it SIGKILLs the tree's process group the first time the sum passes it, so a
test whose memory bound is broken fails at the bound instead of swapping a shared machine: the
process must lead its own group (``subprocess.Popen(..., start_new_session=True)``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from pathlib import Path

from harness.process_tree import descendants


def status_kib(pid: int, *fields: str) -> dict[str, int]:
    """``fields`` (``VmRSS``, ``VmHWM``, ...) of ``/proc/<pid>/status`` in KiB; empty once it is gone.

    A zombie has no memory lines, so none of its fields is there.
    """
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    found = {}
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name in fields:
            found[name] = int(value.split()[0])
    return found


def rss_kib(pid: int) -> int:
    """``VmRSS`` of ``pid`` in KiB; 0 once it is gone (or a zombie, which has none)."""
    return status_kib(pid, "VmRSS").get("VmRSS", 0)


class TreeRss:
    """Samples the summed RSS of ``pid`` and its descendants until :meth:`stop` (or the process is gone).

    ``hwm_kib`` is the kernel's own high-water mark of ``pid`` alone (``VmHWM``) at the last
    sample: exact up to then, where a short peak between two samples escapes ``peak_kib``.
    """

    def __init__(
        self, pid: int, *, every_s: float = 0.05, tree_every_s: float = 1.0, limit_kib: int | None = None
    ) -> None:
        self.pid = pid
        #: The highest summed RSS seen, KiB.
        self.peak_kib = 0
        #: The highest ``VmHWM`` of ``pid`` seen, KiB.
        self.hwm_kib = 0
        #: Samples taken.
        self.samples = 0
        #: The sum that passed ``limit_kib`` (the tree was then killed), else None.
        self.killed_at_kib: int | None = None
        self._every_s = every_s
        self._tree_every_s = tree_every_s
        self._limit_kib = limit_kib
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        pids: set[int] = set()
        listed_at = float("-inf")
        while not self._stopped.is_set():
            if time.monotonic() - listed_at >= self._tree_every_s:
                pids = descendants(self.pid)
                listed_at = time.monotonic()
            root = status_kib(self.pid, "VmRSS", "VmHWM")
            if not root and not Path(f"/proc/{self.pid}").exists():
                return
            total = root.get("VmRSS", 0) + sum(rss_kib(child) for child in pids)
            self.samples += 1
            self.peak_kib = max(self.peak_kib, total)
            self.hwm_kib = max(self.hwm_kib, root.get("VmHWM", 0))
            if self._limit_kib is not None and total > self._limit_kib and self.killed_at_kib is None:
                self.killed_at_kib = total
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.pid, signal.SIGKILL)
                return
            self._stopped.wait(self._every_s)

    def stop(self) -> None:
        """Stop sampling (the last sample is kept)."""
        self._stopped.set()
        self._thread.join(timeout=5)

    def join(self) -> None:
        """Wait for the sampling to end by itself: the process is gone (reaped)."""
        self._thread.join(timeout=5)
