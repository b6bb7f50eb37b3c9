"""The new-data sensor: one run in flight at a time; nothing pending, nothing requested (file log, no services)."""

from __future__ import annotations

import yaml
from dagster import DagsterInstance, DagsterRunStatus, SkipReason, build_sensor_context
from dagster._core.test_utils import create_run_for_test

from dagster_project.automation import new_data_sensor
from dagster_project.definitions import build_definitions
from headwater.config import load_config


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
