"""Resident memory sampled from ``/proc`` while a process runs: of a process tree, or of one process.

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


def rss_kib(pid: int) -> int:
    """``VmRSS`` of ``pid`` in KiB; 0 once it is gone (or a zombie, which has none)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    for line in text.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


class TreeRss:
    """Samples the summed RSS of ``pid`` and its descendants until :meth:`stop` (or the process is gone)."""

    def __init__(
        self, pid: int, *, every_s: float = 0.05, tree_every_s: float = 1.0, limit_kib: int | None = None
    ) -> None:
        self.pid = pid
        #: The highest summed RSS seen, KiB.
        self.peak_kib = 0
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
            root = rss_kib(self.pid)
            if root == 0 and not Path(f"/proc/{self.pid}").exists():
                return
            total = root + sum(rss_kib(child) for child in pids)
            self.samples += 1
            self.peak_kib = max(self.peak_kib, total)
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


class RssSampler:
    """Samples ``VmRSS`` of one process every ``every_s`` until it exits; ``peak_kib`` is the highest seen.

    ``hwm_kib`` is the kernel's own high-water mark (``VmHWM``) at the last sample: exact up to
    then, where a short peak between two samples escapes ``peak_kib``.
    """

    def __init__(self, pid: int, every_s: float = 0.02) -> None:
        self.pid = pid
        self.peak_kib = 0
        self.hwm_kib = 0
        self._every_s = every_s
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        status = Path(f"/proc/{self.pid}/status")
        while True:
            try:
                text = status.read_text()
            except OSError:
                return
            for line in text.splitlines():
                if line.startswith("VmRSS:"):
                    self.peak_kib = max(self.peak_kib, int(line.split()[1]))
                elif line.startswith("VmHWM:"):
                    self.hwm_kib = max(self.hwm_kib, int(line.split()[1]))
            time.sleep(self._every_s)

    def join(self) -> None:
        """Wait for the sampling to end (the process exited)."""
        self._thread.join(timeout=5)
