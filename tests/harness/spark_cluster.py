"""A Spark standalone cluster (one master, N workers) started from pyspark's own ``bin/spark-class``.

The pip wheel ships ``bin/spark-class`` and the jars but not ``sbin/start-master.sh``;
``spark-class`` runs a small launcher JVM and then ``exec``s the daemon, so each Popen pid
is the daemon's JVM. Every daemon runs in its own process group (``killpg`` reaches a
worker's executors and their Python workers, which stay in its group) with
PR_SET_PDEATHSIG, so nothing outlives pytest even when pytest is SIGKILLed; start the
cluster from the thread that lives as long as it (the signal follows the forking thread).

Settings that matter (measured, see the README's "Running on a cluster"): no REST
submission server (it takes the fixed port 6066), ``SPARK_LOCAL_DIRS`` for executors'
scratch (``spark.local.dir`` of the driver is ignored on executors), an empty
``SPARK_CONF_DIR``, 256 MB daemons; readiness is each daemon's log line.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

from harness.processes import die_with_parent, stop_at_exit
from operations.embedded_postgres import free_port

HOST = "127.0.0.1"
_RUNNING_TASK = re.compile(r"Executor: Running task (\d+)\.\d+ in stage (\d+)\.\d+ \(TID (\d+)\)")
_FINISHED_TASK = re.compile(r"Executor: Finished task \S+ in stage \S+ \(TID (\d+)\)")


def spark_class() -> Path:
    """pyspark's ``bin/spark-class`` (the launcher of Spark's daemons)."""
    import pyspark

    return Path(pyspark.__file__).parent / "bin" / "spark-class"


def cluster_unavailable() -> str | None:
    """Why a standalone cluster cannot start here (a missing binary, named), or None."""
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        return "java is not installed (Spark's master and workers are JVMs): install Java 17"
    if not os.access(spark_class(), os.X_OK):
        return f"{spark_class()} is missing or not executable (pyspark's wheel ships it)"
    return None


class SparkCluster:
    """Master on ``127.0.0.1:<free port>``, ``workers`` workers of ``cores`` cores and ``memory`` each."""

    def __init__(self, base: Path, *, workers: int = 2, cores: int = 1, memory: str = "1g") -> None:
        self.base = base
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self.port = free_port(HOST)
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        (base / "conf").mkdir(parents=True, exist_ok=True)
        self.env = {
            **os.environ,
            "SPARK_LOCAL_IP": HOST,
            "SPARK_CONF_DIR": str(base / "conf"),  # empty: no spark-defaults.conf or log4j2 from elsewhere
            "SPARK_DAEMON_MEMORY": "256m",
            "SPARK_LOCAL_DIRS": str(base / "local"),
            "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",  # else a REST server on fixed port 6066
        }
        self.env.pop("SPARK_HOME", None)  # spark-class finds its own home
        stop_at_exit(self.stop)

    @property
    def url(self) -> str:
        """The master URL (``spark.master``)."""
        return f"spark://{HOST}:{self.port}"

    def log(self, name: str) -> Path:
        """The daemon's stdout+stderr."""
        return self.base / f"{name}.log"

    def work_dir(self, index: int) -> Path:
        """Worker ``index``'s directory (executors' cwd, stdout, stderr)."""
        return self.base / f"work{index}"

    def _spawn(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        with self.log(name).open("ab") as out:
            process = subprocess.Popen(
                [str(spark_class()), *args],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.base,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
        self.processes[name] = process
        return process

    def _wait_for(self, name: str, pattern: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        process = self.processes[name]
        while time.monotonic() < deadline:
            if process.poll() is not None:
                msg = f"{name} exited with {process.returncode}: {self.log(name).read_text(errors='replace')[-2000:]}"
                raise RuntimeError(msg)
            if pattern in self.log(name).read_text(errors="replace"):
                return
            time.sleep(0.1)
        msg = f"{name}: no {pattern!r} within {timeout_s} s: {self.log(name).read_text(errors='replace')[-2000:]}"
        raise RuntimeError(msg)

    def start(self, timeout_s: float = 120.0) -> SparkCluster:
        """Start the master, then every worker; return once all workers have registered."""
        master = "org.apache.spark.deploy.master.Master"
        self._spawn("master", master, "--host", HOST, "--port", str(self.port), "--webui-port", "0")
        self._wait_for("master", "I have been elected leader", timeout_s)
        for index in range(self.workers):
            self.start_worker(index, wait=False)
        for index in range(self.workers):
            self._wait_for(f"worker{index}", "Successfully registered with master", timeout_s)
        return self

    def start_worker(self, index: int, *, wait: bool = True, timeout_s: float = 120.0) -> None:
        """Start worker ``index`` (again, after :meth:`kill_worker`)."""
        worker = "org.apache.spark.deploy.worker.Worker"
        self.log(f"worker{index}").write_bytes(b"")
        self._spawn(
            f"worker{index}",
            *(worker, "--host", HOST, "--port", "0", "--webui-port", "0"),
            *("--cores", str(self.cores), "--memory", self.memory),
            *("--work-dir", str(self.work_dir(index)), self.url),
        )
        if wait:
            self._wait_for(f"worker{index}", "Successfully registered with master", timeout_s)

    def _task_lines(self, index: int) -> str:
        """What the executors of worker ``index``'s newest application logged."""
        apps = sorted(self.work_dir(index).glob("app-*"), key=lambda app: app.stat().st_mtime)
        logs = sorted(apps[-1].glob("*/stderr")) if apps else []
        return "".join(log.read_text(errors="replace") for log in logs)

    def running_task(self, index: int, *, min_stage: int = 0) -> tuple[int, int, int] | None:
        """``(stage, task index, TID)`` of a task (stage >= ``min_stage``) worker ``index`` runs now, or None."""
        text = self._task_lines(index)
        finished = {int(tid) for tid in _FINISHED_TASK.findall(text)}
        running = [
            (int(stage), int(task), int(tid))
            for task, stage, tid in _RUNNING_TASK.findall(text)
            if int(stage) >= min_stage and int(tid) not in finished
        ]
        return running[-1] if running else None

    def reran(self, index: int, stage: int, task: int) -> bool:
        """Whether worker ``index``'s executors ran a retry (attempt >= 1) of task ``task`` of ``stage``."""
        retry = re.compile(rf"Executor: Running task {task}\.[1-9]\d* in stage {stage}\.\d+ ")
        return retry.search(self._task_lines(index)) is not None

    def kill_worker(self, index: int) -> None:
        """SIGKILL worker ``index``'s whole process group: the worker, its executors, their Python workers."""
        process = self.processes.pop(f"worker{index}")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()

    def stop(self) -> None:
        """SIGTERM every daemon's group (workers first), SIGKILL after 10 s."""
        for name in sorted(self.processes, key=lambda n: n == "master"):
            process = self.processes.pop(name)
            if process.poll() is not None:
                continue
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
