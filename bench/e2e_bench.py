"""End to end: commit in Postgres -> visible in the warehouse, under a steady workload.

Starts its own PostgreSQL, writes a config with one source table and its SCD1 warehouse
table, runs ``headwater run --follow`` (capture, load as supervised processes) and
drives a paced writer (default 2,000 changes/s for 60 s) that stamps each row with
``clock_timestamp()``. A poller reads the warehouse (``headwater query``'s engine) and
records when each row becomes visible. Prints commit-to-visible latency p50/p99 and the
sustained throughput (rows / time from the first commit to the last row visible).

    .venv/bin/python bench/e2e_bench.py [--rate 2000] [--seconds 60]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psycopg
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from process_tree import stop_group  # noqa: E402

from core.config import load_config  # noqa: E402
from operations.embedded_postgres import EmbeddedPostgres  # noqa: E402
from warehouse_loader.load_job import table_path  # noqa: E402
from warehouse_loader.query import run_query  # noqa: E402


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def writer(dsn: str, rate: int, seconds: float, stop: threading.Event, counts: list[int]) -> None:
    per_tick, tick = max(1, rate // 100), 0.01
    with psycopg.connect(dsn, autocommit=True) as conn:
        start = time.monotonic()
        n = 0
        while time.monotonic() - start < seconds and not stop.is_set():
            conn.execute("INSERT INTO events (payload) SELECT md5(g::text) FROM generate_series(1, %s) g", (per_tick,))
            n += per_tick
            next_at = start + (n / per_tick) * tick
            delay = next_at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        counts.append(n)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rate", type=int, default=2000, help="changes per second")
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="headwater-e2e-"))
    os.chmod(work, 0o755)
    server = EmbeddedPostgres(work / "pg", settings={"max_wal_senders": "10"})
    server.start()
    runner: subprocess.Popen[bytes] | None = None
    try:
        dsn = server.create_database("bench")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "CREATE TABLE events (id bigserial PRIMARY KEY, payload text, "
                "created timestamptz NOT NULL DEFAULT clock_timestamp())"
            )
            conn.execute("CREATE PUBLICATION headwater_bench FOR TABLE events")
        config_path = work / "headwater.yaml"
        config_path.write_text(
            yaml.safe_dump(
                {
                    "project": "e2e",
                    "sources": {"bench": {"dsn": dsn, "tables": ["public.events"], "heartbeat_interval_s": 1}},
                    "warehouse": {"tables": {"events": {"from": "bench.public.events", "mode": "scd1"}}},
                }
            )
        )
        config = load_config(config_path)
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        # Capture once first so the slot and topic exist before the steady load starts.
        subprocess.run(
            [sys.executable, "-m", "headwater", "--config", str(config_path), "capture", "--until-caught-up"],
            check=True,
            env=env,
            capture_output=True,
        )
        runner = subprocess.Popen(
            [sys.executable, "-m", "headwater", "--config", str(config_path), "run", "--follow"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        path = table_path(config, "events")
        while not (Path(path.uri) / "_delta_log").exists():  # the loader is up once the table exists (local)
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("INSERT INTO events (payload) VALUES ('warmup')")
            time.sleep(2)
        time.sleep(5)
        warm = run_query("SELECT max(id) AS m FROM events", {"events": path}).to_pylist()[0]["m"] or 0

        stop, counts = threading.Event(), []
        thread = threading.Thread(target=writer, args=(dsn, args.rate, args.seconds, stop, counts))
        started = time.time()
        thread.start()
        seen_at: dict[int, float] = {}
        created: dict[int, float] = {}
        last_id = warm
        deadline = started + args.seconds + 180
        while time.time() < deadline:
            rows = run_query(f"SELECT id, created FROM events WHERE id > {last_id}", {"events": path}).to_pylist()
            now = time.time()
            for row in rows:
                seen_at[row["id"]] = now
                created[row["id"]] = row["created"].timestamp()
                last_id = max(last_id, row["id"])
            if not thread.is_alive():
                with psycopg.connect(dsn) as conn:
                    top = conn.execute("SELECT max(id) FROM events").fetchone()[0]
                if last_id >= top:
                    break
            time.sleep(0.25)
        thread.join()
        latencies = [(seen_at[i] - created[i]) * 1000 for i in seen_at]
        first_commit = min(created.values())
        last_visible = max(seen_at.values())
        written = counts[0] if counts else 0
        throughput = len(seen_at) / (last_visible - first_commit)
        print(f"rows written: {written}, visible: {len(seen_at)} ({dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC)")
        print(
            f"latency commit -> warehouse: p50 {statistics.median(latencies):.0f} ms, "
            f"p99 {percentile(latencies, 0.99):.0f} ms, max {max(latencies):.0f} ms"
        )
        print(
            f"e2e: {throughput:,.0f} changes/s sustained at {args.rate:,}/s offered "
            f"(p50 {statistics.median(latencies):.0f} ms, p99 {percentile(latencies, 0.99):.0f} ms)"
        )
    finally:
        if runner is not None:
            stop_group(runner)
        server.stop()


if __name__ == "__main__":
    main()
