"""The ``headwater`` CLI as a subprocess, for tests that drive it as an operator would."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_headwater(
    config: Path, *args: str, env: Mapping[str, str] | None = None, ok: bool = True, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """``headwater --config CONFIG ARGS...`` with no terminal on stdin; ``ok``: assert it exited 0."""
    result = subprocess.run(
        [sys.executable, "-m", "headwater", "--config", str(config), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        check=False,
    )
    if ok:
        assert result.returncode == 0, result.stderr[-3000:]
    return result
