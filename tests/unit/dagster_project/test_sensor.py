"""The new-data sensor: one run in flight at a time; nothing pending, nothing requested (file log, no services)."""

from __future__ import annotations

import datetime as dt

import orjson
import yaml
from dagster import DagsterInstance, DagsterRunStatus, RunRequest, SkipReason, build_sensor_context
from dagster._core.test_utils import create_run_for_test

from capture.postgres.events.source_block import postgres_source
from core.config import load_config
from dagster_project.automation import RANGE_END_TAG, RANGE_START_TAG, new_data_sensor
from dagster_project.definitions import build_definitions
from log.base import Record, TopicPartition, TopicSpec, append_keyed
from log.envelope import ChangeEvent, Op, encode_key, encode_value
from log.factory import open_log


def test_sensor_skips_while_its_previous_run_is_in_flight_and_when_nothing_is_pending(tmp_path):
    path = tmp_path / "headwater.yaml"
    document = {
        "project": "s",
        "home": ".headwater",
        "feeds": {"clean": {"from": "shop.public.orders", "sql": "SELECT id FROM source", "key": ["id"]}},
        "warehouse": {"tables": {"orders": {"from": "clean"}}},
    }
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    defs = build_definitions(load_config(path))
    instance = DagsterInstance.ephemeral()
    run = create_run_for_test(instance, tags={"headwater/trigger": "new-data"}, status=DagsterRunStatus.STARTED)

    with build_sensor_context(instance=instance, resources=defs.resources) as context:
        busy = new_data_sensor(context)
    assert isinstance(busy, SkipReason)
    assert busy.skip_message == f"run {run.run_id} for earlier new data is still in flight"

    instance.report_run_failed(run)
    with build_sensor_context(instance=instance, resources=defs.resources) as context:
        idle = new_data_sensor(context)
    assert isinstance(idle, SkipReason)
    assert idle.skip_message == "every feed and warehouse loader has committed up to its input's end"


def _inserts(log, topic: str, ids: range, committed: dt.datetime) -> None:
    ts_us = int(committed.timestamp() * 1_000_000)
    records = []
    for i in ids:
        source = postgres_source("src", "db", "public", "t", i, 1000 + i, 10_000 + i, 0, ts_us + i)
        event = ChangeEvent(Op.CREATE, source, None, {"id": i}, ts_us + i)
        records.append(Record(encode_key({"id": i}), encode_value(event)))
    append_keyed(log, topic, records)


def test_sensor_marks_every_day_the_pending_history_changes_were_committed_on(tmp_path):
    path = tmp_path / "headwater.yaml"
    document = {
        "project": "s",
        "home": ".headwater",
        "log": {"partitions": 2, "file": {"fsync": "never"}},
        "feeds": {"clean": {"from": "shop.public.orders", "sql": "SELECT id FROM source", "key": ["id"]}},
        "warehouse": {"tables": {"now": {"from": "clean"}, "hist": {"from": "shop.public.orders", "mode": "scd2"}}},
    }
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    config = load_config(path)
    defs = build_definitions(config)
    instance = DagsterInstance.ephemeral()
    now = dt.datetime.now(dt.UTC)
    with open_log(config) as log:
        log.create_topic(TopicSpec("shop.public.orders", partitions=2))
        _inserts(log, "shop.public.orders", range(10), now)

    with build_sensor_context(instance=instance, resources=defs.resources) as context:
        today_only = new_data_sensor(context)
    assert isinstance(today_only, RunRequest)
    assert today_only.partition_key == now.date().isoformat()
    assert RANGE_START_TAG not in today_only.tags

    # The history loader has applied nothing yet: older pending commits widen the run to their days.
    with open_log(config) as log:
        log.delete_topic("shop.public.orders")
        log.create_topic(TopicSpec("shop.public.orders", partitions=2))
        _inserts(log, "shop.public.orders", range(10, 20), now - dt.timedelta(days=3))
        _inserts(log, "shop.public.orders", range(10), now)
    with build_sensor_context(instance=instance, resources=defs.resources) as context:
        spanning = new_data_sensor(context)
    assert isinstance(spanning, RunRequest)
    assert spanning.partition_key is None
    assert spanning.tags[RANGE_START_TAG] == (now - dt.timedelta(days=3)).date().isoformat()
    assert spanning.tags[RANGE_END_TAG] == now.date().isoformat()
    assert spanning.tags["headwater/load"] == "incremental"

    # Once the history table's group has committed past the old changes, only today is pending again.
    with open_log(config) as log:
        group = "headwater.load.hist"
        old = {p: 0 for p in range(2)}
        for p in range(2):
            for record in log.read("shop.public.orders", p, 0):
                if orjson.loads(record.value)["after"]["id"] >= 10:
                    old[p] = record.offset + 1
        log.commit(group, {TopicPartition("shop.public.orders", p): o for p, o in old.items()})
    with build_sensor_context(instance=instance, resources=defs.resources) as context:
        caught_up = new_data_sensor(context)
    assert isinstance(caught_up, RunRequest)
    assert caught_up.partition_key == now.date().isoformat()
