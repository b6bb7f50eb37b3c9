"""The CLI's last line is the last thing on stderr, even when threads are left mid-work at exit."""

from __future__ import annotations

import subprocess
import sys

import pytest

# A process like `headwater load` stopping on an error while another query's micro-batch holds
# DuckDB cursors in a daemon thread: DuckDB's bindings print "nanobind: leaked ..." at shutdown.
PROGRAM = """
import sys, threading, time
import duckdb
from headwater.cli import exit_quietly

if "{quiet}" == "yes":
    exit_quietly()
held = threading.Event()

def micro_batch():
    cursor = duckdb.connect(":memory:").cursor()
    cursor.execute("SELECT 1").fetchall()
    held.set()
    time.sleep(60)

threading.Thread(target=micro_batch, daemon=True).start()
held.wait()
print("error: the one line", file=sys.stderr)
sys.exit(3)
"""


@pytest.mark.parametrize("quiet", ["yes", "no"])
def test_nothing_follows_the_error_line_when_threads_are_left_at_exit(quiet: str) -> None:
    result = subprocess.run(
        [sys.executable, "-c", PROGRAM.format(quiet=quiet)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 3
    if quiet == "yes":
        assert result.stderr == "error: the one line\n"
    else:  # what the CLI guards against is real: without it the noise follows the line
        assert result.stderr.startswith("error: the one line\nnanobind: leaked"), result.stderr[:300]
