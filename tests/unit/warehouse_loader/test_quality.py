"""Quality suites: building from config, one-line config errors, results, run history."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import orjson
import pyarrow as pa
import pytest
from deltalake import write_deltalake

from core.config import ExpectationConfig, parse_config
from warehouse_loader.quality import (
    QualityConfigError,
    build_expectations,
    check_names,
    class_name,
    load_runs,
    run_quality,
    runs_path,
    select_tables,
)


def entries(*items: dict) -> tuple[ExpectationConfig, ...]:
    return tuple(ExpectationConfig.model_validate(i) for i in items)


def project(tmp_path: Path, quality: dict) -> object:
    raw = {
        "project": "p",
        "warehouse": {"tables": {"customers": {"from": "s.public.customers"}, "orders": {"from": "s.public.orders"}}},
        "quality": quality,
    }
    return parse_config(raw, tmp_path / "headwater.yaml")


def test_class_name_is_the_gx_camel_case():
    assert class_name("expect_column_values_to_be_unique") == "ExpectColumnValuesToBeUnique"
    assert class_name("expect_table_row_count_to_be_between") == "ExpectTableRowCountToBeBetween"


def test_check_names_are_unique_and_identifier_safe():
    names = check_names(
        entries(
            {"expect": "expect_column_values_to_be_unique", "column": "id"},
            {"expect": "expect_column_values_to_be_unique", "column": "id"},
            {"expect": "expect_table_row_count_to_be_between", "min_value": 1},
            {"expect": "expect_column_values_to_not_be_null", "column": "e-mail"},
        )
    )
    assert names == [
        "expect_column_values_to_be_unique__id",
        "expect_column_values_to_be_unique__id_2",
        "expect_table_row_count_to_be_between",
        "expect_column_values_to_not_be_null__e_mail",
    ]


def test_suite_is_built_from_config_entries():
    import great_expectations as gx

    built = build_expectations(
        "customers",
        entries(
            {"expect": "expect_column_values_to_be_unique", "column": "id", "blocking": True},
            {"expect": "expect_column_values_to_be_between", "column": "balance", "min_value": 0},
        ),
    )
    assert isinstance(built[0], gx.expectations.ExpectColumnValuesToBeUnique)
    assert built[0].column == "id"
    assert isinstance(built[1], gx.expectations.ExpectColumnValuesToBeBetween)
    assert built[1].min_value == 0


def test_unknown_expectation_is_a_one_line_error_naming_table_and_entry():
    with pytest.raises(QualityConfigError) as err:
        build_expectations(
            "customers",
            entries(
                {"expect": "expect_column_values_to_be_unique", "column": "id"},
                {"expect": "expect_column_values_to_be_shiny", "column": "id"},
            ),
        )
    message = str(err.value)
    assert "\n" not in message
    assert "quality.customers[1]" in message
    assert "expect_column_values_to_be_shiny" in message
    assert err.value.field == "quality.customers[1].expect"


def test_bad_argument_is_a_one_line_error_naming_the_argument():
    with pytest.raises(QualityConfigError) as err:
        build_expectations("orders", entries({"expect": "expect_column_values_to_be_between", "column": "x", "mn": 0}))
    message = str(err.value)
    assert "\n" not in message
    assert "quality.orders[0] (expect_column_values_to_be_between)" in message
    assert "mn" in message


def test_suite_for_a_table_that_is_not_in_the_warehouse_is_refused(tmp_path):
    config = project(tmp_path, {"payments": [{"expect": "expect_column_values_to_be_unique", "column": "id"}]})
    with pytest.raises(QualityConfigError, match="'payments' is not a warehouse table"):
        select_tables(config)
    with pytest.raises(QualityConfigError, match="no quality suite for table 'nope'"):
        select_tables(config, ["nope"])


def test_run_reports_counts_samples_and_pass_rate_and_records_history(tmp_path):
    config = project(
        tmp_path,
        {
            "customers": [
                {"expect": "expect_column_values_to_be_unique", "column": "id", "blocking": True},
                {"expect": "expect_column_values_to_be_between", "column": "balance", "min_value": 0},
                {"expect": "expect_column_values_to_not_be_null", "column": "missing_column"},
                {"expect": "expect_table_row_count_to_be_between", "min_value": 1, "max_value": 10},
            ],
            "orders": [{"expect": "expect_column_values_to_be_unique", "column": "id", "blocking": True}],
        },
    )
    write_deltalake(
        str(tmp_path / ".headwater" / "warehouse" / "customers"),
        pa.table({"id": [1, 2, 2, 3, 4], "balance": [10.0, -5.0, 3.0, None, -1.5]}),
    )
    run = run_quality(config, now=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC))
    customers, orders = run.tables
    unique, between, missing, count = customers.expectations
    assert customers.rows == 5
    assert (unique.success, unique.unexpected_count, unique.samples) == (False, 2, [2, 2])
    assert (between.success, between.unexpected_count, sorted(between.samples)) == (False, 2, [-5.0, -1.5])
    assert not missing.success and "missing_column" in missing.error
    assert count.success and count.observed_value == 5
    assert customers.pass_rate == 0.25
    assert orders.rows is None and "not loaded yet" in orders.error
    assert run.failed_blocking == [
        "customers.expect_column_values_to_be_unique__id",
        "orders.expect_column_values_to_be_unique__id",
    ]
    (line,) = runs_path(config).read_bytes().splitlines()
    recorded = orjson.loads(line)
    assert recorded["run_at"] == "2026-01-02T03:04:05+00:00"
    assert recorded["tables"]["customers"]["expectations"][0]["unexpected_count"] == 2
    assert recorded["pass_rate"] == 0.2


def test_load_runs_keeps_the_last_and_skips_a_torn_line(tmp_path):
    path = tmp_path / "runs.jsonl"
    lines = [orjson.dumps({"run_at": f"2026-01-0{i}T00:00:00+00:00", "pass_rate": i / 10}) for i in range(1, 6)]
    path.write_bytes(b"\n".join(lines) + b'\n{"run_at": "2026-01-0')
    runs = load_runs(path, limit=3)
    assert [r["pass_rate"] for r in runs] == [0.3, 0.4, 0.5]
    assert load_runs(tmp_path / "absent.jsonl") == []
