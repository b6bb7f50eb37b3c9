"""What the benches that run a pipeline in its own process group share: its tree's CPU, and stopping it."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK")


def tree_cpu(root: int) -> float:
    """CPU seconds (user + system) of ``root``'s live process tree, with its reaped children's.

    Each live process counts its own time and that of the children it has reaped (a Python
    worker or source runner that came and went), so the difference of two readings holds every
    process that ran in between, not only those still running.
    """
    children: dict[int, list[int]] = {}
    ticks: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
        ticks[int(entry)] = sum(int(field) for field in fields[11:15])  # utime, stime, cutime, cstime
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += ticks.get(pid, 0)
        todo += children.get(pid, [])
    return total / _TICK


def stop_group(process: subprocess.Popen[bytes], timeout: float = 90) -> None:
    """SIGINT to ``process``'s group (started with ``start_new_session``), SIGKILL after ``timeout`` s."""
    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGINT)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
