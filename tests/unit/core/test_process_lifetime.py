"""A child started with the parent-death preexec dies when its parent is SIGKILLed (Linux)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

PARENT = """
import subprocess, sys, time
from core.process_lifetime import parent_death_preexec
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], preexec_fn=parent_death_preexec())
print(child.pid, flush=True)
time.sleep(600)
"""


def gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().split(")")[1].split()[0] in ("Z", "X"):
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.02)
    return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_the_child_dies_with_its_sigkilled_parent():
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    try:
        assert not gone(child, 0.3)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        assert gone(child, 2.0), "the child outlived its SIGKILLed parent"
    finally:
        if not gone(child, 0):
            os.kill(child, signal.SIGKILL)


SUPERVISOR_IN_A_THREAD = """
import sys, threading, time
from operations.pipeline import Stage, Supervisor
stage = Stage("sleeper", [sys.executable, "-c", "import time; time.sleep(600)"])
supervisor = Supervisor([stage], say=lambda line: None)
threading.Thread(target=supervisor.run, daemon=True).start()  # as BackgroundCleaner runs it
while stage.process is None:
    time.sleep(0.01)
print(stage.process.pid, flush=True)
time.sleep(600)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_stage_a_supervisor_thread_started_dies_with_its_sigkilled_process():
    """``capture --follow`` supervises its cleaner from a thread; the cleaner must not outlive it."""
    parent = subprocess.Popen([sys.executable, "-c", SUPERVISOR_IN_A_THREAD], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    try:
        assert not gone(child, 0.3)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        assert gone(child, 2.0), "the stage outlived the SIGKILLed process whose supervisor thread started it"
    finally:
        if not gone(child, 0):
            os.kill(child, signal.SIGKILL)
