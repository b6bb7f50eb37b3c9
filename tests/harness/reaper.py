"""A reaper for servers that daemonise: stopped and removed when the test process dies, however it dies.

PostgreSQL's ``pg_ctl start`` detaches the server from its caller, so ``die_with_parent``
(the kernel's parent-death signal) cannot reach it: a SIGKILLed pytest worker would leave its
server running with nothing to stop it. :func:`reap_when_gone` starts this module as a small
watcher in a session of its own (a kill of the test's process group does not reach it) that
polls the test process; when that process is gone and the directory still exists, it sends the
servers the immediate-shutdown signal (SIGQUIT), waits for them to exit and removes the
directory. When the test stops the servers itself, the directory goes first and the watcher exits.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from core.process_lifetime import process_alive


def reap_when_gone(root: Path, data_dirs: list[Path]) -> None:
    """Stop the servers of ``data_dirs`` and remove ``root`` once this process has died without doing so."""
    pid_files = [str(data / "postmaster.pid") for data in data_dirs]
    subprocess.Popen(  # our own interpreter and module
        [sys.executable, __file__, str(os.getpid()), str(root), *pid_files],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        close_fds=True,
    )


def _watch(owner: int, root: Path, pid_files: list[Path]) -> None:
    """Wait until ``owner`` is gone (or ``root`` removed); then stop the servers and remove ``root``."""
    while process_alive(owner) and root.exists():
        time.sleep(1.0)
    if not root.exists():
        return
    servers = []
    for pid_file in pid_files:
        with contextlib.suppress(OSError, ValueError, IndexError):
            servers.append(int(pid_file.read_text().split()[0]))
    for pid in servers:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGQUIT)
    deadline = time.monotonic() + 30
    while any(process_alive(pid) for pid in servers) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in servers:
        if process_alive(pid):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    _watch(int(sys.argv[1]), Path(sys.argv[2]), [Path(arg) for arg in sys.argv[3:]])
