"""The ``warehouse:`` section of ``headwater.yaml``: where tables live, their AUTO CDC options and freshness."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from core.config_model import ConfigModel
from core.deployment import SettingsMap


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
    tables: dict[str, TableConfig] = {}
    freshness: FreshnessConfig = FreshnessConfig()

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
