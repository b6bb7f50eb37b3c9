"""What a Spark-running command holds for its lifetime: the log and one lean Spark session.

Every Spark entry point (``feeds run``, ``load``, ``run``, ``reprocess``, ``verify --load``,
Dagster's runs) opens its session with :func:`open_session`, so all of them run where
``spark:`` in ``headwater.yaml`` says (:mod:`spark_log.cluster` checks a cluster first).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Final

from core import stop_request
from core.config import ProjectConfig
from core.errors import HeadwaterError, PermanentError, TransientError, traceback_error_line
from log.base import Log
from log.factory import open_log
from spark_log.cluster import check_before_session, cluster_ready, is_loopback
from spark_log.errors import is_schema_changed
from spark_log.session import spark_session, stop_spark
from spark_log.task_errors import unwrap

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.query import StreamingQuery


@contextmanager
def spark_job(config: ProjectConfig, app_name: str) -> Iterator[tuple[SparkSession, Log]]:
    """Open the project's log and a Spark session; close both (and the JVM) on exit."""
    log = open_log(config)
    spark_log = spark_log_path(config)
    start = spark_log.stat().st_size if spark_log.exists() else 0
    try:
        spark = open_session(config, app_name)
    except BaseException:
        log.close()
        raise
    try:
        yield spark, log
    except HeadwaterError:
        raise
    except Exception as exc:
        # A Headwater error raised inside Spark (an executor, the source's planner, a micro-batch)
        # reaches here as Spark's text: rebuilt whole, the CLI prints its own line.
        carried = unwrap(exc)
        if carried is not None:
            raise carried from exc
        if _out_of_memory(spark_log, start):
            raise SparkOutOfMemoryError(_out_of_memory_message(config, spark_log)) from exc
        # Spark's exceptions need the JVM to render their text, and it stops below: take it now.
        text = _exception_text(exc)
        if WORKER_NOT_CONNECTED in text:
            raise PythonWorkerStartError(_worker_start_message(spark_log)) from exc
        raise SparkJobError(_spark_failure(text, spark_log)) from exc
    finally:
        log.close()
        stop_spark(spark)


def _out_of_memory(spark_log: Path, start: int) -> bool:
    """Whether the driver JVM reported running out of heap in ``spark_log`` past byte ``start`` (this job's part)."""
    try:
        with spark_log.open("rb") as file:
            file.seek(start)
            # The heap (java.lang.OutOfMemoryError) or Arrow's direct buffers (OutOfMemoryException).
            return any(b"OutOfMemoryError" in line or b"OutOfMemoryException" in line for line in file)
    except OSError:
        return False


def _out_of_memory_message(config: ProjectConfig, spark_log: Path) -> str:
    memory = config.spark.driver_memory
    return (
        f"Spark's driver ran out of memory (spark.driver_memory {memory}); give it more in "
        f"headwater.yaml (spark: driver_memory: 2g) and run the command again (an unfinished micro-batch is "
        f"redone, once); details in {spark_log}"
    )


def spark_log_path(config: ProjectConfig) -> Path:
    """Where the driver JVM's own output goes (``<home>/logs/spark.log``)."""
    return config.home_dir / "logs" / "spark.log"


def open_session(config: ProjectConfig, app_name: str) -> SparkSession:
    """The project's Spark session, on ``spark.master`` with ``spark.conf``; ready to run jobs.

    On a cluster the master must answer, an executor must register and the checkpoint
    directory must be shared (:mod:`spark_log.cluster`), each failing in one line. The
    driver JVM's output goes to :func:`spark_log_path`. Stop it with :func:`stop_spark`.
    """
    check_before_session(config)
    settings = config.spark
    spark_log = spark_log_path(config)
    in_main = threading.current_thread() is threading.main_thread()
    # pyspark replaces SIGINT's handler with one that calls the JVM from inside the handler: landing
    # while the main thread waits in a py4j call, it reads that call's socket reentrantly (py4j then
    # logs tracebacks). The handler in place before (Python's, or core.stop_request's) is put back.
    before = signal.getsignal(signal.SIGINT) if in_main else None
    try:
        with _jvm_stderr_to(spark_log):
            spark = spark_session(
                app_name,
                local_dir=config.home_dir / "spark",
                extra_conf=settings.session_conf(),
                master=settings.master,
                driver_memory=settings.driver_memory,
                loopback=is_loopback(settings.master),
            )
    except Exception as exc:  # a JVM that would not start, a setting Spark refuses
        raise SparkJobError(_spark_failure(_exception_text(exc), spark_log)) from exc
    finally:
        if before is not None:
            signal.signal(signal.SIGINT, before)
    _pyspark_loggers_to(spark_log)
    try:
        cluster_ready(spark, config)
    except BaseException:
        stop_spark(spark)
        raise
    return spark


class SparkJobError(PermanentError):
    """A Spark job failed for a reason no Headwater check caught first (the text is Spark's)."""


class SparkOutOfMemoryError(SparkJobError):
    """The driver JVM ran out of heap and exited (``-XX:+ExitOnOutOfMemoryError``, :mod:`spark_log.session`)."""


#: Spark's text when a Python worker it started did not connect back within its fixed 10 s
#: (``PythonWorkerFactory.createSimpleWorker``; not configurable). The ``headwater_log`` source's
#: planner and streaming runner are such workers: on a machine busy enough that a Python
#: interpreter takes 10 s to start and import pyspark (0.5 s when quiet), the query fails with it.
WORKER_NOT_CONNECTED: Final = "Python worker failed to connect back"


class PythonWorkerStartError(TransientError):
    """A Spark Python worker did not start in time: the machine was overloaded; running again may work.

    Transient, so ``headwater run`` restarts the stage (after its backoff) instead of leaving it
    stopped for an operator; the micro-batch it was in is redone from its checkpoint.
    """


def _worker_start_message(spark_log: Path) -> str:
    return (
        "a Spark Python worker did not start within Spark's 10 s (the machine is overloaded: see its load and "
        f"memory); run the command again (headwater run restarts it by itself); details in {spark_log}"
    )


def _exception_text(exc: Exception) -> str:
    try:
        return str(exc) or type(exc).__name__
    except Exception:  # a py4j error whose JVM is already gone
        return type(exc).__name__


def _spark_failure(text: str, spark_log: Path) -> str:
    # Spark appends the JVM stack and the query plan after the first line; the log file has them.
    lines = [line for line in text.splitlines() if line.strip()]
    first = lines[0].strip() if lines else text
    first = traceback_error_line(text) or first
    return f"the Spark job failed: {first[:500]}; details in {spark_log}, rerun with --debug for the traceback"


def _pyspark_loggers_to(path: Path) -> None:
    """Send the JSON line pyspark logs on stderr for each SQL error to the log file instead.

    Also keeps py4j's traceback for a stop (SIGINT/SIGTERM raised as KeyboardInterrupt while a
    py4j call waits: ``KeyboardInterrupt while sending command.``) off the terminal: a stop is
    not an error, and the CLI's output stays one line per event.
    """
    from pyspark.logger import PySparkLogger

    for name in ("SQLQueryContextLogger", "DataFrameQueryContextLogger"):
        PySparkLogger.getLogger(name).handlers = [logging.FileHandler(path)]
    root = logging.getLogger()
    if not any(isinstance(f, _Py4jCallNotes) for f in root.filters):
        root.addFilter(_Py4jCallNotes())


class _Py4jCallNotes(logging.Filter):
    """Drops what py4j logs on the root logger about one JVM call, with its traceback.

    A KeyboardInterrupt during a call (a stop, not an error), and "Exception while sending
    command." for each call after the JVM is gone (it exited out of heap): the command reports
    the failure itself, in one line.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        from_py4j = record.name == "root" and f"{os.sep}py4j{os.sep}" in record.pathname
        return not (from_py4j or (record.exc_info and record.exc_info[0] is KeyboardInterrupt))


@contextmanager
def _jvm_stderr_to(path: Path) -> Iterator[None]:
    """Point fd 2 at ``path`` while the JVM starts: it (and the Python workers it forks) keep it.

    Spark's start-up notes and log4j warnings then land in the project's log file, and the
    terminal keeps the CLI's contract: errors are one line.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    saved = os.dup(2)
    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(target, 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(target)


#: Starts the ``index``-th query of a :func:`follow` again (after it stopped for a schema change).
Restart = Callable[[int], "StreamingQuery"]


def follow(
    spark: SparkSession, queries: Sequence[StreamingQuery], *, poll_s: float = 0.5, restart: Restart | None = None
) -> None:
    """Wait while the streaming ``queries`` run; SIGINT / SIGTERM stop them (an unfinished micro-batch is redone).

    Returns when a query ends (raising its error if it failed). A query that stopped because
    a topic it reads got a new schema version (:class:`spark_log.errors.SchemaChangedError`)
    is started again with ``restart`` when given. While waiting, SIGINT only
    sets a flag: pyspark's own handler calls the JVM from inside the signal handler, which,
    landing while this thread waits in a py4j call, reads the same socket reentrantly (py4j
    then logs a traceback per call, seen when ``run --follow`` stopped its stages).
    """
    running = list(queries)
    if threading.current_thread() is not threading.main_thread():  # signal handlers are the main thread's
        try:
            while True:
                try:
                    spark.streams.awaitAnyTermination()
                except KeyboardInterrupt:
                    raise
                except Exception:
                    if _restarted(spark, running, restart):
                        continue
                    raise
                return
        except KeyboardInterrupt:
            _stop(running)
        return
    stop = stop_request.SignalSafeEvent()
    previous = {number: signal.signal(number, lambda _signum, _frame: stop.set()) for number in stop_request.SIGNALS}
    if stop_request.requested.is_set():  # asked while the queries started
        stop.set()
    try:
        while not stop.wait(poll_s):
            if not all(query.isActive for query in running) and not _restarted(spark, running, restart):
                spark.streams.awaitAnyTermination()  # returns at once; raises a failed query's error
                return
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
    _stop(running)


def _restarted(spark: SparkSession, running: list[StreamingQuery], restart: Restart | None) -> bool:
    """Start again every query that stopped for a schema change; False when another one ended."""
    ended = [i for i, query in enumerate(running) if not query.isActive]
    if restart is None or not ended or not all(is_schema_changed(running[i].exception()) for i in ended):
        return False
    spark.streams.resetTerminated()
    for i in ended:
        logging.getLogger(__name__).info("%s: %s", running[i].name, "schema changed; starting it again")
        running[i] = restart(i)
        # One DDL transaction stops every query reading its tables at once: started together, their
        # sources' Python processes miss Spark's 10 s (CI: 29 loads, "Python worker failed to connect back").
        wait_for_sources(running[i])
    return True


def _stop(queries: Sequence[StreamingQuery]) -> None:
    for query in queries:
        query.stop()


#: What a streaming query reports until its sources exist (Spark's StreamExecution): the first
#: before its thread runs, the second while it creates the sources (a Python source's runner
#: process starts and connects back inside that step).
_INITIALIZING: Final = frozenset({"Initializing StreamExecution", "Initializing sources"})


def wait_for_sources(query: StreamingQuery, timeout_s: float = 300.0, poll_s: float = 0.1) -> None:
    """Return once ``query`` has created its sources (or ended, or ``timeout_s`` passed).

    A query over the ``headwater_log`` source starts a Python process that must connect back
    to the JVM within 10 s, a limit Spark hard-codes. Started together on two cores, a dozen
    such processes miss it ("Python worker failed to connect back"); starting each query
    only after the one before has its source keeps one start-up at a time.
    """
    deadline = time.monotonic() + timeout_s
    while query.isActive and time.monotonic() < deadline:
        if query.status.get("message") not in _INITIALIZING or query.lastProgress is not None:
            return
        time.sleep(poll_s)
