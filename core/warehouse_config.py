"""The ``warehouse:`` section of ``headwater.yaml``: tables, where they live, AUTO CDC options, freshness, upkeep."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from core.config_model import ConfigModel
from core.deployment import SettingsMap
from core.iceberg_config import IcebergConfig


def _exclusive(value: Any, info: ValidationInfo, *others: str) -> None:
    """Raise when ``info.field_name`` is given together with an earlier field among ``others``."""
    given = [name for name in others if info.data.get(name) not in (None, False)]
    if value not in (None, False) and given:
        msg = f"cannot be given with {given[0]}; keep one"
        raise ValueError(msg)


def _names(value: tuple[str, ...] | None) -> tuple[str, ...] | None:
    if value is not None and (not value or len(set(value)) != len(value)):
        msg = "give one or more distinct column names"
        raise ValueError(msg)
    return value


class FreshnessConfig(ConfigModel):
    """How fresh a warehouse table must be: loaded at most ``fail_after_s`` ago (a warning after ``warn_after_s``)."""

    fail_after_s: float = Field(default=3600.0, gt=0)
    warn_after_s: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _warn_before_fail(self) -> FreshnessConfig:
        if self.warn_after_s is not None and self.warn_after_s >= self.fail_after_s:
            msg = "warn_after_s must be less than fail_after_s"
            raise ValueError(msg)
        return self


class MaintenanceConfig(ConfigModel):
    """When a table is compacted, checkpointed and vacuumed, and how long old versions stay readable.

    Semantics and defaults: :mod:`warehouse_loader.maintenance` (the policy; it is the same
    for every table format). ``retention_s`` is how far back time travel reaches: files a
    later version no longer uses and log entries older than that are removed, never younger
    ones, and never less than the floor the policy keeps for readers in flight (``verify``,
    backfills, ``query``).
    """

    #: ``run --follow`` runs maintenance as a stage of its own; ``headwater maintain`` works either way.
    enabled: bool = True
    #: How often the stage looks at each table (seconds).
    interval_s: float = Field(default=60.0, gt=0)
    #: Files compaction writes (bytes; delta-rs takes it as approximate).
    target_file_size: int = Field(default=64 * 1024 * 1024, ge=1024 * 1024)
    #: Compact once this many files are below a sixteenth of the target size ...
    compact_min_small_files: int = Field(default=8, ge=2)
    #: ... or once small files hold this share of the table's bytes (with at least two of them), or this
    #: share of the rows are removed by deletion vectors (files with that share are rewritten without them).
    compact_dirty_ratio: float = Field(default=0.1, gt=0, le=1)
    #: A log checkpoint after this many commits since the last one.
    checkpoint_interval: int = Field(default=100, ge=1)
    #: Versions stay readable (time travel) this long; older removed files and log entries go.
    retention_s: float = Field(default=86400.0, ge=0)


class TableConfig(ConfigModel):
    """A warehouse table materialised from a topic or feed, with Databricks AUTO CDC's options.

    ``track_history_columns`` is AUTO CDC's ``track_history_column_list``. Options that
    exclude each other, and SCD2-only options on an SCD1 table, are refused here; column
    names are checked against the change batch when the table is loaded
    (:mod:`warehouse_loader.cdc_options`, which also states each option's semantics).
    """

    from_: str = Field(alias="from")
    mode: Literal["scd1", "scd2"] = "scd1"
    sequence_by: str | None = None
    column_list: tuple[str, ...] | None = None
    except_column_list: tuple[str, ...] | None = None
    ignore_null_updates: bool = False
    ignore_null_updates_column_list: tuple[str, ...] | None = None
    ignore_null_updates_except_column_list: tuple[str, ...] | None = None
    #: A SQL boolean expression over the row image: rows where it holds are deletes (soft deletes).
    apply_as_deletes: str | None = None
    apply_as_truncates: bool = Field(default=True, validate_default=True)
    track_history_columns: tuple[str, ...] | None = None
    track_history_except_column_list: tuple[str, ...] | None = None
    #: Overrides ``warehouse.freshness`` for this table (Dagster's freshness policy).
    freshness: FreshnessConfig | None = None
    #: Overrides ``warehouse.format`` for this table.
    format: str | None = Field(default=None, pattern=r"^[a-z][a-z0-9_]*$")
    #: Overrides ``warehouse.maintenance`` for this table.
    maintenance: MaintenanceConfig | None = None
    #: Overrides ``warehouse.merge_on_read`` for this table (an Iceberg SCD2 table cannot be merge-on-read).
    merge_on_read: bool | None = None

    @field_validator(
        "column_list",
        "except_column_list",
        "ignore_null_updates_column_list",
        "ignore_null_updates_except_column_list",
        "track_history_columns",
        "track_history_except_column_list",
    )
    @classmethod
    def _column_names(cls, value: tuple[str, ...] | None, info: ValidationInfo) -> tuple[str, ...] | None:
        value = _names(value)
        earlier = {
            "except_column_list": ("column_list",),
            "ignore_null_updates_column_list": ("ignore_null_updates",),
            "ignore_null_updates_except_column_list": ("ignore_null_updates", "ignore_null_updates_column_list"),
            "track_history_except_column_list": ("track_history_columns",),
        }
        _exclusive(value, info, *earlier.get(info.field_name or "", ()))
        history = info.field_name in ("track_history_columns", "track_history_except_column_list")
        if value is not None and history and info.data.get("mode") != "scd2":
            msg = "tracks history, so it needs mode: scd2; remove it or set mode: scd2"
            raise ValueError(msg)
        excluded = set(info.data.get("except_column_list") or ())
        kept = info.data.get("column_list")
        dropped = [c for c in value or () if c in excluded or (kept is not None and c not in kept)]
        if dropped and info.field_name not in ("column_list", "except_column_list"):
            msg = f"names {', '.join(dropped)}, left out of the table by column_list/except_column_list"
            raise ValueError(msg)
        return value

    @field_validator("apply_as_deletes")
    @classmethod
    def _delete_condition(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            msg = 'give a SQL boolean expression over the row\'s columns, e.g. "is_deleted"'
            raise ValueError(msg)
        return value

    @field_validator("apply_as_truncates")
    @classmethod
    def _truncate_needs_sequence(cls, value: bool, info: ValidationInfo) -> bool:
        column = info.data.get("sequence_by")
        if value and column:
            msg = (
                f"a truncate carries no row, so it has no value of sequence_by column {column!r}; "
                "set apply_as_truncates: false (truncates are then ignored) or remove sequence_by"
            )
            raise ValueError(msg)
        return value


#: Object stores delta-rs writes to (``file://`` is a local path spelled as a URL).
WAREHOUSE_SCHEMES = ("s3", "s3a", "gs", "az", "abfs", "abfss", "file")


class WarehouseConfig(ConfigModel):
    """Where the warehouse lives (a local path or an object store URL) and its tables, by name."""

    #: Default ``<home>/warehouse``; a local path (relative to this file) or ``s3://bucket/prefix``,
    #: ``gs://...``, ``az://...``.
    path: str | None = None
    #: Handed to delta-rs and pyarrow's filesystem as they are (``AWS_REGION``, ``AWS_ENDPOINT_URL``,
    #: credentials via ``${VAR}``); never shown.
    storage_options: SettingsMap = {}
    #: The table format of every table that names none (``delta``; known formats are checked where tables are used).
    format: str = Field(default="delta", pattern=r"^[a-z][a-z0-9_]*$")
    tables: dict[str, TableConfig] = {}
    freshness: FreshnessConfig = FreshnessConfig()
    #: Iceberg tables' catalog and namespace (:mod:`core.iceberg_config`).
    iceberg: IcebergConfig = IcebergConfig()
    maintenance: MaintenanceConfig = MaintenanceConfig()
    #: Writes may mark replaced rows removed instead of rewriting the files holding them
    #: (merge-on-read). Unset: each format's default: Delta yes (deletion vectors, on local tables
    #: once they outgrow 1 MiB, :mod:`warehouse_loader.delta.merge_on_read`), Iceberg no
    #: (copy-on-write; true: SCD1 tables write position deletes, :mod:`warehouse_loader.iceberg.writer`).
    merge_on_read: bool | None = None

    def merge_on_read_of(self, table: str) -> bool | None:
        """Whether table ``table``'s writes may be merge-on-read (None: as its format does by default)."""
        own = self.tables[table].merge_on_read
        return own if own is not None else self.merge_on_read

    @model_validator(mode="after")
    def _merge_on_read_possible(self) -> WarehouseConfig:
        for name, table in self.tables.items():
            if table.merge_on_read and table.mode == "scd2" and (table.format or self.format) == "iceberg":
                msg = (
                    f"tables.{name}.merge_on_read: an Iceberg SCD2 table is always copy-on-write; "
                    "remove merge_on_read: true there (or store the table as Delta)"
                )
                raise ValueError(msg)
        return self

    def maintenance_of(self, table: str) -> MaintenanceConfig:
        """Table ``table``'s maintenance settings: its own, else the warehouse's."""
        own = self.tables[table].maintenance
        return own if own is not None else self.maintenance

    @field_validator("path")
    @classmethod
    def _known_store(cls, value: str | None) -> str | None:
        if value is None or "://" not in value:
            return value
        scheme = value.split("://", 1)[0].lower()
        if scheme not in WAREHOUSE_SCHEMES or not value.split("://", 1)[1].strip("/"):
            msg = f"must be a local path or s3://bucket/prefix (gs://, az://), got {value!r}"
            raise ValueError(msg)
        return value.rstrip("/")
