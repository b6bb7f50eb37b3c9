"""The new-data sensor under a real ``dagster-daemon`` (temp ``DAGSTER_HOME``): one run of feeds and loads.

The daemon loads the project's definitions in its own code server, evaluates the sensor,
and launches the run in a subprocess with its own Spark session, as ``headwater ui`` does.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import signal
import subprocess
import time

import orjson
import yaml
from dagster import AssetKey, DagsterEventType, DagsterInstance, DagsterRunStatus, RunsFilter, build_sensor_context
from deltalake import DeltaTable

from capture.postgres.events.source_block import postgres_source
from core.config import load_config
from dagster_project.automation import new_data_sensor
from dagster_project.definitions import build_definitions
from dagster_project.ui import _dagster_command, prepare_dagster_home, ui_environment
from log.base import Record, TopicSpec, append_keyed
from log.envelope import ChangeEvent, Op, encode_key, encode_value
from log.factory import open_log
from log.topics import SCHEMAS_TOPIC
from warehouse_loader.load_job import table_path

INT4, TEXT = 23, 25
RUN_TIMEOUT_S = 300


def raw_topic(config, topic: str) -> None:
    """A captured table's topic with its schema record, as capture writes them."""
    with open_log(config) as log:
        log.create_topic(TopicSpec(topic, partitions=2))
        log.create_topic(TopicSpec(SCHEMAS_TOPIC, partitions=1))
        columns = [
            {"name": "id", "type_oid": INT4, "typmod": -1, "key": True},
            {"name": "label", "type_oid": TEXT, "typmod": -1, "key": False},
        ]
        schema = {"topic": topic, "schema": "public", "table": "t", "columns": columns, "version": 1}
        log.append(SCHEMAS_TOPIC, 0, [Record(topic.encode(), orjson.dumps(schema))])


def append_inserts(config, topic: str, ids: range, days_ago: int = 0) -> None:
    """Inserts committed ``days_ago`` days before now (so they fall on that day's history partition)."""
    now_us = time.time_ns() // 1000 - days_ago * 86_400_000_000
    records = []
    for i in ids:
        source = postgres_source("src", "db", "public", "t", i, 1000 + i, 10_000 + i, 0, now_us + i)
        event = ChangeEvent(Op.CREATE, source, None, {"id": i, "label": f"n{i}"}, now_us + i)
        records.append(Record(encode_key({"id": i}), encode_value(event)))
    with open_log(config) as log:
        append_keyed(log, topic, records)


def test_daemon_sensor_runs_feeds_and_loads_with_the_history_partitions_of_each_commit_day(unique_name, tmp_path):
    topic = unique_name("raw")
    path = tmp_path / "headwater.yaml"
    document = {
        "project": "sensed",
        "home": ".headwater",
        "log": {"partitions": 2, "file": {"fsync": "never"}},
        "feeds": {"labels": {"from": topic, "sql": "SELECT id, upper(label) AS label FROM source", "key": ["id"]}},
        "warehouse": {
            "tables": {"labels_now": {"from": "labels", "mode": "scd1"}, "raw_hist": {"from": topic, "mode": "scd2"}}
        },
    }
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    config = load_config(path)
    raw_topic(config, topic)
    # Changes committed two days ago (capture was down) and today: the run must mark three days.
    append_inserts(config, topic, range(10), days_ago=2)
    append_inserts(config, topic, range(10, 25))

    home = prepare_dagster_home(config)
    env = ui_environment(config)
    workspace = str(home / "workspace.yaml")
    started = subprocess.run(
        [*_dagster_command("dagster"), "sensor", "start", "pipeline_on_new_data", "-w", workspace],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert started.returncode == 0, started.stdout + started.stderr
    daemon_log = (tmp_path / "daemon.log").open("wb")
    daemon = subprocess.Popen(
        [*_dagster_command("dagster-daemon"), "run", "-w", workspace],
        env=env,
        cwd=tmp_path,
        stdout=daemon_log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    instance = DagsterInstance.from_config(str(home))
    run = None
    began = time.monotonic()
    try:
        while time.monotonic() - began < RUN_TIMEOUT_S and daemon.poll() is None:
            records = instance.get_run_records(RunsFilter(tags={"headwater/trigger": "new-data"}))
            if records and records[0].dagster_run.is_finished:
                run = records[0].dagster_run
                break
            time.sleep(1)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(daemon.pid, signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            daemon.wait(timeout=10)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(daemon.pid, signal.SIGKILL)  # the daemon's group: its code server too
        daemon.wait()
        daemon_log.close()
    took = time.monotonic() - began
    output = (tmp_path / "daemon.log").read_text(errors="replace")[-3000:]
    assert run is not None, f"no sensor run finished within {RUN_TIMEOUT_S} s; daemon log: {output}"
    assert run.status == DagsterRunStatus.SUCCESS, output
    today = dt.datetime.now(dt.UTC).date()
    days = [(today - dt.timedelta(days=back)).isoformat() for back in (2, 1, 0)]
    assert run.tags["dagster/asset_partition_range_start"] == days[0]
    assert run.tags["dagster/asset_partition_range_end"] == days[-1]
    assert run.tags["headwater/load"] == "incremental"
    materialized = sorted(
        (
            e.dagster_event.event_specific_data.materialization.asset_key.to_user_string(),
            e.dagster_event.partition or "",
        )
        for e in instance.all_logs(run.run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION)
    )
    # History: one incremental load, materialised for each day its new changes were committed on.
    assert materialized == sorted(
        [("feeds/labels", ""), ("warehouse/labels_now", ""), *(("warehouse/raw_hist", day) for day in days)]
    )
    now = DeltaTable(str(table_path(config, "labels_now"))).to_pyarrow_table().to_pylist()
    assert {r["id"]: r["label"] for r in now} == {i: f"N{i}" for i in range(25)}
    assert DeltaTable(str(table_path(config, "raw_hist"))).to_pyarrow_table().num_rows == 25
    print(f"daemon: sensor run {run.run_id} succeeded {took:.0f} s after the daemon started")

    # Everything is committed now: the next evaluation skips; new records make it ask again.
    defs = build_definitions(config)
    with build_sensor_context(instance=instance, resources=defs.resources) as context:
        skipped = new_data_sensor(context)
    assert "committed up to its input's end" in skipped.skip_message
    append_inserts(config, topic, range(25, 27))
    with build_sensor_context(instance=instance, resources=defs.resources) as context:
        again = new_data_sensor(context)
    assert set(again.asset_selection) == {
        AssetKey(["feeds", "labels"]),
        AssetKey(["warehouse", "labels_now"]),
        AssetKey(["warehouse", "raw_hist"]),
    }
    assert again.run_key != run.tags["dagster/run_key"]
    assert again.partition_key == days[-1]  # only today's changes are pending now
