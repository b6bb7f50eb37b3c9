"""SIGTERM to ``headwater run --follow`` is a clean stop at any moment: exit 0, every stage too (issue 31).

One project (a source with a 300,000-row backlog, a feed, an SCD1 table) runs as the real
supervisor; each run gets SIGTERM at one moment: seeded delays after Headwater's first line ran
(the process catches SIGTERM, ``SigCgt`` in ``/proc/<pid>/status``; before that Python is still
starting and the signal's default action applies) while the supervisor starts its stages,
capture snapshots, Spark sessions start and queries plan; and the moments the issue found: while
the load's first micro-batch runs (its checkpoint has offsets for batch 0 and no commit yet),
and the feed's. Each run must exit 0 within the shutdown bound, with every stage's exit 0
(``stopped <stage> (exit 0)``), no ``aborted`` and no traceback.
A final ``run --until-caught-up`` then converges: the table equals the source, so no stop lost
or doubled anything.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import yaml
from harness.process_tree import descendants, kill_all

from core.config import load_config
from warehouse_loader.load_job import table_path
from warehouse_loader.query import run_query

ROWS = 300_000
#: Seconds after start; drawn once from a fixed seed, so a failure names its moment.
SEEDED_DELAYS = sorted(round(random.Random(31).uniform(0.2, 30.0), 1) for _ in range(4))


def catches_sigterm(pid: int) -> bool:
    """The process has a handler for SIGTERM: Headwater's first line ran (before it, Python is starting)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = next(int(line.split()[1], 16) for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(caught & (1 << (signal.SIGTERM - 1)))


def first_batch_running(checkpoint: Path) -> bool:
    """Batch 0 planned (offsets/0 written) and not committed (no commits/0)."""
    return (checkpoint / "offsets" / "0").exists() and not (checkpoint / "commits" / "0").exists()


def test_sigterm_of_run_follow_at_any_moment_stops_cleanly(pg_database: Any, unique_name: Any, tmp_path: Path) -> None:
    name = unique_name("term")
    pg_database.execute("CREATE TABLE t (id int PRIMARY KEY, n int, label text)")
    pg_database.execute(f"INSERT INTO t SELECT g, g % 100, 'label ' || g FROM generate_series(1, {ROWS}) g")
    pg_database.execute(f"CREATE PUBLICATION headwater_{name} FOR TABLE t")
    topic = f"{name}.public.t"
    project = tmp_path / "project"
    project.mkdir()
    (project / "headwater.yaml").write_text(
        yaml.safe_dump(
            {
                "project": "term",
                "log": {"partitions": 2, "file": {"fsync": "never"}},
                "sources": {name: {"dsn": pg_database.dsn, "tables": ["public.t"], "heartbeat_interval_s": 1}},
                "feeds": {"doubled": {"from": topic, "sql": "SELECT id, n * 2 AS n2 FROM source", "key": ["id"]}},
                "warehouse": {"tables": {"t": {"from": topic, "mode": "scd1"}}},
            }
        )
    )
    config = load_config(project / "headwater.yaml")
    home = config.home_dir
    load_checkpoint = home / "checkpoints" / "load" / "t"
    feed_checkpoints = home / "checkpoints" / "feeds" / "doubled"

    def feed_first_batch() -> bool:
        return (
            any(first_batch_running(path / "spark") for path in feed_checkpoints.glob("*"))
            if feed_checkpoints.exists()
            else False
        )

    moments: list[tuple[str, Callable[[float], bool]]] = [
        *((f"{delay}s after start", lambda elapsed, d=delay: elapsed >= d) for delay in SEEDED_DELAYS),
        ("the load's first micro-batch", lambda _elapsed: first_batch_running(load_checkpoint)),
        ("the feed's first micro-batch", lambda _elapsed: feed_first_batch()),
    ]
    output = tmp_path / "run.log"
    for what, moment in moments:
        with output.open("w") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "headwater", "run", "--follow"],
                cwd=project,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            started = time.monotonic()
            while not catches_sigterm(process.pid):  # Python's start-up: the default action applies
                assert process.poll() is None, f"{what}: run --follow ended early: {output.read_text()[-3000:]}"
                assert time.monotonic() - started < 60, f"{what}: never caught SIGTERM"
                time.sleep(0.005)
            started = time.monotonic()
            while not moment(time.monotonic() - started):
                assert process.poll() is None, f"{what}: run --follow ended early: {output.read_text()[-3000:]}"
                assert time.monotonic() - started < 600, f"{what}: the moment never came: {output.read_text()[-3000:]}"
                time.sleep(0.01)
            process.send_signal(signal.SIGTERM)
            code = process.wait(timeout=120)
        finally:
            if process.poll() is None:
                kill_all(descendants(process.pid) | {process.pid})
                process.wait()
        text = output.read_text()
        assert code == 0, f"SIGTERM at {what}: exit {code}\n{text[-4000:]}"
        assert "aborted" not in text and "Traceback" not in text, f"SIGTERM at {what}:\n{text[-4000:]}"
        stopped = [line for line in text.splitlines() if line.startswith("stopped ")]
        assert all(line.endswith("(exit 0)") for line in stopped), f"SIGTERM at {what}: {stopped}"

    done = subprocess.run(
        [sys.executable, "-m", "headwater", "run", "--until-caught-up"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = run_query("SELECT count(*) AS n, sum(n) AS total FROM t", {"t": table_path(config, "t")})
    with psycopg.connect(pg_database.dsn) as conn:
        expected = conn.execute("SELECT count(*), sum(n) FROM t").fetchone()
    assert tuple(result.to_pylist()[0].values()) == expected
