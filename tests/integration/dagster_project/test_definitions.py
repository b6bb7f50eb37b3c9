"""The Dagster project over a real captured source: definitions, materialisation, checks, sensor."""

from __future__ import annotations

import datetime as dt
import shutil

import orjson
import psycopg
import pytest
import yaml
from dagster import AssetCheckKey, AssetKey, DagsterInstance, build_sensor_context, materialize

from core.config import load_config
from core.errors import ConfigError
from dagster_project.definitions import build_definitions
from log.factory import open_log


def write_config(tmp_path, source: str, dsn: str, quality: dict | None = None):
    document = {
        "project": "shop",
        "home": ".headwater",
        "log": {"partitions": 2, "file": {"fsync": "never"}},
        "sources": {source: {"dsn": dsn, "tables": ["public.customers"], "heartbeat_interval_s": 1}},
        "feeds": {
            "customers_clean": {
                "from": f"{source}.public.customers",
                "sql": "SELECT id, upper(email) AS email FROM source",
                "key": ["id"],
            }
        },
        "warehouse": {
            "tables": {
                "customers": {"from": f"{source}.public.customers", "mode": "scd1"},
                "customers_hist": {"from": f"{source}.public.customers", "mode": "scd2"},
                "customers_from_feed": {"from": "customers_clean"},
            }
        },
        "quality": quality
        or {
            "customers": [
                {"expect": "expect_column_values_to_not_be_null", "column": "email", "blocking": True},
                {"expect": "expect_column_values_to_be_between", "column": "balance", "min_value": 0},
            ]
        },
    }
    path = tmp_path / "headwater.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return load_config(path, strict_env=False)


def test_definitions_list_assets_checks_and_automation(tmp_path):
    config = write_config(tmp_path, "shop", "postgresql://capture@localhost/shop")
    defs = build_definitions(config)
    graph = defs.resolve_asset_graph()
    keys = {k.to_user_string(): graph.get(k) for k in graph.get_all_asset_keys()}
    assert set(keys) == {
        "shop/public/customers",
        "feeds/customers_clean",
        "warehouse/customers",
        "warehouse/customers_hist",
        "warehouse/customers_from_feed",
    }
    assert keys["shop/public/customers"].group_name == "sources"
    assert keys["feeds/customers_clean"].group_name == "feeds"
    assert keys["feeds/customers_clean"].is_materializable
    assert {p.to_user_string() for p in keys["feeds/customers_clean"].parent_keys} == {"shop/public/customers"}
    assert keys["warehouse/customers_hist"].partitions_def is not None  # SCD2 history: by commit day
    assert keys["warehouse/customers"].partitions_def is None
    assert {p.to_user_string() for p in keys["warehouse/customers_from_feed"].parent_keys} == {"feeds/customers_clean"}
    assert {p.to_user_string() for p in keys["warehouse/customers_hist"].parent_keys} == {"shop/public/customers"}
    table = AssetKey(["warehouse", "customers"])
    history = AssetKey(["warehouse", "customers_hist"])
    invariants = ["scd2_no_overlapping_versions", "scd2_one_open_version_per_key", "scd2_no_open_version_after_delete"]
    assert graph.asset_check_keys == {
        AssetCheckKey(table, "expect_column_values_to_not_be_null__email"),
        AssetCheckKey(table, "expect_column_values_to_be_between__balance"),
        AssetCheckKey(table, "matches_source"),  # headwater verify: SCD1 tables loaded from a source table
        *(AssetCheckKey(history, name) for name in invariants),  # built into every SCD2 table
    }
    blocking = {spec.name: spec.blocking for checks in defs.asset_checks for spec in checks.check_specs}
    assert blocking == {
        "expect_column_values_to_not_be_null__email": True,
        "expect_column_values_to_be_between__balance": False,
        "matches_source": False,
        **dict.fromkeys(invariants, True),
    }
    assert {s.name for s in defs.sensors} == {"pipeline_on_new_data"}
    assert {s.name for s in defs.schedules} == {"quality_checks_hourly", "maintain_tables_hourly"}
    jobs = {j.name for j in defs.resolve_all_job_defs()}
    assert {"warehouse_loads", "quality_checks", "resnapshot_source", "reprocess"} <= jobs


def test_a_bad_expectation_fails_loading_with_one_line(tmp_path):
    config = write_config(
        tmp_path, "shop", "postgresql://x@h/db", {"customers": [{"expect": "expect_rows_to_sparkle", "column": "id"}]}
    )
    with pytest.raises(ConfigError, match=r"quality\.customers\[0\] \(expect_rows_to_sparkle\)"):
        build_definitions(config)


def check_results(result):
    evaluations = [e.event_specific_data for e in result.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"]
    return {e.check_name: e for e in evaluations}


def test_materialise_capture_load_and_checks_then_a_blocking_failure_fails_the_run(
    pg_server, spark, unique_name, tmp_path
):
    source = unique_name("dg")
    dsn = pg_server.create_database(source)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE customers (id int PRIMARY KEY, email text, balance numeric(10,2));"
            "INSERT INTO customers SELECT g, 'c' || g || '@example.com', g - 3 FROM generate_series(1, 40) g;"
            f"CREATE PUBLICATION headwater_{source} FOR TABLE customers;"
        )
    config = write_config(tmp_path, source, dsn)
    defs = build_definitions(config)
    assets = list(defs.assets)
    checks = list(defs.asset_checks)
    resources = defs.resources
    instance = DagsterInstance.ephemeral()
    raw = AssetKey([source, "public", "customers"])
    scd1, hist = AssetKey(["warehouse", "customers"]), AssetKey(["warehouse", "customers_hist"])

    first = materialize([*assets, *checks], resources=resources, instance=instance, selection=[raw, scd1, hist])
    assert first.success
    by_key = {m.asset_key: m.metadata for m in first.get_asset_materialization_events() for m in [m.materialization]}
    assert by_key[raw]["log/records"].value == 40
    assert by_key[raw]["lag/headwater.load.customers"].value == 40  # captured before the load ran
    assert by_key[scd1]["dagster/row_count"].value == 40
    assert by_key[scd1]["warehouse/lag"].value == 0
    assert "warehouse/last_commit" in by_key[scd1]
    assert by_key[hist]["dagster/row_count"].value == 40
    checks_1 = check_results(first)
    assert checks_1["expect_column_values_to_not_be_null__email"].passed
    between = checks_1["expect_column_values_to_be_between__balance"]
    assert not between.passed and between.severity.value == "WARN"  # not blocking: the run still succeeds
    assert between.metadata["unexpected_count"].value == 2
    assert sorted(float(v) for v in between.metadata["sample_unexpected_values"].value) == [-2.0, -1.0]

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO customers VALUES (41, NULL, 5), (42, NULL, 6)")
    captured = materialize(assets, resources=resources, instance=instance, selection=[raw])
    assert captured.success

    (sensor,) = defs.sensors
    with build_sensor_context(instance=instance, resources=resources) as context:
        run_request = sensor(context)
    # The feed never ran (42 records behind), so it runs, and so does the table reading it.
    feed, from_feed = AssetKey(["feeds", "customers_clean"]), AssetKey(["warehouse", "customers_from_feed"])
    assert list(run_request.asset_selection) == [feed, scd1, from_feed, hist]
    today = dt.datetime.now(dt.UTC).date().isoformat()
    assert run_request.partition_key == today  # SCD2 history: today's partition, loaded incrementally
    assert run_request.tags["headwater/load"] == "incremental"

    second = materialize(
        [*assets, *checks], resources=resources, instance=instance, selection=[scd1], raise_on_error=False
    )
    assert not second.success, "a failed blocking expectation must fail the run"
    not_null = check_results(second)["expect_column_values_to_not_be_null__email"]
    assert not not_null.passed and not_null.severity.value == "ERROR"
    assert not_null.metadata["unexpected_count"].value == 2

    # The feed: an availableNow run of the feed runner, then the table loaded from it.
    fed = materialize(assets, resources=resources, instance=instance, selection=[feed, from_feed])
    assert fed.success
    by_key = {m.asset_key: m.metadata for m in fed.get_asset_materialization_events() for m in [m.materialization]}
    assert by_key[feed]["log/records"].value == 42
    assert by_key[feed]["lag/headwater.feed.customers_clean"].value == 0
    assert by_key[feed]["feed/quarantined"].value == 0
    assert by_key[feed]["feed/upserts"].value == 42
    assert by_key[from_feed]["dagster/row_count"].value == 42
    emails = {}
    with open_log(config) as log:
        topic = by_key[feed]["log/topic"].value
        for partition in range(log.describe_topic(topic).partitions):
            for record in log.read(topic, partition, 0):
                after = orjson.loads(record.value)["after"]
                emails[after["id"]] = after["email"]
    assert emails == {i: (f"C{i}@EXAMPLE.COM" if i <= 40 else None) for i in range(1, 43)}

    # SCD2 history by commit day: rebuilding today's partition from the log gives the same versions.
    from deltalake import DeltaTable

    from warehouse_loader.load_job import table_path

    path = str(table_path(config, "customers_hist"))
    loaded = materialize([*assets], resources=resources, instance=instance, selection=[hist])  # streaming load
    assert loaded.success

    def history() -> list[dict]:
        return sorted(DeltaTable(path).to_pyarrow_table().to_pylist(), key=str)

    before = history()
    assert len(before) == 42
    rebuilt = materialize([*assets], resources=resources, instance=instance, selection=[hist], partition_key=today)
    assert rebuilt.success
    (event,) = rebuilt.get_asset_materialization_events()
    assert event.materialization.partition == today
    # Capture stamps the initial snapshot's rows with their read time, so all 42 are today's.
    assert event.materialization.metadata["backfill/removed_versions"].value == 42
    assert event.materialization.metadata["backfill/changes"].value == 42
    assert history() == before
    # A backfill of every day with data, into an empty table, reproduces the whole history.
    shutil.rmtree(path)
    again = materialize([*assets], resources=resources, instance=instance, selection=[hist], partition_key=today)
    assert again.success
    assert history() == before
