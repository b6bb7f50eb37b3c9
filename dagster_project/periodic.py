"""Recording every 30 s while a ``--follow`` stage runs, in a thread; Dagster is not imported here.

The record itself (:meth:`headwater.stage_runtime.StageRuntime.record_assets`) imports Dagster
only when the project has its instance, so a ``--follow`` stage of a project nobody watches in
Dagster never loads it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator

logger = logging.getLogger(__name__)

#: How often a ``--follow`` stage records what changed.
FOLLOW_INTERVAL_S = 30.0


class PeriodicRecording:
    """Records at start, every ``interval_s`` (a daemon thread) and once more when stopped: for ``--follow`` stages.

    The first record (which pays for importing Dagster and opening its instance: 10-30 s on a
    busy machine) runs at start, beside the stage's own start, not when the stage is stopped. A
    stop waits at most ``stop_wait_s`` for a record in flight; if one still runs then, the last
    record is left to the next run, so a stop stays prompt (``run --follow`` kills a stage that
    takes 60 s).
    """

    def __init__(
        self, record: Callable[[], object], interval_s: float = FOLLOW_INTERVAL_S, stop_wait_s: float = 20.0
    ) -> None:
        self._record = record
        self._interval_s = interval_s
        self._stop_wait_s = stop_wait_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dagster-recording", daemon=True)

    def _run(self) -> None:
        self._record()
        while not self._stop.wait(self._interval_s):
            self._record()

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """Record periodically while the block runs, then once more (see the class docstring)."""
        self._thread.start()
        try:
            yield
        finally:
            self._stop.set()
            self._thread.join(timeout=self._stop_wait_s)
            if self._thread.is_alive():
                logger.warning("recording in Dagster still running at the stop; the next run records the last state")
            else:
                self._record()
