"""The whole pipeline into Iceberg tables, with the loader SIGKILLed under load: exact, local and on S3 (moto).

A writer changes ``items`` (composite key, TOASTed text, arrays, JSON, an enum; inserts,
updates, key changes, deletes) while ``headwater run --follow`` captures and loads into
Iceberg (``warehouse.format: iceberg``, embedded SQLite catalog); the loader stage (``load
--follow``, a child of the supervisor, with its Spark JVM) is SIGKILLed at seeded moments
and restarted by the supervisor. Then ``headwater run --until-caught-up`` and: the SCD1
table and the SCD2 table's current rows equal the source by a checksum over every column,
read by Headwater's query and by DuckDB's own iceberg extension (another process, another
DuckDB, no pyiceberg) from the table's metadata file.
"""

from __future__ import annotations

import hashlib
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from harness.fault_injection import CliProcess
from harness.items_workload import COLUMNS, SCHEMA, Workload, canonical, source_rows

from core.config import load_config
from warehouse_loader.query import query_warehouse

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]

SEED = int(os.environ.get("HEADWATER_FAULT_SEED", "20261202"))
LOADER_KILLS = 3
#: Seconds between the loader's (re)start being seen and its kill (its Spark start takes 10-30 s).
KILL_GAP_S = (12.0, 30.0)


def checksum(rows: list[str]) -> str:
    return hashlib.sha256("\n".join(sorted(rows)).encode()).hexdigest()


def stage_pid(config_path: Path, stage: str) -> int | None:
    """The pid of the supervisor's ``<stage> --follow`` child for this project (None: not running)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if stage.encode() in args and b"--follow" in args and str(config_path).encode() in args and b"run" not in args:
            return int(entry.name)
    return None


class Writer(threading.Thread):
    """Random transactions on ``items`` until stopped."""

    def __init__(self, pg_database: Any, seed: int) -> None:
        super().__init__(name="iceberg-writer", daemon=True)
        self.conn = pg_database.connect()
        self.items = Workload(self.conn, seed)
        self.stopping = threading.Event()
        self.error: BaseException | None = None
        self.transactions = 0

    def run(self) -> None:
        try:
            while not self.stopping.is_set():
                self.items.transactions(1)
                self.transactions += 1
                time.sleep(0.05)
        except BaseException as exc:  # reported by stop()
            self.error = exc

    def stop(self) -> None:
        self.stopping.set()
        if self.ident is not None:
            self.join(timeout=60)
        self.conn.close()
        if self.error is not None:
            raise self.error


def write_config(tmp_path: Path, name: str, dsn: str, warehouse: dict[str, Any]) -> Path:
    topic = f"{name}.public.items"
    path = tmp_path / "headwater.yaml"
    document = {
        "project": "iceberg_faults",
        "home": str(tmp_path / "home"),
        "log": {"partitions": 3, "file": {"fsync": "never"}},
        "sources": {name: {"dsn": dsn, "tables": ["public.items"], "heartbeat_interval_s": 1}},
        "warehouse": {
            "format": "iceberg",
            **warehouse,
            "tables": {"items": {"from": topic, "mode": "scd1"}, "items_hist": {"from": topic, "mode": "scd2"}},
        },
    }
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def headwater(config_path: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "headwater", *args, "--config", str(config_path)],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.parametrize("where", ["local", "s3"])
def test_loader_sigkills_leave_iceberg_tables_equal_to_the_source(
    where: str, pg_database: Any, unique_name: Any, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    warehouse: dict[str, Any] = {}
    storage: dict[str, str] | None = None
    if where == "s3":
        from harness.broker import MotoS3
        from harness.moto import create_bucket, moto_unavailable, warehouse_options

        missing = moto_unavailable()
        if missing:
            pytest.skip(missing)
        moto = MotoS3().start()
        request.addfinalizer(moto.stop)
        create_bucket(moto, "icepipe")
        storage = warehouse_options(moto)
        warehouse = {"path": "s3://icepipe/wh", "storage_options": storage}
    name = unique_name("ice")
    with pg_database.connect() as conn:
        conn.execute(SCHEMA)
    writer = Writer(pg_database, SEED)
    with writer.conn.transaction():
        for _ in range(60):
            writer.items.insert(writer.items.new_key())
    pg_database.execute(f"CREATE PUBLICATION headwater_{name} FOR TABLE items")
    config_path = write_config(tmp_path, name, pg_database.dsn, warehouse)

    rng = random.Random(f"{SEED}:load")
    logs = tmp_path / "logs"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    run = CliProcess(
        "run", [sys.executable, "-m", "headwater", "run", "--follow", "--config", str(config_path)], logs, env
    )
    kills = 0
    try:
        run.start()
        writer.start()
        deadline = time.monotonic() + 420
        while kills < LOADER_KILLS and time.monotonic() < deadline:
            pid = stage_pid(config_path, "load")
            if pid is None:
                time.sleep(0.5)
                continue
            time.sleep(rng.uniform(*KILL_GAP_S))
            if stage_pid(config_path, "load") != pid:
                continue  # it died by itself meanwhile: the supervisor's business, not a kill of ours
            os.killpg(pid, signal.SIGKILL)  # the stage's own session: its Spark JVM dies with it
            kills += 1
        assert run.exit_code() is None, f"run --follow exited:\n{run.tail(3000)}"
    finally:
        writer.stop()
        run.kill()
    assert kills == LOADER_KILLS, f"seed={SEED}: only {kills} loader kills within the time\n{run.tail(3000)}"
    final = headwater(config_path, "run", "--until-caught-up")
    assert final.returncode == 0, f"seed={SEED}: final run failed: {final.stderr[-3000:]}"

    config = load_config(config_path)
    expected = source_rows(pg_database)
    current = [
        canonical(tuple(r.values())) for r in query_warehouse(config, f"SELECT {COLUMNS} FROM items").to_pylist()
    ]
    history = [
        canonical(tuple(r.values()))
        for r in query_warehouse(config, f'SELECT {COLUMNS} FROM items_hist WHERE "__END_AT" IS NULL').to_pylist()
    ]
    assert len(expected) > 60 and writer.transactions > 50
    assert checksum(current) == checksum(expected), f"seed={SEED}: items differs from the source"
    assert checksum(history) == checksum(expected), f"seed={SEED}: items_hist's current rows differ from the source"

    # The same rows through a reader that shares nothing with Headwater or pyiceberg.
    from harness.iceberg_reader import read_iceberg

    from warehouse_loader.formats import format_of
    from warehouse_loader.load_job import table_path

    stored = format_of(config, "items").open(table_path(config, "items"))
    assert stored is not None
    independent = read_iceberg(stored.table.metadata_location, storage)  # type: ignore[attr-defined]
    columns = [c.strip().strip('"') for c in COLUMNS.split(",")]
    other = [canonical(tuple(r[c] for c in columns)) for r in independent.to_pylist()]
    assert checksum(other) == checksum(expected), f"seed={SEED}: DuckDB's iceberg reader sees other rows"
    print(f"\n{where}: loader kills={kills} transactions={writer.transactions} rows={len(expected)} checksums equal")
