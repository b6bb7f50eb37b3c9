"""Leases on the stages' resources: one process at a time runs a feed or loads a table.

Two Spark queries on one checkpoint fail deep inside Spark (``CONCURRENT_STREAM_LOG_UPDATE``)
and two loaders would race on the Delta table; the lease (:mod:`core.leases`) is taken
before Spark starts, so the second process waits (a ``--follow`` standby) or names the
holder in one line. Capture holds its sources' leases itself (:mod:`capture.runner`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Literal

from core.config import ProjectConfig
from core.leases import LeaseWait, acquire, lease


@contextmanager
def holding(
    config: ProjectConfig, kind: Literal["load", "feed"], names: Sequence[str], wait: LeaseWait
) -> Iterator[None]:
    """Hold the leases of ``names`` (warehouse tables or feeds) while the block runs."""
    leases = [lease(config.home_dir, kind, name) for name in sorted(set(names))]
    acquire(leases, wait)
    try:
        yield
    finally:
        for held in leases:
            held.release()
