"""Asset checks from the ``quality:`` suites and the built-in checks: one check per expectation, one GX run per table.

Each checked table (a ``quality:`` suite, or an SCD2 table with its built-in invariant
checks) becomes a ``multi_asset_check`` on its warehouse table with one
``AssetCheckSpec`` per entry (named by :func:`warehouse_loader.quality.table_checks`), so
the UI shows every expectation and ``blocking`` is set per entry: a failed blocking
expectation is reported with ERROR severity, which fails the run and stops downstream
assets; a failed non-blocking one is a WARN. Each result carries the unexpected count
and sample unexpected values.
"""

from collections.abc import Iterator
from typing import Any

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSeverity,
    AssetCheckSpec,
    MetadataValue,
    multi_asset_check,
)

from core.config import ProjectConfig
from dagster_project.lineage import warehouse_key
from dagster_project.resources import HeadwaterProject
from warehouse_loader.quality import ExpectationOutcome, checked_tables, run_quality, table_checks, validate_suites


def _result(key_name: str, outcome: ExpectationOutcome, rows: int | None) -> AssetCheckResult:
    metadata: dict[str, Any] = {
        "expectation": outcome.expect,
        "arguments": MetadataValue.json(outcome.kwargs),
        "unexpected_count": outcome.unexpected_count if outcome.unexpected_count is not None else -1,
        "sample_unexpected_values": MetadataValue.json(outcome.samples),
    }
    if outcome.unexpected_percent is not None:
        metadata["unexpected_percent"] = outcome.unexpected_percent
    if outcome.observed_value is not None:
        metadata["observed_value"] = MetadataValue.json(outcome.observed_value)
    if rows is not None:
        metadata["rows"] = rows
    if outcome.error:
        metadata["error"] = outcome.error
    severity = AssetCheckSeverity.ERROR if outcome.blocking else AssetCheckSeverity.WARN
    return AssetCheckResult(
        asset_key=warehouse_key(key_name),
        check_name=outcome.name,
        passed=outcome.success,
        severity=severity,
        metadata=metadata,
        description=outcome.error,
    )


def quality_check(config: ProjectConfig, table: str) -> AssetChecksDefinition:
    """The checks of ``table``: one GX validation of the table yields a result per expectation."""
    specs = [
        AssetCheckSpec(
            name,
            asset=warehouse_key(table),
            blocking=entry.blocking,
            description=f"{entry.expect}({', '.join(f'{k}={v!r}' for k, v in entry.kwargs.items())})"
            + (" [blocking]" if entry.blocking else ""),
        )
        for name, entry in table_checks(config, table)
    ]

    @multi_asset_check(name=f"quality_{table}", specs=specs, compute_kind="great_expectations")
    def run_suite(context: AssetCheckExecutionContext, project: HeadwaterProject) -> Iterator[AssetCheckResult]:
        run = run_quality(project.load(), [table])
        (outcome,) = run.tables
        for expectation in outcome.expectations:
            yield _result(table, expectation, outcome.rows)

    return run_suite


def build_checks(config: ProjectConfig) -> list[AssetChecksDefinition]:
    """The checks of every suite; a bad entry fails loading with a one-line config error."""
    validate_suites(config)
    return [quality_check(config, table) for table in checked_tables(config)]
