"""Which processes a command left behind: its tree, and anything still working in its directory (/proc)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _stat(pid: int) -> tuple[str, int] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()
    return fields[0], int(fields[1])


def alive(pid: int) -> bool:
    """Running (not gone, not a zombie)."""
    stat = _stat(pid)
    return stat is not None and stat[0] not in ("Z", "X")


def descendants(root: int) -> set[int]:
    """Every live process below ``root``."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) is not None and stat[0] not in ("Z", "X"):
            children.setdefault(stat[1], []).append(int(entry.name))
    found: set[int] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def command_line(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    return ""


def working_in(directory: Path) -> set[int]:
    """Live processes whose working directory is ``directory`` or below, or whose command line names it."""
    directory = directory.resolve()
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid() or not alive(int(entry.name)):
            continue
        pid = int(entry.name)
        try:
            cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
        except OSError:
            continue
        if cwd == directory or directory in cwd.parents or str(directory) in command_line(pid):
            found.add(pid)
    return found


def wait_all_gone(pids: set[int], timeout_s: float) -> set[int]:
    """The pids still alive after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    left = {pid for pid in pids if alive(pid)}
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = {pid for pid in left if alive(pid)}
    return left


def kill_all(pids: set[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def wait_for(condition: Callable[[], Any], timeout_s: float, what: str, log: Path) -> Any:
    """``condition()``'s first truthy value within ``timeout_s`` (polled each second), else fail with ``log``'s tail."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            last = condition()
            if last:
                return last
        time.sleep(1)
    raise AssertionError(f"{what} within {timeout_s:.0f}s (last: {last}); output:\n{log.read_text()[-4000:]}")
