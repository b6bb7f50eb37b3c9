"""Compaction and vacuum beside a loader under load, with SIGKILLs of both (issue 34).

``headwater run --follow`` captures a 40k-row table that a writer keeps updating, loads it
into an SCD1 table and its SCD2 twin (merge-on-read: the tables are past 1 MiB) and runs the
maintenance stage as eagerly as it can: a pass every second, compaction at 2 small files or 2 %
removed rows, a 15-second retention (the one-hour floor lowered through
``HEADWATER_RETENTION_FLOOR_S``). The maintenance stage, the load stage, and then both at once
are SIGKILLed at seeded moments (the supervisor restarts them; one kill of each kind: a repeat
of a kind cost a Spark restart and proved nothing the first did not; other moments come from
another ``HEADWATER_FAULT_SEED``). After each kill the writer pauses and
both tables must equal the source by checksum, as read by delta-rs's own query engine (a
reader Headwater did not write). Then:

* ``headwater verify`` compares the SCD1 table with the source while vacuum keeps running
  with no retention to spare: verify's reader lease puts expiry off (the stage logs it) and
  verify finds the table equal;
* every version committed inside the retention is still readable in full (its data files
  and deletion vector files are there): time travel is what vacuum must leave;
* maintenance did its work: compactions, vacuums that removed files, and deletion vector
  files collected.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest
import yaml
from deltalake import DeltaTable, QueryBuilder
from harness.process_tree import command_line, descendants, kill_all, wait_for
from harness.processes import stop_at_exit

from core.config import load_config
from core.table_leases import reading
from operations.maintain import last_runs
from warehouse_loader.delta.deletion_vectors import DV_DIR
from warehouse_loader.load_job import table_path

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

ROWS = 40_000
SEED = int(os.environ.get("HEADWATER_FAULT_SEED", "20261202"))


def foreign(path: Path, scd2: bool, version: int | None = None) -> list[tuple[int, int]]:
    """``(id, v)`` of the table (open versions for SCD2) as delta-rs's query engine reads it."""
    table = DeltaTable(str(path), version=version)
    where = 'WHERE "__END_AT" IS NULL' if scd2 else ""
    result = pa.table(QueryBuilder().register("t", table).execute(f"SELECT id, v FROM t {where}").read_all())
    return sorted(zip(result.column("id").to_pylist(), result.column("v").to_pylist(), strict=True))


def stage_pid(supervisor: int, words: str) -> int | None:
    """The pid of the supervisor's child whose command line has ``words`` (the stage, not its JVM)."""
    for pid in descendants(supervisor):
        line = command_line(pid)
        if "-m headwater" in line and words in line:
            return pid
    return None


def test_maintenance_and_loader_sigkilled_under_load_keep_tables_exact(pg_database, unique_name, tmp_path):
    name = unique_name("mnt")
    conn = pg_database.connect()
    conn.execute("CREATE TABLE t (id bigint PRIMARY KEY, v int NOT NULL, pad text NOT NULL)")
    conn.execute("INSERT INTO t SELECT g, 0, repeat(md5(g::text), 3) FROM generate_series(0, %s) g", (ROWS - 1,))
    conn.execute(f"CREATE PUBLICATION headwater_{name} FOR TABLE t")
    project = tmp_path / "project"
    project.mkdir()
    topic = f"{name}.public.t"
    (project / "headwater.yaml").write_text(
        yaml.safe_dump(
            {
                "project": "mnt",
                "log": {"partitions": 2, "file": {"fsync": "never"}},
                "sources": {name: {"dsn": pg_database.dsn, "tables": ["public.t"], "heartbeat_interval_s": 1}},
                "warehouse": {
                    "tables": {"t1": {"from": topic, "mode": "scd1"}, "t2": {"from": topic, "mode": "scd2"}},
                    "maintenance": {
                        "interval_s": 1,
                        "target_file_size": 1 << 20,
                        "compact_min_small_files": 2,
                        "compact_dirty_ratio": 0.02,
                        "retention_s": 15,
                    },
                },
            }
        )
    )
    config = load_config(project / "headwater.yaml")
    paths = {t: Path(str(table_path(config, t))) for t in ("t1", "t2")}
    log = tmp_path / "run.log"
    env = {**os.environ, "HEADWATER_RETENTION_FLOOR_S": "0"}
    headwater = [sys.executable, "-m", "headwater"]
    subprocess.run([*headwater, "capture", "--until-caught-up"], cwd=project, env=env, check=True, capture_output=True)
    with log.open("ab") as out:
        run = subprocess.Popen(
            [*headwater, "run", "--follow"], cwd=project, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    stop_at_exit(lambda: (kill_all(descendants(run.pid) | {run.pid}), run.wait()))
    rng = random.Random(SEED)

    def source() -> list[tuple[int, int]]:
        return sorted(conn.execute("SELECT id, v FROM t").fetchall())

    def equal() -> bool:
        expected = source()
        try:
            return all(foreign(paths[t], t == "t2") == expected for t in paths)
        except Exception:
            return False

    try:
        wait_for(equal, 600, "both tables loaded", log)
        pause = threading.Event()
        finished = threading.Event()
        writer_conn = pg_database.connect()

        def writer() -> None:
            local = random.Random(SEED + 1)
            while not finished.is_set():
                if pause.is_set():
                    time.sleep(0.05)
                    continue
                ids = [local.randrange(ROWS) for _ in range(20)]
                writer_conn.execute("UPDATE t SET v = v + 1 WHERE id = ANY(%s)", (ids,))
                time.sleep(0.05)  # ~400 updates a second

        thread = threading.Thread(target=writer, daemon=True)
        thread.start()
        versions: list[tuple[float, int]] = []
        kills = ["maintain --follow", "load --follow", "both"]
        for round_number, victim in enumerate(kills):
            time.sleep(rng.uniform(4, 10))
            versions.append((time.time(), DeltaTable(str(paths["t1"])).version()))
            targets = ["maintain --follow", "load --follow"] if victim == "both" else [victim]
            for words in targets:
                pid = wait_for(lambda w=words: stage_pid(run.pid, w), 120, f"stage {words} running", log)
                kill_all(descendants(pid) | {pid})
            pause.set()
            wait_for(equal, 600, f"tables equal to the source after kill {round_number} ({victim})", log)
            pause.clear()
        pause.set()
        wait_for(equal, 600, "tables equal to the source at the end", log)

        # verify while vacuum runs with no retention to spare: its reader lease defers expiry. A
        # verify of this table can finish within one maintenance pass, so the test also holds the
        # same lease (shared, as every reader does) for 15 s around it: passes due every second
        # must meet a reader and put expiry off, however fast verify was.
        started = time.monotonic()
        with reading(config.home_dir, paths["t1"].name):
            verify = subprocess.run(
                [*headwater, "verify", "t1", "--timeout", "300"], cwd=project, env=env, capture_output=True, text=True
            )
            time.sleep(max(0.0, 15 - (time.monotonic() - started)))
        assert verify.returncode == 0, verify.stdout + verify.stderr
        finished.set()
        thread.join()

        # Time travel inside the retention: versions of the last seconds read in full.
        recent = [version for at, version in versions if time.time() - at < 12]
        newest = DeltaTable(str(paths["t1"])).version()
        for version in [*recent, newest - 1]:
            foreign(paths["t1"], False, version)  # every data file and deletion vector file is there

        run.send_signal(signal.SIGINT)  # the stages flush their output as they stop
        assert run.wait(timeout=180) == 0, log.read_text()[-3000:]
        text = log.read_text()
        assert "expiry deferred" in text, "no vacuum pass met verify's reader lease"
        assert "compacted" in text and "vacuumed" in text, text[-3000:]
        for table in ("t1", "t2"):
            runs = last_runs(config, table)
            assert "last_compaction" in runs and "last_vacuum" in runs
        assert any(paths["t1"].joinpath(DV_DIR).glob("*.bin")), "the tables never went merge-on-read"
        assert "Traceback" not in text, text[text.index("Traceback") - 2000 : text.index("Traceback") + 3000]
    finally:
        if run.poll() is None:
            run.send_signal(signal.SIGINT)
            try:
                run.wait(timeout=120)
            finally:
                kill_all(descendants(run.pid) | {run.pid})
