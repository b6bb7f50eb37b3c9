"""The Dagster project and the quality suites over a MariaDB source: one project, set up once for the module.

A real MariaDB (the session's server), a real Spark session and a real (ephemeral) Dagster instance,
no mocks: the module's fixture creates a database, a ``kind: mysql`` source, a feed, SCD1/SCD2 tables
and ``quality:`` suites, and materialises capture and the loads with their checks once. The cases then
read that project in order: the asset graph, the Great Expectations results (``headwater quality`` and
the asset checks, a blocking failure failing the run), ``matches_source`` (verify against MariaDB), the
new-data sensor, the feed, the SCD2 backfill by commit day, the operator jobs, and CLI work recorded in the
instance ``headwater ui`` serves.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml
from dagster import AssetKey, DagsterInstance, Definitions, build_sensor_context, materialize
from harness.mariadb import MariaDatabase, create_database
from harness.names import NameFactory

from core.config import ProjectConfig, load_config
from dagster_project.definitions import build_definitions
from log.factory import open_log

pytestmark = pytest.mark.timeout(900)

ROWS = 40


@dataclass
class Project:
    """The module's project: config, its Dagster definitions and instance, the MariaDB database."""

    config: ProjectConfig
    defs: Definitions
    instance: DagsterInstance
    database: MariaDatabase
    source: str
    first: Any  # the fixture's materialisation (capture, SCD1, SCD2, checks)

    @property
    def raw(self) -> AssetKey:
        return AssetKey([self.source, self.database.name, "customers"])

    def materialize(self, *selection: AssetKey, checks: bool = True, **kwargs: Any) -> Any:
        assets = [*self.defs.assets, *(self.defs.asset_checks if checks else ())]
        return materialize(
            assets, resources=self.defs.resources, instance=self.instance, selection=list(selection), **kwargs
        )


SCD1, HIST = AssetKey(["warehouse", "customers"]), AssetKey(["warehouse", "customers_hist"])
FEED, FROM_FEED = AssetKey(["feeds", "customers_clean"]), AssetKey(["warehouse", "customers_from_feed"])


def write_config(tmp: Path, source: str, database: MariaDatabase) -> ProjectConfig:
    topic = f"{source}.{database.name}.customers"
    document = {
        "project": "myshop",
        "home": ".headwater",
        "log": {"partitions": 2, "file": {"fsync": "never"}},
        "sources": {
            source: {
                "kind": "mysql",
                "dsn": database.dsn,
                "tables": [f"{database.name}.customers"],
            }
        },
        "feeds": {
            "customers_clean": {"from": topic, "sql": "SELECT id, upper(email) AS email FROM source", "key": ["id"]}
        },
        "warehouse": {
            "tables": {
                "customers": {"from": topic, "mode": "scd1"},
                "customers_hist": {"from": topic, "mode": "scd2"},
                "customers_from_feed": {"from": "customers_clean"},
            }
        },
        "quality": {
            "customers": [
                {"expect": "expect_column_values_to_not_be_null", "column": "email", "blocking": True},
                {"expect": "expect_column_values_to_be_between", "column": "balance", "min_value": 0},
                {"expect": "expect_column_values_to_be_unique", "column": "id"},
            ]
        },
    }
    path = tmp / "headwater.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return load_config(path)


def check_results(result: Any) -> dict[str, Any]:
    evaluations = [e.event_specific_data for e in result.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"]
    return {e.check_name: e for e in evaluations}


def materialized(result: Any) -> dict[AssetKey, Any]:
    return {e.materialization.asset_key: e.materialization.metadata for e in result.get_asset_materialization_events()}


@pytest.fixture(scope="module")
def project(mariadb_server: Any, spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Project]:
    names = NameFactory(__name__)
    database = create_database(mariadb_server, names("db"))
    try:
        database.script(
            "CREATE TABLE customers (id INT PRIMARY KEY, email VARCHAR(64), balance DECIMAL(10,2))",
            "INSERT INTO customers SELECT seq, concat('c', seq, '@example.com'), CAST(seq AS SIGNED) - 3 "
            "FROM seq_1_to_40",
        )
        source = names("my")
        config = write_config(tmp_path_factory.mktemp("mysql_project"), source, database)
        defs = build_definitions(config)
        instance = DagsterInstance.ephemeral()
        project = Project(config, defs, instance, database, source, first=None)
        project.first = project.materialize(project.raw, SCD1, HIST)
        yield project
    finally:
        database.drop()


def test_the_asset_graph_of_a_mysql_source(project: Project) -> None:
    graph = project.defs.resolve_asset_graph()
    raw = graph.get(project.raw)
    assert raw.group_name == "sources" and raw.kinds == {"mysql"}
    assert {p for p in graph.get(HIST).parent_keys} == {project.raw}
    assert graph.get(HIST).partitions_def is not None
    assert {c.name for c in graph.asset_check_keys if c.asset_key == SCD1} == {
        "expect_column_values_to_not_be_null__email",
        "expect_column_values_to_be_between__balance",
        "expect_column_values_to_be_unique__id",
        "matches_source",
    }


def test_capture_load_and_quality_checks_of_mysql_rows(project: Project) -> None:
    first = project.first
    assert first.success
    by_key = materialized(first)
    assert by_key[project.raw]["log/records"].value == ROWS
    assert str(by_key[project.raw]["capture/acked_position"].value).startswith("binlog.")
    assert by_key[SCD1]["dagster/row_count"].value == ROWS
    assert by_key[SCD1]["warehouse/lag"].value == 0
    assert by_key[HIST]["dagster/row_count"].value == ROWS
    checks = check_results(first)
    assert checks["expect_column_values_to_not_be_null__email"].passed
    assert checks["expect_column_values_to_be_unique__id"].passed
    between = checks["expect_column_values_to_be_between__balance"]
    assert not between.passed and between.severity.value == "WARN"  # not blocking: the run still succeeds
    assert between.metadata["unexpected_count"].value == 2
    assert sorted(Decimal(str(v)) for v in between.metadata["sample_unexpected_values"].value) == [-2, -1]


def test_headwater_quality_report_over_the_mysql_table(project: Project) -> None:
    from warehouse_loader.quality_report import run_and_report

    with open_log(project.config) as log:
        run, report = run_and_report(project.config, log, ["customers"])
    (table,) = run.tables
    assert table.rows == ROWS and table.passed == 2 and len(table.expectations) == 3
    assert report.exists() and "expect_column_values_to_be_between" in report.read_text()


def test_matches_source_verifies_the_table_against_mariadb(project: Project) -> None:
    result = project.defs.resolve_job_def("quality_checks").execute_in_process(instance=project.instance)
    verdict = check_results(result)["matches_source"]
    assert verdict.passed, verdict.description
    assert verdict.metadata["source_rows"].value == ROWS == verdict.metadata["warehouse_rows"].value


def test_new_rows_the_sensor_the_feed_and_a_blocking_failure(project: Project) -> None:
    project.database.script("INSERT INTO customers VALUES (41, NULL, 5), (42, NULL, 6)")
    assert project.materialize(project.raw, checks=False).success

    (sensor,) = project.defs.sensors
    with build_sensor_context(instance=project.instance, resources=project.defs.resources) as context:
        run_request = sensor(context)
    assert list(run_request.asset_selection) == [FEED, SCD1, FROM_FEED, HIST]
    today = dt.datetime.now(dt.UTC).date().isoformat()
    assert run_request.partition_key == today and run_request.tags["headwater/load"] == "incremental"

    second = project.materialize(SCD1, raise_on_error=False)
    assert not second.success, "a failed blocking expectation must fail the run"
    not_null = check_results(second)["expect_column_values_to_not_be_null__email"]
    assert not not_null.passed and not_null.severity.value == "ERROR"
    assert not_null.metadata["unexpected_count"].value == 2

    fed = project.materialize(FEED, FROM_FEED, checks=False)
    assert fed.success
    by_key = materialized(fed)
    assert by_key[FEED]["feed/upserts"].value == ROWS + 2
    assert by_key[FROM_FEED]["dagster/row_count"].value == ROWS + 2


def test_scd2_history_rebuilt_by_commit_day_from_mysql_changes(project: Project) -> None:
    from deltalake import DeltaTable

    from warehouse_loader.load_job import table_path

    project.database.script("UPDATE customers SET balance = balance + 100 WHERE id <= 3")
    assert project.materialize(project.raw, checks=False).success
    assert project.materialize(HIST, checks=False).success  # the streaming load
    path = str(table_path(project.config, "customers_hist"))

    def history() -> list[dict[str, Any]]:
        return sorted(DeltaTable(path).to_pyarrow_table().to_pylist(), key=str)

    before = history()
    assert len(before) == ROWS + 2 + 3
    today = dt.datetime.now(dt.UTC).date().isoformat()
    rebuilt = project.materialize(HIST, checks=False, partition_key=today)
    assert rebuilt.success
    (event,) = rebuilt.get_asset_materialization_events()
    assert event.materialization.metadata["backfill/changes"].value == ROWS + 2 + 3
    assert history() == before


def test_warehouse_loads_job_and_operator_jobs(project: Project) -> None:
    loads = project.defs.resolve_job_def("warehouse_loads").execute_in_process(
        instance=project.instance, raise_on_error=False
    )
    # Every table loads; the run fails on the blocking check of the rows with a NULL email.
    assert set(materialized(loads)) == {SCD1, HIST, FROM_FEED}
    assert not loads.success
    assert not check_results(loads)["expect_column_values_to_not_be_null__email"].passed

    # A table the source does not capture is refused in one line; a captured one is re-read (MariaDB:
    # chunks at the consistent-snapshot binlog point) by a capture run, as no agent runs here.
    refused = project.defs.resolve_job_def("resnapshot_source").execute_in_process(
        run_config={"ops": {"incremental_snapshot": {"config": {"source": project.source, "tables": ["x.y"]}}}},
        instance=project.instance,
        raise_on_error=False,
    )
    assert not refused.success
    (failure,) = [e for e in refused.all_events if e.event_type_value == "STEP_FAILURE"]
    description = failure.event_specific_data.user_failure_data.description
    assert "x.y" in description and "\n" not in description.strip(), description
    table = f"{project.database.name}.customers"
    resnapshot = project.defs.resolve_job_def("resnapshot_source").execute_in_process(
        run_config={"ops": {"incremental_snapshot": {"config": {"source": project.source, "tables": [table]}}}},
        instance=project.instance,
    )
    assert resnapshot.success
    (event,) = resnapshot.get_asset_materialization_events()
    assert event.asset_key == project.raw and "snapshot/request" in event.materialization.metadata

    reprocess = project.defs.resolve_job_def("reprocess").execute_in_process(
        run_config={"ops": {"reprocess_version": {"config": {"name": "customers_clean"}}}}, instance=project.instance
    )
    assert reprocess.success
    (event,) = reprocess.get_asset_materialization_events()
    assert event.asset_key == FEED and event.materialization.metadata["reprocess/version"].value == 2


def test_cli_work_recorded_in_the_ui_instance_names_the_binlog_position(project: Project) -> None:
    from dagster_project.recording import AssetRecorder
    from dagster_project.ui import prepare_dagster_home

    figures = {"acked": "binlog.000001:4", "events": 1, "records_written": 1}
    assert AssetRecorder(project.config, "headwater capture").record(sources={project.source: figures}) >= 1
    instance = DagsterInstance.from_config(str(prepare_dagster_home(project.config)))
    event = instance.get_latest_materialization_event(project.raw)
    assert event is not None and event.asset_materialization is not None
    metadata = event.asset_materialization.metadata
    assert metadata["capture/acked_position"].value == "binlog.000001:4" and "capture/acked_lsn" not in metadata
