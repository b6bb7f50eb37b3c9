"""``headwater capture --follow`` with its cleaner child: one ``/metrics`` for both, nothing left after a SIGKILL.

A real capture streams updates of a few rows (superseded records pile up in small
segments); its cleaner child (``headwater log clean --follow``, started by capture)
compacts them. A real HTTP GET of ``/metrics`` on capture's ``--metrics-port`` shows the
capture counters and the cleaner's (recorded by the child into the directory capture's
endpoint sums) and the topic's dirty ratio. Then capture alone is SIGKILLed: its
cleaner child must be gone within seconds (the parent-death signal, armed from the
thread that supervises the cleaner).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import yaml
from harness.metrics_scrape import free_port, scrape, total
from harness.process_tree import command_line, descendants, kill_all, wait_all_gone, wait_for
from harness.processes import stop_at_exit


def test_capture_follow_serves_its_cleaners_metrics_and_takes_it_along_when_killed(pg_database, unique_name, tmp_path):
    name = unique_name("clean")
    pg_database.execute("CREATE TABLE counters (id int PRIMARY KEY, n int NOT NULL, pad text)")
    pg_database.execute("INSERT INTO counters SELECT g, 0, repeat('x', 200) FROM generate_series(1, 5) g")
    pg_database.execute(f"CREATE PUBLICATION headwater_{name} FOR TABLE counters")
    topic = f"{name}.public.counters"
    project = tmp_path / "project"
    project.mkdir()
    (project / "headwater.yaml").write_text(
        yaml.safe_dump(
            {
                "project": "clean",
                "log": {
                    "partitions": 1,
                    "file": {"fsync": "never"},
                    "cleaner_interval_s": 0.5,
                    "topics": {f"{name}.public.*": {"min_compaction_lag_ms": 0, "segment_bytes": 4096}},
                },
                "sources": {name: {"dsn": pg_database.dsn, "tables": ["public.counters"], "heartbeat_interval_s": 1}},
            }
        )
    )
    port = free_port()
    log = tmp_path / "capture.log"
    with log.open("wb") as out:
        capture = subprocess.Popen(
            [sys.executable, "-m", "headwater", "capture", "--follow", "--metrics-port", str(port)],
            cwd=project,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    stop_at_exit(lambda: kill_all(descendants(capture.pid) | {capture.pid}))
    try:

        def snapshotted() -> bool:  # changes made before the slot exists would only be in the snapshot
            return total(scrape(port), "headwater_capture_events_total") >= 5

        wait_for(snapshotted, 120, "capture's snapshot on /metrics", log)
        for round_ in range(1, 41):  # 200 updates of 5 keys: most records superseded
            pg_database.execute("UPDATE counters SET n = %s", (round_,))

        seen: list[dict[str, float]] = [{}]

        def cleaned() -> dict[str, float] | None:
            samples = seen[0] = scrape(port)
            removed = total(samples, f'headwater_cleaner_records_removed_total{{topic="{topic}"}}')
            return samples if removed > 0 and total(samples, "headwater_capture_events_total") >= 205 else None

        try:
            samples = wait_for(cleaned, 240, "the cleaner's counters on capture's /metrics", log)
        except AssertionError as failure:
            shown = {
                k: v
                for k, v in seen[0].items()
                if k.startswith(("headwater_cleaner", "headwater_capture", "headwater_log"))
            }
            raise AssertionError(f"{failure}\nlast samples: {shown}") from None
        assert total(samples, f'headwater_cleaner_passes_total{{topic="{topic}"}}') >= 1
        assert total(samples, f'headwater_cleaner_bytes_removed_total{{topic="{topic}"}}') > 0
        assert total(samples, "headwater_cleaner_pass_duration_seconds_count") >= 1
        assert f'headwater_log_topic_dirty_ratio{{topic="{topic}"}}' in samples
        assert 0 <= samples[f'headwater_log_topic_dirty_ratio{{topic="{topic}"}}'] <= 1

        tree = descendants(capture.pid)
        cleaners = [pid for pid in tree if "log clean --follow" in command_line(pid)]
        assert len(cleaners) == 1, [command_line(pid) for pid in tree]
        os.kill(capture.pid, signal.SIGKILL)
        capture.wait()
        killed_at = time.monotonic()
        left = wait_all_gone(tree, timeout_s=10)
        assert not left, f"left {time.monotonic() - killed_at:.1f}s after SIGKILL of capture --follow: " + "; ".join(
            f"{pid}: {command_line(pid)[:200]}" for pid in left
        )
    finally:
        kill_all(descendants(capture.pid) | {capture.pid})
        capture.wait()
    assert "Traceback" not in log.read_text()
