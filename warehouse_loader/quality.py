"""Data quality: the ``quality:`` suites of ``headwater.yaml`` and the built-in checks, run with Great Expectations 1.x.

(Over 500 lines by a few: suites, results and the run history it records belong together.)

Each warehouse table named under ``quality:`` gets one GX ``ExpectationSuite`` built from
its entries (``expect`` = a GX 1.x expectation name, the other keys its arguments) and is
validated in an ephemeral GX context against the table's current version, read through its
table format into pandas. ``dagster-ge`` only supports GX 0.x, so GX is driven directly here and
both ``headwater quality`` and the Dagster asset checks call :func:`run_quality`.

Results keep, per expectation, success, unexpected count and a few sample unexpected
values; per table, the pass rate. Every run appends one JSON line to
``<home>/quality/runs.jsonl`` (the report's pass-rate-over-time chart reads it back).

GX is imported lazily: building check names and reading history need no GX.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, date, datetime, time
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from core.config import ExpectationConfig, ProjectConfig
from core.errors import ConfigError
from warehouse_loader.errors import WarehouseError
from warehouse_loader.formats import DEFAULT_FORMAT, format_of, table_format
from warehouse_loader.load_job import table_path
from warehouse_loader.location import TableLocation, as_location
from warehouse_loader.scd2_invariants import invariant_checks, invariant_rows
from warehouse_loader.table_format import TableFormat

if TYPE_CHECKING:
    import pandas as pd  # type: ignore[import-untyped]

#: How many unexpected values a result keeps as samples.
SAMPLE_SIZE = 5
#: Name of the pandas data source inside the ephemeral GX context.
_DATASOURCE = "headwater_warehouse"
_SAMPLE_TEXT_MAX = 200


class QualityConfigError(ConfigError):
    """A ``quality:`` entry names an unknown expectation, a bad argument or an unknown table."""


class BlockingExpectationFailedError(WarehouseError):
    """At least one ``blocking`` expectation failed (the run's results were still written).

    Not a :class:`PermanentError`: the command worked and the data failed its checks, so
    ``headwater quality`` exits 1 like a failing test run (3 is for errors that need an operator).
    """

    def __init__(self, failed: Sequence[str]) -> None:
        super().__init__(
            f"{len(failed)} blocking expectation{'s' if len(failed) != 1 else ''} failed: {', '.join(failed)}; "
            "see the quality report and fix the data or the suite"
        )
        self.failed = tuple(failed)


def import_gx() -> Any:
    """Import Great Expectations safely in any process.

    GX imports ``pyspark.sql.connect``, whose package init calls ``sys.exit(0)`` when
    ``__main__`` has neither ``__spec__`` nor ``__file__`` (it takes that for its doctest
    runner): exactly the case of ``python -c`` and of spawned workers such as Dagster's
    run processes, which then vanish with exit code 0. During the import only, ``__main__``
    gets a placeholder ``__file__``.
    """
    main = sys.modules.get("__main__")
    patched = main is not None and getattr(main, "__spec__", None) is None and not hasattr(main, "__file__")
    if patched:
        main.__file__ = "<headwater>"  # type: ignore[union-attr]
    try:
        import great_expectations as gx
    finally:
        if patched:
            del main.__file__  # type: ignore[union-attr]
    return gx


def quality_dir(config: ProjectConfig) -> Path:
    """``<home>/quality``: run history, the default report and GX Data Docs."""
    return config.home_dir / "quality"


def runs_path(config: ProjectConfig) -> Path:
    """The run history, one JSON object per line (:meth:`QualityRun.as_json`)."""
    return quality_dir(config) / "runs.jsonl"


def verify_runs_path(config: ProjectConfig) -> Path:
    """The ``headwater verify`` history, one JSON object per line (``operations.verify.VerifyResult.as_json``)."""
    return quality_dir(config) / "verify.jsonl"


def latest_verifications(config: ProjectConfig) -> dict[str, dict[str, Any]]:
    """The last recorded ``headwater verify`` result of each table (torn or foreign lines skipped)."""
    latest: dict[str, dict[str, Any]] = {}
    for run in load_runs(verify_runs_path(config), limit=10_000, field="table"):
        latest[str(run["table"])] = run
    return latest


def data_docs_path(config: ProjectConfig) -> Path:
    """Where GX Data Docs are built (they load CSS/JS from CDNs: unstyled offline)."""
    return quality_dir(config) / "data_docs"


def class_name(expect: str) -> str:
    """The GX 1.x class of an expectation name: ``expect_column_to_exist`` -> ``ExpectColumnToExist``."""
    return "".join(part[:1].upper() + part[1:] for part in expect.split("_"))


def check_names(entries: Sequence[ExpectationConfig]) -> list[str]:
    """A stable, unique, identifier-safe name per entry: ``<expect>__<column>``, numbered on repeats."""
    names: list[str] = []
    for entry in entries:
        kwargs = entry.kwargs
        target = kwargs.get("column") or "_".join(str(c) for c in kwargs.get("column_list", ()) or ())
        base = entry.expect + (f"__{target}" if target else "")
        base = re.sub(r"[^A-Za-z0-9_]", "_", base)
        name, n = base, 2
        while name in names:
            name, n = f"{base}_{n}", n + 1
        names.append(name)
    return names


def _config_source(config: ProjectConfig | None) -> str:
    if config is not None and config.config_path is not None:
        return str(config.config_path)
    return "headwater.yaml"


def build_expectations(
    table: str, entries: Sequence[ExpectationConfig], *, source: str = "headwater.yaml"
) -> list[Any]:
    """GX 1.x expectation objects for the entries of ``quality.<table>``.

    An unknown name or a bad argument raises :class:`QualityConfigError`, one line naming
    the file, the table and the entry.
    """
    gx = import_gx()
    from great_expectations.exceptions.exceptions import GreatExpectationsError
    from great_expectations.expectations.expectation import Expectation

    built: list[Any] = []
    for index, entry in enumerate(entries):
        where = f"{source}: quality.{table}[{index}] ({entry.expect})"
        cls = getattr(gx.expectations, class_name(entry.expect), None)
        if not (isinstance(cls, type) and issubclass(cls, Expectation)):
            msg = f"{where}: Great Expectations 1.x has no such expectation; check the name in the GX gallery"
            raise QualityConfigError(msg, path=source, field=f"quality.{table}[{index}].expect")
        try:
            built.append(cls(**entry.kwargs))
        except (ValueError, TypeError, GreatExpectationsError) as exc:
            msg = f"{where}: invalid arguments: {_argument_errors(exc)}; fix the entry"
            raise QualityConfigError(msg, path=source, field=f"quality.{table}[{index}]") from None
    return built


def _argument_errors(exc: Exception) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors):
        try:
            parts = [
                f"{'.'.join(str(x) for x in e.get('loc', ()) if x != '__root__') or 'arguments'}: {e.get('msg')}"
                for e in errors()
            ]
        except Exception:  # any shape we do not know: fall back to the plain message
            parts = []
        if parts:
            return "; ".join(parts)
    return " ".join(str(exc).split()) or type(exc).__name__


def table_checks(config: ProjectConfig, table: str) -> list[tuple[str, ExpectationConfig]]:
    """Every check of ``table``, named: its ``quality:`` entries (:func:`check_names`), then the built-in ones."""
    entries = config.quality.get(table, ())
    return [*zip(check_names(entries), entries, strict=True), *builtin_checks(config, table)]


def builtin_checks(config: ProjectConfig, table: str) -> list[tuple[str, ExpectationConfig]]:
    """The blocking checks every table of its kind gets: the SCD2 invariants."""
    settings = config.warehouse.tables.get(table)
    return invariant_checks() if settings is not None and settings.mode == "scd2" else []


def checked_tables(config: ProjectConfig) -> list[str]:
    """Tables with a ``quality:`` suite or built-in checks, suites first."""
    builtin = [name for name in config.warehouse.tables if builtin_checks(config, name) and name not in config.quality]
    return [*config.quality, *builtin]


def validate_suites(config: ProjectConfig, tables: Iterable[str] | None = None) -> dict[str, list[Any]]:
    """Build every selected table's expectations (config errors surface here, before any data is read)."""
    selected = select_tables(config, tables)
    source = _config_source(config)
    return {
        name: build_expectations(name, [entry for _, entry in table_checks(config, name)], source=source)
        for name in selected
    }


def select_tables(config: ProjectConfig, tables: Iterable[str] | None = None) -> list[str]:
    """The tables to check: ``tables`` (all checked ones when empty); each must have checks and be a warehouse table."""
    wanted = list(tables or ()) or checked_tables(config)
    source = _config_source(config)
    for name in wanted:
        if name not in config.quality and not builtin_checks(config, name):
            known = ", ".join(checked_tables(config)) or "none"
            msg = f"{source}: no quality suite for table {name!r}; suites: {known} (see quality: in headwater.yaml)"
            raise QualityConfigError(msg, path=source, field=f"quality.{name}")
        if name not in config.warehouse.tables:
            known = ", ".join(config.warehouse.tables) or "none"
            msg = f"{source}: quality.{name}: {name!r} is not a warehouse table; known: {known}"
            raise QualityConfigError(msg, path=source, field=f"quality.{name}")
    return wanted


@dataclass(frozen=True)
class ExpectationOutcome:
    """One expectation's result on one table."""

    name: str
    expect: str
    kwargs: dict[str, Any]
    blocking: bool
    success: bool
    element_count: int | None = None
    unexpected_count: int | None = None
    unexpected_percent: float | None = None
    samples: list[Any] = field(default_factory=list)
    observed_value: Any = None
    error: str | None = None


@dataclass(frozen=True)
class TableOutcome:
    """One table's suite result. ``error`` is set when the table could not be read (nothing evaluated)."""

    table: str
    rows: int | None
    expectations: list[ExpectationOutcome]
    error: str | None = None

    @property
    def passed(self) -> int:
        """Expectations that succeeded."""
        return sum(1 for e in self.expectations if e.success)

    @property
    def pass_rate(self) -> float | None:
        """Share of expectations that succeeded (``None`` when nothing was evaluated)."""
        if not self.expectations:
            return None
        return self.passed / len(self.expectations)

    @property
    def failed_blocking(self) -> list[str]:
        """``table.check`` names of failed blocking expectations (a table that cannot be read fails them all)."""
        return [f"{self.table}.{e.name}" for e in self.expectations if e.blocking and not e.success]


@dataclass(frozen=True)
class QualityRun:
    """The result of one :func:`run_quality` call."""

    run_at: datetime
    tables: list[TableOutcome]

    @property
    def failed_blocking(self) -> list[str]:
        """Every failed blocking expectation, as ``table.check``."""
        return [name for t in self.tables for name in t.failed_blocking]

    @property
    def pass_rate(self) -> float | None:
        """Share of all evaluated expectations that succeeded."""
        total = sum(len(t.expectations) for t in self.tables)
        if not total:
            return None
        return sum(t.passed for t in self.tables) / total

    def as_json(self) -> dict[str, Any]:
        """The run as one JSON-able object (one line of ``runs.jsonl``)."""
        return {
            "run_at": self.run_at.isoformat(),
            "pass_rate": self.pass_rate,
            "failed_blocking": self.failed_blocking,
            "tables": {
                t.table: {
                    "rows": t.rows,
                    "passed": t.passed,
                    "evaluated": len(t.expectations),
                    "pass_rate": t.pass_rate,
                    "error": t.error,
                    "expectations": [asdict(e) for e in t.expectations],
                }
                for t in self.tables
            },
        }


def jsonable(value: Any) -> Any:
    """A JSON-safe form of a sample value (NaN -> None, decimals/dates/bytes -> text, long text cut)."""
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        return None if math.isnan(value) else value
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if hasattr(value, "item") and callable(value.item):  # numpy scalars
        try:
            return jsonable(value.item())
        except (TypeError, ValueError):
            pass
    text = str(value)
    return text if len(text) <= _SAMPLE_TEXT_MAX else text[: _SAMPLE_TEXT_MAX - 1] + "…"


def _exception_message(info: Mapping[str, Any]) -> str | None:
    """The first exception message in GX's ``exception_info`` (flat, or keyed by metric id)."""
    candidates = [info, *(v for v in info.values() if isinstance(v, Mapping))]
    for candidate in candidates:
        if candidate.get("raised_exception"):
            message = str(candidate.get("exception_message") or "the expectation raised an exception")
            return " ".join(message.split())
    return None


def outcome_from_result(entry: ExpectationConfig, name: str, result: Mapping[str, Any]) -> ExpectationOutcome:
    """An :class:`ExpectationOutcome` from one GX result (``ExpectationValidationResult.to_json_dict()``)."""
    details: Mapping[str, Any] = result.get("result") or {}
    error = _exception_message(result.get("exception_info") or {})
    count = details.get("unexpected_count")
    percent = details.get("unexpected_percent")
    return ExpectationOutcome(
        name=name,
        expect=entry.expect,
        kwargs=jsonable(entry.kwargs),
        blocking=entry.blocking,
        success=bool(result.get("success")) and error is None,
        element_count=details.get("element_count"),
        unexpected_count=int(count) if count is not None else None,
        unexpected_percent=float(percent) if percent is not None else None,
        samples=[jsonable(v) for v in (details.get("partial_unexpected_list") or [])[:SAMPLE_SIZE]],
        observed_value=jsonable(details.get("observed_value")),
        error=error,
    )


def read_table(path: TableLocation | Path, *, invariants: bool = False, fmt: TableFormat | None = None) -> pd.DataFrame:
    """The current version of the table at ``path`` (of format ``fmt``, default Delta) as pandas.

    ``invariants``: an SCD2 table, with the invariant columns its built-in checks read
    (keyed on the key its last commit records).
    """
    path = as_location(path)
    fmt = fmt or table_format(DEFAULT_FORMAT)
    keys = fmt.recorded_key(path) if invariants else None
    if keys:
        return invariant_rows(path, keys, fmt).to_pandas()
    # Read through DuckDB: DeltaTable.to_pandas() scans a pyarrow dataset whose threads can
    # outlive the call and abort the process at exit (arrow#34314).
    table = fmt.open(path)
    if table is None:
        msg = f"no {fmt.name} table at {path}"
        raise FileNotFoundError(msg)
    frame: pd.DataFrame = table.select("SELECT * FROM target").to_pandas()
    return frame


class _Validator:
    """An ephemeral GX context (no analytics, no progress bars) holding one suite per table."""

    def __init__(self, data_docs_dir: Path | None) -> None:
        gx = import_gx()
        from great_expectations.data_context.types.base import (
            DataContextConfig,
            InMemoryStoreBackendDefaults,
            ProgressBarsConfig,
        )

        project = DataContextConfig(
            store_backend_defaults=InMemoryStoreBackendDefaults(init_temp_docs_sites=False),
            analytics_enabled=False,
            progress_bars=ProgressBarsConfig(globally=False),
        )
        self._gx = gx
        self.context: Any = gx.get_context(mode="ephemeral", project_config=project)
        self.data_docs_dir = data_docs_dir
        if data_docs_dir is not None:
            self.context.add_data_docs_site(
                "headwater",
                {
                    "class_name": "SiteBuilder",
                    "store_backend": {
                        "class_name": "TupleFilesystemStoreBackend",
                        "base_directory": str(data_docs_dir),
                    },
                    "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
                },
            )
        self.datasource: Any = self.context.data_sources.add_pandas(_DATASOURCE)

    def validate(self, table: str, expectations: Sequence[Any], frame: pd.DataFrame) -> list[dict[str, Any]]:
        gx = self._gx
        batch = self.datasource.add_dataframe_asset(table).add_batch_definition_whole_dataframe("current")
        suite = self.context.suites.add(gx.ExpectationSuite(name=table, expectations=list(expectations)))
        definition = self.context.validation_definitions.add(
            gx.ValidationDefinition(name=table, data=batch, suite=suite)
        )
        checkpoint = self.context.checkpoints.add(
            gx.Checkpoint(
                name=table,
                validation_definitions=[definition],
                result_format={"result_format": "SUMMARY", "partial_unexpected_count": SAMPLE_SIZE},
            )
        )
        result = checkpoint.run(batch_parameters={"dataframe": frame})
        (validation,) = result.run_results.values()
        # GX reorders results (by domain); the ids the suite gave each expectation restore suite order.
        by_id = {r.expectation_config.id: r.to_json_dict() for r in validation.results}
        ordered = [by_id.get(e.id) for e in suite.expectations]
        if any(r is None for r in ordered):
            msg = f"table {table!r}: Great Expectations returned no result for some expectations of the suite"
            raise WarehouseError(msg)
        return [r for r in ordered if r is not None]

    def build_data_docs(self) -> None:
        if self.data_docs_dir is not None:
            self.context.build_data_docs()


def run_quality(
    config: ProjectConfig,
    tables: Iterable[str] | None = None,
    *,
    data_docs: bool = False,
    record: bool = True,
    now: datetime | None = None,
) -> QualityRun:
    """Run the suites of ``tables`` (all by default) against the warehouse and return the results.

    Config errors raise before any table is read. A table that is not loaded yet counts
    every expectation as failed with the reason. With ``record`` the run is appended to
    :func:`runs_path`; with ``data_docs`` GX Data Docs are (re)built under :func:`data_docs_path`.
    """
    suites = validate_suites(config, tables)
    validator = _Validator(data_docs_path(config) if data_docs else None)
    outcomes: list[TableOutcome] = []
    for table, expectations in suites.items():
        names, entries = (list(column) for column in zip(*table_checks(config, table), strict=True))
        path = table_path(config, table)
        fmt = format_of(config, table)
        if not fmt.exists(path):
            reason = f"table {table!r} is not loaded yet; run 'headwater load {table} --available-now'"
            failed = [
                ExpectationOutcome(
                    name=n, expect=e.expect, kwargs=jsonable(e.kwargs), blocking=e.blocking, success=False, error=reason
                )
                for n, e in zip(names, entries, strict=True)
            ]
            outcomes.append(TableOutcome(table=table, rows=None, expectations=failed, error=reason))
            continue
        frame = read_table(path, invariants=bool(builtin_checks(config, table)), fmt=fmt)
        results = validator.validate(table, expectations, frame)
        outcomes.append(
            TableOutcome(
                table=table,
                rows=len(frame),
                expectations=[outcome_from_result(e, n, r) for e, n, r in zip(entries, names, results, strict=True)],
            )
        )
    validator.build_data_docs()
    run = QualityRun(run_at=now or datetime.now(UTC), tables=outcomes)
    if record:
        append_run(runs_path(config), run)
    return run


def append_run(path: Path, run: QualityRun) -> None:
    """Append ``run`` as one JSON line (a single write, so concurrent runs never interleave a line)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    line = orjson.dumps(run.as_json()) + b"\n"
    with path.open("ab") as handle:
        handle.write(line)


def load_runs(path: Path, *, limit: int = 50, field: str = "run_at") -> list[dict[str, Any]]:
    """The last ``limit`` recorded runs (objects with ``field``), oldest first; unreadable lines are skipped."""
    if not path.is_file():
        return []
    runs: list[dict[str, Any]] = []
    for line in path.read_bytes().splitlines():
        try:
            value = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(value, dict) and field in value:
            runs.append(value)
    return runs[-limit:]
