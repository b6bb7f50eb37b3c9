"""SIGINT/SIGTERM of a ``--follow`` command: kept from the first line, raised where the main thread is, once.

Each case runs in a child interpreter: signal handlers are per process.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap


def run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60, check=False
    )


def test_a_signal_before_the_stage_starts_is_kept_and_raised_when_it_does() -> None:
    done = run(
        """
        import os, signal
        from core import stop_request
        stop_request.listen()
        os.kill(os.getpid(), signal.SIGTERM)  # during start-up: only marked, the process goes on
        assert stop_request.requested.is_set()
        try:
            stop_request.stop_anywhere()
        except KeyboardInterrupt:
            print("raised at once")
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "raised at once"


def test_a_signal_raises_where_the_main_thread_is_and_further_ones_only_mark() -> None:
    done = run(
        """
        import os, signal, time
        from core import stop_request
        stop_request.stop_anywhere()
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)
            print("not interrupted")
        except KeyboardInterrupt:
            print("interrupted")
        os.kill(os.getpid(), signal.SIGTERM)  # while unwinding: marked, not raised again
        time.sleep(0.1)
        print("unwound", stop_request.requested.is_set())
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["interrupted", "unwound True"]
