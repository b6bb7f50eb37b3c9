"""Asset checks from the ``quality:`` suites and the built-in checks: one check per expectation, one GX run per table.

Each checked table (a ``quality:`` suite, or an SCD2 table with its built-in invariant
checks) becomes a ``multi_asset_check`` on its warehouse table with one
``AssetCheckSpec`` per entry (named by :func:`warehouse_loader.quality.table_checks`), so
the UI shows every expectation and ``blocking`` is set per entry: a failed blocking
expectation is reported with ERROR severity, which fails the run and stops downstream
assets; a failed non-blocking one is a WARN. Each result carries the unexpected count
and sample unexpected values.

Every SCD1 table loaded straight from a source table also gets ``matches_source``, a
non-blocking check running :func:`operations.verify.verify_table` (the keys that differ
in its metadata).
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
    asset_check,
    multi_asset_check,
)

from core.config import ProjectConfig
from core.errors import HeadwaterError
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


#: How long the ``matches_source`` check waits for capture and the load to pass its snapshot.
VERIFY_TIMEOUT_S = 120.0


def verify_check(table: str) -> AssetChecksDefinition:
    """``matches_source``: the table equals its source table at a consistent point (``headwater verify``)."""

    @asset_check(
        asset=warehouse_key(table),
        name="matches_source",
        blocking=False,
        description="equals its source table at an exported snapshot (headwater verify)",
    )
    def matches_source(context: AssetCheckExecutionContext, project: HeadwaterProject) -> AssetCheckResult:
        from operations.verify import verify_table  # psycopg and the source: only when the check runs

        try:
            result = verify_table(project.load(), table, timeout_s=VERIFY_TIMEOUT_S)
        except HeadwaterError as exc:  # no snapshot, or the pipeline did not pass it in time: not a verdict
            return AssetCheckResult(passed=False, severity=AssetCheckSeverity.WARN, description=str(exc))
        return AssetCheckResult(
            passed=result.equal,
            severity=AssetCheckSeverity.ERROR,
            description=result.lines()[-1],
            metadata={
                "lsn": result.lsn,
                "source_rows": result.source_rows,
                "warehouse_rows": result.warehouse_rows,
                "differing_keys": MetadataValue.json([d.describe() for d in result.differences[:20]]),
                "unsettled_keys": MetadataValue.json(result.unsettled[:20]),
                "not_compared": MetadataValue.json(result.not_compared),
            },
        )

    return matches_source


def verified_tables(config: ProjectConfig) -> list[str]:
    """SCD1 tables loaded straight from a source table (the ones ``headwater verify`` compares)."""
    return [
        name
        for name, table in config.warehouse.tables.items()
        if table.mode == "scd1" and table.from_ not in config.feeds and table.from_.split(".", 1)[0] in config.sources
    ]


def build_checks(config: ProjectConfig) -> list[AssetChecksDefinition]:
    """The checks of every suite, the built-in ones and ``matches_source``; a bad entry fails in one line."""
    validate_suites(config)
    checks = [quality_check(config, table) for table in checked_tables(config)]
    return checks + [verify_check(table) for table in verified_tables(config)]
