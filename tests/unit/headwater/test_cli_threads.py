"""The ``headwater`` process starts numpy without OpenBLAS threads (they spin at start, for nothing)."""

from __future__ import annotations

import os
import subprocess
import sys

_COUNT_THREADS = """
import os, sys
sys.argv = ["headwater", "--help"]
import headwater.__main__  # sets the environment as the console script does, before numpy
import numpy  # noqa: F401
print(len(os.listdir("/proc/self/task")), os.environ["OPENBLAS_NUM_THREADS"])
"""


def _run(env: dict[str, str]) -> list[str]:
    done = subprocess.run([sys.executable, "-c", _COUNT_THREADS], env=env, capture_output=True, text=True, check=True)
    return done.stdout.split()


def test_the_cli_process_loads_numpy_with_one_thread_and_keeps_a_users_setting() -> None:
    env = {key: value for key, value in os.environ.items() if key != "OPENBLAS_NUM_THREADS"}
    assert _run(env) == ["1", "1"]
    # A user's setting wins: numpy then starts its OpenBLAS threads (the process has more than one).
    threads, setting = _run({**env, "OPENBLAS_NUM_THREADS": "2"})
    assert setting == "2" and int(threads) > 1
