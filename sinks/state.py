"""What a running sink says about itself, for ``headwater status`` and ``/metrics``: running or blocked.

``<home>/sinks/<name>.json`` (replaced whole, :mod:`core.durable_files`), written by the
process running the sink when its state changes: ``{"sink", "state", "since", "error", "pid",
"host", "delivered", "dead_lettered"}``. ``state`` is ``running``, ``blocked`` (the target is
down: retrying, ``error`` says why), ``stopped`` or ``failed``. A file whose process is gone
(SIGKILL) reads as ``not running``.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import orjson

from core.config import ProjectConfig
from core.durable_files import replace_json
from core.process_lifetime import process_alive

RUNNING = "running"
BLOCKED = "blocked"
STOPPED = "stopped"
FAILED = "failed"
NOT_RUNNING = "not running"


@dataclass
class SinkState:
    """One sink's state as its process last wrote it."""

    sink: str
    state: str
    since: float
    error: str | None = None
    pid: int = 0
    host: str = ""
    delivered: int = 0
    dead_lettered: int = 0


def state_path(config: ProjectConfig, sink: str) -> Path:
    """``<home>/sinks/<sink>.json``."""
    return config.home_dir / "sinks" / f"{sink}.json"


class StateFile:
    """Writes one sink's state when it changes (and the counters with it)."""

    def __init__(self, config: ProjectConfig, sink: str) -> None:
        self._path = state_path(config, sink)
        self._state = SinkState(sink, STOPPED, time.time(), pid=os.getpid(), host=socket.gethostname())
        self._lock = threading.Lock()

    def set(self, state: str, error: str | None = None, *, delivered: int, dead_lettered: int) -> None:
        """Record ``state`` (written only when it or the error changed, or the sink stops). Thread-safe."""
        with self._lock:
            self._write(state, error, delivered, dead_lettered)

    def _write(self, state: str, error: str | None, delivered: int, dead_lettered: int) -> None:
        current = self._state
        if current.state == state and current.error == error and state not in (STOPPED, FAILED):
            current.delivered, current.dead_lettered = delivered, dead_lettered
            return
        self._state = SinkState(
            current.sink, state, time.time(), error, current.pid, current.host, delivered, dead_lettered
        )
        self._path.parent.mkdir(parents=True, exist_ok=True)
        replace_json(self._path, asdict(self._state), indent=True)


def read_state(config: ProjectConfig, sink: str) -> dict[str, Any]:
    """The sink's last written state; ``not running`` when no process of it lives on this host."""
    try:
        data: dict[str, Any] = orjson.loads(state_path(config, sink).read_bytes())
    except FileNotFoundError:
        return {"sink": sink, "state": NOT_RUNNING}
    if data.get("state") in (RUNNING, BLOCKED) and not _alive(data.get("pid", 0), data.get("host", "")):
        data["state"] = NOT_RUNNING
    return data


def _alive(pid: int, host: str) -> bool:
    if host != socket.gethostname():
        return True  # another host's process: its word stands
    return process_alive(pid)
