"""``headwater run --follow`` under load: metrics while changes flow, nothing left after a SIGKILL, a rerun converges.

One pipeline (capture, a feed, an SCD1 table) runs as the real supervisor with
``--metrics-port``. While a workload commits, ``/metrics`` is scraped over HTTP: the
counters rise. Then the supervisor alone is SIGKILLed (an OOM kill runs no cleanup):
within seconds no process of its tree (stages, Spark JVMs, Python workers) and none
working in the project's directory may be left. A second ``run --follow`` takes over
at once (nothing holds a source or table), catches up (every lag gauge at 0) and the
warehouse table equals the source.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import yaml
from harness.items_workload import COLUMNS, SCHEMA, Workload, canonical, source_rows
from harness.metrics_scrape import free_port, scrape, total
from harness.process_tree import command_line, descendants, kill_all, wait_all_gone, wait_for, working_in
from harness.processes import stop_at_exit
from harness.row_compare import checksum, row_diff

from core.config import load_config
from warehouse_loader.load_job import table_path
from warehouse_loader.query import run_query

KEY = ["region", "id"]
LAGS = ("headwater_lag_records{", "headwater_lag_seconds{")


class Follow:
    """``headwater run --follow --metrics-port`` in the project directory, output to a file."""

    def __init__(self, project: Path, log: Path) -> None:
        self.port = free_port()
        self.log = log
        with log.open("ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "headwater", "run", "--follow", "--metrics-port", str(self.port)],
                cwd=project,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        stop_at_exit(self.kill_tree)

    def kill_tree(self) -> None:
        kill_all(descendants(self.process.pid) | {self.process.pid})
        self.process.wait()

    def metrics(self) -> dict[str, float]:
        return scrape(self.port)


def test_sigkill_of_run_follow_leaves_no_process_and_a_rerun_converges(pg_database, unique_name, tmp_path):
    name = unique_name("ops")
    conn = pg_database.connect()
    conn.execute(SCHEMA)
    workload = Workload(conn, seed=22)
    with conn.transaction():
        for _ in range(40):
            workload.insert(workload.new_key())
    conn.execute(f"CREATE PUBLICATION headwater_{name} FOR TABLE items")
    topic = f"{name}.public.items"
    project = tmp_path / "project"
    project.mkdir()
    (project / "headwater.yaml").write_text(
        yaml.safe_dump(
            {
                "project": "ops",
                "log": {"partitions": 2, "file": {"fsync": "never"}},
                "sources": {name: {"dsn": pg_database.dsn, "tables": ["public.items"], "heartbeat_interval_s": 1}},
                "feeds": {"priced": {"from": topic, "sql": "SELECT region, id, price FROM source", "key": KEY}},
                "warehouse": {"tables": {"items": {"from": topic, "mode": "scd1"}}},
            }
        )
    )
    config = load_config(project / "headwater.yaml")
    log = tmp_path / "run.log"
    first = Follow(project, log)
    try:
        sigkill_under_load(first, project, workload, log)
    finally:
        first.kill_tree()

    second = Follow(project, log)
    try:
        samples = wait_for(lambda: caught_up(second), 400, "the second run --follow caught up (every lag 0)", log)
        assert samples[f'headwater_source_up{{source="{name}"}}'] == 1
        result = run_query(f"SELECT {COLUMNS} FROM items", {"items": table_path(config, "items")})
        expected = source_rows(pg_database)
        actual = [canonical(tuple(row.values())) for row in result.to_pylist()]
        missing, extra = row_diff(expected, actual)
        assert checksum(actual) == checksum(expected), f"missing {missing[:3]}, extra {extra[:3]}"
        second.process.send_signal(signal.SIGINT)
        assert second.process.wait(timeout=120) == 0, log.read_text()[-3000:]
    finally:
        second.kill_tree()
    text = log.read_text()
    assert "Traceback" not in text, text[max(text.index("Traceback") - 3000, 0) : text.index("Traceback") + 3000]


def sigkill_under_load(first: Follow, project: Path, workload: Workload, log: Path) -> None:
    """Counters rise on /metrics while changes flow; SIGKILL the supervisor then; nothing may be left."""

    def loaded() -> bool:
        return total(first.metrics(), 'headwater_stage_input_records_total{name="items",stage="load"}') >= 40

    wait_for(loaded, 400, "the first run --follow loaded the seeded rows", log)
    stop = threading.Event()

    def changes() -> None:
        while not stop.is_set():
            workload.transactions(1)
            time.sleep(0.02)

    writer = threading.Thread(target=changes, daemon=True)
    writer.start()
    try:
        before = total(first.metrics(), "headwater_capture_events_total")

        def risen() -> dict[str, float] | None:
            samples = first.metrics()
            return samples if total(samples, "headwater_capture_events_total") > before else None

        after = wait_for(risen, 60, "capture's counter rose while changes flowed", log)
        for family in (
            "headwater_slot_wal_retained_bytes",
            "headwater_capture_lag_bytes",
            'headwater_lag_records{name="items",stage="load"}',
            'headwater_lag_records{name="priced",stage="feeds"}',
            "headwater_batch_duration_seconds_bucket",
            'headwater_stage_restarts_total{stage="load"}',
            'headwater_stage_restarts_total{stage="cleaner"}',
            "headwater_log_topic_dirty_ratio",
        ):
            assert any(key.startswith(family) for key in after), f"{family} not on /metrics"
        wait_for(lambda: len(java_under(first.process.pid)) >= 2, 120, "both Spark stages run a JVM", log)
        tree = descendants(first.process.pid)
        stages = " | ".join(command_line(pid) for pid in tree)
        assert "log clean --follow" in stages, f"no cleaner stage under run --follow: {stages}"
        os.kill(first.process.pid, signal.SIGKILL)  # the supervisor alone, as the OOM killer would
        first.process.wait()
        killed_at = time.monotonic()
        left = wait_all_gone(tree | working_in(project), timeout_s=10) | working_in(project)
        assert not left, f"left {time.monotonic() - killed_at:.1f}s after SIGKILL of run --follow: " + "; ".join(
            f"{pid}: {command_line(pid)[:200]}" for pid in left
        )
    finally:
        stop.set()
        writer.join(timeout=30)


def java_under(pid: int) -> list[int]:
    return [child for child in descendants(pid) if command_line(child).split(" ", 1)[0].endswith("/java")]


def caught_up(follow: Follow) -> dict[str, float] | None:
    """The samples once every lag is 0 and the table has loaded something; else None."""
    samples = follow.metrics()
    lags = [value for key, value in samples.items() if key.startswith(LAGS)]
    capture = [value for key, value in samples.items() if key.startswith("headwater_capture_lag_seconds")]
    loaded = total(samples, 'headwater_stage_input_records_total{name="items",stage="load"}')
    return samples if len(lags) == 4 and capture and not any(lags) and not any(capture) and loaded else None
