"""The lean Spark session every Headwater Spark job and test runs on (``local[2]`` unless told otherwise).

The master comes from ``spark.master`` (:func:`spark_log.job.open_session` passes the
project's ``spark:`` section): in local mode, or with a master on this host, the driver
binds to loopback only; with a remote master it binds where Spark's defaults say (set
``spark.driver.host`` in ``spark.conf`` when the executors must use another address).

Start-up is dominated by the JVM loading Spark's classes, so the session uses a
Java class-data-sharing (CDS) archive: the first start in a fresh environment
records the loaded classes (``-XX:ArchiveClassesAtExit``) and later starts map
them (``-XX:SharedArchiveFile``), roughly halving JVM start-up. The archive lives
in ``$HEADWATER_CACHE_DIR`` (default ``~/.cache/headwater``), keyed by the pyspark
version and the Java binary. An unusable archive (corrupt, another JDK) only makes
the JVM skip sharing, never fail (a truncated one would crash it, which is why a
recording is adopted only after its JVM exited cleanly); delete the file to have it
recorded again.

Python workers import the installed, byte-compiled pyspark instead of the zipped copy
Spark puts first on their path (:func:`spark_home`): a worker starts with ~0.2 CPU s
instead of ~0.7, which matters because Spark gives a starting worker 10 s (hard-coded)
to connect back, and two cores under load are slow to give it 0.7 s.

With a local master, Hadoop's ``file:`` paths go through :mod:`spark_log.nio_filesystem`'s
local file system (a jar built once, put first on the driver's class path, with a CDS archive of
its own): it sets the permission of each file it creates without a ``chmod`` child process.

``$HEADWATER_SPARK_JAVA_OPTIONS`` adds JVM options to the driver of every session this
process (and any child) starts, before the project's own ``spark.driver.extraJavaOptions``.
For short jobs on few cores, ``-XX:TieredStopAtLevel=1 -XX:+UseSerialGC`` (no C2 compiler
threads, one GC thread) cuts a job's CPU by about a third; the test suite sets it, a
long-running pipeline should not (C2 code is faster once warm).
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import re
import shutil
import subprocess
import sys
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.process_lifetime import process_alive
from spark_log import jvm_lifetime
from spark_log.nio_filesystem import FILE_SYSTEM_CLASS, FS_IMPL_KEY, nio_filesystem_jar

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["cds_archive_path", "spark_home", "spark_session", "stop_spark"]

_RECORDING_SUFFIX = ".recording"
JAVA_OPTIONS_VARIABLE = "HEADWATER_SPARK_JAVA_OPTIONS"
# VerifySharedSpaces checks each region's CRC before mapping it: without it a corrupted
# archive crashes the JVM (SIGSEGV) instead of just disabling sharing. The CRC costs
# little next to Spark's start. Logs are off because an unusable archive is a slower
# start, not a failure, and the notes would litter job output.
_CDS_FLAGS = "-XX:+VerifySharedSpaces -Xlog:cds=off -Xlog:cds+dynamic=off"
_CLASS_PATH_KEY = "spark.driver.extraClassPath"
_CHECKPOINT_FILE_MANAGER = "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"


def _cache_dir() -> Path:
    configured = os.environ.get("HEADWATER_CACHE_DIR")
    if configured:
        return Path(configured)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "headwater"


def spark_home() -> Path:
    """``SPARK_HOME`` for Headwater's JVMs: the pyspark package, less its zipped Python copies.

    Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` (and py4j's zip) first on every Python
    worker's path; modules imported from a zip are compiled at every start. This directory
    links everything else of the package (``bin``, ``jars``, ``conf`` ...), so workers import
    pyspark and py4j from site-packages, where they are already compiled (the same version).
    Built once per pyspark install, atomically (another process may build it meanwhile).
    """
    import pyspark

    package = Path(pyspark.__file__).resolve().parent
    digest = hashlib.sha256(str(package).encode()).hexdigest()[:10]
    view = _cache_dir() / f"spark-home-{pyspark.__version__}-{digest}"
    if view.is_dir():
        return view
    view.parent.mkdir(parents=True, exist_ok=True)
    building = view.with_name(f"{view.name}.{os.getpid()}.tmp")
    shutil.rmtree(building, ignore_errors=True)
    building.mkdir()
    for entry in package.iterdir():
        if entry.name != "python":
            (building / entry.name).symlink_to(entry)
    try:
        building.rename(view)
    except OSError:  # built by another process first
        shutil.rmtree(building, ignore_errors=True)
    return view


def _java_binary() -> Path | None:
    java_home = os.environ.get("JAVA_HOME")
    found = Path(java_home) / "bin" / "java" if java_home else None
    if found is None or not found.exists():
        which = shutil.which("java")
        found = Path(which) if which else None
    return found.resolve() if found is not None else None


def cds_archive_path(class_path: str = "") -> Path:
    """Where this environment's CDS archive for a driver with ``class_path`` in front lives (it need not exist yet).

    An archive holds the class path it was recorded with, and a JVM on another one does not use it.
    """
    import pyspark

    java = _java_binary()
    identity = f"{java}:{java.stat().st_mtime_ns}" if java is not None else "no-java"
    if class_path:
        identity += f":{class_path}"
    digest = hashlib.sha256(identity.encode()).hexdigest()[:10]
    return _cache_dir() / f"spark-cds-{pyspark.__version__}-{digest}.jsa"


def _drop_abandoned_recordings(archive: Path) -> None:
    """Delete recordings whose process is gone: they were never confirmed complete."""
    for recording in archive.parent.glob(f"{archive.name}.*{_RECORDING_SUFFIX}"):
        pid_text = recording.name.removeprefix(f"{archive.name}.").removesuffix(_RECORDING_SUFFIX)
        if not (pid_text.isdigit() and process_alive(int(pid_text))):
            recording.unlink(missing_ok=True)


#: The archive a JVM of this process records (None: none does).
_recording_to: Path | None = None


def _cds_java_options(class_path: str) -> str:
    """``-XX`` options to use the CDS archive, or to record it when it does not exist yet."""
    global _recording_to  # noqa: PLW0603
    archive = cds_archive_path(class_path)
    try:
        archive.parent.mkdir(parents=True, exist_ok=True)
        _drop_abandoned_recordings(archive)
    except OSError:
        return ""  # no writable cache: start without sharing rather than fail
    if archive.exists():
        return f"-XX:SharedArchiveFile={archive} {_CDS_FLAGS}"
    # Recorded under a per-process name and promoted only after the JVM exited cleanly
    # (stop_spark, or at interpreter exit), so no start ever maps a half-written archive.
    recording = archive.with_name(f"{archive.name}.{os.getpid()}{_RECORDING_SUFFIX}")
    _recording_to = archive
    atexit.register(_finish_recording)
    return f"-XX:ArchiveClassesAtExit={recording} {_CDS_FLAGS}"


def _local_filesystem_class_path(master: str) -> str:
    """The jar of :mod:`spark_log.nio_filesystem` for a local master ("": none built, or executors elsewhere).

    Executors in JVMs of their own (a cluster, ``local-cluster``) would need the jar too: their sessions
    keep Hadoop's class.
    """
    if not re.fullmatch(r"local(\[[^\]]*\])?", master):
        return ""
    jar = nio_filesystem_jar(_java_binary(), _cache_dir())
    return "" if jar is None else str(jar)


def spark_session(
    app_name: str = "headwater",
    *,
    local_dir: Path | None = None,
    extra_conf: Mapping[str, str] | None = None,
    master: str = "local[2]",
    driver_memory: str = "1g",
    loopback: bool = True,
) -> SparkSession:
    """Return a lean session on ``master`` (no UI, 2 shuffle partitions, UTC, Arrow).

    ``local_dir`` holds the driver's scratch files and the default warehouse; ``extra_conf``
    overrides any setting, ``spark.driver.extraJavaOptions`` included (appended to the
    CDS options and ``$HEADWATER_SPARK_JAVA_OPTIONS``). ``loopback``: the driver and every
    executor are on this host, so the driver listens on 127.0.0.1 only. If a session already runs in this process it is
    returned as is: JVM-level settings cannot change without :func:`stop_spark`.
    """
    from pyspark.sql import SparkSession

    jvm_lifetime.install()  # the JVM dies with this process, even a SIGKILLed one
    # The JVM reads these at launch; Python workers (executors' too) run this interpreter: the
    # same path must hold the same environment on every worker host.
    if loopback:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    # Python workers import numpy, whose OpenBLAS threads spin ~0.1 CPU s each at start; Spark's
    # workers never use them (executors on other hosts get the same through spark.executorEnv).
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    with contextlib.suppress(OSError):  # no writable cache: Spark's own home (slower worker starts)
        os.environ.setdefault("SPARK_HOME", str(spark_home()))

    conf: dict[str, str] = {
        "spark.master": master,
        "spark.app.name": app_name,
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.memory": driver_memory,
        "spark.sql.shuffle.partitions": "2",
        "spark.default.parallelism": "2",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.execution.arrow.pyspark.fallback.enabled": "false",
        "spark.python.worker.reuse": "true",
        # Python workers connect back over a Unix socket at a fresh path, not a loopback port:
        # under load a worker another JVM gave up on (10 s) could otherwise reach this JVM on
        # a reused port and fail its start with "Authentication failed" (seen in CI).
        "spark.python.unix.domain.socket.enabled": "true",
        # Micro-batches persisted by feeds are small and short-lived; CPU is the scarce resource.
        "spark.sql.inMemoryColumnarStorage.compressed": "false",
        # Streaming checkpoints (always local paths here) through Hadoop's FileSystem, not its
        # FileContext: without Hadoop's native library, FileContext's rename runs `readlink` as a
        # child process twice for every file it renames, so each micro-batch's offset and commit
        # entries cost ~18 process spawns in the driver (JFR's jdk.ProcessStart). The leases of
        # operations.holders keep a second writer off a checkpoint, which is all FileContext's
        # atomic rename added.
        "spark.sql.streaming.checkpointFileManagerClass": _CHECKPOINT_FILE_MANAGER,
        "spark.executorEnv.OPENBLAS_NUM_THREADS": os.environ["OPENBLAS_NUM_THREADS"],
    }
    if loopback:
        conf["spark.driver.host"] = conf["spark.driver.bindAddress"] = "127.0.0.1"
    if local_dir is not None:
        local_dir.mkdir(parents=True, exist_ok=True)
        conf["spark.local.dir"] = str(local_dir / "tmp")
        conf["spark.sql.warehouse.dir"] = str(local_dir / "warehouse")
    extra = dict(extra_conf or {})
    local_filesystem = _local_filesystem_class_path(master)
    if local_filesystem:
        conf[FS_IMPL_KEY] = FILE_SYSTEM_CLASS
    class_path = os.pathsep.join(filter(None, [local_filesystem, extra.pop(_CLASS_PATH_KEY, "")]))
    if class_path:
        conf[_CLASS_PATH_KEY] = class_path
    java_options = " ".join(
        filter(
            None,
            [
                # A JVM out of heap exits: left running, Spark's task-result threads die and the job
                # waits forever (seen: a feed's micro-batch too large for a 1 GB driver hung the CLI).
                # Its last words ("Terminating due to java.lang.OutOfMemoryError") go to stderr, which
                # is the project's spark.log (spark_log.job), where the CLI finds them: not stdout.
                "-XX:+ExitOnOutOfMemoryError -XX:+DisplayVMOutputToStderr",
                _cds_java_options(class_path),
                os.environ.get(JAVA_OPTIONS_VARIABLE, "").strip(),
                extra.pop("spark.driver.extraJavaOptions", ""),
            ],
        )
    )
    if java_options:
        conf["spark.driver.extraJavaOptions"] = java_options
    conf.update(extra)

    builder: Any = SparkSession.builder
    for key, value in conf.items():
        builder = builder.config(key, value)
    session: SparkSession = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    server = getattr(session.sparkContext, "_accumulatorServer", None)
    if server is not None:
        quiet_accumulator_hangups(server)
    return session


def quiet_accumulator_hangups(server: Any) -> None:
    """No traceback when the JVM hangs up on pyspark's accumulator server.

    The JVM sends accumulator updates to a server in this process over one connection. When the
    JVM closes it first (stopping, or gone) the server's handler reads EOF, and socketserver
    prints the ``EOFError`` with its traceback on stderr, before pyspark marks the server as
    shutting down (seen when a stop came during a feed's first micro-batch). Every update the JVM
    sent was read before that EOF: nothing is lost, so it is not worth a traceback.

    A JVM that exits before reading the server's last acknowledgement byte resets the
    connection instead, and the next read raises ``ConnectionResetError`` (seen in CI: SIGTERM
    of ``run --follow`` at a load's first micro-batch); one that exits before the server writes
    that byte makes the write raise ``BrokenPipeError`` (seen in CI at the same moment). Each is
    the same hang-up, after the same updates were read: any ``ConnectionError`` is.
    """
    report = server.handle_error

    def handle_error(request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], (EOFError, ConnectionError)):
            report(request, client_address)

    server.handle_error = handle_error


def stop_spark(session: SparkSession) -> None:
    """Stop ``session`` and its JVM, keeping the CDS archive the JVM records at exit, if any.

    A JVM that already exited (out of heap: ``-XX:+ExitOnOutOfMemoryError``) cannot be asked to
    stop; the session is then only forgotten, so the error that ended the job is the one reported.
    """
    try:
        with warnings.catch_warnings():
            # pyspark warns "Unable to cleanly shutdown Spark JVM process" when the JVM is already
            # gone (a signal to the whole process group stopped it first, as Ctrl-C does): the
            # stop it was asked for has happened, which is not worth a warning on the terminal.
            warnings.filterwarnings("ignore", "Unable to cleanly shutdown Spark JVM", RuntimeWarning)
            session.stop()
    except Exception:
        if _jvm_alive():
            raise
        _forget_session()
    _stop_jvm()


def _jvm_alive(patience_s: float = 10.0) -> bool:
    """Whether the session's JVM still runs after up to ``patience_s`` (one that refused a call may be exiting)."""
    from pyspark import SparkContext

    proc = getattr(SparkContext._gateway, "proc", None)
    if proc is None:
        return False
    try:
        proc.wait(timeout=patience_s)
    except subprocess.TimeoutExpired:
        return True
    return False


def _forget_session() -> None:
    """Forget the session whose JVM is gone: what ``stop`` would have cleared in pyspark."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    context = SparkContext._active_spark_context
    server = getattr(context, "_accumulatorServer", None)
    if server is not None:
        with contextlib.suppress(Exception):
            server.shutdown()
    SparkContext._active_spark_context = None
    SparkSession._instantiatedSession = None
    SparkSession._activeSession = None


def _stop_jvm() -> None:
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    if gateway is None:
        return
    proc = getattr(gateway, "proc", None)
    with contextlib.suppress(Exception):
        gateway.shutdown()
    SparkContext._gateway = None
    SparkContext._jvm = None
    if proc is None:
        return
    # EOF on its stdin makes pyspark's gateway JVM call System.exit, which writes a pending
    # archive (about 10 s once); only a clean exit proves the archive complete.
    with contextlib.suppress(OSError):
        proc.stdin.close()
    try:
        clean = proc.wait(timeout=120) == 0
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        clean = False
    _promote_recording(clean=clean)


def _promote_recording(*, clean: bool) -> None:
    archive = _recording_to
    if archive is None:
        return
    recording = archive.with_name(f"{archive.name}.{os.getpid()}{_RECORDING_SUFFIX}")
    with contextlib.suppress(OSError):
        if clean and recording.exists() and recording.stat().st_size > 0 and not archive.exists():
            recording.replace(archive)
        else:
            recording.unlink(missing_ok=True)


def _finish_recording() -> None:
    """At interpreter exit: stop a JVM still recording, so its archive is complete before promotion."""
    with contextlib.suppress(Exception):
        _stop_jvm()
