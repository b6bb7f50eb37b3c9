"""The session's Spark: one lean local session, its JVM stopped at session end."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from typing import Any

from harness.processes import stop_at_exit
from harness.workers import service_dir


def start_spark() -> tuple[Any, Callable[[], None]]:
    """Start the shared test session; returns it and an idempotent stop (JVM and scratch dir).

    The stop also runs at interpreter exit or SIGTERM if nobody called it.
    """
    from spark_log.session import spark_session, stop_spark

    directory = service_dir("spark")
    session = spark_session("headwater-tests", local_dir=directory)

    def stop() -> None:
        try:
            stop_spark(session)  # also ends the JVM, so no java process outlives pytest
        finally:
            shutil.rmtree(directory, ignore_errors=True)

    return session, stop_at_exit(stop)
