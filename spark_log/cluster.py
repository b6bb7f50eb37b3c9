"""Spark jobs on a cluster: what is checked before a session starts, and what executors must reach.

With ``spark.master`` not local, executors run in other processes (usually other hosts):

* they read the log themselves (:mod:`spark_log.data_source` opens it from the config
  file's path in each task): the Kafka backend's brokers must be reachable from them, and
  a file log must live on a filesystem every node mounts at the same path, which the
  config says with ``log.file.shared: true`` (otherwise :func:`check_before_session` refuses);
* they write the state of enriched feeds (RocksDB) under ``spark.checkpoint_path``, and the
  driver writes every query's offsets and commits there: it must be one directory the
  driver and every executor see (:func:`check_checkpoints_reachable` proves it with a file
  the driver writes and each executor must find);
* the driver commits Delta tables and feed appends itself (``foreachBatch``), so only the
  driver needs the warehouse's credentials.

Spark gives up on an unreachable standalone master only after 3 x 20 s (hard-coded), and
a job on a cluster without free workers waits forever; so the master's port is tried
first and a session waits a bounded time for its first executor.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
import uuid
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from core.config import ProjectConfig, loaded_config_name
from core.errors import ConfigError
from spark_log.errors import SparkClusterError, SparkMasterUnreachableError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: Seconds to wait for one TCP connection to the master.
CONNECT_TIMEOUT_S = 3.0
_LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")


def master_addresses(master: str) -> list[tuple[str, int]]:
    """``(host, port)`` of each master a ``spark://`` or ``k8s://`` URL names (none for local or yarn)."""
    if master.startswith("spark://"):
        out = []
        for part in master.removeprefix("spark://").split(","):
            host, _, port = part.rpartition(":")
            out.append((host.strip("[]"), int(port)))
        return out
    if master.startswith("k8s://"):
        api = master.removeprefix("k8s://")
        parts = urlsplit(api if "://" in api else f"https://{api}")
        if parts.hostname:
            return [(parts.hostname, parts.port or (80 if parts.scheme == "http" else 443))]
    return []


def is_loopback(master: str) -> bool:
    """True when the driver and every executor are on this host (local mode or a master on loopback)."""
    if master.startswith("local"):
        return True
    addresses = master_addresses(master)
    return bool(addresses) and all(host in _LOOPBACK for host, _ in addresses)


def check_before_session(config: ProjectConfig) -> None:
    """What is known to fail on a cluster, before a JVM starts: one line each, nothing written."""
    spark = config.spark
    if spark.is_local:
        return
    where = loaded_config_name()
    if config.log.backend == "file" and not config.log.file.shared:
        msg = (
            f"{where}: log.file.shared: the file log in {config.home_dir / 'log'} is on this host, but executors of "
            f"spark.master {spark.master} read it from theirs; put {config.home_dir} on a filesystem every Spark node "
            "mounts at the same path and set log.file.shared: true, or use log.backend: kafka"
        )
        raise ConfigError(msg, path=where, field="log.file.shared")
    if spark.master == "yarn" and not (os.environ.get("HADOOP_CONF_DIR") or os.environ.get("YARN_CONF_DIR")):
        msg = f"{where}: spark.master: yarn needs HADOOP_CONF_DIR or YARN_CONF_DIR set to the cluster's configuration"
        raise ConfigError(msg, path=where, field="spark.master")
    check_master_reachable(spark.master)


def check_master_reachable(master: str) -> None:
    """Connect to the master's port (any of an HA list); fail in seconds, not Spark's 71."""
    addresses = master_addresses(master)
    problems = []
    for host, port in addresses:
        try:
            with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S):
                return
        except OSError as exc:
            problems.append(f"{host}:{port}: {exc.strerror or exc}")
    if addresses:
        msg = (
            f"cannot reach the Spark master {master} ({'; '.join(problems)}); "
            "start it or fix spark.master in headwater.yaml"
        )
        raise SparkMasterUnreachableError(msg)


def cluster_ready(spark: SparkSession, config: ProjectConfig) -> None:
    """On a cluster: wait for the first executor, then prove the checkpoint directory is shared."""
    if config.spark.is_local:
        return
    wait_for_executors(spark, config.spark.master, config.spark.executor_timeout_s)
    check_checkpoints_reachable(spark, config.checkpoint_dir)


def wait_for_executors(spark: SparkSession, master: str, timeout_s: float) -> None:
    """Return once an executor has registered (skipped under dynamic allocation, which starts with none)."""
    context = spark.sparkContext
    if context.getConf().get("spark.dynamicAllocation.enabled", "false").lower() == "true":
        return
    deadline = time.monotonic() + timeout_s
    # The driver is one entry of the map; executors add theirs as they register.
    while context._jsc.sc().getExecutorMemoryStatus().size() <= 1:
        if time.monotonic() > deadline:
            msg = (
                f"no executor registered with {master} within {timeout_s:.0f} s: check that workers are running and "
                "have the cores and memory this application asks for (spark.executor.memory, spark.executor.cores, "
                "spark.cores.max in spark.conf)"
            )
            raise SparkClusterError(msg)
        time.sleep(0.1)


def check_checkpoints_reachable(spark: SparkSession, directory: Path) -> None:
    """Fail unless every executor that runs a probe task finds the file the driver wrote in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    probe = directory / f".reachable-{uuid.uuid4().hex}"
    probe.write_text(socket.gethostname())
    try:
        context = spark.sparkContext
        tasks = max(2, context.defaultParallelism)
        seen = context.parallelize(range(tasks), tasks).map(partial(_sees, str(probe))).collect()
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()
    blind = sorted({host for host, found in seen if not found})
    if blind:
        where = loaded_config_name()
        msg = (
            f"{where}: spark.checkpoint_path: executors on {', '.join(blind)} cannot see {directory} as the driver "
            "does (they write the state of enriched feeds there); put it on a filesystem every Spark node mounts "
            "at the same path"
        )
        raise ConfigError(msg, path=where, field="spark.checkpoint_path")


def _sees(probe: str, _task: int) -> tuple[str, bool]:
    """On an executor: this host, and whether it sees ``probe`` in a directory it may write to."""
    found = os.path.isfile(probe) and os.access(os.path.dirname(probe), os.W_OK)
    return socket.gethostname(), found
