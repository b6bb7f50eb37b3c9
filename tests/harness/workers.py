"""Who this test process is under pytest-xdist, and where its services keep their state.

Under ``pytest -n N`` every worker is its own process with its own session fixtures, so
each worker starts its own Postgres, broker, Spark session, ... the first time one of its
tests asks (see tests/README.md). What keeps the workers apart:

* names: :data:`harness.names.RUN_ID` is drawn per process, so two workers never make the
  same slot, publication, database, role, topic or group name;
* ports: every server binds a port the kernel chose free (``free_port``), never a fixed one;
* state: :func:`service_dir` makes a fresh directory named after the worker.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def worker_id() -> str:
    """``gw0``, ``gw1``, ... under pytest-xdist; ``main`` in a session without workers."""
    return os.environ.get("PYTEST_XDIST_WORKER", "main")


def service_dir(kind: str) -> Path:
    """A fresh directory ``<tmp>/hw-<kind>-<worker>-<random>`` for one service's state (traversable by all).

    Not under pytest's basetemp: pytest resets ``/tmp/pytest-of-<user>`` to 0700 at each
    session (any developer's), and servers that run as ``nobody`` (Postgres) must reach it.
    The caller removes it when the service stops.
    """
    directory = Path(tempfile.mkdtemp(prefix=f"hw-{kind}-{worker_id()}-"))
    directory.chmod(0o755)
    return directory
