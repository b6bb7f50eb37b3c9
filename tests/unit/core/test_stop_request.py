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


def test_a_signal_inside_an_import_is_raised_once_the_import_has_finished(tmp_path) -> None:
    # Raised mid-import, a native module can be left half-initialised (DuckDB's aborted the
    # process) and CPython may end the process with SIGINT after the stop was handled (exit -2).
    (tmp_path / "slow_module.py").write_text(
        "import os, signal, time\nos.kill(os.getpid(), signal.SIGTERM)\ntime.sleep(0.3)\nFINISHED = True\n"
    )
    done = run(
        f"""
        import sys, time
        sys.path.insert(0, {str(tmp_path)!r})
        from core import stop_request
        stop_request.stop_anywhere()
        try:
            import slow_module
            time.sleep(5)
            print("not interrupted")
        except KeyboardInterrupt:
            print("interrupted after the import:", sys.modules["slow_module"].FINISHED)
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "interrupted after the import: True"


def test_a_handler_may_set_the_stop_event_while_its_own_thread_holds_the_events_lock() -> None:
    """What a signal landing inside ``Event.wait`` does: ``set()`` from the thread holding the lock.

    A plain ``threading.Event`` hangs there for good (checked first, so this test fails if the
    hazard it guards against ever stops existing in the standard library, not only if the fix
    goes); :class:`SignalSafeEvent` sets the flag and returns.
    """
    done = run(
        """
        import threading
        from core.stop_request import SignalSafeEvent

        def set_inside_wait(event, patience):
            returned = threading.Event()
            def handler_in_the_waiting_thread():
                with event._cond:  # where wait() holds it: before it sleeps, after each timeout
                    event.set()
                returned.set()
            threading.Thread(target=handler_in_the_waiting_thread, daemon=True).start()
            return returned.wait(patience)

        print("plain", set_inside_wait(threading.Event(), 0.3))
        safe = SignalSafeEvent()
        print("safe", set_inside_wait(safe, 10), safe.is_set(), safe.wait(0))
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["plain", "False", "safe", "True", "True", "True"]
