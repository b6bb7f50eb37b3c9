"""Stage commands record their work in the project's Dagster instance only once it exists.

A project nobody watches in Dagster does not pay for Dagster in every command (importing it and
opening its storages took about 1 CPU s of a 2.3 CPU s ``capture --until-caught-up``): no
instance is created and nothing is recorded. ``headwater ui`` creates the instance and records the
state of every asset made before (:func:`dagster_project.recording.record_unrecorded`, which its
start calls); from then on every stage command records its own work, a ``--follow`` one at its
start, every 30 s and when stopped.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from dagster import AssetKey, DagsterInstance
from harness.cli import run_headwater

from core.config import load_config
from dagster_project.recording import record_unrecorded
from dagster_project.ui import dagster_home, dagster_instance_exists
from log.base import end_offsets
from log.factory import open_log


def _latest(config, key: AssetKey) -> tuple[str, int]:
    with DagsterInstance.from_config(str(dagster_home(config))) as instance:
        event = instance.get_latest_materialization_event(key)
    assert event is not None and event.asset_materialization is not None
    return event.asset_materialization.description or "", event.asset_materialization.metadata["log/records"].value


def _records(config, topic: str) -> int:
    log = open_log(config)
    try:
        return sum(end_offsets(log, topic).values())
    finally:
        log.close()


def test_commands_record_into_an_existing_instance_and_the_ui_records_what_came_before(
    pg_database, unique_name, tmp_path
):
    source = unique_name("rec")
    pg_database.execute("CREATE TABLE items (id int PRIMARY KEY, name text)")
    pg_database.execute("INSERT INTO items SELECT n, 'item ' || n FROM generate_series(1, 5) n")
    pg_database.execute(f"CREATE PUBLICATION headwater_{source} FOR TABLE items")
    path = tmp_path / "headwater.yaml"
    path.write_text(
        f"project: rec\nsources:\n  {source}:\n    dsn: {pg_database.dsn}\n    tables: [public.items]\n"
        "    heartbeat_interval_s: 1\n"
    )
    config = load_config(path)
    topic = AssetKey([source, "public", "items"])
    run_headwater(path, "capture", "--until-caught-up")
    assert not dagster_instance_exists(config)
    assert not dagster_home(config).exists()  # the recorder never ran: it creates the home first

    assert record_unrecorded(config) == 1  # what headwater ui's start records: the topic, as it is now
    assert _latest(config, topic) == ("headwater ui: found at its start (made before the instance existed)", 5)
    assert record_unrecorded(config) == 0  # recorded once

    pg_database.execute("INSERT INTO items VALUES (6, 'item 6')")
    run_headwater(path, "capture", "--until-caught-up")
    assert _latest(config, topic) == ("headwater capture", 6)

    # A --follow stage records at its start, every 30 s and when stopped.
    pg_database.execute("INSERT INTO items VALUES (7, 'item 7')")
    follow = subprocess.Popen(
        [sys.executable, "-m", "headwater", "--config", str(path), "capture", "--follow"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while _latest(config, topic)[1] < 7 and time.monotonic() < deadline:
            time.sleep(1)
        pg_database.execute("INSERT INTO items VALUES (8, 'item 8')")
        while _records(config, f"{source}.public.items") < 8 and time.monotonic() < deadline:
            time.sleep(0.5)  # in the log before the stop: the last record must count it
    finally:
        follow.send_signal(signal.SIGINT)
        _, err = follow.communicate(timeout=120)
    assert follow.returncode == 0, err[-2000:]
    assert _latest(config, topic) == ("headwater capture", 8)  # the record at the stop
