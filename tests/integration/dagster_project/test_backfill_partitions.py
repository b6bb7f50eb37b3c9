"""A Dagster partition backfill of SCD2 history: a 3-day range in one run, rebuilt from the log with Spark."""

from __future__ import annotations

import datetime as dt

import orjson
import yaml
from dagster import AssetKey, DagsterInstance, materialize
from deltalake import DeltaTable

from capture.postgres.events.source_block import postgres_source
from core.config import load_config
from dagster_project.definitions import build_definitions
from log.base import Record, TopicSpec, append_keyed
from log.envelope import ChangeEvent, Op, encode_key, encode_value
from log.factory import open_log
from log.topics import SCHEMAS_TOPIC
from warehouse_loader.changes import COMMIT_TS
from warehouse_loader.load_job import table_path

INT4, TEXT = 23, 25
# The range tags a Dagster backfill puts on a single-run (BackfillPolicy.single_run) range run.
RANGE_START, RANGE_END = "dagster/asset_partition_range_start", "dagster/asset_partition_range_end"


def five_days() -> list[dt.date]:
    today = dt.datetime.now(dt.UTC).date()
    return [today - dt.timedelta(days=10 - n) for n in range(5)]


def history_events(days: list[dt.date]) -> list[ChangeEvent]:
    """Keys 1-3 change every day; key 3 is deleted on day 2 and inserted again on day 3."""
    events = []
    lsn = 1000
    for number, day in enumerate(days):
        for hour, key in ((2, 1), (9, 2), (23, 3)):
            lsn += 10
            ts_us = int(dt.datetime.combine(day, dt.time(hour, 30), tzinfo=dt.UTC).timestamp() * 1_000_000)
            source = postgres_source("src", "db", "public", "t", lsn, lsn, lsn, 0, ts_us)
            if (key, number) == (3, 2):
                events.append(ChangeEvent(Op.DELETE, source, {"id": key, "label": None}, None, ts_us))
                continue
            op = Op.CREATE if number == 0 or (key, number) == (3, 3) else Op.UPDATE
            events.append(ChangeEvent(op, source, None, {"id": key, "label": f"k{key}-d{number}"}, ts_us))
    return events


def test_three_day_partition_backfill_rebuilds_exactly_those_days(spark, unique_name, tmp_path):
    topic = unique_name("raw")
    path = tmp_path / "headwater.yaml"
    document = {
        "project": "bf",
        "home": ".headwater",
        "log": {"partitions": 2, "file": {"fsync": "never"}},
        "warehouse": {"tables": {"hist": {"from": topic, "mode": "scd2"}}},
    }
    path.write_text(yaml.safe_dump(document))
    config = load_config(path)
    days = five_days()
    events = history_events(days)
    with open_log(config) as log:
        log.create_topic(TopicSpec(SCHEMAS_TOPIC, partitions=1))
        columns = [
            {"name": "id", "type_oid": INT4, "typmod": -1, "key": True},
            {"name": "label", "type_oid": TEXT, "typmod": -1, "key": False},
        ]
        schema = {"topic": topic, "schema": "public", "table": "t", "columns": columns, "version": 1}
        log.append(SCHEMAS_TOPIC, 0, [Record(topic.encode(), orjson.dumps(schema))])
        log.create_topic(TopicSpec(topic, partitions=2))
        # Stamped (here: exactly) at commit time, as capture's append time would be: the time index finds the days.
        records = [
            Record(encode_key({"id": (e.after or e.before)["id"]}), encode_value(e), (), e.source.ts_us // 1000)
            for e in events
        ]
        append_keyed(log, topic, records)

    defs = build_definitions(config)
    assets, resources = list(defs.assets), defs.resources
    instance = DagsterInstance.ephemeral()
    hist = AssetKey(["warehouse", "hist"])
    assert materialize(assets, resources=resources, instance=instance, selection=[hist]).success  # streaming load
    delta = str(table_path(config, "hist"))

    def versions(on: list[dt.date] | None = None) -> list[tuple]:
        rows = DeltaTable(delta).to_pyarrow_table().to_pylist()
        chosen = [r for r in rows if on is None or r[COMMIT_TS].date() in on]
        return sorted((r["id"], r["label"], r["__START_AT"], r["__END_AT"], r[COMMIT_TS]) for r in chosen)

    loaded = versions()
    assert len(loaded) == 14  # 15 changes, one of them a delete
    # Damage days 1-4; rebuild only days 1-3.
    first = dt.datetime.combine(days[1], dt.time(), tzinfo=dt.UTC).isoformat()
    DeltaTable(delta).update({"label": "'corrupt'"}, predicate=f"{COMMIT_TS} >= '{first}'")
    day_4 = versions([days[4]])
    start, end = days[1].isoformat(), days[3].isoformat()
    result = materialize(
        assets, resources=resources, instance=instance, selection=[hist], tags={RANGE_START: start, RANGE_END: end}
    )

    assert result.success
    events_by_partition = {
        e.materialization.partition: e.materialization for e in result.get_asset_materialization_events()
    }
    assert set(events_by_partition) == {d.isoformat() for d in days[1:4]}  # one run, three partitions
    metadata = events_by_partition[start].metadata
    assert metadata["backfill/changes"].value == 9  # exactly the source's changes on those days
    assert metadata["backfill/removed_versions"].value == 8  # key 3 has no version opened on day 2 (deleted)
    assert versions(days[:4]) == [v for v in loaded if v[4].date() in days[:4]]
    assert versions([days[4]]) == day_4  # a day not backfilled stays as it was (damaged)
