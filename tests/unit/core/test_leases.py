"""Leases: one holder at a time, named when it blocks another; the kernel frees a SIGKILLed holder's lease."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from core.leases import HeldError, Lease, LeaseWait, acquire, lease

HOLD = """
import sys, time
from pathlib import Path
from core.leases import lease
held = lease(Path(sys.argv[1]), "capture", "shop")
assert held.try_acquire()
print("held", flush=True)
time.sleep(600)
"""


def hold_in_child(home) -> subprocess.Popen[str]:
    child = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(home), "capture", "--follow"], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "held"
    return child


def test_a_held_lease_names_its_holder_and_a_bounded_wait_gives_up_in_one_line(tmp_path):
    child = hold_in_child(tmp_path)
    try:
        mine = lease(tmp_path, "capture", "shop")
        assert not mine.try_acquire()
        holder = mine.holder()
        assert holder is not None and holder.pid == child.pid
        assert "capture --follow" in holder.command and holder.since.endswith("Z")
        started = time.monotonic()
        with pytest.raises(HeldError) as raised:
            acquire([mine], LeaseWait(timeout_s=1.0))
        assert 1.0 <= time.monotonic() - started < 5
        message = str(raised.value)
        assert message.startswith("capture of source shop is held by pid ")
        assert f"pid {child.pid} on " in message and "gave up after 1s" in message and "\n" not in message
        assert not mine.held
    finally:
        child.kill()
        child.wait()


def test_a_standby_says_so_once_and_takes_over_when_the_holder_is_sigkilled(tmp_path):
    child = hold_in_child(tmp_path)
    said: list[str] = []
    mine = lease(tmp_path, "capture", "shop")
    done = threading.Event()

    def standby() -> None:
        acquire([mine], LeaseWait(timeout_s=None, say=said.append))
        done.set()

    thread = threading.Thread(target=standby, daemon=True)
    thread.start()
    time.sleep(1.5)
    assert not done.is_set()
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    assert done.wait(10), "the standby did not take over"
    assert mine.held and mine.holder() is not None and mine.holder().pid == os.getpid()
    assert len(said) == 1 and said[0].startswith("standby: capture of source shop is held by pid ")
    assert "taking over when it stops" in said[0]
    mine.release()
    assert Lease(mine.path, mine.what).try_acquire()


def test_leases_taken_before_a_timeout_are_let_go(tmp_path):
    child = hold_in_child(tmp_path)
    try:
        first, second = lease(tmp_path, "capture", "other"), lease(tmp_path, "capture", "shop")
        with pytest.raises(HeldError):
            acquire([first, second], LeaseWait(timeout_s=0.2))
        assert not first.held and lease(tmp_path, "capture", "other").try_acquire()
    finally:
        child.kill()
        child.wait()


def test_taken_says_whether_a_process_holds_the_lease_without_taking_it(tmp_path):
    assert lease(tmp_path, "capture", "shop").taken() is False  # never taken: no file yet
    child = hold_in_child(tmp_path)
    try:
        looker = lease(tmp_path, "capture", "shop")
        assert looker.taken() is True
        assert not looker.try_acquire()  # looking took nothing; the holder still has it
    finally:
        child.kill()
        child.wait()
    assert lease(tmp_path, "capture", "shop").taken() is False  # the kernel dropped the lock of the killed holder
    mine = lease(tmp_path, "capture", "shop")
    assert mine.try_acquire() and mine.taken() is True
    mine.release()
    assert mine.taken() is False
